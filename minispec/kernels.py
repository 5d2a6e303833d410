"""The CPU's compiled loops: the few-rows weight product (backend.matmul), the same product for a
weight read as its GGUF blocks, and the pieces of a decode or verify step (cpu_steps.py), plain
Python compiled by numba on first use.

Skippable: each computes what a few lines of NumPy compute, and is tested against them (`x @ w`
in tests/test_backend.py; the blocks' in tests/test_gguf_blocks.py; model.py's block in
tests/test_cpu_steps.py). They share one file
because numba caches each compiled function on disk under the file that defines it: a loop
calling a loop from another file would keep the old machine code of that one after the other
file changed. `block_front` (a transformer block up to its MLP's SiLU, in one call),
`batch_front` (the same for a batch of sequences), `layers` and `batch_layers` (every layer of
a model, for one sequence or a batch) and `draft_chain` (a draft model's chain of drafts) call
the others, and pieces made for several of them (`_mlp_out`, `_attend_each`), never another
of those five: with `_draft_chain` calling `block_front`'s compiled dispatcher (a module
global), a second run of the suite on two workers loaded machine code that broke block_front's
bits (weights/README.md, "The model drafter's chain in one call"). A first `layers` sharing one
loop over the layers with `draft_chain` gave other bits when loaded from numba's cache for
7-row calls: the SiLU, whose fastmath was left unset, took the flags of whichever caller
compiled it first (SILU_FLAGS spells them out since), the likely cause; `_draft_chain` still
spells that loop out.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np

from .errors import MinispecError

_KERNELS: SimpleNamespace | bool | None = None  # None: not compiled yet; False: no numba
# numba functions on 64 lanes (see _lanes_intrinsics)
_zero = _load = _fma = _store = _dot = _prefetch = None
_zero16 = _load16 = _fma16 = _store16 = None  # and on 16 (the narrow pass)
_tile = _tile16 = _rows = _product = _norm = _rope = _attend = _heads = _mlp_in = None
_mlp_out = _attend_each = None  # a block's end; a batch's RoPE and attention
_scores16 = _exp16 = _max16 = _add16 = _hmax16 = _hsum16 = None  # attention over heads
_attend_lanes = None  # of 64 numbers (see _attention_intrinsics)
_pick = _silu = _fma1 = None  # draft_chain's argmax or draw; SiLU; a fused a * b + c
# numba functions reading GGUF blocks (see _block_intrinsics), and the block products
_halves = _nibbles = _bytes = _fmav = _mulv = _block_tile = None
_izero = _istart = _nibble_dots = _byte_dots = _dots = _fold = _quantize = _ahead8 = None  # int8
# activations (see _int8_intrinsics)
_NARROW_FROM = 7  # a pass of this many rows or more takes the narrow tile (see _narrow_from)
_AHEAD = 0  # bytes of a tile a pass of several rows asks the memory for ahead (see _ahead)
# bytes a pass of one row asks for ahead: a value the compiled code reads at run time (an
# external symbol, not a global numba freezes), set by backend.tune_one_row (see one_row_ahead)
_ONE_ROW = ctypes.c_int64(0)
_ONE_ROW_SYMBOL = "minispec_one_row_ahead"
_one_row_ahead = None

LANES = 64  # outputs per tile: a weight's tile is [D_in, 64], 4 vector registers of 16 floats


def compiled() -> SimpleNamespace | None:
    """The compiled loops (None without numba): product(x, tiles, y) (and product_rows(x, tiles,
    y, narrow_from, ahead), the same with the narrow pass from that many rows on and `ahead` bytes
    prefetched; `narrow_from` and `ahead` the machine's choices), rms_norm, rope_store,
    attention, block_front and batch_front, each named below without its underscore, and
    typed_list (numba's typed List: batch_front's caches). numba is imported on
    the first call, not with minispec; the machine code comes from numba's cache (cache=True)
    after the first run on a machine. block_product(x, tiles, y) is product for a weight kept as
    its GGUF blocks (block_tiles); int8_product(x, tiles, y) the product of x quantized to int8
    (quantize) with Q4_1 blocks (int8_tiles), llama.cpp's arithmetic; silu(gate, up), SiLU(gate)
    * up in place; layers and batch_layers, every layer of a Llama-shaped model for one
    sequence or a batch; draft_chain, a draft model's chain of drafts."""
    global _KERNELS, _zero, _load, _fma, _store, _dot, _tile, _product, _norm, _rope, _attend
    global _heads, _mlp_in, _zero16, _load16, _fma16, _store16, _tile16, _rows, _NARROW_FROM
    global _prefetch, _AHEAD, _halves, _nibbles, _bytes, _fmav, _mulv, _block_tile
    global _block_unpack, _block_sums, _weight, _pick, _silu, _fma1, _mlp_out
    global _attend_each, _izero, _istart, _nibble_dots, _byte_dots, _dots, _fold, _quantize
    global _ahead8, _scores16, _exp16, _max16, _add16, _hmax16, _hsum16, _attend_lanes
    global _one_row_ahead
    if _KERNELS is None:
        try:
            import numba
        except ImportError:
            _KERNELS = False
            return None
        jit = numba.njit(fastmath=True, cache=True)
        _one_row_ahead = _run_time_value(_ONE_ROW, _ONE_ROW_SYMBOL)
        _zero, _load, _fma, _store, _dot, _prefetch, lanes = _lanes_intrinsics(numba)
        _zero16, _load16, _fma16, _store16, _, _, lanes16 = _lanes_intrinsics(numba, 16)
        _scores16, _exp16, _max16, _add16, _hmax16, _hsum16 = _attention_intrinsics(
            numba, lanes, lanes16)
        _halves, _nibbles, _bytes, _fmav, _mulv = _block_intrinsics(numba, lanes)
        _NARROW_FROM, _AHEAD = _narrow_from(numba), _ahead()  # read once, when _product_kernel
        # compiles (numba's cache keeps machine code per CPU: the same choices there)
        _tile, _tile16, _rows = jit(_tile_kernel), jit(_tile16_kernel), jit(_rows_kernel)
        _product = jit(_product_kernel)
        _attend_lanes = numba.njit(cache=True, fastmath=False, error_model="numpy")(
            _attend_lanes_kernel)  # the order written (see there)
        _norm, _rope, _attend = jit(_rms_norm), jit(_rope_store), jit(_attention)
        _heads, _mlp_in = jit(_heads_kernel), jit(_mlp_in_kernel)
        _attend_each = jit(_attend_each_kernel)
        _pick = numba.njit(cache=True)(_pick_kernel)  # no fastmath, as draft_chain
        _fma1 = _scalar_fma(numba)
        _silu = numba.njit(cache=True, **SILU_FLAGS)(_silu_kernel)
        _weight = numba.njit(fastmath=True, cache=True, inline="always")(_weight_kernel)
        _block_tile, _block_unpack = jit(_block_tile_kernel), jit(_block_unpack_kernel)
        _block_sums = jit(_block_sums_kernel)
        block_product = jit(_block_product_kernel)
        _izero, _istart, _nibble_dots, _byte_dots, _fold, _ahead8 = _int8_intrinsics(
            numba, lanes)
        _quantize = numba.njit(cache=True, fastmath=False)(_quantize_kernel)
        _dots = numba.njit(cache=True, fastmath=False, inline="always")(_dots_kernel)
        int8_product = numba.njit(cache=True, fastmath=False)(_int8_product_kernel)  # _fold's
        # additions and products stay unfused: int8_reference computes them in NumPy
        _either_product(numba, block_product, int8_product)
        _mlp_out = jit(_mlp_out_kernel)  # after _silu and _any_product
        _KERNELS = SimpleNamespace(product=_product, product_rows=_rows, rms_norm=_norm,
                                   narrow_from=_NARROW_FROM, ahead=_AHEAD, rope_store=_rope,
                                   attention=_attend, block_front=jit(_block_front),
                                   batch_front=jit(_batch_front), typed_list=numba.typed.List,
                                   block_product=block_product, int8_product=int8_product,
                                   quantize=_quantize,
                                   draft_chain=numba.njit(cache=True)(_draft_chain),
                                   silu=_silu, layers=jit(_layers),
                                   batch_layers=jit(_batch_layers))
    return _KERNELS or None


def tiles(wt: np.ndarray) -> np.ndarray:
    """The layout the product reads, for a weight stored one output per row, wt [D_out, D_in]
    (float32, or a 16-bit weight's bits): [ceil(D_out / 64), D_in, 64], tile k holding outputs
    64k..64k+63 (zeros past D_out), each input's 64 weights side by side. A tile's row i is
    one 64-lane vector, and the tiles follow one another: the product reads the whole weight as
    one stream, which the CPU's own prefetcher follows (a pass of several rows asks ahead too
    where `_ahead` says so, a pass of one row where backend.tune_one_row found it faster)."""
    d_out, d_in = wt.shape
    padded = np.zeros((-(-d_out // LANES) * LANES, d_in), wt.dtype)
    padded[:d_out] = wt
    made = np.ascontiguousarray(padded.reshape(-1, LANES, d_in).transpose(0, 2, 1))
    return made[:, :, BF16_ORDER] if wt.dtype == np.uint16 else made


# A bfloat16 tile's 64 weights in the order `_load` widens them fastest: read as 32 pairs, the
# pair's high half is a float32 once its low 16 bits are cleared (one AND) and its low half
# once shifted up (one shift), so each group of 32 outputs is stored as 16 pairs (c, c + 16).
BF16_ORDER = np.array([g + c + h for g in (0, 32) for c in range(16) for h in (0, 16)])


# ---- the weight products ---------------------------------------------------------------------
#
# y = x @ w for a few rows x [T, D_in] and a weight w [D_in, D_out]. A decode step is bound by
# reading the weights, so checking k tokens should cost about one token: each weight, once read,
# is multiplied with all k rows. The loop walks the weight tile by tile (`tiles` above): for
# each input i it loads the tile's row i, 64 weights (4 registers), and adds x[r, i] times them
# into row r's 64 partial outputs, up to 6 rows at once (24 registers of sums; AVX-512 has 32).
# More rows take more passes over the tile, which the L2 cache then holds.
#
# Every output is summed in one order, whatever T is: fma(w[i], x[r, i], sum) for i = 0, 1,
# 2, ..., one fused multiply-add at a time, in its own lane. So a row's result is the same bits
# whether it comes alone, in a verify call or in a batch, and a 16-bit weight (widened in the
# register, exactly) gives the bits its float32 copy gives: tests/test_backend.py checks both.


def _product_kernel(x, tiles, y):  # pragma: no cover - runs compiled
    # y [T, D_out] = x [T, D_in] float32 times the weight whose `tiles` [N, D_in, 64] these are;
    # several rows ask ahead as `_ahead` chose, one row as backend.tune_one_row chose
    ahead = max(_AHEAD, 0) if x.shape[0] > 1 else _one_row_ahead()
    _rows(x, tiles, y, max(_NARROW_FROM, 0), ahead)  # as ints, not the globals' constants: the
    # signature tests/test_backend.py's product_rows calls use too (one compile)


def _rows_kernel(x, tiles, y, narrow_from, ahead):  # pragma: no cover - runs compiled
    # the same, a pass of n rows taking the narrow tile when n >= narrow_from; the first pass over
    # a tile then sends its first row through the wide tile alone, which reads the tile from
    # memory in order, and the narrow tile's four sweeps find it in the L2 cache. The first pass
    # over each tile asks for the tile's rows `ahead` bytes on (0: never)
    t = x.shape[0]
    rows_ahead = ahead // (tiles.shape[2] * tiles.itemsize)
    for k in range(tiles.shape[0]):
        for r in range(0, t, 6):
            n = min(6, t - r)
            if n < narrow_from:
                _tile(x, tiles[k], y, r, n, k * 64, rows_ahead if r == 0 else 0)
            elif r == 0:  # r, r + 1, min(n, 1): 0, 1, 1 as numba's ints, not constants (a
                # constant argument would have numba compile the tile once more, for it alone)
                _tile(x, tiles[k], y, r, min(n, 1), k * 64, rows_ahead)
                _tile16(x, tiles[k], y, r + 1, n - 1, k * 64)
            else:
                _tile16(x, tiles[k], y, r, n, k * 64)


def _tile_kernel(x, tile, y, r, n, col, ahead):  # pragma: no cover - runs compiled
    # rows r..r+n-1 (n <= 6) of x times one tile [D_in, 64] -> y[r.., col:col + 64]; ahead > 0:
    # each step also asks the memory for the tile's row `ahead` rows on (past the tile's end: the
    # next tile's, or nothing; a prefetch never faults and changes no value)
    s0 = s1 = s2 = s3 = s4 = s5 = _zero()
    for i in range(tile.shape[0]):
        if ahead > 0:  # the same for every i
            _prefetch(tile, i + ahead)
        w = _load(tile, i)  # 64 weights, widened to float32
        s0 = _fma(s0, w, x[r, i])
        if n > 1:  # the same for every i: the branch predictor always guesses it
            s1 = _fma(s1, w, x[r + 1, i])
        if n > 2:
            s2 = _fma(s2, w, x[r + 2, i])
        if n > 3:
            s3 = _fma(s3, w, x[r + 3, i])
        if n > 4:
            s4 = _fma(s4, w, x[r + 4, i])
        if n > 5:
            s5 = _fma(s5, w, x[r + 5, i])
    _store(y, r, col, s0)
    if n > 1:
        _store(y, r + 1, col, s1)
    if n > 2:
        _store(y, r + 2, col, s2)
    if n > 3:
        _store(y, r + 3, col, s3)
    if n > 4:
        _store(y, r + 4, col, s4)
    if n > 5:
        _store(y, r + 5, col, s5)


def _tile16_kernel(x, tile, y, r, n, col):  # pragma: no cover - runs compiled
    # _tile_kernel 16 outputs at a time: 2 registers of sums a row where AVX2 has 16 registers
    # of 8 floats (6 rows of 64 sums would spill to memory), each lane the same chain of FMAs
    for c in range(0, LANES, 16):
        s0 = s1 = s2 = s3 = s4 = s5 = _zero16()
        for i in range(tile.shape[0]):
            w = _load16(tile, i, c)  # weights c..c + 15 of the tile's row i
            s0 = _fma16(s0, w, x[r, i])
            if n > 1:
                s1 = _fma16(s1, w, x[r + 1, i])
            if n > 2:
                s2 = _fma16(s2, w, x[r + 2, i])
            if n > 3:
                s3 = _fma16(s3, w, x[r + 3, i])
            if n > 4:
                s4 = _fma16(s4, w, x[r + 4, i])
            if n > 5:
                s5 = _fma16(s5, w, x[r + 5, i])
        _store16(y, r, col + c, s0)
        if n > 1:
            _store16(y, r + 1, col + c, s1)
        if n > 2:
            _store16(y, r + 2, col + c, s2)
        if n > 3:
            _store16(y, r + 3, col + c, s3)
        if n > 4:
            _store16(y, r + 4, col + c, s4)
        if n > 5:
            _store16(y, r + 5, col + c, s5)


def _narrow_from(numba) -> int:
    """The rows from which a pass takes the narrow tile: 4 where the machine code has no
    AVX-512 (AVX2's 16 registers of 8 floats: 4..6 rows of 64 sums spill there; on an AVX2
    EPYC, SmolLM2's matrices of 12 layers from memory, float32, 4 rows took 24.2 ms in the
    wide pass and 19.7 in the narrow, 5 rows 29.9 and 26.5, 3 rows 16.1 and 18.8: weights/
    README.md), else 7 (never: AVX-512's 32 registers of 16 hold 6 rows of 64 sums)."""
    return 7 if "+avx512f" in _cpu_features() else 4


def _cpu_features() -> list[str]:
    """The features of the CPU numba compiles for: NUMBA_CPU_FEATURES, else the host's."""
    from llvmlite import binding
    from numba.core import config

    features = config.CPU_FEATURES
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    return features.split(",")


AHEAD_BYTES = 768  # how far ahead a pass of several rows prefetches, where it does (_ahead)


def _ahead() -> int:
    """How many bytes of a tile a pass of several rows asks the memory for ahead of its reading
    (llvm.prefetch): AHEAD_BYTES on an Intel CPU with AVX-512, else 0 (never). On an AVX-512
    Xeon guest (2026-12-06) the hardware's prefetcher left a pass of 5 rows, which does 5 rows'
    fused multiply-adds per weight, reading more slowly than one row does: SmolLM2's products
    in bfloat16, 22 ms for one row, took 33-35 ms for five, and 27-28 ms asking 512-1,024 bytes
    ahead (28-32 ms asking 1.5-3 KB ahead); on an AVX-512 EPYC asking 1-8 KB ahead made
    every pass of 2-6 rows slower (weights/README.md, "Prefetching a tile's rows ahead").
    AMD's CPUs are told apart by their SSE4a, which Intel's lack."""
    features = _cpu_features()
    return AHEAD_BYTES if "+avx512f" in features and "+sse4a" not in features else 0


def one_row_ahead() -> int:
    """How many bytes of a tile a pass of one row asks the memory for ahead (0: none, as
    before backend.tune_one_row chose). Several rows ask what `_ahead` says, fixed per CPU;
    one row's reading is a single stream the CPU's own prefetcher follows, and whether the
    hint helps it, and at what distance, changed with the guest's host: SmolLM2's one-row
    products in bfloat16, 22 ms without the hint and 27-29 with it one morning, 24-25 ms without
    and 17-23 with it another day, 768 or 3,072 bytes ahead the faster within the hour
    (weights/README.md, "Prefetching in one-row passes, chosen at run time")."""
    return _ONE_ROW.value


def set_one_row_ahead(nbytes: int) -> None:
    """Make every compiled product of one row ask for `nbytes` of its tile ahead (0: none), in
    this process, from its next call: the loops read the value at run time. A hint to the
    memory: no product's value changes (tests/test_backend.py)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= 1 << 20:
        raise MinispecError(f"set_one_row_ahead: nbytes: expected an int in 0..{1 << 20}, "
                            f"got {nbytes!r}")
    _ONE_ROW.value = nbytes


def _run_time_value(value: ctypes.c_int64, symbol: str):
    """A numba function of no arguments that returns value.value as it is when called: the
    compiled code loads an external int64 named `symbol`, which llvmlite resolves to value's
    address in this process (add_symbol), so numba's cache keeps the load, not the number."""
    from llvmlite import binding, ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    binding.add_symbol(symbol, ctypes.addressof(value))

    @intrinsic
    def read(typingctx):
        def codegen(context, builder, sig, args):
            return builder.load(cgutils.add_global_variable(builder.module, ir.IntType(64),
                                                            symbol))

        return types.int64(), codegen

    return read


def _vector_type(name: str, vec):
    """A numba type, named `name`, whose values are the LLVM vector type `vec` (kept in vector
    registers): what the lanes intrinsics take and return."""
    from numba.core import types
    from numba.extending import models, register_model

    class Vector(types.Type):
        def __init__(self):
            super().__init__(name=name)

    @register_model(Vector)
    class VectorModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, vec)

    return Vector()


def _splat(builder, value, vec):
    """LLVM IR: the scalar `value` in every lane of a vector of type `vec`."""
    from llvmlite import ir

    lanes = ir.VectorType(ir.IntType(32), vec.count)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.IntType(32)(0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                  ir.Constant(lanes, [0] * vec.count))


def _split(builder, x, n):
    """LLVM IR: lanes 0..n-1 of the vector x and lanes n..2n-1, as two vectors of n."""
    from llvmlite import ir

    return [builder.shuffle_vector(x, ir.Constant(x.type, ir.Undefined), ir.Constant(
        ir.VectorType(ir.IntType(32), n), list(range(k, k + n)))) for k in (0, n)]


def _tree(builder, x, op):
    """LLVM IR: the lanes of x combined by op in a fixed tree, lane i with lane i + n/2, n
    halved, down to one -> that lane (_dot's sum, and the attention's max and sum)."""
    from llvmlite import ir

    n = x.type.count
    while n > 1:
        n //= 2
        x = op(*_split(builder, x, n))
    return builder.extract_element(x, ir.IntType(32)(0))


def _lanes_intrinsics(numba, width=LANES):
    """numba functions on a value of 64 float32 lanes (an LLVM <64 x float>, which LLVM keeps in
    4 vector registers): `_zero()`; `_load(tile, i)` the 64 weights tile[i, :] as float32 (a
    BF16 weight, uint16, zero-extended and shifted into the high half of a float32; an F16
    one, its bits as int16, converted half -> float: both exact); `_fma(s, w, u)` s + w * u
    for a float32 u, each lane one fused multiply-add (llvm.fma: one rounding); `_store(y, r,
    col, s)` y[r, col:col + 64] = s, the lanes past y's last column left out (a masked
    store); `_dot(a, b)` the float32 sum of a * b over the lanes, in a fixed tree (lane i plus
    lane i + 32, then i + 16, ..., down to one); `_prefetch(tile, i)` asks the memory for the
    lines of tile[i, :] (llvm.prefetch: a hint, no value; i may point past the tile). With
    width 16, the same on 16 lanes (`_zero16` and so on), whose load takes the first column
    too: `_load16(tile, i, c)` is tile[i, c:c + 16]. The last of the seven: the numba type of
    a value of lanes."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)
    vec = ir.VectorType(f32, width)
    lanes = _vector_type(f"float32x{width}", vec)

    def pointer(context, builder, aryty, ary, index, to):
        arr = context.make_array(aryty)(context, builder, ary)
        ptr = cgutils.get_item_pointer(context, builder, aryty, arr, index)
        return builder.bitcast(ptr, to.as_pointer())  # a no-op with LLVM's opaque pointers

    @intrinsic
    def zero(typingctx):
        return lanes(), lambda context, builder, sig, args: ir.Constant(vec, [0.0] * width)

    def load_codegen(context, builder, sig, args):  # load(tile, i) and load_at(tile, i, c)
        tile = sig.args[0]
        column = args[2] if len(args) > 2 else ir.Constant(ir.IntType(64), 0)
        index = [args[1], column]
        if tile.dtype == types.float32:
            return builder.load(pointer(context, builder, sig.args[0], args[0], index, vec),
                                align=4)  # a float's alignment, not the vector's
        if tile.dtype == types.int16:  # float16's bits
            bits = ir.VectorType(ir.IntType(16), width)
            raw = builder.load(pointer(context, builder, sig.args[0], args[0], index, bits),
                               align=2)
            return builder.fpext(builder.bitcast(raw, ir.VectorType(ir.HalfType(), width)),
                                 vec)
        # bfloat16's bits, in BF16_ORDER: pairs (c, c + 16) of each 32 outputs as one int32
        n = width // 2 if width == LANES else width  # int32 pairs read
        top = ir.Constant(ir.VectorType(i32, n), [-65536] * n)  # 0xFFFF0000
        if width == LANES:  # 32 pairs: the low halves shifted up, the high halves kept
            pairs = builder.load(pointer(context, builder, sig.args[0], args[0], index,
                                         top.type), align=2)
            low = builder.shl(pairs, ir.Constant(top.type, [16] * n))
            high = builder.and_(pairs, top)
            order = [g + c for g in (0, 32, 16, 48) for c in range(16)]  # back in order
            wide = builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(i32, width),
                                                                  order))
            return builder.bitcast(wide, vec)
        # 16 lanes from column c: the 16 pairs from column c - c % 32; c % 32 = 0 takes their
        # low halves (shifted up by 16), 16 their high ones (shifted by 0); then the top kept
        c64 = ir.IntType(64)
        index = [args[1], builder.and_(column, c64(-32))]
        pairs = builder.load(pointer(context, builder, sig.args[0], args[0], index, top.type),
                             align=2)
        shift = builder.trunc(builder.sub(c64(16), builder.and_(column, c64(16))), i32)
        return builder.bitcast(builder.and_(builder.shl(pairs, _splat(builder, shift, top.type)),
                                            top), vec)

    @intrinsic
    def load(typingctx, tile, i):
        if tile.dtype not in (types.float32, types.uint16, types.int16):
            return None
        return lanes(tile, i), load_codegen

    @intrinsic
    def load_at(typingctx, tile, i, c):
        if tile.dtype not in (types.float32, types.uint16, types.int16):
            return None
        return lanes(tile, i, c), load_codegen

    @intrinsic
    def fma(typingctx, s, w, u):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{width}f32")
            every = _splat(builder, args[2], vec)
            return builder.call(fn, [args[1], every, args[0]])  # w * u + s, rounded once

        return lanes(s, w, u), codegen

    @intrinsic
    def store(typingctx, y, r, col, s):
        def codegen(context, builder, sig, args):
            ptr = pointer(context, builder, sig.args[0], args[0], args[1:3], vec)
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            cols = cgutils.unpack_tuple(builder, ary.shape, 2)[1]
            left = builder.trunc(builder.sub(cols, args[2]), i32)  # columns from col on
            lane = ir.Constant(ir.VectorType(i32, width), list(range(width)))
            mask = builder.icmp_signed("<", lane, _splat(builder, left, lane.type))
            fn = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [vec, ptr.type, i32, mask.type]),
                f"llvm.masked.store.v{width}f32." + (
                    "p0" if getattr(ptr.type, "is_opaque", False) else f"p0v{width}f32"))
            builder.call(fn, [args[3], ptr, i32(4), mask])
            return context.get_dummy_value()

        return types.void(y, r, col, s), codegen

    @intrinsic
    def prefetch(typingctx, tile, i):  # a hint that tile[i, :] will be read soon: no value
        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            row = cgutils.get_item_pointer(context, builder, sig.args[0], arr,
                                           [args[1], ir.Constant(ir.IntType(64), 0)],
                                           wraparound=False)  # i may point past the tile
            i8p = ir.IntType(8).as_pointer()
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0" if getattr(row.type, "is_opaque", False)
                else "llvm.prefetch.p0i8")
            start = builder.bitcast(row, i8p)
            for byte in range(0, width * sig.args[0].dtype.bitwidth // 8, 64):  # its lines
                # read (0), keep in every cache level (3), data (1)
                builder.call(fn, [builder.gep(start, [i32(byte)]), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(tile, i), codegen

    @intrinsic
    def dot(typingctx, a, b):
        def codegen(context, builder, sig, args):  # the products, summed in _tree's order
            return _tree(builder, builder.fmul(args[0], args[1]), builder.fadd)

        return types.float32(a, b), codegen

    return zero, load if width == LANES else load_at, fma, store, dot, prefetch, lanes


def _attention_intrinsics(numba, lanes, lanes16):
    """numba functions for the attention over heads of 64 numbers: `_scores16(q, keys, j,
    scale)` the 16 scores of a query q (64 lanes) against keys[j..j + 15] (a [S, 64] float32
    array), each `_dot(q, keys[j + m]) * scale` to the bit (the same products, summed in the
    same tree, the 16 trees' last four levels taken side by side); `_exp16(v, best)` exp(v -
    best) on 16 lanes (`exp_reference` below is its NumPy twin); on 16 lanes, `_max16(a, b)`
    and `_add16(a, b)` lane by lane, `_hmax16(v)` and `_hsum16(v)` over the lanes in _dot's
    tree. Compiled without fastmath (_attend_lanes), each is the arithmetic written here."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)
    v64, v16 = ir.VectorType(f32, LANES), ir.VectorType(f32, 16)

    @intrinsic
    def scores16(typingctx, q, keys, j, scale):
        def codegen(context, builder, sig, args):
            q, keys, j, scale = args
            ary = context.make_array(sig.args[1])(context, builder, keys)
            parts = []
            for m in range(16):  # _dot's first levels, key by key: 64 products -> 32 -> 16
                row = builder.add(j, ir.Constant(j.type, m))
                at = cgutils.get_item_pointer(context, builder, sig.args[1], ary,
                                              [row, ir.Constant(j.type, 0)])
                x = builder.fmul(q, builder.load(builder.bitcast(at, v64.as_pointer()),
                                                 align=4))
                for n in (32, 16):
                    x = builder.fadd(*_split(builder, x, n))
                parts.append(x)
            width = 16  # then 16 -> 8 -> 4 -> 2 -> 1 for all: two vectors, each of p keys'
            while width > 1:  # `width` partial sums, become one of 2p keys' width / 2 sums
                half = width // 2
                keys_in = 16 // width
                low = [k * width + i for k in range(keys_in) for i in range(half)]
                low = low + [16 + i for i in low]
                high = [i + half for i in low]
                parts = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(
                             ir.VectorType(i32, 16), low)),
                         builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, 16), high)))
                         for a, b in zip(parts[::2], parts[1::2])]
                width = half
            return builder.fmul(parts[0], _splat(builder, scale, v16))

        if not (isinstance(keys, types.Array) and keys.dtype == types.float32
                and keys.ndim == 2):
            return None
        return lanes16(q, keys, j, scale), codegen

    @intrinsic
    def exp16(typingctx, v, best):
        def codegen(context, builder, sig, args):
            def const(value, ty=f32):
                return ir.Constant(ir.VectorType(ty, 16), [value] * 16)

            def call(name, *xs):
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(v16, [v16] * len(xs)), f"llvm.{name}.v16f32")
                return builder.call(fn, list(xs))

            x = builder.fsub(args[0], _splat(builder, args[1], v16))
            # x = n ln 2 + r, |r| <= ln 2 / 2 (ln 2 in two parts: n * the first is exact)
            n = call("floor", builder.fadd(builder.fmul(x, const(EXP_LOG2E)), const(0.5)))
            n = call("maxnum", n, const(-127.0))  # -inf and NaN: no poison from fptosi below
            r = builder.fsub(builder.fsub(x, builder.fmul(n, const(EXP_LN2[0]))),
                             builder.fmul(n, const(EXP_LN2[1])))
            y = const(EXP_POLY[0])
            for c in EXP_POLY[1:]:  # Horner, unfused
                y = builder.fadd(builder.fmul(y, r), const(c))
            y = builder.fadd(builder.fadd(builder.fmul(builder.fmul(y, r), r), r), const(1.0))
            two_n = builder.shl(builder.add(builder.fptosi(n, ir.VectorType(i32, 16)),
                                            const(127, i32)), const(23, i32))
            e = builder.fmul(y, builder.bitcast(two_n, v16))
            small = builder.fcmp_ordered("<", x, const(EXP_LOW))
            return builder.select(small, const(0.0), e)  # below: 0, as exp's float32 rounds

        return lanes16(v, best), codegen

    def maximum(builder, a, b):  # the larger, lane by lane (b where either is NaN: never here)
        return builder.select(builder.fcmp_ordered(">", a, b), a, b)

    @intrinsic
    def max16(typingctx, a, b):
        return lanes16(a, b), lambda context, builder, sig, args: maximum(builder, *args)

    @intrinsic
    def add16(typingctx, a, b):
        return lanes16(a, b), lambda context, builder, sig, args: builder.fadd(*args)

    @intrinsic
    def hmax16(typingctx, v):
        return types.float32(v), lambda context, builder, sig, args: _tree(
            builder, args[0], lambda a, b: maximum(builder, a, b))

    @intrinsic
    def hsum16(typingctx, v):
        return types.float32(v), lambda context, builder, sig, args: _tree(
            builder, args[0], builder.fadd)

    return scores16, exp16, max16, add16, hmax16, hsum16


# exp in float32 for the softmax (_exp16, exp_reference): Cephes' expf (S. Moshier), its ranges
# and coefficients: x = n ln 2 + r, exp(x) = 2^n (1 + r + r^2 p(r)); 0 below EXP_LOW
EXP_LOG2E = 1.44269504088896341
EXP_LN2 = (0.693359375, -2.12194440e-4)
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
            1.6666665459e-1, 5.0000001201e-1)
EXP_LOW = -87.33654  # ~ln of float32's smallest normal: below it, 0


def exp_reference(v: np.ndarray, best) -> np.ndarray:
    """_exp16's arithmetic in NumPy, float32 step by step: exp(v - best), elementwise."""
    f = np.float32
    with np.errstate(invalid="ignore", over="ignore"):
        x = (v.astype(np.float32) - f(best)).astype(np.float32)
        n = np.fmax(np.floor(x * f(EXP_LOG2E) + f(0.5)), f(-127.0))  # maxnum: NaN -> -127
        r = (x - n * f(EXP_LN2[0])) - n * f(EXP_LN2[1])
        y = np.full_like(x, f(EXP_POLY[0]))
        for c in EXP_POLY[1:]:
            y = y * r + f(c)
        y = ((y * r) * r + r) + f(1.0)
        two_n = ((n.astype(np.int32) + 127) << 23).view(np.float32)
        return np.where(x < f(EXP_LOW), f(0.0), y * two_n).astype(np.float32)


# ---- weights kept as their GGUF blocks -------------------------------------------------------
#
# A GGUF file stores most matrices quantized in blocks of 32 weights along an output's inputs.
# Q4_1: a float16 scale d, a float16 minimum m and 32 four-bit numbers q, the weight d * q + m;
# Q8_0: d and 32 signed bytes, the weight d * q. gguf's dequantize computes those in float32,
# and d * q is exact there (11 bits times 4 or 8), so d * q + m is one rounding: a fused
# multiply-add of the same numbers gives the same float32. The block products below rebuild
# each weight that way in a register, then multiply and accumulate exactly as the product of the
# dequantized float32 weight does: the same bits out, reading 5 (Q4_1) or 8.5 (Q8_0) bits a
# weight instead of 32. SmolLM2-135M's GGUF keeps its layers in Q4_1 and its embedding (the tied
# LM head) in Q8_0: 96 MB a step instead of 538 MB. Rebuilding costs as much as ~5 rows'
# multiply-adds, so a call of more than 6 rows rebuilds each weight once, into the L1 cache, for
# all its passes (`_block_product_kernel`).

Q4_1_BLOCK, Q8_0_BLOCK = 20, 34  # bytes a block of 32 weights takes in a GGUF file
Q4_1_TILE, Q8_0_TILE = 1280, 2176  # and a block tile (64 outputs x 32 inputs) in block_tiles
UNPACKED = 4  # blocks a call of more than 6 rows rebuilds at a time (2: within 5%; 8: its 64 KB
# spill from a 48 KB L1 cache, 9-47% slower; weights/README.md, "Rebuilt once")


def _tile_rows(blocks: np.ndarray, who: str) -> np.ndarray:
    """GGUF blocks [D_out, D_in / 32, bytes] -> [ceil(D_out / 64), D_in / 32, 64, bytes]: each
    block of inputs with its 64 outputs side by side, the outputs past D_out zero blocks.
    ValueError, naming `who`, for blocks neither Q4_1's nor Q8_0's."""
    d_out, nb, size = blocks.shape
    if size not in (Q4_1_BLOCK, Q8_0_BLOCK):
        raise ValueError(f"{who}: blocks of {size} bytes (expected {Q4_1_BLOCK} or "
                         f"{Q8_0_BLOCK})")
    nt = -(-d_out // LANES)
    rows = np.zeros((nt * LANES, nb, size), np.uint8)
    rows[:d_out] = blocks
    return rows.reshape(nt, LANES, nb, size).transpose(0, 2, 1, 3)


def _halves_at(rows: np.ndarray, at: int) -> np.ndarray:
    """_tile_rows' rows -> the 64 outputs' float16 bits at bytes at, at + 1 -> [.., 128] bytes."""
    nt, nb = rows.shape[:2]
    return np.ascontiguousarray(rows[..., at:at + 2]).reshape(nt, nb, 2 * LANES)


def _scales(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at bytes at, at + 1 of each block as float32 (exact) -> [..]: d at 0, Q4_1's
    m at 2."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(
        np.float32)


def _numbers(blocks: np.ndarray) -> np.ndarray:
    """Each block's 32 numbers q in input order -> [.., 32]: Q4_1's four-bit ones (byte j holds
    input j in its low four bits and input j + 16 in its high four) as uint8, Q8_0's int8."""
    if blocks.shape[-1] == Q8_0_BLOCK:
        return blocks[..., 2:].view(np.int8)
    qs = blocks[..., 4:]
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def block_tiles(blocks: np.ndarray) -> np.ndarray:
    """The layout the block product reads, for a weight [D_out, D_in] kept as its GGUF blocks,
    blocks uint8 [D_out, D_in / 32, 20] (Q4_1) or [..., 34] (Q8_0), each row as in the file:
    [ceil(D_out / 64), D_in / 32, bytes] (zeros past D_out), the 64 outputs of a tile side by
    side for each block of 32 inputs: their 64 scales d (float16 bits), for Q4_1 their 64
    minimums m, then for each of the 32 inputs the 64 outputs' numbers: Q4_1 as 32 bytes whose
    low four bits are output j's and high four bits output j + 32's, Q8_0 as 64 bytes."""
    size = blocks.shape[2]
    rows = _tile_rows(blocks, "block_tiles")  # [nt, nb, 64, size]
    nt, nb = rows.shape[:2]
    q = _numbers(rows).view(np.uint8).transpose(0, 1, 3, 2)  # [nt, nb, 32 inputs, 64 outputs]
    if size == Q4_1_BLOCK:
        packed = q[..., :32] | (q[..., 32:] << 4)  # outputs j and j + 32 in one byte
        return np.concatenate([_halves_at(rows, 0), _halves_at(rows, 2),
                               packed.reshape(nt, nb, -1)], axis=2)
    return np.concatenate([_halves_at(rows, 0), np.ascontiguousarray(q).reshape(nt, nb, -1)],
                          axis=2)


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """The float32 weight [D_out, D_in] of GGUF blocks [D_out, D_in / 32, 20 or 34], computed as
    gguf's dequantize computes it: the reference of the block product."""
    d, q = _scales(blocks, 0)[..., None], _numbers(blocks).astype(np.float32)  # [.., nb, 1]
    if blocks.shape[-1] == Q8_0_BLOCK:
        return (q * d).reshape(blocks.shape[0], -1)
    return (d * q + _scales(blocks, 2)[..., None]).reshape(blocks.shape[0], -1)


def _block_product_kernel(x, tiles, y):  # pragma: no cover - runs compiled
    # y [T, D_out] = x [T, D_in] times the weight whose block_tiles these are. Up to 6 rows: one
    # pass that rebuilds each weight in a register. More rows rebuild each weight once too, 4
    # blocks at a time into `block` (float32, 32 KB: the L1 cache holds it), and take passes of
    # up to 6 rows over it, each row's 64 sums kept in `sums` between them: every sum the same
    # chain of fused multiply-adds as in one pass, so the same bits; rebuilding the tile once
    # per pass cost as much as 5 rows' multiply-adds (weights/README.md, "Rebuilt once")
    t = x.shape[0]
    if t <= 6:
        for k in range(tiles.shape[0]):
            _block_tile(x, tiles, y, k, t)
        return
    nb = tiles.shape[1]
    block = np.empty((32 * UNPACKED, LANES), np.float32)
    sums = np.empty((t, LANES), np.float32)
    passes = (t + 5) // 6  # of rows as even as they go (a pass of 1 row would wait on its sums)
    for k in range(tiles.shape[0]):
        sums[:] = 0.0
        for b0 in range(0, nb, UNPACKED):
            c = min(UNPACKED, nb - b0)
            for b in range(c):
                _block_unpack(tiles, k, b0 + b, block, 32 * b)
            r = 0
            for p in range(passes):
                n = (t - r) // (passes - p)
                _block_sums(x, block, sums, r, n, 32 * b0, 32 * c)
                r += n
        for r in range(t):
            _store(y, r, k * LANES, _load(sums, r))


def _block_unpack_kernel(tiles, k, b, block, at):  # pragma: no cover - runs compiled
    # block b of tile k rebuilt as _block_tile_kernel rebuilds it -> block[at:at + 32] (64
    # float32 a row)
    q4 = tiles.shape[2] == Q4_1_TILE
    d = _halves(tiles, k, b, 0)
    m = _halves(tiles, k, b, 2 * LANES) if q4 else d
    for j in range(32):
        _store(block, at + j, 0, _weight(tiles, k, b, j, d, m, q4))


def _block_sums_kernel(x, block, sums, r, n, i0, length):  # pragma: no cover - runs compiled
    # rows r..r+n-1 (n <= 6): sums[r..] += x[r.., i0:i0 + length] times block[:length] (64
    # weights a row), one fused multiply-add at a time, in _tile_kernel's order
    s0 = _load(sums, r)
    s1 = _load(sums, r + 1) if n > 1 else s0
    s2 = _load(sums, r + 2) if n > 2 else s0
    s3 = _load(sums, r + 3) if n > 3 else s0
    s4 = _load(sums, r + 4) if n > 4 else s0
    s5 = _load(sums, r + 5) if n > 5 else s0
    for j in range(length):
        w = _load(block, j)
        i = i0 + j
        s0 = _fma(s0, w, x[r, i])
        if n > 1:
            s1 = _fma(s1, w, x[r + 1, i])
        if n > 2:
            s2 = _fma(s2, w, x[r + 2, i])
        if n > 3:
            s3 = _fma(s3, w, x[r + 3, i])
        if n > 4:
            s4 = _fma(s4, w, x[r + 4, i])
        if n > 5:
            s5 = _fma(s5, w, x[r + 5, i])
    _store(sums, r, 0, s0)
    if n > 1:
        _store(sums, r + 1, 0, s1)
    if n > 2:
        _store(sums, r + 2, 0, s2)
    if n > 3:
        _store(sums, r + 3, 0, s3)
    if n > 4:
        _store(sums, r + 4, 0, s4)
    if n > 5:
        _store(sums, r + 5, 0, s5)


def _block_tile_kernel(x, tiles, y, k, n):  # pragma: no cover - runs compiled
    # rows 0..n-1 (n <= 6) times tile k of the blocks -> y[:n, 64k:64k + 64]: each weight rebuilt
    # in a register (_weight_kernel), then _tile_kernel's sums
    q4 = tiles.shape[2] == Q4_1_TILE  # the same for every block: the branch predictor's guess
    s0 = s1 = s2 = s3 = s4 = s5 = _zero()
    r = 0  # a call's first rows: more than 6 go through _block_sums_kernel
    for b in range(tiles.shape[1]):
        d = _halves(tiles, k, b, 0)
        m = _halves(tiles, k, b, 2 * LANES) if q4 else d  # (Q8_0 has no minimum)
        for j in range(32):
            w = _weight(tiles, k, b, j, d, m, q4)
            i = 32 * b + j
            s0 = _fma(s0, w, x[r, i])
            if n > 1:
                s1 = _fma(s1, w, x[r + 1, i])
            if n > 2:
                s2 = _fma(s2, w, x[r + 2, i])
            if n > 3:
                s3 = _fma(s3, w, x[r + 3, i])
            if n > 4:
                s4 = _fma(s4, w, x[r + 4, i])
            if n > 5:
                s5 = _fma(s5, w, x[r + 5, i])
    col = k * LANES
    _store(y, r, col, s0)
    if n > 1:
        _store(y, r + 1, col, s1)
    if n > 2:
        _store(y, r + 2, col, s2)
    if n > 3:
        _store(y, r + 3, col, s3)
    if n > 4:
        _store(y, r + 4, col, s4)
    if n > 5:
        _store(y, r + 5, col, s5)


def _weight_kernel(tiles, k, b, j, d, m, q4):  # pragma: no cover - runs compiled (inlined)
    # the 64 weights of input j of block b of tile k, from their scales d (and minimums m):
    # Q4_1 d * q + m in one fused multiply-add, Q8_0 d * q
    if q4:
        return _fmav(_nibbles(tiles, k, b, 4 * LANES + 32 * j), d, m)
    return _mulv(_bytes(tiles, k, b, 2 * LANES + LANES * j), d)


def _any_product(x, tiles, y):  # pragma: no cover - what _either_product compiles
    """product, block_product or int8_product, by the tiles' type: one block's loops take any
    weight."""
    raise NotImplementedError("_any_product runs compiled (kernels.compiled)")


def _either_product(numba, block_product, int8_product) -> None:
    """Compile `_any_product` inside the loops as `_product` for a float32 or 16-bit weight's
    tiles, as `block_product` for GGUF blocks' (uint8) and as `int8_product` for the int8
    path's (int8_tiles, int8): a choice numba makes by type, once."""
    from numba.core import types
    from numba.extending import overload

    @overload(_any_product)
    def either(x, tiles, y):
        if tiles.dtype == types.uint8:
            return lambda x, tiles, y: block_product(x, tiles, y)
        if tiles.dtype == types.int8:
            return lambda x, tiles, y: int8_product(x, tiles, y)
        return lambda x, tiles, y: _product(x, tiles, y)


def _scalar_fma(numba):
    """`_fma1(a, b, c)`: a * b + c in float32 with one rounding (llvm.fma.f32), for loops whose
    bits must not depend on whether LLVM fuses a multiply and an add (kernels.silu)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    f32 = ir.FloatType()

    @intrinsic
    def fma1(typingctx, a, b, c):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
            return builder.call(fn, list(args))

        return types.float32(types.float32, types.float32, types.float32), codegen

    return fma1


def _block_intrinsics(numba, lanes):
    """numba functions for the block products, on the 64-lane values of _lanes_intrinsics
    (`lanes`, their numba type): `_halves(tiles, k, b, at)` the 64 float16 at byte `at` of
    tiles[k, b] as float32 (exact); `_nibbles(tiles, k, b, at)` the 64 four-bit numbers of the
    32 bytes at `at` (byte j: lane j low, lane j + 32 high) as float32; `_bytes(tiles, k, b,
    at)` the 64 signed bytes at `at` as float32; `_fmav(a, b, c)` a * b + c, lane by lane, one
    rounding (llvm.fma); `_mulv(a, b)` a * b."""
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)
    vec = ir.VectorType(f32, LANES)

    def at(context, builder, sig, args, to):  # a pointer to tiles[k, b, at] as `to`
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], arr, args[1:4])
        return builder.bitcast(ptr, to.as_pointer())

    @intrinsic
    def halves(typingctx, tiles, k, b, offset):
        def codegen(context, builder, sig, args):
            bits = ir.VectorType(ir.IntType(16), LANES)
            raw = builder.load(at(context, builder, sig, args, bits), align=1)
            return builder.fpext(builder.bitcast(raw, ir.VectorType(ir.HalfType(), LANES)), vec)

        return lanes(tiles, k, b, offset), codegen

    @intrinsic
    def nibbles(typingctx, tiles, k, b, offset):
        def codegen(context, builder, sig, args):
            packed = ir.VectorType(ir.IntType(8), LANES // 2)
            raw = builder.load(at(context, builder, sig, args, packed), align=1)
            low = builder.and_(raw, ir.Constant(packed, [15] * (LANES // 2)))
            high = builder.lshr(raw, ir.Constant(packed, [4] * (LANES // 2)))
            both = builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(i32, LANES),
                                                                 list(range(LANES))))
            return builder.uitofp(builder.zext(both, ir.VectorType(i32, LANES)), vec)

        return lanes(tiles, k, b, offset), codegen

    @intrinsic
    def signed_bytes(typingctx, tiles, k, b, offset):
        def codegen(context, builder, sig, args):
            raw = builder.load(at(context, builder, sig, args, ir.VectorType(ir.IntType(8),
                                                                               LANES)), align=1)
            return builder.sitofp(builder.sext(raw, ir.VectorType(i32, LANES)), vec)

        return lanes(tiles, k, b, offset), codegen

    @intrinsic
    def fmav(typingctx, a, b, c):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{LANES}f32")
            return builder.call(fn, list(args))

        return lanes(a, b, c), codegen

    @intrinsic
    def mulv(typingctx, a, b):
        return lanes(a, b), lambda context, builder, sig, args: builder.fmul(*args)

    return halves, nibbles, signed_bytes, fmav, mulv


# ---- int8 activations against GGUF blocks (llama.cpp's arithmetic) -------------------------
#
# Rebuilding every weight in float32 makes the block product bound by arithmetic, not by the
# memory (above). llama.cpp multiplies blocks another way: each row of x is quantized per block
# of 32 inputs to int8 (a scale dx = max |x| / 127, qx = round(x / dx), sx = dx * sum(qx)), and
# a Q4_1 block adds d[o] * dx * (sum over its 32 inputs of q[o, j] * qx[j]) + m[o] * sx to
# output o, a Q8_0 block d[o] * dx * (sum of q[o, j] * qx[j]): integer dot products, which
# AVX-512 VNNI's vpdpbusd takes 64 at a time (16 outputs x 4 inputs, unsigned times signed
# bytes; Q8_0's signed weights meet qx + 128, and the tiles hold -128 * sum(q) to start each
# block's sums from). That is another model, a little: every product moves by the rounding of
# its activations (about 1% of a product's spread), so the logits are not the float32 model's
# bits; opt-in (`minispec.load(..., activations="int8")`). Integer sums are exact in any order
# and each output's float sums run over the blocks in one order whatever T is, so a row's
# result still does not depend on the rows beside it: a verify call gives one-token steps'
# bits, and speculation is lossless against this model. `int8_reference` is the same
# arithmetic in NumPy.

Q8_0_INT8_TILE = 2432  # bytes of a Q8_0 block tile in int8_tiles (a Q4_1 one: Q4_1_TILE)
INT8_AHEAD = 2  # blocks of a tile asked for from memory ahead of the one being multiplied
# (SmolLM2's layers, one row: none 5.4 ms, 1 block 3.7, 2 blocks 3.0-4.5, 4 blocks 4.6)
INT8_ROWS = 6  # rows a pass of the int8 product takes (4 vector registers of int32 sums each)
_ROUND = np.float32(12582912.0)  # 1.5 * 2**23: (v + it) - it rounds v to an integer, half to even


def int8_tiles(blocks: np.ndarray) -> np.ndarray:
    """The layout int8_product reads for GGUF blocks [D_out, D_in / 32, 20 (Q4_1) or 34 (Q8_0)]:
    [ceil(D_out / 64), D_in / 32, 1280 or 2432] bytes, typed int8 (numba picks the product by
    the tiles' type). Per tile of 64 outputs and block of 32 inputs, the 64 scales d (float16
    bits, as in block_tiles), then for each group g of 4 inputs 16 outputs' 4 weights side by
    side, as vpdpbusd multiplies them (byte 4o + i: output o, input 4g + i). Q4_1: the 64
    minimums m (float16 bits), then per group two runs of 64 bytes, run p holding outputs
    32p..32p + 15 in the low four bits and 32p + 16..32p + 31 in the high four. Q8_0: the 64
    outputs' -128 * sum(q) (int32), then per group four runs of 64 signed bytes, run h
    holding outputs 16h..16h + 15."""
    size = blocks.shape[2]
    rows = _tile_rows(blocks, "int8_tiles")  # [nt, nb, 64, size]
    nt, nb = rows.shape[:2]
    q = np.ascontiguousarray(_numbers(rows))  # [nt, nb, 64 outputs, 32 inputs]
    if size == Q8_0_BLOCK:
        start = np.ascontiguousarray(-128 * q.sum(axis=3, dtype=np.int32))
        runs = q.reshape(nt, nb, 64, 8, 4).transpose(0, 1, 3, 2, 4)  # [.., g, output, i]
        return np.concatenate([_halves_at(rows, 0), start.view(np.uint8), np.ascontiguousarray(
            runs).view(np.uint8).reshape(nt, nb, -1)], axis=2).view(np.int8)
    q = q.reshape(nt, nb, 2, 2, 16, 8, 4)  # output 32p + 16h + o, input 4g + i
    runs = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).transpose(0, 1, 4, 2, 3, 5)  # [.., g, p, o, i]
    return np.concatenate([_halves_at(rows, 0), _halves_at(rows, 2), runs.reshape(nt, nb, -1)],
                          axis=2).view(np.int8)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [T, D] float32 -> qx int8 [T, D], dx and sx float32 [T, D / 32]: per block of 32
    inputs dx = max |x| / 127, qx = x * (1 / dx) rounded half to even (0 where dx is 0), sx =
    dx * sum(qx); a block holding a NaN or an infinity gets qx 0 and dx = sx = NaN, which its
    products then carry. What `_quantize_kernel` computes, operation for operation."""
    t, n = x.shape
    b = x.reshape(t, n // 32, 32)
    with np.errstate(all="ignore"):
        a = np.abs(b)
        bad = ~(a < np.inf).all(axis=2)
        dx = a.max(axis=2) / np.float32(127)
        inv = np.where(dx != 0, np.float32(1) / np.where(dx != 0, dx, 1), np.float32(0))
        qx = np.rint(b * inv[..., None].astype(np.float32))
        qx[bad] = 0
        dx[bad] = np.nan
        sx = dx * qx.sum(axis=2, dtype=np.int32).astype(np.float32)
    return qx.astype(np.int8).reshape(t, n), dx, sx


def int8_reference(x: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """What int8_product computes for x [T, D_in] float32 and GGUF blocks [D_out, D_in / 32, 20
    or 34], in NumPy: [T, D_out]. Each block's integer dot products are exact; the float sums
    run over the blocks in order, each step rounded as the kernel rounds it (nothing fused)."""
    qx, dx, sx = quantize_rows(x)
    t, nb = dx.shape
    q4 = blocks.shape[2] == Q4_1_BLOCK
    d, m = _scales(blocks, 0), _scales(blocks, 2) if q4 else None  # [D_out, nb]
    dots = np.einsum("tbj,obj->tob", qx.reshape(t, nb, 32).astype(np.int32),
                     _numbers(blocks).astype(np.int32))  # [T, D_out, nb]
    y = np.zeros((t, blocks.shape[0]), np.float32)
    with np.errstate(all="ignore"):
        for b in range(nb):
            y = y + (d[:, b] * dx[:, b, None]) * dots[..., b].astype(np.float32)
            if q4:  # (the kernel adds 0 * sx for Q8_0: +-0, leaving y, never -0, as it
                # is, or NaN where dx is NaN too)
                y = y + m[:, b] * sx[:, b, None]
    return y


def _quantize_kernel(x, qx, dx, sx):  # pragma: no cover - runs compiled, without fastmath
    # quantize_rows(x) -> qx [T, D] int8, dx and sx [T, D / 32], the same operations. max |x|
    # is taken on the bits (|x|'s bits order as |x| does, and a NaN's or an infinity's are the
    # largest), an integer maximum LLVM vectorizes, as it does the rounding loop
    t, n = x.shape
    bits = np.ascontiguousarray(x).view(np.int32)
    word = np.empty(1, np.int32)
    amax = word.view(np.float32)  # the largest |x|, from its bits
    for r in range(t):
        for b in range(n // 32):
            top = np.int32(0)
            for j in range(32 * b, 32 * b + 32):
                top = max(top, bits[r, j] & np.int32(0x7FFFFFFF))
            if top >= np.int32(0x7F800000):  # NaN or an infinity: no scale holds the block
                for j in range(32 * b, 32 * b + 32):
                    qx[r, j] = 0
                dx[r, b] = sx[r, b] = np.float32(np.nan)
                continue
            word[0] = top
            d = np.float32(amax[0] / np.float32(127))
            inv = np.float32(np.float32(1) / d) if d != 0 else np.float32(0)
            total = np.int32(0)
            for j in range(32 * b, 32 * b + 32):
                k = np.int32(np.float32(np.float32(x[r, j] * inv) + _ROUND) - _ROUND)
                qx[r, j] = k
                total += k
            dx[r, b] = d
            sx[r, b] = np.float32(d * np.float32(total))


def _int8_product_kernel(x, tiles, y):  # pragma: no cover - runs compiled, without fastmath
    # y [T, D_out] = x [T, D_in] quantized (_quantize) times the weight whose int8_tiles these
    # are: per tile and block, each row's 64 integer dot products (8 groups of 4 inputs), then
    # folded into the row's float sums (_fold); passes of up to 6 rows, each tile's blocks
    # read from memory once (asked for INT8_AHEAD blocks ahead), from the caches after
    t, n = x.shape
    nb = n // 32
    qx = np.empty((t, n), np.int8)
    dx = np.empty((t, nb), np.float32)
    sx = np.empty((t, nb), np.float32)
    _quantize(x, qx, dx, sx)
    xw = qx.view(np.int32)  # [T, D_in / 4]: 4 inputs' qx in each
    q4 = tiles.shape[2] == Q4_1_TILE
    if not q4:  # Q8_0: qx + 128, unsigned, against the signed weights
        for r in range(t):
            for i in range(xw.shape[1]):
                xw[r, i] ^= np.int32(-2139062144)  # 0x80808080: each byte's top bit flipped
    sums = np.empty((INT8_ROWS, LANES), np.float32)
    zero = _zero()
    for k in range(tiles.shape[0]):
        r = 0
        while r < t:
            c = min(INT8_ROWS, t - r)
            for i in range(c):
                _store(sums, i, 0, zero)
            for b in range(nb):
                for at in range(0, tiles.shape[2], 64):  # the lines INT8_AHEAD blocks on
                    _ahead8(tiles, k, b + INT8_AHEAD, at)
                d = _halves(tiles, k, b, 0)
                m = _halves(tiles, k, b, 2 * LANES) if q4 else zero  # Q8_0: y + 0 * sx
                a0 = a1 = a2 = a3 = a4 = a5 = _izero() if q4 else _istart(tiles, k, b, 2 * LANES)
                for g in range(8):
                    w = 8 * b + g
                    a0 = _dots(a0, tiles, k, b, g, xw[r, w], q4)
                    if c > 1:
                        a1 = _dots(a1, tiles, k, b, g, xw[r + 1, w], q4)
                    if c > 2:
                        a2 = _dots(a2, tiles, k, b, g, xw[r + 2, w], q4)
                    if c > 3:
                        a3 = _dots(a3, tiles, k, b, g, xw[r + 3, w], q4)
                    if c > 4:
                        a4 = _dots(a4, tiles, k, b, g, xw[r + 4, w], q4)
                    if c > 5:
                        a5 = _dots(a5, tiles, k, b, g, xw[r + 5, w], q4)
                _fold(sums, 0, a0, d, m, dx[r, b], sx[r, b])
                if c > 1:
                    _fold(sums, 1, a1, d, m, dx[r + 1, b], sx[r + 1, b])
                if c > 2:
                    _fold(sums, 2, a2, d, m, dx[r + 2, b], sx[r + 2, b])
                if c > 3:
                    _fold(sums, 3, a3, d, m, dx[r + 3, b], sx[r + 3, b])
                if c > 4:
                    _fold(sums, 4, a4, d, m, dx[r + 4, b], sx[r + 4, b])
                if c > 5:
                    _fold(sums, 5, a5, d, m, dx[r + 5, b], sx[r + 5, b])
            for i in range(c):
                _store(y, r + i, k * LANES, _load(sums, i))
            r += c


def _dots_kernel(acc, tiles, k, b, g, x4, q4):  # pragma: no cover - runs compiled (inlined)
    # acc plus the 64 outputs' integer dot products of group g (4 inputs) of block b of tile k
    # with x4's 4 bytes: Q4_1's nibbles or Q8_0's signed bytes
    if q4:
        return _nibble_dots(acc, tiles, k, b, 4 * LANES + 128 * g, x4)
    return _byte_dots(acc, tiles, k, b, 6 * LANES + 256 * g, x4)


def _int8_intrinsics(numba, lanes):
    """numba functions for the int8 product, on 64 int32 lanes (an LLVM <64 x i32>):
    `_izero()`; `_istart(tiles, k, b, at)` the 64 int32 at byte `at` of tiles[k, b];
    `_nibble_dots(acc, tiles, k, b, at, xw)` acc plus, for each of the 64 outputs, the dot
    product of its 4 nibbles in the two 64-byte runs at byte `at` of tiles[k, b] (int8_tiles,
    Q4_1) with the 4 signed bytes of the int32 xw (vpdpbusd: unsigned times signed bytes, 4
    products summed into each int32 lane); `_byte_dots(acc, tiles, k, b, at, xw)` the same for
    Q8_0's four runs of signed bytes, xw's 4 bytes unsigned; `_fold(sums, i, acc, d, m, dx,
    sx)` sums[i] = sums[i] + (d * dx) * acc + m * sx on 64 float32 lanes (`lanes`), every
    product and sum rounded on its own; `_ahead(tiles, k, b, at)` asks the memory for the line
    at byte `at` of tiles[k, b] (a hint; b may be past the tile's last block)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    f32, i32, i8 = ir.FloatType(), ir.IntType(32), ir.IntType(8)
    vec, ivec = ir.VectorType(f32, LANES), ir.VectorType(i32, LANES)
    v16, b64 = ir.VectorType(i32, 16), ir.VectorType(i8, 64)
    ilanes = _vector_type(f"int32x{LANES}", ivec)

    def pointer(context, builder, sig, args, at, to, wraparound=True):  # &tiles[k, b, at]
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], arr, [*args[1:3], at],
                                       wraparound=wraparound)
        return builder.bitcast(ptr, to.as_pointer())

    def concat(builder, parts):  # 4 x <16 x i32> -> <64 x i32>
        half = ir.VectorType(i32, 32)
        lo = builder.shuffle_vector(parts[0], parts[1], ir.Constant(half, list(range(32))))
        hi = builder.shuffle_vector(parts[2], parts[3], ir.Constant(half, list(range(32))))
        return builder.shuffle_vector(lo, hi, ir.Constant(ivec, list(range(LANES))))

    def dots(builder, acc, runs, x4, unsigned_weights):  # vpdpbusd on each 16 outputs
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v16, [v16, v16, v16]),
            "llvm.x86.avx512.vpdpbusd.512")
        out = []
        for g, run in enumerate(runs):
            part = builder.shuffle_vector(acc, acc, ir.Constant(
                v16, list(range(16 * g, 16 * g + 16))))
            w = builder.bitcast(run, v16)
            out.append(builder.call(fn, [part, w, x4] if unsigned_weights else [part, x4, w]))
        return concat(builder, out)

    def tiles_of_int8(tiles):
        return isinstance(tiles, types.Array) and tiles.dtype == types.int8

    @intrinsic
    def izero(typingctx):
        return ilanes(), lambda context, builder, sig, args: ir.Constant(ivec, [0] * LANES)

    @intrinsic
    def istart(typingctx, tiles, k, b, at):
        def codegen(context, builder, sig, args):
            return builder.load(pointer(context, builder, sig, args, args[3], ivec), align=4)

        return (ilanes(tiles, k, b, at), codegen) if tiles_of_int8(tiles) else None

    @intrinsic
    def nibble_dots(typingctx, acc, tiles, k, b, at, xw):
        def codegen(context, builder, sig, args):
            acc, tiles_sig = args[0], sig.args[1:5]
            inner = sig.replace(args=tiles_sig)
            runs = []
            for p in range(2):
                off = builder.add(args[4], ir.Constant(args[4].type, 64 * p))
                raw = builder.load(pointer(context, builder, inner, args[1:4], off, b64),
                                   align=1)
                runs += [builder.and_(raw, ir.Constant(b64, [15] * 64)),
                         builder.lshr(raw, ir.Constant(b64, [4] * 64))]
            return dots(builder, acc, runs, _splat(builder, args[5], v16), True)

        return (ilanes(acc, tiles, k, b, at, xw), codegen) if tiles_of_int8(tiles) else None

    @intrinsic
    def byte_dots(typingctx, acc, tiles, k, b, at, xw):
        def codegen(context, builder, sig, args):
            inner = sig.replace(args=sig.args[1:5])
            runs = []
            for h in range(4):
                off = builder.add(args[4], ir.Constant(args[4].type, 64 * h))
                runs.append(builder.load(pointer(context, builder, inner, args[1:4], off, b64),
                                         align=1))
            return dots(builder, args[0], runs, _splat(builder, args[5], v16), False)

        return (ilanes(acc, tiles, k, b, at, xw), codegen) if tiles_of_int8(tiles) else None

    @intrinsic
    def fold(typingctx, sums, i, acc, d, m, dx, sx):
        def codegen(context, builder, sig, args):
            sums, i, acc, d, m, dx, sx = args
            arr = context.make_array(sig.args[0])(context, builder, sums)
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], arr,
                                           [i, ir.Constant(ir.IntType(64), 0)])
            ptr = builder.bitcast(ptr, vec.as_pointer())
            y = builder.load(ptr, align=4)
            dx = context.cast(builder, dx, sig.args[5], types.float32)
            sx = context.cast(builder, sx, sig.args[6], types.float32)
            scaled = builder.fmul(d, _splat(builder, dx, vec))
            y = builder.fadd(y, builder.fmul(scaled, builder.sitofp(acc, vec)))
            y = builder.fadd(y, builder.fmul(m, _splat(builder, sx, vec)))
            builder.store(y, ptr, align=4)
            return context.get_dummy_value()

        return types.void(sums, i, acc, d, m, dx, sx), codegen

    @intrinsic
    def ahead(typingctx, tiles, k, b, at):
        def codegen(context, builder, sig, args):
            i8p = ir.IntType(8).as_pointer()
            line = pointer(context, builder, sig, args, args[3], ir.IntType(8), False)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0" if getattr(line.type, "is_opaque", False)
                else "llvm.prefetch.p0i8")
            builder.call(fn, [line, i32(0), i32(3), i32(1)])  # read, every cache level, data
            return context.get_dummy_value()

        return types.void(tiles, k, b, at), codegen

    return izero, istart, nibble_dots, byte_dots, fold, ahead


# ---- the pieces of a block -------------------------------------------------------------------

def _rms_norm(x, w, eps, y):  # pragma: no cover - runs compiled
    # y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w
    t, d = x.shape
    for r in range(t):
        ss = np.float32(0)
        for i in range(d):
            ss += x[r, i] * x[r, i]
        scale = np.float32(1) / np.sqrt(ss / d + eps)
        for i in range(d):
            y[r, i] = x[r, i] * scale * w[i]


def _rope_store(qkv, cos, sin, k_cache, v_cache, positions, slots, n_heads,
                n_kv):  # pragma: no cover - runs compiled
    # rotate the query and key heads of qkv [T, H+2K, E] in place (position positions[r]), then
    # write row r's keys and values into the caches [K, S_max, E] at slot slots[r]
    t, _, e = qkv.shape
    half = e // 2
    for r in range(t):
        p = positions[r]
        for h in range(n_heads + n_kv):
            for i in range(half):
                c, s = cos[p, i], sin[p, i]
                a, b = qkv[r, h, i], qkv[r, h, i + half]
                qkv[r, h, i] = a * c - b * s
                qkv[r, h, i + half] = b * c + a * s
        for h in range(n_kv):  # element by element: a slice assignment compiles numba's
            for i in range(e):  # broadcasting and its error messages (2 s on a first run)
                k_cache[h, slots[r], i] = qkv[r, n_heads + h, i]
                v_cache[h, slots[r], i] = qkv[r, n_heads + n_kv + h, i]


def _attention(qkv, k_cache, v_cache, positions, slots, tree, has_tree, n_heads, scale,
               window, out):  # pragma: no cover - runs compiled
    # row r, query head h (kv head h // G) attends to the slots j <= slots[r] it sees: with a
    # tree, of this call's slots (first..) only those whose bit is set in tree[r]; with a
    # sliding window, only j > positions[r] - window. Softmax over them, then the mean of values.
    # A head of 64 numbers takes _attend_lanes; another head size the loops of one number at a
    # time below.
    t, _, e = qkv.shape
    g = n_heads // k_cache.shape[0]
    first = slots[0]
    last = 0  # the last slot any row sees (a loop: slots.max() compiles 0.4 s more)
    for r in range(t):
        last = max(last, slots[r])
    if e == LANES:
        _attend_lanes(qkv, k_cache, v_cache, positions, slots, tree, has_tree, g, scale,
                      window, out, first, last)
        return
    scores = np.empty(last + 1, np.float32)
    acc = np.empty(e, np.float32)
    for r in range(t):
        top = slots[r]
        lo = max(positions[r] - window + 1, 0) if window > 0 else 0
        for h in range(n_heads):
            keys, values = k_cache[h // g], v_cache[h // g]
            best = np.float32(-np.inf)
            for j in range(lo, top + 1):
                if has_tree and j >= first and not (tree[r] >> (j - first)) & 1:
                    scores[j] = -np.inf
                    continue
                s = np.float32(0)
                for i in range(e):
                    s += qkv[r, h, i] * keys[j, i]
                scores[j] = s * scale
                best = max(best, scores[j])
            total = np.float32(0)
            for j in range(lo, top + 1):
                scores[j] = np.exp(scores[j] - best)
                total += scores[j]
            for i in range(e):
                acc[i] = 0
            for j in range(lo, top + 1):
                p = scores[j]
                if p != 0:
                    for i in range(e):
                        acc[i] += p * values[j, i]
            for i in range(e):
                out[r, h * e + i] = acc[i] / total


def _attend_lanes_kernel(qkv, k_cache, v_cache, positions, slots, tree, has_tree, g, scale,
                         window, out, first, last):  # pragma: no cover - runs compiled
    # _attention for heads of 64 numbers, each one 64-lane value. Per row and kv head, each of
    # its g query heads' scores 16 keys at a time (_scores16: _dot's sums, the last levels of
    # 16 trees side by side), a masked-out node -inf, their max, exp(score - max) and its sum
    # 16 at a time (_exp16; the sum of 16 lanes, then their tree); then the mean of the values
    # for up to 4 of the heads at once: each value read once, each head's 64 sums their own
    # chain of fused multiply-adds, key by key. Every number is a function of its row alone
    # (its slot, position and tree bits), not of the rows beside it. Compiled without
    # fastmath: the order written here is the order computed.
    n_kv, _, e = k_cache.shape
    scores = np.empty((g, last + 16), np.float32)  # room for one block of 16 past the last slot
    totals = np.empty(g, np.float32)
    for r in range(qkv.shape[0]):
        end = slots[r] + 1
        lo = max(positions[r] - window + 1, 0) if window > 0 else 0
        whole = lo + (end - lo) // 16 * 16  # keys lo..whole - 1 in blocks of 16, then one by one
        blocks = lo + (end - lo + 15) // 16 * 16  # the scores' blocks of 16 cover lo..blocks - 1
        for kv in range(n_kv):
            keys, values = k_cache[kv], v_cache[kv]
            for a in range(g):
                q = _load(qkv[r], kv * g + a)
                for j in range(lo, whole, 16):
                    _store16(scores, a, j, _scores16(q, keys, j, scale))
                for j in range(whole, end):
                    scores[a, j] = _dot(q, _load(keys, j)) * scale
                if has_tree:
                    for j in range(max(lo, first), end):
                        if not (tree[r] >> (j - first)) & 1:
                            scores[a, j] = -np.inf
                for j in range(end, blocks):  # the last block's lanes past `end`
                    scores[a, j] = -np.inf
                top = _load16(scores, a, lo)
                for j in range(lo + 16, blocks, 16):
                    top = _max16(top, _load16(scores, a, j))
                best = _hmax16(top)
                sums = _zero16()
                for j in range(lo, blocks, 16):  # exp(-inf) = 0 past `end`
                    p = _exp16(_load16(scores, a, j), best)
                    _store16(scores, a, j, p)
                    sums = _add16(sums, p)
                totals[a] = _hsum16(sums)
            for a in range(0, g, 4):
                n = min(4, g - a)
                m0 = m1 = m2 = m3 = _zero()
                for j in range(lo, end):  # a score of 0 adds 0: the sums stay as they were
                    v = _load(values, j)
                    m0 = _fma(m0, v, scores[a, j])
                    if n > 1:  # the same for every j
                        m1 = _fma(m1, v, scores[a + 1, j])
                    if n > 2:
                        m2 = _fma(m2, v, scores[a + 2, j])
                    if n > 3:
                        m3 = _fma(m3, v, scores[a + 3, j])
                h = kv * g + a
                _store(out, r, h * e, m0)
                if n > 1:
                    _store(out, r, (h + 1) * e, m1)
                if n > 2:
                    _store(out, r, (h + 2) * e, m2)
                if n > 3:
                    _store(out, r, (h + 3) * e, m3)
                for b in range(n):
                    for i in range(e):
                        out[r, (h + b) * e + i] /= totals[a + b]


def _block_front(x, attn_norm_w, wqkv, wo, mlp_norm_w, w_gate, w_up, f, eps, cos, sin, k_cache,
                 v_cache, positions, slots, tree, has_tree, n_heads, n_kv, scale,
                 window):  # pragma: no cover - runs compiled
    # model.block for a Llama-shaped layer (RMSNorm, RoPE, SwiGLU, no biases) on x [T, D], as far
    # as the MLP's SiLU: the loops above one after the other, in one call -> h = x + attn [T, D]
    # and the MLP's two products of norm(h), gate and up [T, F] (f = F). The weights are the
    # tiles the product reads.
    qkv = _heads(x, attn_norm_w, wqkv, eps, n_heads + 2 * n_kv, 2 * cos.shape[1])
    att = np.empty((x.shape[0], n_heads * qkv.shape[2]), np.float32)
    _rope(qkv, cos, sin, k_cache, v_cache, positions, slots, n_heads, n_kv)
    _attend(qkv, k_cache, v_cache, positions, slots, tree, has_tree, n_heads, scale, window, att)
    return _mlp_in(x, att, wo, mlp_norm_w, w_gate, w_up, f, eps)


def _batch_front(x, bounds, attn_norm_w, wqkv, wo, mlp_norm_w, w_gate, w_up, f, eps, cos, sin,
                 k_caches, v_caches, layer, positions, n_heads, n_kv, scale,
                 window):  # pragma: no cover - runs compiled
    # _block_front for B sequences' rows laid end to end (rows bounds[b]..bounds[b+1] - 1 are
    # sequence b's, at positions[row]): norms and products over every row at once, RoPE with
    # the cache write and attention sequence by sequence, each on layer `layer` of its own
    # caches, k_caches[b] and v_caches[b] [L, K, S_max, E] (numba lists). Each row's arithmetic
    # is the one-sequence call's, in the same order: the same bits.
    qkv = _heads(x, attn_norm_w, wqkv, eps, n_heads + 2 * n_kv, 2 * cos.shape[1])
    att = _attend_each(qkv, bounds, cos, sin, k_caches, v_caches, layer, positions, n_heads,
                       n_kv, scale, window)
    return _mlp_in(x, att, wo, mlp_norm_w, w_gate, w_up, f, eps)


def _attend_each_kernel(qkv, bounds, cos, sin, k_caches, v_caches, layer, positions, n_heads,
                        n_kv, scale, window):  # pragma: no cover - runs compiled
    # RoPE with the cache write and attention for B sequences' rows qkv [N, H + 2K, E] laid end
    # to end, sequence by sequence, each on layer `layer` of its own caches -> att [N, H * E]
    att = np.empty((qkv.shape[0], n_heads * qkv.shape[2]), np.float32)
    no_tree = np.zeros(0, np.uint32)
    has_tree = no_tree.shape[0] > 0  # False, as a value: a literal False compiles _attend again
    for b in range(bounds.shape[0] - 1):
        lo, hi = bounds[b], bounds[b + 1]
        k_cache, v_cache = k_caches[b][layer], v_caches[b][layer]
        rows, at = qkv[lo:hi], positions[lo:hi]
        _rope(rows, cos, sin, k_cache, v_cache, at, at, n_heads, n_kv)
        _attend(rows, k_cache, v_cache, at, at, no_tree, has_tree, n_heads, scale, window,
                att[lo:hi])
    return att


def _draft_chain(ids, pos, embed, attn_norm_ws, wqkvs, wos, mlp_norm_ws, w_gates, w_ups,
                 w_downs, f, eps, cos, sin, k_cache, v_cache, n_heads, n_kv, scale, window,
                 norm_w, head, cols, cut, temperature, uniforms, tokens, logits,
                 q):  # pragma: no cover - runs compiled
    # g = len(tokens) drafts of a Llama-shaped model in one call: its layers (per-layer weights
    # in numba lists; caches [L, K, S_max, E]) over the tokens `ids` at positions pos.., then
    # the final norm and LM head on the last row -> logits[0], and tokens[0] from the logits of
    # the ids `cols` (ascending); then each draft fed back in turn, one row a step, for
    # tokens[1..]. The last draft is not fed. cut 0: `head` is the whole LM head, cols its
    # first ids; cut 1: `head` holds only the rows of the ids `cols` (a draft vocabulary),
    # whose logits go to those columns (the caller filled the others with -inf). Each token
    # `_pick`ed from the logits of cols: temperature 0 their argmax, q [g, 0] untouched; else
    # q[s, cols] their softmax and tokens[s] drawn from it with uniforms[s] (every other id's
    # q stays 0, as warp's exp of -inf gives). The layers are
    # _layers' loop, written again (see the module's docstring). Compiled without fastmath: a
    # logit of -inf, or a NaN, stays what IEEE makes of it.
    no_tree = np.zeros(0, np.uint32)
    has_tree = no_tree.shape[0] > 0  # False, as a value (as in _batch_front)
    x = np.empty((ids.shape[0], embed.shape[1]), np.float32)
    for r in range(ids.shape[0]):
        x[r] = embed[ids[r]]
    at = pos
    for s in range(tokens.shape[0]):
        t = x.shape[0]
        positions = np.arange(at, at + t)
        h = x
        for i in range(len(wqkvs)):  # _layers' loop, as _batch_front calls the pieces
            qkv = _heads(h, attn_norm_ws[i], wqkvs[i], eps, n_heads + 2 * n_kv, 2 * cos.shape[1])
            att = np.empty((t, n_heads * qkv.shape[2]), np.float32)
            _rope(qkv, cos, sin, k_cache[i], v_cache[i], positions, positions, n_heads, n_kv)
            _attend(qkv, k_cache[i], v_cache[i], positions, positions, no_tree, has_tree, n_heads,
                    scale, window, att)
            h, gate, up = _mlp_in(h, att, wos[i], mlp_norm_ws[i], w_gates[i], w_ups[i], f, eps)
            h = _mlp_out(h, gate, up, w_downs[i])
        last = np.empty((1, h.shape[1]), np.float32)
        _norm(h[t - 1:], norm_w, eps, last)
        n = cols.shape[0]
        u = uniforms[s] if temperature > 0 else 0.0
        if cut:  # the cut's logits and q, in a row of their own, then in their columns
            row = np.empty((1, n), np.float32)
            _any_product(last, head, row)
            qcut = np.empty(n if temperature > 0 else 0)
            best = _pick(row[0], qcut, u, temperature)
            for c in range(n):
                logits[s, cols[c]] = row[0, c]
            for c in range(qcut.shape[0]):
                q[s, cols[c]] = qcut[c]
        else:  # q [g, 0] at temperature 0: nothing written
            _any_product(last, head, logits[s:s + 1])
            best = _pick(logits[s, :n], q[s, :n], u, temperature)
        best = cols[best]
        tokens[s] = best
        x = np.empty((1, embed.shape[1]), np.float32)
        x[0] = embed[best]
        at += t


def _layers(h, attn_norm_ws, wqkvs, wos, mlp_norm_ws, w_gates, w_ups, w_downs, f, eps, cos,
            sin, k_cache, v_cache, positions, slots, tree, has_tree, n_heads, n_kv, scale,
            window):  # pragma: no cover - runs compiled
    # every layer of a Llama-shaped model over rows h [T, D] -> [T, D]: per layer (weights in
    # numba lists, caches [L, K, S_max, E]) _block_front's pieces, then silu(gate) * up and the
    # MLP's last product plus h, as NumbaKernels.block takes them one call at a time: the same
    # arithmetic in the same order, so the same bits, without Python between the layers.
    t = h.shape[0]
    for i in range(len(wqkvs)):
        qkv = _heads(h, attn_norm_ws[i], wqkvs[i], eps, n_heads + 2 * n_kv, 2 * cos.shape[1])
        att = np.empty((t, n_heads * qkv.shape[2]), np.float32)
        _rope(qkv, cos, sin, k_cache[i], v_cache[i], positions, slots, n_heads, n_kv)
        _attend(qkv, k_cache[i], v_cache[i], positions, slots, tree, has_tree, n_heads, scale,
                window, att)
        h, gate, up = _mlp_in(h, att, wos[i], mlp_norm_ws[i], w_gates[i], w_ups[i], f, eps)
        h = _mlp_out(h, gate, up, w_downs[i])
    return h


def _batch_layers(h, bounds, attn_norm_ws, wqkvs, wos, mlp_norm_ws, w_gates, w_ups, w_downs, f,
                  eps, cos, sin, k_caches, v_caches, positions, n_heads, n_kv, scale,
                  window):  # pragma: no cover - runs compiled
    # every layer for B sequences' rows laid end to end (_batch_front's arguments, each layer's
    # weights from numba lists, as _layers takes them for one sequence): per layer _batch_front's
    # pieces, then _mlp_out, the arithmetic of NumbaKernels.batch_block, so the same bits
    for i in range(len(wqkvs)):
        qkv = _heads(h, attn_norm_ws[i], wqkvs[i], eps, n_heads + 2 * n_kv, 2 * cos.shape[1])
        att = _attend_each(qkv, bounds, cos, sin, k_caches, v_caches, i, positions, n_heads,
                           n_kv, scale, window)
        h, gate, up = _mlp_in(h, att, wos[i], mlp_norm_ws[i], w_gates[i], w_ups[i], f, eps)
        h = _mlp_out(h, gate, up, w_downs[i])
    return h


def _pick_kernel(lrow, qrow, u, temperature):  # pragma: no cover - runs compiled
    # draft_chain's choice from one step's logits lrow [n] -> an index into it: temperature 0
    # the argmax (the first on ties, as np.argmax), qrow untouched; else qrow [n] = softmax(lrow
    # / temperature) in float64 as sampling.warp computes it (the largest logit subtracted
    # first) and the index drawn from it with the uniform u as sampling.sample draws (the
    # inverse of the running sum over the entries of q > 0). A function of its own, so that
    # each kind of row (a view of the logits, or the cut's own row) gets loops compiled for it.
    best = 0
    for c in range(1, lrow.shape[0]):
        if lrow[c] > lrow[best]:
            best = c
    if temperature > 0:
        top = np.float64(lrow[best])
        total = 0.0
        for c in range(lrow.shape[0]):
            qrow[c] = np.exp((np.float64(lrow[c]) - top) / temperature)
            total += qrow[c]
        for c in range(lrow.shape[0]):
            qrow[c] /= total
        mass = 0.0  # the running sum, then the draw
        for c in range(lrow.shape[0]):
            if qrow[c] > 0:
                mass += qrow[c]
        r = u * mass
        mass = 0.0
        for c in range(lrow.shape[0]):
            if qrow[c] > 0:
                best = c  # the last entry with q > 0 if r rounded up to the total
                mass += qrow[c]
                if mass > r:
                    break
    return best


def _heads_kernel(x, attn_norm_w, wqkv, eps, heads, e):  # pragma: no cover - runs compiled
    # a block's start: norm(x) [T, D] times wqkv -> the heads [T, H + 2K, E] (heads = H + 2K)
    xn = np.empty_like(x)
    _norm(x, attn_norm_w, eps, xn)
    qkv = np.empty((x.shape[0], heads * e), np.float32)
    _any_product(xn, wqkv, qkv)
    return qkv.reshape((x.shape[0], heads, e))


def _mlp_in_kernel(x, att, wo, mlp_norm_w, w_gate, w_up, f, eps):  # pragma: no cover - compiled
    # after attention: h = x + att [T, H*E] times wo, then the MLP's gate and up products of
    # norm(h) -> h, gate, up
    t, d = x.shape
    h = np.empty((t, d), np.float32)
    _any_product(att, wo, h)
    for r in range(t):
        for i in range(d):
            h[r, i] += x[r, i]  # x + attn
    xn = np.empty_like(x)
    _norm(h, mlp_norm_w, eps, xn)
    gate = np.empty((t, f), np.float32)
    up = np.empty((t, f), np.float32)
    _any_product(xn, w_gate, gate)
    _any_product(xn, w_up, up)
    return h, gate, up


def _mlp_out_kernel(h, gate, up, w_down):  # pragma: no cover - runs compiled
    # the MLP's end: h + (silu(gate) * up) times w_down -> [T, D] (gate is overwritten), as
    # NumbaKernels.block finishes a block after block_front
    _silu(gate, up)
    y = np.empty_like(h)
    _any_product(gate, w_down, y)
    for r in range(h.shape[0]):
        for j in range(y.shape[1]):
            y[r, j] += h[r, j]  # h + mlp
    return y


_TANH_EDGE = np.float32(7.90531110763549805)  # past it tanh rounds to +-1 in float32
_TANH_P = tuple(np.float32(c) for c in (  # tanh(x) ~ x p(x^2) / q(x^2) on [-edge, edge]: the
    -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,  # coefficients of
    5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,  # Eigen's and XLA's
    4.89352455891786e-03))  # float32 tanh, highest power first
_TANH_Q = tuple(np.float32(c) for c in (
    1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03))

SILU_FLAGS = {"error_model": "numpy", "fastmath": False}  # _silu_kernel's, spelled out: numba
# gives a function whose fastmath is left unset the flags of the first caller that compiles it
# (_mlp_out's fastmath), and its bits would then depend on which path ran first


def _silu_kernel(gate, up):  # pragma: no cover - runs compiled
    # gate [T, F] = silu(gate) * up in place, model.silu's arithmetic (x * ((1 + tanh(x / 2))
    # * 0.5)) with tanh a rational function: numba's np.tanh is one call of the C library per
    # number, this loop LLVM vectorizes (16 at a time; error_model="numpy" lets the division
    # raise nothing). Its multiply-adds are fused by hand (_fma1) and it is compiled without
    # fastmath (SILU_FLAGS), so that no compilation can change its bits; past the edge tanh is
    # +-1, as float32's is.
    # Within 6 ulp of tanh where NumPy's is within 1.4; NaN and +-inf as NumPy's.
    a, b, c, d, e, f, g7 = _TANH_P
    q3, q2, q1, q0 = _TANH_Q
    one, half = np.float32(1), np.float32(0.5)
    for r in range(gate.shape[0]):
        for j in range(gate.shape[1]):
            x = gate[r, j]
            h = x * half
            k = min(max(h, -_TANH_EDGE), _TANH_EDGE)
            k2 = k * k
            p = _fma1(_fma1(_fma1(_fma1(_fma1(_fma1(a, k2, b), k2, c), k2, d), k2, e), k2, f),
                      k2, g7) * k
            t = p / _fma1(_fma1(_fma1(q3, k2, q2), k2, q1), k2, q0)
            if h >= _TANH_EDGE:
                t = one
            elif h <= -_TANH_EDGE:
                t = -one
            gate[r, j] = x * ((t + one) * half) * up[r, j]
