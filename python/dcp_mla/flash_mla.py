"""FlashMLA's Python interface over dcp-mla's kernels: switch an engine by changing an import.

    from dcp_mla.flash_mla import get_mla_metadata, flash_mla_with_kvcache

takes FlashMLA's argument names, shapes and return values (FlashMLA's
flash_mla_interface.py as of 2026: get_mla_metadata returns (sched_meta, None), the schedule
is made on the first call, out [b, s_q, h_q, 512] bf16 and softmax_lse [b, h_q, s_q] f32 in
natural log, +inf for a row that sees no token). Differences, all raised as errors rather than
silently ignored:

- head_dim_v must be 512 and q's head dim 576 (MLA as DeepSeek-V3/V3.2, Kimi, GLM-5 use it) or
  512 (FlashMLA's MODEL1: sparse only, below); num_heads_k must be 1.
- Dense decode reads a bf16 cache only: is_fp8_kvcache with dense attention raises
  NotImplementedError (FP8-656 caches are read by sparse decode, as in FlashMLA's sparse path).
- Sparse decode at head dim 576 takes a bf16 cache too (FlashMLA requires FP8 there);
  is_fp8_kvcache must match the cache's row size (656 bytes FP8, 576 bf16).
- Head dim 512 is FlashMLA's MODEL1 sparse path (dcp_mla.decode_model1): q [b, s_q, h_q, 512],
  k_cache FlashMLA's page-wise FP8 layout [num_blocks, page_block_size, 1, 584] (448 e4m3 and
  64 bf16 per token, then the page's ue8m0 scales, pages padded to a multiple of 576 bytes), with
  is_fp8_kvcache=True and indices, as FlashMLA requires. extra_k_cache (the same layout, its own
  page_block_size), extra_indices_in_kvcache [b, s_q, extra_topk] and extra_topk_length [b] add a
  second list to the same softmax, as in FlashMLA; softmax_scale defaults to 512^-1/2. At head
  dim 576 the extra_* arguments raise NotImplementedError (FlashMLA's MODEL1 path is where they
  are). attn_sink ([h_q] f32): out scaled by e^lse / (e^lse + e^sink) per head, softmax_lse
  unchanged, as FlashMLA documents it; dense attention takes it too (FlashMLA requires it None
  there).
- q, k_cache and indices may be strided views of larger buffers, as FlashMLA's own tests pass
  them (each row contiguous, k_cache's pages a whole number of rows apart); they are read in
  place.
- The numerics are dcp-mla's (docs/contract.md §9: P rounded to bf16 once, fp32 accumulation),
  not FlashMLA's bit for bit.
- The kernels write softmax_lse in FlashMLA's [b, h_q, s_q] layout, with +inf for an empty row,
  in place (through a strided view; no extra kernel). The native
  dcp_mla.decode_dense / decode_sparse return lse [b, s_q, h_q] with −inf for an empty row,
  which is what dcp_mla's combines take.
- For s_q > 1 with causal=True, row j of request i sees the first cache_seqlens[i] − s_q + 1 + j
  tokens, as in FlashMLA; the decode kernels work the rows' lengths out from cache_seqlens
  (read in place), so a dense call launches the decode's own kernels only.

Launch cache (host time): a call at head dim 576 that went through the checked path leaves its
FlashMLASchedMeta the launch's argument struct (meta.launch, dcp_mla._fastlaunch.Launch), keyed
on everything the launch reads but the data pointers: the shape, strides, dtype and device of q,
k_cache, block_table and cache_seqlens (dense) or indices and topk_length (sparse) and
attn_sink, which are None, head_dim_v, softmax_scale, causal, is_fp8_kvcache, the current
stream, the thread and the metadata's workspace. A later call of the same key (a step's other
layers) allocates out and lse, writes every data pointer of this call into the struct and calls
the C ABI, which checks the launch against the allocations as always; any other call takes the
checked path (same checks, same errors) and replaces the entry. Calls with int64 lengths (an
int32 copy each call) and MODEL1 calls are never cached. One thread's entry is never replayed by
another, so a metadata shared by threads stays correct (each call checked).
"""

import dataclasses
from ctypes import addressof, sizeof
from typing import Optional, Tuple

import torch

from . import _lib, ops
from ._fastlaunch import Launch, get_ident, launch_key

_is_compiling = torch.compiler.is_compiling
_raw_stream = ops._raw_stream
_BF16, _F32, _I32 = torch.bfloat16, torch.float32, torch.int32


@dataclasses.dataclass
class FlashMLASchedMeta:
    """The schedule of one decode shape, as FlashMLA's: the first flash_mla_with_kvcache call
    with it picks the split-KV parts, allocates their workspace and computes the split schedule
    from its lengths; later calls (the step's other layers) reuse that schedule, one small kernel
    less each. Make one a step (get_mla_metadata() per forward, inside a captured graph too):
    results are exact whatever the lengths, but a schedule kept across steps keeps the SMs'
    balance of the lengths it was made with. Use it only for calls of the same shapes. It also keeps
the last checked launch (`launch`; see the module docstring): later calls of the same shapes,
strides, scalars and stream replay it with their own pointers, skipping the Python checks."""
    have_initialized: bool = False
    # set once a call has launched with it, i.e. its workspace holds a computed schedule (a
    # first call that raised before its launch leaves the next call to compute it)
    scheduled: bool = False
    config: Optional[tuple] = None
    num_splits: Optional[int] = None
    workspace: Optional[torch.Tensor] = None
    # the launch cache (dcp_mla._fastlaunch.Launch): the argument struct of the last call that
    # went through the checked path at head dim 576, replayed by calls of the same key
    launch: Optional[object] = dataclasses.field(default=None, repr=False, compare=False)


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """An empty schedule, filled by the first flash_mla_with_kvcache call. Any arguments (those
    of FlashMLA's older get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k,
    ...)) are accepted and unused: the schedule depends on the shapes only."""
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor],
                           cache_seqlens: Optional[torch.Tensor], head_dim_v: int,
                           tile_scheduler_metadata: FlashMLASchedMeta, num_splits: None = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           is_fp8_kvcache: bool = False, indices: Optional[torch.Tensor] = None,
                           attn_sink: Optional[torch.Tensor] = None, extra_k_cache: Optional[torch.Tensor] = None,
                           extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                           topk_length: Optional[torch.Tensor] = None,
                           extra_topk_length: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """MLA decode with FlashMLA's interface (see the module docstring for the differences).

    q: [b, s_q, h_q, 576] bf16 (or 512: MODEL1). k_cache: [num_blocks, page_block_size, 1, 576]
    bf16, or [num_blocks, page_block_size, 1, 656] FP8-656 bytes (uint8 or float8_e4m3fn) for
    sparse, or with q's 512 the MODEL1 cache [num_blocks, page_block_size, 1, 584] bytes.
    block_table: [b, max_blocks] int32 (dense). cache_seqlens: [b] int32 (dense).
    indices: [b, s_q, topk] int32 of page·page_block_size + offset, −1 unused (sparse).
    topk_length: [b] int32, only the first topk_length[i] indices of request i count.
    extra_k_cache, extra_indices_in_kvcache [b, s_q, extra_topk], extra_topk_length [b] (MODEL1):
    a second source attended in the same softmax. softmax_scale: default head_dim^-1/2 of q.
    Returns out [b, s_q, h_q, 512] bf16 and softmax_lse [b, h_q, s_q] f32 (natural log).
    """
    meta = tile_scheduler_metadata
    cached = getattr(meta, "launch", None)
    if (cached is not None and not _is_compiling() and (num_splits is None or isinstance(num_splits, torch.Tensor))
            and extra_k_cache is None and extra_indices_in_kvcache is None and extra_topk_length is None):
        # the launch cache: a call whose key matches the last checked call of this thread with
        # this metadata replays its argument struct with this call's data pointers
        try:
            key = _face_key(q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, head_dim_v,
                            softmax_scale, causal, is_fp8_kvcache, _raw_stream(cached.index))
        except (AttributeError, TypeError):
            key = None  # an argument that is no tensor: the checked path names it
        if key == cached.key and cached.thread == get_ident() and cached.workspace is meta.workspace:
            out = torch.empty(cached.out_shape, dtype=_BF16, device=cached.device)
            lse = torch.empty(cached.lse_shape, dtype=_F32, device=cached.device)
            second, third = (block_table, cache_seqlens) if indices is None else (indices, topk_length)
            native = ops._NATIVE  # the native replay (python/src/launch.rs), where ops bound one
            status = ops._FALLBACK if native is None else native.replay_decode(
                indices is not None, addressof(cached.buf), sizeof(cached.buf),
                (q, out, lse, None, k_cache, second, third, attn_sink), keep_absent=True)
            if status == ops._FALLBACK:
                cached.write(q, out, lse, k_cache, second, third, attn_sink)
                cached.call()
            elif status:
                _lib.check(cached.name, status)
            return out, lse
    if not isinstance(meta, FlashMLASchedMeta):
        raise TypeError("tile_scheduler_metadata: pass the first value get_mla_metadata returns")
    if num_splits is not None and not isinstance(num_splits, torch.Tensor):
        raise TypeError("num_splits: must be None (or the old interface's tensor, which is unused)")
    if head_dim_v != 512:
        raise ValueError(f"head_dim_v: {head_dim_v}, dcp-mla's kernels are built for 512")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1:
        raise ValueError(f"k_cache: shape {tuple(k_cache.shape)}, expected [num_blocks, page_block_size, 1, head_dim]")
    if q.dim() == 4 and q.shape[-1] == 512:
        # (block_table and cache_seqlens are unused with indices, as in FlashMLA's sparse path)
        return _model1(q, k_cache, meta, softmax_scale, causal, is_fp8_kvcache, indices,
                       attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)
    for name, value in [("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                        ("extra_topk_length", extra_topk_length)]:
        if value is not None:
            raise NotImplementedError(f"{name}: dcp-mla takes a second source on FlashMLA's MODEL1 path only "
                                      f"(q's head dim 512), not with head dim {q.shape[-1]}")
    row_bytes = k_cache.shape[3] * k_cache.element_size()
    if is_fp8_kvcache != (row_bytes == 656):
        raise ValueError(f"k_cache: rows of {row_bytes} bytes with is_fp8_kvcache={is_fp8_kvcache} "
                         "(FP8-656 rows are 656 bytes, bf16 rows 1152)")
    b, s_q, h_q, _ = q.shape
    sparse = indices is not None
    # FlashMLA's lse [b, h_q, s_q], written in place by the kernels through a [b, s_q, h_q] view
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)
    lse_view = lse.transpose(1, 2)
    config = (b, s_q, h_q, q.shape[-1], k_cache.shape[1], bool(causal), bool(is_fp8_kvcache),
              None if indices is None else indices.shape[-1], None, None)
    reuse = meta.scheduled
    if not meta.have_initialized:
        # the library's split count for this launch (the card's tuned table where it has a row)
        if sparse:
            context = indices.shape[-1]
        else:
            context = (block_table.shape[1] if block_table is not None else 1) * k_cache.shape[1]
        meta.num_splits, meta.workspace = ops.decode_workspace(
            q.shape, sparse=sparse, device=q.device, kv_format="fp8_656" if is_fp8_kvcache and sparse else "bf16",
            context=max(context, 1), causal=bool(causal) and not sparse)
        meta.config = config
        meta.have_initialized = True
    else:
        _same_config(meta, config)
    if sparse:
        if causal:
            raise ValueError("causal: must be False with indices (sparse attention), as in FlashMLA")
        topk_len = None
        if topk_length is not None:
            # [b] per request as a [b, s_q] view (strides {1, 0}): read in place, no copy
            topk_len = topk_length.to(torch.int32).unsqueeze(1).expand(b, s_q)
        out, _ = ops.decode_sparse(q, k_cache, indices, topk_len=topk_len, scale=softmax_scale,
                                   num_splits=meta.num_splits, workspace=meta.workspace, reuse_schedule=reuse,
                                   sink=attn_sink, lse=lse_view, empty_lse_inf=True)
    else:
        if is_fp8_kvcache:
            raise NotImplementedError("is_fp8_kvcache: dense decode over an FP8 cache is not in dcp-mla "
                                      "(sparse decode reads FP8-656)")
        if topk_length is not None:
            raise ValueError("topk_length: only with indices (sparse attention)")
        if block_table is None or cache_seqlens is None:
            raise ValueError("block_table and cache_seqlens: required for dense attention")
        # FlashMLA's masking is one GPU's global lengths: every row sees cache_seqlens[i] tokens,
        # or with causal row j sees cache_seqlens[i] − s_q + 1 + j (at least 0); the kernels read
        # cache_seqlens [b] in place as a [b, s_q] view and work the rows' lengths out
        seqlens = cache_seqlens if cache_seqlens.dtype == torch.int32 else cache_seqlens.to(torch.int32)
        out, _ = ops.decode_dense(q, k_cache, block_table, seqlens, scale=softmax_scale,
                                  num_splits=meta.num_splits, workspace=meta.workspace, reuse_schedule=reuse,
                                  sink=attn_sink, lse=lse_view, empty_lse_inf=True,
                                  lens_rule="global_causal" if causal else "global")
    meta.scheduled = True  # both paths launched (an error above leaves it as it was)
    # remember the launch, unless a length tensor was converted (its int32 copy is gone now)
    if not _is_compiling() and (topk_length is None or topk_length.dtype == _I32) and (
            sparse or cache_seqlens.dtype == _I32):
        _remember(meta, sparse, q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, head_dim_v,
                  softmax_scale, causal, is_fp8_kvcache, (b, s_q, h_q, 512), (b, h_q, s_q))
    return out, lse


def _face_key(q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
              causal, is_fp8_kvcache, stream):
    """The launch cache's key: the native one where the native side reads every tensor (their
    dims, shape, strides, dtype and device as bytes; block_table and cache_seqlens only without
    indices, as _fastlaunch.launch_key), else launch_key's tuples of the same facts (the two
    forms never compare equal)."""
    if ops._NATIVE is not None:
        dense = indices is None
        k = ops._NATIVE.tensor_key((q, k_cache, block_table if dense else None, cache_seqlens if dense else None,
                                indices, topk_length, attn_sink))
        if k is not None:
            return k, head_dim_v, softmax_scale, causal, is_fp8_kvcache, stream
    return launch_key(q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, head_dim_v,
                      softmax_scale, causal, is_fp8_kvcache, stream)


def _remember(meta, sparse, q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, head_dim_v,
              softmax_scale, causal, is_fp8_kvcache, out_shape, lse_shape):
    """Keeps the launch this thread just made with `meta` (ops._last_launch) as its launch cache,
    keyed on the stream it went to."""
    name = "dcp_mla_launch_decode_sparse" if sparse else "dcp_mla_launch_decode_dense"
    fn, filled = ops._last_launch(name)
    key = _face_key(q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, head_dim_v,
                    softmax_scale, causal, is_fp8_kvcache, filled.stream or 0)
    meta.launch = Launch(key, name, fn, filled, meta.workspace, out_shape, lse_shape, q.device)


_CONFIG = "(b, s_q, h_q, head_dim, page_block_size, causal, fp8, topk, extra_page_block_size, extra_topk)"


def _same_config(meta, config):
    if meta.config != config:
        raise ValueError(f"tile_scheduler_metadata: made for {_CONFIG} = {meta.config}, called with {config}: "
                         "use one get_mla_metadata() per shape")


def _model1(q, k_cache, meta, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
            extra_k_cache, extra_indices, topk_length, extra_topk_length):
    """FlashMLA's MODEL1 path (q's head dim 512): sparse decode over the page-wise FP8 cache,
    from k_cache and, when given, extra_k_cache in one softmax (dcp_mla.decode_model1)."""
    if indices is None:
        raise NotImplementedError("indices: q's head dim 512 (MODEL1) is sparse decode only in dcp-mla; "
                                  "dense decode reads 576-value rows")
    if causal:
        raise ValueError("causal: must be False with indices (sparse attention), as in FlashMLA")
    if not is_fp8_kvcache:
        raise ValueError("is_fp8_kvcache: must be True with q's head dim 512 (MODEL1's cache is FP8), as in FlashMLA")
    row_bytes = k_cache.shape[3] * k_cache.element_size()
    if row_bytes != 584:
        raise ValueError(f"k_cache: rows of {row_bytes} bytes with q's head dim 512: MODEL1's cache is "
                         "[num_blocks, page_block_size, 1, 584] bytes")
    if (extra_k_cache is None) != (extra_indices is None):
        given, missing = (("extra_k_cache", "extra_indices_in_kvcache") if extra_indices is None
                          else ("extra_indices_in_kvcache", "extra_k_cache"))
        raise ValueError(f"{missing}: required with {given}")
    if extra_topk_length is not None and extra_k_cache is None:
        raise ValueError("extra_topk_length: only with extra_k_cache")
    if extra_k_cache is not None and (extra_k_cache.dim() != 4 or extra_k_cache.shape[2] != 1):
        raise ValueError(f"extra_k_cache: shape {tuple(extra_k_cache.shape)}, expected [num_blocks, "
                         "page_block_size, 1, 584]")
    b, s_q, h_q, _ = q.shape
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)
    config = (b, s_q, h_q, 512, k_cache.shape[1], False, True, indices.shape[-1],
              None if extra_k_cache is None else extra_k_cache.shape[1],
              None if extra_indices is None else extra_indices.shape[-1])
    reuse = meta.scheduled
    if not meta.have_initialized:
        # the split count of the heuristic (the tuned decode table has no MODEL1 rows)
        meta.num_splits, meta.workspace = ops.decode_workspace(q.shape, sparse=True, device=q.device)
        meta.config = config
        meta.have_initialized = True
    else:
        _same_config(meta, config)

    def lengths(x):
        return x if x is None or x.dtype == torch.int32 else x.to(torch.int32)

    out, _ = ops.decode_model1(q, k_cache, indices, topk_len=lengths(topk_length), extra_cache=extra_k_cache,
                               extra_indices=extra_indices, extra_topk_len=lengths(extra_topk_length),
                               scale=softmax_scale, num_splits=meta.num_splits, workspace=meta.workspace,
                               reuse_schedule=reuse, sink=attn_sink, lse=lse.transpose(1, 2), empty_lse_inf=True)
    meta.scheduled = True
    return out, lse
