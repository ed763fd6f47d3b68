//! Attention sinks (docs/contract.md §4, FlashMLA's `attn_sink`): the factor a per-head sink
//! scales a row's output by, and its application to an attention result or an fp64 oracle. Used
//! by decode attention ([`crate::reference::attention`]) and by every combine given a sink
//! ([`crate::reference::merge`]), after the merge.

use super::real::Real;
use super::tolerance::AttentionOracle;
use crate::formats::D_V;

/// The factor by which an attention sink scales one row's output (docs/contract.md §4):
/// e^lse / (e^lse + e^sink), the share of the row's softmax that its tokens keep once the sink
/// joins the denominator. `lse` is the row's natural-log lse over its tokens, `sink` the head's
/// sink, both in the working precision. Formed from the larger of the two, so it neither
/// overflows nor loses a small share: 1 / (1 + e^(sink − lse)) when lse > sink, else
/// e^(lse − sink) / (e^(lse − sink) + 1).
///
/// - sink = −inf: exactly 1 (the output is unchanged); sink = +inf: exactly 0.
/// - An empty row (lse = −inf, or +inf as FlashMLA writes it): 0 whatever the sink, NaN included.
///   The row reads no token, so its output is the empty sum 0 for every sink.
/// - NaN lse, or a NaN sink on a row that reads tokens: NaN.
pub fn sink_factor<T: Real>(lse: T, sink: T) -> T {
    if lse.is_nan() {
        return T::NAN;
    }
    if lse == T::NEG_INFINITY || lse == T::INFINITY {
        return T::ZERO;
    }
    if sink.is_nan() {
        return T::NAN;
    }
    if lse > sink {
        T::ONE / (T::ONE + (sink - lse).exp())
    } else {
        let a = (lse - sink).exp();
        a / (a + T::ONE)
    }
}

/// Applies per-head attention sinks to an attention result in place (docs/contract.md §4,
/// FlashMLA's `attn_sink`): each row of `out` [n, 512], rows laid out [.., H] (head = row mod H),
/// is multiplied by [`sink_factor`]`(lse[row], sink[head])`; `lse` \[n\] (natural log) describes the
/// tokens only and is left unchanged. `sink` holds one fp32 value per head of the result, H of
/// them (the H_l heads of a rank's combine result; see [`crate::reference::merge::merge`]).
///
/// Exact cases: a sink of −inf leaves out bit for bit; +inf gives out·0 (0, signed as out); an empty
/// row (lse = ±inf) is 0 whatever the sink; a NaN lse, or a NaN sink on a row that reads tokens,
/// makes every element NaN. Under DCP the sink belongs after the merge, never on a rank's partial:
/// applied per rank it would enter the global softmax D times.
pub fn apply_sink<T: Real>(out: &mut [T], lse: &[T], sink: &[f32]) {
    let h = sink.len();
    assert_eq!(out.len(), lse.len() * D_V, "out is [n, 512] beside lse [n]");
    if lse.is_empty() {
        return;
    }
    assert!(h > 0, "one sink per head: at least one head");
    assert_eq!(lse.len() % h, 0, "rows are [.., H] with H = sink.len()");
    for (row, (o, &l)) in out.chunks_exact_mut(D_V).zip(lse).enumerate() {
        let f = sink_factor(l, T::from_f32(sink[row % h]));
        if l == T::NEG_INFINITY || l == T::INFINITY {
            // an empty row is 0, not 0·out: a garbage value there never leaks
            o.fill(T::ZERO);
        } else {
            o.iter_mut().for_each(|x| *x = *x * f);
        }
    }
}

/// [`apply_sink`] on an fp64 oracle: out and A (the softmax-weighted mean of |v|) are both scaled
/// by the row's factor, since the sink is one more term of the softmax's denominator whose value
/// is 0. docs/contract.md §9's bound 2^-6·A_c then scales with the output.
pub fn apply_sink_oracle(oracle: &mut AttentionOracle, sink: &[f32]) {
    apply_sink(&mut oracle.out, &oracle.lse, sink);
    apply_sink(&mut oracle.mean_abs_v, &oracle.lse, sink);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_factor_cases() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        assert_eq!(sink_factor(1.5f32, -inf), 1.0);
        assert_eq!(sink_factor(1.5f32, inf), 0.0);
        assert_eq!(sink_factor(1.5f32, 1.5), 0.5);
        assert!((sink_factor(0.0f64, 2f64.ln()) - 1.0 / 3.0).abs() < 1e-15);
        // the larger term leads: a sink 200 above the lse keeps its share (e^-200 in f64)
        assert!((sink_factor(-100.0f64, 100.0) / (-200f64).exp() - 1.0).abs() < 1e-12);
        assert_eq!(sink_factor(100.0f64, -100.0), 1.0);
        // empty rows: 0 whatever the sink; NaN lse or NaN sink on a row with tokens: NaN
        for s in [-inf, -1.0, 0.0, inf, nan] {
            assert_eq!(sink_factor(-inf, s), 0.0);
            assert_eq!(sink_factor(inf, s), 0.0);
            assert!(sink_factor(nan, s).is_nan());
        }
        assert!(sink_factor(0.0f32, nan).is_nan());
    }

    #[test]
    fn apply_sink_rows_and_heads() {
        // rows [2 tokens, 2 heads]: head h takes sink[h]; lse is untouched
        let mut out: Vec<f32> = (0..4).flat_map(|r| std::iter::repeat_n(r as f32 + 1.0, D_V)).collect();
        out[3 * D_V + 7] = f32::NAN; // garbage in an empty row never leaks
        let lse = [0.0, 1.0, 0.0, f32::NEG_INFINITY];
        apply_sink(&mut out, &lse, &[0.0, f32::INFINITY]);
        assert!(out[..D_V].iter().all(|&x| x == 0.5)); // head 0, lse = sink: half
        assert!(out[D_V..2 * D_V].iter().all(|&x| x == 0.0)); // head 1, +inf sink
        assert!(out[2 * D_V..3 * D_V].iter().all(|&x| x == 1.5));
        assert!(out[3 * D_V..].iter().all(|&x| x.to_bits() == 0)); // empty: +0
    }
}
