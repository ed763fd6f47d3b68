"""ctypes client of the dcp-mla C ABI (ffi/include/dcp_mla.h): no compiled extension needed.

Copy this file into an engine. It loads libdcp_mla_ffi.so from $DCP_MLA_LIB (or a path given
to `load`), passes torch tensors as (data_ptr, element count, dtype code) and launches on
`torch.cuda.current_stream()` unless a stream is given. Every failure raises DcpMlaError with
the status name and the library's message (which names the argument and the reason).

    m = DcpMla(0)                          # device 0: the same primary context as torch
    m.kv_fill(ckv, kpe, req_idx, positions, block_table, cache, fmt=KV_BF16,
              dcp_size=4, interleave=1, rank=r)
"""

import ctypes
import os
from ctypes import POINTER, byref, c_char_p, c_float, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

DTYPE_U8, DTYPE_BF16, DTYPE_F32, DTYPE_I32 = 1, 2, 3, 4
KV_BF16, KV_FP8_656 = 1, 2
LSE_BASE_E, LSE_BASE_2 = 1, 2
STATUS = [
    "SUCCESS", "INVALID_ARGUMENT", "NULL_POINTER", "MISALIGNED", "BAD_DTYPE",
    "INVALID_CONFIG", "UNSUPPORTED", "NO_DEVICE", "CUDA_ERROR", "INTERNAL",
]
STATUS_NO_DEVICE = STATUS.index("NO_DEVICE")


class Tensor(ctypes.Structure):
    """DcpMlaTensor: a device pointer, its element count and a DTYPE_* code."""
    _fields_ = [("data", c_void_p), ("numel", c_size_t), ("dtype", c_int32)]


class DcpMlaError(RuntimeError):
    def __init__(self, function, status, message):
        self.status = status
        self.message = message
        name = STATUS[status] if 0 <= status < len(STATUS) else str(status)
        super().__init__(f"{function}: DCP_MLA_STATUS_{name}: {message}")


_D = c_void_p  # DcpMlaDevice*
_S = c_void_p  # stream
_T = Tensor
_Z = c_size_t
_I = c_int32
_U64 = c_uint64

# Argument types of every status-returning function, in header order.
SIGNATURES = {
    "dcp_mla_compute_capability_supported": [_I, _I, POINTER(c_int32)],
    "dcp_mla_device_open": [_I, POINTER(c_void_p)],
    "dcp_mla_device_close": [_D],
    "dcp_mla_device_info": [_D, POINTER(c_int32), POINTER(c_int32), POINTER(c_int32)],
    "dcp_mla_malloc": [_D, _Z, POINTER(c_void_p)],
    "dcp_mla_free": [_D, c_void_p],
    "dcp_mla_memcpy_htod": [_D, c_void_p, c_void_p, _Z],
    "dcp_mla_memcpy_dtoh": [_D, c_void_p, c_void_p, _Z],
    "dcp_mla_memset": [_D, c_void_p, ctypes.c_uint8, _Z],
    "dcp_mla_synchronize": [_D],
    "dcp_mla_kv_fill": [_D, _S, _T, _Z, _T, _Z, _T, _T, _T, _Z, _Z, _Z, _T, _Z, _Z, _I, _Z, _Z, _Z],
    "dcp_mla_decode_dense": [_D, _S, _T, _Z, _Z, _Z, c_float, _T, _T, _Z, _T, _T, _Z, _Z, _T, _Z, _Z, _T],
    "dcp_mla_decode_sparse": [_D, _S, _T, _Z, _Z, _Z, c_float, _T, _T, _Z, _T, _T, _I, _Z, _Z, _T, _Z, _T],
    "dcp_mla_ag_rs_correct": [_D, _S, _T, _T, _I, _T, _Z, _Z, _Z, _Z],
    "dcp_mla_ag_rs_finish": [_D, _S, _T, _T, _I, _T, _T, _Z, _Z, _Z, _Z],
    "dcp_mla_a2a_pack": [_D, _S, _T, _T, _T, _Z, _Z, _Z, _Z],
    "dcp_mla_a2a_combine": [_D, _S, _T, _Z, _I, _T, _T, _Z, _Z, _Z],
    "dcp_mla_merge_two": [_D, _S, _T, _T, _T, _T, _I, _T, _T, _Z],
    "dcp_mla_topk_local": [_D, _S, _T, _Z, _Z, _T, _Z, _Z, _T],
    "dcp_mla_topk_pack": [_D, _S, _T, _T, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _T, _T],
    "dcp_mla_topk_merge": [_D, _S, _T, _T, _Z, _Z, _Z, _T],
    "dcp_mla_topk_compact": [_D, _S, _T, _Z, _Z, _Z, _Z, _Z, _T, _Z, _Z, _Z, _T, _T],
    "dcp_mla_prefill_flatten": [_D, _S, _T, _I, _Z, _Z, _T, _Z, _Z, _Z, _T, _Z, _T, _Z, _Z, _Z, _Z],
    "dcp_mla_prefill_reorder": [_D, _S, _T, _Z, _T, _Z, _T, _Z, _Z, _Z],
    "dcp_mla_check_config": [_Z, _Z, _Z, _Z],
    "dcp_mla_check_topk": [_Z, _Z],
    "dcp_mla_local_len": [_Z, _Z, _Z, _U64, POINTER(c_uint64)],
    "dcp_mla_token_address": [_Z, _Z, _Z, _U64, POINTER(c_size_t), POINTER(c_uint64), POINTER(c_uint64)],
    "dcp_mla_causal_local_lens": [POINTER(c_uint64), POINTER(c_uint32), _Z, _Z, _Z, _Z, POINTER(c_int32), _Z],
    "dcp_mla_pages_for": [_Z, _Z, _U64, POINTER(c_uint64)],
    "dcp_mla_capacity": [_U64, _I, _Z, _Z, POINTER(c_uint64), POINTER(c_uint64)],
    "dcp_mla_decode_num_splits": [_Z, _Z, _Z, _I, _Z, POINTER(c_size_t)],
    "dcp_mla_decode_workspace_bytes": [_Z, _Z, _Z, _I, _Z, POINTER(c_size_t)],
    "dcp_mla_a2a_slot_bytes": [_Z, _Z, POINTER(c_size_t)],
    "dcp_mla_ag_rs_workspace_bytes": [_Z, _Z, _Z, POINTER(c_uint64)],
    "dcp_mla_topk_workspace_bytes": [_Z, _Z, _Z, POINTER(c_uint64)],
    "dcp_mla_prefill_plan": [POINTER(c_uint64), _Z, _Z, _Z, _Z, _U64] + [POINTER(c_size_t)] * 4,
    "dcp_mla_prefill_piece_table": [POINTER(c_uint64), _Z, _Z, _Z, _Z, _U64, _Z, POINTER(c_int32), _Z],
}


def load(path=None):
    """Loads the library and declares every function's types (a wrong call raises at once)."""
    lib = ctypes.CDLL(path or os.environ["DCP_MLA_LIB"])
    for name, args in SIGNATURES.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = c_int32
    for name in ["dcp_mla_last_error", "dcp_mla_version"]:
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = c_char_p
    lib.dcp_mla_status_name.argtypes = [c_int32]
    lib.dcp_mla_status_name.restype = c_char_p
    lib.dcp_mla_variant_name.argtypes = [c_size_t]
    lib.dcp_mla_variant_name.restype = c_char_p
    lib.dcp_mla_variant_count.argtypes = []
    lib.dcp_mla_variant_count.restype = c_size_t
    lib.dcp_mla_abi_version.argtypes = []
    lib.dcp_mla_abi_version.restype = c_uint32
    lib.dcp_mla_default_scale.argtypes = []
    lib.dcp_mla_default_scale.restype = c_float
    return lib


_DTYPES = {"torch.uint8": DTYPE_U8, "torch.int8": DTYPE_U8, "torch.bfloat16": DTYPE_BF16,
           "torch.float32": DTYPE_F32, "torch.int32": DTYPE_I32}


def tensor(x):
    """A torch CUDA tensor as a DcpMlaTensor; None is an absent optional buffer. The element
    count is what the storage holds from the tensor's first element on, so a view of a larger
    buffer is checked against the real allocation."""
    if x is None:
        return Tensor(None, 0, DTYPE_U8)
    code = _DTYPES.get(str(x.dtype))
    if code is None:
        raise TypeError(f"dtype {x.dtype} has no dcp-mla code")
    if not x.is_cuda:
        raise ValueError("dcp-mla takes CUDA tensors")
    storage = x.untyped_storage()
    avail = (storage.nbytes() - (x.data_ptr() - storage.data_ptr())) // x.element_size()
    return Tensor(x.data_ptr(), avail, code)


class DcpMla:
    """A device handle and one method per operation. Launches are asynchronous on `stream`
    (default: torch's current stream); nothing is allocated and nothing synchronises."""

    def __init__(self, ordinal=0, path=None):
        self.lib = load(path)
        self.dev = c_void_p()
        self._check("dcp_mla_device_open", self.lib.dcp_mla_device_open(ordinal, byref(self.dev)))

    def close(self):
        if self.dev:
            self._check("dcp_mla_device_close", self.lib.dcp_mla_device_close(self.dev))
            self.dev = c_void_p()

    def _check(self, name, status):
        if status != 0:
            raise DcpMlaError(name, status, self.lib.dcp_mla_last_error().decode())

    def _stream(self, stream):
        if stream is None:
            import torch
            stream = torch.cuda.current_stream()
        return c_void_p(getattr(stream, "cuda_stream", stream))

    def launch(self, name, *args, stream=None):
        """Calls an operation: (device, stream) first, then `args`, each tensor converted."""
        conv = [tensor(a) if t is Tensor else a for a, t in zip(args, SIGNATURES[name][2:])]
        self._check(name, getattr(self.lib, name)(self.dev, self._stream(stream), *conv))

    def query(self, name, *args, out_types=()):
        """Calls a planner query with trailing out-pointers of `out_types`; returns their values."""
        outs = [t() for t in out_types]
        self._check(name, getattr(self.lib, name)(*args, *[byref(o) for o in outs]))
        return [o.value for o in outs]

    # --- planner and capability queries -------------------------------------------------------
    def version(self):
        return self.lib.dcp_mla_version().decode()

    def variants(self):
        return [self.lib.dcp_mla_variant_name(i).decode() for i in range(self.lib.dcp_mla_variant_count())]

    def device_info(self):
        """(major, minor, num_sms)."""
        return tuple(self.query("dcp_mla_device_info", self.dev, out_types=(c_int32,) * 3))

    def default_scale(self):
        return self.lib.dcp_mla_default_scale()

    def local_len(self, length, dcp_size, interleave, rank):
        return self.query("dcp_mla_local_len", dcp_size, interleave, rank, length, out_types=(c_uint64,))[0]

    def causal_local_lens(self, lens, qs, dcp_size, interleave, rank):
        """Per-row local lengths of every request's q rows on `rank`, concatenated."""
        n = len(lens)
        rows = sum(qs)
        out = (c_int32 * max(rows, 1))()
        self._check("dcp_mla_causal_local_lens", self.lib.dcp_mla_causal_local_lens(
            (c_uint64 * n)(*lens), (c_uint32 * n)(*qs), n, dcp_size, interleave, rank, out, rows))
        return list(out)[:rows]

    def decode_num_splits(self, batch, nq, heads, sparse, num_sms):
        return self.query("dcp_mla_decode_num_splits", batch, nq, heads, int(sparse), num_sms,
                          out_types=(c_size_t,))[0]

    def decode_workspace_bytes(self, batch, nq, heads, sparse, num_splits):
        return self.query("dcp_mla_decode_workspace_bytes", batch, nq, heads, int(sparse), num_splits,
                          out_types=(c_size_t,))[0]

    def a2a_slot_bytes(self, num_tokens, local_heads):
        return self.query("dcp_mla_a2a_slot_bytes", num_tokens, local_heads, out_types=(c_size_t,))[0]

    def check_topk(self, dcp_size, k):
        self._check("dcp_mla_check_topk", self.lib.dcp_mla_check_topk(dcp_size, k))

    # --- operations ----------------------------------------------------------------------------
    def kv_fill(self, ckv, kpe, req_idx, positions, block_table, cache, *, fmt, dcp_size, interleave, rank,
                stream=None):
        """ckv bf16 [T, >=512], kpe bf16 [T, >=64], req_idx/positions int32 [T], block_table int32
        [batch, max_pages], cache [num_pages, block_size, row bytes or 576 bf16]."""
        self.launch("dcp_mla_kv_fill", ckv, ckv.stride(0), kpe, kpe.stride(0), req_idx, positions,
                    block_table, block_table.stride(0), block_table.shape[0], block_table.shape[1],
                    cache, cache.shape[0], cache.shape[1], fmt, dcp_size, interleave, rank, stream=stream)

    def decode_dense(self, q, cache, block_table, lens, out, lse, *, scale, num_splits=1, workspace=None,
                     stream=None):
        """q bf16 [b, nq, H, 576]; cache bf16 [pages, B, 576]; lens int32 [b, nq]; out bf16/f32
        [b, nq, H, 512]; lse f32 [b, nq, H]."""
        b, nq, h, _ = q.shape
        self.launch("dcp_mla_decode_dense", q, b, nq, h, scale, out, lse, num_splits, workspace,
                    cache, cache.shape[0], cache.shape[1], block_table, block_table.stride(0),
                    block_table.shape[1], lens, stream=stream)

    def decode_sparse(self, q, cache, fmt, indices, out, lse, *, scale, topk_len=None, num_splits=1,
                      workspace=None, stream=None):
        """indices int32 [b, nq, topk] of page·B + slot; cache [pages, B, row]."""
        b, nq, h, _ = q.shape
        self.launch("dcp_mla_decode_sparse", q, b, nq, h, scale, out, lse, num_splits, workspace,
                    cache, fmt, cache.shape[0], cache.shape[1], indices, indices.shape[-1], topk_len,
                    stream=stream)

    def ag_rs_correct(self, out, lse_all, contrib, *, lse_base, num_tokens, local_heads, dcp_size, rank,
                      stream=None):
        self.launch("dcp_mla_ag_rs_correct", out, lse_all, lse_base, contrib, num_tokens, local_heads,
                    dcp_size, rank, stream=stream)

    def ag_rs_finish(self, summed, lse_all, out, lse, *, lse_base, num_tokens, local_heads, dcp_size, rank,
                     stream=None):
        self.launch("dcp_mla_ag_rs_finish", summed, lse_all, lse_base, out, lse, num_tokens, local_heads,
                    dcp_size, rank, stream=stream)

    def a2a_pack(self, out, lse, send, *, slot_bytes, num_tokens, local_heads, dcp_size, stream=None):
        self.launch("dcp_mla_a2a_pack", out, lse, send, slot_bytes, num_tokens, local_heads, dcp_size,
                    stream=stream)

    def a2a_combine(self, recv, out, lse, *, slot_bytes, lse_base, num_tokens, local_heads, dcp_size,
                    stream=None):
        self.launch("dcp_mla_a2a_combine", recv, slot_bytes, lse_base, out, lse, num_tokens, local_heads,
                    dcp_size, stream=stream)

    def merge_two(self, out_a, lse_a, out_b, lse_b, out, lse, *, lse_a_base, lse_b_base, rows, stream=None):
        """Each input's lse in its own base (docs/contract.md §5.3); the output lse is natural log."""
        self.launch("dcp_mla_merge_two", out_a, lse_a, out_b, lse_b, lse_a_base, lse_b_base, out, lse, rows,
                    stream=stream)

    def topk_local(self, scores, lens, out, *, k, cols=None, stream=None):
        """scores f32 [rows, stride]; lens int32 [rows]; out int32 [rows, k]."""
        rows, stride = scores.shape
        self.launch("dcp_mla_topk_local", scores, scores.stride(0), stride if cols is None else cols, lens,
                    rows, k, out, stream=stream)

    def topk_pack(self, local_idx, scores, cand_scores, cand_ids, *, dcp_size, interleave, rank, cols=None,
                  stream=None):
        rows, k = local_idx.shape
        self.launch("dcp_mla_topk_pack", local_idx, scores, scores.stride(0),
                    scores.shape[1] if cols is None else cols, rows, k, dcp_size, interleave, rank,
                    cand_scores, cand_ids, stream=stream)

    def topk_merge(self, cand_scores, cand_ids, out, *, stream=None):
        """cand_* [D, rows, k]; out int32 [rows, k]."""
        d, rows, k = cand_scores.shape
        self.launch("dcp_mla_topk_merge", cand_scores, cand_ids, d, rows, k, out, stream=stream)

    def topk_compact(self, ids, out, counts, *, dcp_size, interleave, rank, block_table=None, block_size=1,
                     rows_per_request=1, stream=None):
        rows, k = ids.shape
        stride = 0 if block_table is None else block_table.stride(0)
        self.launch("dcp_mla_topk_compact", ids, rows, k, dcp_size, interleave, rank, block_table, stride,
                    block_size, rows_per_request, out, counts, stream=stream)

    def prefill_flatten(self, cache, fmt, block_table, pieces, out, *, dcp_size, interleave, rank,
                        stream=None):
        self.launch("dcp_mla_prefill_flatten", cache, fmt, cache.shape[0], cache.shape[1], block_table,
                    block_table.stride(0), block_table.shape[0], block_table.shape[1], pieces, pieces.shape[0],
                    out, out.shape[0], dcp_size, interleave, rank, stream=stream)

    def prefill_reorder(self, gathered, pieces, out, *, dcp_size, interleave, stream=None):
        self.launch("dcp_mla_prefill_reorder", gathered, gathered.shape[1], pieces, pieces.shape[0], out,
                    out.shape[0], dcp_size, interleave, stream=stream)
