"""Reading and writing .safetensors files: header checks, memory-mapped tensors, BF16, shards.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N
bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then
the raw little-endian tensor bytes, offsets relative to the end of the header. We parse the header
ourselves and check every number in it against the file size before touching the data, so a lying
header raises MinispecError instead of allocating or reading out of bounds. Tensors are views into a
numpy.memmap: nothing is read until it is used. Never pickle: .bin / .pt checkpoints are refused.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import _no_constant, bounded_int
from .errors import MinispecError

# bytes per element of every dtype the format defines (to check sizes); minispec reads the first 3
ITEMSIZE = {
    "F32": 4, "F16": 2, "BF16": 2,
    "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}
SUPPORTED = ("F32", "F16", "BF16")
MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit too
# tensors one file may declare: a 70B Llama has 723 in all, a shard of the largest MoE checkpoints
# a few thousand; parsing a million tiny entries would take over a gigabyte before any check
MAX_TENSORS = 50_000
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in a file: dtype, shape, byte range (relative to the data section)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """BF16 bits (uint16) -> float32: BF16 is the top half of a float32, so shift the bits up 16."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bits (uint16), rounding to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = 0x7FC0
    return rounded


class SafetensorsFile:
    """One .safetensors file: the checked header, and tensors read lazily through a memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metadata, self.tensors, self._data_start = _read_header(self.path)
        self._mm: np.ndarray | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __iter__(self):
        return iter(self.tensors)

    def keys(self) -> list[str]:
        """Tensor names in the file."""
        return list(self.tensors)

    def _data(self) -> np.ndarray:
        if self._mm is None:
            size = self.path.stat().st_size - self._data_start
            if size == 0:  # numpy cannot map zero bytes
                self._mm = np.zeros(0, np.uint8)
            else:
                self._mm = np.memmap(self.path, np.uint8, mode="r", offset=self._data_start)
        return self._mm

    def get(self, name: str) -> np.ndarray:
        """The tensor `name` as float32 (BF16 converted) or float16; F32/F16 are read-only views."""
        info = self.tensors.get(name)
        if info is None:
            raise MinispecError(f"{self.path}: no tensor named {name!r}")
        if info.dtype not in SUPPORTED:
            raise MinispecError(f"{self.path}: tensor {name!r} has dtype {info.dtype}; minispec "
                                f"reads {', '.join(SUPPORTED)}")
        raw = self._data()[info.begin:info.end]
        if info.dtype == "BF16":
            return bf16_to_f32(raw.view("<u2")).reshape(info.shape)
        return raw.view("<f4" if info.dtype == "F32" else "<f2").reshape(info.shape)

    def get_ints(self, name: str) -> np.ndarray:
        """The integer tensor `name` (I64 or I32) as int64: ids, never weights."""
        info = self.tensors.get(name)
        if info is None:
            raise MinispecError(f"{self.path}: no tensor named {name!r}")
        if info.dtype not in ("I64", "I32"):
            raise MinispecError(f"{self.path}: tensor {name!r} has dtype {info.dtype}; expected "
                                "integers (I64 or I32)")
        raw = self._data()[info.begin:info.end]
        return raw.view("<i8" if info.dtype == "I64" else "<i4").reshape(info.shape).astype(
            np.int64)

    def get_bytes(self, name: str) -> np.ndarray:
        """The U8 tensor `name` (a copy in memory): bytes, never weights of their own."""
        info = self.tensors.get(name)
        if info is None:
            raise MinispecError(f"{self.path}: no tensor named {name!r}")
        if info.dtype != "U8":
            raise MinispecError(f"{self.path}: tensor {name!r} has dtype {info.dtype}; expected "
                                "bytes (U8)")
        return np.array(self._data()[info.begin:info.end]).reshape(info.shape)


def _read_header(path: Path) -> tuple[dict[str, str], dict[str, TensorInfo], int]:
    if path.exists() and not path.is_file():
        raise MinispecError(f"{path}: not a regular file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise MinispecError(f"{path}: truncated: {size} bytes, a safetensors file starts "
                                    f"with an 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > MAX_HEADER:
                raise MinispecError(f"{path}: header length {n} does not fit: the file has "
                                    f"{size - 8} bytes after the length field (truncated or not "
                                    f"a safetensors file?)")
            raw = f.read(n)
    except FileNotFoundError:
        raise MinispecError(f"{path}: file not found") from None
    except OSError as e:
        raise MinispecError(f"{path}: cannot read ({e})") from None
    objects = 0

    def counted(pairs: list) -> dict:  # called once per JSON object, as the parser closes it
        nonlocal objects
        objects += 1
        if objects > MAX_TENSORS + 2:  # the tensors' entries, __metadata__, the header itself
            raise _TooManyTensors
        return dict(pairs)

    try:
        header = json.loads(raw.decode("utf-8"), parse_int=bounded_int,
                            parse_constant=_no_constant, object_pairs_hook=counted)
    except _TooManyTensors:
        raise MinispecError(f"{path}: the header declares more than {MAX_TENSORS} tensors (or "
                            f"objects); real checkpoint files hold a few thousand") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise MinispecError(f"{path}: header is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise MinispecError(f"{path}: header should be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise MinispecError(f"{path}: __metadata__ should be an object, got {metadata!r}")
    data_size = size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _check_entry(path, name, entry, data_size)
    spans = sorted((t.begin, t.end, name) for name, t in tensors.items() if t.end > t.begin)
    for (_, end0, name0), (begin1, _, name1) in itertools.pairwise(spans):
        if begin1 < end0:
            raise MinispecError(f"{path}: tensors {name0!r} and {name1!r} overlap in the file "
                                f"(data_offsets)")
    covered = sum(end - begin for begin, end, _ in spans)
    if covered != data_size:  # the format: the tensors tile the data section exactly
        raise MinispecError(f"{path}: the tensors' data_offsets cover {covered} bytes but the "
                            f"data section has {data_size} (a shifted or truncated header?)")
    return metadata, tensors, 8 + n


def _encodable(name: str) -> bool:
    """Whether a file name can reach the file system (a lone surrogate cannot)."""
    try:
        os.fsencode(name)
        return True
    except UnicodeError:
        return False


class _TooManyTensors(Exception):
    pass


def _check_entry(path: Path, name: str, entry: Any, data_size: int) -> TensorInfo:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise MinispecError(f"{where}: header entry should be an object, got {entry!r}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise MinispecError(f"{where}: unknown dtype {dtype!r:.60}; expected one of "
                            f"{', '.join(SUPPORTED)}")

    def ints(value: Any) -> bool:
        return isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)

    if not ints(shape) or len(shape) > 8:
        raise MinispecError(f"{where}: shape should be a list of at most 8 non-negative "
                            f"integers, got {shape!r:.100}")
    if not ints(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise MinispecError(f"{where}: data_offsets should be [begin, end] with begin <= end, "
                            f"got {offsets!r:.100}")
    begin, end = offsets
    if end > data_size:
        raise MinispecError(f"{where}: data_offsets {offsets} run past the end of the data "
                            f"({data_size} bytes): file truncated?")
    nbytes = math.prod(shape) * ITEMSIZE[dtype]
    if nbytes != end - begin:
        raise MinispecError(f"{where}: shape {shape} x {dtype} is {nbytes} bytes but data_offsets "
                            f"{offsets} span {end - begin}")
    return TensorInfo(dtype, tuple(shape), begin, end)


class Checkpoint:
    """The tensors of a model directory: model.safetensors, or shards listed in the index JSON."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / INDEX_NAME
        single = self.directory / SINGLE_NAME
        self._where: dict[str, SafetensorsFile] = {}
        if index.exists():
            self._open_shards(index)
        elif single.exists():
            f = SafetensorsFile(single)
            self._where = {name: f for name in f.tensors}
        else:
            pickled = [p.name for p in self.directory.glob("*.bin")] + [
                p.name for p in self.directory.glob("*.pt")]
            hint = (f" (found {', '.join(sorted(pickled))}: pickled checkpoints are not read, "
                    f"convert them to safetensors)" if pickled else "")
            raise MinispecError(f"{self.directory}: no {SINGLE_NAME} or {INDEX_NAME}{hint}")

    def _open_shards(self, index: Path) -> None:
        from .config import read_json

        doc = read_json(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise MinispecError(f"{index}: expected an object with a non-empty 'weight_map' "
                                f"{{tensor name: shard file}}")
        files: dict[str, SafetensorsFile] = {}
        for name, fname in weight_map.items():
            if (not isinstance(fname, str) or os.path.basename(fname) != fname or not fname
                    or fname in (".", "..") or "\0" in fname or not fname.isprintable()
                    or not _encodable(fname)):
                raise MinispecError(f"{index}: weight_map[{name!r}] should be a file name in the "
                                    f"same directory, got {fname!r:.100}")
            if fname not in files:
                files[fname] = SafetensorsFile(self.directory / fname)
            if name not in files[fname]:
                raise MinispecError(f"{self.directory / fname}: no tensor named {name!r}, but "
                                    f"{INDEX_NAME} says it is there")
            self._where[name] = files[fname]

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def keys(self) -> list[str]:
        """Every tensor name in the checkpoint."""
        return list(self._where)

    def file_of(self, name: str) -> Path:
        """The file holding `name` (the directory when it is in none, for error messages)."""
        f = self._where.get(name)
        return f.path if f is not None else self.directory

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name` as its header declares it."""
        return self._where[name].tensors[name].shape

    def dtype(self, name: str) -> str:
        """The safetensors dtype of tensor `name` ("F32", "BF16", ...)."""
        return self._where[name].tensors[name].dtype

    def get(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 or float16 (see SafetensorsFile.get)."""
        if name not in self._where:
            raise MinispecError(f"{self.directory}: no tensor named {name!r} in the checkpoint")
        return self._where[name].get(name)


def save_file(tensors: dict[str, np.ndarray], path: str | Path, *, bf16: bool = False,
              metadata: dict[str, str] | None = None) -> None:
    """Write float32 / float16 (and int64, uint8) arrays as a .safetensors file (float32 stored
    as BF16 if `bf16`)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs, offset = [], 0
    for name, a in tensors.items():
        a = np.asarray(a)
        if a.dtype == np.float32 and bf16:
            dtype, data = "BF16", f32_to_bf16(a).astype("<u2")
        elif a.dtype in (np.float32, np.float16):
            dtype, data = ("F32", a.astype("<f4")) if a.dtype == np.float32 else ("F16",
                                                                                  a.astype("<f2"))
        elif a.dtype == np.int64:  # ids (a draft vocabulary), never weights
            dtype, data = "I64", a.astype("<i8")
        elif a.dtype == np.uint8:  # bytes (a GGUF file's blocks: minispec.convert)
            dtype, data = "U8", a
        else:
            raise MinispecError(f"save_file: tensor {name!r} has dtype {a.dtype}; expected "
                                "float32, float16, int64 or uint8")
        raw = np.ascontiguousarray(data).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)
