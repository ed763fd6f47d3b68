//! Planner queries (host only, no device): ownership and lengths, capacity, workspace sizes and
//! the prefill chunk plan, all from `dcp_mla::planner` and the launchers' size functions.

use crate::{bad_arg, fail, guard, kv_format, put, DcpMlaStatus, R};
use dcp_mla::ops::combine::a2a_aligned_slot_bytes;
use dcp_mla::ops::decode::{decode_num_splits, decode_workspace_bytes, default_scale};
use dcp_mla::ops::prefill::{piece_table, PIECE_FIELDS};
use dcp_mla::planner::{self, workspace, DcpConfig, DcpLayout};

/// A layout the planner's arithmetic can use: D ≥ 1 and one of the sizes the kernels are built
/// for (`planner::DCP_SIZES`, INVALID_CONFIG as everywhere else), I ≥ 1 with D·I within 64
/// bits, rank < D.
fn layout(dcp_size: usize, interleave: usize, rank: usize) -> R<DcpLayout> {
    if dcp_size == 0 {
        return Err(bad_arg("dcp_size", "must be at least 1"));
    }
    planner::check_dcp_size(dcp_size).map_err(dcp_mla::Error::from)?;
    if interleave == 0 {
        return Err(bad_arg("interleave", "must be at least 1"));
    }
    if (interleave as u64).checked_mul(dcp_size as u64).is_none() {
        return Err(bad_arg("interleave", format!("D·I = {dcp_size}·{interleave} overflows 64 bits")));
    }
    if rank >= dcp_size {
        return Err(bad_arg("rank", format!("{rank} is not below the group size {dcp_size}")));
    }
    Ok(DcpLayout { size: dcp_size, interleave })
}

/// A host array of `n` elements, or NullPointer when it is null and n > 0.
///
/// # Safety
/// `p` must be null or valid for `n` reads.
unsafe fn host<'a, T>(arg: &str, p: *const T, n: usize) -> R<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(fail(DcpMlaStatus::NullPointer, format!("`{arg}` is a null host pointer")));
    }
    Ok(std::slice::from_raw_parts(p, n))
}

/// The default softmax scale of docs/contract.md §4: 576^-1/2.
#[no_mangle]
pub extern "C" fn dcp_mla_default_scale() -> f32 {
    default_scale()
}

/// Checks a DCP configuration (docs/contract.md §1): D ≥ 1 dividing tp, B ≥ 1, I ≥ 1 dividing B.
/// DCP_MLA_STATUS_INVALID_CONFIG with the values otherwise.
#[no_mangle]
pub extern "C" fn dcp_mla_check_config(
    tp: usize,
    dcp_size: usize,
    interleave: usize,
    block_size: usize,
) -> DcpMlaStatus {
    guard(|| DcpConfig::new(tp, dcp_size, interleave, block_size).map(|_| ()).map_err(Into::into))
}

/// Checks the sparse top-k constraint (docs/contract.md §6): K in {256, 512, 1024, 2048} and D·K a multiple of 512.
/// DCP_MLA_STATUS_INVALID_CONFIG naming D and K otherwise.
#[no_mangle]
pub extern "C" fn dcp_mla_check_topk(dcp_size: usize, k: usize) -> DcpMlaStatus {
    guard(|| Ok(planner::check_topk(dcp_size, k)?))
}

/// Checks a decode step's sizes as the `dcp-mla` CLI's `plan` and `demo` and Python's `plan()`
/// do (`dcp_mla::planner::check_decode_shape`): D in {1, 2, 4, 8}, 1 ≤ D·local_heads ≤ 128,
/// 1 ≤ num_q ≤ 8, batch ≥ 1, num_q ≤ context ≤ 2^31 − 1 and batch·num_q within int32.
/// DCP_MLA_STATUS_INVALID_CONFIG naming the value otherwise.
#[no_mangle]
pub extern "C" fn dcp_mla_check_decode(
    dcp_size: usize,
    local_heads: usize,
    num_q: usize,
    batch: usize,
    context: u64,
) -> DcpMlaStatus {
    guard(|| planner::check_decode_shape(dcp_size, local_heads, num_q, batch, context).map(|_| ()).map_err(Into::into))
}

/// n_r(L): the tokens rank `rank` holds of a sequence of `len` global tokens (docs/contract.md §2).
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_local_len(
    dcp_size: usize,
    interleave: usize,
    rank: usize,
    len: u64,
    out: *mut u64,
) -> DcpMlaStatus {
    guard(|| put("out", out, layout(dcp_size, interleave, rank)?.local_len(len, rank)))
}

/// Where global token `t` lives (docs/contract.md §2): its owner rank, block-table column and slot.
///
/// # Safety
/// The out-pointers must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_token_address(
    dcp_size: usize,
    interleave: usize,
    block_size: usize,
    t: u64,
    rank: *mut usize,
    page_column: *mut u64,
    slot: *mut u64,
) -> DcpMlaStatus {
    guard(|| {
        let dcp = layout(dcp_size, interleave, 0)?;
        if block_size == 0 {
            return Err(bad_arg("block_size", "must be at least 1"));
        }
        let (r, col, s) = dcp.address(t, block_size);
        put("rank", rank, r)?;
        put("page_column", page_column, col)?;
        put("slot", slot, s)
    })
}

/// Causal local lengths of MTP rows (docs/contract.md §2) on rank `rank`: for request i of total length
/// lens[i] (including its qs[i] new tokens), row j sees n_r(lens[i] − qs[i] + 1 + j) tokens.
/// Writes the rows of every request, concatenated, to `out` (int32, sum(qs) entries, at most
/// `out_len`): with a uniform q this is the [batch, q] `lens` of dcp_mla_launch_decode_dense.
///
/// # Safety
/// `lens` and `qs` must hold `num_requests` entries; `out` `out_len` writable entries.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_causal_local_lens(
    lens: *const u64,
    qs: *const u32,
    num_requests: usize,
    dcp_size: usize,
    interleave: usize,
    rank: usize,
    out: *mut i32,
    out_len: usize,
) -> DcpMlaStatus {
    guard(|| {
        let dcp = layout(dcp_size, interleave, rank)?;
        let lens = host("lens", lens, num_requests)?;
        let qs: Vec<usize> = host("qs", qs, num_requests)?.iter().map(|&q| q as usize).collect();
        let rows = planner::causal_local_lens(lens, &qs, dcp, rank)?;
        if rows.len() > out_len {
            return Err(bad_arg("out_len", format!("{out_len} entries, but the rows need {}", rows.len())));
        }
        if !rows.is_empty() {
            let out = host("out", out.cast_const(), rows.len())?;
            std::ptr::copy_nonoverlapping(rows.as_ptr(), out.as_ptr().cast_mut(), rows.len());
        }
        Ok(())
    })
}

/// Pages every rank needs for one sequence of `len` tokens: ceil(len / (B·D)).
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_pages_for(
    dcp_size: usize,
    block_size: usize,
    len: u64,
    out: *mut u64,
) -> DcpMlaStatus {
    guard(|| {
        let dcp = layout(dcp_size, 1, 0)?;
        if block_size == 0 {
            return Err(bad_arg("block_size", "must be at least 1"));
        }
        put("out", out, dcp.pages_for(len, block_size))
    })
}

/// Global tokens a DCP group holds with `bytes_per_rank` of cache per rank in `format`
/// (whole pages times B·D: capacity grows D-fold), and the pages per rank.
///
/// # Safety
/// The out-pointers must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_capacity(
    bytes_per_rank: u64,
    format: i32,
    block_size: usize,
    dcp_size: usize,
    tokens: *mut u64,
    pages_per_rank: *mut u64,
) -> DcpMlaStatus {
    guard(|| {
        let f = kv_format("format", format)?;
        layout(dcp_size, 1, 0)?;
        if block_size == 0 {
            return Err(bad_arg("block_size", "must be at least 1"));
        }
        put("tokens", tokens, planner::capacity_tokens(bytes_per_rank, f, block_size, dcp_size))?;
        put("pages_per_rank", pages_per_rank, planner::pages_per_rank(bytes_per_rank, f, block_size))
    })
}

/// Split-KV parts that make about one wave of `num_sms` decode CTAs (the parts share the batch's
/// KV tiles evenly whatever the lengths, and their count is aligned with the sequences' so that
/// equal lengths split none; 1 when a sequence's row blocks alone fill the machine); a function
/// of the shapes only, so a captured graph stays valid for any lengths.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_decode_num_splits(
    batch: usize,
    num_q: usize,
    heads: usize,
    sparse: i32,
    num_sms: usize,
    out: *mut usize,
) -> DcpMlaStatus {
    guard(|| put("out", out, decode_num_splits(batch, num_q, heads, sparse != 0, num_sms)))
}

/// Bytes of the decode split-KV workspace (0 for one split) for dense (`sparse` = 0) or sparse
/// decode; `heads` is the gathered H = D·H_l.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_decode_workspace_bytes(
    batch: usize,
    num_q: usize,
    heads: usize,
    sparse: i32,
    num_splits: usize,
    out: *mut usize,
) -> DcpMlaStatus {
    guard(|| put("out", out, decode_workspace_bytes(batch, num_q, heads, sparse != 0, num_splits)?))
}

/// Bytes of one a2a slot (one destination's share of a [D, slot] send or receive buffer) for
/// `num_tokens` rows of `local_heads` heads, rounded up to 16 so every slot starts aligned.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_a2a_slot_bytes(
    num_tokens: usize,
    local_heads: usize,
    out: *mut usize,
) -> DcpMlaStatus {
    guard(|| put("out", out, a2a_aligned_slot_bytes(num_tokens, local_heads)?))
}

/// Bytes of the ag_rs combine buffers on one rank: the all-gathered lse [D, T, D·H_l], the
/// contribution [D·H_l, T, 512] and the reduce-scattered sum [H_l, T, 512], all f32.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_ag_rs_workspace_bytes(
    dcp_size: usize,
    num_tokens: usize,
    local_heads: usize,
    out: *mut u64,
) -> DcpMlaStatus {
    guard(|| put("out", out, workspace::merge_ag_rs_bytes(dcp_size, num_tokens, local_heads)?))
}

/// Bytes of the distributed top-k buffers of `rows` rows: local top-k, packed candidates, the
/// all-gathered [D, rows, k] candidates and the merged ids.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_topk_workspace_bytes(
    dcp_size: usize,
    rows: usize,
    k: usize,
    out: *mut u64,
) -> DcpMlaStatus {
    guard(|| put("out", out, workspace::topk_bytes(dcp_size, rows, k)?))
}

/// The plan both prefill entry points make from the same C arguments (the piece table's is the
/// plan's, so the two always agree).
///
/// # Safety
/// `prefix_lens` must hold `num_requests` entries.
unsafe fn prefill_chunks(
    prefix_lens: *const u64,
    num_requests: usize,
    dcp_size: usize,
    interleave: usize,
    block_size: usize,
    budget_bytes: u64,
) -> R<planner::ChunkPlan> {
    let lens = host("prefix_lens", prefix_lens, num_requests)?;
    Ok(planner::plan_prefill_chunks(lens, layout(dcp_size, interleave, 0)?, block_size, budget_bytes)?)
}

/// Plans the prefix gather of a prefill batch (docs/contract.md §7) under a workspace budget: the chunk
/// length (a multiple of B·D), the rows of each rank's flatten buffer, the number of chunks and
/// the most pieces any chunk has (the rows of the piece tables to allocate).
///
/// # Safety
/// `prefix_lens` must hold `num_requests` entries; the out-pointers must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_prefill_plan(
    prefix_lens: *const u64,
    num_requests: usize,
    dcp_size: usize,
    interleave: usize,
    block_size: usize,
    budget_bytes: u64,
    chunk_tokens: *mut usize,
    cap_rows: *mut usize,
    num_chunks: *mut usize,
    max_pieces: *mut usize,
) -> DcpMlaStatus {
    guard(|| {
        let plan = prefill_chunks(prefix_lens, num_requests, dcp_size, interleave, block_size, budget_bytes)?;
        put("chunk_tokens", chunk_tokens, plan.chunk_tokens)?;
        put("cap_rows", cap_rows, plan.cap_rows)?;
        put("num_chunks", num_chunks, plan.chunks.len())?;
        put("max_pieces", max_pieces, plan.chunks.iter().map(|c| c.pieces.len()).max().unwrap_or(0))
    })
}

/// The piece table of chunk `chunk` of the plan dcp_mla_prefill_plan makes from the same
/// arguments: int32 [max_pieces, 8] written to host memory `table` (to upload into the
/// device buffer the flatten and reorder read), empty entries padded with zeros.
///
/// # Safety
/// `prefix_lens` must hold `num_requests` entries; `table` `max_pieces·8` writable entries.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_prefill_piece_table(
    prefix_lens: *const u64,
    num_requests: usize,
    dcp_size: usize,
    interleave: usize,
    block_size: usize,
    budget_bytes: u64,
    chunk: usize,
    table: *mut i32,
    max_pieces: usize,
) -> DcpMlaStatus {
    guard(|| {
        let plan = prefill_chunks(prefix_lens, num_requests, dcp_size, interleave, block_size, budget_bytes)?;
        let Some(c) = plan.chunks.get(chunk) else {
            return Err(bad_arg("chunk", format!("{chunk} is not below the plan's {} chunks", plan.chunks.len())));
        };
        let t = piece_table(c, max_pieces)?;
        if !t.is_empty() {
            let out = host("table", table.cast_const(), max_pieces * PIECE_FIELDS)?;
            std::ptr::copy_nonoverlapping(t.as_ptr(), out.as_ptr().cast_mut(), t.len());
        }
        Ok(())
    })
}
