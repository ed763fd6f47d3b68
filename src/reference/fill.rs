//! KV-cache fill (docs/contract.md §2-3), the reference of `kernels-src/fill.cuh`.

use crate::formats::{encode_bf16_row, encode_fp8_row, KvFormat, D_LATENT, D_QK, D_ROPE};
use crate::planner::DcpLayout;
use half::bf16;

/// The new tokens to write, as host arrays laid out exactly as the kernel reads them.
#[derive(Debug, Clone, Copy)]
pub struct FillInput<'a> {
    /// bf16 [num_tokens, ckv_stride]; the first 512 values of each row are c_kv.
    pub ckv: &'a [bf16],
    pub ckv_stride: usize,
    /// bf16 [num_tokens, kpe_stride]; the first 64 values of each row are k_pe.
    pub kpe: &'a [bf16],
    pub kpe_stride: usize,
    /// Block-table row of each token.
    pub req_idx: &'a [i32],
    /// Global position of each token; negative positions are skipped (padding).
    pub positions: &'a [i32],
}

/// The paged cache of one rank and the block table that addresses it.
#[derive(Debug, Clone, Copy)]
pub struct PagedCache<'a> {
    /// int32 [batch, block_table_stride].
    pub block_table: &'a [i32],
    pub block_table_stride: usize,
    pub batch: usize,
    /// Valid columns of the block table (≤ block_table_stride).
    pub max_pages: usize,
    pub num_pages: usize,
    /// B: tokens per page.
    pub block_size: usize,
    pub format: KvFormat,
}

/// Where token `pos` of request `req` lives on rank `rank`, as a slot index page·B + slot;
/// `None` when another rank owns it or the block table does not map it to a valid page.
pub fn slot_of(cache: &PagedCache, dcp: DcpLayout, rank: usize, req: i32, pos: i32) -> Option<usize> {
    if pos < 0 || req < 0 || req as usize >= cache.batch {
        return None;
    }
    if dcp.owner(pos as u64) != rank {
        return None;
    }
    let local = dcp.local(pos as u64) as usize;
    let col = local / cache.block_size;
    if col >= cache.max_pages {
        return None;
    }
    let page = cache.block_table[req as usize * cache.block_table_stride + col];
    if page < 0 || page as usize >= cache.num_pages {
        return None;
    }
    Some(page as usize * cache.block_size + local % cache.block_size)
}

/// Writes each token this rank owns into `bytes` (the cache tensor as raw little-endian bytes:
/// [num_pages, B, 576] bf16 or [num_pages, B, 656] u8). Every other byte is left untouched.
pub fn fill(input: &FillInput, cache: &PagedCache, dcp: DcpLayout, rank: usize, bytes: &mut [u8]) {
    let row_bytes = cache.format.token_bytes();
    assert_eq!(bytes.len(), cache.num_pages * cache.block_size * row_bytes, "cache size");
    assert_eq!(input.req_idx.len(), input.positions.len());
    for (t, (&req, &pos)) in input.req_idx.iter().zip(input.positions).enumerate() {
        let Some(slot) = slot_of(cache, dcp, rank, req, pos) else { continue };
        let ckv = &input.ckv[t * input.ckv_stride..][..D_LATENT];
        let kpe = &input.kpe[t * input.kpe_stride..][..D_ROPE];
        let row = &mut bytes[slot * row_bytes..(slot + 1) * row_bytes];
        match cache.format {
            KvFormat::Bf16 => {
                let mut vals = [bf16::ZERO; D_QK];
                encode_bf16_row(ckv, kpe, &mut vals);
                for (i, v) in vals.iter().enumerate() {
                    row[2 * i..2 * i + 2].copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
            KvFormat::Fp8_656 => encode_fp8_row(ckv, kpe, row),
        }
    }
}
