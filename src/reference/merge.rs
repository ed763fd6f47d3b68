//! The DCP combine (docs/contract.md §5) in its three shapes: the plain merge of D partials, the
//! all-gather + reduce-scatter (ag_rs) split, the all-to-all (a2a) packed buffers, and the
//! two-way merge of chunked prefill.
//!
//! Each combine also takes an optional per-head attention sink (docs/contract.md §4, its last
//! argument): applied once, in its last step, to the merged result
//! ([`crate::reference::sink::apply_sink`]); `None` applies none.
//!
//! Every function takes the base of its input lse explicitly and returns natural logs. A base-2
//! lse is converted as `lse · ln 2`, multiplied in the working precision (f32 for `merge::<f32>`)
//! before the maximum is taken; a kernel does the same multiply before its max.

use super::sink::apply_sink;
use crate::formats::{LseBase, D_V};
use half::bf16;

/// The working precision, [`crate::reference::real::Real`], also named here where it was first.
pub use super::real::Real;

/// λ of docs/contract.md §5: the lse in natural log, with +inf (an empty shard, FlashMLA style) mapped to
/// −inf. NaN stays NaN (revised 2026-12-01): a NaN lse means a NaN reached that shard's inputs.
pub fn natural_lse<T: Real>(lse: T, base: LseBase) -> T {
    let l = match base {
        LseBase::E => lse,
        LseBase::Two => lse * T::LN_2,
    };
    if l == T::INFINITY {
        T::NEG_INFINITY
    } else {
        l
    }
}

/// The merge coefficients of one output row: `coef[r] = w_r / S` (0 where w_r = 0 or where every
/// shard is empty) and the merged natural-log lse `M + ln S` (−inf when every shard is empty).
/// If any λ is NaN, every coefficient and the merged lse are NaN (so is the merged out).
pub fn merge_weights<T: Real>(lses: impl IntoIterator<Item = T>, base: LseBase, coef: &mut Vec<T>) -> T {
    coef.clear();
    coef.extend(lses.into_iter().map(|l| natural_lse(l, base)));
    if coef.iter().any(|c| c.is_nan()) {
        coef.iter_mut().for_each(|c| *c = T::NAN);
        return T::NAN;
    }
    let m = coef.iter().fold(T::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    if m == T::NEG_INFINITY {
        coef.iter_mut().for_each(|c| *c = T::ZERO);
        return T::NEG_INFINITY;
    }
    let mut s = T::ZERO;
    for c in coef.iter_mut() {
        *c = (*c - m).exp();
        s += *c;
    }
    for c in coef.iter_mut() {
        *c = *c / s;
    }
    m + s.ln()
}

/// Merges D partial results of n rows: `out` [D, n, 512] and `lse` [D, n] in `base`. Returns the
/// merged out \[n, 512\] and lse \[n\] (natural log), exactly docs/contract.md §5. `merge::<f32>` is the
/// bit-level model of the kernels; [`merge_f64`] is the oracle. With an attention `sink` per head
/// it is applied once to the merged rows: the n rows are laid out [.., H] (head = row mod H) with
/// H = `sink.len()`, which must divide n. The merged lse is returned unchanged by the sink (it
/// describes the tokens only), so D partials merged with the sink equal one rank's attention over
/// all tokens with the sink.
pub fn merge<T: Real>(
    out: &[T],
    lse: &[T],
    d: usize,
    n: usize,
    base: LseBase,
    sink: Option<&[f32]>,
) -> (Vec<T>, Vec<T>) {
    assert_eq!(out.len(), d * n * D_V, "out is [D, n, 512]");
    assert_eq!(lse.len(), d * n, "lse is [D, n]");
    if n == 0 {
        return (Vec::new(), Vec::new());
    }
    let outs: Vec<&[T]> = out.chunks(n * D_V).collect();
    let lses: Vec<&[T]> = lse.chunks(n).collect();
    let (mut o, l) = merge_parts(&outs, &lses, n, base);
    if let Some(s) = sink {
        apply_sink(&mut o, &l, s);
    }
    (o, l)
}

/// [`merge`] in f64 from f32 partials: the oracle a kernel's fp32 merge is compared against.
pub fn merge_f64(out: &[f32], lse: &[f32], d: usize, n: usize, base: LseBase) -> (Vec<f64>, Vec<f64>) {
    let out: Vec<f64> = out.iter().map(|&x| x as f64).collect();
    let lse: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
    merge(&out, &lse, d, n, base, None)
}

/// The merge over separately stored partials: `outs[r]` [n, 512], `lses[r]` [n].
fn merge_parts<T: Real>(outs: &[&[T]], lses: &[&[T]], n: usize, base: LseBase) -> (Vec<T>, Vec<T>) {
    let mut out = vec![T::ZERO; n * D_V];
    let mut lse = vec![T::ZERO; n];
    let mut coef = Vec::with_capacity(outs.len());
    for i in 0..n {
        lse[i] = merge_weights(lses.iter().map(|l| l[i]), base, &mut coef);
        let row = &mut out[i * D_V..(i + 1) * D_V];
        for (r, &c) in coef.iter().enumerate() {
            if c == T::ZERO {
                continue;
            }
            for (o, &x) in row.iter_mut().zip(&outs[r][i * D_V..(i + 1) * D_V]) {
                *o += c * x;
            }
        }
    }
    (out, lse)
}

/// The two-way merge of chunked prefill (docs/contract.md §5.3): (out_a, lse_a) + (out_b, lse_b), each
/// out \[n, 512\] f32 and lse \[n\] in its own base; fp32 out and natural-log lse, cast once at the
/// end. Each lse is first taken to λ (natural log; +inf as empty, NaN kept), then the two are
/// weighted as natural logs.
///
/// With an attention `sink` per head, applied to the result (rows [.., H], H = `sink.len()`): in a
/// chain of chunk merges it belongs on the last merge only; the running result stays without the
/// sink, or the sink would enter the softmax once per chunk.
pub fn merge_two(
    out_a: &[f32],
    lse_a: &[f32],
    base_a: LseBase,
    out_b: &[f32],
    lse_b: &[f32],
    base_b: LseBase,
    sink: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let n = lse_a.len();
    assert_eq!(lse_b.len(), n, "lse_b has as many rows as lse_a");
    assert_eq!(out_a.len(), n * D_V, "out_a is [n, 512]");
    assert_eq!(out_b.len(), n * D_V, "out_b is [n, 512]");
    let lam_a: Vec<f32> = lse_a.iter().map(|&l| natural_lse(l, base_a)).collect();
    let lam_b: Vec<f32> = lse_b.iter().map(|&l| natural_lse(l, base_b)).collect();
    let (mut o, l) = merge_parts(&[out_a, out_b], &[&lam_a, &lam_b], n, LseBase::E);
    if let Some(s) = sink {
        apply_sink(&mut o, &l, s);
    }
    (o, l)
}

/// Rounds f32 to bf16, to nearest even (NaN stays NaN): the final cast of every merge shape.
pub fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// ag_rs step 1 on rank `rank`: its fp32 contribution, head-major [H, T, 512], equal to
/// (w_r / S)·out_r, and exactly 0 where w_r = 0. `out_r` is this rank's partial [T, H, 512]
/// (upcast to f32), `lse_all` the all-gathered lse [D, T, H] in `base`.
pub fn ag_rs_contribution(
    rank: usize,
    out_r: &[f32],
    lse_all: &[f32],
    d: usize,
    t: usize,
    h: usize,
    base: LseBase,
) -> Vec<f32> {
    assert!(rank < d, "rank below D");
    assert_eq!(lse_all.len(), d * t * h, "lse_all is [D, T, H]");
    assert_eq!(out_r.len(), t * h * D_V, "out_r is [T, H, 512]");
    let mut contrib = vec![0.0f32; h * t * D_V];
    let mut coef = Vec::with_capacity(d);
    for ti in 0..t {
        for hi in 0..h {
            merge_weights((0..d).map(|r| lse_all[(r * t + ti) * h + hi]), base, &mut coef);
            let c = coef[rank];
            if c == 0.0 {
                continue;
            }
            let src = &out_r[(ti * h + hi) * D_V..][..D_V];
            let dst = &mut contrib[(hi * t + ti) * D_V..][..D_V];
            for (o, &x) in dst.iter_mut().zip(src) {
                *o = c * x;
            }
        }
    }
    contrib
}

/// The reduce-scatter over heads, modelled on the host: rank `rank` receives the sum over
/// source ranks 0..D−1 (in order, fp32) of their contributions' heads [rank·H_l, (rank+1)·H_l).
/// `contribs[r]` is rank r's [H, T, 512]; the result is [H_l, T, 512].
pub fn reduce_scatter(contribs: &[Vec<f32>], rank: usize, h_l: usize, t: usize) -> Vec<f32> {
    let span = h_l * t * D_V;
    let mut sum = vec![0.0f32; span];
    for c in contribs {
        for (o, &x) in sum.iter_mut().zip(&c[rank * span..(rank + 1) * span]) {
            *o += x;
        }
    }
    sum
}

/// ag_rs step 2: from the reduce-scattered sum [H_l, T, 512] of this rank's heads
/// [head_offset, head_offset + H_l), the output [T, H_l, 512] (fp32; cast with [`to_bf16`]) and
/// lse [T, H_l] natural log. `lse_all` is [D, T, H].
///
/// With an attention `sink` per head, applied after the merge to the fp32 result before any
/// cast: `sink` \[H_l\] holds the sinks of this rank's heads, sink\[j\] for head head_offset + j
/// (a TP rank's own shard of the model's sinks). Ranks' contributions carry no sink; only this
/// last step applies it.
#[allow(clippy::too_many_arguments)]
pub fn ag_rs_finish(
    summed: &[f32],
    lse_all: &[f32],
    d: usize,
    t: usize,
    h_l: usize,
    base: LseBase,
    head_offset: usize,
    sink: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(summed.len(), h_l * t * D_V, "summed is [H_l, T, 512]");
    if let Some(s) = sink {
        assert_eq!(s.len(), h_l, "sink is [H_l]: one per head of this rank");
    }
    assert_eq!(lse_all.len() % (d * t).max(1), 0, "lse_all is [D, T, H]");
    let h = lse_all.len().checked_div(d * t).unwrap_or(0);
    assert!(head_offset + h_l <= h, "heads [head_offset, head_offset + H_l) lie within H");
    let mut out = vec![0.0f32; t * h_l * D_V];
    let mut lse = vec![0.0f32; t * h_l];
    let mut coef = Vec::with_capacity(d);
    for ti in 0..t {
        for hl in 0..h_l {
            let hi = head_offset + hl;
            lse[ti * h_l + hl] = merge_weights((0..d).map(|r| lse_all[(r * t + ti) * h + hi]), base, &mut coef);
            out[(ti * h_l + hl) * D_V..][..D_V].copy_from_slice(&summed[(hl * t + ti) * D_V..][..D_V]);
        }
    }
    if let Some(s) = sink {
        apply_sink(&mut out, &lse, s);
    }
    (out, lse)
}

/// Bytes of one a2a slot: `[T × H_l × 512 bf16 out][T × H_l fp32 lse]` (the planner's size).
pub use crate::planner::workspace::a2a_slot_bytes;

/// a2a send buffer of one source rank: [D destinations, slot_bytes], destination d carrying
/// heads [d·H_l, (d+1)·H_l) of `out_r` bf16 [T, H, 512] and `lse_r` fp32 [T, H] (copied bit for
/// bit, in whatever base the producer used), out first, lse at byte offset T·H_l·1024.
pub fn a2a_pack(out_r: &[bf16], lse_r: &[f32], d: usize, t: usize, h: usize) -> Vec<u8> {
    assert_eq!(lse_r.len(), t * h, "lse_r is [T, H]");
    assert_eq!(out_r.len(), t * h * D_V, "out_r is [T, H, 512]");
    assert_eq!(h % d, 0, "H = D·H_l");
    let h_l = h / d;
    let slot = a2a_slot_bytes(t, h_l);
    let mut buf = vec![0u8; d * slot];
    for dst in 0..d {
        let s = &mut buf[dst * slot..(dst + 1) * slot];
        let (outs, lses) = s.split_at_mut(t * h_l * D_V * 2);
        for ti in 0..t {
            for hl in 0..h_l {
                let row = ti * h_l + hl;
                let src = (ti * h + dst * h_l + hl) * D_V;
                for (e, v) in out_r[src..src + D_V].iter().enumerate() {
                    outs[(row * D_V + e) * 2..][..2].copy_from_slice(&v.to_bits().to_le_bytes());
                }
                lses[row * 4..][..4].copy_from_slice(&lse_r[ti * h + dst * h_l + hl].to_le_bytes());
            }
        }
    }
    buf
}

/// a2a receive side: `recv` is [D sources, slot_bytes] (slot r as rank r packed it for this
/// rank); the full fp32 merge over the D sources gives out [T, H_l, 512] and lse [T, H_l].
///
/// With an attention `sink` per head, applied to the merged fp32 result: `sink` \[H_l\] holds
/// the sinks of this rank's heads (sink\[j\] for its j-th head, global head rank·H_l + j). The
/// packed slots carry no sink.
pub fn a2a_combine(
    recv: &[u8],
    d: usize,
    t: usize,
    h_l: usize,
    base: LseBase,
    sink: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    if let Some(s) = sink {
        assert_eq!(s.len(), h_l, "sink is [H_l]: one per head of this rank");
    }
    let slot = a2a_slot_bytes(t, h_l);
    assert_eq!(recv.len(), d * slot, "recv is [D, slot_bytes]");
    let n = t * h_l;
    let mut out = Vec::with_capacity(d * n * D_V);
    let mut lse = Vec::with_capacity(d * n);
    for s in recv.chunks(slot.max(1)).take(d) {
        let (outs, lses) = s.split_at(n * D_V * 2);
        out.extend(outs.chunks(2).map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()));
        lse.extend(lses.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())));
    }
    merge(&out, &lse, d, n, base, sink)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(vals: &[f32]) -> Vec<f32> {
        vals.iter().flat_map(|&v| std::iter::repeat_n(v, D_V)).collect()
    }

    #[test]
    fn merge_of_two_equal_lse_averages() {
        let (out, lse) = merge(&rows(&[1.0, 3.0]), &[0.5, 0.5], 2, 1, LseBase::E, None);
        assert!(out.iter().all(|&x| x == 2.0));
        assert!((lse[0] - (0.5 + 2f32.ln())).abs() < 1e-6);
    }

    #[test]
    fn empty_shards_never_leak() {
        // shard 1 is empty (+inf lse, FlashMLA style) with a NaN out; shard 2 −inf with a NaN out
        let (out, lse) =
            merge(&rows(&[2.0, f32::NAN, f32::NAN]), &[1.0, f32::INFINITY, f32::NEG_INFINITY], 3, 1, LseBase::E, None);
        assert!(out.iter().all(|&x| x == 2.0));
        assert_eq!(lse[0], 1.0);
        // a NaN lse is not an empty shard: it makes the merged row NaN (docs/contract.md §5)
        let (out, lse) = merge(&rows(&[2.0, 3.0]), &[1.0, f32::NAN], 2, 1, LseBase::E, None);
        assert!(out.iter().all(|x| x.is_nan()) && lse[0].is_nan());
        let (out, lse) =
            merge(&rows(&[f32::NAN, 5.0]), &[f32::NEG_INFINITY, f32::NEG_INFINITY], 2, 1, LseBase::E, None);
        assert!(out.iter().all(|&x| x == 0.0));
        assert_eq!(lse[0], f32::NEG_INFINITY);
    }

    #[test]
    fn a_sink_enters_the_merged_softmax_once() {
        // two shards of one token each, scores 0: the global softmax with sink 0 is
        // (e^0·1 + e^0·3) / (e^0 + e^0 + e^0) = 4/3; a sink applied to each shard first would
        // give (0.5 + 1.5) / 2 = 1
        let (out, lse) = merge(&rows(&[1.0, 3.0]), &[0.0, 0.0], 2, 1, LseBase::E, Some(&[0.0]));
        assert!(out.iter().all(|&x| (x - 4.0 / 3.0).abs() < 1e-6));
        // the lse describes the tokens only
        assert_eq!(lse[0], 2f32.ln());
    }

    #[test]
    fn base_two_converts_to_natural() {
        let (_, lse) = merge(&rows(&[1.0]), &[3.0], 1, 1, LseBase::Two, None);
        assert_eq!(lse[0], 3.0f32 * std::f32::consts::LN_2);
    }

    #[test]
    fn shapes_agree_with_merge() {
        let (d, t, h_l) = (2, 3, 2);
        let h = d * h_l;
        let outs: Vec<Vec<f32>> =
            (0..d).map(|r| (0..t * h * D_V).map(|i| ((i * 7 + r * 13) % 23) as f32 / 8.0 - 1.0).collect()).collect();
        let lse_all: Vec<f32> = (0..d * t * h).map(|i| (i % 5) as f32 - 2.0).collect();
        // ag_rs
        let contribs: Vec<Vec<f32>> =
            (0..d).map(|r| ag_rs_contribution(r, &outs[r], &lse_all, d, t, h, LseBase::E)).collect();
        let flat: Vec<f32> = outs.concat();
        let (m_out, m_lse) = merge(&flat, &lse_all, d, t * h, LseBase::E, None);
        for rank in 0..d {
            let summed = reduce_scatter(&contribs, rank, h_l, t);
            let (o, l) = ag_rs_finish(&summed, &lse_all, d, t, h_l, LseBase::E, rank * h_l, None);
            for ti in 0..t {
                for hl in 0..h_l {
                    let row = ti * h + rank * h_l + hl;
                    assert_eq!(l[ti * h_l + hl], m_lse[row]);
                    assert_eq!(o[(ti * h_l + hl) * D_V..][..D_V], m_out[row * D_V..][..D_V]);
                }
            }
        }
        // a2a: destination `rank` receives slot `rank` of every source
        let packed: Vec<Vec<u8>> =
            (0..d).map(|r| a2a_pack(&to_bf16(&outs[r]), &lse_all[r * t * h..][..t * h], d, t, h)).collect();
        let slot = a2a_slot_bytes(t, h_l);
        for rank in 0..d {
            let recv: Vec<u8> = packed.iter().flat_map(|p| p[rank * slot..(rank + 1) * slot].to_vec()).collect();
            let (o, l) = a2a_combine(&recv, d, t, h_l, LseBase::E, None);
            for ti in 0..t {
                for hl in 0..h_l {
                    let row = ti * h + rank * h_l + hl;
                    assert_eq!(l[ti * h_l + hl], m_lse[row]);
                    // inputs were exact in bf16 (multiples of 1/8 in [-1, 2)): the merge is identical
                    assert_eq!(o[(ti * h_l + hl) * D_V..][..D_V], m_out[row * D_V..][..D_V]);
                }
            }
        }
    }
}
