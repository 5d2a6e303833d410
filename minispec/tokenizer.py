"""A thin layer over the `tokenizers` library: text <-> token ids for a model directory's
tokenizer.json.

Special tokens are handled here, explicitly: encode() never lets the tokenizer's post-processor add
anything and prepends BOS itself when the model's tokenizer would (Llama does, Qwen2 and GPT-2
don't).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .errors import MinispecError


class Tokenizer:
    """Text <-> ids. bos_id: the id encode(add_bos=True) prepends; None: the model adds no BOS."""

    def __init__(self, tok: Any, *, bos_id: int | None = None, eos_id: int | None = None,
                 source: str = "tokenizer.json"):
        self.tok = tok  # a tokenizers.Tokenizer
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.source = source

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Read tokenizer.json (BOS/EOS are filled in by the loader)."""
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:  # pragma: no cover - tokenizers is a runtime dependency
            raise MinispecError(f"{path}: reading it needs the 'tokenizers' package "
                                f"(pip install tokenizers)") from None
        from .config import read_json

        doc = read_json(Path(path))  # the size, the nesting, NaN: refused with its position
        if not isinstance(doc, dict):
            raise MinispecError(f"{path}: expected a JSON object")
        text = Path(path).read_text(encoding="utf-8")
        # generation has no use for padding or truncation, and a huge fixed padding aborts the
        # whole process inside the library: both are blanked out before it sees the file, in
        # place, so that the line and column of any error it reports are the file's own
        if doc.get("padding") is not None or doc.get("truncation") is not None:
            text = blank_fields(text, ("padding", "truncation"))
        try:
            tok = HFTokenizer.from_str(text)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - its Rust panics derive from BaseException
            raise MinispecError(f"{path}: not a valid tokenizer.json "
                                f"({type(e).__name__}: {str(e)[:200]})") from None
        return cls(tok, source=str(path))

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows, special tokens included (may be below the model's V)."""
        return self.tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string, or None."""
        return self.tok.token_to_id(token)

    def call(self, what: str, fn, *args, **kwargs):
        """A call into the tokenizers library, its errors (and its Rust panics, which derive
        from BaseException) reported as MinispecError naming the file."""
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001
            raise MinispecError(f"{self.source}: the tokenizer failed to {what} "
                                f"({type(e).__name__}: {str(e)[:200]})") from None

    def post_processor_bos(self) -> int | None:
        """The id the tokenizer's own post-processor puts in front of a text, if any."""
        try:
            plain = self.call("encode", self.tok.encode, "a", add_special_tokens=False).ids
            special = self.call("encode", self.tok.encode, "a", add_special_tokens=True).ids
        except MinispecError:  # e.g. a word-level vocabulary without "a" or [UNK]
            plain = []
            special = self.call("encode", self.tok.encode, "", add_special_tokens=True).ids
        if len(special) > len(plain) and special[1:1 + len(plain)] == plain:
            return special[0]
        return None

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`, with BOS in front when add_bos and the model has one."""
        if not isinstance(text, str):
            raise MinispecError(f"encode: text must be a str, got {type(text).__name__}")
        ids = self.call("encode", self.tok.encode, text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos and self.bos_id is not None else []) + list(ids)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of token ids (special tokens kept unless skip_special_tokens)."""
        try:
            ok = not isinstance(ids, (str, bytes)) and not any(isinstance(i, bool) for i in ids)
            ids = [int(i) for i in ids] if ok else None
        except (TypeError, ValueError, OverflowError):
            ids = None
        if ids is None or any(not 0 <= i < 2**32 for i in ids):
            raise MinispecError("decode: expected a sequence of token ids (integers >= 0)")
        return self.call("decode", self.tok.decode, ids, skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab={self.vocab_size}, bos={self.bos_id})"


def blank_fields(text: str, names: tuple[str, ...]) -> str:
    """JSON object text with the values of its top-level fields `names` replaced by null, every
    other character kept at its line and column: the replacement is `null` padded with spaces,
    and keeps the newlines of what it replaces (a value shorter than 4 characters shifts the rest
    of its own line only)."""
    decoder, ws = json.JSONDecoder(), re.compile(r"[ \t\n\r]*")
    i = ws.match(text, ws.match(text).end() + 1).end()  # past "{"
    pieces, done = [], 0
    while i < len(text) and text[i] == '"':
        key, i = json.decoder.scanstring(text, i + 1)
        i = ws.match(text, ws.match(text, i).end() + 1).end()  # past ":"
        _, end = decoder.raw_decode(text, i)
        if key in names:
            lines = text[i:end].split("\n")
            pieces += [text[done:i], "\n".join(["null".ljust(len(lines[0]))]
                                                + [" " * len(line) for line in lines[1:]])]
            done = end
        i = ws.match(text, end).end()
        i = ws.match(text, i + 1).end() if text[i:i + 1] == "," else i
    return "".join(pieces) + text[done:]


SPACE = "\u00b7"  # a space inside a token, as the traces write it: ' self' shows as '·self'


def show_token(decode, token: int) -> str:
    """A token as text with whitespace made visible (newlines as \\n, spaces as ·), for the
    terminal trace and the --html page: the blanks between tokens are then the only spaces."""
    return repr(decode([token]))[1:-1].replace(" ", SPACE)
