//! `dcp-mla tune` (issue 53 item 2): its plan of runs, the plan's time estimate, and the
//! measuring loop that fills a tuned table ([`dcp_mla::planner::tune`]).
//!
//! The grid: every shape class of the engine view ([`ENGINE_SHAPES`]), of the flushed decode
//! rows of `dcp-mla bench` (but MODEL1's: no tuned class) and of the attention inside its DCP step rows ([`step_parts`]: the
//! small-context, many-head shapes DCP makes), each once; for each class, every decode variant
//! this build ships for its kind ([`decode_variants`]) × candidate split counts ([`split_candidates`]). The split schedule kernel
//! has no knob of its own in kernels.toml, so the split count is its only axis.
//!
//! Each (variant, split count) of a class is timed as `dcp-mla bench` times a flushed row
//! ([`Timer::median_ms`]: the L2 evicted before each launch, median after warm-ups), over the
//! same inputs (one allocation a class: shuffled block table, random cache), the first launch
//! computing its split schedule and the timed ones reusing it, as a step's layers do. The
//! launcher's own choice (`DecodePath::Auto` with the heuristic's split count) is timed on the
//! same inputs, so the table says what tuning bought for each class.

use super::{
    ragged_len, step_parts, BenchRow, Case, DecodeInputs, DecodeSpec, StepShape, Target, Timer, DECODE_ENGINE_FAMILY,
    ENGINE_SHAPES,
};
use dcp_mla::catalogue::{decode_variants, variant_name};
use dcp_mla::error::Result;
use dcp_mla::formats::{KvFormat, D_QK, D_V};
use dcp_mla::ops::decode::{DecodePath, DecodeSchedule};
use dcp_mla::planner::split::{row_blocks_per_seq, MAX_SPLITS};
use dcp_mla::planner::tune::{DecodeClass, TuneRow};
use dcp_mla::rng::Rng;
use dcp_mla::runtime::{Device, Stream};

/// What `dcp-mla tune` may take on the GPU (issue 53: one command of at most 8 minutes).
pub const TUNE_BUDGET_S: f64 = 480.0;

/// One (variant, split count) of a class.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneRun {
    /// As [`dcp_mla::catalogue::variant_name`] spells it.
    pub variant: String,
    pub path: DecodePath,
    pub num_splits: usize,
}

/// One class of the grid: where it comes from, its inputs, and its runs.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneClass {
    pub class: DecodeClass,
    /// The bench row (family and shape) whose inputs it measures.
    pub source: String,
    pub spec: DecodeSpec,
    /// What the launcher runs without a table (its heuristic's kernel and split count): the
    /// baseline a run must beat, by [`WIN_MARGIN`], to become the class's row.
    pub heuristic: TuneRun,
    pub runs: Vec<TuneRun>,
}

impl TuneClass {
    /// The run that launches what the heuristic launches (on Hopper the grid always has it): its
    /// timing is the heuristic's baseline, so the launch is timed once.
    pub fn heuristic_run(&self) -> Option<usize> {
        self.runs.iter().position(|r| *r == self.heuristic)
    }
}

/// How much faster than the heuristic a run must measure, on equal and on ragged lengths
/// alike, to replace it in the table: two timings of one configuration in one tune run differ
/// by up to ~2% (H100, 2026-12-06), and the fastest of fifteen runs is biased low by as much.
pub const WIN_MARGIN: f64 = 0.02;

/// The plan of runs of one `dcp-mla tune` on a card of `num_sms` SMs.
#[derive(Debug, Clone, PartialEq)]
pub struct TunePlan {
    pub num_sms: usize,
    pub classes: Vec<TuneClass>,
}

/// The class of a decode launch over `spec`, as the launcher looks it up
/// ([`dcp_mla::planner::choice::DecodeShape::class`]): never `ragged`, since a launcher cannot
/// know its lengths; a dense class is measured on equal and ragged lengths both instead.
pub fn class_of(spec: &DecodeSpec) -> DecodeClass {
    spec.shape().class()
}

/// `spec`'s lengths made ragged: each request's drawn uniformly from [L/8, L] (L its length in
/// `spec`), as engines' batches and the engine view's ragged rows have them, seeded by `seed`.
/// Sparse specs (a fixed top-k a row) are returned as they are.
pub fn ragged_spec(spec: &DecodeSpec, seed: u64) -> DecodeSpec {
    if spec.sparse {
        return spec.clone();
    }
    let mut rng = Rng::new(seed);
    let q = spec.q.max(1);
    let mut row_lens = Vec::with_capacity(spec.row_lens.len());
    for rows in spec.row_lens.chunks(q) {
        // every row of a request holds its length L (the causal rule shifts rows in the kernel)
        let l = rows.iter().copied().max().unwrap_or(0).max(0) as u64;
        let drawn = ragged_len(&mut rng, l) as i32;
        row_lens.extend(rows.iter().map(|&r| r - rows[rows.len() - 1] + drawn));
    }
    DecodeSpec { row_lens, ragged: true, ..spec.clone() }
}

/// The split counts tried for `spec` on `num_sms` SMs: unsplit, half a wave, the heuristic's,
/// a wave and two (a wave: `num_sms` / row blocks a sequence), each in 1..=[`MAX_SPLITS`], once.
pub fn split_candidates(spec: &DecodeSpec, num_sms: usize) -> Vec<usize> {
    let rb = row_blocks_per_seq(spec.q, spec.h, spec.sparse);
    let wave = (num_sms / rb).clamp(1, MAX_SPLITS);
    let mut v = vec![1, wave.div_ceil(2), spec.heuristic_splits(num_sms), wave, (2 * wave).min(MAX_SPLITS)];
    v.sort_unstable();
    v.dedup();
    v
}

/// The shapes the grid covers, in order (the first of a class stands for it): the engine view,
/// the flushed `mla_decode` rows, then the attention of the DCP step rows.
fn grid_rows() -> Vec<BenchRow> {
    let mut v: Vec<BenchRow> =
        ENGINE_SHAPES.iter().map(|&e| BenchRow::new(DECODE_ENGINE_FAMILY, Case::Engine(e), Target::None)).collect();
    v.extend(super::rows().into_iter().filter(|r| r.family == "mla_decode"));
    for sparse in [false, true] {
        for h_l in [8, 16] {
            for sk in [8192, 32768] {
                for q in [1, 6] {
                    for d in [1, 2, 4, 8] {
                        let parts = step_parts(StepShape { sparse, h_l, sk, q, d });
                        v.extend(
                            parts
                                .into_iter()
                                .filter(|c| matches!(c, Case::Dense { .. } | Case::Sparse { .. }))
                                .map(|c| BenchRow::new("dcp_step", c, Target::None)),
                        );
                    }
                }
            }
        }
    }
    // Short sequences across batch sizes: both tables ran b = 64's unsplit (dense 16 tiles a
    // sequence, and sparse H = 128's at K = 512); these classes say at which
    // batch sizes that holds before the heuristic takes it up (NOTES.md, next steps).
    for b in [8, 16, 32, 128] {
        v.push(BenchRow::new("mla_decode", Case::Dense { b, q: 1, h: 64, sk: 1024 }, Target::None));
        for h in [64, 128] {
            let case = Case::Sparse { format: KvFormat::Fp8_656, b, q: 1, h, k: 512 };
            v.push(BenchRow::new("mla_decode", case, Target::None));
        }
    }
    v
}

/// The plan for a card of `num_sms` SMs; `filter` keeps the classes whose label or source
/// contains it.
pub fn tune_plan(num_sms: usize, filter: Option<&str>) -> Result<TunePlan> {
    // the table is for Hopper cards (the wgmma kernels): the baseline is the heuristic there
    let sm90 = true;
    let mut classes: Vec<TuneClass> = Vec::new();
    for row in grid_rows() {
        let Some(mut spec) = DecodeSpec::of(&row)? else { continue };
        if spec.model1 {
            // MODEL1 has no tuned class: its rows launch the launcher's kernel at the planner's split count
            continue;
        }
        if spec.ragged {
            // a class's "equal" set: every request at the context (ragged_spec draws the other)
            spec = DecodeSpec { row_lens: vec![spec.context as i32; spec.row_lens.len()], ragged: false, ..spec };
        }
        let class = class_of(&spec);
        if classes.iter().any(|c| c.class == class) {
            continue;
        }
        let source = row.name();
        if filter.is_some_and(|f| !class.label().contains(f) && !source.contains(f)) {
            continue;
        }
        let splits = split_candidates(&spec, num_sms);
        let shape = spec.shape();
        let Some(path) = shape.heuristic_path(sm90) else { continue };
        let heuristic = TuneRun { variant: variant_name(path), path, num_splits: shape.heuristic_splits(num_sms) };
        let runs = decode_variants(spec.format, spec.sparse)
            .into_iter()
            .flat_map(|(variant, path)| {
                splits.iter().map(move |&num_splits| TuneRun { variant: variant.clone(), path, num_splits })
            })
            .collect();
        classes.push(TuneClass { class, source, spec, heuristic, runs });
    }
    Ok(TunePlan { num_sms, classes })
}

/// What the estimate of a plan's time assumes about the card. [`H100_MODEL`]'s figures come
/// from docs/performance.md and PERF.md's H100 measurements; the estimate is a model, not a
/// measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CardModel {
    /// A decode kernel's streaming rate, GB/s (the H100's copy: 3,032).
    pub stream_gbs: f64,
    /// Dense compute-bound attention, TFLOP/s (FlashMLA's H100 b128 q1 H128: ~580).
    pub dense_tflops: f64,
    /// Sparse FP8 attention, TFLOP/s (FlashMLA's H100 K2048 rows: ~300).
    pub sparse_tflops: f64,
    /// µs a CTA spends on one 64-token tile at best (the H200's 2.07 µs at H = 128, × its
    /// 1,980 / 1,755 MHz clock ratio to the H100).
    pub tile_us: f64,
    /// Fixed µs a launch: dense (the split's schedule and combine), sparse (34.6, fitted to quad
    /// before its removal; lead's has not been fitted).
    pub dense_fixed_us: f64,
    pub sparse_fixed_us: f64,
    /// How much slower the mma.sync kernel is assumed than wgmma (a guess, not measured here).
    pub mma_factor: f64,
    /// µs around each timed launch: the L2 eviction (256 MiB read) and the event round trip.
    pub per_launch_us: f64,
    /// Seconds to set up a class (host random data) and per GB of its device buffers.
    pub setup_s: f64,
    pub setup_s_per_gb: f64,
    /// Seconds before the first class: the context and the kernel modules.
    pub startup_s: f64,
}

/// The H100 SXM model of the estimate (see [`CardModel`]).
pub const H100_MODEL: CardModel = CardModel {
    stream_gbs: 2900.0,
    dense_tflops: 580.0,
    sparse_tflops: 300.0,
    tile_us: 2.3,
    dense_fixed_us: 12.0,
    sparse_fixed_us: 35.0,
    mma_factor: 3.0,
    per_launch_us: 90.0 + 30.0,
    setup_s: 0.3,
    setup_s_per_gb: 0.05,
    startup_s: 5.0,
};

/// Estimated µs of one launch of `spec` as `path` in `num_splits` parts on `num_sms` SMs: the
/// larger of the roofline (bytes at the streaming rate, FLOPs at the compute rate) and the
/// longest CTA's tiles in series (waves × tiles a part × `tile_us`), plus the fixed cost;
/// × `mma_factor` for the mma.sync kernel.
pub fn estimate_launch_us(
    spec: &DecodeSpec,
    path: DecodePath,
    num_splits: usize,
    num_sms: usize,
    m: &CardModel,
) -> f64 {
    let rb = row_blocks_per_seq(spec.q, spec.h, spec.sparse);
    let (seqs, tokens_per_seq, bytes, flops, rate, fixed) = if spec.sparse {
        let rows = spec.b * spec.q;
        let bytes = rows * spec.topk * spec.format.token_bytes();
        let flops = 2.0 * (rows * spec.h * spec.topk) as f64 * (D_QK + D_V) as f64;
        (rows, spec.topk, bytes, flops, m.sparse_tflops, m.sparse_fixed_us)
    } else {
        let longest = spec.row_lens.iter().copied().max().unwrap_or(0).max(0) as usize;
        let keys: usize = spec.row_lens.iter().map(|&l| l.max(0) as usize).sum();
        let tokens: usize =
            spec.row_lens.chunks(spec.q.max(1)).map(|r| r.iter().copied().max().unwrap_or(0) as usize).sum();
        let flops = 2.0 * (keys * spec.h) as f64 * (D_QK + D_V) as f64;
        (spec.b, longest, tokens * D_QK * 2, flops, m.dense_tflops, m.dense_fixed_us)
    };
    let roofline = (bytes as f64 / (m.stream_gbs * 1e3)).max(flops / (rate * 1e6));
    let p = num_splits.max(1);
    let ctas = seqs * rb * p;
    let waves = ctas.div_ceil(num_sms.max(1));
    let serial = waves as f64 * tokens_per_seq.div_ceil(64).div_ceil(p) as f64 * m.tile_us;
    let t = roofline.max(serial) + fixed;
    if path == DecodePath::Mma {
        t * m.mma_factor
    } else {
        t
    }
}

/// Estimated seconds of `plan` with `warmup` + `reps` launches a run and a timed heuristic
/// baseline a class, under `m`: what `dcp-mla tune --dry-run` prints.
pub fn estimate_s(plan: &TunePlan, warmup: usize, reps: usize, m: &CardModel) -> f64 {
    // in f64: a sum of two counts may not fit in usize
    let per_run = warmup as f64 + reps as f64;
    let mut s = m.startup_s;
    for c in &plan.classes {
        s += m.setup_s + m.setup_s_per_gb * c.spec.device_bytes() as f64 / 1e9;
        // dense runs are timed on equal and on ragged lengths
        let sets = if c.spec.sparse { 1.0 } else { 2.0 };
        for r in c.runs.iter().chain(c.heuristic_run().is_none().then_some(&c.heuristic)) {
            let us = estimate_launch_us(&c.spec, r.path, r.num_splits, plan.num_sms, m);
            s += sets * per_run * (us + m.per_launch_us) / 1e6;
        }
    }
    s
}

/// A run's µs on the class's equal lengths and (dense) on ragged ones ([`ragged_spec`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub equal: f64,
    pub ragged: Option<f64>,
}

impl Timing {
    /// Its worse ratio to `base` over the two length sets (below 1: faster on both).
    pub fn worst_ratio(&self, base: &Timing) -> f64 {
        let r = self.equal / base.equal;
        match (self.ragged, base.ragged) {
            (Some(a), Some(b)) => r.max(a / b),
            _ => r,
        }
    }
}

/// One class measured: the heuristic's time and every run's (or why it failed).
#[derive(Debug, Clone)]
pub struct Measured {
    pub class: DecodeClass,
    pub source: String,
    /// The heuristic's run ([`TuneClass::heuristic`]) and its time, or why it failed.
    pub heuristic_run: TuneRun,
    pub heuristic: std::result::Result<Timing, String>,
    pub runs: Vec<(TuneRun, std::result::Result<Timing, String>)>,
}

impl Measured {
    /// The class's row: the run whose worse ratio to the heuristic (equal and ragged lengths) is
    /// lowest, if it is below 1 − [`WIN_MARGIN`]; else the heuristic's own run, so that the
    /// class keeps its heuristic rather than borrowing a neighbour's row. With the heuristic
    /// failed, the fastest run on equal lengths; `None` when every run failed.
    pub fn best(&self) -> Option<TuneRow> {
        let ok = self.runs.iter().filter_map(|(r, t)| t.as_ref().ok().map(|t| (r, *t)));
        let (run, t) = match &self.heuristic {
            Ok(h) => {
                let (run, t) = ok.min_by(|a, b| a.1.worst_ratio(h).total_cmp(&b.1.worst_ratio(h)))?;
                if t.worst_ratio(h) < 1.0 - WIN_MARGIN {
                    (run, t)
                } else {
                    (&self.heuristic_run, *h)
                }
            }
            Err(_) => ok.min_by(|a, b| a.1.equal.total_cmp(&b.1.equal))?,
        };
        let h = self.heuristic.as_ref().ok();
        Some(TuneRow {
            class: self.class,
            variant: run.variant.clone(),
            path: run.path,
            num_splits: run.num_splits,
            us: Some(t.equal),
            heuristic_us: h.map(|h| h.equal),
            ragged_us: t.ragged,
            heuristic_ragged_us: h.and_then(|h| h.ragged),
        })
    }
}

/// Times every run of `plan` on `dev` with `timer` (its warm-up and repetitions), class by
/// class; `progress` hears each class's label before it runs. A failing run is recorded and the
/// loop goes on (a kernel fault leaves the context unusable: every later run then fails too).
pub fn measure_plan(
    dev: &Device,
    timer: &mut Timer,
    plan: &TunePlan,
    progress: &mut dyn FnMut(usize, &TuneClass),
) -> Result<Vec<Measured>> {
    let s = timer.stream().clone();
    let st = Stream::from_cudarc(&s);
    let mut out = Vec::with_capacity(plan.classes.len());
    for (i, c) in plan.classes.iter().enumerate() {
        progress(i, c);
        let max_splits = c.runs.iter().chain([&c.heuristic]).map(|r| r.num_splits).max().unwrap_or(1);
        let mut rng = Rng::new(0x7e57_0000 + i as u64);
        // dense: equal lengths and ragged ones (a run must win on both); sparse: one set
        let mut specs = vec![c.spec.clone()];
        if !c.spec.sparse {
            specs.push(ragged_spec(&c.spec, 0x7e57_ba5e + i as u64));
        }
        let inputs =
            match specs.iter().map(|sp| DecodeInputs::new(&s, &mut rng, sp, max_splits)).collect::<Result<Vec<_>>>() {
                Ok(x) => x,
                Err(e) => {
                    let why = format!("inputs: {e}");
                    let runs = c.runs.iter().map(|r| (r.clone(), Err(why.clone()))).collect();
                    let heuristic_run = c.heuristic.clone();
                    out.push(Measured {
                        class: c.class,
                        source: c.source.clone(),
                        heuristic_run,
                        heuristic: Err(why),
                        runs,
                    });
                    continue;
                }
            };
        // the first launch computes the split schedule, the timed ones reuse it
        let mut time = |r: &TuneRun| -> std::result::Result<Timing, String> {
            let mut us = Vec::with_capacity(inputs.len());
            for inp in &inputs {
                let mut args = inp.args(&s, r.num_splits);
                let mut launch = || {
                    let x = args.launch(dev, st, r.path);
                    args.common_mut().schedule = DecodeSchedule::Reuse;
                    x
                };
                us.push(timer.median_ms(&mut launch).map(|ms| ms * 1e3).map_err(|e| e.to_string())?);
            }
            Ok(Timing { equal: us[0], ragged: us.get(1).copied() })
        };
        let runs: Vec<_> = c.runs.iter().map(|r| (r.clone(), time(r))).collect();
        let heuristic = match c.heuristic_run() {
            Some(i) => runs[i].1.clone(),
            None => time(&c.heuristic),
        };
        out.push(Measured {
            class: c.class,
            source: c.source.clone(),
            heuristic_run: c.heuristic.clone(),
            heuristic,
            runs,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{rows, DECODE_GRAPH_FAMILY};
    use dcp_mla::formats::KvFormat;

    #[test]
    fn the_plan_covers_the_engine_view_and_the_bench_rows() {
        let plan = tune_plan(132, None).unwrap();
        let classes: Vec<DecodeClass> = plan.classes.iter().map(|c| c.class).collect();
        let mut sources = rows()
            .into_iter()
            .filter(|r| ["mla_decode", DECODE_GRAPH_FAMILY, DECODE_ENGINE_FAMILY].contains(&r.family))
            // MODEL1's rows are not tuned (no tuned class)
            .filter(|r| !matches!(r.case, Case::Model1 { .. }))
            .collect::<Vec<_>>();
        sources
            .extend(ENGINE_SHAPES.iter().map(|&e| BenchRow::new(DECODE_ENGINE_FAMILY, Case::Engine(e), Target::None)));
        for r in sources {
            let spec = DecodeSpec::of(&r).unwrap().unwrap();
            assert!(classes.contains(&class_of(&spec)), "{} has no class in the plan", r.name());
        }
        // each class once; the engine rows first, named by their shapes
        for (i, c) in classes.iter().enumerate() {
            assert!(!classes[..i].contains(c), "{} twice", c.label());
        }
        assert_eq!(plan.classes[0].source, "mla_decode_engine dense b128 q1 H64 8K");
        // DCP's shapes are in: b = 64, H = 8·4, a quarter of 32K
        let shape = dcp_mla::planner::choice::DecodeShape {
            sparse: false,
            format: KvFormat::Bf16,
            batch: 64,
            nq: 1,
            heads: 32,
            context: 8192,
            causal: false,
        };
        let dcp = shape.class();
        assert!(classes.contains(&dcp));
    }

    #[test]
    fn runs_are_every_variant_times_the_splits() {
        let plan = tune_plan(132, Some("sparse fp8 b128 q2 H128")).unwrap();
        assert_eq!(plan.classes.len(), 1);
        let c = &plan.classes[0];
        let splits = split_candidates(&c.spec, 132);
        // mma and lead
        assert_eq!(c.runs.len(), 2 * splits.len());
        assert!(c.runs.iter().any(|r| r.variant == "wgmma-lead-64x2"));
        assert!(c.runs.iter().any(|r| r.variant == "mma"));
        // the heuristic's launch is always one of the runs (timed once, as its baseline)
        for c in &tune_plan(132, None).unwrap().classes {
            assert!(c.heuristic_run().is_some(), "{}", c.class.label());
        }
        // the heuristic's split count is always a candidate
        for c in &tune_plan(132, None).unwrap().classes {
            assert!(split_candidates(&c.spec, 132).contains(&c.spec.heuristic_splits(132)), "{}", c.class.label());
        }
        // dense q = 1 H = 64 on 132 SMs: 1, 66, 128 (the heuristic), 132, 264
        let plan = tune_plan(132, Some("dense b128 q1 H64 8K")).unwrap();
        assert_eq!(split_candidates(&plan.classes[0].spec, 132), [1, 66, 128, 132, 264]);
    }

    #[test]
    fn the_estimate_fits_the_budget() {
        let plan = tune_plan(132, None).unwrap();
        let s = estimate_s(&plan, 3, 15, &H100_MODEL);
        assert!(s > 10.0 && s < TUNE_BUDGET_S, "{s} s");
        // the model against the H100's FlashMLA figures, within a factor of 1.5: dense
        // b128 q1 H64 8K 423 µs, sparse FP8 K2048 q1 H64 120 µs
        let find = |f: &str| tune_plan(132, Some(f)).unwrap().classes.remove(0);
        let dense = find("dense b128 q1 H64 8K");
        let wgmma = DecodePath::Wgmma { tile: 64, stages: 2, schedule: dcp_mla::catalogue::Sm90Schedule::Trio };
        let us = estimate_launch_us(&dense.spec, wgmma, 128, 132, &H100_MODEL);
        assert!((423.0 / 1.5..423.0 * 1.5).contains(&us), "{us}");
        // unsplit, a request's 128 tiles run in series on one CTA: slower
        assert!(estimate_launch_us(&dense.spec, wgmma, 1, 132, &H100_MODEL) >= us);
        let sparse = find("sparse fp8 b128 q1 H64 K2048");
        let us = estimate_launch_us(&sparse.spec, wgmma, 1, 132, &H100_MODEL);
        assert!((120.0 / 1.5..120.0 * 1.5).contains(&us), "{us}");
    }

    #[test]
    fn the_best_run_becomes_the_row_only_if_it_wins_on_both_length_sets() {
        let plan = tune_plan(132, Some("dense b128 q1 H64 8K")).unwrap();
        let c = &plan.classes[0];
        assert_eq!(c.heuristic.variant, "wgmma-trio-64x2");
        assert_eq!(c.heuristic.num_splits, 128);
        let t = |equal, ragged| Ok(Timing { equal, ragged: Some(ragged) });
        let measured = |times: Vec<std::result::Result<Timing, String>>| Measured {
            class: c.class,
            source: c.source.clone(),
            heuristic_run: c.heuristic.clone(),
            heuristic: t(425.0, 300.0),
            runs: c.runs.iter().cloned().zip(times.into_iter().chain(std::iter::repeat(t(999.0, 999.0)))).collect(),
        };
        // run 2 wins on both by more than the margin; run 0 is faster on equal lengths only
        let m = measured(vec![t(300.0, 400.0), Err("trap".into()), t(410.0, 285.0), t(430.0, 290.0)]);
        let row = m.best().unwrap();
        assert_eq!((row.variant.as_str(), row.num_splits), (c.runs[2].variant.as_str(), c.runs[2].num_splits));
        assert_eq!((row.us, row.heuristic_us, row.ragged_us), (Some(410.0), Some(425.0), Some(285.0)));
        // within the margin on one set: the heuristic's own run is the row
        let m = measured(vec![t(300.0, 299.0)]);
        let row = m.best().unwrap();
        assert_eq!((row.variant.as_str(), row.num_splits), ("wgmma-trio-64x2", 128));
        assert_eq!(row.us, Some(425.0));
        // the heuristic failed: the fastest on equal lengths
        let m = Measured { heuristic: Err("x".into()), ..measured(vec![t(300.0, 400.0), t(310.0, 200.0)]) };
        assert_eq!(m.best().unwrap().num_splits, c.runs[0].num_splits);
        let none = Measured { runs: vec![(c.runs[0].clone(), Err("x".into()))], ..m };
        assert!(none.best().is_none());
    }

    #[test]
    fn ragged_lengths_keep_each_request_within_an_eighth_and_its_length() {
        let plan = tune_plan(132, Some("dense b128 q2 H64 8K causal")).unwrap();
        let spec = &plan.classes[0].spec;
        let r = ragged_spec(spec, 7);
        assert!(r.ragged && r.row_lens.len() == spec.row_lens.len());
        for (rows, orig) in r.row_lens.chunks(2).zip(spec.row_lens.chunks(2)) {
            assert!(rows[1] >= orig[1] / 8 && rows[1] <= orig[1], "{rows:?}");
            assert_eq!(rows[1] - rows[0], orig[1] - orig[0], "the rows of a request keep their offsets");
        }
        assert_ne!(r.row_lens, spec.row_lens);
        assert_eq!(class_of(&r), class_of(spec), "one class for both length sets");
    }
}
