"""`--html FILE`: one self-contained HTML page of a generation, round by round: the algorithm,
visible. For each draft x: q(x), p(x), the uniform r and the verdict (kept when r q(x) < p(x));
at a rejection the residual norm(max(0, p - q))'s most likely tokens and the one drawn; the
bonus token when every draft was kept; totals at the end.

The page is built by a verify step that wraps minispec.verify without changing it: it copies the
random generator before the call and replays the uniforms verify drew (one per draft it tested,
in order, then one for the correction or bonus draw), so what the page shows are the numbers the
real step used. A tree round (minispec/tree.py) is walked by minispec.tree.verify_tree itself,
asked to record each child it tries: the page shows the tree, each child tried with its
proposal s(x), the target's r(x) and the uniform, and the token drawn at the end.
"""

from __future__ import annotations

import copy
import html

import numpy as np

from .core.verify import verify as minispec_verify
from .tokenizer import SPACE, show_token
from .tree import children_of, depths
from .tree import verify_tree as minispec_verify_tree


class TracedVerify:
    """A verify step with verify's signature that records each call (see the module docstring)."""

    __name__ = "verify"

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, p, q, draft_tokens, rng):
        replay = copy.deepcopy(rng)
        emitted = minispec_verify(p, q, draft_tokens, rng)
        p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
        drafts = [int(t) for t in draft_tokens]
        steps = []
        for i, x in enumerate(drafts[: len(emitted)]):
            r = replay.random()
            kept = bool(r * q[i, x] < p[i, x])
            steps.append({"token": x, "q": float(q[i, x]), "p": float(p[i, x]), "r": r,
                          "kept": kept})
            if not kept:
                break
        rejected = bool(steps) and not steps[-1]["kept"]
        i = len(steps) - 1 if rejected else len(drafts)
        dist = np.maximum(p[i] - q[i], 0.0) if rejected else p[i]
        dist = dist / dist.sum() if dist.sum() > 0 else p[i]
        top = np.argsort(-dist, kind="stable")[:5]
        self.calls.append({"steps": steps, "rejected": rejected, "final": int(emitted[-1]),
                           "final_prob": float(dist[int(emitted[-1])]),
                           "top": [(int(t), float(dist[t])) for t in top if dist[t] > 0]})
        return emitted

    def verify_tree(self, p, q, tokens, parents, siblings, rng):
        """minispec.tree.verify_tree, its walk recorded (what the loop calls for a tree round)."""
        trace: list = []
        path, token = minispec_verify_tree(p, q, tokens, parents, siblings, rng, trace)
        *steps, last = trace
        dist = np.asarray(last["last"], dtype=np.float64)
        top = np.argsort(-dist, kind="stable")[:5]
        self.calls.append({"tree": True, "tokens": [int(t) for t in tokens],
                           "parents": [int(a) for a in parents], "path": list(path),
                           "steps": steps, "rejected": last["rejected"], "final": int(token),
                           "final_prob": float(dist[int(token)]),
                           "top": [(int(t), float(dist[t])) for t in top if dist[t] > 0]})
        return path, token


GREEDY_NOTE = """<p class=greedy><b>Temperature 0:</b> p and q are one-hot (all their mass on
the most likely token), so every kept draft reads q(x) = p(x) = 1 and every rejected one p(x) = 0:
a draft is kept exactly when it is the target's own choice, and the uniform r plays no role. Run
again with a temperature (<code>--temperature 1</code>) to see r, q and p decide.</p>"""


TREE_NOTE = """<p>A <b>tree</b> round drafts several candidates per position and the target
scores every node in one call. The walk starts after the context: the children of the current
node are tried in turn; child x is kept when u&middot;s(x) &lt; r(x), where s is the distribution
it was drawn from (given the siblings tried before it) and r the target's, less what each
rejected sibling took (r becomes norm(max(0, r - s))); a kept child becomes the current node. When
every child is rejected the token is drawn from r (a correction); at a leaf, from p after it (a
bonus). In the tree, <span class=k>kept</span>, <span class=x>rejected</span>, <span
class=u>not tried</span>.</p>"""


def page(prompt: str, result, traced: TracedVerify, decode, title: str,
         greedy: bool = False) -> str:
    """The HTML page for one generation (`result`, a GenerationResult) made with `traced`;
    greedy (temperature 0) adds a note that r then decides nothing."""

    def tok(t: int) -> str:
        return f"<code>{html.escape(show_token(decode, t))}</code>"

    def tree_section(call) -> str:
        """A tree round: the tree (kept nodes green, rejected red), then the walk's table."""
        kids, depth = children_of(call["parents"]), depths(call["parents"])
        verdict = {s["node"]: s["kept"] for s in call["steps"]}

        def nodes(parent: int) -> str:  # parent's children as a nested list
            items = "".join(
                f"<li><span class={ {True: 'k', False: 'x'}.get(verdict.get(c), 'u') }>"
                f"{tok(call['tokens'][c])}</span>{nodes(c)}</li>" for c in kids[parent])
            return f"<ul>{items}</ul>" if items else ""

        said = {True: "kept (u&middot;s &lt; r)", False: "rejected (u&middot;s &ge; r)"}
        rows = "".join(
            f"<tr class={'kept' if s['kept'] else 'rejected'}><td>{depth[s['node']] + 1}</td>"
            f"<td>{tok(s['token'])}</td><td>{s['s']:.4f}</td><td>{s['r']:.4f}</td>"
            f"<td>{s['u']:.4f}</td><td>{said[s['kept']]}</td></tr>" for s in call["steps"])
        return (f"<div class=tree>{nodes(-1)}</div><table><tr><th>depth</th><th>child x</th>"
                f"<th>s(x)</th><th>r(x)</th><th>u</th><th>verdict</th></tr>{rows}</table>")

    def section(n: int, rd, call, over: str, body: str, kind: str) -> str:
        top = ", ".join(f"{tok(t)} {pr:.3f}" for t, pr in call["top"])
        return (f"<section><h2>round {n}: {len(rd.emitted)} token"
                f"{'s' * (len(rd.emitted) != 1)} from one target call{over}</h2>{body}"
                f"<p class={'corr' if call['rejected'] else 'bonus'}>{kind}: {tok(call['final'])}"
                f" (probability {call['final_prob']:.3f}); most likely: {top}</p></section>")

    rounds = []
    for n, (rd, call) in enumerate(zip(result.stats.rounds, traced.calls), 1):
        if call.get("tree"):
            kind = ("correction, from r after every child was rejected" if call["rejected"]
                    else "bonus, from p after the leaf")
            rounds.append(section(n, rd, call, f" over a tree of {len(call['tokens'])} nodes",
                                  tree_section(call), kind))
            continue
        rows = "".join(
            f"<tr class={'kept' if s['kept'] else 'rejected'}><td>{tok(s['token'])}</td>"
            f"<td>{s['q']:.4f}</td><td>{s['p']:.4f}</td><td>{s['r']:.4f}</td>"
            f"<td>{'kept (r&middot;q &lt; p)' if s['kept'] else 'rejected (r&middot;q &ge; p)'}"
            f"</td></tr>" for s in call["steps"])
        untested = rd.drafted[len(call["steps"]):]
        skipped = (f"<p class=note>not tested after the rejection: "
                   f"{' '.join(tok(t) for t in untested)}</p>" if untested else "")
        kind = "correction, from norm(max(0, p - q))" if call["rejected"] else (
            "bonus, from p after the last draft" if rd.drafted else "the target's own token")
        table = (f"<table><tr><th>draft x</th><th>q(x)</th><th>p(x)</th><th>r</th>"
                 f"<th>verdict</th></tr>{rows}</table>" if rows else "<p class=note>no drafts "
                 "this round</p>")
        rounds.append(section(n, rd, call, "", table + skipped, kind))
    st = result.stats
    text = html.escape(prompt) + "".join(
        f"<span class=k>{html.escape(decode(rd.emitted[: rd.accepted]))}</span>"
        f"<span class={'b' if rd.kind == 'bonus' else 'c'}>"
        f"{html.escape(decode(rd.emitted[rd.accepted:]))}</span>" for rd in st.rounds)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; max-width: 60em; margin: 2em auto; color: #222; }}
pre {{ background: #f6f6f6; padding: 1em; white-space: pre-wrap; }}
table {{ border-collapse: collapse; margin: .3em 0; }}
td, th {{ border: 1px solid #ccc; padding: .15em .6em; text-align: right; }}
tr.kept td {{ background: #e3f6e3; }} tr.rejected td {{ background: #fbe3e3; }}
.k {{ background: #e3f6e3; }} .c {{ background: #dff0fb; }} .b {{ background: #fff3c4; }}
p.greedy {{ background: #fff3c4; padding: .5em; }}
p.corr {{ color: #05608f; }} p.bonus {{ color: #8a6d00; }} p.note {{ color: #777; }}
.x {{ background: #fbe3e3; }} .u {{ color: #999; }} div.tree ul {{ margin: 0; }}
section {{ border-top: 1px solid #ddd; padding-top: .3em; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Each round: the drafter proposed tokens x drawn from q; the target scored them all in one call
(p). A draft is kept when the uniform r satisfies r&middot;q(x) &lt; p(x), that is with probability
min(1, p(x)/q(x)); the first rejected one is replaced by a draw from norm(max(0, p - q)); if every
draft is kept the target adds a bonus token from its next distribution.
<span class=k>kept drafts</span> <span class=c>correction</span> <span class=b>bonus</span>.
In the tables {SPACE} is a space inside a token and \\n a newline.</p>
{TREE_NOTE if any(c.get("tree") for c in traced.calls) else ""}
{GREEDY_NOTE if greedy else ""}
<pre>{text}</pre>
<p><b>{st.new_tokens}</b> tokens, <b>{st.target_calls}</b> target calls
({st.tokens_per_target_call:.2f} tokens per call), {st.accepted} of {st.drafted} drafts kept,
stopped by {html.escape(result.stop_reason)}.</p>
{''.join(rounds)}
</body></html>
"""
