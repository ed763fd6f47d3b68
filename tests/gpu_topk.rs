//! Sparse top-k under DCP (docs/contract.md §6) on the GPU against the CPU reference
//! (`dcp_mla::reference::topk`), bit for bit: local top-k, candidate packing, the global merge and
//! the compaction with and without page translation.
//!
//! Inputs are fresh random rows of several characters (distinct scores, a few levels so that
//! ties dominate, all zeros, a narrow band sharing the top key bits, NaN/±inf/−0 mixed in, all
//! NaN), lengths 0, 1, K−1, K, K+1, long rows, negative and over-long lengths, ids above 2^24,
//! permuted block tables with holes, a score buffer of more than 2^31 elements, and one CUDA
//! graph replayed with new device-side lengths, scores and candidates. Outputs are poisoned first.

mod common;

use common::*;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaSlice;
use dcp_mla::ops::topk::*;
use dcp_mla::reference::topk as reference;
use dcp_mla::runtime::DeviceSlice;
use dcp_mla::DcpLayout;

const POISON: i32 = -0x2152_4111;
const KS: [usize; 4] = [256, 512, 1024, 2048];
const ROW_KINDS: usize = 8;

/// One row of `n` scores of character `kind` (0..ROW_KINDS).
fn score_row(rng: &mut Rng, kind: usize, n: usize) -> Vec<f32> {
    let specials = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0, 0.0, -f32::NAN];
    (0..n)
        .map(|_| match kind {
            0 => rng.unit() * 100.0,
            1 => rng.below(5) as f32 - 2.0,
            2 => 0.0,
            // one binade, few mantissa values: every key shares its top 12 bits
            3 => 1.0 + rng.below(3000) as f32 * f32::powi(2.0, -20),
            4 => {
                if rng.below(4) == 0 {
                    specials[rng.below(specials.len() as u64) as usize]
                } else {
                    rng.unit()
                }
            }
            // almost all equal, a few larger ones
            5 => {
                if rng.below(100) == 0 {
                    2.0 + rng.unit()
                } else {
                    1.0
                }
            }
            6 => f32::NAN,
            _ => {
                if rng.below(2) == 0 {
                    -0.0
                } else {
                    0.0
                }
            }
        })
        .collect()
}

fn check_i32(what: &str, got: &[i32], want: &[i32], width: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let row = i / width;
        panic!(
            "{what}: first mismatch at row {row} column {}: got {} want {}\n got row:  {:?}\n want row: {:?}",
            i % width,
            got[i],
            want[i],
            &got[row * width..(row * width + width).min(got.len())].iter().take(64).collect::<Vec<_>>(),
            &want[row * width..(row * width + width).min(want.len())].iter().take(64).collect::<Vec<_>>()
        );
    }
}

/// The local top-k test's shape for one K: every row kind at each of `lens`, then one row of a
/// random length; the schedules run on each of `cols` (`cols[0]` also takes the launcher's own
/// schedule). Lengths past a column count clamp to it, in the kernel and the reference alike
/// (docs/semantics.md).
struct LocalCase {
    /// Not a multiple of 4: rows start misaligned (and every fourth one aligned).
    row_stride: usize,
    cols: Vec<usize>,
    lens: Vec<i32>,
    /// The random row's length is K + 1 + below(random_span).
    random_span: u64,
}

/// The whole test, or with `small` (DCP_MLA_TEST_TOPK_SMALL=1) a sanitizer-sized one that keeps
/// the cluster kernels' paths (`small_case_keeps_the_cluster_paths` checks them): one column
/// count of 16,408 for every schedule, so that one CTA holds a whole row (its load's unrolled
/// loop, a list overflowed by ties in a CTA of more than 8,192 elements) and so do clusters of 2
/// (8,204 a CTA, above the list's 8,192) and 4 (every CTA listed), with rows ending inside the
/// first CTA's chunk and a later one's, and one clamped length instead of two.
fn local_case(k: usize, small: bool) -> LocalCase {
    let k = k as i32;
    if small {
        let row_stride = 16_411;
        LocalCase {
            row_stride,
            cols: vec![row_stride - 3],
            lens: vec![0, 1, k - 1, k, k + 1, 2 * k + 3, 10_001, row_stride as i32, -3],
            random_span: 12_000,
        }
    } else {
        // On 40,000 and 16,000 columns: chunk boundaries fall inside the rows, lengths end inside
        // and before a CTA's chunk.
        let row_stride = 40_003;
        LocalCase {
            row_stride,
            cols: vec![row_stride - 3, 16_000],
            lens: vec![0, 1, k - 1, k, k + 1, 2 * k + 3, 5_000, 40_003, 50_000, -3],
            random_span: 30_000,
        }
    }
}

/// DCP_MLA_TEST_TOPK_SMALL=1: the sanitizer-sized local top-k ([`local_case`], clusters of 1, 2
/// and 4 only); `scripts/gpu-run.sh racecheck-topk-local` sets it for the cluster families.
fn small() -> bool {
    match std::env::var("DCP_MLA_TEST_TOPK_SMALL") {
        Err(_) => false,
        Ok(v) if v.is_empty() || v == "0" => false,
        Ok(v) if v == "1" => true,
        Ok(v) => panic!("DCP_MLA_TEST_TOPK_SMALL={v}: 0 or 1"),
    }
}

/// The cluster sizes the small case runs: one CTA (no cluster barriers), 2 and 4.
const SMALL_CLUSTERS: [usize; 3] = [1, 2, 4];

#[test]
#[ignore = "needs a CUDA GPU"]
fn local_topk_matches_reference() {
    let s = stream();
    let dev = gpu();
    let mut rng = Rng::new(seed());
    let small = small();
    for k in ks() {
        let LocalCase { row_stride, cols: all_cols, lens: lens_of_kind, random_span } = local_case(k, small);
        let mut scores = Vec::new();
        let mut lens = Vec::new();
        let mut kinds = Vec::new();
        for kind in 0..ROW_KINDS {
            for &len in &lens_of_kind {
                scores.extend(score_row(&mut rng, kind, row_stride));
                lens.push(len);
                kinds.push(kind);
            }
        }
        // a row with a random length
        scores.extend(score_row(&mut rng, 0, row_stride));
        lens.push(k as i32 + 1 + rng.below(random_span) as i32);
        kinds.push(0);
        let rows = lens.len();

        let d_scores = upload(&s, &scores);
        let d_lens = upload(&s, &lens);
        let mut d_out = upload(&s, &vec![POISON; rows * k]);
        let cols = all_cols[0];
        let args = LocalTopk {
            scores: view(&s, &d_scores),
            row_stride,
            cols,
            lens: view(&s, &d_lens),
            rows,
            k,
            out: view(&s, &d_out),
        };
        local_topk(dev, raw(&s), &args).expect("local_topk");
        let got = download(&s, &d_out);
        let want_of = |cols| reference::local_topk(&scores, rows, row_stride, cols, &lens, k);
        let want = want_of(cols);
        for r in 0..rows {
            check_i32(
                &format!("local top-k K = {k}, row {r} (kind {}, len {})", kinds[r], lens[r]),
                &got[r * k..(r + 1) * k],
                &want[r * k..(r + 1) * k],
                k,
            );
        }
        for (i, &cols) in all_cols.iter().enumerate() {
            let want = if i == 0 { want.clone() } else { want_of(cols) };
            for schedule in schedules(dev, cols, small) {
                s.memcpy_htod(&vec![POISON; rows * k], &mut d_out).unwrap();
                local_topk_with(dev, raw(&s), &LocalTopk { cols, ..args }, schedule).expect("local_topk_with");
                let got = download(&s, &d_out);
                for r in 0..rows {
                    check_i32(
                        &format!("{schedule:?}, cols {cols}, K = {k}, row {r} (kind {}, len {})", kinds[r], lens[r]),
                        &got[r * k..(r + 1) * k],
                        &want[r * k..(r + 1) * k],
                        k,
                    );
                }
            }
        }
    }
}

/// One CTA per row, and on Hopper every cluster size that fits `cols` columns (with `small`
/// only [`SMALL_CLUSTERS`]), whole and half keys.
/// DCP_MLA_TEST_TOPK_SCHEDULES=cta,cluster,half keeps only those families, so that a sanitizer
/// run fits a device call (`scripts/gpu-run.sh racecheck-topk-local` sets it; `tests` never
/// does); a filter that leaves nothing fails rather than running nothing.
fn schedules(dev: &dcp_mla::runtime::Device, cols: usize, small: bool) -> Vec<TopkSchedule> {
    let hopper = dev.compute_capability().0 >= 9;
    if !hopper {
        eprintln!("compute capability below 9.0: top-k clusters not run");
    }
    let only = std::env::var("DCP_MLA_TEST_TOPK_SCHEDULES").ok();
    let v = schedule_list(hopper, cols, small, only.as_deref());
    if let Some(only) = only {
        eprintln!("DCP_MLA_TEST_TOPK_SCHEDULES={only}: cols {cols}: {v:?}");
    }
    v
}

/// [`schedules`] without the device and the environment (a CPU test checks it).
fn schedule_list(hopper: bool, cols: usize, small: bool, only: Option<&str>) -> Vec<TopkSchedule> {
    let mut v = vec![TopkSchedule::CtaPerRow];
    if hopper {
        let sizes =
            |fewest: usize| (fewest.max(1)..=TOPK_CLUSTER_MAX).filter(move |c| !small || SMALL_CLUSTERS.contains(c));
        v.extend(sizes(cols.div_ceil(TOPK_CLUSTER_CHUNK)).map(|ctas| TopkSchedule::Cluster { ctas }));
        v.extend(sizes(cols.div_ceil(TOPK_CLUSTER_CHUNK_HALF)).map(|ctas| TopkSchedule::HalfKeyCluster { ctas }));
    }
    if let Some(only) = only {
        let keep: Vec<&str> = only.split(',').map(str::trim).collect();
        for f in &keep {
            assert!(
                ["cta", "cluster", "half"].contains(f),
                "DCP_MLA_TEST_TOPK_SCHEDULES={only}: `{f}` is not cta, cluster or half"
            );
        }
        v.retain(|s| {
            keep.contains(&match s {
                TopkSchedule::CtaPerRow => "cta",
                TopkSchedule::Cluster { .. } => "cluster",
                TopkSchedule::HalfKeyCluster { .. } => "half",
            })
        });
        assert!(!v.is_empty(), "DCP_MLA_TEST_TOPK_SCHEDULES={only} leaves no schedule for {cols} columns");
    }
    v
}

/// Per CTA of a `ctas`-CTA cluster, how many of a row's `len` elements it holds (len already
/// clamped to `cols`): `topk_local_cluster`'s chunk, ceil(cols / ctas) rounded up to 4.
fn cluster_counts(cols: usize, ctas: usize, len: usize) -> Vec<usize> {
    let chunk = cols.div_ceil(ctas).next_multiple_of(4);
    (0..ctas).map(|c| len.saturating_sub(c * chunk).min(chunk)).collect()
}

/// The sanitizer-sized case keeps every path of the cluster kernels that the whole test takes
/// (kernels-src/topk.cuh, `topk_local_cluster`), for every K, whole and half keys, clusters of
/// 1, 2 and 4: a CTA's unrolled load (an aligned row of ≥ 16,384 of its elements), its list
/// overflowing (a row of equal keys with > 8,192 elements in a CTA) and not, scalar tails (a
/// count not a multiple of 4, and for half keys of 8), rows ending inside a later CTA's chunk and
/// CTAs with nothing. And it costs a small part of the whole test under a sanitizer (cost counted
/// as cluster CTAs of rows longer than K, each ~ 8,000 elements' accesses, plus elements).
#[test]
fn small_case_keeps_the_cluster_paths() {
    const TIE_KIND: usize = 2; // all zeros: every key equal
    let cost = |k: usize, small: bool| {
        let case = local_case(k, small);
        let mut total = 0;
        for (i, &cols) in case.cols.iter().enumerate() {
            let mut launches = schedule_list(true, cols, small, Some("cluster"));
            if i == 0 {
                launches.push(TopkSchedule::Cluster { ctas: 1 }); // the launcher's own (at most one CTA)
            }
            for s in launches {
                let TopkSchedule::Cluster { ctas } = s else { unreachable!() };
                for &len in case.lens.iter().chain([&(k as i32 + case.random_span as i32 / 2)]) {
                    let len = len.clamp(0, cols as i32) as usize;
                    if len > k {
                        total += ROW_KINDS * (ctas * 8_000 + len);
                    }
                }
            }
        }
        total
    };
    for k in KS {
        let case = local_case(k, true);
        let &[cols] = &case.cols[..] else { panic!("one column count") };
        assert!(case.row_stride % 4 != 0 && cols < case.row_stride);
        assert!(k as u64 + case.random_span < cols as u64, "the random row's length fits");
        let all = schedule_list(true, cols, true, None);
        let want: Vec<TopkSchedule> = [TopkSchedule::CtaPerRow]
            .into_iter()
            .chain(SMALL_CLUSTERS.map(|ctas| TopkSchedule::Cluster { ctas }))
            .chain(SMALL_CLUSTERS.map(|ctas| TopkSchedule::HalfKeyCluster { ctas }))
            .collect();
        assert_eq!(all, want, "K = {k}: every family, clusters of 1, 2 and 4");
        assert_eq!(schedule_list(false, cols, true, None), [TopkSchedule::CtaPerRow]);
        assert_eq!(schedule_list(true, cols, true, Some("cluster, half")), want[1..]);

        // (row, its length clamped, its kind) of every working row (longer than K)
        let (lens, per_kind) = (&case.lens, case.lens.len());
        let rows: Vec<(usize, usize, usize)> = (0..ROW_KINDS)
            .flat_map(|kind| lens.iter().enumerate().map(move |(j, &len)| (kind * per_kind + j, len, kind)))
            .map(|(row, len, kind)| (row, len.clamp(0, cols as i32) as usize, kind))
            .filter(|&(_, len, _)| len > k)
            .collect();
        for schedule in &all[1..] {
            let (TopkSchedule::Cluster { ctas } | TopkSchedule::HalfKeyCluster { ctas }) = *schedule else {
                unreachable!()
            };
            let half = matches!(schedule, TopkSchedule::HalfKeyCluster { .. });
            let chunk = cols.div_ceil(ctas).next_multiple_of(4);
            assert!(chunk <= if half { TOPK_CLUSTER_CHUNK_HALF } else { TOPK_CLUSTER_CHUNK });
            // every (row, CTA): (row, kind, CTA, its start, its count)
            let ctas_of = rows.iter().flat_map(|&(row, len, kind)| {
                cluster_counts(cols, ctas, len).into_iter().enumerate().map(move |(c, n)| (row, kind, c, c * chunk, n))
            });
            let has = |what: &str, f: &dyn Fn(usize, usize, usize, usize, usize) -> bool| {
                assert!(
                    ctas_of.clone().any(|(r, kind, c, start, n)| f(r, kind, c, start, n)),
                    "K = {k}, {schedule:?}: {what}"
                );
            };
            has("a listed CTA with a scalar tail", &|_, _, _, _, n| n > 0 && n <= 8192 && n % 4 != 0);
            if half {
                has("a CTA with a tail past its 16-byte reads of top halves", &|_, _, _, _, n| n % 8 != 0);
            }
            if ctas <= 2 {
                has("a CTA of equal keys overflowing its list", &|_, kind, _, _, n| kind == TIE_KIND && n > 8192);
            }
            if ctas == 1 {
                let aligned = |r: usize, start: usize| (r * case.row_stride + start) % 4 == 0;
                has("an aligned CTA through the unrolled load", &|r, _, _, start, n| {
                    aligned(r, start) && n / 4 >= 4 * 1024
                });
                has("a misaligned CTA", &|r, _, _, start, n| !aligned(r, start) && n > 0);
            } else {
                has("a row ending inside a later CTA's chunk", &|_, _, c, _, n| c > 0 && n > 0 && n < chunk);
                has("a CTA with nothing of a working row", &|_, _, _, _, n| n == 0);
            }
        }
        let (small, whole) = (cost(k, true), cost(k, false));
        eprintln!(
            "K = {k}: the small case's cluster family costs {:.3} of the whole test's",
            small as f64 / whole as f64
        );
        assert!(small * 6 < whole, "K = {k}: the small case costs {small} against the whole test's {whole}");
    }
}

/// The K values the local top-k test runs: all of KS, or DCP_MLA_TEST_TOPK_K's (a comma list of
/// them) for a sanitizer run split by K; a value outside KS fails.
fn ks() -> Vec<usize> {
    let Ok(only) = std::env::var("DCP_MLA_TEST_TOPK_K") else { return KS.to_vec() };
    let v: Vec<usize> = only.split(',').map(|k| k.trim().parse().expect("DCP_MLA_TEST_TOPK_K: a list of K")).collect();
    assert!(!v.is_empty() && v.iter().all(|k| KS.contains(k)), "DCP_MLA_TEST_TOPK_K={only}: K in {KS:?}");
    v
}

/// A score buffer of 2^31 + 2^20 elements: row 1 starts at 2^31 − 2^20 and crosses 2^31, so a
/// 32-bit row offset or index would read the wrong scores. Runs local top-k and pack on it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn local_topk_and_pack_beyond_2_pow_31_elements() {
    let s = stream();
    let dev = gpu();
    let mut rng = Rng::new(seed());
    let k = 2048;
    let cols = 1usize << 21;
    let row_stride = (1usize << 31) - (1 << 20);
    let rows = 2;
    let mut big: CudaSlice<f32> = s.alloc_zeros(row_stride + cols).expect("8.6 GB score buffer");
    let host: Vec<Vec<f32>> = (0..rows).map(|r| score_row(&mut rng, [0, 4][r], cols)).collect();
    for (r, row) in host.iter().enumerate() {
        s.memcpy_htod(row, &mut big.slice_mut(r * row_stride..r * row_stride + cols)).unwrap();
    }
    let lens = vec![cols as i32, cols as i32 - 7];
    let d_lens = upload(&s, &lens);
    let d_out = upload(&s, &vec![POISON; rows * k]);
    let args =
        LocalTopk { scores: view(&s, &big), row_stride, cols, lens: view(&s, &d_lens), rows, k, out: view(&s, &d_out) };
    local_topk(dev, raw(&s), &args).expect("local_topk");
    let got = download(&s, &d_out);
    let dcp = DcpLayout { size: 8, interleave: 2 };
    let rank = 5;
    let d_cs = upload(&s, &vec![f32::from_bits(POISON as u32); rows * k]);
    let d_ci = upload(&s, &vec![POISON; rows * k]);
    let pack = PackCandidates {
        local_idx: view(&s, &d_out),
        scores: view(&s, &big),
        row_stride,
        cols,
        rows,
        k,
        dcp,
        rank,
        cand_scores: view(&s, &d_cs),
        cand_ids: view(&s, &d_ci),
    };
    pack_candidates(dev, raw(&s), &pack).expect("pack_candidates");
    let (got_s, got_i) = (download(&s, &d_cs), download(&s, &d_ci));
    // Clusters hold at most 8 · 32,768 columns (8 · 65,536 with half keys): rows 2^31 − 2^16
    // apart put row 1's across 2^31.
    if dev.compute_capability().0 >= 9 {
        let c_stride = (1usize << 31) - (1 << 16);
        for (schedule, c_cols) in [
            (TopkSchedule::Cluster { ctas: 8 }, TOPK_CLUSTER_MAX * TOPK_CLUSTER_CHUNK),
            (TopkSchedule::HalfKeyCluster { ctas: 8 }, TOPK_CLUSTER_MAX * TOPK_CLUSTER_CHUNK_HALF),
        ] {
            let c_lens = upload(&s, &vec![c_cols as i32; rows]);
            let c_args = LocalTopk { row_stride: c_stride, cols: c_cols, lens: view(&s, &c_lens), ..args };
            let c_out = upload(&s, &vec![POISON; rows * k]);
            local_topk_with(dev, raw(&s), &LocalTopk { out: view(&s, &c_out), ..c_args }, schedule)
                .expect("local_topk_with");
            let got_c = download(&s, &c_out);
            // row 1 of this view is host row 1 from 2^20 − 2^16 on
            let tail = (1usize << 20) - (1 << 16);
            for (r, row) in [&host[0][..c_cols], &host[1][tail..tail + c_cols]].into_iter().enumerate() {
                let want = reference::local_topk(row, 1, c_cols, c_cols, &[c_cols as i32], k);
                check_i32(&format!("2^31 buffer, {schedule:?}, row {r}"), &got_c[r * k..(r + 1) * k], &want, k);
            }
        }
    }
    for r in 0..rows {
        let want = reference::local_topk(&host[r], 1, cols, cols, &lens[r..r + 1], k);
        check_i32(&format!("2^31 buffer, row {r}"), &got[r * k..(r + 1) * k], &want, k);
        let (ws, wi) = reference::pack_candidates(&want, &host[r], cols, cols, k, dcp, rank);
        check_i32(&format!("2^31 buffer pack ids, row {r}"), &got_i[r * k..(r + 1) * k], &wi, k);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits() as i32).collect::<Vec<_>>();
        check_i32(&format!("2^31 buffer pack scores, row {r}"), &bits(&got_s[r * k..(r + 1) * k]), &bits(&ws), k);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pack_matches_reference_with_large_ids() {
    let s = stream();
    let dev = gpu();
    let mut rng = Rng::new(seed());
    for (d, i) in [(1, 1), (2, 1), (4, 3), (8, 1), (8, 4)] {
        let dcp = DcpLayout { size: d, interleave: i };
        let rank = rng.below(d as u64) as usize;
        let (rows, k) = (5, 512);
        // 2.5M local positions: global ids up to ~2·10^7 > 2^24 at D = 8
        let cols = 2_500_000 + rng.below(1000) as usize;
        let row_stride = cols + 3;
        let scores: Vec<f32> = (0..rows).flat_map(|r| score_row(&mut rng, [0, 4, 1, 6, 3][r], row_stride)).collect();
        let idx: Vec<i32> = (0..rows * k)
            .map(|j| match rng.below(8) {
                0 => -1,
                1 => (cols - 1 - (j % 7)) as i32,
                // at or past cols (inside the stride): an unused slot, never read
                2 => (cols + (j % 3)) as i32,
                _ => rng.below(cols as u64) as i32,
            })
            .collect();
        let d_scores = upload(&s, &scores);
        let d_idx = upload(&s, &idx);
        let d_cs = upload(&s, &vec![f32::from_bits(POISON as u32); rows * k]);
        let d_ci = upload(&s, &vec![POISON; rows * k]);
        let args = PackCandidates {
            local_idx: view(&s, &d_idx),
            scores: view(&s, &d_scores),
            row_stride,
            cols,
            rows,
            k,
            dcp,
            rank,
            cand_scores: view(&s, &d_cs),
            cand_ids: view(&s, &d_ci),
        };
        pack_candidates(dev, raw(&s), &args).expect("pack_candidates");
        let (ws, wi) = reference::pack_candidates(&idx, &scores, row_stride, cols, k, dcp, rank);
        let got_i = download(&s, &d_ci);
        check_i32(&format!("pack ids D = {d} I = {i} rank {rank}"), &got_i, &wi, k);
        assert!(wi.iter().any(|&x| x > 1 << 24) || d < 8, "the case must produce ids above 2^24");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits() as i32).collect::<Vec<_>>();
        check_i32(&format!("pack scores D = {d} I = {i}"), &bits(&download(&s, &d_cs)), &bits(&ws), k);
    }
}

/// Candidates [D, rows, K] with rows of different character. Ids are distinct (an odd multiple
/// of the candidate index modulo 2^30, plus an offset), up to 2^30.
fn candidates(rng: &mut Rng, d: usize, rows: usize, k: usize) -> (Vec<f32>, Vec<i32>) {
    let n = d * k;
    let mut cs = vec![f32::NEG_INFINITY; d * rows * k];
    let mut ci = vec![-1i32; d * rows * k];
    let off = rng.below(1 << 30);
    for row in 0..rows {
        let kind = row % 10;
        let at = |c: usize| ((c / k) * rows + row) * k + c % k;
        let valid_count = match kind {
            0 => 0,
            1 => 1 + rng.below(k as u64 / 2) as usize,
            2 => k.min(n),
            3 => (k + 1).min(n),
            _ => n - rng.below(n as u64 / 4) as usize,
        };
        let mut slots: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut slots);
        for &c in &slots[..valid_count] {
            let id = ((c as u64 * 2_654_435_761 + off + row as u64 * 977) % (1 << 30)) as i32;
            let score = match kind {
                4 => rng.below(3) as f32,
                5 => 0.5,
                6 => [f32::NAN, f32::NEG_INFINITY, -0.0, 0.0, 1.0][rng.below(5) as usize],
                _ => rng.unit(),
            };
            cs[at(c)] = score;
            ci[at(c)] = id;
        }
        // invalid candidates with garbage scores must not count
        for &c in &slots[valid_count..] {
            if rng.below(2) == 0 {
                cs[at(c)] = 1e30;
            }
        }
        if kind == 7 && valid_count > 4 {
            // duplicate (score, id) pairs: the earlier candidate wins a tie on both
            for j in 0..valid_count / 4 {
                let (a, b) = (slots[j], slots[valid_count - 1 - j]);
                cs[at(b)] = cs[at(a)];
                ci[at(b)] = ci[at(a)];
            }
        }
    }
    (cs, ci)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn global_merge_matches_reference() {
    let s = stream();
    let dev = gpu();
    let mut rng = Rng::new(seed());
    for d in [1, 2, 4, 8] {
        for k in KS {
            let rows = 23;
            let (cs, ci) = candidates(&mut rng, d, rows, k);
            let d_cs = upload(&s, &cs);
            let d_ci = upload(&s, &ci);
            let d_out = upload(&s, &vec![POISON; rows * k]);
            let args = GlobalMerge {
                cand_scores: view(&s, &d_cs),
                cand_ids: view(&s, &d_ci),
                dcp_size: d,
                rows,
                k,
                out: view(&s, &d_out),
            };
            let launched = global_merge(dev, raw(&s), &args);
            if d * k % 512 != 0 {
                // docs/contract.md §6: refused at run time, naming D and K, before anything is launched
                let e = launched.unwrap_err().to_string();
                assert!(e.contains(&format!("D = {d}")) && e.contains(&format!("K = {k}")), "{e}");
                assert!(download(&s, &d_out).iter().all(|&x| x == POISON), "a refused merge wrote its output");
                continue;
            }
            launched.expect("global_merge");
            let want = reference::global_merge(&cs, &ci, d, rows, k);
            check_i32(&format!("global merge D = {d} K = {k}"), &download(&s, &d_out), &want, k);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn compact_matches_reference() {
    let s = stream();
    let dev = gpu();
    let mut rng = Rng::new(seed());
    for (d, i) in [(1, 1), (2, 1), (4, 1), (4, 2), (8, 4)] {
        let dcp = DcpLayout { size: d, interleave: i };
        for k in KS {
            let (q, requests, block_size) = (2, 3, 16);
            let rows = q * requests;
            let span = 200 * block_size * d; // global positions drawn below this
            let ids: Vec<i32> =
                (0..rows * k).map(|_| if rng.below(5) == 0 { -1 } else { rng.below(span as u64) as i32 }).collect();
            // Pages for 150 of the 200 columns a request may need: a column beyond the stride gives -1.
            let stride = 150;
            let mut pages: Vec<i32> = (0..(requests * stride) as i32).collect();
            rng.shuffle(&mut pages);
            for p in pages.iter_mut() {
                if rng.below(20) == 0 {
                    *p = -1;
                }
            }
            let d_ids = upload(&s, &ids);
            let d_table = upload(&s, &pages);
            for rank in 0..d {
                for translate in [false, true] {
                    let d_out = upload(&s, &vec![POISON; rows * k]);
                    let d_counts = upload(&s, &vec![POISON; rows]);
                    let args = Compact {
                        ids: view(&s, &d_ids),
                        rows,
                        k,
                        dcp,
                        rank,
                        translate: translate.then(|| PageTranslate {
                            block_table: view(&s, &d_table),
                            stride,
                            block_size,
                            rows_per_request: q,
                        }),
                        out: view(&s, &d_out),
                        counts: view(&s, &d_counts),
                    };
                    compact(dev, raw(&s), &args).expect("compact");
                    let t = reference::PageTranslate { block_table: &pages, stride, block_size, rows_per_request: q };
                    let (want, want_counts) = reference::compact(&ids, k, dcp, rank, translate.then_some(t));
                    let tag = format!("compact D = {d} I = {i} K = {k} rank {rank} translate {translate}");
                    check_i32(&tag, &download(&s, &d_out), &want, k);
                    check_i32(&format!("{tag}: counts"), &download(&s, &d_counts), &want_counts, rows);
                }
            }
        }
    }
}

/// Local top-k → pack into rank 0's slot of a D = 2 candidate buffer (rank 1's slot is written
/// by the host, standing in for the all-gather) → global merge → compaction with translation,
/// captured once in a CUDA graph and replayed with new lengths, scores, candidates and tables.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_reads_new_lengths_and_indices() {
    let dev = gpu();
    let s = dev.context().new_stream().expect("stream");
    let mut rng = Rng::new(seed());
    let dcp = DcpLayout { size: 2, interleave: 1 };
    let (rows, k, row_stride, q, block_size) = (6, 512, 9_000, 2, 64);
    let requests = rows / q;
    let stride = 9_000usize.div_ceil(block_size) * 2 + 1;

    let mut d_scores = upload(&s, &vec![0.0f32; rows * row_stride]);
    let mut d_lens = upload(&s, &vec![0i32; rows]);
    let d_idx = upload(&s, &vec![POISON; rows * k]);
    let mut d_cs = upload(&s, &vec![0.0f32; 2 * rows * k]);
    let mut d_ci = upload(&s, &vec![0i32; 2 * rows * k]);
    let d_merged = upload(&s, &vec![POISON; rows * k]);
    let mut d_table = upload(&s, &vec![0i32; requests * stride]);
    let mut d_out = upload(&s, &vec![POISON; rows * k]);
    let mut d_counts = upload(&s, &vec![POISON; rows]);

    let topk = LocalTopk {
        scores: view(&s, &d_scores),
        row_stride,
        cols: row_stride,
        lens: view(&s, &d_lens),
        rows,
        k,
        out: view(&s, &d_idx),
    };
    // SAFETY: rank 0's slot is the first rows·k elements of the [2, rows, k] buffers.
    let (slot_s, slot_i) = unsafe {
        (
            DeviceSlice::<f32>::from_raw(view(&s, &d_cs).ptr(), rows * k),
            DeviceSlice::<i32>::from_raw(view(&s, &d_ci).ptr(), rows * k),
        )
    };
    let pack = PackCandidates {
        local_idx: view(&s, &d_idx),
        scores: view(&s, &d_scores),
        row_stride,
        cols: row_stride,
        rows,
        k,
        dcp,
        rank: 0,
        cand_scores: slot_s,
        cand_ids: slot_i,
    };
    let merge = GlobalMerge {
        cand_scores: view(&s, &d_cs),
        cand_ids: view(&s, &d_ci),
        dcp_size: 2,
        rows,
        k,
        out: view(&s, &d_merged),
    };
    let comp = Compact {
        ids: view(&s, &d_merged),
        rows,
        k,
        dcp,
        rank: 0,
        translate: Some(PageTranslate { block_table: view(&s, &d_table), stride, block_size, rows_per_request: q }),
        out: view(&s, &d_out),
        counts: view(&s, &d_counts),
    };
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin_capture");
    let launched = local_topk(dev, raw(&s), &topk)
        .and_then(|_| pack_candidates(dev, raw(&s), &pack))
        .and_then(|_| global_merge(dev, raw(&s), &merge))
        .and_then(|_| compact(dev, raw(&s), &comp));
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).expect("end_capture").expect("a graph");
    launched.expect("launch during capture");

    for replay in 0..3 {
        let scores: Vec<f32> =
            (0..rows).flat_map(|r| score_row(&mut rng, (r + replay) % ROW_KINDS, row_stride)).collect();
        let lens: Vec<i32> = (0..rows)
            .map(|r| match (r + replay) % 3 {
                0 => rng.below(k as u64 + 1) as i32,
                _ => rng.below(row_stride as u64 + 1) as i32,
            })
            .collect();
        // rank 1's candidates: its own local top-k of fresh scores, packed
        let other: Vec<f32> = (0..rows).flat_map(|_| score_row(&mut rng, 0, row_stride)).collect();
        let other_lens: Vec<i32> = (0..rows).map(|_| rng.below(row_stride as u64 + 1) as i32).collect();
        let other_idx = reference::local_topk(&other, rows, row_stride, row_stride, &other_lens, k);
        let (os, oi) = reference::pack_candidates(&other_idx, &other, row_stride, row_stride, k, dcp, 1);
        let mut table: Vec<i32> = (0..(requests * stride) as i32).collect();
        rng.shuffle(&mut table);

        s.memcpy_htod(&scores, &mut d_scores).unwrap();
        s.memcpy_htod(&lens, &mut d_lens).unwrap();
        s.memcpy_htod(&os, &mut d_cs.slice_mut(rows * k..)).unwrap();
        s.memcpy_htod(&oi, &mut d_ci.slice_mut(rows * k..)).unwrap();
        s.memcpy_htod(&table, &mut d_table).unwrap();
        s.memcpy_htod(&vec![POISON; rows * k], &mut d_out).unwrap();
        s.memcpy_htod(&vec![POISON; rows], &mut d_counts).unwrap();
        graph.launch().expect("graph launch");
        s.synchronize().unwrap();

        let tag = format!("graph replay {replay}");
        let idx = reference::local_topk(&scores, rows, row_stride, row_stride, &lens, k);
        check_i32(&format!("{tag}: local top-k"), &download(&s, &d_idx), &idx, k);
        let (ms, mi) = reference::pack_candidates(&idx, &scores, row_stride, row_stride, k, dcp, 0);
        let cs = [ms, os].concat();
        let ci = [mi, oi].concat();
        let merged = reference::global_merge(&cs, &ci, 2, rows, k);
        check_i32(&format!("{tag}: global merge"), &download(&s, &d_merged), &merged, k);
        let t = reference::PageTranslate { block_table: &table, stride, block_size, rows_per_request: q };
        let (want, counts) = reference::compact(&merged, k, dcp, 0, Some(t));
        check_i32(&format!("{tag}: compact"), &download(&s, &d_out), &want, k);
        check_i32(&format!("{tag}: counts"), &download(&s, &d_counts), &counts, rows);
    }
}
