//! The merge in isolation (docs/contract.md §5) and the FP8 quantisation bounds (docs/contract.md §3): the fp32
//! merge against its fp64 oracle, the three shapes against the plain merge bit for bit, empty
//! shards (−inf, +inf, NaN lse with NaN outputs) never leaking, base 2 against base e.
//! Attention sinks (docs/contract.md §4): their exact cases on one result, and every combine shape
//! applying them once after its merge, bit for bit like the plain merge with sinks.

use dcp_mla::formats::{decode_fp8_row, encode_fp8_row, fp8_group_scale, D_V, FP8_GROUP};
use dcp_mla::reference::attention::{apply_sink, sink_factor};
use dcp_mla::reference::merge::{
    a2a_combine, a2a_pack, a2a_slot_bytes, ag_rs_contribution, ag_rs_finish, merge, merge_f64, merge_two,
    reduce_scatter, to_bf16,
};
use dcp_mla::LseBase;
use half::bf16;
use proptest::prelude::*;

/// One partial's lse: finite, or an empty shard in one of its three spellings.
fn lse_value() -> impl Strategy<Value = f32> {
    prop_oneof![6 => -30.0f32..30.0, 1 => Just(f32::NEG_INFINITY), 1 => Just(f32::INFINITY), 1 => Just(f32::NAN)]
}

fn partials(d: usize, n: usize) -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (prop::collection::vec(-4.0f32..4.0, d * n * D_V), prop::collection::vec(lse_value(), d * n)).prop_map(
        move |(mut out, lse)| {
            // an empty shard's output is garbage: NaN
            for (row, l) in lse.iter().enumerate() {
                if !l.is_finite() {
                    out[row * D_V..(row + 1) * D_V].fill(f32::NAN);
                }
            }
            (out, lse)
        },
    )
}

/// A head's sink: finite, ±inf, or NaN.
fn sink_value() -> impl Strategy<Value = f32> {
    prop_oneof![6 => -30.0f32..30.0, 1 => Just(f32::NEG_INFINITY), 1 => Just(f32::INFINITY), 1 => Just(f32::NAN)]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The sink on one result, case by case, exactly: lse unchanged; −inf sink: out bit for bit;
    /// +inf sink: 0; lse = sink: out / 2; an empty row: +0 whatever the sink (NaN included);
    /// NaN lse, or NaN sink on a row with tokens: NaN; otherwise e^lse / (e^lse + e^sink) formed
    /// directly in f64, to a few f32 ulps, and the f32 result within f32 rounding of the f64 one.
    #[test]
    fn sink_cases_are_exact(
        h in 1usize..=4,
        vals in prop::collection::vec(-4.0f32..4.0, 4 * D_V),
        lse in prop::collection::vec(lse_value(), 12),
        sink in prop::collection::vec(sink_value(), 4),
        tie in any::<bool>(),
    ) {
        let n = 12 - 12 % h;
        let (lse, sink) = (&lse[..n], &sink[..h]);
        // one row in two of head 0 gets lse = sink: a factor of exactly 1/2
        let lse: Vec<f32> = lse.iter().enumerate().map(|(i, &l)| if tie && i % (2 * h) == 0 { sink[0] } else { l }).collect();
        let x: Vec<f32> = (0..n * D_V).map(|i| vals[i % (4 * D_V)]).collect();
        let mut out = x.clone();
        apply_sink(&mut out, &lse, sink);
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let lse64: Vec<f64> = lse.iter().map(|&v| v as f64).collect();
        let mut out64 = x64.clone();
        apply_sink(&mut out64, &lse64, sink);
        for row in 0..n {
            let (l, s) = (lse[row], sink[row % h]);
            let (xr, o, o64) = (&x[row * D_V..][..D_V], &out[row * D_V..][..D_V], &out64[row * D_V..][..D_V]);
            if l.is_nan() || (s.is_nan() && l.is_finite()) {
                prop_assert!(o.iter().all(|v| v.is_nan()) && o64.iter().all(|v| v.is_nan()), "row {}: NaN", row);
            } else if l.is_infinite() {
                prop_assert!(o.iter().all(|v| v.to_bits() == 0) && o64.iter().all(|v| v.to_bits() == 0), "row {}: empty", row);
                prop_assert_eq!(sink_factor(l, s), 0.0);
            } else if s == f32::NEG_INFINITY {
                prop_assert_eq!(bits(o), bits(xr), "row {}: −inf sink", row);
            } else if s == f32::INFINITY {
                prop_assert!(o.iter().all(|&v| v == 0.0) && o64.iter().all(|&v| v == 0.0), "row {}: +inf sink", row);
            } else if l == s {
                prop_assert_eq!(bits(o), bits(&xr.iter().map(|v| v * 0.5).collect::<Vec<_>>()), "row {}: lse = sink", row);
            } else {
                let (l, s) = (l as f64, s as f64);
                let f = l.exp() / (l.exp() + s.exp());
                // f32 rounds sink − lse once (a relative error of its size in the exponential),
                // then a few operations of one ulp each
                let tol32 = (4.0 + (s - l).abs()) * f32::EPSILON as f64;
                for e in 0..D_V {
                    let want = xr[e] as f64 * f;
                    prop_assert!((o64[e] - want).abs() <= 1e-14 * want.abs(), "row {}: {} vs {}", row, o64[e], want);
                    prop_assert!((o[e] as f64 - want).abs() <= tol32 * want.abs() + 1e-44, "row {}: {} vs {}", row, o[e], want);
                }
            }
        }
    }

    /// Every combine shape with sinks equals the plain merge with sinks, bit for bit (bf16-exact
    /// partials, so a2a sees the same values).
    #[test]
    fn shapes_with_sinks_equal_the_merge_with_sinks(
        dh in (1usize..=8, 1usize..=2, 1usize..=3),
        seed_out in prop::collection::vec(-4.0f32..4.0, 64),
        lse in prop::collection::vec(lse_value(), 8 * 3 * 16),
        sink in prop::collection::vec(sink_value(), 16),
        base2 in any::<bool>(),
    ) {
        let (d, h_l, t) = dh;
        let h = d * h_l;
        let base = if base2 { LseBase::Two } else { LseBase::E };
        let sink = &sink[..h];
        let out: Vec<f32> = (0..d * t * h * D_V).map(|i| bf16::from_f32(seed_out[(i * 7 + i / 64) % 64]).to_f32()).collect();
        let lse = lse[..d * t * h].to_vec();
        let (m_out, m_lse) = merge(&out, &lse, d, t * h, base, Some(sink));
        let (_, p_lse) = merge(&out, &lse, d, t * h, base, None);
        prop_assert_eq!(bits(&m_lse), bits(&p_lse), "the sink leaves the merged lse alone");
        let contribs: Vec<Vec<f32>> = (0..d).map(|r| ag_rs_contribution(r, &out[r * t * h * D_V..][..t * h * D_V], &lse, d, t, h, base)).collect();
        let slot = a2a_slot_bytes(t, h_l);
        let packed: Vec<Vec<u8>> = (0..d).map(|r| a2a_pack(&to_bf16(&out[r * t * h * D_V..][..t * h * D_V]), &lse[r * t * h..][..t * h], d, t, h)).collect();
        for rank in 0..d {
            let mine = &sink[rank * h_l..(rank + 1) * h_l];
            let summed = reduce_scatter(&contribs, rank, h_l, t);
            let (o, l) = ag_rs_finish(&summed, &lse, d, t, h_l, base, rank * h_l, Some(mine));
            let recv: Vec<u8> = packed.iter().flat_map(|p| p[rank * slot..(rank + 1) * slot].to_vec()).collect();
            let (ao, al) = a2a_combine(&recv, d, t, h_l, base, Some(mine));
            for ti in 0..t {
                for hl in 0..h_l {
                    let (row, r) = (ti * h + rank * h_l + hl, ti * h_l + hl);
                    let want = bits(&m_out[row * D_V..][..D_V]);
                    prop_assert_eq!(l[r].to_bits(), m_lse[row].to_bits());
                    prop_assert_eq!(al[r].to_bits(), m_lse[row].to_bits());
                    prop_assert_eq!(bits(&o[r * D_V..][..D_V]), want.clone(), "ag_rs");
                    prop_assert_eq!(bits(&ao[r * D_V..][..D_V]), want, "a2a");
                }
            }
        }
        // the two-way merge: D = 2 with the sinks on its result
        if d == 2 {
            let n = t * h;
            let (o2, l2) = merge_two(&out[..n * D_V], &lse[..n], base, &out[n * D_V..], &lse[n..], base, Some(sink));
            prop_assert_eq!(bits(&o2), bits(&m_out));
            prop_assert_eq!(bits(&l2), bits(&m_lse));
        }
    }

    #[test]
    fn fp32_merge_against_fp64_oracle((out, lse) in (1usize..=8).prop_flat_map(|d| partials(d, 3)), base2 in any::<bool>()) {
        let d = out.len() / (3 * D_V);
        let base = if base2 { LseBase::Two } else { LseBase::E };
        let (o, l) = merge(&out, &lse, d, 3, base, None);
        let (o64, l64) = merge_f64(&out, &lse, d, 3, base);
        for i in 0..3 {
            // a NaN lse is no empty shard: the merged row is NaN (docs/contract.md §5, revised)
            if (0..d).any(|r| lse[r * 3 + i].is_nan()) {
                prop_assert!(l[i].is_nan() && l64[i].is_nan(), "row {}: lse {} / {}", i, l[i], l64[i]);
                prop_assert!(o[i * D_V..(i + 1) * D_V].iter().all(|x| x.is_nan()));
                continue;
            }
            let empty = (0..d).all(|r| !lse[r * 3 + i].is_finite());
            if empty {
                prop_assert_eq!(l[i], f32::NEG_INFINITY);
                prop_assert!(o[i * D_V..(i + 1) * D_V].iter().all(|&x| x == 0.0));
                continue;
            }
            prop_assert!((l[i] as f64 - l64[i]).abs() <= 1e-5 * l64[i].abs().max(1.0));
            // |Σ c_r x_r| can cancel: relative to the largest term
            let scale = (0..d).filter(|&r| lse[r * 3 + i].is_finite()).map(|r| out[(r * 3 + i) * D_V..][..D_V].iter().fold(0f32, |m, x| m.max(x.abs()))).fold(0f32, f32::max) as f64;
            for e in 0..D_V {
                let (g, w) = (o[i * D_V + e] as f64, o64[i * D_V + e]);
                prop_assert!(!g.is_nan(), "no NaN leaks from an empty shard");
                prop_assert!((g - w).abs() <= 1e-5 * w.abs() + 1e-6 * scale, "{} vs {}", g, w);
            }
        }
    }

    #[test]
    fn shapes_equal_the_plain_merge(dh in (1usize..=4, 1usize..=2, 1usize..=3), seed_out in prop::collection::vec(-4.0f32..4.0, 64), lse in prop::collection::vec(lse_value(), 4 * 3 * 8), base2 in any::<bool>()) {
        let (d, h_l, t) = dh;
        let h = d * h_l;
        let base = if base2 { LseBase::Two } else { LseBase::E };
        // bf16-exact partials so the a2a path sees the same values
        let out: Vec<f32> = (0..d * t * h * D_V).map(|i| bf16::from_f32(seed_out[(i * 7 + i / 64) % 64]).to_f32()).collect();
        let lse = lse[..d * t * h].to_vec();
        let (m_out, m_lse) = merge(&out, &lse, d, t * h, base, None);
        let contribs: Vec<Vec<f32>> = (0..d).map(|r| ag_rs_contribution(r, &out[r * t * h * D_V..][..t * h * D_V], &lse, d, t, h, base)).collect();
        let slot = a2a_slot_bytes(t, h_l);
        let packed: Vec<Vec<u8>> = (0..d).map(|r| a2a_pack(&to_bf16(&out[r * t * h * D_V..][..t * h * D_V]), &lse[r * t * h..][..t * h], d, t, h)).collect();
        for rank in 0..d {
            let (o, l) = ag_rs_finish(&reduce_scatter(&contribs, rank, h_l, t), &lse, d, t, h_l, base, rank * h_l, None);
            let recv: Vec<u8> = packed.iter().flat_map(|p| p[rank * slot..(rank + 1) * slot].to_vec()).collect();
            let (ao, al) = a2a_combine(&recv, d, t, h_l, base, None);
            for ti in 0..t {
                for hl in 0..h_l {
                    let (row, mine) = (ti * h + rank * h_l + hl, ti * h_l + hl);
                    let want: Vec<u32> = m_out[row * D_V..][..D_V].iter().map(|x| x.to_bits()).collect();
                    let bits = |v: &[f32]| v[mine * D_V..][..D_V].iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                    prop_assert_eq!(l[mine].to_bits(), m_lse[row].to_bits());
                    prop_assert_eq!(al[mine].to_bits(), m_lse[row].to_bits());
                    prop_assert_eq!(bits(&o), want.clone(), "ag_rs");
                    prop_assert_eq!(bits(&ao), want, "a2a");
                }
            }
        }
    }

    #[test]
    fn two_way_merge_is_the_d2_merge_and_chains((out, lse) in partials(3, 2)) {
        let n = 2;
        let part = |r: usize| (&out[r * n * D_V..(r + 1) * n * D_V], &lse[r * n..(r + 1) * n]);
        let (a, b, c) = (part(0), part(1), part(2));
        let (o2, l2) = merge_two(a.0, a.1, LseBase::E, b.0, b.1, LseBase::E, None);
        let (m2, ml2) = merge(&out[..2 * n * D_V], &lse[..2 * n], 2, n, LseBase::E, None);
        prop_assert_eq!(o2.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), m2.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        prop_assert_eq!(l2.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), ml2.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        // chunk by chunk (fp32 intermediates) equals merging all three at once, to fp32 rounding
        // the running result is natural log; the third chunk arrives in base 2 (its own base)
        let c2: Vec<f32> = c.1.iter().map(|&l| l / std::f32::consts::LN_2).collect();
        let (o3, l3) = merge_two(&o2, &l2, LseBase::E, c.0, &c2, LseBase::Two, None);
        let (m3, ml3) = merge_f64(&out, &lse, 3, n, LseBase::E);
        for i in 0..n {
            if ml3[i].is_nan() {
                // a NaN lse in any chunk: NaN through the chain too
                prop_assert!(l3[i].is_nan() && o3[i * D_V..(i + 1) * D_V].iter().all(|x| x.is_nan()));
                continue;
            }
            prop_assert!(
                l3[i] as f64 == ml3[i] || (l3[i] as f64 - ml3[i]).abs() <= 1e-5 * ml3[i].abs().max(1.0),
                "lse {} vs {}", l3[i], ml3[i]
            );
            for e in 0..D_V {
                let (g, w) = (o3[i * D_V + e] as f64, m3[i * D_V + e]);
                prop_assert!((g - w).abs() <= 1e-5 * w.abs() + 1e-5, "{} vs {}", g, w);
            }
        }
    }

    #[test]
    fn base_two_equals_base_e((out, lse) in partials(4, 1)) {
        let lse2: Vec<f32> = lse.iter().map(|&x| x / std::f32::consts::LN_2).collect();
        let (o, l) = merge_f64(&out, &lse, 4, 1, LseBase::E);
        let (o2, l2) = merge_f64(&out, &lse2, 4, 1, LseBase::Two);
        if l[0].is_nan() {
            prop_assert!(l2[0].is_nan() && o2.iter().all(|x| x.is_nan()));
        } else {
            prop_assert!(l[0] == l2[0] || (l[0] - l2[0]).abs() <= 1e-5 * l[0].abs().max(1.0));
            for (x, y) in o.iter().zip(&o2) {
                prop_assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0));
            }
        }
    }

    #[test]
    fn fp8_quantisation_error_bounds(vals in prop::collection::vec(-1.0f32..1.0, 512), mags in prop::collection::vec(-20i32..12, 4)) {
        let ckv: Vec<bf16> = vals.iter().enumerate().map(|(i, &v)| bf16::from_f32(v * 2f32.powi(mags[i / FP8_GROUP]))).collect();
        let kpe: Vec<bf16> = (0..64).map(|i| bf16::from_f32(i as f32 - 30.5)).collect();
        let mut row = [0u8; 656];
        encode_fp8_row(&ckv, &kpe, &mut row);
        let dec = decode_fp8_row(&row);
        for g in 0..4 {
            let group = &ckv[g * FP8_GROUP..(g + 1) * FP8_GROUP];
            let amax = group.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
            let scale = fp8_group_scale(amax);
            prop_assert_eq!(f32::from_le_bytes(row[512 + 4 * g..516 + 4 * g].try_into().unwrap()), scale);
            // the smallest power of two ≥ max(amax / 448, 1e-4)
            let floor = (amax / 448.0).max(1e-4);
            prop_assert!(scale >= floor && scale / 2.0 < floor && scale.to_bits() & 0x7f_ffff == 0);
            for (i, x) in group.iter().enumerate() {
                let (x, y) = (x.to_f32(), dec[g * FP8_GROUP + i]);
                // e4m3: half an ulp of 3 mantissa bits for normals, 2^-10·scale in the subnormals
                prop_assert!((x - y).abs() <= (x.abs() / 16.0).max(scale * 2f32.powi(-10)), "{} vs {}", x, y);
                prop_assert!(y.abs() <= 448.0 * scale);
            }
        }
        for i in 0..64 {
            prop_assert_eq!(dec[512 + i], kpe[i].to_f32(), "k_pe is stored unquantised");
        }
    }
}
