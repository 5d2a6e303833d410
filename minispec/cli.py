"""Command line: generate with speculative decoding, compare with plain decoding, trace each round.

    python -m minispec --prompt "def parse(" --compare --trace
    python -m minispec                       # interactive prompt with /slash commands
    python -m minispec bench | sweep ...     # benchmarks (minispec/measure/)
    python -m minispec real demo --chat --prompt "Hi"   # SmolLM2-135M-Instruct (minispec/real.py)

With no --target/--draft it runs the pair shipped in weights/ ("shipped:target", "shipped:draft").
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .backend import set_blas_threads
from .core.sampling import Sampling
from .core.speculative import Request
from .drafters import DRAFTERS
from .drafters.tree_model import check_shape
from .errors import MinispecError
from .options import add_activations, add_device, add_dtype, add_gamma, add_threads, parse_gamma
from .shipped import SHIPPED, models_hint, resolve  # weights/ in a checkout, or a wheel's copy
from .tokenizer import SPACE, show_token

GREEN, RED, CYAN, YELLOW, RESET = "\033[32m", "\033[31m", "\033[36m", "\033[33m", "\033[0m"

HELP = """commands (any case; a bad value changes nothing and says why):
  /gamma N          draft length (or /gamma auto)
  /temperature X    0 is greedy
  /top_k N          0 is off
  /top_p X          1 is off
  /length N         max new tokens (max_new_tokens, as --max-new-tokens)
  /drafter NAME     model | ngram | early-exit | model-tree | medusa | eagle | auto
  /seed N           the sampling seed (/seed none: fresh randomness each time)
  /settings         show the current settings
  /speculative      toggle speculative / plain autoregressive decoding (or: on, off)
  /trace            toggle the per-round trace (or: on, off)
  /help             this text
  /quit             leave (also Ctrl-D); Ctrl-C stops a generation
the arrow keys recall earlier lines, kept between sessions in ~/.minispec_history"""

HISTORY = Path("~/.minispec_history")  # the REPL's lines, kept between sessions (on a terminal)
BIG_GAMMA = 16  # above this a notice says what a long chain costs (minispec sweep: 7 is best here)


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
    stop: float | None = None  # eagle, model: a chain ends where its confidence falls below it
    draft_vocab: str | None = None  # model: a safetensors file whose draft_vocab ids it proposes
    copy: int | None = None  # eagle: copy from the context once a draft agrees with a lookup


def shipped_pair() -> tuple[Path, Path]:
    """Paths of the target and draft shipped in weights/ (or the installed copy)."""
    return SHIPPED / "target", SHIPPED / "draft"


def load_flag(flag: str, path: str, device: str, dtype: str | None = None,
              activations: str = "float32"):
    """load() of the directory a flag names, its errors prefixed with the flag."""
    from .loader import load

    try:
        return load(resolve(str(path)), device=device, dtype=dtype, activations=activations)
    except MinispecError as e:
        raise MinispecError(f"{flag}: {e}{models_hint(str(e))}") from None


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
        "`minispec crossover -h`, `minispec serve -h`, `minispec real -h`.",
    )
    ap.add_argument("--target", default="shipped:target",
                    help="target model directory (HF layout); shipped:target is the one in "
                    "weights/ (or the installed copy)")
    ap.add_argument("--draft", default=None,
                    help="draft model directory (default: shipped:draft with the shipped target)")
    ap.add_argument("--drafter", choices=list(DRAFTERS), default="model",
                    help="what proposes the drafts (model-tree and medusa draft trees)")
    ap.add_argument("--exit-layer", type=int, default=None,
                    help="layers of the target the early-exit drafter runs (default: a quarter)")
    ap.add_argument("--tree", default=None, metavar="K1,K2,...",
                    help="children per depth of a tree drafter's tree, e.g. 3,2,1,1 (default: "
                    "2,2,1,1 for model-tree, 1,1,1,1 for medusa; eagle drafts a chain without it)")
    ap.add_argument("--dynamic", default=None, metavar="BEAM,NODES",
                    help="eagle: grow the --tree dynamically (EAGLE-2), expanding the BEAM best "
                    "nodes per depth and keeping the NODES best, by their estimated chance of "
                    "being kept (the head's measured acceptance, else its draft probability)")
    ap.add_argument("--stop", type=float, default=None, metavar="P",
                    help="eagle (chain) and model: end a round's chain where its estimated chance "
                    "of being kept (an EAGLE head's measured acceptance, else the drafter's own "
                    "probabilities) falls below P (a dynamic draft length; 0.15 in the eagle-stop "
                    "preset)")
    ap.add_argument("--copy", type=int, default=None, metavar="N",
                    help="eagle (chain): once a drafted token is the one a prompt lookup of the "
                    "context's last N or more tokens proposes, copy the rest of the chain from "
                    "the context (2 in the eagle-copy preset)")
    ap.add_argument("--draft-vocab", default=None, metavar="FILE",
                    help="model: propose only the token ids of FILE's draft_vocab tensor (a head's "
                    "model.safetensors, e.g. weights/smollm2/eagle/model.safetensors), computing "
                    "only their rows of the draft's LM head")
    ap.add_argument("--prompt", default=None,
                    help="prompt text; without it, an interactive prompt")
    add_gamma(ap)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    ap.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    ap.add_argument("--max-new-tokens", type=int, default=64,
                    help="new tokens to generate (at most what the context leaves; a notice says "
                    "when it caps)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the sampling (and the drafts)")
    add_device(ap)
    add_dtype(ap)
    add_activations(ap)
    add_threads(ap)
    ap.add_argument("--compare", action="store_true",
                    help="also decode autoregressively and print the speedup")
    ap.add_argument("--trace", action="store_true",
                    help="show each round: accepted (green), rejected (red), correction or bonus")
    ap.add_argument("--no-color", action="store_true", help="plain-text trace markers")
    ap.add_argument("--html", metavar="FILE", default=None,
                    help="with --prompt: also write the generation as one HTML page, round by "
                    "round (drafts, q(x), p(x), the uniform r, verdicts, residuals; a tree "
                    "drafter's trees and their walk); try it with --temperature 1 (at 0, r "
                    "plays no role)")
    return ap


def parse_dynamic(text: str) -> tuple[int, int]:
    try:
        beam, nodes = (int(x) for x in text.split(","))
    except ValueError:
        raise MinispecError(f"--dynamic: expected BEAM,NODES like 4,16, got {text!r:.40}") \
            from None
    return beam, nodes


class Session:
    """A loaded target and drafter plus the current settings: what one generation needs."""

    def __init__(self, args: argparse.Namespace):
        from .drafters import load_draft_vocab, make_drafter

        self.args = args
        self.settings = Settings(  # the values first: checked before any model is loaded
            gamma=parse_gamma(str(args.gamma)),
            sampling=Sampling(args.temperature, args.top_k, args.top_p),
            max_new_tokens=Request(args.max_new_tokens).max_new_tokens,
            seed=Request(1, seed=args.seed).seed, trace=args.trace,
            drafter=args.drafter, exit_layer=args.exit_layer,
            tree=None if args.tree is None else check_shape(args.tree, "--tree"),
            dynamic=None if args.dynamic is None else parse_dynamic(args.dynamic),
            stop=args.stop, draft_vocab=args.draft_vocab, copy=args.copy,
        )
        if args.stop is not None and (args.drafter not in ("eagle", "model")
                                      or args.tree is not None or not 0 <= args.stop < 1):
            raise MinispecError(f"--stop: a probability in [0, 1) for the eagle or model "
                                f"drafter's chain (no --tree), got {args.stop} with --drafter "
                                f"{args.drafter}{' --tree' if args.tree is not None else ''}")
        if args.copy is not None and (args.drafter != "eagle" or args.tree is not None
                                      or args.copy < 1):
            raise MinispecError(f"--copy: an integer >= 1 for the eagle drafter's chain (no "
                                f"--tree), got {args.copy} with --drafter {args.drafter}"
                                f"{' --tree' if args.tree is not None else ''}")
        if args.draft_vocab is not None and args.drafter != "model":
            raise MinispecError(f"--draft-vocab: for the model drafter (--drafter model), got "
                                f"--drafter {args.drafter}")
        if args.html and not Path(args.html).resolve().parent.is_dir():
            raise MinispecError(f"--html {args.html}: its folder does not exist")
        self.target = load_flag("--target", args.target, args.device, args.dtype,
                                args.activations)
        if self.target.tokenizer is None:
            raise MinispecError(f"--target {args.target}: no tokenizer.json, so the CLI cannot "
                                "encode text")
        draft_dir = args.draft
        if draft_dir is None and args.drafter in ("model", "model-tree"):
            if Path(resolve(str(args.target))).resolve() != shipped_pair()[0].resolve():
                raise MinispecError("--draft: give a draft model directory for this --target "
                                    "(or use --drafter ngram | early-exit)")
            draft_dir = "shipped:draft"
        self.draft_model = (load_flag("--draft", draft_dir, args.device, args.dtype)
                            if draft_dir else None)
        # calls of a few tokens take the speed path: CUDA graphs on a GPU, numba loops on a CPU
        from .cpu_steps import enable_where_supported

        enable_where_supported(self.target, self.draft_model)
        self.draft_vocab = None
        if args.draft_vocab is not None:
            try:
                self.draft_vocab = load_draft_vocab(resolve(args.draft_vocab))
            except MinispecError as e:
                raise MinispecError(f"--draft-vocab: {e}") from None
        self.make_drafter = make_drafter
        self.drafter()  # built once now, so a bad --exit-layer or --tree shows before any text
        self.color = sys.stdout.isatty() and not args.no_color

    def prepare(self, prompt: str, source: str = "--prompt") -> list[int]:
        """The prompt's token ids, after every check a generation makes (so that an error comes
        before any text is echoed), with a notice on stderr for what will not run as asked."""
        check_text(prompt, source)
        ids = self.target.tokenizer.encode(prompt)
        ctx = self.target.config.max_position_embeddings
        if not ids:
            raise MinispecError(f"{source}: empty, and this tokenizer has no BOS token to start "
                                "from")
        if len(ids) >= ctx:
            raise MinispecError(f"{source}: {len(ids)} tokens leave no room for new tokens in "
                                f"the context of {ctx} positions")
        s = self.settings
        notices = []
        if not prompt:
            notices.append("note: the prompt is empty: generating from the BOS token alone")
        if len(ids) + s.max_new_tokens > ctx:
            notices.append(f"note: at most {ctx - len(ids)} new tokens fit after this "
                           f"{len(ids)}-token prompt (the context is {ctx} positions); "
                           f"max_new_tokens {s.max_new_tokens} is capped")
        if s.speculative and isinstance(s.gamma, int):
            cap, asked = self.gamma_for(len(ids)), min(s.max_new_tokens, ctx - len(ids))
            if s.gamma > asked:
                notices.append(f"note: gamma {s.gamma} is more than the {asked} new tokens to "
                               f"generate: capped to {cap} (a round emits its drafts plus one "
                               "token)")
            if cap > BIG_GAMMA:
                notices.append(f"note: gamma {cap} drafts up to {cap} tokens a round and drops "
                               "every one after the first rejection: many draft calls for few "
                               "tokens (minispec sweep measures the best gamma)")
        for notice in notices:
            print(notice, file=sys.stderr)
        return ids

    def gamma_for(self, n_prompt: int) -> int | str:
        """The gamma a generation runs with: the setting, capped to the new tokens that can come
        (a round emits at most gamma + 1 of them)."""
        s = self.settings
        if not isinstance(s.gamma, int):
            return s.gamma
        room = self.target.config.max_position_embeddings - n_prompt
        return max(1, min(s.gamma, min(s.max_new_tokens, room) - 1))

    def drafter(self):
        s = self.settings
        return self.make_drafter(s.drafter, self.target, draft_model=self.draft_model,
                                 exit_layer=s.exit_layer, tree=s.tree, dynamic=s.dynamic,
                                 stop=s.stop if s.drafter in ("eagle", "model") else None,
                                 draft_vocab=self.draft_vocab if s.drafter == "model" else None,
                                 copy=s.copy if s.drafter == "eagle" else None)

    def generate(self, ids: list[int], speculative: bool, on_round=None, verify=None):
        from .core.speculative import generate
        from .drafters import NoDrafter

        s = self.settings
        request = Request(s.max_new_tokens, self.target.config.eos_token_ids, s.seed)
        drafter = self.drafter() if speculative else NoDrafter(self.target)
        kw = {} if verify is None else {"verify": verify}
        return generate(self.target, drafter, ids, s.sampling, request,
                        gamma=self.gamma_for(len(ids)) if speculative else 0,
                        on_round=on_round, **kw)

    def warm_up(self, ids: list[int]) -> None:
        s = self.settings
        length, s.max_new_tokens = s.max_new_tokens, min(s.max_new_tokens, 4)
        try:
            self.generate(ids, True)
            self.generate(ids, False)
        finally:
            s.max_new_tokens = length

    def run(self, prompt: str, compare: bool = False, html: str | None = None,
            source: str = "--prompt") -> None:
        """Generate, showing the tokens as each round emits them (accepted drafts, the
        correction and the bonus token in their colors on a terminal), then the statistics;
        with `html`, also the page of minispec/html_trace.py."""
        from .html_trace import TracedVerify

        s = self.settings
        ids = self.prepare(prompt, source)  # every check first: an error comes before any text
        if compare:  # one short untimed run of each first, so neither pays the first-call costs
            self.warm_up(ids)
        tok = self.target.tokenizer
        traced = TracedVerify() if html else None
        print(prompt, end="", flush=True)

        def stream(r) -> None:
            if not self.color or not s.speculative:
                print(tok.decode(r.emitted), end="", flush=True)
                return
            kept = tok.decode(r.emitted[: r.accepted])
            last = tok.decode(r.emitted[r.accepted:])
            color = YELLOW if r.kind == "bonus" else CYAN
            print(f"{GREEN}{kept}{RESET}{color}{last}{RESET}", end="", flush=True)

        try:
            result = self.generate(ids, s.speculative or bool(html), on_round=stream,
                                   verify=traced)
        except (MinispecError, KeyboardInterrupt):
            print(flush=True)  # what follows (the error, the prompt) starts on its own line
            raise
        print("\n")
        if s.trace and s.speculative:
            print(render_trace(result.stats.rounds, tok.decode, self.color))
            print()
        print(format_stats(result, speculative=s.speculative or bool(html)))
        if html:
            self.write_html(prompt, html, result, traced)
        if compare:
            base = self.generate(ids, not s.speculative)
            spec, plain = (result, base) if s.speculative else (base, result)
            same = "identical" if spec.tokens == plain.tokens else "different (sampled)"
            print(format_stats(base, speculative=not s.speculative))
            print(f"speedup: {spec.stats.tokens_per_second / plain.stats.tokens_per_second:.2f}x "
                  f"(speculative {spec.stats.tokens_per_second:.1f} tok/s vs autoregressive "
                  f"{plain.stats.tokens_per_second:.1f} tok/s); outputs {same}")

    def write_html(self, prompt: str, path: str, result, traced) -> None:
        """--html: the generation as one self-contained page (minispec/html_trace.py)."""
        from .html_trace import page

        s = self.settings
        title = (f"minispec: {s.drafter} drafter, gamma {s.gamma}, temperature "
                 f"{s.sampling.temperature:g}")
        text = page(prompt, result, traced, self.target.tokenizer.decode, title,
                    greedy=s.sampling.temperature == 0)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise MinispecError(f"--html {path}: cannot write ({e.strerror})") from None
        print(f"wrote {path}: {len(result.stats.rounds)} rounds, {result.stats.new_tokens} "
              "tokens" + ("; at temperature 0 the uniform r plays no role: try --temperature 1"
                          if s.sampling.temperature == 0 else ""))


def check_text(text: str, source: str) -> None:
    """MinispecError naming `source` and the first byte that is not UTF-8 (Python reads such a
    byte in argv or a terminal line as a lone surrogate), before a tokenizer is blamed for it."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            at = len(text[:i].encode("utf-8", "surrogateescape"))
            byte = (f"byte 0x{ord(ch) - 0xdc00:02x}" if ch >= "\udc80" else
                    f"a lone surrogate U+{ord(ch):04X}")
            raise MinispecError(f"{source}: not UTF-8 text: {byte} at byte {at} (after "
                                f"{text[max(0, i - 20):i]!r}); give the prompt as UTF-8 "
                                "(iconv -t UTF-8 converts a file)")


def render_trace(rounds, decode, color: bool) -> str:
    """One line per round: accepted drafts, rejected drafts (of a tree, how many nodes were not
    kept), then the correction or bonus token."""

    def paint(text: str, code: str, plain: str) -> str:
        return f"{code}{text}{RESET}" if color else plain.format(text)

    lines = []
    for i, r in enumerate(rounds):
        # r.emitted is cut just after an EOS; the round's own token is its last entry otherwise
        kept = r.emitted[: r.accepted]
        parts = [paint(show_token(decode, t), GREEN, "{}") for t in kept]
        if len(r.emitted) > r.accepted:
            if 0 < r.depth < len(r.drafted):  # a tree: its nodes off the path, counted
                n = len(r.drafted) - r.accepted
                parts.append(paint(f"{n} other node{'s' * (n != 1)}", RED, "~{}~"))
            else:
                parts += [paint(show_token(decode, t), RED, "~{}~")
                          for t in r.drafted[r.accepted :]]
            last = show_token(decode, r.emitted[-1])
            parts.append(paint(last, YELLOW, "[+{}]") if r.kind == "bonus"
                         else paint(last, CYAN, "[->{}]"))
        lines.append(f"round {i + 1:3d} | " + " ".join(parts))
    legend = (f"{GREEN}accepted{RESET} {RED}rejected{RESET} {CYAN}correction{RESET} "
              f"{YELLOW}bonus{RESET}" if color else "accepted ~rejected~ [->correction] [+bonus]")
    return "\n".join([legend + f"  ({SPACE} is a space, tokens are separated by blanks)", *lines])


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
    """Apply one /command (its name in any case); False means quit. Every value is checked at
    once: a bad one leaves the setting as it was and says why, as "error: " and the message
    naming the setting (the words --max-new-tokens and the other flags use)."""
    s = session.settings
    name, _, arg = line[1:].partition(" ")
    name, arg = name.lower(), arg.strip()

    def number(a: str, kind, setting: str, expected: str):
        try:
            return kind(a)
        except ValueError:
            raise MinispecError(f"{setting}: expected {expected}, got {a!r}") from None

    def sampling(**change):  # a new Sampling: checked at once
        s.sampling = dataclasses.replace(s.sampling, **change)

    def length(a):  # Request's check: the same words as --max-new-tokens 0
        expected = "an integer >= 1"
        s.max_new_tokens = Request(number(a, int, "max_new_tokens", expected)).max_new_tokens

    def seed(a):
        n = None if a.lower() == "none" else number(a, int, "seed", "None or an integer >= 0")
        s.seed = Request(1, seed=n).seed

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
        "temperature": lambda a: sampling(temperature=number(
            a, float, "temperature", "a finite number >= 0")),
        "top_k": lambda a: sampling(top_k=number(a, int, "top_k", "an integer >= 0 (0 = off)")),
        "top_p": lambda a: sampling(top_p=number(
            a, float, "top_p", "a number in (0, 1] (1 = off)")),
        "length": length,
        "drafter": lambda a: drafter(a.lower()),
        "seed": seed,
    }
    toggles = {"speculative": ("speculative decoding", "plain autoregressive decoding"),
               "trace": ("trace on", "trace off")}
    if name in ("quit", "exit", "q", "help", "settings") and arg:
        print(f"error: /{name} takes no value, got {arg!r}")
    elif name in ("quit", "exit", "q"):
        return False
    elif name == "help":
        print(HELP)
    elif name == "settings":
        print(describe_settings(s))
    elif name in toggles:
        if arg.lower() not in ("", "on", "off"):
            print(f"error: /{name}: expected on, off or nothing (to toggle), got {arg!r}")
            return True
        value = not getattr(s, name) if not arg else arg.lower() == "on"
        setattr(s, name, value)
        print(toggles[name][0] if value else toggles[name][1])
    elif name in setters:
        if not arg:
            print(f"error: /{name} needs a value (see /help)")
            return True
        try:
            setters[name](arg)
        except MinispecError as e:
            print(f"error: {e}")
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
                                         if s.tree else "")
        + (f" (stop {s.stop:g})" if s.stop is not None and s.drafter in ("eagle", "model")
           else "")
        + (f" (draft vocabulary {s.draft_vocab})" if s.draft_vocab and s.drafter == "model"
           else "")
        + (f" (copy {s.copy})" if s.copy is not None and s.drafter == "eagle" else ""),
        f"  gamma        {s.gamma}",
        f"  temperature  {sp.temperature:g}   top_k {sp.top_k}   top_p {sp.top_p:g}",
        f"  length       {s.max_new_tokens}",
        f"  seed         {s.seed}",
        f"  trace        {'on' if s.trace else 'off'}"])


def interactive(session: Session, history: Path | None = None) -> None:
    """The REPL: line editing (readline), its history kept in the file `history` between
    sessions, Ctrl-C stops the generation in progress (or clears the line) and keeps the
    settings, Ctrl-D quits. A line that is not UTF-8 is named as the prompt, byte and all."""
    try:
        import readline  # importing it gives input() line editing and history
    except ImportError:  # not on every platform
        readline = None
    if readline is not None and history is not None:
        history = history.expanduser()
        readline.set_history_length(1000)
        try:
            readline.read_history_file(history)
        except OSError:  # the first session, or an unreadable file: start empty
            pass
    if hasattr(sys.stdin, "reconfigure"):  # a non-UTF-8 byte reaches check_text, not a crash
        sys.stdin.reconfigure(errors="surrogateescape")
    print("minispec: type a prompt; /help for commands, /settings for the current ones. "
          "Ctrl-C stops a generation, Ctrl-D quits.")
    try:
        repl(session)
    finally:
        if readline is not None and history is not None:
            try:
                readline.write_history_file(history)
            except OSError as e:
                print(f"note: history not kept: {history}: {e.strerror}", file=sys.stderr)


def repl(session: Session) -> None:
    """Read, generate or apply a /command, print; until /quit or Ctrl-D."""
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
            session.run(line, source="prompt")
        except KeyboardInterrupt:
            print("(stopped; settings kept)")
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
        if argv and argv[0] == "roofline":
            from .measure import roofline

            return roofline.main(argv[1:])
        if argv and argv[0] == "real":  # SmolLM2 (minispec/real.py); its demo runs this main
            from .real import main as real_main

            return real_main(argv[1:], demo_run=main)
        if argv and argv[0] == "judge":
            from .judge import main as judge_main

            return judge_main(argv[1:])
        if argv and argv[0] in ("crossover", "serve"):
            from .measure import crossover

            return (crossover.main if argv[0] == "crossover" else crossover.serve_main)(argv[1:])
        args = build_parser().parse_args(argv)
        if args.html and args.prompt is None:
            raise MinispecError("--html: needs --prompt TEXT (the interactive prompt writes no "
                                "page)")
        set_blas_threads(args.threads)
        session = Session(args)
        if args.prompt is None:
            interactive(session, HISTORY if sys.stdin.isatty() else None)
        else:
            session.run(args.prompt, compare=args.compare, html=args.html)
    except MinispecError as e:
        hint = "" if "holds model directories" in str(e) else models_hint(str(e))
        print(f"minispec: error: {e}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
