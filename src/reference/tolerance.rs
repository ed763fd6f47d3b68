//! docs/contract.md §9's tolerance for attention outputs (decode, and every combine of decode partials),
//! against an fp64 oracle: one home for the rule, used by every test that checks attention.
//!
//! - out, elementwise: |out_c − ref_c| ≤ 2^-6·A_c, where A_c = Σ_k p_k·|v_kc| / Σ_k p_k is the
//!   softmax-weighted mean of |v| ([`crate::reference::attention::decode_oracle`]).
//!   One bf16 rounding of P errs by at most 2^-8·A_c, the bf16 output by 2^-8·|out| ≤ 2^-8·A_c,
//!   and the a2a combine's bf16 partials by another 2^-8·A_c: 2^-6 leaves a margin over all three.
//! - out, whole tensor: relative L2 error ≤ 3e-3 (what catches a wrong or missing token).
//! - lse: |lse − ref| ≤ 1e-5 + 2e-6·|ref|.
//! - NaN and ±inf positions identical to the oracle's (a NaN input row gives NaN out and lse).

/// The fp64 oracle of one attention tensor: out \[rows, 512\], lse \[rows\], A \[rows, 512\].
#[derive(Debug, Clone, Default)]
pub struct AttentionOracle {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
    pub mean_abs_v: Vec<f64>,
}

/// The elementwise factor of A_c.
pub const OUT_ELEMENT_FACTOR: f64 = 1.0 / 64.0;
/// The bound on the relative L2 error of the whole output tensor.
pub const OUT_REL_L2: f64 = 3e-3;
/// lse: absolute and relative parts.
pub const LSE_ABS: f64 = 1e-5;
pub const LSE_REL: f64 = 2e-6;

/// What [`check_attention`] measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionError {
    /// max over elements of |out − ref| / A_c (0/0 counts as 0); the bound is 2^-6
    pub worst_out_ratio: f64,
    /// relative L2 error of out over the tensor
    pub rel_l2: f64,
    /// max |lse − ref| over finite references
    pub worst_lse: f64,
}

fn same_class(g: f64, w: f64) -> bool {
    if w.is_nan() {
        g.is_nan()
    } else if w.is_infinite() {
        g == w
    } else {
        g.is_finite()
    }
}

/// Checks out (as f64 values) and lse against the oracle under docs/contract.md §9; Err names the first
/// element out of bounds. `out` and `lse` may be a subset of heads only if the oracle is too.
pub fn check_attention(
    what: &str,
    out: impl IntoIterator<Item = f64>,
    lse: impl IntoIterator<Item = f64>,
    oracle: &AttentionOracle,
) -> Result<AttentionError, String> {
    let mut e = AttentionError::default();
    let (mut err2, mut ref2, mut n_out) = (0.0f64, 0.0f64, 0usize);
    for (k, g) in out.into_iter().enumerate() {
        let (w, a) = match (oracle.out.get(k), oracle.mean_abs_v.get(k)) {
            (Some(&w), Some(&a)) => (w, a),
            _ => return Err(format!("{what}: out has more than the oracle's {} values", oracle.out.len())),
        };
        n_out += 1;
        if !same_class(g, w) {
            return Err(format!("{what}: out[{k}] (row {}) = {g}, want {w}", k / crate::formats::D_V));
        }
        if !w.is_finite() {
            continue;
        }
        let d = (g - w).abs();
        let ratio = if d == 0.0 { 0.0 } else { d / a };
        if ratio.is_nan() || ratio > OUT_ELEMENT_FACTOR {
            return Err(format!(
                "{what}: out[{k}] (row {}) = {g}, want {w}: |error| {d:e} > 2^-6·A_c = {:e}",
                k / crate::formats::D_V,
                OUT_ELEMENT_FACTOR * a
            ));
        }
        e.worst_out_ratio = e.worst_out_ratio.max(ratio);
        err2 += d * d;
        ref2 += w * w;
    }
    if n_out != oracle.out.len() {
        return Err(format!("{what}: {n_out} out values, the oracle has {}", oracle.out.len()));
    }
    e.rel_l2 = if err2 == 0.0 { 0.0 } else { (err2 / ref2).sqrt() };
    if e.rel_l2 > OUT_REL_L2 {
        return Err(format!("{what}: relative L2 error {:e} > {OUT_REL_L2:e}", e.rel_l2));
    }
    let mut n_lse = 0usize;
    for (k, g) in lse.into_iter().enumerate() {
        let Some(&w) = oracle.lse.get(k) else {
            return Err(format!("{what}: lse has more than the oracle's {} values", oracle.lse.len()));
        };
        n_lse += 1;
        if !same_class(g, w) {
            return Err(format!("{what}: lse[{k}] = {g}, want {w}"));
        }
        if w.is_finite() {
            let d = (g - w).abs();
            if d > LSE_ABS + LSE_REL * w.abs() {
                return Err(format!("{what}: lse[{k}] = {g}, want {w}: |error| {d:e}"));
            }
            e.worst_lse = e.worst_lse.max(d);
        }
    }
    if n_lse != oracle.lse.len() {
        return Err(format!("{what}: {n_lse} lse values, the oracle has {}", oracle.lse.len()));
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oracle() -> AttentionOracle {
        AttentionOracle {
            out: vec![0.5, -0.25, 0.0, 1.0],
            lse: vec![1.0, f64::NEG_INFINITY],
            mean_abs_v: vec![1.0, 0.5, 0.5, 1.0],
        }
    }

    #[test]
    fn accepts_errors_inside_the_bound_and_names_the_first_outside() {
        let o = oracle();
        let ok =
            check_attention("t", [0.5 + 0.5 / 64.0 * 0.9 / 8.0, -0.25, 0.0, 1.0], [1.0 + 1e-5, f64::NEG_INFINITY], &o);
        assert!(ok.is_ok(), "{ok:?}");
        // an element error of 2^-6·A_c·1.01: out of bounds, though relative L2 would pass
        let err = check_attention("t", [0.5, -0.25, 0.5 / 64.0 * 1.01, 1.0], [1.0, f64::NEG_INFINITY], &o).unwrap_err();
        assert!(err.contains("out[2]"), "{err}");
        // NaN where the oracle is finite, finite where it is -inf, lse error too large
        assert!(check_attention("t", [f64::NAN, -0.25, 0.0, 1.0], [1.0, f64::NEG_INFINITY], &o).is_err());
        assert!(check_attention("t", [0.5, -0.25, 0.0, 1.0], [1.0, 0.0], &o).is_err());
        assert!(check_attention("t", [0.5, -0.25, 0.0, 1.0], [1.0 + 2e-5, f64::NEG_INFINITY], &o).is_err());
        // lengths must match
        assert!(check_attention("t", [0.5, -0.25, 0.0], [1.0, f64::NEG_INFINITY], &o).is_err());
    }

    #[test]
    fn relative_l2_is_bounded_when_every_element_passes() {
        // every element at 0.9 · 2^-6 · A_c with A_c = 1 and out ≈ 0.25: relative L2 ≈ 0.056
        let o = AttentionOracle { out: vec![0.25; 8], lse: vec![], mean_abs_v: vec![1.0; 8] };
        let err = check_attention("t", vec![0.25 + 0.9 / 64.0; 8], [], &o).unwrap_err();
        assert!(err.contains("relative L2"), "{err}");
    }

    #[test]
    fn nan_rows_must_stay_nan() {
        let o = AttentionOracle { out: vec![f64::NAN], lse: vec![f64::NAN], mean_abs_v: vec![f64::NAN] };
        assert!(check_attention("t", [f64::NAN], [f64::NAN], &o).is_ok());
        assert!(check_attention("t", [0.0], [f64::NAN], &o).is_err());
        assert!(check_attention("t", [f64::NAN], [0.0], &o).is_err());
    }
}
