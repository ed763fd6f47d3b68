//! MODEL1 sparse decode and its fill (docs/contract.md §3-§4, "MODEL1"): FlashMLA's `d_qk = 512`
//! sparse path over the page-wise FP8 cache of [`crate::formats::model1`], with an optional second
//! source (FlashMLA's `extra_k_cache` and `extra_indices_in_kvcache`).
//!
//! Row (i, j) of q [b, q, H, 512] bf16 attends to the union of two index lists: the entries of
//! the first list, each an address page·B + slot in the first cache, then those of the second
//! list in the second cache (its own B and page stride), all in one softmax. s_k = σ·(q·k_k)
//! over the 512 values, out = Σ softmax(s)_k·v_k with v the whole 512-value row (448 nope +
//! 64 rope), lse = ln Σ exp(s_k) (natural log). Numerics are [`super::attention`]'s: bf16 and
//! dequantised values widened to T, dot products in order over the 512 values then scaled, the
//! first list's entries before the second's; `T = f32` is the kernels' precision, `T = f64` the
//! oracle. Empty rows, NaN rows and sinks ([`super::attention::apply_sink`]) follow §4 as for
//! the 576 path.

use super::attention::{attend, QueryShape};
use super::fill::FillInput;
use super::merge::Real;
use super::tolerance::AttentionOracle;
use crate::formats::model1::{
    decode_model1_token, encode_model1_token, Model1Pages, MODEL1_D_NOPE, MODEL1_D_QK, MODEL1_D_V,
};
use crate::formats::D_ROPE;
use crate::planner::{local_slot, DcpLayout};
use half::bf16;

/// The default softmax scale of the MODEL1 path, 512^-0.5 (FlashMLA's `d_qk^-0.5`).
pub fn model1_default_scale() -> f32 {
    1.0 / (MODEL1_D_QK as f32).sqrt()
}

/// One source of tokens: a MODEL1 cache and the index list that picks from it.
#[derive(Debug, Clone, Copy)]
pub struct Model1Source<'a> {
    /// The cache tensor's bytes; `pages` describes them.
    pub cache: &'a [u8],
    pub pages: Model1Pages,
    /// int32 [b, q, k]: addresses page·B + slot. An entry outside [0, num_pages·B) (−1 included)
    /// is unused and never read; a repeated address counts once per entry.
    pub indices: &'a [i32],
    pub k: usize,
    /// int32 \[b\] (FlashMLA's `topk_length` / `extra_topk_length`): every row of request i uses
    /// only its leftmost topk_len\[i\] entries, clamped to \[0, k\]. None: all k.
    pub topk_len: Option<&'a [i32]>,
}

impl Model1Source<'_> {
    fn check(&self, shape: QueryShape, what: &str) {
        let QueryShape { batch, rows, .. } = shape;
        assert_eq!(self.indices.len(), batch * rows * self.k, "{what}: indices is [b, q, k]");
        assert!(self.cache.len() >= self.pages.cache_bytes(), "{what}: cache bytes");
        if let Some(t) = self.topk_len {
            assert_eq!(t.len(), batch, "{what}: topk_len is [b]");
        }
    }

    /// Appends the rows that query row `row` of request `req` reads from this source, in entry order.
    fn gather(&self, req: usize, row: usize, kv: &mut Vec<[f32; MODEL1_D_QK]>) {
        let used = self.topk_len.map_or(self.k, |t| (t[req].max(0) as usize).min(self.k));
        let slots = self.pages.slots();
        kv.extend(
            self.indices[row * self.k..row * self.k + used]
                .iter()
                .filter(|&&x| x >= 0 && (x as usize) < slots)
                .map(|&x| decode_model1_token(self.cache, &self.pages, x as usize)),
        );
    }
}

/// MODEL1 sparse decode of every row: out [b, q, H, 512] and lse [b, q, H] (natural log), over
/// `main` and, when given, `extra` in the same softmax. No sink: apply one with
/// [`super::attention::apply_sink`] (under DCP, after the combine).
pub fn decode_model1<T: Real>(
    q: &[bf16],
    shape: QueryShape,
    main: &Model1Source,
    extra: Option<&Model1Source>,
    scale: f32,
) -> (Vec<T>, Vec<T>) {
    let (out, lse, _) = model1_rows::<T>(q, shape, main, extra, scale, false);
    (out, lse)
}

/// The fp64 oracle of docs/contract.md §9 for [`decode_model1`]: out, lse and A (the
/// softmax-weighted mean of |v| over the 512 values), for
/// [`crate::reference::tolerance::check_attention`].
pub fn decode_model1_oracle(
    q: &[bf16],
    shape: QueryShape,
    main: &Model1Source,
    extra: Option<&Model1Source>,
    scale: f32,
) -> AttentionOracle {
    let (out, lse, mean_abs_v) = model1_rows::<f64>(q, shape, main, extra, scale, true);
    AttentionOracle { out, lse, mean_abs_v }
}

fn model1_rows<T: Real>(
    q: &[bf16],
    shape: QueryShape,
    main: &Model1Source,
    extra: Option<&Model1Source>,
    scale: f32,
    mean_abs: bool,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let QueryShape { batch, rows, heads } = shape;
    assert_eq!(q.len(), batch * rows * heads * MODEL1_D_QK, "q is [b, q, H, 512]");
    main.check(shape, "main source");
    if let Some(e) = extra {
        e.check(shape, "extra source");
    }
    let n = batch * rows * heads;
    let mut out = vec![T::ZERO; n * MODEL1_D_V];
    let mut abs_v = vec![T::ZERO; if mean_abs { n * MODEL1_D_V } else { 0 }];
    let mut lse = vec![T::NEG_INFINITY; n];
    let mut kv: Vec<[f32; MODEL1_D_QK]> = Vec::new();
    for i in 0..batch {
        for j in 0..rows {
            let row = i * rows + j;
            kv.clear();
            main.gather(i, row, &mut kv);
            if let Some(e) = extra {
                e.gather(i, row, &mut kv);
            }
            for h in 0..heads {
                let r = row * heads + h;
                let qh = &q[r * MODEL1_D_QK..][..MODEL1_D_QK];
                let o = &mut out[r * MODEL1_D_V..][..MODEL1_D_V];
                let a = mean_abs.then(|| &mut abs_v[r * MODEL1_D_V..][..MODEL1_D_V]);
                lse[r] = attend(qh, &kv, T::from_f32(scale), o, a);
            }
        }
    }
    (out, lse, abs_v)
}

/// A rank's MODEL1 cache as the fill addresses it: the block table (shared by the group, §2)
/// and the pages.
#[derive(Debug, Clone, Copy)]
pub struct Model1Cache<'a> {
    /// int32 [batch, block_table_stride].
    pub block_table: &'a [i32],
    pub block_table_stride: usize,
    pub batch: usize,
    /// Valid columns of the block table (≤ block_table_stride).
    pub max_pages: usize,
    pub pages: Model1Pages,
}

impl Model1Cache<'_> {
    /// Where token `pos` of request `req` lives on rank `rank`, as page·B + slot; None when
    /// another rank owns it, the position or request is out of range, or the block table does not
    /// map it to a page of the cache (as [`super::fill::slot_of`]).
    pub fn slot_of(&self, dcp: DcpLayout, rank: usize, req: i32, pos: i32) -> Option<usize> {
        if pos < 0 || req < 0 || req as usize >= self.batch || dcp.owner(pos as u64) != rank {
            return None;
        }
        let row = &self.block_table[req as usize * self.block_table_stride..][..self.max_pages];
        local_slot(row, self.pages.block_size, self.pages.num_pages, dcp.local(pos as u64)).map(|s| s as usize)
    }
}

/// The fill of a MODEL1 cache: writes each token this rank owns into its slot (value row and
/// scale slot, [`encode_model1_token`]); every other byte of `bytes`, the pages' padding included,
/// is left as it was. `input.ckv` rows hold the 448 nope values (ckv_stride ≥ 448), `input.kpe`
/// rows the 64 rope values; a negative position, a request outside the batch or an unmapped page
/// skips the token.
pub fn fill_model1(input: &FillInput, cache: &Model1Cache, dcp: DcpLayout, rank: usize, bytes: &mut [u8]) {
    assert!(bytes.len() >= cache.pages.cache_bytes(), "cache size");
    assert_eq!(input.req_idx.len(), input.positions.len());
    let mut row = [bf16::ZERO; MODEL1_D_QK];
    for (t, (&req, &pos)) in input.req_idx.iter().zip(input.positions).enumerate() {
        let Some(slot) = cache.slot_of(dcp, rank, req, pos) else { continue };
        row[..MODEL1_D_NOPE].copy_from_slice(&input.ckv[t * input.ckv_stride..][..MODEL1_D_NOPE]);
        row[MODEL1_D_NOPE..].copy_from_slice(&input.kpe[t * input.kpe_stride..][..D_ROPE]);
        encode_model1_token(&row, &cache.pages, slot, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::model1::MODEL1_ROW_BYTES;

    /// A page written byte by byte in FlashMLA's layout (not through the encoder), B = 2, two
    /// pages: token s of page p has every nope code 0x38 (1.0) with scale byte 127 + s + 2p on
    /// every tile, and rope values p + 0.5 in bf16.
    #[test]
    fn reads_flashmla_layout_written_by_hand() {
        let pages = Model1Pages::new(2, 2);
        let mut cache = vec![0u8; pages.cache_bytes()];
        for p in 0..2usize {
            let base = p * pages.page_stride;
            for s in 0..2usize {
                let row = base + s * MODEL1_ROW_BYTES;
                cache[row..row + 448].fill(0x38);
                for r in 0..64 {
                    let b = bf16::from_f32(p as f32 + 0.5).to_bits().to_le_bytes();
                    cache[row + 448 + 2 * r..row + 450 + 2 * r].copy_from_slice(&b);
                }
                let sc = base + 2 * MODEL1_ROW_BYTES + 8 * s;
                cache[sc..sc + 7].fill((127 + s + 2 * p) as u8);
            }
        }
        assert_eq!(pages.page_stride, 1_728);
        let q = vec![bf16::ZERO; 2 * MODEL1_D_QK]; // zero query: uniform softmax
        let shape = QueryShape { batch: 1, rows: 2, heads: 1 };
        // row 0: slots 3 (page 1, s 1: 2^3) and 0 (2^0); -1, 4 (out of range) unused
        // row 1: slot 1 only, twice (page 0, s 1: 2^1)
        let idx = [3, -1, 0, 4, 1, 1, -1, -1];
        let main = Model1Source { cache: &cache, pages, indices: &idx, k: 4, topk_len: None };
        let (out, lse) = decode_model1::<f64>(&q, shape, &main, None, 0.1);
        assert!(out[..448].iter().all(|&x| x == 4.5), "{}", out[0]);
        assert!(out[448..512].iter().all(|&x| x == 1.0)); // (1.5 + 0.5) / 2
        assert!((lse[0] - 2f64.ln()).abs() < 1e-15);
        assert!(out[512..512 + 448].iter().all(|&x| x == 2.0));
        assert!(out[512 + 448..].iter().all(|&x| x == 0.5));
        // topk_len 1 for the request: row 0 keeps slot 3, row 1 slot 1; an extra source adds
        // slot 2 (page 1, s 0: 2^2, rope 1.5) to row 0 and nothing to row 1 (extra topk_len 1)
        let extra_idx = [2, 1, -1, 0];
        let extra = Model1Source { cache: &cache, pages, indices: &extra_idx, k: 2, topk_len: Some(&[1]) };
        let main = Model1Source { topk_len: Some(&[1]), ..main };
        let (out, lse) = decode_model1::<f32>(&q, shape, &main, Some(&extra), 0.1);
        assert_eq!((out[0], out[448]), (6.0, 1.5));
        assert!((lse[0] - 2f32.ln()).abs() < 1e-6);
        assert_eq!((out[512], out[512 + 448], lse[1]), (2.0, 0.5, 0.0));
        // topk_len 0 everywhere: empty rows, out 0 and lse -inf
        let main = Model1Source { topk_len: Some(&[0]), ..main };
        let extra = Model1Source { topk_len: Some(&[-3]), ..extra };
        let (out, lse) = decode_model1::<f32>(&q, shape, &main, Some(&extra), 0.1);
        assert!(out.iter().all(|&x| x == 0.0) && lse.iter().all(|&l| l == f32::NEG_INFINITY));
    }
}
