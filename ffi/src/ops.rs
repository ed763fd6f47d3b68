//! One entry point per operation of docs/contract.md, each a thin shell around a launcher of
//! `dcp_mla::ops`: convert the C arguments (checking null pointers, dtype codes and element
//! alignment), check what can be checked without a device (variants, planner constraints), then
//! call the launcher, which validates every extent before it launches.

use crate::{device, fail, guard, stream, DcpMlaDevice, DcpMlaStatus, DcpMlaTensor, R};
use dcp_mla::ops::combine::{self, A2aCombine, A2aPack, AgRsCorrect, AgRsFinish, MergeTwo};
use dcp_mla::ops::decode::{self, DecodeCommon, DecodeOut, DenseDecode, SparseDecode};
use dcp_mla::ops::fill::{kv_fill, KvFill};
use dcp_mla::ops::prefill::{self, Flatten, Reorder};
use dcp_mla::ops::topk::{self, Compact, GlobalMerge, LocalTopk, PackCandidates, PageTranslate};
use dcp_mla::planner::{check_topk, DcpLayout};
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use std::ffi::c_void;

/// The body of every entry point below: `args` converts the C arguments (`arg!`) and runs the
/// checks that need no device, then the device handle is looked at and `op` launches; `guard`
/// maps the outcome (an error, a panic) to the call's status.
///
/// # Safety
/// As for the entry points: `device` null or an open handle, `stream` null or a live stream of
/// its context, and the tensors `args` converts live device memory of their `numel`.
unsafe fn launch<A>(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    op: fn(&Device, Stream, &A) -> dcp_mla::Result<()>,
    args: impl FnOnce() -> R<A>,
) -> DcpMlaStatus {
    guard(|| {
        let a = args()?;
        Ok(op(self::device(device)?, self::stream(stream), &a)?)
    })
}

fn layout(dcp_size: usize, interleave: usize) -> DcpLayout {
    DcpLayout { size: dcp_size, interleave }
}

/// Writes each new token's KV into this rank's paged cache if this rank owns it (docs/contract.md §2-3);
/// bit-identical to the CPU reference. A token whose position is negative, whose request index
/// is outside [0, batch) or whose page is out of range is skipped.
///
/// - `ckv`: bf16 [num_tokens, ckv_stride] (c_kv in the first 512 values of a row);
///   `kpe`: bf16 [num_tokens, kpe_stride] (k_pe in the first 64); strides in elements.
/// - `req_idx`, `positions`: int32 [num_tokens]: block-table row and global position per token.
/// - `block_table`: int32 [batch, block_table_stride], first `max_pages` columns used.
/// - `cache`: this rank's cache [num_pages, page_stride, row] in `format` (DCP_MLA_KV_*), any
///   dtype, the first `block_size` rows of each page its tokens; `page_stride` 0: packed pages.
/// - `dcp_size`, `interleave`, `rank`: D, I and this rank r.
///
/// # Safety
/// Every tensor must describe live device memory of its `numel`; `device` an open handle;
/// `stream` null or a live stream of the device's context.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_kv_fill(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    ckv: DcpMlaTensor,
    ckv_stride: usize,
    kpe: DcpMlaTensor,
    kpe_stride: usize,
    req_idx: DcpMlaTensor,
    positions: DcpMlaTensor,
    block_table: DcpMlaTensor,
    block_table_stride: usize,
    batch: usize,
    max_pages: usize,
    cache: DcpMlaTensor,
    num_pages: usize,
    block_size: usize,
    page_stride: usize,
    format: i32,
    dcp_size: usize,
    interleave: usize,
    rank: usize,
) -> DcpMlaStatus {
    launch(device, stream, kv_fill, || {
        Ok(KvFill {
            ckv: arg!(ckv),
            ckv_stride,
            kpe: arg!(kpe),
            kpe_stride,
            req_idx: arg!(req_idx),
            positions: arg!(positions),
            block_table: arg!(block_table),
            block_table_stride,
            batch,
            max_pages,
            cache: arg!(cache),
            num_pages,
            block_size,
            page_stride: page_stride_arg(page_stride),
            format: arg!(format),
            dcp: layout(dcp_size, interleave),
            rank,
        })
    })
}

/// `n` strides from a C array, or `None` (contiguous) for a null pointer.
///
/// # Safety
/// `p` null or pointing at `N` readable values.
unsafe fn strides_arg<const N: usize>(p: *const usize) -> Option<[usize; N]> {
    // SAFETY: the caller's contract.
    (!p.is_null()).then(|| unsafe { std::ptr::read_unaligned(p as *const [usize; N]) })
}

/// A page stride in cache rows, 0 for packed pages (`None`).
fn page_stride_arg(page_stride: usize) -> Option<usize> {
    (page_stride != 0).then_some(page_stride)
}

#[allow(clippy::too_many_arguments)]
fn decode_common(
    q: DcpMlaTensor,
    q_strides: Option<[usize; 3]>,
    batch: usize,
    num_q: usize,
    heads: usize,
    scale: f32,
    out: DcpMlaTensor,
    out_strides: Option<[usize; 3]>,
    lse: DcpMlaTensor,
    lse_strides: Option<[usize; 3]>,
    empty_lse_inf: i32,
    num_splits: usize,
    workspace: DcpMlaTensor,
    schedule: i32,
    sink: DcpMlaTensor,
) -> R<DecodeCommon> {
    let schedule = arg!(schedule);
    let out: DecodeOut = arg!(out);
    // The workspace is only touched with more than one split: an absent one is 0 bytes.
    let workspace = if workspace.data.is_null() && num_splits <= 1 {
        // SAFETY: an empty view is never dereferenced.
        unsafe { DeviceSlice::from_raw(0, 0) }
    } else {
        arg!(workspace)
    };
    Ok(DecodeCommon {
        q: arg!(q),
        q_strides,
        batch,
        nq: num_q,
        heads,
        scale,
        out,
        lse: arg!(lse),
        num_splits,
        workspace,
        schedule,
        sink: arg!(sink),
        out_strides,
        lse_strides,
        empty_lse_inf: empty_lse_inf != 0,
    })
}

/// Dense MLA decode over the BF16 paged cache (docs/contract.md §4): row (i, j) attends to the first
/// `lens[i][j]` local tokens of request i.
///
/// - `q`: bf16 [batch, num_q, heads, 576]; `scale`: softmax scale σ (dcp_mla_default_scale()).
/// - `out`: bf16 or f32 [batch, num_q, heads, 512]; `lse`: f32 [batch, num_q, heads], natural log,
///   −inf for a row that sees no token.
/// - `num_splits`: KV splits (dcp_mla_decode_num_splits); with more than 1, `workspace` must hold
///   dcp_mla_decode_workspace_bytes bytes (16-byte aligned); with 1 it may be null.
/// - `schedule`: DCP_MLA_SCHEDULE_COMPUTE, or DCP_MLA_SCHEDULE_REUSE to reuse the split schedule an
///   earlier COMPUTE launch of the same batch, num_q, heads, num_splits and kind (dense or sparse,
///   cache format) left in this workspace, e.g. the step's first layer: it saves a kernel and
///   the wait for it. Exact whatever the lengths are now (other lengths cost only balance); a
///   workspace whose schedule has another sequence count, part count or KV tile, or that no
///   schedule wrote, makes the kernel trap. Ignored with one split.
/// - `q_strides`: null for a contiguous q, else 3 values: elements between q's requests, query
///   rows and heads (multiples of 8; each row's 576 values contiguous), for a view of a larger
///   buffer. `q.numel` counts the elements from q's first to the end of its last row.
/// - `out_strides`, `lse_strides`: null for contiguous outputs, else 3 values each: elements
///   between requests, query rows and heads, no two rows (values) overlapping; out's a multiple
///   of 16 bytes (FlashMLA's lse [b, h, s_q] is lse_strides {h·s_q, 1, s_q}).
/// - `empty_lse_inf`: nonzero gives a row that sees no token lse = +inf (FlashMLA's convention)
///   instead of −inf; out is 0 either way.
/// - `cache`: [num_pages, page_stride, 576] bf16 (any dtype), the first `block_size` rows of each
///   page its tokens; `page_stride`: cache rows between page starts (≥ block_size), 0 for
///   `block_size` (packed pages); `block_table`: int32 [batch, block_table_stride], first
///   `max_pages` columns used; `lens`: int32 [batch, num_q]; `lens_strides`: null for contiguous
///   lengths, else 2 values: elements between requests and query rows (any, 0 broadcasts).
/// - `lens_rule`: what `lens` holds (DCP_MLA_LENS_*). LOCAL (0): each query row's local length.
///   GLOBAL (1): each request's global length L, its num_q new tokens included (FlashMLA's
///   cache_seqlens; {1, 0} strides broadcast a [batch] tensor): every row sees n_r(L) tokens,
///   the t < L of rank `rank` ((t / interleave) % dcp_size == rank). GLOBAL_CAUSAL (2): the same
///   with causal MTP rows, row j sees n_r(max(L − num_q + 1 + j, 0)). The kernels work the rows'
///   lengths out themselves: no lengths kernel before the decode. `dcp_size` (1, 2, 4 or 8),
///   `interleave` (≥ 1) and `rank` (< dcp_size) are read with GLOBAL and GLOBAL_CAUSAL only;
///   one GPU is 1, 1, 0.
/// - `sink`: optional f32 [heads] attention sinks (null data: none), FlashMLA's `attn_sink`: each
///   row's out is scaled by e^lse / (e^lse + e^sink[h]), lse unchanged (docs/contract.md §4). Leave
///   it null on a DCP rank whose partial result a combine merges: pass it to the combine instead.
///
/// # Safety
/// As for dcp_mla_kv_fill; each strides pointer null or pointing at its values (host memory).
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_decode_dense(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    q: DcpMlaTensor,
    q_strides: *const usize,
    batch: usize,
    num_q: usize,
    heads: usize,
    scale: f32,
    out: DcpMlaTensor,
    out_strides: *const usize,
    lse: DcpMlaTensor,
    lse_strides: *const usize,
    empty_lse_inf: i32,
    num_splits: usize,
    workspace: DcpMlaTensor,
    schedule: i32,
    cache: DcpMlaTensor,
    num_pages: usize,
    block_size: usize,
    page_stride: usize,
    block_table: DcpMlaTensor,
    block_table_stride: usize,
    max_pages: usize,
    lens: DcpMlaTensor,
    lens_strides: *const usize,
    lens_rule: i32,
    dcp_size: usize,
    interleave: usize,
    rank: usize,
    sink: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, decode::mla_decode_dense, || {
        let lens_rule = crate::lens_rule("lens_rule", lens_rule, dcp_size, interleave, rank)?;
        Ok(DenseDecode {
            common: decode_common(
                q,
                strides_arg(q_strides),
                batch,
                num_q,
                heads,
                scale,
                out,
                strides_arg(out_strides),
                lse,
                strides_arg(lse_strides),
                empty_lse_inf,
                num_splits,
                workspace,
                schedule,
                sink,
            )?,
            cache: arg!(cache),
            num_pages,
            block_size,
            block_table: arg!(block_table),
            block_table_stride,
            max_pages,
            lens: arg!(lens),
            lens_strides: strides_arg(lens_strides),
            lens_rule,
            page_stride: page_stride_arg(page_stride),
        })
    })
}

/// Sparse MLA decode (docs/contract.md §4) over the BF16 or FP8-656 cache: row (i, j) attends to the
/// cache rows page·block_size + slot listed in `indices[i][j]` (−1 or out of range: unused).
///
/// - `q`, `scale`, `out`, `lse`, `num_splits`, `workspace`, `schedule`: as for dcp_mla_decode_dense.
/// - `q_strides`, `page_stride`: as for dcp_mla_decode_dense.
/// - `cache`: [num_pages, page_stride, row] in `format` (DCP_MLA_KV_*), any dtype; an index is
///   still page·block_size + slot.
/// - `indices`: int32 [batch, num_q, topk]; `indices_strides`: null for contiguous lists, else 2
///   values: elements between the lists' requests and query rows (each list contiguous);
///   `topk_len`: optional int32 [batch, num_q] (null data: every entry counts), only the first
///   topk_len[i][j] entries count; `topk_len_strides`: as `lens_strides` of dcp_mla_decode_dense
///   (FlashMLA's per-request topk_length is {1, 0}).
/// - `sink`: as for dcp_mla_decode_dense.
///
/// # Safety
/// As for dcp_mla_kv_fill; each strides pointer null or pointing at its values (host memory).
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_decode_sparse(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    q: DcpMlaTensor,
    q_strides: *const usize,
    batch: usize,
    num_q: usize,
    heads: usize,
    scale: f32,
    out: DcpMlaTensor,
    out_strides: *const usize,
    lse: DcpMlaTensor,
    lse_strides: *const usize,
    empty_lse_inf: i32,
    num_splits: usize,
    workspace: DcpMlaTensor,
    schedule: i32,
    cache: DcpMlaTensor,
    format: i32,
    num_pages: usize,
    block_size: usize,
    page_stride: usize,
    indices: DcpMlaTensor,
    indices_strides: *const usize,
    topk: usize,
    topk_len: DcpMlaTensor,
    topk_len_strides: *const usize,
    sink: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, decode::mla_decode_sparse, || {
        Ok(SparseDecode {
            common: decode_common(
                q,
                strides_arg(q_strides),
                batch,
                num_q,
                heads,
                scale,
                out,
                strides_arg(out_strides),
                lse,
                strides_arg(lse_strides),
                empty_lse_inf,
                num_splits,
                workspace,
                schedule,
                sink,
            )?,
            cache: arg!(cache),
            format: arg!(format),
            num_pages,
            block_size,
            indices: arg!(indices),
            topk,
            topk_len: arg!(topk_len),
            topk_len_strides: strides_arg(topk_len_strides),
            page_stride: page_stride_arg(page_stride),
            indices_strides: strides_arg(indices_strides),
        })
    })
}

/// ag_rs combine, step 1 (docs/contract.md §5.1) on rank `rank` of D = `dcp_size` (H = D·local_heads):
/// contrib[h, t, :] = (w_rank / S) · out[t, h, :] computed in f32, head-major for a reduce-scatter.
///
/// - `out`: bf16 or f32 [num_tokens, H, 512], this rank's partial attention output.
/// - `lse_all`: f32 [D, num_tokens, H], every rank's lse (all-gathered), base `lse_base_code`.
/// - `contrib`: f32 or bf16 [H, num_tokens, 512] (bf16: rounded to nearest even), written.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_ag_rs_correct(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    out: DcpMlaTensor,
    lse_all: DcpMlaTensor,
    lse_base_code: i32,
    contrib: DcpMlaTensor,
    num_tokens: usize,
    local_heads: usize,
    dcp_size: usize,
    rank: usize,
) -> DcpMlaStatus {
    launch(device, stream, combine::ag_rs_correct, || {
        Ok(AgRsCorrect {
            out: arg!(out),
            lse_all: arg!(lse_all),
            lse_base: arg!(lse_base_code as "lse_base"),
            contrib: arg!(contrib),
            num_tokens,
            local_heads,
            dcp_size,
            rank,
        })
    })
}

/// ag_rs combine, step 2: casts this rank's reduce-scattered heads to the output dtype and
/// writes their merged lse (natural log; −inf with out = 0 where every shard is empty).
///
/// - `summed`: f32 or bf16 [local_heads, num_tokens, 512], the reduce-scattered contributions.
/// - `lse_all`: f32 [D, num_tokens, D·local_heads], the same all-gathered lse, base `lse_base_code`.
/// - `out`: bf16 or f32 [num_tokens, local_heads, 512]; `lse`: f32 [num_tokens, local_heads].
/// - `sink`: optional f32 [local_heads] (null data: none), the attention sinks of this rank's heads
///   (sink[j] for head rank·local_heads + j), applied once to the merged f32 rows before the cast.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_ag_rs_finish(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    summed: DcpMlaTensor,
    lse_all: DcpMlaTensor,
    lse_base_code: i32,
    out: DcpMlaTensor,
    lse: DcpMlaTensor,
    num_tokens: usize,
    local_heads: usize,
    dcp_size: usize,
    rank: usize,
    sink: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, combine::ag_rs_finish, || {
        Ok(AgRsFinish {
            summed: arg!(summed),
            lse_all: arg!(lse_all),
            lse_base: arg!(lse_base_code as "lse_base"),
            out: arg!(out),
            lse: arg!(lse),
            num_tokens,
            local_heads,
            dcp_size,
            rank,
            sink: arg!(sink),
        })
    })
}

/// a2a combine, send side (docs/contract.md §5.2): packs this rank's out (as bf16) and lse into one slot
/// per destination rank d (heads [d·H_l, (d+1)·H_l)), so one all-to-all moves both.
///
/// - `out`: bf16 or f32 [num_tokens, D·local_heads, 512]; `lse`: f32 [num_tokens, D·local_heads].
/// - `send`: bytes [D, slot_bytes] (any dtype), slot_bytes from dcp_mla_a2a_slot_bytes.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_a2a_pack(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    out: DcpMlaTensor,
    lse: DcpMlaTensor,
    send: DcpMlaTensor,
    slot_bytes: usize,
    num_tokens: usize,
    local_heads: usize,
    dcp_size: usize,
) -> DcpMlaStatus {
    launch(device, stream, combine::a2a_pack, || {
        Ok(A2aPack { out: arg!(out), lse: arg!(lse), send: arg!(send), slot_bytes, num_tokens, local_heads, dcp_size })
    })
}

/// a2a combine, receive side: the full merge (docs/contract.md §5) of the D received slots, in f32, rank
/// order, a source with coefficient 0 skipped. Compiled for D in {1, 2, 4, 8} (D = 1 is the identity: the one slot
/// unpacked, docs/contract.md §9's DCP identity at D = 1).
///
/// - `recv`: bytes [D, slot_bytes]: slot r as source rank r packed it for this rank.
/// - `out`: bf16 or f32 [num_tokens, local_heads, 512]; `lse`: f32 [num_tokens, local_heads].
/// - `sink`: optional f32 [local_heads] (null data: none): as for dcp_mla_ag_rs_finish.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_a2a_combine(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    recv: DcpMlaTensor,
    slot_bytes: usize,
    lse_base_code: i32,
    out: DcpMlaTensor,
    lse: DcpMlaTensor,
    num_tokens: usize,
    local_heads: usize,
    dcp_size: usize,
    sink: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, combine::a2a_combine, || {
        let a = A2aCombine {
            recv: arg!(recv),
            slot_bytes,
            lse_base: arg!(lse_base_code as "lse_base"),
            out: arg!(out),
            lse: arg!(lse),
            num_tokens,
            local_heads,
            dcp_size,
            sink: arg!(sink),
        };
        if !combine::a2a_combine_compiled(dcp_size, &a.out) {
            return Err(fail(
                DcpMlaStatus::Unsupported,
                format!("a2a combine for D = {dcp_size} is not compiled (D in {:?})", combine::A2A_RANKS),
            ));
        }
        Ok(a)
    })
}

/// The two-way merge of chunked prefill (docs/contract.md §5.3): (out_a, lse_a) + (out_b, lse_b) over
/// `rows` rows, f32 accumulation. An `out` of the inputs' dtype may be exactly `out_a` or `out_b`
/// (in place).
///
/// - `out_a`, `out_b`: bf16 or f32 [rows, 512], both the same dtype; `lse_a`, `lse_b`: f32
///   [rows], each in its own base
///   (`lse_a_base_code`, `lse_b_base_code`: a running natural-log result merged with a base-2
///   chunk is the normal case).
/// - `out`: bf16 or f32 [rows, 512]; `lse`: f32 [rows], natural log.
/// - `sink`: optional f32 [H] (null data: none): attention sinks applied to the merged rows, laid
///   out [T, H] (head = row mod H, H = sink.numel dividing `rows`). Pass it on the last merge of a
///   chain only, so that the sink enters the softmax once.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_merge_two(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    out_a: DcpMlaTensor,
    lse_a: DcpMlaTensor,
    out_b: DcpMlaTensor,
    lse_b: DcpMlaTensor,
    lse_a_base_code: i32,
    lse_b_base_code: i32,
    out: DcpMlaTensor,
    lse: DcpMlaTensor,
    rows: usize,
    sink: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, combine::merge_two, || {
        Ok(MergeTwo {
            out_a: arg!(out_a),
            lse_a: arg!(lse_a),
            out_b: arg!(out_b),
            lse_b: arg!(lse_b),
            lse_a_base: arg!(lse_a_base_code as "lse_a_base"),
            lse_b_base: arg!(lse_b_base_code as "lse_b_base"),
            out: arg!(out),
            lse: arg!(lse),
            rows,
            sink: arg!(sink),
        })
    })
}

/// Local top-k (docs/contract.md §6): per row the K best of the first lens[row] scores by (score
/// descending, index ascending; NaN as −inf), as ascending indices, −1 padded.
///
/// - `scores`: f32 [rows, row_stride], the first `cols` columns usable.
/// - `lens`: int32 [rows]; `k`: 256, 512, 1024 or 2048; `out`: int32 [rows, k].
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_topk_local(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    scores: DcpMlaTensor,
    row_stride: usize,
    cols: usize,
    lens: DcpMlaTensor,
    rows: usize,
    k: usize,
    out: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, topk::local_topk, || {
        let a = LocalTopk { scores: arg!(scores), row_stride, cols, lens: arg!(lens), rows, k, out: arg!(out) };
        if !topk::local_topk_compiled(k) {
            return Err(fail(
                DcpMlaStatus::Unsupported,
                format!("local top-k for K = {k} is not compiled (K in 256, 512, 1024, 2048)"),
            ));
        }
        Ok(a)
    })
}

/// Packs this rank's local top-k into candidates: (scores[row, l] bit for bit, global(l, rank))
/// per entry, (−inf, −1) for an unused one.
///
/// - `local_idx`: int32 [rows, k]; `scores`: f32 [rows, row_stride], `cols` columns used.
/// - `cand_scores`: f32 [rows, k], `cand_ids`: int32 [rows, k]: written (usually this rank's slot
///   of the [D, rows, k] buffers the all-gather fills).
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_topk_pack(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    local_idx: DcpMlaTensor,
    scores: DcpMlaTensor,
    row_stride: usize,
    cols: usize,
    rows: usize,
    k: usize,
    dcp_size: usize,
    interleave: usize,
    rank: usize,
    cand_scores: DcpMlaTensor,
    cand_ids: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, topk::pack_candidates, || {
        Ok(PackCandidates {
            local_idx: arg!(local_idx),
            scores: arg!(scores),
            row_stride,
            cols,
            rows,
            k,
            dcp: layout(dcp_size, interleave),
            rank,
            cand_scores: arg!(cand_scores),
            cand_ids: arg!(cand_ids),
        })
    })
}

/// Global merge (docs/contract.md §6): the exact top-K of the D·K all-gathered candidates per row by
/// (score descending, id ascending), in candidate order, −1 padded. D·K must be a multiple of
/// 512 (DCP_MLA_STATUS_INVALID_CONFIG otherwise, naming D and K).
///
/// - `cand_scores`: f32 [D, rows, k], `cand_ids`: int32 [D, rows, k], rank-major.
/// - `out`: int32 [rows, k], global ids.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_topk_merge(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    cand_scores: DcpMlaTensor,
    cand_ids: DcpMlaTensor,
    dcp_size: usize,
    rows: usize,
    k: usize,
    out: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, topk::global_merge, || {
        let a =
            GlobalMerge { cand_scores: arg!(cand_scores), cand_ids: arg!(cand_ids), dcp_size, rows, k, out: arg!(out) };
        check_topk(dcp_size, k)?;
        if !topk::global_merge_compiled(dcp_size, k) {
            return Err(fail(
                DcpMlaStatus::Unsupported,
                format!("global top-k merge for D = {dcp_size}, K = {k} is not compiled (D in 1, 2, 4, 8)"),
            ));
        }
        Ok(a)
    })
}

/// Compaction for rank `rank` (docs/contract.md §6): keeps the ids this rank owns, as local positions
/// (or page·block_size + slot when `block_table` is given), compacted to the front, −1 padded,
/// with per-row counts.
///
/// - `ids`: int32 [rows, k], merged global ids; `out`: int32 [rows, k]; `counts`: int32 [rows].
/// - `block_table`: optional int32 [ceil(rows / rows_per_request), block_table_stride] (null data:
///   no translation); `block_size` B; row i belongs to request i / rows_per_request.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_topk_compact(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    ids: DcpMlaTensor,
    rows: usize,
    k: usize,
    dcp_size: usize,
    interleave: usize,
    rank: usize,
    block_table: DcpMlaTensor,
    block_table_stride: usize,
    block_size: usize,
    rows_per_request: usize,
    out: DcpMlaTensor,
    counts: DcpMlaTensor,
) -> DcpMlaStatus {
    launch(device, stream, topk::compact, || {
        let block_table: Option<DeviceSlice<i32>> = arg!(block_table);
        let translate = block_table.map(|t| PageTranslate {
            block_table: t,
            stride: block_table_stride,
            block_size,
            rows_per_request,
        });
        let a = Compact {
            ids: arg!(ids),
            rows,
            k,
            dcp: layout(dcp_size, interleave),
            rank,
            translate,
            out: arg!(out),
            counts: arg!(counts),
        };
        Ok(a)
    })
}

/// Prefill prefix flatten (docs/contract.md §7): writes this rank's rows of one chunk into its uniform
/// bf16 buffer (FP8-656 dequantised), zeros elsewhere; the chunk's layout is read from the
/// device-side piece table (dcp_mla_prefill_piece_table).
///
/// - `cache`: [num_pages, page_stride, row] in `format` (`page_stride` 0: packed pages, as for
///   dcp_mla_kv_fill); `block_table`: int32
///   [batch, block_table_stride], the first `max_pages` columns read.
/// - `pieces`: int32 [max_pieces, 8]; `out`: bf16 [cap_rows, 576], every row written.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_prefill_flatten(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    cache: DcpMlaTensor,
    format: i32,
    num_pages: usize,
    block_size: usize,
    page_stride: usize,
    block_table: DcpMlaTensor,
    block_table_stride: usize,
    batch: usize,
    max_pages: usize,
    pieces: DcpMlaTensor,
    max_pieces: usize,
    out: DcpMlaTensor,
    cap_rows: usize,
    dcp_size: usize,
    interleave: usize,
    rank: usize,
) -> DcpMlaStatus {
    launch(device, stream, prefill::flatten, || {
        Ok(Flatten {
            cache: arg!(cache),
            format: arg!(format),
            num_pages,
            block_size,
            page_stride: page_stride_arg(page_stride),
            block_table: arg!(block_table),
            block_table_stride,
            batch,
            max_pages,
            pieces: arg!(pieces),
            max_pieces,
            out: arg!(out),
            cap_rows,
            dcp: layout(dcp_size, interleave),
            rank,
        })
    })
}

/// Prefill reorder: writes every token of every piece from the all-gathered flatten buffers
/// to its global row.
///
/// - `gathered`: bf16 [D, cap_rows, 576]; `pieces`: int32 [max_pieces, 8] (the flatten's table).
/// - `out`: bf16 [out_rows, 576]; rows of other chunks are left as they are.
///
/// # Safety
/// As for dcp_mla_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_prefill_reorder(
    device: *const DcpMlaDevice,
    stream: *mut c_void,
    gathered: DcpMlaTensor,
    cap_rows: usize,
    pieces: DcpMlaTensor,
    max_pieces: usize,
    out: DcpMlaTensor,
    out_rows: usize,
    dcp_size: usize,
    interleave: usize,
) -> DcpMlaStatus {
    launch(device, stream, prefill::reorder, || {
        Ok(Reorder {
            gathered: arg!(gathered),
            cap_rows,
            pieces: arg!(pieces),
            max_pieces,
            out: arg!(out),
            out_rows,
            dcp: layout(dcp_size, interleave),
        })
    })
}
