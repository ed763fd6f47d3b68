//! Decode attention on one rank (docs/contract.md §4), dense and sparse, over a paged BF16 or FP8-656
//! cache. `decode::<f32>` upcasts bf16 inputs and accumulates in f32 (the kernels' precision);
//! `decode::<f64>` is the oracle for tolerance checks.
//!
//! Row (i, j) of query q [b, q, H, 576] bf16 gives out [b, q, H, 512] and lse [b, q, H] in
//! natural log: s_k = σ·(q·k_k) over 576 dims, out = Σ softmax(s)_k·v_k (v = the first 512
//! values of the token row), lse = ln Σ exp(s_k). A row that sees no token gives out = 0 and
//! lse = −inf (FlashMLA gives +inf; the merge accepts both). Never NaN for finite inputs; a row
//! that reads a NaN (in q, or in the k or v part of a token row) is NaN in every out element
//! and in its lse.

use super::fill::PagedCache;
use super::real::Real;
use crate::formats::{decode_fp8_row, KvFormat, D_QK, D_V};
use crate::planner::local_slot;
use half::bf16;

/// The sink arithmetic ([`crate::reference::sink`]), also named here where it was first.
pub use super::sink::{apply_sink, apply_sink_oracle, sink_factor};

/// The shape of the queries: `batch` requests of `rows` query rows (q) of `heads` heads (H).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryShape {
    pub batch: usize,
    pub rows: usize,
    pub heads: usize,
}

/// Which tokens each row attends to.
#[derive(Debug, Clone, Copy)]
pub enum Selection<'a> {
    /// int32 \[b, q\]: row (i, j) attends to the first lens\[i\]\[j\] local tokens of request i, in
    /// local order, through the block table (a negative length is 0). A token whose column lies
    /// beyond `max_pages` or whose page is negative or ≥ num_pages is skipped, never read.
    Dense { lens: &'a [i32] },
    /// int32 [b, q, k]: row (i, j) attends to the tokens at addresses page·B + slot listed in
    /// indices\[i\]\[j\]; an entry outside [0, num_pages·B) (−1 included) is unused. With `topk_len`
    /// \[b, q\], only the first topk_len\[i\]\[j\] entries (clamped to \[0, k\]) count. A repeated
    /// address counts once per entry.
    Sparse { indices: &'a [i32], k: usize, topk_len: Option<&'a [i32]> },
}

/// The default softmax scale 576^-0.5.
pub fn default_scale() -> f32 {
    1.0 / (D_QK as f32).sqrt()
}

/// One token row of the cache as 576 values (FP8-656 dequantised exactly).
fn read_row(bytes: &[u8], format: KvFormat, slot: usize) -> [f32; D_QK] {
    let n = format.token_bytes();
    let src = &bytes[slot * n..(slot + 1) * n];
    match format {
        KvFormat::Bf16 => {
            let mut row = [0.0f32; D_QK];
            for (o, b) in row.iter_mut().zip(src.chunks(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
            row
        }
        KvFormat::Fp8_656 => decode_fp8_row(src),
    }
}

/// Decode attention of every row: returns out [b, q, H, 512] and lse [b, q, H] (natural log).
/// `bytes` is this rank's cache [num_pages, B, token_bytes] as `cache` describes it.
pub fn decode<T: Real>(
    q: &[bf16],
    shape: QueryShape,
    cache: &PagedCache,
    bytes: &[u8],
    sel: &Selection,
    scale: f32,
) -> (Vec<T>, Vec<T>) {
    let (out, lse, _) = attention_rows::<T>(q, shape, cache, bytes, sel, scale, false);
    (out, lse)
}

/// [`decode`]'s body; with `mean_abs`, also A [b, q, H, 512]: A_c = Σ_k p_k·|v_kc| / Σ_k p_k,
/// the softmax-weighted mean of |v| that docs/contract.md §9's elementwise bound is relative to (0 for an
/// empty row); without, A is empty and not computed (the f32 model the demo runs at scale).
fn attention_rows<T: Real>(
    q: &[bf16],
    shape: QueryShape,
    cache: &PagedCache,
    bytes: &[u8],
    sel: &Selection,
    scale: f32,
    mean_abs: bool,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let QueryShape { batch, rows, heads } = shape;
    assert_eq!(q.len(), batch * rows * heads * D_QK, "q is [b, q, H, 576]");
    assert!(bytes.len() >= cache.num_pages * cache.block_size * cache.format.token_bytes(), "cache bytes");
    let slots_total = cache.num_pages * cache.block_size;
    let mut out = vec![T::ZERO; batch * rows * heads * D_V];
    let mut abs_v = vec![T::ZERO; if mean_abs { batch * rows * heads * D_V } else { 0 }];
    let mut lse = vec![T::NEG_INFINITY; batch * rows * heads];
    let mut kv: Vec<[f32; D_QK]> = Vec::new();
    let mut picked: Vec<usize> = Vec::new();
    for i in 0..batch {
        // Dense rows of one request read their common prefix once.
        let mut dense_rows: Vec<Option<[f32; D_QK]>> = Vec::new();
        if let Selection::Dense { lens } = sel {
            let longest = (0..rows).map(|j| lens[i * rows + j].max(0) as usize).max().unwrap_or(0);
            let table = &cache.block_table[i * cache.block_table_stride..][..cache.max_pages];
            dense_rows = (0..longest)
                .map(|l| {
                    local_slot(table, cache.block_size, cache.num_pages, l as u64)
                        .map(|s| read_row(bytes, cache.format, s as usize))
                })
                .collect();
        }
        for j in 0..rows {
            let row = i * rows + j;
            kv.clear();
            match sel {
                Selection::Dense { lens } => {
                    let len = lens[row].max(0) as usize;
                    kv.extend(dense_rows[..len].iter().flatten());
                }
                Selection::Sparse { indices, k, topk_len } => {
                    let used = topk_len.map_or(*k, |t| (t[row].max(0) as usize).min(*k));
                    picked.clear();
                    picked.extend(
                        indices[row * k..row * k + used]
                            .iter()
                            .filter(|&&x| x >= 0 && (x as usize) < slots_total)
                            .map(|&x| x as usize),
                    );
                    kv.extend(picked.iter().map(|&s| read_row(bytes, cache.format, s)));
                }
            }
            for h in 0..heads {
                let qh = &q[(row * heads + h) * D_QK..][..D_QK];
                let o = &mut out[(row * heads + h) * D_V..][..D_V];
                let a = mean_abs.then(|| &mut abs_v[(row * heads + h) * D_V..][..D_V]);
                lse[row * heads + h] = attend(qh, &kv, T::from_f32(scale), o, a);
            }
        }
    }
    (out, lse, abs_v)
}

/// Softmax attention of one query head over `kv` into `out`, and when asked the softmax-weighted
/// mean of |v| into `mean_abs` (both left 0 when kv is empty); returns the natural-log lse (−inf
/// when empty).
/// Each kv row holds the token's d_qk values (576, or 512 for MODEL1) with v its first 512; q has
/// the same length as a row.
pub(crate) fn attend<T: Real, R: AsRef<[f32]>>(
    q: &[bf16],
    kv: &[R],
    scale: T,
    out: &mut [T],
    mut mean_abs: Option<&mut [T]>,
) -> T {
    if kv.is_empty() {
        return T::NEG_INFINITY;
    }
    let qf: Vec<T> = q.iter().map(|x| T::from_f32(x.to_f32())).collect();
    let s: Vec<T> = kv
        .iter()
        .map(|k| {
            let k = k.as_ref();
            debug_assert_eq!(k.len(), qf.len(), "q and k rows have the same length");
            let mut dot = T::ZERO;
            for (&a, &b) in qf.iter().zip(k.iter()) {
                dot += a * T::from_f32(b);
            }
            scale * dot
        })
        .collect();
    let m = s.iter().fold(T::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    let mut sum = T::ZERO;
    for (&sk, k) in s.iter().zip(kv) {
        let k = k.as_ref();
        let p = (sk - m).exp();
        sum += p;
        for (o, &v) in out.iter_mut().zip(&k[..D_V]) {
            *o += p * T::from_f32(v);
        }
        if let Some(a) = mean_abs.as_deref_mut() {
            for (a, &v) in a.iter_mut().zip(&k[..D_V]) {
                *a += p * T::from_f32(v).abs();
            }
        }
    }
    for o in out.iter_mut() {
        *o = *o / sum;
    }
    if let Some(a) = mean_abs {
        for a in a.iter_mut() {
            *a = *a / sum;
        }
    }
    // docs/contract.md §9: a NaN anywhere in what the row read (q, k or only v) makes its whole out and its
    // lse NaN; a NaN in v alone would otherwise leave the lse finite and the merge would keep it
    if sum.is_nan() || out.iter().any(|o| o.is_nan()) {
        out.fill(T::NAN);
        return T::NAN;
    }
    m + sum.ln()
}

/// The fp64 oracle of docs/contract.md §9's attention tolerance: out, lse and A (A_c = Σ_k p_k·|v_kc| /
/// Σ_k p_k, the softmax-weighted mean of |v|; 0 for an empty row), for
/// [`crate::reference::tolerance::check_attention`].
pub fn decode_oracle(
    q: &[bf16],
    shape: QueryShape,
    cache: &PagedCache,
    bytes: &[u8],
    sel: &Selection,
    scale: f32,
) -> crate::reference::tolerance::AttentionOracle {
    let (out, lse, mean_abs_v) = attention_rows::<f64>(q, shape, cache, bytes, sel, scale, true);
    crate::reference::tolerance::AttentionOracle { out, lse, mean_abs_v }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request, B = 2, two pages mapped 1 → 0 and 0 → 1; tokens carry constant rows.
    #[test]
    fn dense_sparse_and_empty_rows() {
        let b = 2;
        let table = [1, 0];
        let cache = PagedCache {
            block_table: &table,
            block_table_stride: 2,
            batch: 1,
            max_pages: 2,
            num_pages: 2,
            block_size: b,
            format: KvFormat::Bf16,
        };
        let mut bytes = vec![0u8; 2 * b * D_QK * 2];
        // local token l at slot table[l / 2]·2 + l % 2, value l + 1 in every channel
        for l in 0..4usize {
            let slot = table[l / b] as usize * b + l % b;
            for e in 0..D_QK {
                bytes[(slot * D_QK + e) * 2..][..2]
                    .copy_from_slice(&bf16::from_f32(l as f32 + 1.0).to_bits().to_le_bytes());
            }
        }
        let q = vec![bf16::ZERO; 3 * D_QK]; // zero query: uniform softmax
        let shape = QueryShape { batch: 1, rows: 3, heads: 1 };
        let (out, lse) = decode::<f64>(&q, shape, &cache, &bytes, &Selection::Dense { lens: &[0, 1, 4] }, 0.1);
        assert!(out[..D_V].iter().all(|&x| x == 0.0) && lse[0] == f64::NEG_INFINITY);
        assert_eq!(out[D_V], 1.0);
        assert_eq!(lse[1], 0.0);
        assert!((out[2 * D_V] - 2.5).abs() < 1e-12 && (lse[2] - 4f64.ln()).abs() < 1e-12);
        // sparse: slot 0 holds local 2 (value 3); -1, out-of-range and entries past topk_len are unused
        let idx = [0, -1, 99, 3, 3, 0, -1, -1, 2, 2, 2, 2];
        let sel = Selection::Sparse { indices: &idx, k: 4, topk_len: Some(&[4, 1, 4]) };
        let (out, lse) = decode::<f32>(&q, shape, &cache, &bytes, &sel, 0.1);
        // row 0: slots 0 (value 3) and 3 (local 1, value 2) -> 2.5
        assert_eq!(out[0], 2.5);
        assert_eq!(out[D_V], 2.0); // row 1: only the first entry (slot 3)
        assert_eq!(out[2 * D_V], 1.0); // row 2: slot 2 (local 0) four times
        assert!((lse[2] - 4f32.ln()).abs() < 1e-6);
    }
}
