"""Command line: generate with speculative decoding, compare with plain decoding, trace each round.

    python -m minispec --prompt "def parse(" --compare --trace
    python -m minispec                       # interactive prompt with /slash commands
    python -m minispec bench | sweep ...     # benchmarks (minispec/measure/)

With no --target/--draft it runs the pair shipped in weights/.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .backend import set_blas_threads
from .drafters import DRAFTERS
from .drafters.tree_model import check_shape
from .errors import MinispecError
from .sampling import Sampling
from .shipped import SHIPPED  # weights/ in a checkout, or the copy a wheel installed

GREEN, RED, CYAN, YELLOW, RESET = "\033[32m", "\033[31m", "\033[36m", "\033[33m", "\033[0m"

HELP = """commands:
  /gamma N        draft length (or /gamma auto)
  /temperature X  0 is greedy
  /top_k N        0 is off
  /top_p X        1 is off
  /length N       max new tokens
  /drafter NAME   model | ngram | early-exit | model-tree | medusa | eagle
  /seed N         the sampling seed
  /settings       show the current settings
  /speculative    toggle speculative / plain autoregressive decoding
  /trace          toggle the per-round trace
  /help           this text
  /quit           leave (also Ctrl-D); Ctrl-C stops a generation"""


@dataclass
class Settings:
    """What the interactive prompt can change between generations."""

    gamma: int | str = 4
    sampling: Sampling = field(default_factory=Sampling)  # temperature, top_k, top_p
    max_new_tokens: int = 64
    seed: int | None = 0
    speculative: bool = True
    trace: bool = False
    drafter: str = "model"
    exit_layer: int | None = None
    tree: tuple[int, ...] | None = None  # children per depth, for model-tree, medusa, eagle
    dynamic: tuple[int, int] | None = None  # EAGLE-2's (beam, nodes)


def shipped_pair() -> tuple[Path, Path]:
    """Paths of the target and draft shipped in weights/."""
    return SHIPPED / "target", SHIPPED / "draft"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where the help text does not already say what the default is
    (so no "(default: a quarter) (default: None)"), nor on a flag ("(default: False)")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.nargs == 0:  # a flag
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="minispec", formatter_class=HelpFormatter,
        description="Speculative decoding from scratch (NumPy/CuPy). "
        "Subcommands: `minispec bench -h`, `minispec sweep -h`, `minispec drafters -h`, "
        "`minispec crossover -h`, `minispec serve -h`.",
    )
    target, draft = shipped_pair()
    ap.add_argument("--target", type=Path, default=target,
                    help="target model directory (HF layout)")
    ap.add_argument("--draft", type=Path, default=None,
                    help=f"draft model directory (with the shipped target: {draft})")
    ap.add_argument("--drafter", choices=list(DRAFTERS), default="model",
                    help="what proposes the drafts (model-tree and medusa draft trees)")
    ap.add_argument("--exit-layer", type=int, default=None,
                    help="layers of the target the early-exit drafter runs (default: a quarter)")
    ap.add_argument("--tree", default=None, metavar="K1,K2,...",
                    help="children per depth of a tree drafter's tree, e.g. 3,2,1,1 (default: "
                    "2,2,1,1 for model-tree, 1,1,1,1 for medusa; eagle drafts a chain without it)")
    ap.add_argument("--dynamic", default=None, metavar="BEAM,NODES",
                    help="eagle: grow the --tree dynamically (EAGLE-2), expanding the BEAM most "
                    "probable nodes per depth and keeping the NODES most probable")
    ap.add_argument("--prompt", default=None,
                    help="prompt text; without it, an interactive prompt")
    ap.add_argument("--gamma", default="4", help="draft tokens per round, or 'auto'")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    ap.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    ap.add_argument("--max-new-tokens", type=int, default=64,
                    help="new tokens to generate (at most what the context leaves; a notice says "
                    "when it caps)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the sampling (and the drafts)")
    ap.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                    help="auto: the GPU when CuPy sees one")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS threads for NumPy (default 1: a decode step's small matmuls are "
                    "faster on one thread on small or busy machines; raise it for large models)")
    ap.add_argument("--compare", action="store_true",
                    help="also decode autoregressively and print the speedup")
    ap.add_argument("--trace", action="store_true",
                    help="show each round: accepted (green), rejected (red), correction or bonus")
    ap.add_argument("--no-color", action="store_true", help="plain-text trace markers")
    ap.add_argument("--html", metavar="FILE", default=None,
                    help="with --prompt: write the generation as one HTML page, round by round "
                    "(drafts, q(x), p(x), the uniform r, verdicts, residuals)")
    return ap


def parse_dynamic(text: str) -> tuple[int, int]:
    try:
        beam, nodes = (int(x) for x in text.split(","))
    except ValueError:
        raise MinispecError(f"--dynamic: expected BEAM,NODES like 4,16, got {text!r:.40}") \
            from None
    return beam, nodes


def parse_gamma(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        gamma = int(text)
    except ValueError:
        gamma = 0
    if gamma < 1:
        raise MinispecError(f"gamma: expected a positive integer or 'auto', got {text!r}")
    return gamma


class Session:
    """A loaded target and drafter plus the current settings: what one generation needs."""

    def __init__(self, args: argparse.Namespace):
        from .drafters import make_drafter
        from .loader import load

        self.args = args
        self.target = load(args.target, device=args.device)
        if self.target.tokenizer is None:
            raise MinispecError(f"{args.target}: no tokenizer.json, so the CLI cannot encode text")
        draft_dir = args.draft
        if draft_dir is None and args.drafter in ("model", "model-tree"):
            if args.target.resolve() != shipped_pair()[0].resolve():
                raise MinispecError("--draft: give a draft model directory for this --target "
                                    "(or use --drafter ngram | early-exit)")
            draft_dir = shipped_pair()[1]
        self.draft_model = load(draft_dir, device=args.device) if draft_dir else None
        self.make_drafter = make_drafter
        self.settings = Settings(
            gamma=parse_gamma(str(args.gamma)),
            sampling=Sampling(args.temperature, args.top_k, args.top_p),
            max_new_tokens=args.max_new_tokens, seed=args.seed, trace=args.trace,
            drafter=args.drafter, exit_layer=args.exit_layer,
            tree=None if args.tree is None else check_shape(args.tree, "--tree"),
            dynamic=None if args.dynamic is None else parse_dynamic(args.dynamic),
        )
        self.color = sys.stdout.isatty() and not args.no_color

    def drafter(self):
        s = self.settings
        return self.make_drafter(s.drafter, self.target, draft_model=self.draft_model,
                                 exit_layer=s.exit_layer, tree=s.tree, dynamic=s.dynamic)

    def generate(self, prompt: str, speculative: bool, on_round=None, verify=None):
        from .drafters import NoDrafter
        from .speculative import Request, generate

        s = self.settings
        ids = self.target.tokenizer.encode(prompt)
        request = Request(s.max_new_tokens, self.target.config.eos_token_ids, s.seed)
        drafter = self.drafter() if speculative else NoDrafter(self.target)
        kw = {} if verify is None else {"verify": verify}
        return generate(self.target, drafter, ids, s.sampling, request,
                        gamma=s.gamma if speculative else 0, on_round=on_round, **kw)

    def write_html(self, prompt: str, path: str) -> None:
        """--html: the generation as one self-contained page (minispec/html_trace.py)."""
        from .html_trace import TracedVerify, page

        s = self.settings
        if s.drafter in ("model-tree", "medusa") or (s.drafter == "eagle" and s.tree):
            raise MinispecError("--html: shows chains; choose a chain drafter (model, ngram, "
                                "early-exit, eagle without --tree)")
        traced = TracedVerify()
        result = self.generate(prompt, True, verify=traced)
        title = (f"minispec: {s.drafter} drafter, gamma {s.gamma}, temperature "
                 f"{s.sampling.temperature:g}")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(page(prompt, result, traced, self.target.tokenizer.decode, title))
        except OSError as e:
            raise MinispecError(f"--html {path}: cannot write ({e.strerror})") from None
        print(f"wrote {path}: {len(result.stats.rounds)} rounds, {result.stats.new_tokens} "
              "tokens")

    def warm_up(self, prompt: str) -> None:
        s = self.settings
        length, s.max_new_tokens = s.max_new_tokens, min(s.max_new_tokens, 4)
        try:
            self.generate(prompt, True)
            self.generate(prompt, False)
        finally:
            s.max_new_tokens = length

    def cap_notice(self, prompt: str) -> str | None:
        """A notice when the context leaves fewer positions than --max-new-tokens asks for."""
        n = len(self.target.tokenizer.encode(prompt))
        ctx = self.target.config.max_position_embeddings
        if n + self.settings.max_new_tokens > ctx:
            return (f"note: at most {max(0, ctx - n)} new tokens fit after this {n}-token prompt "
                    f"(the context is {ctx} positions); max_new_tokens "
                    f"{self.settings.max_new_tokens} is capped")
        return None

    def run(self, prompt: str, compare: bool = False) -> None:
        """Generate, showing the tokens as each round emits them (accepted drafts, the
        correction and the bonus token in their colors on a terminal), then the statistics."""
        s = self.settings
        if compare:  # one short untimed run of each first, so neither pays the first-call costs
            self.warm_up(prompt)
        notice = self.cap_notice(prompt)
        if notice:
            print(notice, file=sys.stderr)
        tok = self.target.tokenizer
        print(prompt, end="", flush=True)

        def stream(r) -> None:
            if not self.color or not s.speculative:
                print(tok.decode(r.emitted), end="", flush=True)
                return
            kept = tok.decode(r.emitted[: r.accepted])
            last = tok.decode(r.emitted[r.accepted:])
            color = YELLOW if r.kind == "bonus" else CYAN
            print(f"{GREEN}{kept}{RESET}{color}{last}{RESET}", end="", flush=True)

        result = self.generate(prompt, s.speculative, on_round=stream)
        print("\n")
        if s.trace and s.speculative:
            print(render_trace(result.stats.rounds, tok.decode, self.color))
            print()
        print(format_stats(result, speculative=s.speculative))
        if compare:
            base = self.generate(prompt, not s.speculative)
            spec, plain = (result, base) if s.speculative else (base, result)
            same = "identical" if spec.tokens == plain.tokens else "different (sampled)"
            print(format_stats(base, speculative=not s.speculative))
            print(f"speedup: {spec.stats.tokens_per_second / plain.stats.tokens_per_second:.2f}x "
                  f"(speculative {spec.stats.tokens_per_second:.1f} tok/s vs autoregressive "
                  f"{plain.stats.tokens_per_second:.1f} tok/s); outputs {same}")


def render_trace(rounds, decode, color: bool) -> str:
    """One line per round: accepted drafts, rejected drafts, then the correction or bonus token."""

    def paint(text: str, code: str, plain: str) -> str:
        return f"{code}{text}{RESET}" if color else plain.format(text)

    lines = []
    for i, r in enumerate(rounds):
        # r.emitted is cut just after an EOS; the round's own token is its last entry otherwise
        kept = r.emitted[: r.accepted]
        parts = [paint(show(decode, t), GREEN, "{}") for t in kept]
        if len(r.emitted) > r.accepted:
            parts += [paint(show(decode, t), RED, "~{}~") for t in r.drafted[r.accepted :]]
            last = show(decode, r.emitted[-1])
            parts.append(paint(last, YELLOW, "[+{}]") if r.kind == "bonus"
                         else paint(last, CYAN, "[->{}]"))
        lines.append(f"round {i + 1:3d} | " + " ".join(parts))
    legend = (f"{GREEN}accepted{RESET} {RED}rejected{RESET} {CYAN}correction{RESET} "
              f"{YELLOW}bonus{RESET}" if color else "accepted ~rejected~ [->correction] [+bonus]")
    return "\n".join([legend, *lines])


def show(decode, token: int) -> str:
    """A token as text with whitespace made visible (newlines as \\n)."""
    return repr(decode([token]))[1:-1]


def format_stats(result, speculative: bool) -> str:
    st = result.stats
    if not speculative:
        return (f"autoregressive: {len(result.tokens)} tokens, {st.target_calls} target calls, "
                f"{st.tokens_per_second:.1f} tok/s, stopped by {result.stop_reason}")
    return (f"speculative ({st.drafter} drafter): {len(result.tokens)} tokens, "
            f"acceptance {st.acceptance_rate:.2f} ({st.accepted}/{st.positions}), "
            f"{st.tokens_per_target_call:.2f} tokens/target call, {st.target_calls} target calls, "
            f"{st.draft_calls} draft calls, drafting {st.draft_seconds:.2f}s, "
            f"verifying {st.verify_seconds:.2f}s, {st.tokens_per_second:.1f} tok/s, "
            f"stopped by {result.stop_reason}")


def command(session: Session, line: str) -> bool:
    """Apply one /command; False means quit. Every value is checked at once: a bad one leaves
    the setting as it was and says why, in one wording: "error: /NAME: ..."."""
    s = session.settings
    name, _, arg = line[1:].partition(" ")
    arg = arg.strip()

    def sampling(**change):  # a new Sampling: checked at once
        s.sampling = dataclasses.replace(s.sampling, **change)

    def length(a):
        n = int(a)
        if n < 1:
            raise MinispecError(f"max_new_tokens: expected a positive integer, got {a!r}")
        s.max_new_tokens = n

    def drafter(a):
        if a not in DRAFTERS:
            raise MinispecError(f"drafter: expected one of {' | '.join(DRAFTERS)}, got {a!r}")
        old, s.drafter = s.drafter, a
        try:
            session.drafter()  # built once now, so a missing model or file shows here
        except MinispecError:
            s.drafter = old
            raise

    setters = {
        "gamma": lambda a: setattr(s, "gamma", parse_gamma(a)),
        "temperature": lambda a: sampling(temperature=float(a)),
        "top_k": lambda a: sampling(top_k=int(a)),
        "top_p": lambda a: sampling(top_p=float(a)),
        "length": length,
        "drafter": drafter,
        "seed": lambda a: setattr(s, "seed", int(a)),
    }
    if name in ("quit", "exit", "q"):
        return False
    if name == "help":
        print(HELP)
    elif name == "settings":
        print(describe_settings(s))
    elif name == "speculative":
        s.speculative = not s.speculative
        print("speculative decoding" if s.speculative else "plain autoregressive decoding")
    elif name == "trace":
        s.trace = not s.trace
        print(f"trace {'on' if s.trace else 'off'}")
    elif name in setters:
        if not arg:
            print(f"error: /{name}: give a value (see /help)")
            return True
        try:
            setters[name](arg)
        except ValueError:
            print(f"error: /{name}: could not read {arg!r} as a number (see /help)")
            return True
        except MinispecError as e:
            print(f"error: /{name}: {e}")
            return True
        print(f"{name} = {arg}")
    else:
        print(f"error: unknown command {line!r} (see /help)")
    return True


def describe_settings(s: Settings) -> str:
    """The current settings, one per line (/settings)."""
    sp = s.sampling
    return "\n".join([
        f"  mode         {'speculative' if s.speculative else 'plain autoregressive'}",
        f"  drafter      {s.drafter}" + (f" (tree {','.join(map(str, s.tree))})"
                                         if s.tree else ""),
        f"  gamma        {s.gamma}",
        f"  temperature  {sp.temperature:g}   top_k {sp.top_k}   top_p {sp.top_p:g}",
        f"  length       {s.max_new_tokens}",
        f"  seed         {s.seed}",
        f"  trace        {'on' if s.trace else 'off'}"])


def interactive(session: Session) -> None:
    """The REPL: line editing and history (readline), Ctrl-C stops the generation in progress
    (or clears the line) and keeps the settings, Ctrl-D quits."""
    try:
        import readline  # noqa: F401  (importing it gives input() line editing and history)
    except ImportError:  # not on every platform
        pass
    print("minispec: type a prompt; /help for commands, /settings for the current ones. "
          "Ctrl-C stops a generation, Ctrl-D quits.")
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            if not command(session, line.strip()):
                return
            continue
        try:
            session.run(line)
        except KeyboardInterrupt:
            print("\n(stopped; settings kept)")
        except MinispecError as e:
            print(f"error: {e}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench":
            from .measure import bench

            return bench.main(argv[1:])
        if argv and argv[0] == "sweep":
            from .measure import sweep

            return sweep.main(argv[1:])
        if argv and argv[0] == "drafters":
            from .measure import drafters

            return drafters.main(argv[1:])
        if argv and argv[0] == "judge":
            from .judge import main as judge_main

            return judge_main(argv[1:])
        if argv and argv[0] in ("crossover", "serve"):
            from .measure import crossover

            return (crossover.main if argv[0] == "crossover" else crossover.serve_main)(argv[1:])
        args = build_parser().parse_args(argv)
        set_blas_threads(args.threads)
        session = Session(args)
        if args.prompt is None:
            interactive(session)
        elif args.html:
            session.write_html(args.prompt, args.html)
        else:
            session.run(args.prompt, compare=args.compare)
    except MinispecError as e:
        print(f"minispec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
