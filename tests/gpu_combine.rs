//! The DCP combine kernels (docs/contract.md §5) on the GPU against the CPU reference
//! (`dcp_mla::reference::merge`), within docs/contract.md §9: fp32 out rel 1e-5, bf16 out within 1 bf16
//! ulp of the rounded fp64 result, lse abs 1e-5, inf positions exact; the ag_rs path through a
//! bf16 contribution and a once-rounded bf16 sum within (2^-7 + 1e-5)·mag (+ 1 ulp for bf16 out).
//!
//! "Relative" is measured against the size of the merged terms, mag = Σ_r (w_r/S)·|out_r| (the
//! fp64 merge of |out|), not against |out|: with mixed signs the result can cancel to far below
//! its terms, where no fp32 accumulation is relative-accurate. Without cancellation mag = |out|
//! and this is the contract's rel 1e-5 exactly. Under cancellation, rounding w_r/S to fp32 alone (2^-24
//! relative, plus expf's 2 ulp) moves the sum by ~1e-7·mag, which exceeds 1e-5·|out| once
//! mag/|out| > ~100; partials uniform in [−2, 2) give hundreds of such values per million (seen
//! on the H200: 1.5948992e-3 vs the f32 reference's 1.5949607e-3, mag 1.52, the kernel's FMA vs
//! the reference's separate multiply and add). So the kernel is not bit-exact with
//! `merge::<f32>` (FMA contraction, expf vs libm exp) and is checked against it, as against the
//! fp64 merge, within 1e-5·mag; it stays within ~1e-6·mag of the fp64 merge. For the same reason
//! a bf16 result may be off by more than its ulp where that ulp is below 1e-5·mag.
//!
//! Inputs: fresh random partials with +inf and −inf lse on some (row, rank) pairs (empty shards,
//! whose outs are NaN) and NaN lse on others (a NaN input: the merged row must be NaN, docs/contract.md §5),
//! rows where every shard is empty, base e and base 2 lse,
//! D ∈ {1, 2, 4, 8}, T ∈ {1, 128, 4096}. Every output buffer is poisoned with NaN first.

mod common;

use common::*;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream};
use dcp_mla::formats::D_V;
use dcp_mla::ops::combine::*;
use dcp_mla::reference::attention::sink_factor;
use dcp_mla::reference::merge::{
    a2a_combine as ref_a2a_combine, a2a_pack as ref_a2a_pack, a2a_slot_bytes, ag_rs_contribution,
    ag_rs_finish as ref_ag_rs_finish, merge_f64, merge_two as ref_merge_two, reduce_scatter, to_bf16,
};
use dcp_mla::LseBase;
use half::bf16;
use std::sync::Arc;

const POISON_F32: f32 = f32::from_bits(0x7fa5_a5a5);
const POISON_BF16: u16 = 0x7fa5;
const POISON_BYTE: u8 = 0xa5;

/// D partial results [D, T, H, 512] and their lse [D, T, H] (the all-gathered layout).
struct Partials {
    d: usize,
    t: usize,
    h: usize,
    /// f32; exactly representable in bf16 when made with `bf16_values`.
    out: Vec<f32>,
    lse: Vec<f32>,
}

fn special_lse(rng: &mut Rng) -> f32 {
    [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][rng.below(3) as usize]
}

/// Random partials: about 1 in 7 (row, rank) pairs is an empty shard (NaN, +inf or −inf lse) with
/// a NaN out; about 1 in 16 rows has every shard empty; the rest have lse in [−16, 16).
fn partials(rng: &mut Rng, d: usize, t: usize, h: usize, bf16_values: bool) -> Partials {
    let n = t * h;
    let mut lse = vec![0.0f32; d * n];
    let mut out = vec![0.0f32; d * n * D_V];
    for i in 0..n {
        let all_empty = rng.below(16) == 0;
        for r in 0..d {
            let l = if all_empty || rng.below(7) == 0 { special_lse(rng) } else { rng.unit() * 16.0 };
            lse[r * n + i] = l;
            let row = &mut out[(r * n + i) * D_V..][..D_V];
            if l.is_finite() {
                for x in row.iter_mut() {
                    let v = rng.unit() * 2.0;
                    *x = if bf16_values { bf16::from_f32(v).to_f32() } else { v };
                }
            } else {
                row.fill(f32::NAN);
            }
        }
    }
    Partials { d, t, h, out, lse }
}

impl Partials {
    fn rank_out(&self, r: usize) -> &[f32] {
        let n = self.t * self.h * D_V;
        &self.out[r * n..(r + 1) * n]
    }
    fn rank_lse(&self, r: usize) -> &[f32] {
        let n = self.t * self.h;
        &self.lse[r * n..(r + 1) * n]
    }
}

/// The fp64 merge of all D partials: out [T·H, 512], mag [T·H, 512] (the merge of |out|) and lse [T·H].
struct Oracle {
    out: Vec<f64>,
    mag: Vec<f64>,
    lse: Vec<f64>,
}

fn oracle(p: &Partials, base: LseBase) -> Oracle {
    let n = p.t * p.h;
    let (out, lse) = merge_f64(&p.out, &p.lse, p.d, n, base);
    let abs: Vec<f32> = p.out.iter().map(|x| x.abs()).collect();
    let (mag, _) = merge_f64(&abs, &p.lse, p.d, n, base);
    Oracle { out, mag, lse }
}

impl Oracle {
    /// The rows of heads [rank·H_l, (rank+1)·H_l), as [T, H_l, width] from [T, H, width].
    fn heads(v: &[f64], t: usize, h: usize, h_l: usize, rank: usize, width: usize) -> Vec<f64> {
        (0..t).flat_map(|ti| v[(ti * h + rank * h_l) * width..][..h_l * width].iter().copied()).collect()
    }
    /// The same magnitudes with another expected out (the f32 reference's).
    fn with_out(&self, out: &[f32]) -> Oracle {
        Oracle { out: out.iter().map(|&x| x as f64).collect(), mag: self.mag.clone(), lse: self.lse.clone() }
    }
    fn for_rank(&self, t: usize, h: usize, h_l: usize, rank: usize) -> Oracle {
        Oracle {
            out: Self::heads(&self.out, t, h, h_l, rank, D_V),
            mag: Self::heads(&self.mag, t, h, h_l, rank, D_V),
            lse: Self::heads(&self.lse, t, h, h_l, rank, 1),
        }
    }
}

fn report(what: &str, bad: usize, total: usize, first: Option<String>) {
    assert!(bad == 0, "{what}: {bad} of {total} values out of tolerance; first: {}", first.unwrap_or_default());
}

/// fp32 out within 1e-5·mag of the fp64 merge (exactly 0 where every shard is empty).
fn check_out_f32(what: &str, got: &[f32], want: &Oracle) {
    assert_eq!(got.len(), want.out.len(), "{what}: length");
    let (mut bad, mut first) = (0, None);
    for (i, &g) in got.iter().enumerate() {
        // NaN exactly where the fp64 merge is NaN (a NaN lse among the inputs), else the bound
        let ok = if want.out[i].is_nan() { g.is_nan() } else { (g as f64 - want.out[i]).abs() <= 1e-5 * want.mag[i] };
        if !ok {
            bad += 1;
            first.get_or_insert_with(|| format!("[{i}] got {g:e}, want {:e} (mag {:e})", want.out[i], want.mag[i]));
        }
    }
    report(what, bad, got.len(), first);
}

fn bf16_ulp(x: bf16) -> f64 {
    let a = bf16::from_bits(x.to_bits() & 0x7fff);
    bf16::from_bits(a.to_bits() + 1).to_f64() - a.to_f64()
}

/// bf16 out within 1 ulp of the fp64 merge rounded to bf16, or within the fp32 tolerance 1e-5·mag
/// (under cancellation a bf16 result cannot be more accurate than the fp32 sum it rounds).
fn check_out_bf16(what: &str, got: &[bf16], want: &Oracle) {
    assert_eq!(got.len(), want.out.len(), "{what}: length");
    let (mut bad, mut first) = (0, None);
    for (i, &g) in got.iter().enumerate() {
        let w = bf16::from_f64(want.out[i]);
        let ok = if want.out[i].is_nan() {
            g.is_nan()
        } else {
            (g.to_f64() - w.to_f64()).abs() <= bf16_ulp(w).max(1e-5 * want.mag[i])
            // false for NaN
        };
        if !ok {
            bad += 1;
            first.get_or_insert_with(|| format!("[{i}] got {g}, want {w} ({:e}, mag {:e})", want.out[i], want.mag[i]));
        }
    }
    report(what, bad, got.len(), first);
}

/// lse within abs 1e-5 of `want` (the inputs keep |lse| below 19, where fp32 is good to ~2e-6);
/// −inf exactly where `want` is −inf, NaN exactly where it is NaN.
fn check_lse<W: Copy + Into<f64>>(what: &str, got: &[f32], want: &[W]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut bad, mut first) = (0, None);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let w: f64 = w.into();
        // the poison is a NaN: a row left unwritten must not pass for an expected NaN
        let ok = if g.to_bits() == POISON_F32.to_bits() {
            false
        } else if w == f64::NEG_INFINITY {
            g == f32::NEG_INFINITY
        } else if w.is_nan() {
            g.is_nan()
        } else {
            w.is_finite() && (g as f64 - w).abs() <= 1e-5
        };
        if !ok {
            bad += 1;
            first.get_or_insert_with(|| format!("[{i}] got {g:e}, want {w:e}"));
        }
    }
    report(what, bad, got.len(), first);
}

/// Elementwise rel 1e-5 (exact where `want` is 0, or both NaN): for single products, which do not cancel.
fn check_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut bad, mut first) = (0, None);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-5 * w.abs();
        if !ok {
            bad += 1;
            first.get_or_insert_with(|| format!("[{i}] got {g:e}, want {w:e}"));
        }
    }
    report(what, bad, got.len(), first);
}

fn assert_bits_eq(what: &str, got: &[bf16], want: &[bf16]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
    assert!(bad.is_none(), "{what}: first difference at {bad:?}");
}

fn assert_f32_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
    assert!(bad.is_none(), "{what}: first difference at {bad:?}");
}

/// A device output of bf16 or fp32 rows, poisoned with NaN.
enum DevRows {
    Bf16(CudaSlice<bf16>),
    F32(CudaSlice<f32>),
}

impl DevRows {
    fn poisoned(s: &Arc<CudaStream>, n: usize, f32_out: bool) -> Self {
        if f32_out {
            DevRows::F32(upload(s, &vec![POISON_F32; n]))
        } else {
            DevRows::Bf16(upload(s, &vec![bf16::from_bits(POISON_BF16); n]))
        }
    }
    /// Uploads f32 values as bf16 (exact for `bf16_values` partials) or f32.
    fn from_f32(s: &Arc<CudaStream>, v: &[f32], as_f32: bool) -> Self {
        if as_f32 {
            DevRows::F32(upload(s, v))
        } else {
            DevRows::Bf16(upload(s, &to_bf16(v)))
        }
    }
    fn view(&self, s: &Arc<CudaStream>) -> CombineRows {
        match self {
            DevRows::Bf16(b) => CombineRows::Bf16(view(s, b)),
            DevRows::F32(b) => CombineRows::F32(view(s, b)),
        }
    }
    /// Checks against the oracle: fp32 rel 1e-5, bf16 within 1 ulp.
    fn check(&self, s: &Arc<CudaStream>, what: &str, want: &Oracle) {
        match self {
            DevRows::Bf16(b) => {
                let got = download(s, b);
                let unwritten = got.iter().position(|x| x.to_bits() == POISON_BF16);
                assert!(unwritten.is_none(), "{what}: out[{unwritten:?}] still holds the poison");
                check_out_bf16(what, &got, want)
            }
            DevRows::F32(b) => {
                let got = download(s, b);
                let unwritten = got.iter().position(|x| x.to_bits() == POISON_F32.to_bits());
                assert!(unwritten.is_none(), "{what}: out[{unwritten:?}] still holds the poison");
                check_out_f32(what, &got, want)
            }
        }
    }
    /// Checks bit for bit against a reference fp32 result (rounded to nearest even for bf16).
    fn check_bits(&self, s: &Arc<CudaStream>, what: &str, want: &[f32]) {
        match self {
            DevRows::Bf16(b) => assert_bits_eq(what, &download(s, b), &to_bf16(want)),
            DevRows::F32(b) => assert_f32_bits_eq(what, &download(s, b), want),
        }
    }
}

struct AgRsCase {
    d: usize,
    t: usize,
    h_l: usize,
    base: LseBase,
    f32_in: bool,
    /// the contribution (what the reduce-scatter moves) in fp32, else bf16
    f32_contrib: bool,
    f32_out: bool,
}

/// Rows as fp32 values (bf16 widened exactly).
fn download_rows(s: &Arc<CudaStream>, rows: &DevRows) -> Vec<f32> {
    match rows {
        DevRows::F32(b) => download(s, b),
        DevRows::Bf16(b) => download(s, b).iter().map(|x| x.to_f32()).collect(),
    }
}

/// A result that went through bf16 contributions and a bf16 sum against the fp64 merge: the
/// contributions and the sum each round once (bf16's unit roundoff is 2^-8: 8 significant bits),
/// each about 2^-8 of the row's magnitude, so about 2^-7 in all, then the output rounds (1 bf16
/// ulp for bf16 out); plus the fp32 tolerance 1e-5·mag of the other checks.
fn check_out_bf16_path(what: &str, got: &[f32], want: &Oracle, bf16_out: bool) {
    assert_eq!(got.len(), want.out.len(), "{what}: length");
    let (mut bad, mut first) = (0, None);
    for (i, &g) in got.iter().enumerate() {
        let w = want.out[i];
        let ulp = if bf16_out { bf16_ulp(bf16::from_f64(w)) } else { 0.0 };
        let ok =
            if w.is_nan() { g.is_nan() } else { (g as f64 - w).abs() <= (2f64.powi(-7) + 1e-5) * want.mag[i] + ulp };
        if !ok {
            bad += 1;
            first.get_or_insert_with(|| format!("[{i}] got {g:e}, want {w:e} (mag {:e})", want.mag[i]));
        }
    }
    report(what, bad, got.len(), first);
}

/// The whole ag_rs path: every rank's contribution vs the reference, the reduce-scatter on the
/// host (its sum rounded to bf16 once for a bf16 contribution, as a reduce-scatter that
/// accumulates in fp32 delivers it),
/// every rank's final cast vs the reference (bit for bit given the same sum) and vs the fp64
/// merge of all partials.
fn run_ag_rs(c: &AgRsCase, rng: &mut Rng) {
    let (s, dev) = (stream(), gpu());
    let (d, t, h_l) = (c.d, c.t, c.h_l);
    let h = d * h_l;
    let p = partials(rng, d, t, h, !c.f32_in);
    let want = oracle(&p, c.base);
    let tag = format!(
        "ag_rs D={d} T={t} H_l={h_l} {:?} f32_in={} f32_contrib={} f32_out={}",
        c.base, c.f32_in, c.f32_contrib, c.f32_out
    );

    let d_lse = upload(&s, &p.lse);
    let mut contribs = Vec::with_capacity(d);
    for r in 0..d {
        let d_out = DevRows::from_f32(&s, p.rank_out(r), c.f32_in);
        let d_contrib = DevRows::poisoned(&s, h * t * D_V, c.f32_contrib);
        let args = AgRsCorrect {
            out: d_out.view(&s),
            lse_all: view(&s, &d_lse),
            lse_base: c.base,
            contrib: d_contrib.view(&s),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            rank: r,
        };
        ag_rs_correct(dev, raw(&s), &args).expect("ag_rs_correct");
        let got = download_rows(&s, &d_contrib);
        let reference = ag_rs_contribution(r, p.rank_out(r), &p.lse, d, t, h, c.base);
        if c.f32_contrib {
            check_close(&format!("{tag}: contribution of rank {r}"), &got, &reference);
        } else {
            // the fp32 value (within 1e-5 of the reference's) rounded: at most 1 ulp from the
            // reference rounded, NaN where it is NaN
            let rounded = to_bf16(&reference);
            let bad = got
                .iter()
                .zip(&rounded)
                .position(|(&g, &w)| !((g.is_nan() && w.is_nan()) || (g as f64 - w.to_f64()).abs() <= bf16_ulp(w)));
            assert!(bad.is_none(), "{tag}: bf16 contribution of rank {r}: first difference at {bad:?}");
        }
        contribs.push(got);
    }
    for rank in 0..d {
        let mut summed = reduce_scatter(&contribs, rank, h_l, t);
        if !c.f32_contrib {
            summed = to_bf16(&summed).iter().map(|x| x.to_f32()).collect();
        }
        let d_summed = DevRows::from_f32(&s, &summed, c.f32_contrib);
        let d_out = DevRows::poisoned(&s, t * h_l * D_V, c.f32_out);
        let d_lse_out = upload(&s, &vec![POISON_F32; t * h_l]);
        let args = AgRsFinish {
            summed: d_summed.view(&s),
            lse_all: view(&s, &d_lse),
            lse_base: c.base,
            out: d_out.view(&s),
            lse: view(&s, &d_lse_out),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            rank,
            sink: None,
        };
        ag_rs_finish(dev, raw(&s), &args).expect("ag_rs_finish");
        let (ref_out, ref_lse) = ref_ag_rs_finish(&summed, &p.lse, d, t, h_l, c.base, rank * h_l, None);
        d_out.check_bits(&s, &format!("{tag}: finish out of rank {rank} vs reference"), &ref_out);
        let got_lse = download(&s, &d_lse_out);
        check_lse(&format!("{tag}: finish lse of rank {rank} vs reference"), &got_lse, &ref_lse);
        let mine = want.for_rank(t, h, h_l, rank);
        let what = format!("{tag}: out of rank {rank} vs fp64 merge");
        if c.f32_contrib {
            d_out.check(&s, &what, &mine);
        } else {
            check_out_bf16_path(&what, &download_rows(&s, &d_out), &mine, !c.f32_out);
        }
        check_lse(&format!("{tag}: lse of rank {rank} vs fp64 merge"), &got_lse, &mine.lse);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ag_rs_matches_reference() {
    let mut rng = Rng::new(seed());
    let case =
        |d, t, h_l, base, f32_in, f32_contrib, f32_out| AgRsCase { d, t, h_l, base, f32_in, f32_contrib, f32_out };
    let cases = [
        case(2, 1, 16, LseBase::E, false, true, false),
        case(4, 128, 16, LseBase::Two, true, true, true),
        case(8, 128, 4, LseBase::E, false, true, true),
        case(8, 1, 16, LseBase::Two, true, true, false),
        case(2, 4096, 2, LseBase::E, false, true, false),
        case(4, 4096, 1, LseBase::Two, false, true, true),
        case(1, 5, 8, LseBase::E, true, true, true),
        // bf16 contributions (a bf16 reduce-scatter), from bf16 and fp32 inputs, to either output
        case(4, 128, 16, LseBase::E, false, false, false),
        case(8, 128, 4, LseBase::Two, true, false, false),
        case(2, 4096, 2, LseBase::E, false, false, true),
        case(1, 5, 8, LseBase::Two, true, false, true),
    ];
    for c in &cases {
        run_ag_rs(c, &mut rng);
    }
}

/// The first differing byte of two tight slots of `rows` rows: the lse bytes must be equal, the
/// bf16 values equal or both NaN (an fp32 NaN packed to bf16 may come out with another payload).
fn slot_difference(got: &[u8], want: &[u8], rows: usize) -> Option<usize> {
    assert_eq!(got.len(), want.len());
    let split = rows * D_V * 2;
    let value = |b: &[u8], i: usize| bf16::from_bits(u16::from_le_bytes([b[i], b[i + 1]]));
    (0..split)
        .step_by(2)
        .find(|&i| {
            let (g, w) = (value(got, i), value(want, i));
            g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan())
        })
        .or_else(|| (split..got.len()).find(|&i| got[i] != want[i]))
}

struct A2aCase {
    d: usize,
    t: usize,
    h_l: usize,
    base: LseBase,
    f32_in: bool,
    f32_out: bool,
}

/// The whole a2a path: every source's pack vs the reference byte for byte (padding untouched),
/// the all-to-all on the host, every destination's combine vs the reference and the fp64 merge.
fn run_a2a(c: &A2aCase, rng: &mut Rng) {
    let (s, dev) = (stream(), gpu());
    let (d, t, h_l) = (c.d, c.t, c.h_l);
    let h = d * h_l;
    // The a2a carries bf16: the partials are bf16 values even when packed from fp32.
    let p = partials(rng, d, t, h, true);
    let want = oracle(&p, c.base);
    let tag = format!("a2a D={d} T={t} H_l={h_l} {:?} f32_in={} f32_out={}", c.base, c.f32_in, c.f32_out);
    let tight = a2a_slot_bytes(t, h_l);
    let slot = a2a_aligned_slot_bytes(t, h_l).unwrap();

    let mut sends = Vec::with_capacity(d);
    let mut ref_sends = Vec::with_capacity(d);
    for r in 0..d {
        let d_out = DevRows::from_f32(&s, p.rank_out(r), c.f32_in);
        let d_lse = upload(&s, p.rank_lse(r));
        let d_send = upload(&s, &vec![POISON_BYTE; d * slot]);
        let args = A2aPack {
            out: d_out.view(&s),
            lse: view(&s, &d_lse),
            send: view(&s, &d_send),
            slot_bytes: slot,
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
        };
        a2a_pack(dev, raw(&s), &args).expect("a2a_pack");
        let got = download(&s, &d_send);
        let reference = ref_a2a_pack(&to_bf16(p.rank_out(r)), p.rank_lse(r), d, t, h);
        for dst in 0..d {
            let g = &got[dst * slot..(dst + 1) * slot];
            let bad = slot_difference(&g[..tight], &reference[dst * tight..(dst + 1) * tight], t * h_l);
            assert!(bad.is_none(), "{tag}: pack of rank {r}, slot {dst} differs at byte {bad:?}");
            assert!(g[tight..].iter().all(|&b| b == POISON_BYTE), "{tag}: pack of rank {r} wrote slot {dst}'s padding");
        }
        sends.push(got);
        ref_sends.push(reference);
    }
    for rank in 0..d {
        let recv: Vec<u8> = sends.iter().flat_map(|sb| sb[rank * slot..(rank + 1) * slot].iter().copied()).collect();
        let ref_recv: Vec<u8> =
            ref_sends.iter().flat_map(|sb| sb[rank * tight..(rank + 1) * tight].iter().copied()).collect();
        let d_recv = upload(&s, &recv);
        let d_out = DevRows::poisoned(&s, t * h_l * D_V, c.f32_out);
        let d_lse_out = upload(&s, &vec![POISON_F32; t * h_l]);
        let args = A2aCombine {
            recv: view(&s, &d_recv),
            slot_bytes: slot,
            lse_base: c.base,
            out: d_out.view(&s),
            lse: view(&s, &d_lse_out),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            sink: None,
        };
        a2a_combine(dev, raw(&s), &args).expect("a2a_combine");
        let (ref_out, ref_lse) = ref_a2a_combine(&ref_recv, d, t, h_l, c.base, None);
        let got_lse = download(&s, &d_lse_out);
        check_lse(&format!("{tag}: lse of rank {rank} vs reference"), &got_lse, &ref_lse);
        let mine = want.for_rank(t, h, h_l, rank);
        if let DevRows::F32(b) = &d_out {
            check_out_f32(
                &format!("{tag}: out of rank {rank} vs reference"),
                &download(&s, b),
                &mine.with_out(&ref_out),
            );
        }
        d_out.check(&s, &format!("{tag}: out of rank {rank} vs fp64 merge"), &mine);
        check_lse(&format!("{tag}: lse of rank {rank} vs fp64 merge"), &got_lse, &mine.lse);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a2a_matches_reference() {
    let mut rng = Rng::new(seed());
    let cases = [
        A2aCase { d: 2, t: 1, h_l: 16, base: LseBase::E, f32_in: false, f32_out: false },
        // D = 1 (docs/contract.md §9's DCP identity at D = 1): the one slot, unpacked
        A2aCase { d: 1, t: 128, h_l: 16, base: LseBase::E, f32_in: false, f32_out: false },
        A2aCase { d: 1, t: 3, h_l: 8, base: LseBase::Two, f32_in: true, f32_out: true },
        A2aCase { d: 4, t: 128, h_l: 16, base: LseBase::Two, f32_in: true, f32_out: true },
        A2aCase { d: 8, t: 128, h_l: 8, base: LseBase::E, f32_in: false, f32_out: false },
        A2aCase { d: 8, t: 1, h_l: 16, base: LseBase::Two, f32_in: false, f32_out: true },
        A2aCase { d: 2, t: 4096, h_l: 4, base: LseBase::E, f32_in: false, f32_out: true },
        A2aCase { d: 4, t: 4096, h_l: 1, base: LseBase::Two, f32_in: true, f32_out: false },
        // T·H_l = 2: the tight slot (2056 bytes) is padded to 2064.
        A2aCase { d: 2, t: 1, h_l: 2, base: LseBase::E, f32_in: false, f32_out: true },
    ];
    for c in &cases {
        run_a2a(c, &mut rng);
    }
}

/// Two-way merge of `rows` rows, input a's lse in `base_a` and b's in `base_b` (docs/contract.md §5.3: each
/// its own), the two inputs fp32 or bf16 (`f32_in`), the output fp32 or bf16 (`f32_out`);
/// `in_place` writes out over out_a (same dtype) and lse over lse_b.
fn run_merge_two(
    rows: usize,
    base_a: LseBase,
    base_b: LseBase,
    f32_in: bool,
    f32_out: bool,
    in_place: bool,
    rng: &mut Rng,
) {
    assert!(!in_place || f32_in == f32_out, "in place needs out in the inputs' dtype");
    let (s, dev) = (stream(), gpu());
    // bf16 inputs: values bf16 holds exactly, so the reference and the oracle see what the kernel reads
    let p = partials(rng, 2, rows, 1, !f32_in);
    // the fp64 oracle sees both inputs in natural log, converted as docs/contract.md §5 says (× ln 2 in fp32)
    let natural = |l: f32, b: LseBase| if b == LseBase::Two { l * std::f32::consts::LN_2 } else { l };
    let mut nat = Partials { d: 2, t: rows, h: 1, out: p.out.clone(), lse: p.lse.clone() };
    for (i, l) in nat.lse.iter_mut().enumerate() {
        *l = natural(*l, if i < rows { base_a } else { base_b });
    }
    let want = oracle(&nat, LseBase::E);
    let tag =
        format!("merge_two rows={rows} {base_a:?}+{base_b:?} f32_in={f32_in} f32_out={f32_out} in_place={in_place}");
    let (ref_out, ref_lse) =
        ref_merge_two(p.rank_out(0), p.rank_lse(0), base_a, p.rank_out(1), p.rank_lse(1), base_b, None);

    let d_out_a = DevRows::from_f32(&s, p.rank_out(0), f32_in);
    let d_lse_a = upload(&s, p.rank_lse(0));
    let d_out_b = DevRows::from_f32(&s, p.rank_out(1), f32_in);
    let d_lse_b = upload(&s, p.rank_lse(1));
    let d_out = DevRows::poisoned(&s, rows * D_V, f32_out);
    let d_lse = upload(&s, &vec![POISON_F32; rows]);
    let args = MergeTwo {
        out_a: d_out_a.view(&s),
        lse_a: view(&s, &d_lse_a),
        out_b: d_out_b.view(&s),
        lse_b: view(&s, &d_lse_b),
        lse_a_base: base_a,
        lse_b_base: base_b,
        out: if in_place { d_out_a.view(&s) } else { d_out.view(&s) },
        lse: if in_place { view(&s, &d_lse_b) } else { view(&s, &d_lse) },
        rows,
        sink: None,
    };
    merge_two(dev, raw(&s), &args).expect("merge_two");
    let (got_lse, got_out) = if in_place { (download(&s, &d_lse_b), d_out_a) } else { (download(&s, &d_lse), d_out) };
    check_lse(&format!("{tag}: lse vs reference"), &got_lse, &ref_lse);
    check_lse(&format!("{tag}: lse vs fp64 merge"), &got_lse, &want.lse);
    if let DevRows::F32(b) = &got_out {
        check_out_f32(&format!("{tag}: out vs reference"), &download(&s, b), &want.with_out(&ref_out));
    }
    got_out.check(&s, &format!("{tag}: out vs fp64 merge"), &want);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn merge_two_matches_reference() {
    let mut rng = Rng::new(seed());
    use LseBase::{Two, E};
    // (rows, base a, base b, fp32 in, fp32 out, in place)
    let cases = [
        (16, E, E, true, true, false),
        (16, Two, Two, true, false, false),
        (128 * 64, Two, Two, true, false, false),
        (128 * 64, E, E, true, true, false),
        (4096 * 8, E, E, true, true, false),
        (4096 * 8, Two, Two, true, false, false),
        (128 * 16, E, E, true, true, true),
        // mixed bases: a natural-log running result merged with a base-2 chunk, and the reverse
        (128 * 64, E, Two, true, true, false),
        (128 * 64, Two, E, true, false, false),
        (128 * 16, E, Two, true, true, true),
        // bf16 inputs (what attention kernels write), either output, and bf16 in place
        (16, E, Two, false, false, false),
        (128 * 64, E, E, false, false, false),
        (128 * 64, Two, E, false, true, false),
        (4096 * 8, E, Two, false, false, false),
        (128 * 16, E, Two, false, false, true),
    ];
    for (rows, a, b, f32_in, f32_out, in_place) in cases {
        run_merge_two(rows, a, b, f32_in, f32_out, in_place, &mut rng);
    }
}

/// Sinks of `h` heads: finite values around the rows' lse, −inf (no effect), +inf (out 0), NaN.
fn sinks(rng: &mut Rng, h: usize) -> Vec<f32> {
    (0..h)
        .map(|i| match i % 8 {
            0 => f32::NEG_INFINITY,
            3 => f32::INFINITY,
            5 => f32::NAN,
            _ => rng.unit() * 16.0,
        })
        .collect()
}

/// A combine's fp32 result with sinks against the same launch's without (docs/contract.md §4-§5):
/// the lse bit for bit, and each row of rows [.., H] the plain row times the fp64 factor
/// e^lse / (e^lse + e^sink) of its lse, within 2e-6 of the plain value (fp32 factor and product);
/// a row whose lse is ±inf is 0, a NaN lse or a NaN sink on a row with tokens NaN.
fn check_sinked(what: &str, got: &[f32], got_lse: &[f32], plain: &[f32], plain_lse: &[f32], sink: &[f32]) {
    assert_f32_bits_eq(&format!("{what}: lse (the sink leaves it)"), got_lse, plain_lse);
    let h = sink.len();
    let mut bad = 0;
    let mut first = None;
    for (i, (g, p)) in got.chunks(D_V).zip(plain.chunks(D_V)).enumerate() {
        let f = sink_factor(plain_lse[i] as f64, sink[i % h] as f64);
        for (c, (&g, &p)) in g.iter().zip(p).enumerate() {
            let want = if plain_lse[i].is_infinite() { 0.0 } else { p as f64 * f };
            let ok = if want.is_nan() { g.is_nan() } else { (g as f64 - want).abs() <= 2e-6 * (p as f64).abs() };
            if !ok {
                bad += 1;
                first.get_or_insert_with(|| format!("row {i} col {c}: got {g}, want {want} (plain {p}, factor {f})"));
            }
        }
    }
    report(what, bad, got.len(), first);
}

/// The combines apply a sink once, to the merged fp32 row before the output cast, in all three
/// shapes (the ag_rs last step, the a2a receiver, a two-way merge), with the head of a row
/// taken as row mod H (H_l for the DCP shapes, the sink's length for merge_two).
#[test]
#[ignore = "needs a CUDA GPU"]
fn sinks_apply_once_to_the_merged_rows() {
    let (s, dev) = (stream(), gpu());
    let mut rng = Rng::new(seed());
    let (d, t, h_l) = (4, 32, 8);
    let h = d * h_l;
    let rows = t * h_l;
    let sink = sinks(&mut rng, h_l);
    let d_sink = upload(&s, &sink);

    // ag_rs finish: the summed rows of rank 1's heads, every rank's lse
    let p = partials(&mut rng, d, t, h, false);
    let summed: Vec<f32> = (0..h_l * t * D_V).map(|_| rng.unit() * 2.0).collect();
    let (d_summed, d_lse_all) = (upload(&s, &summed), upload(&s, &p.lse));
    let finish = |with_sink: bool| {
        let (d_out, d_lse) = (upload(&s, &vec![POISON_F32; rows * D_V]), upload(&s, &vec![POISON_F32; rows]));
        let args = AgRsFinish {
            summed: CombineRows::F32(view(&s, &d_summed)),
            lse_all: view(&s, &d_lse_all),
            lse_base: LseBase::Two,
            out: CombineRows::F32(view(&s, &d_out)),
            lse: view(&s, &d_lse),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            rank: 1,
            sink: with_sink.then(|| view(&s, &d_sink)),
        };
        ag_rs_finish(dev, raw(&s), &args).expect("ag_rs_finish");
        (download(&s, &d_out), download(&s, &d_lse))
    };
    let ((plain, plain_lse), (got, got_lse)) = (finish(false), finish(true));
    check_sinked("ag_rs_finish with sinks", &got, &got_lse, &plain, &plain_lse, &sink);

    // a2a combine at rank 2: the slots the reference packs from bf16 partials
    let p = partials(&mut rng, d, t, h, true);
    let tight = a2a_slot_bytes(t, h_l);
    let slot = a2a_aligned_slot_bytes(t, h_l).unwrap();
    let mut recv = vec![0u8; d * slot];
    for r in 0..d {
        let send = ref_a2a_pack(&to_bf16(p.rank_out(r)), p.rank_lse(r), d, t, h);
        recv[r * slot..r * slot + tight].copy_from_slice(&send[2 * tight..3 * tight]);
    }
    let d_recv = upload(&s, &recv);
    let combine = |with_sink: bool| {
        let (d_out, d_lse) = (upload(&s, &vec![POISON_F32; rows * D_V]), upload(&s, &vec![POISON_F32; rows]));
        let args = A2aCombine {
            recv: view(&s, &d_recv),
            slot_bytes: slot,
            lse_base: LseBase::E,
            out: CombineRows::F32(view(&s, &d_out)),
            lse: view(&s, &d_lse),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            sink: with_sink.then(|| view(&s, &d_sink)),
        };
        a2a_combine(dev, raw(&s), &args).expect("a2a_combine");
        (download(&s, &d_out), download(&s, &d_lse))
    };
    let ((plain, plain_lse), (got, got_lse)) = (combine(false), combine(true));
    check_sinked("a2a_combine with sinks", &got, &got_lse, &plain, &plain_lse, &sink);

    // merge_two of [T, H] rows with H sinks (H = 8 here, not the DCP shapes' H_l)
    let p = partials(&mut rng, 2, rows, 1, false);
    let d_in: Vec<_> = (0..2).map(|r| (upload(&s, p.rank_out(r)), upload(&s, p.rank_lse(r)))).collect();
    let merge = |with_sink: bool| {
        let (d_out, d_lse) = (upload(&s, &vec![POISON_F32; rows * D_V]), upload(&s, &vec![POISON_F32; rows]));
        let args = MergeTwo {
            out_a: CombineRows::F32(view(&s, &d_in[0].0)),
            lse_a: view(&s, &d_in[0].1),
            out_b: CombineRows::F32(view(&s, &d_in[1].0)),
            lse_b: view(&s, &d_in[1].1),
            lse_a_base: LseBase::E,
            lse_b_base: LseBase::Two,
            out: CombineRows::F32(view(&s, &d_out)),
            lse: view(&s, &d_lse),
            rows,
            sink: with_sink.then(|| view(&s, &d_sink)),
        };
        merge_two(dev, raw(&s), &args).expect("merge_two");
        (download(&s, &d_out), download(&s, &d_lse))
    };
    let ((plain, plain_lse), (got, got_lse)) = (merge(false), merge(true));
    check_sinked("merge_two with sinks", &got, &got_lse, &plain, &plain_lse, &sink);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn launchers_reject_bad_arguments_before_launching() {
    let (s, dev) = (stream(), gpu());
    let buf = upload(&s, &vec![0.0f32; 4 * 512]);
    let lse = upload(&s, &[0.0f32; 4]);
    let m = MergeTwo {
        out_a: CombineRows::F32(view(&s, &buf)),
        lse_a: view(&s, &lse),
        out_b: CombineRows::F32(view(&s, &buf)),
        lse_b: view(&s, &lse),
        lse_a_base: LseBase::E,
        lse_b_base: LseBase::E,
        out: CombineRows::F32(view(&s, &buf)),
        lse: view(&s, &lse),
        rows: 5,
        sink: None,
    };
    let e = merge_two(dev, raw(&s), &m).unwrap_err();
    assert_eq!(e.argument(), Some("out_a"), "{e}");
    // the two inputs in different dtypes
    let half = upload(&s, &vec![bf16::ZERO; 4 * 512]);
    let mixed = MergeTwo { rows: 4, out_b: CombineRows::Bf16(view(&s, &half)), ..m };
    let e = merge_two(dev, raw(&s), &mixed).unwrap_err();
    assert_eq!(e.argument(), Some("out_b"), "{e}");
}

/// One CUDA graph holding an ag_rs correction, an a2a combine and a two-way merge, replayed with
/// new lse values (and outs) written into the same device buffers between replays.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_reads_new_lse() {
    let dev = gpu();
    let s = dev.context().new_stream().expect("stream");
    let mut rng = Rng::new(seed());
    let (d, t, h_l) = (4, 32, 8);
    let h = d * h_l;
    let rows = t * h_l;
    let slot = a2a_aligned_slot_bytes(t, h_l).unwrap();
    assert_eq!(slot, a2a_slot_bytes(t, h_l));

    let mut d_ag_out = upload(&s, &vec![bf16::ZERO; t * h * D_V]);
    let mut d_ag_lse = upload(&s, &vec![0.0f32; d * t * h]);
    let mut d_contrib = upload(&s, &vec![POISON_F32; h * t * D_V]);
    let mut d_recv = upload(&s, &vec![0u8; d * slot]);
    let mut d_a2a_out = upload(&s, &vec![bf16::from_bits(POISON_BF16); rows * D_V]);
    let mut d_a2a_lse = upload(&s, &vec![POISON_F32; rows]);
    let mut d_m_a = upload(&s, &vec![0.0f32; rows * D_V]);
    let mut d_m_lse_a = upload(&s, &vec![0.0f32; rows]);
    let mut d_m_b = upload(&s, &vec![0.0f32; rows * D_V]);
    let mut d_m_lse_b = upload(&s, &vec![0.0f32; rows]);
    let mut d_m_out = upload(&s, &vec![POISON_F32; rows * D_V]);
    let mut d_m_lse = upload(&s, &vec![POISON_F32; rows]);

    let rank = 2;
    let correct = AgRsCorrect {
        out: CombineRows::Bf16(view(&s, &d_ag_out)),
        lse_all: view(&s, &d_ag_lse),
        lse_base: LseBase::Two,
        contrib: CombineRows::F32(view(&s, &d_contrib)),
        group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
        rank,
    };
    let combine = A2aCombine {
        recv: view(&s, &d_recv),
        slot_bytes: slot,
        lse_base: LseBase::E,
        out: CombineRows::Bf16(view(&s, &d_a2a_out)),
        lse: view(&s, &d_a2a_lse),
        group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
        sink: None,
    };
    let merge = MergeTwo {
        out_a: CombineRows::F32(view(&s, &d_m_a)),
        lse_a: view(&s, &d_m_lse_a),
        out_b: CombineRows::F32(view(&s, &d_m_b)),
        lse_b: view(&s, &d_m_lse_b),
        lse_a_base: LseBase::E,
        lse_b_base: LseBase::E,
        out: CombineRows::F32(view(&s, &d_m_out)),
        lse: view(&s, &d_m_lse),
        rows,
        sink: None,
    };
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin_capture");
    let launched = ag_rs_correct(dev, raw(&s), &correct)
        .and_then(|_| a2a_combine(dev, raw(&s), &combine))
        .and_then(|_| merge_two(dev, raw(&s), &merge));
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).expect("end_capture").expect("a graph");
    launched.expect("launch during capture");

    for replay in 0..3 {
        let tag = format!("graph replay {replay}");
        // ag_rs inputs
        let ag = partials(&mut rng, d, t, h, true);
        s.memcpy_htod(&to_bf16(ag.rank_out(rank)), &mut d_ag_out).unwrap();
        s.memcpy_htod(&ag.lse, &mut d_ag_lse).unwrap();
        s.memcpy_htod(&vec![POISON_F32; h * t * D_V], &mut d_contrib).unwrap();
        // a2a inputs: what the D sources packed for this rank
        let a2a = partials(&mut rng, d, t, h, true);
        let recv: Vec<u8> = (0..d)
            .flat_map(|r| {
                let packed = ref_a2a_pack(&to_bf16(a2a.rank_out(r)), a2a.rank_lse(r), d, t, h);
                packed[rank * slot..(rank + 1) * slot].to_vec()
            })
            .collect();
        s.memcpy_htod(&recv, &mut d_recv).unwrap();
        s.memcpy_htod(&vec![bf16::from_bits(POISON_BF16); rows * D_V], &mut d_a2a_out).unwrap();
        s.memcpy_htod(&vec![POISON_F32; rows], &mut d_a2a_lse).unwrap();
        // two-way inputs
        let two = partials(&mut rng, 2, rows, 1, false);
        s.memcpy_htod(two.rank_out(0), &mut d_m_a).unwrap();
        s.memcpy_htod(two.rank_lse(0), &mut d_m_lse_a).unwrap();
        s.memcpy_htod(two.rank_out(1), &mut d_m_b).unwrap();
        s.memcpy_htod(two.rank_lse(1), &mut d_m_lse_b).unwrap();
        s.memcpy_htod(&vec![POISON_F32; rows * D_V], &mut d_m_out).unwrap();
        s.memcpy_htod(&vec![POISON_F32; rows], &mut d_m_lse).unwrap();

        graph.launch().expect("graph launch");
        s.synchronize().unwrap();

        let reference = ag_rs_contribution(rank, ag.rank_out(rank), &ag.lse, d, t, h, LseBase::Two);
        check_close(&format!("{tag}: ag_rs contribution"), &download(&s, &d_contrib), &reference);

        let want = oracle(&a2a, LseBase::E).for_rank(t, h, h_l, rank);
        check_out_bf16(&format!("{tag}: a2a out"), &download(&s, &d_a2a_out), &want);
        check_lse(&format!("{tag}: a2a lse"), &download(&s, &d_a2a_lse), &want.lse);

        let want = oracle(&two, LseBase::E);
        check_out_f32(&format!("{tag}: merge_two out"), &download(&s, &d_m_out), &want);
        check_lse(&format!("{tag}: merge_two lse"), &download(&s, &d_m_lse), &want.lse);
    }
}
