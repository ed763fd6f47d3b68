"""The C ABI (ffi/include/dcp_mla.h) as ctypes functions: loading, signatures, status checks.

The extension module `dcp_mla._native` is the C ABI's shared library with a Python entry point;
ctypes opens the same file, so nothing else has to be found at run time. `DCP_MLA_LIB` may name
another build of the library (libdcp_mla_ffi.so), e.g. to test one without reinstalling.
Nothing here imports torch.
"""

import ctypes
import os
import struct
import threading
from ctypes import POINTER, c_char_p, c_float, c_int32, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

# Codes of the header's #defines.
DTYPE_U8, DTYPE_BF16, DTYPE_F32, DTYPE_I32 = 1, 2, 3, 4
KV_BF16, KV_FP8_656 = 1, 2
LSE_BASE_E, LSE_BASE_2 = 1, 2
SCHEDULE_COMPUTE, SCHEDULE_REUSE = 0, 1
LENS_LOCAL, LENS_GLOBAL, LENS_GLOBAL_CAUSAL = 0, 1, 2
#: DcpMlaStatus values, by code.
STATUS = [
    "SUCCESS", "INVALID_ARGUMENT", "NULL_POINTER", "MISALIGNED", "BAD_DTYPE",
    "INVALID_CONFIG", "UNSUPPORTED", "NO_DEVICE", "CUDA_ERROR", "INTERNAL",
]
STATUS_NO_DEVICE = STATUS.index("NO_DEVICE")
#: The header revision this package was written against (DCP_MLA_ABI_VERSION).
ABI_VERSION = 5


class DcpMlaError(RuntimeError):
    """A C ABI call failed: `status` is the DcpMlaStatus name, `message` the library's reason
    (which names the argument). A refused argument or configuration raises the subclass
    DcpMlaValueError, which is a ValueError too."""

    def __init__(self, function, status, message):
        self.code = status
        self.status = STATUS[status] if 0 <= status < len(STATUS) else str(status)
        self.message = message
        super().__init__(f"{function}: DCP_MLA_STATUS_{self.status}: {message}")

    @staticmethod
    def of(function, status, message):
        """The error of a failed call: DcpMlaValueError for the statuses in VALUE_STATUSES,
        DcpMlaError for the others."""
        cls = DcpMlaValueError if status in VALUE_STATUSES else DcpMlaError
        return cls(function, status, message)


class DcpMlaValueError(DcpMlaError, ValueError):
    """The library refused an argument or a configuration (DCP_MLA_STATUS_INVALID_ARGUMENT or
    INVALID_CONFIG: e.g. plan(dcp_size=3), batch=0, num_q=9): catchable as ValueError, as a bad
    Python value is, and as DcpMlaError (a RuntimeError), as before."""


#: The status codes raised as DcpMlaValueError: a value the caller passed was refused.
VALUE_STATUSES = (STATUS.index("INVALID_ARGUMENT"), STATUS.index("INVALID_CONFIG"))


class Tensor(ctypes.Structure):
    """DcpMlaTensor: a device pointer, its element count, a DTYPE_* code and its strides
    (num_strides 0: the field's default layout)."""
    _fields_ = [("data", c_void_p), ("numel", c_size_t), ("dtype", c_int32), ("num_strides", c_uint32),
                ("strides", c_size_t * 4)]


def _args_struct(name, tensors, sizes, codes=()):
    """An operation's argument struct, laid out as the header's (ffi/src/ops.rs): struct_size,
    device, stream, then its tensors, its size_t values and its 4-byte codes. python/tests and
    ffi/tests/layout.rs check every field's name, type, offset and size against the header and
    the Rust struct."""
    fields = [("struct_size", c_size_t), ("device", c_void_p), ("stream", c_void_p)]
    fields += [(t, Tensor) for t in tensors.split()] + [(z, c_size_t) for z in sizes.split()] + list(codes)
    return type(name, (ctypes.Structure,), {"_fields_": fields})


_PAD = ("_reserved", c_uint32)
#: The argument struct of each operation's entry point (C ABI revision 5), by function name.
ARGS = {
    "dcp_mla_launch_kv_fill": _args_struct(
        "DcpMlaKvFillArgs", "ckv kpe req_idx positions block_table cache",
        "batch max_pages num_pages block_size dcp_size interleave rank", [("format", c_int32), _PAD]),
    "dcp_mla_launch_decode_dense": _args_struct(
        "DcpMlaDecodeDenseArgs", "q out lse workspace cache block_table lens sink",
        "batch num_q heads num_splits num_pages block_size max_pages dcp_size interleave rank",
        [("scale", c_float), ("schedule", c_int32), ("lens_rule", c_int32), ("empty_lse_inf", c_int32)]),
    "dcp_mla_launch_decode_sparse": _args_struct(
        "DcpMlaDecodeSparseArgs", "q out lse workspace cache indices topk_len sink",
        "batch num_q heads num_splits num_pages block_size topk",
        [("scale", c_float), ("schedule", c_int32), ("format", c_int32), ("empty_lse_inf", c_int32)]),
    "dcp_mla_launch_decode_model1": _args_struct(
        "DcpMlaDecodeModel1Args",
        "q out lse workspace cache indices topk_len extra_cache extra_indices extra_topk_len sink",
        "batch num_q heads num_splits num_pages block_size topk extra_num_pages extra_block_size extra_topk",
        [("scale", c_float), ("schedule", c_int32), ("empty_lse_inf", c_int32), _PAD]),
    "dcp_mla_launch_kv_fill_model1": _args_struct(
        "DcpMlaKvFillModel1Args", "ckv kpe req_idx positions block_table cache",
        "batch max_pages num_pages block_size dcp_size interleave rank"),
    "dcp_mla_launch_ag_rs_correct": _args_struct(
        "DcpMlaAgRsCorrectArgs", "out lse_all contrib", "num_tokens local_heads dcp_size rank",
        [("lse_base", c_int32), _PAD]),
    "dcp_mla_launch_ag_rs_finish": _args_struct(
        "DcpMlaAgRsFinishArgs", "summed lse_all out lse sink", "num_tokens local_heads dcp_size rank",
        [("lse_base", c_int32), _PAD]),
    "dcp_mla_launch_a2a_pack": _args_struct(
        "DcpMlaA2aPackArgs", "out lse send", "slot_bytes num_tokens local_heads dcp_size"),
    "dcp_mla_launch_a2a_combine": _args_struct(
        "DcpMlaA2aCombineArgs", "recv out lse sink", "slot_bytes num_tokens local_heads dcp_size",
        [("lse_base", c_int32), _PAD]),
    "dcp_mla_launch_merge_two": _args_struct(
        "DcpMlaMergeTwoArgs", "out_a lse_a out_b lse_b out lse sink", "rows",
        [("lse_a_base", c_int32), ("lse_b_base", c_int32)]),
    "dcp_mla_launch_topk_local": _args_struct("DcpMlaTopkLocalArgs", "scores lens out", "cols rows k"),
    "dcp_mla_launch_topk_pack": _args_struct(
        "DcpMlaTopkPackArgs", "local_idx scores cand_scores cand_ids", "cols rows k dcp_size interleave rank"),
    "dcp_mla_launch_topk_merge": _args_struct("DcpMlaTopkMergeArgs", "cand_scores cand_ids out", "dcp_size rows k"),
    "dcp_mla_launch_topk_compact": _args_struct(
        "DcpMlaTopkCompactArgs", "ids block_table out counts",
        "rows k dcp_size interleave rank block_size rows_per_request"),
    "dcp_mla_launch_prefill_flatten": _args_struct(
        "DcpMlaPrefillFlattenArgs", "cache block_table pieces out",
        "num_pages block_size batch max_pages max_pieces cap_rows dcp_size interleave rank",
        [("format", c_int32), _PAD]),
    "dcp_mla_launch_prefill_reorder": _args_struct(
        "DcpMlaPrefillReorderArgs", "gathered pieces out", "cap_rows max_pieces out_rows dcp_size interleave"),
}


_CODES = {c_void_p: "Q", c_size_t: "Q", c_uint64: "Q", c_int32: "i", c_uint32: "I", c_float: "f"}


def leaves(cls, prefix="", base=0):
    """Every scalar of a struct in memory order: (field path, offset, ctypes type), a nested
    struct's fields as `q.data`, an array's elements as `q.strides[0]`."""
    out = []
    for name, t in cls._fields_:
        off = base + getattr(cls, name).offset
        if isinstance(t, type) and issubclass(t, ctypes.Structure):
            out += leaves(t, f"{prefix}{name}.", off)
        elif isinstance(t, type) and issubclass(t, ctypes.Array):
            size = ctypes.sizeof(t._type_)
            out += [(f"{prefix}{name}[{i}]", off + i * size, t._type_) for i in range(t._length_)]
        else:
            out.append((prefix + name, off, t))
    return out


def packer(cls):
    """A struct.Struct that writes all of `cls`'s scalars, in order, into an instance of it (its
    explicit byte offsets taken from ctypes, so its layout is the struct's by construction)."""
    assert ctypes.sizeof(c_size_t) == ctypes.sizeof(c_void_p) == 8, "a 64-bit platform"
    fmt, pos = "=", 0
    for _, off, t in leaves(cls):
        fmt += "x" * (off - pos) + _CODES[t]
        pos = off + ctypes.sizeof(t)
    fmt += "x" * (ctypes.sizeof(cls) - pos)
    packed = struct.Struct(fmt)
    assert packed.size == ctypes.sizeof(cls), cls.__name__
    return packed


def fill_checked(cls, buf, values):
    """The slow path of a fill that struct.pack_into refused: each value checked against its
    field's type, the first bad one raising a TypeError or ValueError that names the field
    (`DcpMlaDecodeDenseArgs.batch`), as `integer` does."""
    for (path, off, t), v in zip(leaves(cls), values):
        name = f"{cls.__name__}.{path}"
        if t is c_float:
            try:
                float(v)
            except (TypeError, ValueError):
                raise TypeError(f"{name}: expected a float, got {type(v).__name__} {v!r}") from None
        else:
            lo, hi = _INT_RANGES.get(t, (0, (1 << 64) - 1))
            integer(name, 0 if v is None and t is c_void_p else v, lo, hi)
    packer(cls).pack_into(buf, 0, *values)


_D, _Z, _I, _U64 = c_void_p, c_size_t, c_int32, c_uint64

#: Argument types of every status-returning function (the operations last).
SIGNATURES = {
    "dcp_mla_compute_capability_supported": [_I, _I, POINTER(c_int32)],
    "dcp_mla_device_open": [_I, POINTER(c_void_p)],
    "dcp_mla_device_close": [_D],
    "dcp_mla_device_info": [_D, POINTER(c_int32), POINTER(c_int32), POINTER(c_int32)],
    "dcp_mla_malloc": [_D, _Z, POINTER(c_void_p)],
    "dcp_mla_free": [_D, c_void_p],
    "dcp_mla_memcpy_htod": [_D, c_void_p, c_void_p, _Z],
    "dcp_mla_memcpy_dtoh": [_D, c_void_p, c_void_p, _Z],
    "dcp_mla_memset": [_D, c_void_p, c_uint8, _Z],
    "dcp_mla_synchronize": [_D],
    "dcp_mla_check_config": [_Z, _Z, _Z, _Z],
    "dcp_mla_check_topk": [_Z, _Z],
    "dcp_mla_check_decode": [_Z, _Z, _Z, _Z, _U64],
    "dcp_mla_local_len": [_Z, _Z, _Z, _U64, POINTER(c_uint64)],
    "dcp_mla_token_address": [_Z, _Z, _Z, _U64, POINTER(c_size_t), POINTER(c_uint64), POINTER(c_uint64)],
    "dcp_mla_causal_local_lens": [POINTER(c_uint64), POINTER(c_uint32), _Z, _Z, _Z, _Z, POINTER(c_int32), _Z],
    "dcp_mla_pages_for": [_Z, _Z, _U64, POINTER(c_uint64)],
    "dcp_mla_capacity": [_U64, _I, _Z, _Z, POINTER(c_uint64), POINTER(c_uint64)],
    "dcp_mla_decode_num_splits": [_Z, _Z, _Z, _I, _Z, POINTER(c_size_t)],
    "dcp_mla_decode_num_splits_on": [_D, _I, _I, _Z, _Z, _Z, _Z, _I, POINTER(c_size_t)],
    "dcp_mla_decode_workspace_bytes": [_Z, _Z, _Z, _I, _Z, POINTER(c_size_t)],
    "dcp_mla_a2a_slot_bytes": [_Z, _Z, POINTER(c_size_t)],
    "dcp_mla_ag_rs_workspace_bytes": [_Z, _Z, _Z, POINTER(c_uint64)],
    "dcp_mla_topk_workspace_bytes": [_Z, _Z, _Z, POINTER(c_uint64)],
    "dcp_mla_prefill_plan": [POINTER(c_uint64), _Z, _Z, _Z, _Z, _U64] + [POINTER(c_size_t)] * 4,
    "dcp_mla_prefill_piece_table": [POINTER(c_uint64), _Z, _Z, _Z, _Z, _U64, _Z, POINTER(c_int32), _Z],
    # the operations: one argument struct each (an instance of it is passed by reference)
    **{name: [POINTER(cls)] for name, cls in ARGS.items()},
}

_lib = None
_lock = threading.Lock()


def library_path():
    """The shared object the C ABI is called in: $DCP_MLA_LIB, else the installed extension."""
    if os.environ.get("DCP_MLA_LIB"):
        return os.environ["DCP_MLA_LIB"]
    from . import _native
    return _native.__file__


def lib():
    """The C ABI, loaded once with every function's types declared (a wrong call raises)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load(library_path())
    return _lib


def _load(path):
    l = ctypes.CDLL(path)
    for name, args in SIGNATURES.items():
        f = getattr(l, name)
        f.argtypes = args
        f.restype = c_int32
    for name, args, res in [
        ("dcp_mla_last_error", [], c_char_p), ("dcp_mla_version", [], c_char_p),
        ("dcp_mla_status_name", [c_int32], c_char_p), ("dcp_mla_variant_name", [c_size_t], c_char_p),
        ("dcp_mla_variant_count", [], c_size_t), ("dcp_mla_abi_version", [], c_uint32),
        ("dcp_mla_default_scale", [], c_float),
    ]:
        getattr(l, name).argtypes = args
        getattr(l, name).restype = res
    got = l.dcp_mla_abi_version()
    if got != ABI_VERSION:
        raise ImportError(f"{path} implements C ABI revision {got}; this package was written for {ABI_VERSION}")
    return l


#: The range of each integer type a C argument may have: (lowest, highest).
_INT_RANGES = {
    c_int32: (-(1 << 31), (1 << 31) - 1), c_uint32: (0, (1 << 32) - 1), c_uint8: (0, 255),
    c_uint64: (0, (1 << 64) - 1), c_size_t: (0, (1 << (8 * ctypes.sizeof(c_size_t))) - 1),
}


def integer(name, value, lo=0, hi=(1 << 64) - 1):
    """`value` as a Python int in [lo, hi], or a TypeError / ValueError naming `name`: the one
    check every integer argument passes before ctypes sees it (ctypes would take -1 as 2^64 - 1,
    and refuses a float with a message that names no argument). bool is refused too."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    v = value.__index__()
    if not lo <= v <= hi:
        raise ValueError(f"{name}: {v} is out of range [{lo}, {hi}]")
    return v


def _check_args(name, args):
    """The safety net under `call`: every Python value passed to an integer parameter goes
    through `integer`, named by its function and position (the planner and the operations name
    their arguments themselves before this)."""
    types = SIGNATURES.get(name)
    if types is None:
        return args
    out = []
    for i, (a, t) in enumerate(zip(args, types)):
        if t in _INT_RANGES and not isinstance(a, ctypes._SimpleCData):
            lo, hi = _INT_RANGES[t]
            a = integer(f"{name} argument {i + 1}", a, lo, hi)
        out.append(a)
    return out + list(args[len(out):])


def check(name, status):
    """Raises DcpMlaError for a failed call, with the library's message (DcpMlaValueError, also a
    ValueError, for a refused argument or configuration)."""
    if status != 0:
        raise DcpMlaError.of(name, status, lib().dcp_mla_last_error().decode())


def call(name, *args):
    """Calls a status-returning function and checks its status."""
    check(name, getattr(lib(), name)(*_check_args(name, args)))


def query(name, *args, out_types=()):
    """Calls a query with trailing out-pointers of `out_types`; returns their values."""
    outs = [t() for t in out_types]
    call(name, *args, *[ctypes.byref(o) for o in outs])
    return [o.value for o in outs]
