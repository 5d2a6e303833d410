"""The safetensors reader: values, BF16, and every way a file or its header can lie."""

import json

import numpy as np
import pytest

from minispec.errors import MinispecError
from minispec.safetensors import Checkpoint, SafetensorsFile, bf16_to_f32, f32_to_bf16, save_file


def _raw_file(path, header: dict, data: bytes = b"", length: int | None = None) -> None:
    text = json.dumps(header).encode()
    n = len(text) if length is None else length
    path.write_bytes(n.to_bytes(8, "little") + text + data)


def test_read_back_f32_f16(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    b = np.linspace(-2, 2, 5).astype(np.float16)
    save_file({"a": a, "b": b}, tmp_path / "x.safetensors", metadata={"format": "pt"})
    f = SafetensorsFile(tmp_path / "x.safetensors")
    assert f.keys() == ["a", "b"] and f.metadata == {"format": "pt"}
    np.testing.assert_array_equal(f.get("a"), a)
    assert f.get("b").dtype == np.float16
    np.testing.assert_array_equal(f.get("b"), b)


def test_reads_files_written_by_the_safetensors_library(tmp_path):
    from safetensors.numpy import save_file as lib_save

    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    lib_save({"w": a, "h": a[0].astype(np.float16)}, str(tmp_path / "lib.safetensors"))
    f = SafetensorsFile(tmp_path / "lib.safetensors")
    np.testing.assert_array_equal(f.get("w"), a)
    np.testing.assert_array_equal(f.get("h"), a[0].astype(np.float16))


def test_bf16_conversion():
    x = np.array([1.0, -2.5, 3.140625, 1e-3, 65504.0, np.inf, 0.0], dtype=np.float32)
    back = bf16_to_f32(f32_to_bf16(x))
    np.testing.assert_allclose(back, x, rtol=2**-8)
    assert back[2] == 3.140625  # exactly representable values are exact
    # rounding to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7
    assert bf16_to_f32(f32_to_bf16(np.float32([1 + 2**-8])))[0] == 1.0
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.float32([np.nan]))))[0]


def test_bf16_known_bits(tmp_path):
    # 0x3F80 is 1.0, 0xC000 is -2.0 in BF16: what torch writes for those values
    data = np.array([0x3F80, 0xC000], dtype="<u2").tobytes()
    _raw_file(tmp_path / "x.safetensors",
              {"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, data)
    np.testing.assert_array_equal(SafetensorsFile(tmp_path / "x.safetensors").get("t"), [1.0, -2.0])


def test_empty_file_and_empty_tensor(tmp_path):
    save_file({}, tmp_path / "e.safetensors")
    assert SafetensorsFile(tmp_path / "e.safetensors").keys() == []
    save_file({"z": np.zeros((0, 3), np.float32)}, tmp_path / "z.safetensors")
    assert SafetensorsFile(tmp_path / "z.safetensors").get("z").shape == (0, 3)


GOOD = {"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


@pytest.mark.parametrize("header, data, length, message", [
    (GOOD, b"\0" * 16, 10**12, "header length 1000000000000 does not fit"),
    (GOOD, b"\0" * 16, 2**64 - 1, "does not fit"),
    ({"t": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None,
     "unknown dtype 'F99'"),
    ({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8, None,
     "run past the end"),
    ({"t": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}, b"\0" * 24, None,
     "shape \\[2, 3\\] x F32 is 24 bytes but data_offsets \\[0, 16\\] span 16"),
    ({"t": {"dtype": "F32", "shape": [10**9, 10**9], "data_offsets": [0, 16]}}, b"\0" * 16, None,
     "is 4000000000000000000 bytes"),
    ({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None,
     "shape should be a list of at most 8 non-negative integers"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, None,
     "begin <= end"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": "0-8"}}, b"\0" * 8, None,
     "data_offsets should be"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None,
     "'a' and 'b' overlap"),
    ({"t": "F32"}, b"", None, "header entry should be an object"),
    ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, None,
     "cover 4 bytes but the data section has 8"),  # the tensors must tile the data exactly
    ({"t": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, None,
     "unknown dtype"),
    ({"__metadata__": 3}, b"", None, "__metadata__ should be an object"),
])
def test_lying_headers(tmp_path, header, data, length, message):
    path = tmp_path / "bad.safetensors"
    _raw_file(path, header, data, length)
    with pytest.raises(MinispecError, match=message) as err:
        SafetensorsFile(path)
    assert str(path) in str(err.value)


def test_not_json_and_truncated(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes((5).to_bytes(8, "little") + b"{nope")
    with pytest.raises(MinispecError, match="header is not valid JSON"):
        SafetensorsFile(path)
    path.write_bytes((4).to_bytes(8, "little") + b"[1]\n")
    with pytest.raises(MinispecError, match="should be a JSON object"):
        SafetensorsFile(path)
    path.write_bytes(b"\x01\x02")
    with pytest.raises(MinispecError, match="truncated: 2 bytes"):
        SafetensorsFile(path)
    # a real file cut short in its data
    save_file({"a": np.ones(100, np.float32)}, path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(MinispecError, match="run past the end.*truncated"):
        SafetensorsFile(path)
    with pytest.raises(MinispecError, match="file not found"):
        SafetensorsFile(tmp_path / "missing.safetensors")


def test_known_but_unsupported_dtype(tmp_path):
    path = tmp_path / "i.safetensors"
    _raw_file(path, {"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16)
    f = SafetensorsFile(path)  # the header is fine: only reading the tensor is refused
    with pytest.raises(MinispecError, match="'ids' has dtype I64; minispec reads F32, F16, BF16"):
        f.get("ids")
    with pytest.raises(MinispecError, match="no tensor named 'x'"):
        f.get("x")


def test_checkpoint_shards_and_bad_index(tmp_path):
    save_file({"a": np.ones(2, np.float32)}, tmp_path / "s1.safetensors")
    save_file({"b": np.zeros(3, np.float32)}, tmp_path / "s2.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    ck = Checkpoint(tmp_path)
    assert sorted(ck.keys()) == ["a", "b"] and ck.shape("b") == (3,)
    assert ck.file_of("b").name == "s2.safetensors"
    np.testing.assert_array_equal(ck.get("a"), [1, 1])

    for doc, message in [
        ({"weight_map": {"a": "s2.safetensors"}}, "s2.safetensors: no tensor named 'a'"),
        ({"weight_map": {"a": "../s1.safetensors"}}, "should be a file name in the same dir"),
        ({"weight_map": {"a": "s9.safetensors"}}, "s9.safetensors: file not found"),
        ({"weight_map": {}}, "non-empty 'weight_map'"),
        ([1, 2], "non-empty 'weight_map'"),
    ]:
        index.write_text(json.dumps(doc))
        with pytest.raises(MinispecError, match=message):
            Checkpoint(tmp_path)
    index.write_text("{")
    with pytest.raises(MinispecError, match="index.json: not valid JSON"):
        Checkpoint(tmp_path)


def test_checkpoint_refuses_pickles(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(MinispecError, match="pytorch_model.bin: pickled checkpoints are not read"):
        Checkpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(MinispecError, match="no model.safetensors or model.safetensors.index.json"):
        Checkpoint(tmp_path)


@pytest.mark.parametrize("shard", ["\ud800.safetensors", "a\0b", "..", "sub/x.safetensors", 7])
def test_index_shard_names_are_plain_file_names(tmp_path, shard):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
    with pytest.raises(MinispecError, match="weight_map"):
        Checkpoint(tmp_path)


def test_a_header_declaring_too_many_tensors_is_refused_before_it_is_all_parsed(tmp_path):
    import tracemalloc

    from minispec.safetensors import MAX_TENSORS

    n = 4 * MAX_TENSORS  # the campaign's file had a million: 1.6 GB peak before this bound
    entries = ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
                       for i in range(n))
    header = ("{" + entries + "}").encode()
    path = tmp_path / "many.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    tracemalloc.start()
    try:
        with pytest.raises(MinispecError, match=f"declares more than {MAX_TENSORS} tensors"):
            SafetensorsFile(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the raw header (~15 MB here) plus at most MAX_TENSORS parsed entries
    assert peak < len(header) * 2 + 600 * MAX_TENSORS
    few = ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
                   for i in range(1000))
    header = ("{" + few + "}").encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    assert len(SafetensorsFile(path).keys()) == 1000


def test_the_tensor_count_bound_is_exact(tmp_path):
    from minispec.safetensors import MAX_TENSORS

    path = tmp_path / "edge.safetensors"
    for n, ok in ((MAX_TENSORS, True), (MAX_TENSORS + 1, False)):
        entries = ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
                           for i in range(n))
        header = ('{"__metadata__":{"format":"pt"},' + entries + "}").encode()
        path.write_bytes(len(header).to_bytes(8, "little") + header)
        if ok:
            assert len(SafetensorsFile(path).keys()) == MAX_TENSORS
        else:
            with pytest.raises(MinispecError, match="more than 50000 tensors"):
                SafetensorsFile(path)
