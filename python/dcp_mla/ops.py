"""Every operation over torch CUDA tensors, registered as torch custom ops (`torch.ops.dcp_mla.*`).

Each public function checks its arguments (dtype, device, shape, contiguity and strides, with an
error that names the argument), allocates only the outputs the caller did not pass, and launches
on the current torch stream of the tensors' device. Nothing synchronises, so every call can be
captured in a CUDA graph. The C ABI underneath checks everything again against the real
allocations (a view is checked against the storage it lives in) and its errors arrive as
DcpMlaError, naming the argument in the ABI's terms.

Eager calls go straight to the C ABI (the custom-op dispatcher would add its own overhead to
every launch); under torch.compile the same functions call the registered custom ops, whose fake
implementations let `torch.compile(fullgraph=True)` trace a whole decode step.
"""

import functools
import os
import struct
import threading
from ctypes import addressof, byref, c_size_t, c_void_p, memmove, sizeof
from typing import Optional, Tuple

import torch

from . import _lib, planner
from ._fastlaunch import OpLaunch, ops_key
from ._lib import DTYPE_BF16, DTYPE_F32, DTYPE_I32, DTYPE_U8, LSE_BASE_E, LSE_BASE_2

_BYTES = (torch.uint8, torch.int8) + tuple(
    d for d in (getattr(torch, "float8_e4m3fn", None),) if d is not None)
_CODES = {torch.bfloat16: DTYPE_BF16, torch.float32: DTYPE_F32, torch.int32: DTYPE_I32,
          **{d: DTYPE_U8 for d in _BYTES}}
_OUT = (torch.bfloat16, torch.float32)
_LSE_BASES = {"e": LSE_BASE_E, "2": LSE_BASE_2, LSE_BASE_E: LSE_BASE_E, LSE_BASE_2: LSE_BASE_2}


# --- argument checks (run in the caller's frame, so torch.compile traces them as guards) --------

def _fail(name, what):
    raise ValueError(f"{name}: {what}")


def _check(x, name, dtypes, ndim=None, shape=None, contiguous=True, device=None):
    """`x` is a CUDA tensor of one of `dtypes`, `ndim` dims whose sizes match `shape` (None: any),
    on `device`, contiguous (or, with contiguous='rows', unit stride in its last dim)."""
    try:
        dtype, dev = x.dtype, x.device
    except AttributeError:
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}") from None
    if dtype not in dtypes:
        raise TypeError(f"{name}: dtype {dtype}, expected {' or '.join(str(d) for d in dtypes)}")
    if dev.type != "cuda":
        _fail(name, f"on {dev}, expected a CUDA tensor")
    if device is not None and dev != device:
        _fail(name, f"on {dev}, the other tensors are on {device}")
    if ndim is not None or shape is not None:
        got = x.shape
        if ndim is not None and len(got) != ndim:
            _fail(name, f"{len(got)}-d {tuple(got)}, expected {ndim}-d")
        if shape is not None:
            for i, want in enumerate(shape):
                if want is not None and got[i] != want:
                    _fail(name, f"shape {tuple(got)}, expected {tuple('*' if s is None else s for s in shape)} "
                                f"(dim {i} is {got[i]}, not {want})")
    if contiguous is True:
        if not x.is_contiguous():
            _fail(name, f"must be contiguous (strides {x.stride()})")
    elif contiguous == "rows" and x.dim() > 0 and x.stride(-1) != 1 and x.shape[-1] > 1:
        _fail(name, f"last dim must have stride 1 (strides {x.stride()})")
    return x


def _ints(**named):
    """Integer arguments (None: absent) checked by name before ctypes sees them: ints in
    [0, 2^63), not floats or bools (`_lib.integer`; ctypes would take −1 as 2^64 − 1). Under
    torch.compile the values may be symbolic: the traced custom op's eager run checks them then."""
    if torch.compiler.is_compiling():
        return
    for name, value in named.items():
        if value is not None and not (type(value) is int and 0 <= value < 1 << 63):
            _lib.integer(name, value, 0, (1 << 63) - 1)


def _cache(cache, name="cache", device=None):
    """A paged cache [pages, B, row] or FlashMLA's [pages, B, 1, row]: its 3-d view and format.
    The pages may be a view of a larger page dimension: each page's rows contiguous, page starts
    any whole number of rows (at least B) apart (the C ABI's page_stride)."""
    _check(cache, name, (torch.bfloat16,) + _BYTES, device=device, contiguous="rows")
    if cache.dim() == 4:
        if cache.shape[2] != 1:
            _fail(name, f"shape {tuple(cache.shape)}: a 4-d cache has one KV head (dim 2 of size 1)")
        cache = cache.select(2, 0)
    elif cache.dim() != 3:
        _fail(name, f"{cache.dim()}-d {tuple(cache.shape)}, expected [pages, B, row] or [pages, B, 1, row]")
    row_bytes = cache.shape[2] * cache.element_size()
    fmt = {1152: _lib.KV_BF16, 656: _lib.KV_FP8_656}.get(row_bytes)
    if fmt is None:
        _fail(name, f"rows of {row_bytes} bytes: expected 1152 (576 bf16) or 656 (FP8-656)")
    row = cache.shape[2]
    rows_apart = cache.shape[1] > 1 and cache.stride(1) != row
    pages_apart = cache.shape[0] > 1 and (cache.stride(0) % row or cache.stride(0) < row * cache.shape[1])
    if rows_apart or pages_apart:
        _fail(name, f"strides {cache.stride()}: a page's rows must be contiguous and pages a whole number of "
                    f"rows (at least B) apart")
    return cache, fmt


def _cache_t(cache3):
    """A cache [pages, B, row] as a C tensor: its stride (elements between page starts) given
    only when its pages are not packed."""
    if cache3.is_contiguous():
        return (cache3.data_ptr(), cache3.numel(), _CODES[cache3.dtype], 0, 0, 0, 0, 0)
    if cache3.shape[0] <= 1 or cache3.stride(0) == cache3.shape[1] * cache3.shape[2]:
        return (cache3.data_ptr(), _extent(cache3), _CODES[cache3.dtype], 0, 0, 0, 0, 0)
    return (cache3.data_ptr(), _extent(cache3), _CODES[cache3.dtype], 1, cache3.stride(0), 0, 0, 0)


def _model1_cache(cache, name="cache", device=None):
    """A MODEL1 cache as FlashMLA lays it out, [num_blocks, B, 1, 584] bytes (uint8, int8 or
    float8_e4m3fn; or [num_blocks, B, 584]): its 3-d view and page stride in bytes
    (planner.model1_pages: a page's B·584 bytes contiguous, pages a multiple of 576 bytes apart)."""
    _check(cache, name, _BYTES, device=device, contiguous=False)
    _, _, stride = planner.model1_pages(cache.shape, cache.stride(), name)
    return (cache.select(2, 0) if cache.dim() == 4 else cache), stride


def _model1_t(cache3, stride):
    """A MODEL1 cache [pages, B, 584] as a C tensor with its page stride in bytes. Its element
    count is what the allocation holds from its first byte, up to the pages' extent with the last
    page's padding (FlashMLA's [num_blocks, B, 1, 584] views end at the last page's B·584 bytes,
    its allocation at the padded page's end): the library checks the bytes it may read against it."""
    pages, bs = cache3.shape[0], cache3.shape[1]
    want = (pages - 1) * stride + planner.model1_page_bytes(bs) if pages else 0
    storage = cache3.untyped_storage()
    held = storage.nbytes() - (cache3.data_ptr() - storage.data_ptr())
    return (cache3.data_ptr(), max(min(want, held), _extent(cache3)), _CODES[cache3.dtype], 1, stride, 0, 0, 0)


def _tv(x, n):
    """A view as a C tensor with its first n strides, or with none (the C ABI's default layout)
    when x is contiguous or absent. A dim of size 1 gets stride 0 (torch leaves any stride
    there; the library checks alignment)."""
    if x is None:
        return _ABSENT
    # The tuple spelled out here and in _cache_t, not through _t: these run on every launch, and
    # a shared helper (one more call) measured 0.2 µs a decode call, most of what testing the
    # contiguity once saves (CPU, torch 2.11).
    if x.is_contiguous():
        return (x.data_ptr(), x.numel(), _CODES[x.dtype], 0, 0, 0, 0, 0)
    st = [s if z > 1 else 0 for z, s in zip(x.shape[:n], x.stride()[:n])] + [0] * (4 - n)
    return (x.data_ptr(), _extent(x), _CODES[x.dtype], n, *st)


def _t1(x):
    """A 2-d tensor with its row stride (elements between rows) given."""
    return (x.data_ptr(), x.numel() if x.is_contiguous() else _extent(x), _CODES[x.dtype], 1, x.stride(0), 0, 0, 0)


def _want_format(name, got, kv_format):
    if kv_format is not None and planner.kv_format_code(kv_format) != got:
        _fail(name, f"holds {'bf16' if got == _lib.KV_BF16 else 'fp8_656'} rows, kv_format says {kv_format!r}")


def _sink(sink, heads, device, name="sink"):
    """An optional f32 [heads] attention sink per head (docs/contract.md §4), checked."""
    if sink is not None:
        _check(sink, name, (torch.float32,), ndim=1, shape=(heads,), device=device)
    return sink


def _base(name, base):
    try:
        return _LSE_BASES[base]
    except (KeyError, TypeError):
        raise ValueError(f"{name}: {base!r} is no lse base ('e' or '2')") from None


# --- the C ABI side: device handles, streams, tensor descriptors --------------------------------

@functools.lru_cache(maxsize=None)
def _device(index):
    """The library's handle of CUDA device `index` (its primary context: the one torch uses)."""
    dev = c_void_p()
    _lib.call("dcp_mla_device_open", index, byref(dev))
    if _NATIVE is not None:
        _NATIVE.register_device(index, dev.value)  # the native launches' handle of this device too
    return dev.value


@functools.lru_cache(maxsize=None)
def num_sms(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


# Planner answers the wrappers need: pure functions of their integer arguments, so cached (a
# ctypes query costs several µs) behind functions torch.compile evaluates as constants while
# tracing (it cannot trace ctypes, nor run an lru_cache wrapper as a constant).
_cached = functools.lru_cache(maxsize=4096)


@_cached
def _splits_cached(b, nq, h, sparse, index):
    return planner.decode_num_splits(b, nq, h, sparse, num_sms(index))


@_cached
def _splits_on_cached(b, nq, h, sparse, kv, context, causal, index):
    return _lib.query("dcp_mla_decode_num_splits_on", _device(index), int(bool(sparse)), kv, b, nq, h, context,
                      int(bool(causal)), out_types=(c_size_t,))[0]


@_cached
def _workspace_bytes_cached(b, nq, h, sparse, num_splits):
    return planner.decode_workspace_bytes(b, nq, h, sparse, num_splits)


@_cached
def _slot_bytes_cached(t, hl):
    return planner.a2a_slot_bytes(t, hl)


@_cached
def _default_scale_cached():
    return planner.default_scale()


@torch.compiler.assume_constant_result
def _splits(b, nq, h, sparse, index):
    return _splits_cached(b, nq, h, sparse, index)


@torch.compiler.assume_constant_result
def _splits_on(b, nq, h, sparse, kv, context, causal, index):
    return _splits_on_cached(b, nq, h, sparse, kv, context, causal, index)


@torch.compiler.assume_constant_result
def _workspace_bytes(b, nq, h, sparse, num_splits):
    return _workspace_bytes_cached(b, nq, h, sparse, num_splits)


@torch.compiler.assume_constant_result
def _slot_bytes(t, hl):
    return _slot_bytes_cached(t, hl)


@torch.compiler.assume_constant_result
def _default_scale():
    return _default_scale_cached()


def _index(device):
    return device.index if device.index is not None else torch.cuda.current_device()


# torch's current stream of a device as a raw cudaStream_t, without building a torch.cuda.Stream
# object (what torch's own generated code calls); the public API where that is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if _raw_stream is None:
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def _dev_stream(x):
    index = _index(x.device)
    return _device(index), _raw_stream(index)


def _extent(x):
    """The elements a tensor's shape and strides span from its first (its numel when
    contiguous): the library bounds every access it makes by it."""
    n = 1
    for size, stride in zip(x.shape, x.stride()):
        if size == 0:
            return 0
        n += (size - 1) * stride
    return n


def _t(x):
    """A tensor as the 8 scalars of a DcpMlaTensor without strides (None: absent)."""
    if x is None:
        return _ABSENT
    n = x.numel() if x.is_contiguous() else _extent(x)
    return (x.data_ptr(), n, _CODES[x.dtype], 0, 0, 0, 0, 0)


_ABSENT = (0,) * 8


class _Entry:
    """An operation's entry point: the function (its argtypes set once), its argument struct's
    class and size, and the struct.Struct that fills one in a single call."""
    __slots__ = ("fn", "cls", "size", "pack")

    def __init__(self, name):
        self.fn = getattr(_lib.lib(), name)
        self.cls = _lib.ARGS[name]
        self.size = sizeof(self.cls)
        self.pack = _lib.packer(self.cls).pack_into


_ENTRIES = {}
# One argument struct per operation and thread, filled in place by each call: no ctypes object
# is made per launch, and two threads never share one.
_local = threading.local()


def _thread_struct(name):
    """(`name`'s entry, this thread's struct of it), made on first use: the struct every launch
    of `name` on this thread fills in place, ctypes' and the native one alike."""
    e = _ENTRIES.get(name)
    if e is None:
        e = _ENTRIES[name] = _Entry(name)
    buf = _local.__dict__.get(name)
    if buf is None:
        buf = _local.__dict__[name] = e.cls()
    return e, buf


def _launch(name, dev_stream, *values):
    """Fills `name`'s argument struct (struct_size, device and stream first, then `values` in
    the order of its scalars) and calls it; a value the struct cannot hold raises a TypeError or
    ValueError naming its field."""
    e = _ENTRIES.get(name)
    buf = _local.__dict__.get(name)
    if e is None or buf is None:
        e, buf = _thread_struct(name)
    try:
        e.pack(buf, 0, e.size, *dev_stream, *values)
    except struct.error:
        _lib.fill_checked(e.cls, buf, (e.size, *dev_stream, *values))
    status = e.fn(buf)
    if status != 0:
        _lib.check(name, status)


# --- native launches (dcp_mla._native's `launch`: python/src/launch.rs) --------------------------
# decode_dense and decode_sparse fill their argument struct from the tensors natively, through
# the DLPack C exchange API torch publishes (torch.Tensor.__dlpack_c_exchange_api__, torch >=
# 2.11), and launch without ctypes: what _launch's Python costs (~6 µs a decode launch, torch's
# per-attribute calls most of it) drops to the call itself. The struct is the same, byte for
# byte (python/tests/test_native_launch.py), and lands in this thread's struct of the entry
# point, where _last_launch finds it. Anything the native side does not read (another dtype, a
# stand-in object, a scalar its field cannot hold, a device not yet opened here) comes back as
# _FALLBACK and takes _launch, whose errors name the argument. Off when DCP_MLA_LIB names
# another build of the library (the native module launches the one linked into it) or with
# DCP_MLA_NATIVE_LAUNCH=0.

def _bind_native():
    if os.environ.get("DCP_MLA_LIB") or os.environ.get("DCP_MLA_NATIVE_LAUNCH", "1") == "0":
        return None
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if api is None:
        return None
    from . import _native
    try:
        _native.bind_tensor_api(api)
    except (TypeError, ValueError):
        return None  # another capsule or DLPack major version: the ctypes path
    return _native


_NATIVE = _bind_native()
_FALLBACK = -1 if _NATIVE is None else _NATIVE.FALLBACK
_DENSE, _SPARSE = "dcp_mla_launch_decode_dense", "dcp_mla_launch_decode_sparse"
_DENSE_AT, _SPARSE_AT = _DENSE + "@", _SPARSE + "@"
_DENSE_SIZE, _SPARSE_SIZE = sizeof(_lib.ARGS[_DENSE]), sizeof(_lib.ARGS[_SPARSE])


def _native_dst(name):
    """The address of this thread's struct of `name` (_thread_struct), which a native launch
    fills as _launch would; remembered as `name + "@"` in the thread's locals."""
    _local.__dict__[name + "@"] = at = addressof(_thread_struct(name)[1])
    return at


# The ops-level launch cache (dcp_mla._fastlaunch.OpLaunch), one entry an operation and thread:
# the last checked decode_dense / decode_sparse call's argument struct, replayed by a call whose
# arguments have the same key (every tensor's shape, strides, dtype and device, which are None,
# the other arguments as given, the stream) with its own data pointers.
_op_launches = threading.local()


def _op_key(tensors, scalars, stream):
    """The key of an ops-level launch: the native one (every tensor's dims, shape, strides, dtype
    and device as bytes, `_native.tensor_key`) where the native side reads every tensor, else
    _fastlaunch.ops_key's tuples of the same facts. The two forms never compare equal (bytes
    against a tuple), so a call keyed one way never replays a launch remembered the other way."""
    if _NATIVE is not None:
        k = _NATIVE.tensor_key(tensors)
        if k is not None:
            return k, scalars, stream
    return ops_key(tensors, scalars, stream)


def _replay(name, tensors, scalars):
    """Replays `name`'s cached launch when this call's key matches it: (out, lse), else None.
    tensors: q, out, lse, workspace, cache, block_table or indices, lens or topk_len, sink, as
    given (out and lse None: allocated here, as the checked path would)."""
    cached = _op_launches.__dict__.get(name)
    if cached is None or torch.compiler.is_compiling():
        return None
    stream = _raw_stream(cached.index)
    try:
        key = _op_key(tensors, scalars, stream)
    except (AttributeError, TypeError):
        return None  # an argument that is no tensor: the checked path names it
    if key != cached.key:
        return None
    out, lse, ws = tensors[1], tensors[2], tensors[3]
    if ws is None and cached.ws_need:
        ws = _owned_workspace(cached.device, cached.ws_need, cached.index, stream)
        if ws is None:
            return None  # captured or compiled: the checked path allocates the call's own
    if out is None:
        out = torch.empty(cached.out_shape, dtype=cached.out_dtype, device=cached.device)
    if lse is None:
        lse = torch.empty(cached.lse_shape, dtype=torch.float32, device=cached.device)
    full = (tensors[0], out, lse, ws) + tensors[4:]
    status = _FALLBACK if _NATIVE is None else \
        _NATIVE.replay_decode(name == _SPARSE, addressof(cached.buf), sizeof(cached.buf), full)
    if status == _FALLBACK:
        cached.write(full)
        cached.call()
    elif status:
        _lib.check(name, status)
    # the thread's struct of `name` holds its last launch's arguments, replayed ones too
    # (_last_launch: the face's launch cache copies it after a call)
    memmove(addressof(_local.__dict__[name]), addressof(cached.buf), sizeof(cached.buf))
    return out, lse


def _remember(name, tensors, scalars, q, out_dtype, workspace):
    """Keeps the launch this thread just made through the checked path as `name`'s cache entry,
    unless it ran under torch.compile or on a workspace allocated for this call alone (a replay
    would have none). `workspace`: the launch's; where the caller passed none, a replay takes the
    library's own for its stream again."""
    owned = tensors[3] is None and workspace is not None
    if torch.compiler.is_compiling() or (owned and not any(workspace is w for w in _owned_workspaces.values())):
        return
    fn, filled = _last_launch(name)
    b, nq, h = q.shape[0], q.shape[1], q.shape[2]
    key = _op_key(tensors, scalars, filled.stream or 0)
    _op_launches.__dict__[name] = OpLaunch(key, name, fn, filled, (b, nq, h, 512), out_dtype, (b, nq, h), q.device,
                                           _index(q.device), workspace.numel() if owned else 0)


def _last_launch(name):
    """(entry point, argument struct) of this thread's last eager launch of `name`: the struct
    is filled in place by every launch, so copy it before the next (dcp_mla.flash_mla's launch
    cache does)."""
    return _ENTRIES[name].fn, _local.__dict__[name]


# --- the custom ops: the raw launch of each operation, registered for torch.compile ------------
# Each impl takes only tensors and scalars and writes only its `mutates` arguments.

_IMPLS = {}
_infer_schema = getattr(torch.library, "infer_schema", None)  # torch >= 2.5
if _infer_schema is None:
    from torch._library.infer_schema import infer_schema as _infer_schema
_LIB = torch.library.Library("dcp_mla", "DEF")


def _op(mutates):
    """Registers an impl as `torch.ops.dcp_mla.<name>`: its schema from the annotations, `mutates`
    marked as written, one kernel for every backend and a fake that returns nothing.
    torch.library.custom_op would wrap the call in Python autograd and ADInplaceOrView layers
    (~24 µs of host time a call through torch.ops on an H100's host); defined through the
    Library, the dispatcher calls the impl directly and leaves autograd to its C++ fallback."""
    def register(fn):
        name = fn.__name__.lstrip("_")
        _LIB.define(name + _infer_schema(fn, mutates_args=mutates))
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        torch.library.register_fake(f"dcp_mla::{name}", lambda *args, **kwargs: None, lib=_LIB)
        _IMPLS[name] = (fn, getattr(torch.ops.dcp_mla, name).default)
        return fn
    return register


def _run(name, *args):
    """Eager: the impl itself. Under torch.compile: the custom op (traced through its fake)."""
    fn, op = _IMPLS[name]
    (op if torch.compiler.is_compiling() else fn)(*args)


@_op(("cache",))
def _kv_fill(ckv: torch.Tensor, kpe: torch.Tensor, req_idx: torch.Tensor, positions: torch.Tensor,
             block_table: torch.Tensor, cache: torch.Tensor, fmt: int, dcp_size: int, interleave: int,
             rank: int) -> None:
    _launch("dcp_mla_launch_kv_fill", _dev_stream(cache), *_t1(ckv), *_t1(kpe), *_t(req_idx), *_t(positions),
            *_t1(block_table), *_cache_t(cache), block_table.shape[0], block_table.shape[1], cache.shape[0],
            cache.shape[1], dcp_size, interleave, rank, fmt, 0)


@_op(("out", "lse", "workspace"))
def _decode_dense(q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, workspace: Optional[torch.Tensor], scale: float,
                  num_splits: int, schedule: int, sink: Optional[torch.Tensor], empty_lse_inf: int, lens_rule: int,
                  dcp_size: int, interleave: int, rank: int) -> None:
    if _NATIVE is not None:
        at = _local.__dict__.get(_DENSE_AT) or _native_dst(_DENSE)
        try:
            status = _NATIVE.decode_dense(at, _DENSE_SIZE, q, cache, block_table, lens, out, lse, workspace, sink, scale,
                                          num_splits, schedule, lens_rule, empty_lse_inf, dcp_size, interleave, rank)
        except (TypeError, OverflowError):
            status = _FALLBACK  # a scalar of another type: _launch names it
        if status != _FALLBACK:
            if status:
                _lib.check(_DENSE, status)
            return
    _launch(_DENSE, _dev_stream(q), *_dense_values(q, cache, block_table, lens, out, lse, workspace, scale, num_splits,
                                                 schedule, sink, empty_lse_inf, lens_rule, dcp_size, interleave, rank))


def _dense_values(q, cache, block_table, lens, out, lse, workspace, scale, num_splits, schedule, sink, empty_lse_inf,
                  lens_rule, dcp_size, interleave, rank):
    """decode_dense's struct after its device and stream, as _launch packs it (the native
    launch's reference: python/tests/test_native_launch.py)."""
    b, nq, h, _ = q.shape
    return (*_tv(q, 3), *_tv(out, 3), *_tv(lse, 3), *_t(workspace), *_cache_t(cache), *_t1(block_table),
            *_tv(lens, 2), *_t(sink), b, nq, h, num_splits, *cache.shape[:2], block_table.shape[1], dcp_size,
            interleave, rank, scale, schedule, lens_rule, empty_lse_inf)


@_op(("out", "lse", "workspace"))
def _decode_sparse(q: torch.Tensor, cache: torch.Tensor, fmt: int, indices: torch.Tensor,
                   topk_len: Optional[torch.Tensor], out: torch.Tensor, lse: torch.Tensor,
                   workspace: Optional[torch.Tensor], scale: float, num_splits: int, schedule: int,
                   sink: Optional[torch.Tensor], empty_lse_inf: int) -> None:
    if _NATIVE is not None:
        at = _local.__dict__.get(_SPARSE_AT) or _native_dst(_SPARSE)
        try:
            status = _NATIVE.decode_sparse(at, _SPARSE_SIZE, q, cache, indices, topk_len, out, lse, workspace, sink,
                                           scale, fmt, num_splits, schedule, empty_lse_inf)
        except (TypeError, OverflowError):
            status = _FALLBACK
        if status != _FALLBACK:
            if status:
                _lib.check(_SPARSE, status)
            return
    _launch(_SPARSE, _dev_stream(q), *_sparse_values(q, cache, fmt, indices, topk_len, out, lse, workspace, scale,
                                                   num_splits, schedule, sink, empty_lse_inf))


def _sparse_values(q, cache, fmt, indices, topk_len, out, lse, workspace, scale, num_splits, schedule, sink,
                   empty_lse_inf):
    """decode_sparse's struct after its device and stream, as _launch packs it."""
    b, nq, h, _ = q.shape
    return (*_tv(q, 3), *_tv(out, 3), *_tv(lse, 3), *_t(workspace), *_cache_t(cache), *_tv(indices, 2),
            *_tv(topk_len, 2), *_t(sink), b, nq, h, num_splits, *cache.shape[:2], indices.shape[-1], scale, schedule,
            fmt, empty_lse_inf)


@_op(("out", "lse", "workspace"))
def _decode_model1(q: torch.Tensor, cache: torch.Tensor, cache_stride: int, indices: torch.Tensor,
                   topk_len: Optional[torch.Tensor], extra_cache: Optional[torch.Tensor], extra_stride: int,
                   extra_indices: Optional[torch.Tensor], extra_topk_len: Optional[torch.Tensor], out: torch.Tensor,
                   lse: torch.Tensor, workspace: Optional[torch.Tensor], scale: float, num_splits: int,
                   schedule: int, sink: Optional[torch.Tensor], empty_lse_inf: int) -> None:
    b, nq, h, _ = q.shape
    if extra_cache is None:
        extra, extra_sizes = _ABSENT, (0, 0, 0)
    else:
        extra = _model1_t(extra_cache, extra_stride)
        extra_sizes = (extra_cache.shape[0], extra_cache.shape[1], extra_indices.shape[-1])
    _launch("dcp_mla_launch_decode_model1", _dev_stream(q), *_tv(q, 3), *_tv(out, 3), *_tv(lse, 3), *_t(workspace),
            *_model1_t(cache, cache_stride), *_tv(indices, 2), *_tv(topk_len, 2), *extra, *_tv(extra_indices, 2),
            *_tv(extra_topk_len, 2), *_t(sink), b, nq, h, num_splits, cache.shape[0], cache.shape[1],
            indices.shape[-1], *extra_sizes, scale, schedule, empty_lse_inf, 0)


@_op(("cache",))
def _kv_fill_model1(ckv: torch.Tensor, kpe: torch.Tensor, req_idx: torch.Tensor, positions: torch.Tensor,
                    block_table: torch.Tensor, cache: torch.Tensor, cache_stride: int, dcp_size: int, interleave: int,
                    rank: int) -> None:
    _launch("dcp_mla_launch_kv_fill_model1", _dev_stream(cache), *_t1(ckv), *_t1(kpe), *_t(req_idx), *_t(positions),
            *_t1(block_table), *_model1_t(cache, cache_stride), block_table.shape[0], block_table.shape[1],
            cache.shape[0], cache.shape[1], dcp_size, interleave, rank)


@_op(("contrib",))
def _ag_rs_correct(out: torch.Tensor, lse_all: torch.Tensor, base: int, contrib: torch.Tensor, dcp_size: int,
                   rank: int) -> None:
    t, h, _ = out.shape
    _launch("dcp_mla_launch_ag_rs_correct", _dev_stream(out), *_t(out), *_t(lse_all), *_t(contrib), t,
            h // dcp_size, dcp_size, rank, base, 0)


@_op(("out", "lse"))
def _ag_rs_finish(summed: torch.Tensor, lse_all: torch.Tensor, base: int, out: torch.Tensor, lse: torch.Tensor,
                  dcp_size: int, rank: int, sink: Optional[torch.Tensor]) -> None:
    hl, t, _ = summed.shape
    _launch("dcp_mla_launch_ag_rs_finish", _dev_stream(summed), *_t(summed), *_t(lse_all), *_t(out), *_t(lse),
            *_t(sink), t, hl, dcp_size, rank, base, 0)


@_op(("send",))
def _a2a_pack(out: torch.Tensor, lse: torch.Tensor, send: torch.Tensor, dcp_size: int) -> None:
    t, h, _ = out.shape
    _launch("dcp_mla_launch_a2a_pack", _dev_stream(out), *_t(out), *_t(lse), *_t(send), send.shape[1], t,
            h // dcp_size, dcp_size)


@_op(("out", "lse"))
def _a2a_combine(recv: torch.Tensor, base: int, out: torch.Tensor, lse: torch.Tensor,
                 sink: Optional[torch.Tensor]) -> None:
    t, hl, _ = out.shape
    _launch("dcp_mla_launch_a2a_combine", _dev_stream(recv), *_t(recv), *_t(out), *_t(lse), *_t(sink),
            recv.shape[1], t, hl, recv.shape[0], base, 0)


@_op(("out", "lse"))
def _merge_two(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor, base_a: int,
               base_b: int, out: torch.Tensor, lse: torch.Tensor, sink: Optional[torch.Tensor]) -> None:
    _launch("dcp_mla_launch_merge_two", _dev_stream(out), *_t(out_a), *_t(lse_a), *_t(out_b), *_t(lse_b), *_t(out),
            *_t(lse), *_t(sink), out.shape[0], base_a, base_b)


@_op(("out",))
def _topk_local(scores: torch.Tensor, cols: int, lens: torch.Tensor, out: torch.Tensor) -> None:
    rows, k = out.shape
    _launch("dcp_mla_launch_topk_local", _dev_stream(scores), *_t1(scores), *_t(lens), *_t(out), cols, rows, k)


@_op(("cand_scores", "cand_ids"))
def _topk_pack(local_idx: torch.Tensor, scores: torch.Tensor, cols: int, dcp_size: int, interleave: int, rank: int,
               cand_scores: torch.Tensor, cand_ids: torch.Tensor) -> None:
    rows, k = local_idx.shape
    _launch("dcp_mla_launch_topk_pack", _dev_stream(scores), *_t(local_idx), *_t1(scores), *_t(cand_scores),
            *_t(cand_ids), cols, rows, k, dcp_size, interleave, rank)


@_op(("out",))
def _topk_merge(cand_scores: torch.Tensor, cand_ids: torch.Tensor, out: torch.Tensor) -> None:
    d, rows, k = cand_scores.shape
    _launch("dcp_mla_launch_topk_merge", _dev_stream(out), *_t(cand_scores), *_t(cand_ids), *_t(out), d, rows, k)


@_op(("out", "counts"))
def _topk_compact(ids: torch.Tensor, dcp_size: int, interleave: int, rank: int, block_table: Optional[torch.Tensor],
                  block_size: int, rows_per_request: int, out: torch.Tensor, counts: torch.Tensor) -> None:
    rows, k = ids.shape
    table = _ABSENT if block_table is None else _t1(block_table)
    _launch("dcp_mla_launch_topk_compact", _dev_stream(ids), *_t(ids), *table, *_t(out), *_t(counts), rows, k,
            dcp_size, interleave, rank, block_size, rows_per_request)


@_op(("out",))
def _prefill_flatten(cache: torch.Tensor, fmt: int, block_table: torch.Tensor, pieces: torch.Tensor,
                     out: torch.Tensor, dcp_size: int, interleave: int, rank: int) -> None:
    _launch("dcp_mla_launch_prefill_flatten", _dev_stream(out), *_cache_t(cache), *_t1(block_table), *_t(pieces),
            *_t(out), cache.shape[0], cache.shape[1], block_table.shape[0], block_table.shape[1], pieces.shape[0],
            out.shape[0], dcp_size, interleave, rank, fmt, 0)


@_op(("out",))
def _prefill_reorder(gathered: torch.Tensor, pieces: torch.Tensor, out: torch.Tensor, dcp_size: int,
                     interleave: int) -> None:
    _launch("dcp_mla_launch_prefill_reorder", _dev_stream(out), *_t(gathered), *_t(pieces), *_t(out),
            gathered.shape[1], pieces.shape[0], out.shape[0], dcp_size, interleave)


# --- the public functions ------------------------------------------------------------------------

def _empty(shape, dtype, like):
    return torch.empty(shape, dtype=dtype, device=like.device)


def kv_fill(ckv, kpe, req_idx, positions, block_table, cache, *, dcp_size, interleave, rank, kv_format=None):
    """Writes each new token's KV into this rank's paged cache if the rank owns it (docs/contract.md
    §2-3). ckv bf16 [T, ≥512] and kpe bf16 [T, ≥64] (unit stride in the last dim), req_idx and
    positions int32 [T], block_table int32 [batch, max_pages] (unit last stride), cache [pages, B,
    576] bf16 or [pages, B, 656] bytes (uint8 / float8_e4m3fn; a FlashMLA [pages, B, 1, row] view
    is accepted; its pages may be a view of a larger page dimension, each page's rows contiguous).
    A token with a negative position, a request index outside the batch or a page
    out of range is skipped. Returns `cache`."""
    _ints(dcp_size=dcp_size, interleave=interleave, rank=rank)
    cache3, fmt = _cache(cache)
    _want_format("cache", fmt, kv_format)
    dev = cache.device
    _check_fill_tokens(ckv, kpe, req_idx, positions, block_table, dev)
    _run("kv_fill", ckv, kpe, req_idx, positions, block_table, cache3, fmt, dcp_size, interleave, rank)
    return cache


def _check_fill_tokens(ckv, kpe, req_idx, positions, block_table, dev):
    """A fill's new tokens (kv_fill, kv_fill_model1): ckv and kpe bf16 [T, ...] with unit last
    strides, req_idx and positions int32 [T], block_table int32 [batch, max_pages], all on dev."""
    t = _check(ckv, "ckv", (torch.bfloat16,), ndim=2, contiguous="rows", device=dev).shape[0]
    _check(kpe, "kpe", (torch.bfloat16,), ndim=2, shape=(t, None), contiguous="rows", device=dev)
    _check(req_idx, "req_idx", (torch.int32,), ndim=1, shape=(t,), device=dev)
    _check(positions, "positions", (torch.int32,), ndim=1, shape=(t,), device=dev)
    _check(block_table, "block_table", (torch.int32,), ndim=2, contiguous="rows", device=dev)


def _decode_outputs(q, out, lse, out_dtype):
    """The caller's out and lse, checked, or new ones (which need no check). Either may be a view:
    out's rows contiguous, lse any strides (the library refuses views whose rows overlap)."""
    b, nq, h, _ = q.shape
    if out is None:
        out = _empty((b, nq, h, 512), out_dtype, q)
    else:
        _check(out, "out", _OUT, ndim=4, shape=(b, nq, h, 512), contiguous="rows", device=q.device)
    if lse is None:
        lse = _empty((b, nq, h), torch.float32, q)
    else:
        _check(lse, "lse", (torch.float32,), ndim=3, shape=(b, nq, h), contiguous=False, device=q.device)
    return out, lse


def _split_plan(q_shape, sparse, num_splits, device, kv_format=None, context=None, causal=False):
    """(num_splits, workspace bytes) of decodes of q shape [b, nq, H, 576] on `device`: the
    caller's count, else the library's choice for the launch (the tuned table's where it has a
    row for the class of `kv_format`, `context` and `causal`), else, with no context, the
    heuristic's."""
    b, nq, h = q_shape[0], q_shape[1], q_shape[2]
    if num_splits is None:
        if context is None:
            num_splits = _splits(b, nq, h, sparse, _index(device))
        else:
            kv = _KV_CODES.get(kv_format if kv_format is not None else "bf16")
            if kv is None:
                _fail("kv_format", f"{kv_format!r}, expected 'bf16' or 'fp8_656'")
            _ints(context=context)
            num_splits = _splits_on(b, nq, h, sparse, kv, context, bool(causal), _index(device))
    return num_splits, _workspace_bytes(b, nq, h, sparse, num_splits)


_KV_CODES = planner.KV_FORMATS
_KV_NAMES = {code: name for name, code in _KV_CODES.items()}


# The workspaces the library owns, one per (device, stream), for decodes that pass none: a
# stream runs its launches one after another, so every such call on it can share one buffer
# (grown when a call needs more; a smaller one freed is reused by torch's allocator only after
# the work queued on its stream). None is kept while a stream is captured into a CUDA graph or
# under torch.compile: those calls allocate their own.
_owned_workspaces = {}


def _owned_workspace(device, need, index=None, stream=None):
    """The library's workspace of at least `need` bytes for `device`'s current stream (`index`
    and `stream`: the device's index and that raw stream where the caller has them), or None
    where a call must allocate its own (graph capture, torch.compile)."""
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return None
    if index is None:
        index = _index(device)
        stream = _raw_stream(index)
    key = (index, stream)
    ws = _owned_workspaces.get(key)
    if ws is None or ws.numel() < need:
        ws = torch.empty((need,), dtype=torch.uint8, device=device)
        _owned_workspaces[key] = ws
    return ws


def _workspace(q, sparse, num_splits, workspace, reuse_schedule, kv_format, context, causal=False):
    """The caller's workspace, checked against what num_splits needs, or the library's own for
    the current stream (which holds no schedule the caller may reuse); and the launch's schedule
    code."""
    num_splits, need = _split_plan(q.shape, sparse, num_splits, q.device, kv_format, context, causal)
    code = _lib.SCHEDULE_REUSE if reuse_schedule else _lib.SCHEDULE_COMPUTE
    if workspace is None:
        if reuse_schedule and need:
            _fail("workspace", "reuse_schedule=True needs the workspace an earlier call scheduled")
        if not need:
            return num_splits, None, code
        ws = _owned_workspace(q.device, need)
        if ws is None:
            ws = torch.empty((need,), dtype=torch.uint8, device=q.device)
        return num_splits, ws, code
    _check(workspace, "workspace", tuple(_CODES), device=q.device)
    if workspace.numel() * workspace.element_size() < need:
        _fail("workspace", f"{workspace.numel() * workspace.element_size()} bytes, {num_splits} splits need {need}")
    return num_splits, workspace, code


def decode_workspace(q_shape, *, sparse, num_splits=None, device=None, kv_format="bf16", context=None,
                     causal=False):
    """(num_splits, workspace or None) for decodes of q shape [b, nq, H, 576]: allocate it once
    and pass both to every decode of that shape (what a captured graph wants). With `context`
    (dense: the most tokens a request may hold, block_table.shape[1] · B; sparse: the top-k),
    `kv_format` ('bf16' or 'fp8_656') and `causal` (dense lens_rule='global_causal'), num_splits
    is what the library runs best for the launch (the card's tuned decode table where it has a
    row, as a launch that leaves the kernel to the library runs its kernel; never more parts
    than the batch has 64-token tiles at `context`, one when a request fits one tile); without,
    the shape-only heuristic's."""
    _ints(num_splits=num_splits)
    device = torch.device(device if device is not None else "cuda")
    num_splits, need = _split_plan(q_shape, sparse, num_splits, device, kv_format, context, causal)
    return num_splits, (torch.empty((need,), dtype=torch.uint8, device=device) if need else None)


_LENS_RULES = {"local": _lib.LENS_LOCAL, "global": _lib.LENS_GLOBAL, "global_causal": _lib.LENS_GLOBAL_CAUSAL}


def decode_dense(q, cache, block_table, lens, *, scale=None, num_splits=None, workspace=None, out=None, lse=None,
                 out_dtype=torch.bfloat16, reuse_schedule=False, sink=None,
                 empty_lse_inf=False, lens_rule="local", dcp_size=1, interleave=1,
                 rank=0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense MLA decode on one rank's shard (docs/contract.md §4): row (i, j) attends to the
    first lens[i, j] local tokens of request i (lens_rule="local"). With lens_rule="global",
    lens holds each request's global length L (its nq new tokens included; int32 [b] or
    [b, nq]) and every row sees n_r(L) tokens of rank `rank` of (dcp_size, interleave); with
    "global_causal" row j sees n_r(max(L − nq + 1 + j, 0)), the causal MTP rule. The kernels
    work the lengths out themselves (no lengths kernel); one GPU is dcp_size=1, rank=0, and a
    "local" rule takes no layout. q bf16 [b, nq, H, 576], a view with any strides that are
    multiples of 8 and a unit last stride; cache bf16 [pages, B, 576] (or [pages, B, 1,
    576]), whose pages may be a view of a larger page dimension (each page's rows contiguous, page
    starts a whole number of rows apart); block_table int32 [b, max_pages] (unit last stride);
    lens int32 [b, nq] (any strides). Views are read in place, never copied, and out (rows
    contiguous) and lse (any strides, FlashMLA's [b, h, s_q] layout included) may be views too.
    Returns out [b, nq, H, 512] (bf16, or f32 with out_dtype) and lse f32 [b, nq, H], natural
    log, −inf for a row that sees no token.
    num_splits defaults to the planner's for this device (decode_workspace gives both for graphs);
    without a workspace the call uses the library's own for the current stream (every such call
    on that stream shares it; one captured into a CUDA graph allocates its own); scale to 576^-1/2. reuse_schedule=True reuses
    the split schedule an earlier call of the same shapes left in `workspace` (the step's first
    layer computes it, the others reuse it: one small kernel less a layer); the result is exact
    whatever the lengths are now, only the balance is the older lengths'. A workspace no call of
    these shapes scheduled makes the kernel trap. sink: optional f32 [H] attention sinks
    (FlashMLA's attn_sink): out scaled by e^lse / (e^lse + e^sink[h]), lse unchanged; leave it
    None on a DCP rank and give it to the combine, which applies it once. empty_lse_inf=True gives
    a row that sees no token lse +inf (FlashMLA's convention) instead of −inf.
    A call whose arguments have the shapes, strides, dtypes, devices and values (data pointers
    aside) of this thread's last checked call, on the same stream, replays that call's launch with
    its own pointers, skipping the Python checks (the library checks every launch)."""
    given = (q, out, lse, workspace, cache, block_table, lens, sink)
    scalars = (scale, num_splits, out_dtype, reuse_schedule, empty_lse_inf, lens_rule, dcp_size, interleave, rank)
    done = _replay("dcp_mla_launch_decode_dense", given, scalars)
    if done is not None:
        return done
    _ints(num_splits=num_splits)
    dev = q.device
    _check(q, "q", (torch.bfloat16,), ndim=4, shape=(None, None, None, 576), contiguous="rows")
    b, nq, h, _ = q.shape
    cache3, fmt = _cache(cache, device=dev)
    if fmt != _lib.KV_BF16 or cache3.dtype != torch.bfloat16:
        _fail("cache", "dense decode reads a bf16 cache [pages, B, 576]; an FP8-656 cache is read by decode_sparse")
    _check(block_table, "block_table", (torch.int32,), ndim=2, shape=(b, None), contiguous="rows", device=dev)
    rule = _LENS_RULES.get(lens_rule)
    if rule is None:
        _fail("lens_rule", f"{lens_rule!r}, expected one of {sorted(_LENS_RULES)}")
    if rule == _lib.LENS_LOCAL and (dcp_size, interleave, rank) != (1, 1, 0):
        # local lengths are already this rank's: a layout given with them would go unused
        _fail("lens_rule", f"'local' lengths take no DCP layout (dcp_size={dcp_size}, interleave={interleave}, "
                           f"rank={rank}); use 'global' or 'global_causal' with request lengths")
    if rule != _lib.LENS_LOCAL:
        _ints(dcp_size=dcp_size, interleave=interleave, rank=rank)
    if rule != _lib.LENS_LOCAL and isinstance(lens, torch.Tensor) and lens.dim() == 1:
        _check(lens, "lens", (torch.int32,), ndim=1, shape=(b,), contiguous=False, device=dev)
        lens = lens.unsqueeze(1).expand(b, nq)  # one global length a request, read by every row
    _check(lens, "lens", (torch.int32,), ndim=2, shape=(b, nq), contiguous=False, device=dev)
    _sink(sink, h, dev)
    out, lse = _decode_outputs(q, out, lse, out_dtype)
    # (at least 1: an empty table or top-k is the launcher's to judge, with its own message)
    num_splits, workspace, schedule = _workspace(q, False, num_splits, workspace, reuse_schedule, "bf16",
                                                 max(block_table.shape[1] * cache3.shape[1], 1),
                                                 rule == _lib.LENS_GLOBAL_CAUSAL)
    _run("decode_dense", q, cache3, block_table, lens, out, lse, workspace,
         _default_scale() if scale is None else float(scale), num_splits, schedule, sink, int(bool(empty_lse_inf)),
         rule, dcp_size, interleave, rank)
    _remember("dcp_mla_launch_decode_dense", given, scalars, q, out_dtype, workspace)
    return out, lse


def decode_sparse(q, cache, indices, *, topk_len=None, kv_format=None, scale=None, num_splits=None, workspace=None,
                  out=None, lse=None, out_dtype=torch.bfloat16, reuse_schedule=False,
                  sink=None, empty_lse_inf=False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode (docs/contract.md §4) over a bf16 or FP8-656 cache: row (i, j) attends to
    the cache rows page·B + slot listed in indices[i, j] (−1 or out of range: unused; only the
    first topk_len[i, j] count when topk_len int32 [b, nq] is given). q bf16 [b, nq, H, 576] and
    the cache as for decode_dense (views read in place); indices int32 [b, nq, topk], any strides
    with a unit last stride. Returns (out, lse) as decode_dense; reuse_schedule, sink and
    empty_lse_inf as there, and so is the replay of this thread's last checked call."""
    given = (q, out, lse, workspace, cache, indices, topk_len, sink)
    scalars = (kv_format, scale, num_splits, out_dtype, reuse_schedule, empty_lse_inf)
    done = _replay(_SPARSE, given, scalars)
    if done is not None:
        return done
    _ints(num_splits=num_splits)
    dev = q.device
    _check(q, "q", (torch.bfloat16,), ndim=4, shape=(None, None, None, 576), contiguous="rows")
    b, nq, h, _ = q.shape
    cache3, fmt = _cache(cache, device=dev)
    _want_format("cache", fmt, kv_format)
    _check(indices, "indices", (torch.int32,), ndim=3, shape=(b, nq, None), contiguous="rows", device=dev)
    if topk_len is not None:
        _check(topk_len, "topk_len", (torch.int32,), ndim=2, shape=(b, nq), contiguous=False, device=dev)
    _sink(sink, h, dev)
    out, lse = _decode_outputs(q, out, lse, out_dtype)
    num_splits, workspace, schedule = _workspace(q, True, num_splits, workspace, reuse_schedule, _KV_NAMES[fmt],
                                                 max(indices.shape[2], 1))
    _run("decode_sparse", q, cache3, fmt, indices, topk_len, out, lse, workspace,
         _default_scale() if scale is None else float(scale), num_splits, schedule, sink, int(bool(empty_lse_inf)))
    _remember(_SPARSE, given, scalars, q, out_dtype, workspace)
    return out, lse


def _lengths(x, name, b, nq, device):
    """Optional per-row counts int32 [b, nq] (any strides), or [b] per request (read by every row
    of the request: a [b, nq] view with strides (1, 0), no copy)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor) and x.dim() == 1:
        _check(x, name, (torch.int32,), ndim=1, shape=(b,), contiguous=False, device=device)
        return x.unsqueeze(1).expand(b, nq)
    return _check(x, name, (torch.int32,), ndim=2, shape=(b, nq), contiguous=False, device=device)


def decode_model1(q, cache, indices, *, topk_len=None, extra_cache=None, extra_indices=None, extra_topk_len=None,
                  scale=None, num_splits=None, workspace=None, out=None, lse=None, out_dtype=torch.bfloat16,
                  reuse_schedule=False, sink=None, empty_lse_inf=False) -> Tuple[torch.Tensor, torch.Tensor]:
    """MODEL1 sparse decode (docs/contract.md §4, "MODEL1"; FlashMLA's d_qk = 512 path): row
    (i, j) attends to the cache rows page·B + slot listed in indices[i, j] (−1 or out of range:
    unused), then to those of extra_indices[i, j] in extra_cache when given, all in one softmax
    over 512-value rows (448 dequantised, 64 rope; V is the whole row).

    q bf16 [b, nq, H, 512] (a view with strides that are multiples of 8 and a unit last stride);
    cache a MODEL1 cache as FlashMLA lays it out, [num_blocks, B, 1, 584] (or [num_blocks, B,
    584]) of uint8 / int8 / float8_e4m3fn bytes, pages a multiple of 576 bytes apart (FlashMLA's
    padded pages; a view of a larger page dimension is read in place); indices int32 [b, nq,
    topk] (any strides, unit last stride); topk_len optional int32 [b, nq] or [b] (FlashMLA's
    per-request topk_length): only the first topk_len entries of a list count. extra_cache,
    extra_indices [b, nq, extra_topk] and extra_topk_len: the second source, its own block size
    and page stride. scale defaults to 512^-1/2 (FlashMLA's d_qk^-1/2; decode_sparse's 576
    path has 576^-1/2). Returns out [b, nq, H, 512] and lse f32 [b, nq, H] as decode_sparse
    (num_splits, workspace, reuse_schedule, sink, empty_lse_inf as there)."""
    _ints(num_splits=num_splits)
    dev = q.device
    _check(q, "q", (torch.bfloat16,), ndim=4, shape=(None, None, None, 512), contiguous="rows")
    b, nq, h, _ = q.shape
    cache3, stride = _model1_cache(cache, "cache", dev)
    _check(indices, "indices", (torch.int32,), ndim=3, shape=(b, nq, None), contiguous="rows", device=dev)
    topk_len = _lengths(topk_len, "topk_len", b, nq, dev)
    extra3, extra_stride = None, 0
    if extra_cache is None:
        for name, value in [("extra_indices", extra_indices), ("extra_topk_len", extra_topk_len)]:
            if value is not None:
                _fail(name, "given without extra_cache")
    else:
        if extra_indices is None:
            _fail("extra_indices", "required with extra_cache")
        extra3, extra_stride = _model1_cache(extra_cache, "extra_cache", dev)
        _check(extra_indices, "extra_indices", (torch.int32,), ndim=3, shape=(b, nq, None), contiguous="rows",
               device=dev)
        extra_topk_len = _lengths(extra_topk_len, "extra_topk_len", b, nq, dev)
    _sink(sink, h, dev)
    out, lse = _decode_outputs(q, out, lse, out_dtype)
    num_splits, workspace, schedule = _workspace(q, True, num_splits, workspace, reuse_schedule, None, None)
    # scale 0: the C ABI's default for this path, 512^-1/2
    _run("decode_model1", q, cache3, stride, indices, topk_len, extra3, extra_stride, extra_indices, extra_topk_len,
         out, lse, workspace, 0.0 if scale is None else float(scale), num_splits, schedule, sink,
         int(bool(empty_lse_inf)))
    return out, lse


def kv_fill_model1(ckv, kpe, req_idx, positions, block_table, cache, *, dcp_size, interleave, rank):
    """Writes each new token into this rank's MODEL1 cache if the rank owns it (docs/contract.md
    §2-3, "MODEL1"): the 448 values of ckv bf16 [T, ≥448] quantised to e4m3 in tiles of 64 with
    one power-of-two scale a tile, and the 64 rope values of kpe bf16 [T, ≥64] kept in bf16
    (unit stride in the last dim: a [T, 512] row split as row[:, :448], row[:, 448:] is read in
    place), bit for bit as the CPU reference. req_idx and positions int32 [T], block_table int32
    [batch, max_pages] (unit last stride), cache as decode_model1 takes it. A token with a
    negative position, a request index outside the batch or a page out of range is skipped;
    nothing else of the cache is written, page padding included. Returns `cache`."""
    _ints(dcp_size=dcp_size, interleave=interleave, rank=rank)
    cache3, stride = _model1_cache(cache)
    dev = cache.device
    _check_fill_tokens(ckv, kpe, req_idx, positions, block_table, dev)
    _run("kv_fill_model1", ckv, kpe, req_idx, positions, block_table, cache3, stride, dcp_size, interleave, rank)
    return cache


def ag_rs_correct(out, lse_all, *, dcp_size, rank, lse_base="e", contrib=None,
                  contrib_dtype=torch.float32) -> torch.Tensor:
    """ag_rs combine, step 1 (docs/contract.md §5.1): contrib[h, t] = (w_rank / S) · out[t, h]
    computed in f32, head-major for the reduce-scatter. out bf16/f32 [T, H, 512] (H = D·H_l);
    lse_all f32 [D, T, H], every rank's lse in base `lse_base`. Returns contrib [H, T, 512] in
    contrib_dtype (f32 by default; bf16 rounds to nearest even)."""
    _ints(dcp_size=dcp_size, rank=rank)
    _check(out, "out", _OUT, ndim=3, shape=(None, None, 512))
    t, h, _ = out.shape
    if h % dcp_size:
        _fail("out", f"{h} heads are not a multiple of dcp_size {dcp_size}")
    _check(lse_all, "lse_all", (torch.float32,), ndim=3, shape=(dcp_size, t, h), device=out.device)
    if contrib is None:
        contrib = _empty((h, t, 512), contrib_dtype, out)
    _check(contrib, "contrib", _OUT, ndim=3, shape=(h, t, 512), device=out.device)
    _run("ag_rs_correct", out, lse_all, _base("lse_base", lse_base), contrib, dcp_size, rank)
    return contrib


def ag_rs_finish(summed, lse_all, *, dcp_size, rank, lse_base="e", out=None, lse=None, out_dtype=torch.bfloat16,
                 sink=None):
    """ag_rs combine, step 2: this rank's reduce-scattered heads summed f32/bf16 [H_l, T, 512] cast to
    out [T, H_l, 512] with their merged lse f32 [T, H_l] (natural log; −inf with out = 0 where
    every shard is empty). lse_all is step 1's [D, T, D·H_l]. sink: optional f32 [H_l], the
    attention sinks of this rank's heads, applied once to the merged rows (lse unchanged).
    Returns (out, lse)."""
    _ints(dcp_size=dcp_size, rank=rank)
    _check(summed, "summed", _OUT, ndim=3, shape=(None, None, 512))
    hl, t, _ = summed.shape
    _check(lse_all, "lse_all", (torch.float32,), ndim=3, shape=(dcp_size, t, dcp_size * hl), device=summed.device)
    out = _empty((t, hl, 512), out_dtype, summed) if out is None else out
    lse = _empty((t, hl), torch.float32, summed) if lse is None else lse
    _check(out, "out", _OUT, ndim=3, shape=(t, hl, 512), device=summed.device)
    _check(lse, "lse", (torch.float32,), ndim=2, shape=(t, hl), device=summed.device)
    _sink(sink, hl, summed.device)
    _run("ag_rs_finish", summed, lse_all, _base("lse_base", lse_base), out, lse, dcp_size, rank, sink)
    return out, lse


def a2a_pack(out, lse, *, dcp_size, send=None) -> torch.Tensor:
    """a2a combine, send side (docs/contract.md §5.2): out bf16/f32 [T, D·H_l, 512] (as bf16) and
    lse f32 [T, D·H_l] packed into one slot per destination rank. Returns send uint8 [D, slot]
    (slot = planner.a2a_slot_bytes(T, H_l)), which one all-to-all delivers."""
    _ints(dcp_size=dcp_size)
    _check(out, "out", _OUT, ndim=3, shape=(None, None, 512))
    t, h, _ = out.shape
    if h % dcp_size:
        _fail("out", f"{h} heads are not a multiple of dcp_size {dcp_size}")
    _check(lse, "lse", (torch.float32,), ndim=2, shape=(t, h), device=out.device)
    slot = _slot_bytes(t, h // dcp_size)
    send = _empty((dcp_size, slot), torch.uint8, out) if send is None else send
    _check(send, "send", _BYTES, ndim=2, shape=(dcp_size, slot), device=out.device)
    _run("a2a_pack", out, lse, send, dcp_size)
    return send


def a2a_combine(recv, *, num_tokens, local_heads, lse_base="e", out=None, lse=None, out_dtype=torch.bfloat16,
                sink=None):
    """a2a combine, receive side: the merge of the D received slots recv uint8 [D, slot] (slot r
    as rank r packed it for this rank) in f32, rank order. Returns out [T, H_l, 512] and lse f32
    [T, H_l] (natural log). sink: as for ag_rs_finish."""
    _ints(num_tokens=num_tokens, local_heads=local_heads)
    _check(recv, "recv", _BYTES, ndim=2)
    slot = _slot_bytes(num_tokens, local_heads)
    _check(recv, "recv", _BYTES, ndim=2, shape=(None, slot))
    out = _empty((num_tokens, local_heads, 512), out_dtype, recv) if out is None else out
    lse = _empty((num_tokens, local_heads), torch.float32, recv) if lse is None else lse
    _check(out, "out", _OUT, ndim=3, shape=(num_tokens, local_heads, 512), device=recv.device)
    _check(lse, "lse", (torch.float32,), ndim=2, shape=(num_tokens, local_heads), device=recv.device)
    _sink(sink, local_heads, recv.device)
    _run("a2a_combine", recv, _base("lse_base", lse_base), out, lse, sink)
    return out, lse


def merge_two(out_a, lse_a, out_b, lse_b, *, lse_a_base="e", lse_b_base="e", out=None, lse=None,
              out_dtype=None, sink=None):
    """The two-way merge of chunked prefill (docs/contract.md §5.3): out_a, out_b [rows, 512], both
    bf16 or both f32, lse_a, lse_b f32 [rows], each in its own base. Returns out [rows, 512] (in
    out_dtype, by default the inputs' dtype; may be out_a itself, in place, when of their dtype)
    and lse f32 [rows] (natural log). sink: optional f32 [H] attention sinks of rows laid out
    [T, H] (H dividing rows), applied to the merged rows: pass it on the last merge of a chain."""
    _check(out_a, "out_a", _OUT, ndim=2, shape=(None, 512))
    rows = out_a.shape[0]
    dev = out_a.device
    _check(out_b, "out_b", (out_a.dtype,), ndim=2, shape=(rows, 512), device=dev)
    out_dtype = out_a.dtype if out_dtype is None else out_dtype
    _check(lse_a, "lse_a", (torch.float32,), ndim=1, shape=(rows,), device=dev)
    _check(lse_b, "lse_b", (torch.float32,), ndim=1, shape=(rows,), device=dev)
    out = _empty((rows, 512), out_dtype, out_a) if out is None else out
    lse = _empty((rows,), torch.float32, out_a) if lse is None else lse
    _check(out, "out", _OUT, ndim=2, shape=(rows, 512), device=dev)
    _check(lse, "lse", (torch.float32,), ndim=1, shape=(rows,), device=dev)
    if sink is not None:
        _check(sink, "sink", (torch.float32,), ndim=1, device=dev)
        if sink.shape[0] == 0 or rows % sink.shape[0]:
            _fail("sink", f"{sink.shape[0]} heads do not divide the {rows} rows")
    _run("merge_two", out_a, lse_a, out_b, lse_b, _base("lse_a_base", lse_a_base), _base("lse_b_base", lse_b_base),
         out, lse, sink)
    return out, lse


def topk_local(scores, lens, k, *, cols=None, out=None) -> torch.Tensor:
    """Local top-k (docs/contract.md §6): per row the k best of the first lens[row] scores by
    (score descending, index ascending; NaN as −inf), as ascending indices, −1 padded. scores
    f32 [rows, ≥cols] (unit last stride), lens int32 [rows], k in {256, 512, 1024, 2048}.
    Returns int32 [rows, k]."""
    _ints(k=k, cols=cols)
    _check(scores, "scores", (torch.float32,), ndim=2, contiguous="rows")
    rows = scores.shape[0]
    _check(lens, "lens", (torch.int32,), ndim=1, shape=(rows,), device=scores.device)
    out = _empty((rows, k), torch.int32, scores) if out is None else out
    _check(out, "out", (torch.int32,), ndim=2, shape=(rows, k), device=scores.device)
    _run("topk_local", scores, scores.shape[1] if cols is None else cols, lens, out)
    return out


def topk_pack(local_idx, scores, *, dcp_size, interleave, rank, cols=None, cand_scores=None, cand_ids=None):
    """Packs this rank's local top-k into candidates (scores bit for bit, global ids; (−inf, −1)
    for unused). local_idx int32 [rows, k]; scores f32 [rows, ≥cols]. Returns (cand_scores f32,
    cand_ids int32), [rows, k] each: pass this rank's slot of the [D, rows, k] all-gather buffers
    to write them in place."""
    _ints(dcp_size=dcp_size, interleave=interleave, rank=rank, cols=cols)
    _check(local_idx, "local_idx", (torch.int32,), ndim=2)
    rows, k = local_idx.shape
    dev = local_idx.device
    _check(scores, "scores", (torch.float32,), ndim=2, shape=(rows, None), contiguous="rows", device=dev)
    cand_scores = _empty((rows, k), torch.float32, scores) if cand_scores is None else cand_scores
    cand_ids = _empty((rows, k), torch.int32, scores) if cand_ids is None else cand_ids
    _check(cand_scores, "cand_scores", (torch.float32,), ndim=2, shape=(rows, k), device=dev)
    _check(cand_ids, "cand_ids", (torch.int32,), ndim=2, shape=(rows, k), device=dev)
    _run("topk_pack", local_idx, scores, scores.shape[1] if cols is None else cols, dcp_size, interleave, rank,
         cand_scores, cand_ids)
    return cand_scores, cand_ids


def topk_merge(cand_scores, cand_ids, *, out=None) -> torch.Tensor:
    """Global merge (docs/contract.md §6): the exact top-k of the D·k all-gathered candidates
    cand_scores f32 / cand_ids int32 [D, rows, k] per row, in candidate order, −1 padded (D·k must
    be a multiple of 512). Returns int32 [rows, k] of global ids."""
    _check(cand_scores, "cand_scores", (torch.float32,), ndim=3)
    d, rows, k = cand_scores.shape
    _check(cand_ids, "cand_ids", (torch.int32,), ndim=3, shape=(d, rows, k), device=cand_scores.device)
    out = _empty((rows, k), torch.int32, cand_scores) if out is None else out
    _check(out, "out", (torch.int32,), ndim=2, shape=(rows, k), device=cand_scores.device)
    _run("topk_merge", cand_scores, cand_ids, out)
    return out


def topk_compact(ids, *, dcp_size, interleave, rank, block_table=None, block_size=1, rows_per_request=1, out=None,
                 counts=None):
    """Keeps the merged global ids int32 [rows, k] that this rank owns, as local positions (or
    page·B + slot through block_table int32 [ceil(rows / rows_per_request), max_pages]),
    compacted to the front and −1 padded. Returns (out int32 [rows, k], counts int32 [rows])."""
    _ints(dcp_size=dcp_size, interleave=interleave, rank=rank, block_size=block_size,
          rows_per_request=rows_per_request)
    _check(ids, "ids", (torch.int32,), ndim=2)
    rows, k = ids.shape
    if block_table is not None:
        _check(block_table, "block_table", (torch.int32,), ndim=2, contiguous="rows", device=ids.device)
    out = _empty((rows, k), torch.int32, ids) if out is None else out
    counts = _empty((rows,), torch.int32, ids) if counts is None else counts
    _check(out, "out", (torch.int32,), ndim=2, shape=(rows, k), device=ids.device)
    _check(counts, "counts", (torch.int32,), ndim=1, shape=(rows,), device=ids.device)
    _run("topk_compact", ids, dcp_size, interleave, rank, block_table, block_size, rows_per_request, out, counts)
    return out, counts


def prefill_flatten(cache, block_table, pieces, out, *, dcp_size, interleave, rank, kv_format=None):
    """Prefill prefix flatten (docs/contract.md §7): this rank's rows of one chunk into out bf16
    [cap_rows, 576] (FP8-656 dequantised; every row written), the chunk read from pieces int32
    [max_pieces, 8] on the device (planner.prefill_piece_table). The cache as kv_fill takes it
    (its pages may be a view). Returns out."""
    _ints(dcp_size=dcp_size, interleave=interleave, rank=rank)
    cache3, fmt = _cache(cache)
    _want_format("cache", fmt, kv_format)
    dev = cache.device
    _check(block_table, "block_table", (torch.int32,), ndim=2, contiguous="rows", device=dev)
    _check(pieces, "pieces", (torch.int32,), ndim=2, shape=(None, 8), device=dev)
    _check(out, "out", (torch.bfloat16,), ndim=2, shape=(None, 576), device=dev)
    _run("prefill_flatten", cache3, fmt, block_table, pieces, out, dcp_size, interleave, rank)
    return out


def prefill_reorder(gathered, pieces, out, *, dcp_size, interleave):
    """Prefill reorder: every token of every piece from the all-gathered flatten buffers gathered
    bf16 [D, cap_rows, 576] to its global row of out bf16 [out_rows, 576] (rows of other chunks
    untouched). Returns out."""
    _ints(dcp_size=dcp_size, interleave=interleave)
    _check(gathered, "gathered", (torch.bfloat16,), ndim=3, shape=(dcp_size, None, 576))
    _check(pieces, "pieces", (torch.int32,), ndim=2, shape=(None, 8), device=gathered.device)
    _check(out, "out", (torch.bfloat16,), ndim=2, shape=(None, 576), device=gathered.device)
    _run("prefill_reorder", gathered, pieces, out, dcp_size, interleave)
    return out


def local_lens(cache_seqlens, *, dcp_size, interleave, rank, num_q=1, causal=True) -> torch.Tensor:
    """Per-row local lengths on the device, for decode_dense's `lens`: int32 [b, num_q] where row j
    of request i sees n_r(L_i − num_q + 1 + j) tokens with causal (L_i = cache_seqlens[i], its
    num_q new tokens included), n_r(L_i) without; n_r(L) counts the t < L with (t // I) % D == r
    (docs/contract.md §2; planner.local_len is the same on the host). A few small torch kernels,
    capturable in a graph."""
    _ints(dcp_size=dcp_size, interleave=interleave, rank=rank, num_q=num_q)
    _check(cache_seqlens, "cache_seqlens", (torch.int32, torch.int64), ndim=1)
    lens = cache_seqlens.to(torch.int64).view(-1, 1)
    if causal and num_q > 1:
        lens = lens - torch.arange(num_q - 1, -1, -1, dtype=torch.int64, device=lens.device)
    lens = lens.clamp(min=0).expand(-1, num_q)
    cycle = dcp_size * interleave
    n = (lens // cycle) * interleave + (lens % cycle - rank * interleave).clamp(0, interleave)
    return n.to(torch.int32).contiguous()
