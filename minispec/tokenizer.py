"""A thin layer over the `tokenizers` library: text <-> token ids for a model directory's
tokenizer.json.

Special tokens are handled here, explicitly: encode() never lets the tokenizer's post-processor add
anything and prepends BOS itself when the model's tokenizer would (Llama does, Qwen2 and GPT-2
don't).
"""

from __future__ import annotations

import json
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

        doc = read_json(Path(path))
        if not isinstance(doc, dict):
            raise MinispecError(f"{path}: expected a JSON object")
        # generation has no use for padding or truncation, and a huge fixed padding aborts the
        # whole process inside the library: both are dropped before it sees the file
        doc["padding"] = doc["truncation"] = None
        try:
            tok = HFTokenizer.from_str(json.dumps(doc))
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


SPACE = "\u00b7"  # a space inside a token, as the traces write it: ' self' shows as '·self'


def show_token(decode, token: int) -> str:
    """A token as text with whitespace made visible (newlines as \\n, spaces as ·), for the
    terminal trace and the --html page: the blanks between tokens are then the only spaces."""
    return repr(decode([token]))[1:-1].replace(" ", SPACE)
