//! The prefill chunk plan (docs/contract.md §7): the cached prefixes of a batch are gathered in chunks
//! whose token capacity is a multiple of B·D and whose workspace fits a byte budget. The plan is
//! computed on the host from the prefix lengths alone, so every rank computes the same plan with
//! no device synchronisation.
//!
//! A chunk is filled greedily with pieces of the requests in order. Every piece starts at a
//! multiple of B·D inside its request, so its local rows start at `global_start / D` on every
//! rank; it reserves a whole number of logical blocks (B rows per rank each) of the chunk's
//! per-rank capacity.

use super::{DcpLayout, PlanError};
use crate::error::Result;
use crate::formats::D_QK;

/// A request's slice of prefix inside one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Index of the request (its block-table row).
    pub request: usize,
    /// First global position of the slice, a multiple of B·D.
    pub global_start: usize,
    /// Tokens of the slice.
    pub global_len: usize,
    /// First local position on every rank: global_start / D.
    pub local_start: usize,
    /// n_r(global_len) for r = 0..D−1: the rows each rank flattens.
    pub local_len: Vec<usize>,
    /// First row of the piece in each rank's flatten buffer (a multiple of B).
    pub row_offset: usize,
    /// Rows the piece reserves in each rank's flatten buffer (whole logical blocks: a multiple of B).
    pub rows: usize,
    /// First row of the piece in the chunk's reordered output.
    pub out_offset: usize,
}

/// One chunk: its pieces and its reordered length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub pieces: Vec<Piece>,
    /// Σ global_len over the pieces: rows of the reordered output.
    pub tokens: usize,
}

/// The plan of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Token capacity of every chunk, a multiple of B·D.
    pub chunk_tokens: usize,
    /// Rows of each rank's flatten buffer: chunk_tokens / D (the all-gather moves [D, cap_rows, 576]).
    pub cap_rows: usize,
    /// Workspace bytes one chunk uses: [`prefill_chunk_bytes`] of chunk_tokens.
    pub workspace_bytes: u64,
    pub chunks: Vec<Chunk>,
}

/// Workspace of one chunk of `chunk_tokens` tokens (bf16 rows of 576): the rank's flatten buffer
/// [chunk_tokens / D, 576], the all-gathered buffer [D, chunk_tokens / D, 576] and the reordered
/// output [chunk_tokens, 576].
pub fn prefill_chunk_bytes(chunk_tokens: u64, d: usize) -> u64 {
    let row = (D_QK * 2) as u64;
    // saturating: a chunk beyond 64 bits of bytes fits no budget (and D = 0 counts as 1)
    (chunk_tokens / (d as u64).max(1)).saturating_add(chunk_tokens.saturating_mul(2)).saturating_mul(row)
}

/// Plans the gather of cached prefixes of `prefix_lens` tokens under a workspace budget of
/// `budget_bytes`: the largest chunk capacity (a multiple of B·D) whose [`prefill_chunk_bytes`]
/// fits, but no larger than the batch needs; chunks filled greedily with pieces of the requests
/// in order. A request with an empty prefix gets no piece; a batch without any prefix gets no
/// chunk.
pub fn plan_prefill_chunks(
    prefix_lens: &[u64],
    dcp: DcpLayout,
    block_size: usize,
    budget_bytes: u64,
) -> Result<ChunkPlan> {
    super::check_layout(dcp.size, dcp, block_size)?;
    let d = dcp.size;
    let unit = block_size as u64 * d as u64;
    let mut need_units = 0u64;
    for &len in prefix_lens {
        super::check_i32("prefix length", len as u128)?;
        need_units += len.div_ceil(unit);
    }
    let per_unit = prefill_chunk_bytes(unit, d);
    let fit_units = budget_bytes / per_unit;
    if fit_units == 0 {
        return Err(PlanError::BudgetTooSmall { budget: budget_bytes, unit, need: per_unit }.into());
    }
    let units = fit_units.min(need_units).max(1);
    let chunk_tokens = usize::try_from(units * unit)
        .map_err(|_| PlanError::Overflow { what: "chunk tokens", value: (units * unit) as u128 })?;
    super::check_i32("chunk tokens", chunk_tokens as u128)?;
    let (unit, units) = (unit as usize, units as usize);

    let mut chunks = Vec::new();
    let mut cur = Chunk { pieces: Vec::new(), tokens: 0 };
    let mut free = units;
    for (request, &len) in prefix_lens.iter().enumerate() {
        let len = len as usize;
        let mut start = 0;
        while start < len {
            if free == 0 {
                chunks.push(std::mem::replace(&mut cur, Chunk { pieces: Vec::new(), tokens: 0 }));
                free = units;
            }
            let take = (len - start).div_ceil(unit).min(free);
            let global_len = (take * unit).min(len - start);
            cur.pieces.push(Piece {
                request,
                global_start: start,
                global_len,
                local_start: start / d,
                local_len: (0..d).map(|r| dcp.local_len(global_len as u64, r) as usize).collect(),
                row_offset: (units - free) * block_size,
                rows: take * block_size,
                out_offset: cur.tokens,
            });
            cur.tokens += global_len;
            free -= take;
            start += global_len;
        }
    }
    if !cur.pieces.is_empty() {
        chunks.push(cur);
    }
    Ok(ChunkPlan {
        chunk_tokens,
        cap_rows: chunk_tokens / d,
        workspace_bytes: prefill_chunk_bytes(chunk_tokens as u64, d),
        chunks,
    })
}
