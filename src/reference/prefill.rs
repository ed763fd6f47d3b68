//! Prefill over a cached prefix (docs/contract.md §7): each rank flattens its local rows of a chunk into a
//! uniform-capacity bf16 buffer (dequantising FP8), the buffers are all-gathered [D, cap, 576],
//! and a reorder writes every row to its global position. Bit-exact definitions.
//!
//! A chunk starts at a global position that is a multiple of D·I (the planner makes it a
//! multiple of B·D), so its local rows on every rank start at `global_start / D` and the chunk's
//! token g (relative to its start) sits on rank owner(g), row local(g) of that rank's part.

use super::fill::PagedCache;
use crate::formats::{decode_fp8_row_bf16, KvFormat, D_QK};
use crate::planner::{ChunkPlan, DcpLayout};
use half::bf16;

/// One rank's flattened rows: row i (< min(local_len, cap)) is the local token local_start + i
/// of the request whose block-table row is `block_table_row`, as 576 bf16 (FP8-656 dequantised
/// with [`decode_fp8_row_bf16`]). Rows ≥ local_len are zero, and so is a row whose page column
/// lies beyond the table row or whose page is negative or ≥ num_pages (nothing outside the cache
/// is read). `cache` is the rank's raw cache [num_pages, block_size, token_bytes].
pub fn flatten(
    cache: &[u8],
    format: KvFormat,
    block_size: usize,
    block_table_row: &[i32],
    local_start: usize,
    local_len: usize,
    cap: usize,
) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; cap * D_QK];
    flatten_into(cache, format, block_size, block_table_row, local_start, local_len, &mut out);
    out
}

/// [`flatten`] into `out` [rows, 576], rows = out.len() / 576 being the capacity.
fn flatten_into(
    cache: &[u8],
    format: KvFormat,
    block_size: usize,
    table: &[i32],
    local_start: usize,
    local_len: usize,
    out: &mut [bf16],
) {
    let row_bytes = format.token_bytes();
    let num_pages = cache.len() / (block_size * row_bytes);
    for (i, dst) in out.chunks_mut(D_QK).enumerate().take(local_len) {
        let l = local_start + i;
        let page = table.get(l / block_size).copied().unwrap_or(-1);
        if page < 0 || page as usize >= num_pages {
            dst.fill(bf16::ZERO);
            continue;
        }
        let src = &cache[(page as usize * block_size + l % block_size) * row_bytes..][..row_bytes];
        match format {
            KvFormat::Bf16 => {
                for (o, b) in dst.iter_mut().zip(src.chunks(2)) {
                    *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            KvFormat::Fp8_656 => dst.copy_from_slice(&decode_fp8_row_bf16(src)),
        }
    }
}

/// The reorder of one chunk piece: `gathered` \[D, cap, 576\] (rank r's flattened rows at \[r\]) to
/// [global_len, 576] in global order: token g comes from rank owner(g), row local(g). A token
/// whose local row is ≥ cap (a plan that did not size cap for it) is zero.
pub fn reorder(gathered: &[bf16], dcp: DcpLayout, global_len: usize) -> Vec<bf16> {
    let d = dcp.size;
    assert_eq!(gathered.len() % (d * D_QK), 0, "gathered is [D, cap, 576]");
    let cap = gathered.len() / (d * D_QK);
    let mut out = vec![bf16::ZERO; global_len * D_QK];
    for (g, dst) in out.chunks_mut(D_QK).enumerate() {
        let (r, l) = (dcp.owner(g as u64), dcp.local(g as u64) as usize);
        if l < cap {
            dst.copy_from_slice(&gathered[(r * cap + l) * D_QK..][..D_QK]);
        }
    }
    out
}

/// Flatten of a whole planned chunk on rank `rank`: [cap_rows, 576] where the plan's piece p
/// occupies rows [p.row_offset, p.row_offset + p.local_len\[rank\]) (zero up to the next piece).
/// `cache` describes the rank's cache `bytes` and its block table [batch, stride]; columns
/// beyond `max_pages` are not read.
pub fn flatten_chunk(plan: &ChunkPlan, chunk: usize, rank: usize, cache: &PagedCache, bytes: &[u8]) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; plan.cap_rows * D_QK];
    let used = &bytes[..cache.num_pages * cache.block_size * cache.format.token_bytes()];
    for p in &plan.chunks[chunk].pieces {
        let row = &cache.block_table[p.request * cache.block_table_stride..][..cache.max_pages];
        let dst = &mut out[p.row_offset * D_QK..(p.row_offset + p.rows) * D_QK];
        flatten_into(used, cache.format, cache.block_size, row, p.local_start, p.local_len[rank], dst);
    }
    out
}

/// Reorder of a whole planned chunk: `gathered` [D, cap_rows, 576] to [chunk tokens, 576], piece
/// p's tokens at rows [p.out_offset, p.out_offset + p.global_len) in global order.
pub fn reorder_chunk(plan: &ChunkPlan, chunk: usize, gathered: &[bf16], dcp: DcpLayout) -> Vec<bf16> {
    let c = &plan.chunks[chunk];
    let cap = plan.cap_rows;
    assert_eq!(gathered.len(), dcp.size * cap * D_QK, "gathered is [D, cap_rows, 576]");
    let mut out = vec![bf16::ZERO; c.tokens * D_QK];
    for p in &c.pieces {
        for g in 0..p.global_len {
            let (r, l) = (dcp.owner(g as u64), dcp.local(g as u64) as usize);
            let src = (r * cap + p.row_offset + l) * D_QK;
            out[(p.out_offset + g) * D_QK..][..D_QK].copy_from_slice(&gathered[src..src + D_QK]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatten_then_reorder_restores_global_order() {
        // D = 2, I = 1, B = 2, bf16; token t's row is all t. Rank r holds tokens r, r+2, ...
        let dcp = DcpLayout { size: 2, interleave: 1 };
        let (b, len) = (2, 5);
        let table = [1, 0, 2];
        let mut caches = vec![vec![0u8; 3 * b * 1152]; 2];
        for t in 0..len {
            let (r, l) = (dcp.owner(t as u64), dcp.local(t as u64) as usize);
            let slot = table[l / b] as usize * b + l % b;
            for e in 0..D_QK {
                caches[r][(slot * D_QK + e) * 2..][..2]
                    .copy_from_slice(&bf16::from_f32(t as f32).to_bits().to_le_bytes());
            }
        }
        let cap = 3;
        let gathered: Vec<bf16> = (0..2)
            .flat_map(|r| flatten(&caches[r], KvFormat::Bf16, b, &table, 0, dcp.local_len(len as u64, r) as usize, cap))
            .collect();
        let out = reorder(&gathered, dcp, len);
        for t in 0..len {
            assert!(out[t * D_QK..(t + 1) * D_QK].iter().all(|v| v.to_f32() == t as f32), "token {t}");
        }
        // rank 1 holds 2 tokens: its third row is zero
        assert!(gathered[(cap + 2) * D_QK..(cap + 3) * D_QK].iter().all(|v| v.to_bits() == 0));
    }
}
