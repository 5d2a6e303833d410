"""minispec/backend.py: the one CPU speed path of the math (backend.matmul, few_rows_matmul)
against NumPy's `x @ w`, at every weight shape of the shipped models and of SmolLM2-135M, 1..32
rows and more; and the fallback to `x @ w` when the kernel is off or numba is missing."""

import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

from minispec.backend import (
    BF16,
    F16,
    KERNEL_MAX_ROWS,
    Arena,
    few_rows_matmul,
    kernel_available,
    kernel_weight,
    matmul,
    use_kernel,
    widen,
)
from minispec.errors import MinispecError
from minispec.loader import load
from minispec.shipped import SHIPPED

needs_numba = pytest.mark.skipif(not kernel_available(), reason="numba is not installed")

# [D_in, D_out] of every weight product: the shipped target (D 512, 8/2 heads of 64, F 1376,
# V 4096), the draft (D 192, 3/1 heads, F 512), the Medusa heads (512 -> 512, as wo) and the
# EAGLE head's fc (1024 -> 512); SmolLM2-135M (D 576, 9/3 heads of 64, F 1536) but its head
SHAPES = {
    "target qkv": (512, 768), "target wo": (512, 512), "target up": (512, 1376),
    "target down": (1376, 512), "target head": (512, 4096),
    "draft qkv": (192, 320), "draft wo": (192, 192), "draft up": (192, 512),
    "draft down": (512, 192), "draft head": (192, 4096), "eagle fc": (1024, 512),
    "smollm2 qkv": (576, 960), "smollm2 wo": (576, 576), "smollm2 up": (576, 1536),
    "smollm2 down": (1536, 576), "odd": (37, 13),
}
SMOLLM2_HEAD = (576, 49152)  # 113 MB: a few rows only, to stay fast
ROWS = 32  # every row count up to this one is tried: 1..6 rows make one pass, more make several
RNG = np.random.default_rng(0)


def weight(d_in: int, d_out: int) -> np.ndarray:
    """A random w [D_in, D_out] stored as loader.py stores it: a view of [D_out, D_in]."""
    return RNG.standard_normal((d_out, d_in), dtype=np.float32).T / np.float32(np.sqrt(d_in))


def reference(x, w):
    """The exact product (float64) and the scale of its round-off, sum_i |x_i w_i|."""
    w64 = w.astype(np.float64)
    return x.astype(np.float64) @ w64, np.abs(x).astype(np.float64) @ np.abs(w64)


def assert_close(got, exact, scale):
    # float32 sums in another order: each output within 2e-5 of sum |x_i w_i| of the exact one
    assert got.shape == exact.shape and got.dtype == np.float32
    assert np.all(np.abs(got - exact) <= 2e-5 * scale)


@needs_numba
@pytest.mark.parametrize("name", SHAPES)
def test_few_rows_equal_numpy_at_every_shape(name):
    w = weight(*SHAPES[name])
    x = RNG.standard_normal((100, w.shape[0]), dtype=np.float32)
    exact, scale = reference(x, w)  # row by row: rows :t of it are those of x[:t]
    for t in [*range(1, ROWS + 1), 100]:
        assert_close(matmul(x[:t], w), exact[:t], scale[:t])
    assert_close(x @ w, exact, scale)  # NumPy itself meets the same bound


def as_bf16(w: np.ndarray) -> np.ndarray:
    """w [D_in, D_out] (a view of [D_out, D_in]) rounded down to bfloat16, held as BF16 the way
    the loader holds it: the top 16 bits of each float32."""
    return (np.ascontiguousarray(w.T).view(np.uint32) >> 16).astype(BF16).T


def test_widen_is_exact_for_every_bfloat16():
    bits = np.arange(2**16, dtype=np.uint32)
    wide = widen(bits.astype(BF16))
    np.testing.assert_array_equal(wide.view(np.uint32), bits << 16)  # NaNs and infs included
    w = RNG.standard_normal((3, 5), dtype=np.float32)
    assert widen(w) is w  # float32 stays as it is


def as_f16(w: np.ndarray) -> np.ndarray:
    """w [D_in, D_out] (a view of [D_out, D_in]) rounded to float16, held as the loader holds a
    float16 checkpoint's matrices (F16, one output per row)."""
    return np.ascontiguousarray(w.T).astype(F16).T


@needs_numba
@pytest.mark.parametrize("stored", [as_bf16, as_f16])
@pytest.mark.parametrize("name", [*SHAPES, "smollm2 head"])
def test_16_bit_weights_give_the_float32_products_bit_for_bit(name, stored):
    # a BF16 or F16 weight is widened in registers and summed in the same order as its float32
    # copy: every row count, every shape, the same bits as the widened-at-load weight
    w = stored(weight(*(SHAPES.get(name) or SMOLLM2_HEAD)))
    rows = ROWS + 1 if name != "smollm2 head" else 2
    x = RNG.standard_normal((rows, w.shape[0]), dtype=np.float32)
    wide = widen(w)
    assert wide.T.flags.c_contiguous and w.nbytes * 2 == wide.nbytes
    for t in range(1, rows + 1):
        np.testing.assert_array_equal(matmul(x[:t], w), matmul(x[:t], wide))
    np.testing.assert_array_equal(few_rows_matmul(x[:3], w), few_rows_matmul(x[:3], wide))
    with use_kernel(False):  # NumPy's product widens first: the readable reference
        np.testing.assert_array_equal(matmul(x[:2], w), x[:2] @ wide)


@needs_numba
@pytest.mark.parametrize("stored", [None, as_bf16, as_f16])
@pytest.mark.parametrize("name", SHAPES)
def test_a_row_does_not_depend_on_the_rows_beside_it(name, stored):
    # each output is summed in one order, whatever rows go with it in a pass (1..6) or how many
    # passes there are, so a verify call's products equal, bit for bit, the same rows sent
    # alone or in another group
    w = weight(*SHAPES[name])
    w = w if stored is None else stored(w)
    x = RNG.standard_normal((ROWS, w.shape[0]), dtype=np.float32)
    y = matmul(x, w)
    for t in range(1, ROWS):
        np.testing.assert_array_equal(y[:t], matmul(x[:t], w))
        np.testing.assert_array_equal(y[t:], matmul(x[t:], w))
    np.testing.assert_array_equal(y[[4, 4]], matmul(x[[4, 4]], w))


@needs_numba
@pytest.mark.parametrize("stored", [None, as_bf16, as_f16])
def test_the_narrow_pass_gives_the_wide_passs_bits(stored):
    # a pass of 16 lanes (the machine's choice from kernels.narrow_from rows on, where AVX2
    # would spill 64 lanes' sums) sums each output in the same order: the same bits, on any
    # machine, for every row count and every shape
    from minispec.kernels import compiled

    loops = compiled()
    assert loops.narrow_from in (4, 7)
    for name in SHAPES:
        w = weight(*SHAPES[name])
        w = w if stored is None else stored(w)
        tiles = kernel_weight(w)
        x = RNG.standard_normal((13, w.shape[0]), dtype=np.float32)
        for t in range(1, 14):
            wide, narrow, mixed = (np.full((t, w.shape[1]), np.nan, np.float32) for _ in "abc")
            loops.product_rows(x[:t], tiles, wide, 7, 0)  # 64 lanes in every pass
            loops.product_rows(x[:t], tiles, narrow, 2, 0)  # 16 lanes for 1..6 rows, over 1..13
            loops.product_rows(x[:t], tiles, mixed, 4, 0)  # AVX2's: row 0 wide, then 16 lanes
            np.testing.assert_array_equal(narrow, wide)
            np.testing.assert_array_equal(mixed, wide)
            np.testing.assert_array_equal(matmul(x[:t], w), wide)


@needs_numba
@pytest.mark.parametrize("stored", [None, as_bf16])
def test_prefetching_ahead_changes_no_bit(stored):
    # a pass of several rows may ask for the tile's rows some bytes ahead (the machine's choice,
    # kernels.ahead): a hint to the memory, past the tile's end and the weight's too
    from minispec.kernels import AHEAD_BYTES, compiled

    loops = compiled()
    assert loops.ahead in (0, AHEAD_BYTES)
    for name in SHAPES:
        w = weight(*SHAPES[name])
        w = w if stored is None else stored(w)
        tiles = kernel_weight(w)
        x = RNG.standard_normal((13, w.shape[0]), dtype=np.float32)
        for t in (1, 2, 5, 7, 13):
            plain = np.full((t, w.shape[1]), np.nan, np.float32)
            loops.product_rows(x[:t], tiles, plain, 7, 0)
            for ahead in (AHEAD_BYTES, 64, 1 << 20):
                for narrow_from in (7, 4):
                    y = np.full((t, w.shape[1]), np.nan, np.float32)
                    loops.product_rows(x[:t], tiles, y, narrow_from, ahead)
                    np.testing.assert_array_equal(y, plain)


@pytest.fixture
def one_row_hint(monkeypatch):
    """kernels' one-row hint as it was, after the test; backend.tune_one_row as if nothing had
    been timed in this process yet."""
    from minispec import backend, kernels

    monkeypatch.setattr(backend, "_one_row_timed", 0)
    before = kernels.one_row_ahead()
    yield kernels
    kernels.set_one_row_ahead(before)


@needs_numba
@pytest.mark.parametrize("stored", [None, as_bf16])
def test_the_one_row_hint_changes_no_bit(stored, one_row_hint):
    # a product of one row asks ahead as backend.tune_one_row chose (set_one_row_ahead), read
    # by the compiled loops at run time: a hint, the same bits whatever it is
    kernels = one_row_hint
    for name in SHAPES:
        w = weight(*SHAPES[name])
        w = w if stored is None else stored(w)
        x = RNG.standard_normal((1, w.shape[0]), dtype=np.float32)
        kernels.set_one_row_ahead(0)
        plain = matmul(x, w)
        for nbytes in (kernels.AHEAD_BYTES, 64, 1 << 20):
            kernels.set_one_row_ahead(nbytes)
            assert kernels.one_row_ahead() == nbytes
            np.testing.assert_array_equal(matmul(x, w), plain)
    for bad in (-1, (1 << 20) + 1, 1.5, True, "768"):
        with pytest.raises(MinispecError, match="set_one_row_ahead: nbytes"):
            kernels.set_one_row_ahead(bad)


def _clock(monkeypatch, kernels, costs):
    """time.perf_counter for backend.tune_one_row: each call costs[bytes asked ahead] seconds
    on (1.0 without the hint), so a timed pass of the products takes that long."""
    now = [0.0]

    def perf_counter():
        now[0] += costs.get(kernels.one_row_ahead(), 1.0)
        return now[0]

    monkeypatch.setattr("minispec.backend.time.perf_counter", perf_counter)


@needs_numba
@pytest.mark.parametrize("costs, chosen", [
    ({768: 0.9, 1536: 0.95, 3072: 0.92}, 768), ({768: 0.99, 1536: 0.9, 3072: 0.8}, 3072),
    ({768: 0.98, 1536: 0.99, 3072: 0.98}, 0), ({768: 1.3, 1536: 1.2, 3072: 1.1}, 0)])
def test_tune_one_row_asks_the_fastest_distance_where_it_is_faster(monkeypatch, one_row_hint,
                                                                   costs, chosen):
    from minispec.backend import ONE_ROW_AHEADS, ONE_ROW_GAIN, tune_one_row

    kernels = one_row_hint
    assert set(costs) == set(ONE_ROW_AHEADS) and 1 - 0.9 > ONE_ROW_GAIN > 1 - 0.98
    _clock(monkeypatch, kernels, costs)
    small = [weight(*SHAPES["draft qkv"]), as_bf16(weight(*SHAPES["draft up"]))]
    large = [weight(*SHAPES["target up"]), as_bf16(weight(*SHAPES["target down"])), None]
    kernels.set_one_row_ahead(1536 if chosen != 1536 else 0)  # another answer, before
    assert tune_one_row(small) == chosen == kernels.one_row_ahead()
    # the largest weights timed decide: fewer bytes leave the choice; more bytes time again
    other = 1536 if chosen != 1536 else 0
    _clock(monkeypatch, kernels, {1536: 0.5} if other else {1536: 1.5, 768: 2, 3072: 2})
    assert tune_one_row(small[:1]) is None and kernels.one_row_ahead() == chosen
    assert tune_one_row(large) == other == kernels.one_row_ahead()


@needs_numba
def test_enable_tunes_the_one_row_hint_on_the_models_weights(monkeypatch, one_row_hint):
    from minispec import cpu_steps

    kernels = one_row_hint
    model = load(SHIPPED / "draft")
    _clock(monkeypatch, kernels, {768: 0.5, 1536: 0.6, 3072: 0.7})
    kernels.set_one_row_ahead(0)
    cpu_steps.enable(model)
    assert kernels.one_row_ahead() == 768
    _clock(monkeypatch, kernels, {768: 1.5, 1536: 1.5, 3072: 1.5})
    cpu_steps.enable(load(SHIPPED / "draft"))  # no more bytes: timed once already
    assert kernels.one_row_ahead() == 768
    cpu_steps.enable(load(SHIPPED / "target"))  # more bytes: timed, and slower with the hint
    assert kernels.one_row_ahead() == 0


@needs_numba
def test_the_big_lm_head_with_a_few_rows():
    w = weight(*SMOLLM2_HEAD)
    x = RNG.standard_normal((5, w.shape[0]), dtype=np.float32)
    exact, scale = reference(x, w)
    for t in (1, 2, 5):
        assert_close(matmul(x[:t], w), exact[:t], scale[:t])


def test_products_outside_the_kernel_are_numpys():
    # more than KERNEL_MAX_ROWS rows, other dtypes, a weight stored [in, out]: exactly `x @ w`
    w = weight(192, 320)
    x = RNG.standard_normal((KERNEL_MAX_ROWS + 1, 192), dtype=np.float32)
    np.testing.assert_array_equal(matmul(x, w), x @ w)
    c = np.ascontiguousarray(w)
    np.testing.assert_array_equal(matmul(x[:5], c), x[:5] @ c)
    for dtype in (np.float64, np.float16):
        np.testing.assert_array_equal(matmul(x[:5].astype(dtype), w.astype(dtype)),
                                      x[:5].astype(dtype) @ w.astype(dtype))


def test_use_kernel_off_is_numpys_product():
    w = weight(512, 768)
    x = RNG.standard_normal((5, 512), dtype=np.float32)
    with use_kernel(False) as on:
        assert on is False
        np.testing.assert_array_equal(matmul(x, w), x @ w)
    with use_kernel(True) as on:
        assert on is kernel_available()


@needs_numba
def test_few_rows_matmul_says_what_it_expected():
    x = RNG.standard_normal((2, 8), dtype=np.float32)
    with pytest.raises(MinispecError, match=r"stored \[D_out, D_in\]"):
        few_rows_matmul(x, np.ones((8, 4), np.float32))  # C-contiguous [in, out]
    with pytest.raises(MinispecError, match="float32"):
        few_rows_matmul(x.astype(np.float64), np.ones((4, 8)).T)


@needs_numba
def test_the_kernels_copy_of_a_weight_is_its_tiles_kept_while_the_weight_lives():
    # the kernel reads a copy of w laid out 64 outputs to a tile, made once, zeros past D_out,
    # and freed with w (a model dropped gives its memory back); w is read-only from then on
    w = weight(48, 100)
    tiles = kernel_weight(w)
    assert kernel_weight(w) is tiles and tiles.shape == (2, 48, 64)
    np.testing.assert_array_equal(tiles[0], w[:, :64])
    np.testing.assert_array_equal(tiles[1, :, :36], w[:, 64:])
    assert not tiles[1, :, 36:].any() and tiles.ctypes.data % 64 == 0
    with pytest.raises(ValueError, match="read-only"):  # the copy would not see the change
        w[0, 0] = 1.0
    stored = RNG.standard_normal((8, 16), dtype=np.float32)  # [D_out, D_in], as loader.py
    kernel_weight(stored.T)
    with pytest.raises(ValueError, match="read-only"):
        stored[0, 0] = 1.0  # nor through the array w views (a tied head's embedding)
    gone = weakref.ref(tiles)
    del w, tiles
    gc.collect()
    assert gone() is None


def test_the_shipped_weights_are_stored_one_output_per_row():
    model = load(SHIPPED / "target", device="cpu")
    layer = model.weights["layers"][0]
    for name in ("wqkv", "wo", "w_gate", "w_up", "w_down"):
        assert layer[name].T.flags.c_contiguous, name
    assert model.weights["lm_head"].T.flags.c_contiguous


def test_the_arena_holds_the_same_values_on_cache_lines():
    arena = Arena()
    arena.BLOCK = 1 << 20  # small blocks, so that the test fills one and starts others
    arrays = [RNG.standard_normal((33, 7), dtype=np.float32),
              RNG.integers(0, 2**16, (600, 700)).astype(BF16),  # 840 KB: the same block
              RNG.standard_normal((5,)).astype(F16), weight(37, 13).T,
              RNG.standard_normal((1200, 500), dtype=np.float32),  # 2.4 MB: a block of its own
              RNG.standard_normal((300, 300), dtype=np.float32)]  # 360 KB: the next block
    held = [arena.put(a) for a in arrays]
    for a, h in zip(arrays, held):
        assert h.dtype == a.dtype and h.shape == a.shape and h.flags.c_contiguous
        assert np.array_equal(h, a) and h.ctypes.data % 64 == 0
    held[0][0, 0] = 1.0  # a copy: the original is untouched, the neighbours too
    assert arrays[0][0, 0] != 1.0 and np.array_equal(held[1], arrays[1])


def test_an_arena_out_of_memory_raises_memory_error(monkeypatch):
    # as NumPy does when an array cannot be had, not the OSError of a refused memory map
    import errno
    import mmap

    def refused(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refused)
    with pytest.raises(MemoryError, match="arena"):
        Arena().put(np.ones(4, dtype=np.float32))


def test_the_loaded_matrices_live_in_the_arena_a_tied_head_in_the_embedding():
    # the shipped target's tied head is a bfloat16 copy (its embedding is float32): in the arena
    model = load(SHIPPED / "target", device="cpu")
    matrices = [layer[n] for layer in model.weights["layers"]
                for n in ("wqkv", "wo", "w_gate", "w_up", "w_down")] + [model.weights["lm_head"]]
    assert all(w.ctypes.data % 64 == 0 for w in matrices)
    # one stream in a step's order: each matrix after the one before, at most a few vectors of
    # D = 512 (a norm's weights, the embedding before the head) and a cache line between them
    ends = [w.ctypes.data + w.nbytes for w in matrices[:-1]]
    gaps = [w.ctypes.data - e for e, w in zip(ends, matrices[1:])]
    assert all(0 <= g <= 2 * (512 * 4 + 64) for g in gaps[:-1]), gaps
    assert gaps[-1] == -(-(4096 * 512 * 4 + 512 * 4) // 64) * 64  # the embedding, the final norm
    plain = load(SHIPPED / "target", device="cpu", dtype="float32")
    head, embed = plain.weights["lm_head"], plain.weights["embed"]
    assert head.ctypes.data == embed.ctypes.data and head.strides == embed.T.strides  # tied: a view
    assert np.array_equal(widen(matrices[0].T), plain.weights["layers"][0]["wqkv"].T)


def test_without_numba_the_model_runs_on_numpy():
    # numba made unimportable in a fresh interpreter: matmul falls back to `x @ w`, the shipped
    # target decodes the same greedy tokens, and few_rows_matmul says what it needs
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np\n"
        "from minispec.backend import kernel_available, few_rows_matmul\n"
        "from minispec.errors import MinispecError\n"
        "from minispec.loader import load\n"
        "from minispec.shipped import SHIPPED\n"
        "assert not kernel_available()\n"
        "try:\n    few_rows_matmul(np.ones((2, 4), np.float32), np.ones((3, 4), np.float32).T)\n"
        "except MinispecError as e:\n    assert 'numba' in str(e)\nelse:\n    raise SystemExit(1)\n"
        "m = load(SHIPPED / 'target', device='cpu')\n"
        "c = m.new_cache(64)\n"
        "print(m.forward([1, 2, 3, 4, 5], c).argmax(axis=-1).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    model = load(SHIPPED / "target", device="cpu")
    cache = model.new_cache(64)
    assert out.strip() == str(model.forward([1, 2, 3, 4, 5], cache).argmax(axis=-1).tolist())
