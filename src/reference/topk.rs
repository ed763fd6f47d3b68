//! Sparse top-k under DCP (docs/contract.md §6): local top-k, candidate packing, the global merge and
//! the compaction back to each rank's local (or page) addresses. All bit-exact definitions.
//!
//! The order key everywhere: score descending, then index (local or global id) ascending. NaN
//! counts as −inf and −0.0 equals +0.0 (a radix-select kernel canonicalises both before building
//! its keys).

use crate::planner::DcpLayout;
use std::cmp::Ordering;

/// The score as the order key sees it: NaN → −inf, −0 → +0.
fn key(score: f32) -> f32 {
    if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score + 0.0
    }
}

/// `a` before `b` when its score is higher, or equal with a smaller index.
fn better(a: (f32, i64), b: (f32, i64)) -> Ordering {
    key(b.0).partial_cmp(&key(a.0)).expect("keys are never NaN").then(a.1.cmp(&b.1))
}

/// Local top-k of `rows` rows of `scores` (row r starts at r·row_stride, 64-bit offsets, of
/// which the first `cols` ≤ row_stride are the row's). Row r considers indices 0..len\[r\], len
/// clamped to [0, cols] (the kernel's rule: columns past `cols` are never read). Output [rows, k]
/// int32: if len ≤ k, 0..len−1 then −1; otherwise the k best by the key, in ascending index order.
pub fn local_topk(scores: &[f32], rows: usize, row_stride: usize, cols: usize, lens: &[i32], k: usize) -> Vec<i32> {
    assert!(lens.len() >= rows, "one length per row");
    assert!(cols <= row_stride, "cols ≤ row_stride");
    let mut out = vec![-1i32; rows * k];
    let mut cand: Vec<i64> = Vec::new();
    for r in 0..rows {
        let len = (lens[r].max(0) as usize).min(cols);
        let dst = &mut out[r * k..(r + 1) * k];
        if len <= k || k == 0 {
            for (i, o) in dst.iter_mut().take(len).enumerate() {
                *o = i as i32;
            }
            continue;
        }
        let row = &scores[r * row_stride..r * row_stride + len];
        cand.clear();
        cand.extend(0..len as i64);
        cand.select_nth_unstable_by(k - 1, |&a, &b| better((row[a as usize], a), (row[b as usize], b)));
        let best = &mut cand[..k];
        best.sort_unstable();
        for (o, &i) in dst.iter_mut().zip(best.iter()) {
            *o = i as i32;
        }
    }
    out
}

/// Packs rank `rank`'s local top-k `local_idx` [rows, k] into candidates (score, global id):
/// score = scores[row·row_stride + l] copied bit for bit (a NaN stays NaN), id = global(l, rank);
/// an unused entry (negative, or l ≥ cols: outside the row) becomes (−inf, −1), as the kernel
/// does. Ids are stored as int bits, never as floats.
pub fn pack_candidates(
    local_idx: &[i32],
    scores: &[f32],
    row_stride: usize,
    cols: usize,
    k: usize,
    dcp: DcpLayout,
    rank: usize,
) -> (Vec<f32>, Vec<i32>) {
    let mut s = vec![f32::NEG_INFINITY; local_idx.len()];
    let mut ids = vec![-1i32; local_idx.len()];
    for (i, &l) in local_idx.iter().enumerate() {
        if l < 0 || l as usize >= cols {
            continue;
        }
        let row = i / k;
        s[i] = scores[row * row_stride + l as usize];
        ids[i] = i32::try_from(dcp.global(l as u64, rank)).expect("global ids fit int32 (the planner checks)");
    }
    (s, ids)
}

/// The global merge of the D ranks' candidates `cand_scores`/`cand_ids` [D, rows, k]
/// (rank-major): per row, if at most k candidates are valid (id ≥ 0), all of them in candidate
/// order then −1; otherwise the exact top k by (score descending, id ascending), emitted in
/// candidate order (rank r, then position j). Ids are distinct in any real input; should two
/// candidates tie on both score and id, the earlier one wins. Output [rows, k].
pub fn global_merge(cand_scores: &[f32], cand_ids: &[i32], d: usize, rows: usize, k: usize) -> Vec<i32> {
    assert_eq!(cand_scores.len(), d * rows * k, "cand_scores is [D, rows, K]");
    assert_eq!(cand_ids.len(), d * rows * k, "cand_ids is [D, rows, K]");
    let mut out = vec![-1i32; rows * k];
    let mut valid: Vec<usize> = Vec::with_capacity(d * k);
    for row in 0..rows {
        valid.clear();
        valid.extend((0..d).flat_map(|r| (0..k).map(move |j| (r * rows + row) * k + j)).filter(|&c| cand_ids[c] >= 0));
        let dst = &mut out[row * k..(row + 1) * k];
        if valid.len() > k && k > 0 {
            let mut ranked = valid.clone();
            ranked.select_nth_unstable_by(k - 1, |&a, &b| {
                better((cand_scores[a], cand_ids[a] as i64), (cand_scores[b], cand_ids[b] as i64)).then(a.cmp(&b))
            });
            ranked.truncate(k);
            // flat offsets of one row increase in candidate order (rank, then position)
            ranked.sort_unstable();
            valid = ranked;
        }
        for (o, &c) in dst.iter_mut().zip(&valid) {
            *o = cand_ids[c];
        }
    }
    out
}

/// The block table a compaction translates through: local position l of the request of row
/// `row` becomes `block_table[(row / rows_per_request)·stride + l / block_size]·block_size +
/// l % block_size`. A column l / block_size ≥ stride or a negative page gives −1.
#[derive(Debug, Clone, Copy)]
pub struct PageTranslate<'a> {
    pub block_table: &'a [i32],
    pub stride: usize,
    pub block_size: usize,
    /// q: query rows per request; row i belongs to request i / q.
    pub rows_per_request: usize,
}

/// Compaction for rank `rank` of the merged global ids `ids` [rows, k]: keeps the ids this rank
/// owns, in order, as local positions (or, with `translate`, page·B + slot), compacted to the
/// front and padded with −1; also returns per-row counts of the kept ids. An owned id whose
/// translation fails stays in place as −1 and is counted (attention skips −1 anyway).
pub fn compact(
    ids: &[i32],
    k: usize,
    dcp: DcpLayout,
    rank: usize,
    translate: Option<PageTranslate>,
) -> (Vec<i32>, Vec<i32>) {
    assert_eq!(ids.len() % k.max(1), 0, "ids is [rows, K]");
    let rows = ids.len().checked_div(k).unwrap_or(0);
    let mut out = vec![-1i32; ids.len()];
    let mut counts = vec![0i32; rows];
    for row in 0..rows {
        let mut n = 0;
        for &g in &ids[row * k..(row + 1) * k] {
            if g < 0 || dcp.owner(g as u64) != rank {
                continue;
            }
            let l = dcp.local(g as u64);
            out[row * k + n] = match translate {
                None => l as i32,
                Some(t) => translate_local(&t, row, l),
            };
            n += 1;
        }
        counts[row] = n as i32;
    }
    (out, counts)
}

fn translate_local(t: &PageTranslate, row: usize, l: u64) -> i32 {
    let col = (l / t.block_size as u64) as usize;
    if col >= t.stride {
        return -1;
    }
    let page = t.block_table[(row / t.rows_per_request) * t.stride + col];
    if page < 0 {
        return -1;
    }
    i32::try_from(page as u64 * t.block_size as u64 + l % t.block_size as u64).unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_topk_ties_nan_and_short_rows() {
        let scores = [1.0, f32::NAN, 3.0, 3.0, -0.0, 0.0, f32::NEG_INFINITY, 2.0];
        // k = 3: best are 2, 3 (3.0), 7 (2.0)
        assert_eq!(local_topk(&scores, 1, 8, 8, &[8], 3), vec![2, 3, 7]);
        // -0 == +0 and NaN == -inf: the lower index wins the tie
        assert_eq!(local_topk(&scores[4..7], 1, 3, 3, &[3], 1), vec![0]);
        assert_eq!(local_topk(&[0.0, -0.0], 1, 2, 2, &[2], 1), vec![0]);
        assert_eq!(local_topk(&[f32::NAN, f32::NEG_INFINITY], 1, 2, 2, &[2], 1), vec![0]);
        assert_eq!(local_topk(&scores, 1, 8, 8, &[2], 3), vec![0, 1, -1]);
        assert_eq!(local_topk(&scores, 1, 8, 8, &[-5], 2), vec![-1, -1]);
        // a length past cols is clamped to cols, not to the row stride (the kernel never reads
        // columns past cols)
        assert_eq!(local_topk(&scores, 1, 8, 5, &[8], 3), local_topk(&scores, 1, 8, 5, &[5], 3));
        assert_eq!(local_topk(&scores, 1, 8, 5, &[8], 8), vec![0, 1, 2, 3, 4, -1, -1, -1]);
        // pack: an index at or past cols is an unused slot, never a read past the row
        let (s, ids) = pack_candidates(&[1, 5, 7, -1], &scores, 8, 5, 4, DcpLayout { size: 1, interleave: 1 }, 0);
        assert_eq!(ids, vec![1, -1, -1, -1]);
        assert!(s[0].is_nan() && s[1..].iter().all(|&x| x == f32::NEG_INFINITY));
    }

    #[test]
    fn compaction_of_the_issue_case() {
        let dcp = DcpLayout { size: 2, interleave: 1 };
        let (ids, counts) = compact(&[1, 8, 3, -1, 6, 4], 6, dcp, 0, None);
        assert_eq!(ids, vec![4, 3, 2, -1, -1, -1]);
        assert_eq!(counts, vec![3]);
        // translated: local 4 -> page col 1 (B = 4), slot 0; the table maps col 1 to page 9
        let t = PageTranslate { block_table: &[5, 9], stride: 2, block_size: 4, rows_per_request: 1 };
        let (ids, _) = compact(&[1, 8, 3, -1, 6, 4, 16, -1], 8, dcp, 0, Some(t));
        // 16 -> local 8 -> column 2 beyond the table -> -1 in place
        assert_eq!(ids, vec![36, 23, 22, -1, -1, -1, -1, -1]);
    }

    #[test]
    fn global_merge_keeps_candidate_order() {
        // D = 2, rows = 1, K = 2: candidates (5.0, 10), (1.0, 3) | (5.0, 4), (-1, -1)
        let s = [5.0, 1.0, 5.0, f32::NEG_INFINITY];
        let ids = [10, 3, 4, -1];
        // 3 valid > K: top 2 are (5, 4) and (5, 10); candidate order puts 10 first
        assert_eq!(global_merge(&s, &ids, 2, 1, 2), vec![10, 4]);
        assert_eq!(global_merge(&s, &[10, -1, 4, -1], 2, 1, 2), vec![10, 4]);
    }
}
