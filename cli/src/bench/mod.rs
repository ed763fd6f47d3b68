//! Benchmark definitions shared by `benches/kernels.rs` (criterion) and `dcp-mla bench`: CUDA-event
//! timing after warm-up, the same run's device-to-device copy ceiling, and one [`BenchRow`] per
//! shape of `docs/performance.md` with its target.
//!
//! Targets are ratios measured in one run (docs/performance.md): a fraction of the copy bandwidth measured
//! just before, FlashMLA's TFLOP/s on the same card, or a time against a baseline. Every timed
//! launch is preceded by an untimed *read* of a buffer larger than the L2 cache, so memory-bound
//! rows do not read their inputs from L2. Triton's `do_bench` writes that buffer instead, which
//! leaves the L2 full of dirty lines: the timed kernel then pays their write-back, up to doubling
//! the traffic of a kernel that moves less than the L2 holds.

use cudarc::driver::{sys, CudaSlice, CudaStream, DeviceRepr, DriverError};
use dcp_mla::error::{Error, Result};
use dcp_mla::formats::model1::{
    encode_model1_token, model1_page_bytes, Model1Pages, MODEL1_D_QK, MODEL1_D_V, MODEL1_TOKEN_BYTES,
};
use dcp_mla::formats::{KvFormat, D_LATENT, D_QK, D_ROPE, D_V};
use dcp_mla::ops::combine::{
    self, a2a_aligned_slot_bytes, A2aCombine, A2aPack, AgRsCorrect, CombineGroup, CombineRows, MergeTwo,
};
use dcp_mla::ops::decode::{
    self, DecodeCommon, DecodeOut, DecodePath, DecodeSchedule, DenseDecode, IndexLists, SparseDecode,
};
use dcp_mla::ops::fill::{kv_fill, KvFill, NewTokens};
use dcp_mla::ops::model1::{mla_decode_model1_on, Model1Decode, Model1Source};
use dcp_mla::ops::prefill::{self, piece_table, Flatten, Reorder};
use dcp_mla::ops::topk::{self, Compact, GlobalMerge, LocalTopk, PackCandidates, PageTranslate};
use dcp_mla::ops::RowsDtype;
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::planner::choice::DecodeShape;
use dcp_mla::planner::{plan_prefill_chunks, prefill_chunk_bytes, ChunkPlan, DcpLayout};
use dcp_mla::rng::Rng;
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use dcp_mla::LseBase;
use half::bf16;
use std::sync::Arc;
use std::time::Duration;

pub mod tune;

/// Bytes of the copy that measures the ceiling (read once, written once).
pub const COPY_BYTES: usize = 1 << 31;
/// Bytes read between timed launches to evict the L2 cache (H200: 50 MiB).
pub const L2_FLUSH_BYTES: usize = 256 << 20;

/// Maps a cudarc error to the library's, naming the driver call.
pub fn drv<T>(call: &'static str, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|source| Error::Driver { call, source })
}

/// Device 0 for a benchmark binary, or `{needs} a CUDA GPU: {error}` on stderr and exit code 2.
pub fn gpu_or_exit(needs: &str) -> Device {
    Device::open(0).unwrap_or_else(|e| {
        eprintln!("{needs} a CUDA GPU: {e}");
        std::process::exit(2)
    })
}

/// Milliseconds between two events recorded around `f` on `s`.
fn event_ms(s: &Arc<CudaStream>, iters: u64, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let ctx = s.context();
    // cudarc's default (None) disables timing.
    let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let a = drv("cuEventCreate", ctx.new_event(timed))?;
    let b = drv("cuEventCreate", ctx.new_event(timed))?;
    drv("cuEventRecord", a.record(s))?;
    for _ in 0..iters {
        f()?;
    }
    drv("cuEventRecord", b.record(s))?;
    drv("cuEventSynchronize", b.synchronize())?;
    Ok(drv("cuEventElapsedTime", a.elapsed_ms(&b))? as f64)
}

/// A row's same-bytes ceiling ([`Timer::same_bytes_copy`]): the two copies' µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SameBytesCopy {
    pub kernel_us: f64,
    pub memcpy_us: f64,
}

impl SameBytesCopy {
    /// The faster copy's µs: `copy_same_bytes_us`.
    pub fn us(&self) -> f64 {
        self.kernel_us.min(self.memcpy_us)
    }
}

/// The timer of one run: a stream and an L2-eviction buffer.
pub struct Timer<'a> {
    dev: &'a Device,
    stream: Arc<CudaStream>,
    /// Read (never written) before each timed launch ([`Device::evict_l2`]); `sink` is the
    /// eviction kernel's output, written never.
    flush: CudaSlice<u8>,
    sink: CudaSlice<u32>,
    /// Untimed launches before measuring.
    pub warmup: usize,
    /// Timed launches; the median is reported.
    pub reps: usize,
}

impl<'a> Timer<'a> {
    pub fn new(dev: &'a Device, stream: Arc<CudaStream>, warmup: usize, reps: usize) -> Result<Self> {
        let flush = drv("cuMemAlloc", stream.alloc_zeros::<u8>(L2_FLUSH_BYTES))?;
        let sink = drv("cuMemAlloc", stream.alloc_zeros::<u32>(1))?;
        Ok(Timer { dev, stream, flush, sink, warmup, reps: reps.max(1) })
    }

    /// Reads the whole flush buffer on the timer's stream: one launch of ~70 µs on an H200, so
    /// the host queues the timed launch while the GPU is still busy (launch latency stays out of
    /// the timed window).
    fn evict_l2(&self) -> Result<()> {
        let st = Stream::from_cudarc(&self.stream);
        self.dev.evict_l2(st, DeviceSlice::of(&self.flush, &self.stream), DeviceSlice::of(&self.sink, &self.stream))
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Median milliseconds of one call of `f` (timed with CUDA events, one launch per sample,
    /// the L2 cache evicted before each), after `warmup` untimed calls.
    pub fn median_ms(&mut self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..self.warmup {
            f()?;
        }
        let mut v = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            self.evict_l2()?;
            v.push(event_ms(&self.stream, 1, f)?);
        }
        Ok(median(&mut v))
    }

    /// The same-bytes ceiling of a row that moves `bytes` bytes (read plus written): the same
    /// run's device copy of half of them (its reads and writes make `bytes`), timed as a row is
    /// (L2 evicted before each launch, median), by the benchmarks' copy kernel
    /// ([`Device::copy_bytes`]) and by `cudaMemcpyAsync`.
    pub fn same_bytes_copy(&mut self, bytes: f64) -> Result<SameBytesCopy> {
        let half = ((bytes / 2.0).ceil() as usize).div_ceil(16).max(1) * 16;
        let s = self.stream.clone();
        let src = drv("cuMemAlloc", s.alloc_zeros::<u8>(half))?;
        let mut dst = drv("cuMemAlloc", s.alloc_zeros::<u8>(half))?;
        let st = Stream::from_cudarc(&s);
        let (a, b) = (DeviceSlice::of(&src, &s), DeviceSlice::of(&dst, &s));
        let dev = self.dev;
        let kernel_us = self.median_ms(&mut || dev.copy_bytes(st, a, b))? * 1e3;
        let memcpy_us = self.median_ms(&mut || drv("cuMemcpyDtoDAsync", s.memcpy_dtod(&src, &mut dst)))? * 1e3;
        Ok(SameBytesCopy { kernel_us, memcpy_us })
    }

    /// The ceiling of this run: GB/s of a [`COPY_BYTES`] device-to-device copy, bytes read plus
    /// bytes written, median of the timed copies.
    pub fn copy_gbs(&mut self) -> Result<f64> {
        let s = self.stream.clone();
        let src = drv("cuMemAlloc", s.alloc_zeros::<u8>(COPY_BYTES))?;
        let mut dst = drv("cuMemAlloc", s.alloc_zeros::<u8>(COPY_BYTES))?;
        let ms = self.median_ms(&mut || drv("cuMemcpyDtoDAsync", s.memcpy_dtod(&src, &mut dst)))?;
        Ok(2.0 * COPY_BYTES as f64 / ms / 1e6)
    }
}

/// The family of the rows [`measure_us`] times as a CUDA graph of layers ([`graph_layer_us`]).
pub const DECODE_GRAPH_FAMILY: &str = "mla_decode_graph";

/// The engine view (issue 53 item 3): the anchors' engine_view.py shapes ([`ENGINE_SHAPES`],
/// names as its rows spell them), the native launch path, [`GRAPH_LAYERS`] layers in one CUDA
/// graph, causal MTP rows and ragged lengths where the shape says so.
pub const DECODE_ENGINE_FAMILY: &str = "mla_decode_engine";

/// The engine view's shapes launched on the heuristic's kernel and split count (no tuned
/// table), timed as [`DECODE_ENGINE_FAMILY`]'s in the same run: what the tuned table buys, row
/// for row (the two families' rows share their shape strings).
pub const DECODE_ENGINE_HEURISTIC_FAMILY: &str = "mla_decode_engine_heuristic";

/// The diagnosis rows of the identity block table: the flushed decode shapes with each request's
/// pages in order (what `mla_decode` read before issue 53), beside the same shapes over a
/// shuffled table, to show what the page layout costs.
pub const DECODE_ORDERED_FAMILY: &str = "mla_decode_ordered";

/// Layers a `mla_decode_graph` row captures in one CUDA graph, each with its own KV cache (as a
/// model's layers have), replayed back to back with no L2 eviction: how an engine runs decode.
pub const GRAPH_LAYERS: usize = 4;
/// Timed replays of a `mla_decode_graph` row's graph (the median is reported).
const GRAPH_REPLAYS: usize = 10;
/// Timed replays of a `mla_decode_engine` row's graph (engine_view.py's 15).
const ENGINE_REPLAYS: usize = 15;

/// Timed replays of a family whose rows [`measure_us`] times as a graph of [`GRAPH_LAYERS`]
/// layers; `None` for a family of flushed launches.
pub fn graph_replays(family: &str) -> Option<usize> {
    match family {
        DECODE_GRAPH_FAMILY => Some(GRAPH_REPLAYS),
        DECODE_ENGINE_FAMILY | DECODE_ENGINE_HEURISTIC_FAMILY => Some(ENGINE_REPLAYS),
        _ => None,
    }
}

/// µs per layer of `row`'s decode, [`GRAPH_LAYERS`] layers captured in one CUDA graph on a new
/// stream (a capture needs one), replayed back to back with no L2 eviction: median of `replays`
/// replays after three untimed ones. Each layer's launch runs twice before the capture, so the
/// graph holds the launches that reuse their split schedule, as a step's layers do after the
/// first; an engine row's first layer computes its schedule in every replay, as a step's first
/// layer does ([`prepare_layer`]).
pub fn graph_layer_us(dev: &Device, row: &BenchRow, replays: usize) -> Result<f64> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let s = drv("cuStreamCreate", dev.context().new_stream())?;
    let mut layers = (0..GRAPH_LAYERS).map(|l| prepare_layer(dev, &s, row, l)).collect::<Result<Vec<_>>>()?;
    for _ in 0..2 {
        layers.iter_mut().try_for_each(|l| l())?;
    }
    drv("cuStreamSynchronize", s.synchronize())?;
    drv("cuStreamBeginCapture", s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))?;
    let captured = layers.iter_mut().try_for_each(|l| l());
    // end the capture whatever the launches returned, so the stream is usable again
    let graph = drv("cuStreamEndCapture", s.end_capture(CUgraphInstantiate_flags(0)))?;
    captured?;
    let graph = graph.ok_or_else(|| Error::Unsupported("an empty decode graph".into()))?;
    for _ in 0..3 {
        drv("cuGraphLaunch", graph.launch())?;
    }
    let mut v = Vec::with_capacity(replays.max(1));
    for _ in 0..replays.max(1) {
        v.push(event_ms(&s, 1, &mut || drv("cuGraphLaunch", graph.launch()))?);
    }
    Ok(median(&mut v) * 1e3 / GRAPH_LAYERS as f64)
}

/// µs of one `row` as `dcp-mla bench` reports it: a row of a graph family ([`graph_replays`]) per
/// layer of its graph ([`graph_layer_us`]), any other the median of `timer`'s flushed launches on
/// its stream.
pub fn measure_us(dev: &Device, timer: &mut Timer, row: &BenchRow) -> Result<f64> {
    if let Some(replays) = graph_replays(row.family) {
        return graph_layer_us(dev, row, replays);
    }
    let s = timer.stream().clone();
    let mut launch = prepare(dev, &s, row)?;
    Ok(timer.median_ms(&mut launch)? * 1e3)
}

/// Criterion's `iter_custom` body: `iters` back-to-back calls between two events.
pub fn events_elapsed(s: &Arc<CudaStream>, iters: u64, f: &mut dyn FnMut() -> Result<()>) -> Result<Duration> {
    Ok(Duration::from_secs_f64(event_ms(s, iters, f)? / 1e3))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// What a row must reach (docs/performance.md "Targets").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// At least this fraction of the same run's copy bandwidth.
    CopyFraction(f64),
    /// At least this fraction of the speed of the same run's copy of the row's own bytes
    /// ([`Timer::same_bytes_copy`]: its µs over the row's): a data-path row's fair ceiling.
    SameBytes(f64),
    /// At least this many TFLOP/s: FlashMLA's figure on the H200, or (MODEL1) a fraction of its
    /// figure on the card docs/performance.md names.
    Tflops(f64),
    /// At most this many µs.
    MaxUs(f64),
    /// At most `baseline_us / factor` µs (a baseline measured on the H200, e.g. torch or Triton).
    FasterThan { baseline_us: f64, factor: f64 },
    /// No target: measured for the record.
    None,
}

impl Target {
    pub fn describe(&self) -> String {
        match *self {
            Target::CopyFraction(f) => format!("≥ {:.0}% of copy", f * 100.0),
            Target::SameBytes(f) => format!("≥ {:.0}% of same-bytes copy", f * 100.0),
            Target::Tflops(t) => format!("≥ {t:.0} TFLOP/s"),
            Target::MaxUs(u) => format!("≤ {u} µs"),
            Target::FasterThan { baseline_us, factor: 1.0 } => format!("≤ {baseline_us} µs (baseline)"),
            Target::FasterThan { baseline_us, factor } => format!("≤ {baseline_us} µs / {factor}"),
            Target::None => "-".into(),
        }
    }

    /// Achieved over required: 1 or more meets the target; None without a target (or for
    /// [`Target::SameBytes`], whose ceiling is [`Target::ratio_with`]'s).
    pub fn ratio(&self, m: &Measurement, copy_gbs: f64) -> Option<f64> {
        self.ratio_with(m, copy_gbs, None)
    }

    /// [`Target::ratio`] with the row's same-bytes copy µs, when it was measured.
    pub fn ratio_with(&self, m: &Measurement, copy_gbs: f64, same_bytes_us: Option<f64>) -> Option<f64> {
        match *self {
            Target::CopyFraction(f) => Some(m.gbs() / copy_gbs / f),
            Target::SameBytes(f) => same_bytes_us.map(|c| c / m.us / f),
            Target::Tflops(t) => Some(m.tflops() / t),
            Target::MaxUs(u) => Some(u / m.us),
            Target::FasterThan { baseline_us, factor } => Some(baseline_us / factor / m.us),
            Target::None => None,
        }
    }
}

/// One timed row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    pub us: f64,
    /// Bytes the kernel must move at least (docs/performance.md's byte counts).
    pub bytes: f64,
    pub flops: f64,
}

impl Measurement {
    pub fn gbs(&self) -> f64 {
        self.bytes / self.us / 1e3
    }
    pub fn tflops(&self) -> f64 {
        self.flops / self.us / 1e6
    }
}

/// The shape of one benchmark row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Case {
    /// KV fill of `tokens` new tokens into a D = 1 cache.
    Fill { format: KvFormat, tokens: usize },
    /// Dense decode: b requests of s_k tokens, q rows, H heads, BF16 cache, automatic splits,
    /// the split schedule computed by the first (untimed) launch and reused by the timed ones, as
    /// a step's layers share it (and as FlashMLA's metadata is timed).
    Dense { b: usize, q: usize, h: usize, sk: usize },
    /// `Dense` with causal MTP rows (row j of a request sees L − q + 1 + j of its L tokens, the
    /// kernels' causal rule, as engines run speculative rows): beside the same shape's `Dense`
    /// row, what the causal rule costs.
    DenseCausal { b: usize, q: usize, h: usize, sk: usize },
    /// `Dense` with q = 1 and the split schedule computed by every launch (a step's first layer).
    DenseScheduled { b: usize, h: usize, sk: usize },
    /// Dense decode, q = 1, of a ramp of lengths: request i has s_k·(i + 1)/b tokens, with the
    /// automatic split-KV schedule (`split`, reused as in `Dense`) or one CTA per request: what
    /// balancing buys.
    DenseRamp { b: usize, h: usize, sk: usize, split: bool },
    /// Dense decode, q = 1, equal lengths, one CTA per request (no schedule, no combine): beside
    /// the same shape's `Dense` row, what a split launch's fixed cost is where it buys nothing.
    DenseUnsplit { b: usize, h: usize, sk: usize },
    /// Sparse decode: each query row attends to `k` distinct random tokens of its request's
    /// [`SPARSE_CONTEXT`]-token cache, addressed through the block table (page·B + offset).
    Sparse { format: KvFormat, b: usize, q: usize, h: usize, k: usize },
    /// MODEL1's sparse decode (FlashMLA's d_qk = 512 path over its page-wise FP8 cache, one
    /// source): each query row attends to `k` distinct random tokens of its request's
    /// [`SPARSE_CONTEXT`]-token cache, drawn as [`Case::Sparse`]'s are.
    Model1 { b: usize, q: usize, h: usize, k: usize },
    /// A shape of the engine view ([`ENGINE_SHAPES`]); its rows are [`DECODE_ENGINE_FAMILY`]'s.
    Engine(EngineShape),
    /// Two-way merge of T·H rows, `input` in, bf16 out.
    MergeTwo { t: usize, h: usize, input: RowsDtype },
    /// ag_rs step 1 on one rank: bf16 partials [T, H, 512] → a `contrib` contribution.
    AgRsCorrect { d: usize, t: usize, h: usize, contrib: RowsDtype },
    /// a2a receive side: D slots of T·(H/D) rows → bf16 out.
    A2aCombine { d: usize, t: usize, h: usize },
    /// Local top-k of `rows` rows of `n` random scores.
    TopkLocal { rows: usize, n: usize, k: usize },
    /// Packing one rank's local top-k of `rows` rows into candidates.
    TopkPack { rows: usize, k: usize, d: usize },
    /// Global merge of D·K candidates per row.
    TopkMerge { rows: usize, d: usize, k: usize },
    /// Compaction of merged ids for one rank, with page translation.
    TopkCompact { rows: usize, d: usize, k: usize },
    /// Prefix flatten of one rank's rows of a `prefix`-token chunk.
    Flatten { format: KvFormat, prefix: usize, d: usize },
    /// Reorder of the all-gathered [D, prefix/D, 576] buffer.
    Reorder { prefix: usize, d: usize },
    /// a2a send side: this rank's [T, H, 512] fp32 partial and lse packed into D bf16 slots.
    A2aPack { d: usize, t: usize, h: usize },
    /// One rank's local kernels of one layer's decode step ([`step_parts`]), without the NCCL
    /// collectives (see [`step_collectives_us`]); `d = 1` is the step without DCP.
    DcpStep(StepShape),
}

/// Tokens of each request's cache in a sparse row (the anchors': 32,768), of which each query
/// row draws its K distinct indices.
pub const SPARSE_CONTEXT: usize = 32768;

/// Tokens a page of every decode row's cache (the anchors' and FlashMLA's 64).
pub const DECODE_BLOCK: usize = 64;

/// One shape of the engine view: the anchors' engine_view.py `SHAPES`, its name included, so
/// that a comparer pairs the rows by family and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineShape {
    /// engine_view.py's name of the shape, the row's shape string.
    pub name: &'static str,
    /// Sparse FP8-656 over index lists, else dense BF16 over the block table.
    pub sparse: bool,
    pub b: usize,
    pub q: usize,
    pub h: usize,
    /// Dense: tokens a request (ragged: the most). Sparse: tokens of each request's cache.
    pub sk: usize,
    /// Sparse: indices a query row (0 for dense).
    pub topk: usize,
    /// Row j of a request sees its first L − q + 1 + j tokens (engines' MTP rows).
    pub causal: bool,
    /// Request lengths uniform in [s_k/8, s_k] ([`engine_lens`]).
    pub ragged: bool,
}

const fn dense_engine(
    name: &'static str,
    b: usize,
    q: usize,
    h: usize,
    sk: usize,
    causal: bool,
    ragged: bool,
) -> EngineShape {
    EngineShape { name, sparse: false, b, q, h, sk, topk: 0, causal, ragged }
}

const fn sparse_engine(name: &'static str, b: usize, q: usize, h: usize, sk: usize, topk: usize) -> EngineShape {
    EngineShape { name, sparse: true, b, q, h, sk, topk, causal: false, ragged: false }
}

/// The engine view's twelve shapes, in engine_view.py's order and spelling.
pub const ENGINE_SHAPES: [EngineShape; 12] = [
    dense_engine("dense b128 q1 H64 8K", 128, 1, 64, 8192, false, false),
    dense_engine("dense b128 q1 H128 8K", 128, 1, 128, 8192, false, false),
    dense_engine("dense b128 q2 H64 8K causal", 128, 2, 64, 8192, true, false),
    dense_engine("dense b128 q6 H64 8K causal", 128, 6, 64, 8192, true, false),
    dense_engine("dense b128 q1 H64 32K ragged", 128, 1, 64, 32768, false, true),
    dense_engine("dense b64 q1 H16 4K", 64, 1, 16, 4096, false, false),
    dense_engine("dense b32 q2 H128 16K causal", 32, 2, 128, 16384, true, false),
    dense_engine("dense b16 q6 H64 32K causal", 16, 6, 64, 32768, true, false),
    sparse_engine("sparse fp8 b128 q1 H64 K2048", 128, 1, 64, 32768, 2048),
    sparse_engine("sparse fp8 b128 q2 H128 K2048", 128, 2, 128, 32768, 2048),
    sparse_engine("sparse fp8 b32 q6 H64 K2048", 32, 6, 64, 32768, 2048),
    sparse_engine("sparse fp8 b64 q1 H128 K512", 64, 1, 128, 8192, 512),
];

/// The request lengths of an engine row: s_k each, or (ragged) uniform in [s_k/8, s_k] from a
/// generator seeded by the shape's name. Every layer of the row's graph takes the same lengths,
/// as a step's layers do.
pub fn engine_lens(e: &EngineShape) -> Vec<u64> {
    if !e.ragged {
        return vec![e.sk as u64; e.b];
    }
    // FNV-1a of the name: a seed that does not depend on the shape's place in the list
    let seed = e.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3));
    let mut rng = Rng::new(seed);
    (0..e.b).map(|_| ragged_len(&mut rng, e.sk as u64)).collect()
}

/// A ragged request's length under a context of `l` tokens: uniform in [l/8, l], as the engine
/// view's ragged rows and `dcp-mla tune`'s ragged set draw them.
pub fn ragged_len(rng: &mut Rng, l: u64) -> u64 {
    let lo = l / 8;
    lo + rng.below(l - lo + 1)
}

/// The [b, q] lengths a dense launch's rows see for requests of `lens` tokens: L each, or with
/// `causal` L − q + 1 + j for row j (the planner's `causal_local_lens` without DCP).
pub fn decode_row_lens(lens: &[u64], q: usize, causal: bool) -> Result<Vec<i32>> {
    if causal {
        return dcp_mla::planner::causal_local_lens(
            lens,
            &vec![q; lens.len()],
            DcpLayout { size: 1, interleave: 1 },
            0,
        );
    }
    let mut rows = Vec::with_capacity(lens.len() * q);
    for &l in lens {
        rows.extend(std::iter::repeat_n(dcp_mla::planner::check_i32("request length", l as u128)?, q));
    }
    Ok(rows)
}

/// A decode step of [`STEP_BATCH`] requests of `sk` tokens, `q` query rows each, `h_l` heads a
/// rank under tensor parallelism, dense BF16 or sparse FP8-656 with a top-k of [`STEP_TOPK`],
/// spread over a DCP group of `d` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    pub sparse: bool,
    pub h_l: usize,
    pub sk: usize,
    pub q: usize,
    pub d: usize,
}

/// The seed's step shapes: batch 64 (GLM-5.2 at TP8: H_l = 8; DeepSeek-V3 at TP8: H_l = 16).
pub const STEP_BATCH: usize = 64;
pub const STEP_TOPK: usize = 2048;

/// The kernels one rank runs in a step, in order. Without DCP: the fill of the batch's new
/// tokens, [the top-k over all `sk` scores], attention over `sk` tokens (sparse: K) with H_l
/// heads. With DCP: the fill of the rank's share of the new tokens (b/D), [local top-k over its
/// sk/D scores, candidate packing, the exact merge of D·K candidates, compaction to its own
/// tokens], attention over its sk/D tokens (sparse: ~K/D) with the gathered D·H_l heads, and
/// the a2a combine's pack and merge. The collectives between them are not here.
pub fn step_parts(st: StepShape) -> Vec<Case> {
    let StepShape { sparse, h_l, sk, q, d } = st;
    let (b, t, h) = (STEP_BATCH, STEP_BATCH * q, d * h_l);
    let format = if sparse { KvFormat::Fp8_656 } else { KvFormat::Bf16 };
    let mut v = vec![Case::Fill { format, tokens: b.div_ceil(d) }];
    if sparse {
        let k = STEP_TOPK;
        v.push(Case::TopkLocal { rows: t, n: sk / d, k });
        if d > 1 {
            v.push(Case::TopkPack { rows: t, k, d });
            v.push(Case::TopkMerge { rows: t, d, k });
            v.push(Case::TopkCompact { rows: t, d, k });
        }
        v.push(Case::Sparse { format, b, q, h, k: k / d });
    } else {
        v.push(Case::Dense { b, q, h, sk: sk / d });
    }
    if d > 1 {
        v.push(Case::A2aPack { d, t, h });
        v.push(Case::A2aCombine { d, t, h });
    }
    v
}

/// NCCL time a DCP step adds on each rank, µs, as measured at D = 2 on two H200s (NOTES.md at 628d1db,
/// "Multi-GPU decode step": b = 64, 32K, q = 1): the a2a all-to-all 24.7 µs (H_l = 8) / 27.9
/// (H_l = 16); the query-head all-gather and (sparse) the candidate all-gather were not timed
/// apart, and are taken as the measured lse all-gather, 17 µs each (messages of the same
/// latency-bound size class). Stated constants, used for every D and q until `bench-step`
/// measures them on the machine.
pub fn step_collectives_us(st: StepShape) -> f64 {
    if st.d == 1 {
        return 0.0;
    }
    let all_to_all = if st.h_l <= 8 { STEP_A2A_US[0] } else { STEP_A2A_US[1] };
    let gathers = if st.sparse { 2.0 } else { 1.0 };
    all_to_all + gathers * STEP_GATHER_US
}
/// The a2a all-to-all at H_l = 8 and 16, and one all-gather (see [`step_collectives_us`]).
const STEP_A2A_US: [f64; 2] = [24.7, 27.9];
const STEP_GATHER_US: f64 = 17.0;

/// One benchmark row: a named shape, its byte and FLOP counts, and its target.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// Kernel family (as in kernels.toml).
    pub family: &'static str,
    /// Short shape description.
    pub shape: String,
    pub case: Case,
    pub target: Target,
}

impl BenchRow {
    fn new(family: &'static str, case: Case, target: Target) -> Self {
        BenchRow { family, shape: describe(&case), case, target }
    }

    /// `family shape`, unique per row.
    pub fn name(&self) -> String {
        format!("{} {}", self.family, self.shape)
    }

    /// Bytes the operation must move at least, and its FLOPs.
    pub fn work(&self) -> (f64, f64) {
        work(&self.case)
    }

    /// A data-path row (it moves bytes and computes next to nothing: the fill, the prefix
    /// flatten and reorder, the combines): it carries the same run's same-bytes copy
    /// ([`Timer::same_bytes_copy`]), its fair ceiling.
    pub fn is_data_path(&self) -> bool {
        matches!(
            self.case,
            Case::Fill { .. }
                | Case::Flatten { .. }
                | Case::Reorder { .. }
                | Case::MergeTwo { .. }
                | Case::AgRsCorrect { .. }
                | Case::A2aCombine { .. }
                | Case::A2aPack { .. }
        )
    }
}

/// Lengths of [`Case::DenseRamp`]: s_k·(i + 1)/b for request i.
fn ramp_lens(b: usize, sk: usize) -> Vec<usize> {
    (0..b).map(|i| sk * (i + 1) / b).collect()
}

fn describe(c: &Case) -> String {
    match *c {
        Case::Fill { format, tokens } => format!("{format:?} tokens={tokens}"),
        Case::Dense { b, q, h, sk } => format!("b={b} q={q} H={h} s_k={sk}"),
        Case::DenseCausal { b, q, h, sk } => format!("b={b} q={q} H={h} s_k={sk} causal"),
        Case::DenseUnsplit { b, h, sk } => format!("b={b} q=1 H={h} s_k={sk} split=1"),
        Case::DenseScheduled { b, h, sk } => format!("b={b} q=1 H={h} s_k={sk} schedule=every launch"),
        Case::DenseRamp { b, h, sk, split } => {
            format!("b={b} q=1 H={h} s_k=ramp..{sk} {}", if split { "split=auto" } else { "split=1" })
        }
        Case::Sparse { format, b, q, h, k } => format!("{format:?} b={b} q={q} H={h} K={k}"),
        Case::Model1 { b, q, h, k } => format!("Model1 b={b} q={q} H={h} K={k}"),
        Case::Engine(e) => e.name.to_string(),
        Case::MergeTwo { t, h, input } => format!("{input:?} in T={t} H={h}"),
        Case::AgRsCorrect { d, t, h, contrib } => format!("{contrib:?} contrib D={d} T={t} H={h}"),
        Case::A2aCombine { d, t, h } => format!("D={d} T={t} H={h}"),
        Case::TopkLocal { rows, n, k } => format!("{rows}x{n} K={k}"),
        Case::TopkPack { rows, k, d } | Case::TopkMerge { rows, d, k } | Case::TopkCompact { rows, d, k } => {
            format!("rows={rows} D={d} K={k}")
        }
        Case::Flatten { format, prefix, d } => format!("{format:?} prefix={prefix} D={d}"),
        Case::Reorder { prefix, d } => format!("prefix={prefix} D={d}"),
        Case::A2aPack { d, t, h } => format!("D={d} T={t} H={h}"),
        Case::DcpStep(st) => format!("{} D={}", step_label(st), st.d),
    }
}

/// A step's shape but its group size.
fn step_label(st: StepShape) -> String {
    let StepShape { sparse, h_l, sk, q, .. } = st;
    format!("{} H_l={h_l} s_k={sk} q={q}", if sparse { "fp8 K=2048" } else { "dense" })
}

/// Bytes and FLOPs of a row; a step's are its parts'.
fn work(c: &Case) -> (f64, f64) {
    match *c {
        Case::DcpStep(st) => step_parts(st).iter().map(kernel_work).fold((0.0, 0.0), |a, w| (a.0 + w.0, a.1 + w.1)),
        _ => kernel_work(c),
    }
}

/// Bytes a kernel must move at least, and its FLOPs.
fn kernel_work(c: &Case) -> (f64, f64) {
    let attn = |rows: usize, keys: usize, dims: usize| 2.0 * rows as f64 * keys as f64 * dims as f64;
    let attn_flops = |rows: usize, keys: usize| attn(rows, keys, D_QK + D_V);
    // a sparse decode: each query row's K tokens read once (`token_bytes` each, as stored), the
    // bf16 q read and out written, 2·`dims` FLOPs a head and token (`dims` = d_qk + d_v)
    let sparse = |b: usize, q: usize, h: usize, k: usize, token_bytes: usize, dims: usize| {
        (b * q * k * token_bytes + b * q * h * dims * 2, attn(b * q * h, k, dims))
    };
    let (bytes, flops) = match *c {
        Case::Fill { format, tokens } => (tokens * ((D_LATENT + D_ROPE) * 2 + format.token_bytes()), 0.0),
        // (causal rows see up to q − 1 tokens fewer: counted as the full rows)
        Case::Dense { b, q, h, sk } | Case::DenseCausal { b, q, h, sk } => {
            (b * sk * D_QK * 2 + b * q * h * (D_QK + D_V) * 2, attn_flops(b * q * h, sk))
        }
        Case::DenseUnsplit { b, h, sk } | Case::DenseScheduled { b, h, sk } => {
            return kernel_work(&Case::Dense { b, q: 1, h, sk })
        }
        Case::DenseRamp { b, h, sk, .. } => {
            let tokens: usize = ramp_lens(b, sk).iter().sum();
            (tokens * D_QK * 2 + b * h * (D_QK + D_V) * 2, attn_flops(h, tokens))
        }
        Case::Sparse { format, b, q, h, k } => sparse(b, q, h, k, format.token_bytes(), D_QK + D_V),
        // MODEL1: 584 bytes a token (value row and scale slot, not the page's padding)
        Case::Model1 { b, q, h, k } => sparse(b, q, h, k, MODEL1_TOKEN_BYTES, MODEL1_D_QK + MODEL1_D_V),
        // dense: each request's KV read once (its longest row's tokens), the FLOPs of every row's
        // own length; with equal lengths and no causal rows, `Dense`'s counts
        Case::Engine(e) if e.sparse => {
            return kernel_work(&Case::Sparse { format: KvFormat::Fp8_656, b: e.b, q: e.q, h: e.h, k: e.topk })
        }
        Case::Engine(e) => {
            let lens = engine_lens(&e);
            let rows = decode_row_lens(&lens, e.q, e.causal).expect("engine shapes are valid");
            let keys: usize = rows.iter().map(|&l| l as usize).sum();
            let tokens: u64 = lens.iter().sum();
            (tokens as usize * D_QK * 2 + e.b * e.q * e.h * (D_QK + D_V) * 2, attn_flops(e.h, keys))
        }
        // both inputs and lse read, bf16 out and fp32 lse written
        Case::MergeTwo { t, h, input } => (t * h * (2 * (D_V * input.bytes() + 4) + D_V * 2 + 4), 0.0),
        // bf16 partial and the D lse of each row read, the contribution written
        Case::AgRsCorrect { d, t, h, contrib } => (t * h * (D_V * 2 + d * 4 + D_V * contrib.bytes()), 0.0),
        // the D slots (bf16 + lse) read, bf16 out and lse written
        Case::A2aCombine { d, t, h } => (t * h * (D_V * 2 + 4) + t * (h / d) * (D_V * 2 + 4), 0.0),
        Case::TopkLocal { rows, n, k } => (rows * n * 4 + rows * k * 4, 0.0),
        Case::TopkPack { rows, k, .. } => (rows * k * (4 + 4 + 8), 0.0),
        Case::TopkMerge { rows, d, k } => (d * rows * k * 8 + rows * k * 4, 0.0),
        Case::TopkCompact { rows, k, .. } => (rows * k * 8 + rows * 4, 0.0),
        Case::Flatten { format, prefix, d } => ((prefix / d) * (format.token_bytes() + D_QK * 2), 0.0),
        Case::Reorder { prefix, .. } => (prefix * D_QK * 2 * 2, 0.0),
        // fp32 partial and lse read, the D bf16 slots written
        Case::A2aPack { t, h, .. } => (t * h * (D_V * 4 + 4) + t * h * (D_V * 2 + 4), 0.0),
        Case::DcpStep(_) => return work(c),
    };
    (bytes as f64, flops)
}

/// FlashMLA's MODEL1 sparse decode on an H100 (b, q, H, K, µs): the `mla_decode` MODEL1 rows'
/// shapes and the figures their targets come from (docs/performance.md, "Targets").
pub const MODEL1_FLASHMLA_H100_US: [(usize, usize, usize, usize, f64); 3] =
    [(128, 1, 64, 512, 41.9), (128, 2, 128, 512, 106.6), (64, 2, 64, 2048, 126.9)];

/// The fraction of FlashMLA's speed a MODEL1 row must reach (issue 64's bar).
pub const MODEL1_FLASHMLA_BAR: f64 = 0.90;

/// Every row of docs/performance.md's tables, with its target; a shape docs/performance.md gives a baseline but no
/// target for is held to the baseline itself.
pub fn rows() -> Vec<BenchRow> {
    use KvFormat::{Bf16, Fp8_656};
    let faster = |baseline_us: f64, factor: f64| Target::FasterThan { baseline_us, factor };
    let mut v = Vec::new();
    for format in [Bf16, Fp8_656] {
        // issue 63: against a copy of the same bytes in the same run
        v.push(BenchRow::new("kv_fill", Case::Fill { format, tokens: 128 }, Target::SameBytes(0.90)));
        v.push(BenchRow::new("kv_fill", Case::Fill { format, tokens: 8192 }, Target::SameBytes(0.95)));
    }
    // FlashMLA on the H200 (docs/performance.md): the memory-bound rows are held to 97% of the
    // run's copy bandwidth (FlashMLA: 99-102%), the compute-bound ones to FlashMLA's TFLOP/s.
    for (b, q, h, sk, target) in [
        (128, 1, 16, 8192, Target::CopyFraction(0.97)),
        (128, 1, 64, 8192, Target::CopyFraction(0.97)),
        (128, 1, 128, 8192, Target::Tflops(654.0)),
        (128, 1, 64, 32768, Target::CopyFraction(0.97)),
        (128, 2, 64, 8192, Target::Tflops(638.0)),
        (128, 6, 64, 8192, Target::Tflops(729.0)),
        // not in docs/performance.md: a small batch, where the split's three launches are most of the time
        (2, 1, 64, 4096, Target::None),
    ] {
        v.push(BenchRow::new("mla_decode", Case::Dense { b, q, h, sk }, target));
    }
    // not in docs/performance.md: the q = 2 and q = 6 rows with causal MTP rows (the tuned
    // table's own timings had causal q = 6 6-13% slower than the same shape without)
    for q in [2, 6] {
        v.push(BenchRow::new("mla_decode", Case::DenseCausal { b: 128, q, h: 64, sk: 8192 }, Target::None));
    }
    // not in docs/performance.md: the 8K H = 64 row unsplit (its split launch's fixed cost)
    v.push(BenchRow::new("mla_decode", Case::DenseUnsplit { b: 128, h: 64, sk: 8192 }, Target::None));
    // not in docs/performance.md: the 8K H = 64 row with its schedule computed every launch
    v.push(BenchRow::new("mla_decode", Case::DenseScheduled { b: 128, h: 64, sk: 8192 }, Target::None));
    // not in docs/performance.md: uneven lengths, with and without the split schedule
    for split in [true, false] {
        v.push(BenchRow::new("mla_decode", Case::DenseRamp { b: 128, h: 64, sk: 32768, split }, Target::None));
    }
    for (q, h, k, tflops) in
        [(1, 64, 2048, 316.0), (2, 64, 2048, 324.0), (2, 128, 2048, 395.0), (6, 64, 2048, 324.0), (2, 64, 512, 256.0)]
    {
        v.push(BenchRow::new("mla_decode", Case::Sparse { format: Fp8_656, b: 128, q, h, k }, Target::Tflops(tflops)));
    }
    // not in docs/performance.md: the BF16 cache's sparse decode (the wgmma trio schedule, as FP8's)
    v.push(BenchRow::new("mla_decode", Case::Sparse { format: Bf16, b: 128, q: 2, h: 64, k: 2048 }, Target::None));
    // MODEL1 (issue 64): FlashMLA's µs on an H100 (docs/performance.md), held to
    // MODEL1_FLASHMLA_BAR of its TFLOP/s
    for (b, q, h, k, flashmla_us) in MODEL1_FLASHMLA_H100_US {
        let case = Case::Model1 { b, q, h, k };
        let flashmla_tflops = kernel_work(&case).1 / flashmla_us / 1e6;
        v.push(BenchRow::new("mla_decode", case, Target::Tflops(MODEL1_FLASHMLA_BAR * flashmla_tflops)));
    }
    // how engines run decode: GRAPH_LAYERS layers in one CUDA graph, back to back, no L2
    // eviction (graph_layer_us); beside FlashMLA's rows of the same shapes, no target of their own
    for (q, h, sk) in [(1, 64, 8192), (1, 128, 8192), (2, 64, 8192), (6, 64, 8192), (1, 64, 32768)] {
        v.push(BenchRow::new(DECODE_GRAPH_FAMILY, Case::Dense { b: 128, q, h, sk }, Target::None));
    }
    for (q, h) in [(1, 64), (2, 64), (2, 128)] {
        let case = Case::Sparse { format: Fp8_656, b: 128, q, h, k: 2048 };
        v.push(BenchRow::new(DECODE_GRAPH_FAMILY, case, Target::None));
    }
    // the engine view: engine_view.py's shapes, natively, 4 layers a graph (graph_layer_us)
    for e in ENGINE_SHAPES {
        v.push(BenchRow::new(DECODE_ENGINE_FAMILY, Case::Engine(e), Target::None));
    }
    // the same on the heuristic's kernel and split count, beside them: what the tuned table buys
    for e in ENGINE_SHAPES {
        v.push(BenchRow::new(DECODE_ENGINE_HEURISTIC_FAMILY, Case::Engine(e), Target::None));
    }
    // diagnosis: the flushed dense and sparse FP8 shapes over the identity block table (each
    // request's pages in order), beside the shuffled rows above: what the page layout costs
    for (q, h, sk) in [(1, 16, 8192), (1, 64, 8192), (1, 128, 8192), (1, 64, 32768), (2, 64, 8192), (6, 64, 8192)] {
        v.push(BenchRow::new(DECODE_ORDERED_FAMILY, Case::Dense { b: 128, q, h, sk }, Target::None));
    }
    v.push(BenchRow::new(DECODE_ORDERED_FAMILY, Case::Dense { b: 2, q: 1, h: 64, sk: 4096 }, Target::None));
    for (q, h, k) in [(1, 64, 2048), (2, 64, 2048), (2, 128, 2048), (6, 64, 2048), (2, 64, 512)] {
        let case = Case::Sparse { format: Fp8_656, b: 128, q, h, k };
        v.push(BenchRow::new(DECODE_ORDERED_FAMILY, case, Target::None));
    }
    // vLLM's Triton two-way merge (bf16 in, bf16 out; docs/performance.md): at T ≤ 768 in 0.8 of
    // its time, at T = 4096 at 90% of copy; the fp32-in variant (docs/contract.md §5's intermediates) at 90%
    // of copy for the bytes it moves.
    for (t, h, us) in [(128, 64, 11.6), (128, 128, 19.2), (768, 64, 49.0)] {
        v.push(BenchRow::new("combine_merge_two", Case::MergeTwo { t, h, input: RowsDtype::Bf16 }, faster(us, 1.25)));
    }
    v.push(BenchRow::new(
        "combine_merge_two",
        Case::MergeTwo { t: 4096, h: 128, input: RowsDtype::Bf16 },
        Target::CopyFraction(0.90),
    ));
    for (t, h) in [(128, 64), (128, 128), (768, 64), (4096, 128)] {
        v.push(BenchRow::new(
            "combine_merge_two",
            Case::MergeTwo { t, h, input: RowsDtype::F32 },
            Target::SameBytes(0.90),
        ));
    }
    // vLLM's DCP correction (bf16 in, bf16 out; docs/performance.md): in 0.8 of its time; the
    // fp32 contribution (docs/contract.md §5.1's intermediate) at 90% of copy for its bytes; the a2a combine
    // does the same job in the other shape and is held to vLLM's times.
    for (d, t, h, us) in [(4, 128, 64, 10.3), (8, 128, 128, 16.0), (4, 768, 64, 37.9)] {
        let bf16 = Case::AgRsCorrect { d, t, h, contrib: RowsDtype::Bf16 };
        v.push(BenchRow::new("combine_ag_rs_correct", bf16, faster(us, 1.25)));
        let f32 = Case::AgRsCorrect { d, t, h, contrib: RowsDtype::F32 };
        v.push(BenchRow::new("combine_ag_rs_correct", f32, Target::SameBytes(0.90)));
        v.push(BenchRow::new("combine_a2a", Case::A2aCombine { d, t, h }, faster(us, 1.25)));
    }
    // torch.topk: the local top-k target is a third of its time at 128 × 32768.
    for (rows, n, k, us, factor) in
        [(128, 32768, 2048, 121.0, 3.0), (128, 131072, 2048, 278.0, 1.0), (512, 32768, 512, 278.0, 1.0)]
    {
        v.push(BenchRow::new("topk_local", Case::TopkLocal { rows, n, k }, faster(us, factor)));
    }
    v.push(BenchRow::new("topk_pack", Case::TopkPack { rows: 128, k: 2048, d: 4 }, Target::None));
    v.push(BenchRow::new("topk_merge", Case::TopkMerge { rows: 128, d: 4, k: 2048 }, Target::MaxUs(12.0)));
    v.push(BenchRow::new("topk_merge", Case::TopkMerge { rows: 128, d: 8, k: 2048 }, faster(92.0, 1.0)));
    v.push(BenchRow::new("topk_compact", Case::TopkCompact { rows: 128, d: 4, k: 2048 }, Target::None));
    for format in [Bf16, Fp8_656] {
        v.push(BenchRow::new(
            "prefill_flatten",
            Case::Flatten { format, prefix: 32768, d: 4 },
            Target::SameBytes(0.95),
        ));
    }
    v.push(BenchRow::new("prefill_reorder", Case::Reorder { prefix: 32768, d: 4 }, Target::CopyFraction(0.7)));
    // issue 20 item 4: one rank's step at the seed's shapes, D = 1 (no DCP) and 2, 4, 8; the
    // bench prints the ratios with the collectives added (step_summary)
    for sparse in [false, true] {
        for h_l in [8, 16] {
            for sk in [8192, 32768] {
                for q in [1, 6] {
                    for d in [1, 2, 4, 8] {
                        let st = StepShape { sparse, h_l, sk, q, d };
                        v.push(BenchRow::new("dcp_step", Case::DcpStep(st), Target::None));
                    }
                }
            }
        }
    }
    v
}

/// The step rows' verdict: for each shape, the step without DCP against one rank's step with
/// DCP at each D (its kernels as measured plus [`step_collectives_us`]); speedup > 1 means DCP
/// makes the step faster. `measured` holds (row, µs) of this run.
pub fn step_summary(measured: &[(&BenchRow, f64)]) -> String {
    let us = |st: StepShape| measured.iter().find(|(r, _)| r.case == Case::DcpStep(st)).map(|&(_, us)| us);
    let [a2a_8, a2a_16] = STEP_A2A_US;
    let mut out = format!(
        "DCP step, one rank (collectives added: a2a all-to-all {a2a_8} / {a2a_16} µs (H_l = 8 / 16) + \
         {STEP_GATHER_US} µs an all-gather)\n"
    );
    out += &format!("{:<36} {:>10} {:>22} {:>22} {:>22}\n", "shape", "no DCP µs", "D=2 µs (speedup)", "D=4", "D=8");
    for r in measured {
        let Case::DcpStep(st) = r.0.case else { continue };
        if st.d != 1 {
            continue;
        }
        let Some(base) = us(st) else { continue };
        let mut line = format!("{:<36} {:>10.1}", step_label(st), base);
        for d in [2, 4, 8] {
            let with = StepShape { d, ..st };
            line += &match us(with) {
                Some(local) => {
                    let total = local + step_collectives_us(with);
                    format!(" {:>14.1} ({:>4.2})", total, base / total)
                }
                None => format!(" {:>22}", "-"),
            };
        }
        out += &line;
        out.push('\n');
    }
    out
}

/// A prepared row: its buffers live inside the closure, each call launches once.
pub type Launch<'a> = Box<dyn FnMut() -> Result<()> + 'a>;

/// `host` copied to a new device buffer on `s`.
pub fn up<T: DeviceRepr>(s: &Arc<CudaStream>, host: &[T]) -> Result<CudaSlice<T>> {
    drv("cuMemcpyHtoDAsync", s.clone_htod(host))
}

fn zeros<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(s: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<T>> {
    drv("cuMemAlloc", s.alloc_zeros::<T>(n.max(1)))
}

/// The launchers' view of a buffer on `s`.
pub fn sl<T>(s: &Arc<CudaStream>, b: &CudaSlice<T>) -> DeviceSlice<T> {
    DeviceSlice::of(b, s)
}

/// A device buffer of combine rows in either dtype, owned by a bench launch.
enum Part {
    Bf16(CudaSlice<bf16>),
    F32(CudaSlice<f32>),
}

impl Part {
    /// `values` uploaded in `dtype` (bf16: rounded to nearest even).
    fn upload(s: &Arc<CudaStream>, dtype: RowsDtype, values: &[f32]) -> Result<Part> {
        Ok(match dtype {
            RowsDtype::F32 => Part::F32(up(s, values)?),
            RowsDtype::Bf16 => Part::Bf16(up(s, &values.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>())?),
        })
    }
    fn zeros(s: &Arc<CudaStream>, dtype: RowsDtype, n: usize) -> Result<Part> {
        Ok(match dtype {
            RowsDtype::F32 => Part::F32(zeros::<f32>(s, n)?),
            RowsDtype::Bf16 => Part::Bf16(zeros::<bf16>(s, n)?),
        })
    }
    fn rows(&self, s: &Arc<CudaStream>) -> CombineRows {
        match self {
            Part::Bf16(b) => CombineRows::Bf16(sl(s, b)),
            Part::F32(b) => CombineRows::F32(sl(s, b)),
        }
    }
}

/// How a decode row's pages lie in its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageOrder {
    /// The block table is a random permutation of all the cache's pages (seeded), as engines
    /// and the anchors' FlashMLA rows have it: every decode row but the diagnosis ones.
    Shuffled,
    /// Request i owns pages i·n .. (i + 1)·n in order (the identity table):
    /// [`DECODE_ORDERED_FAMILY`].
    Ordered,
}

/// The page order of a row of `family`.
pub fn page_order(family: &str) -> PageOrder {
    if family == DECODE_ORDERED_FAMILY {
        PageOrder::Ordered
    } else {
        PageOrder::Shuffled
    }
}

/// The block table of `requests` requests of `pages_per_request` pages each, int32
/// [requests, pages_per_request]: every page of the cache once, in `order`.
pub fn block_table(rng: &mut Rng, requests: usize, pages_per_request: usize, order: PageOrder) -> Vec<i32> {
    let mut t: Vec<i32> = (0..(requests * pages_per_request) as i32).collect();
    if order == PageOrder::Shuffled {
        rng.shuffle(&mut t);
    }
    t
}

/// Sparse index lists int32 [requests, q, k]: for each query row, `k` distinct random tokens of
/// its request's first `context` tokens, in random order, each as the cache row it lives in
/// through the request's block-table row (page·`block` + offset).
pub fn sparse_indices(
    rng: &mut Rng,
    table: &[i32],
    pages_per_request: usize,
    block: usize,
    q: usize,
    context: usize,
    k: usize,
) -> Vec<i32> {
    let requests = table.len() / pages_per_request.max(1);
    let k = k.min(context);
    let mut tokens: Vec<usize> = (0..context).collect();
    let mut idx = Vec::with_capacity(requests * q * k);
    for i in 0..requests {
        let pages = &table[i * pages_per_request..(i + 1) * pages_per_request];
        for _ in 0..q {
            // a partial Fisher-Yates: the first k of a permutation (kept between rows)
            for j in 0..k {
                tokens.swap(j, j + rng.below((context - j) as u64) as usize);
            }
            idx.extend(tokens[..k].iter().map(|&t| pages[t / block] * block as i32 + (t % block) as i32));
        }
    }
    idx
}

/// What a decode row launches over, on the host: its shape, how many tokens of cache each
/// request owns and in which page order, and the rows' lengths (dense) or top-k (sparse).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeSpec {
    /// Index lists into the cache, else the dense block table (BF16).
    pub sparse: bool,
    /// The 576 path's cache format (unused by MODEL1).
    pub format: KvFormat,
    /// MODEL1's sparse decode (d_qk = 512) over its page-wise FP8 cache ([`Case::Model1`]);
    /// `sparse` too.
    pub model1: bool,
    pub b: usize,
    pub q: usize,
    pub h: usize,
    /// Tokens of cache each request owns (its pages): the longest length (dense), or the
    /// context the indices are drawn from (sparse).
    pub context: usize,
    /// Dense: the [b, q] row lengths. Sparse: empty.
    pub row_lens: Vec<i32>,
    /// Sparse: indices a query row.
    pub topk: usize,
    pub order: PageOrder,
    /// For the tuned table's class: causal rows, ragged lengths.
    pub causal: bool,
    pub ragged: bool,
}

impl DecodeSpec {
    fn dense(b: usize, q: usize, h: usize, context: usize, row_lens: Vec<i32>, order: PageOrder) -> Self {
        let ragged = row_lens.chunks(q.max(1)).any(|r| r[r.len() - 1] != row_lens[row_lens.len() - 1]);
        DecodeSpec {
            sparse: false,
            format: KvFormat::Bf16,
            model1: false,
            b,
            q,
            h,
            context,
            row_lens,
            topk: 0,
            order,
            causal: false,
            ragged,
        }
    }

    fn sparse(format: KvFormat, b: usize, q: usize, h: usize, context: usize, topk: usize, order: PageOrder) -> Self {
        DecodeSpec {
            sparse: true,
            format,
            model1: false,
            b,
            q,
            h,
            context,
            row_lens: Vec::new(),
            topk,
            order,
            causal: false,
            ragged: false,
        }
    }

    /// The launches of a decode row (`None` for other kinds of row); its `row_lens` are the
    /// lengths of every launch of it.
    pub fn of(row: &BenchRow) -> Result<Option<DecodeSpec>> {
        let order = page_order(row.family);
        let equal = |b: usize, q: usize, sk: usize| vec![sk as i32; b * q];
        Ok(Some(match row.case {
            Case::Dense { b, q, h, sk } => DecodeSpec::dense(b, q, h, sk, equal(b, q, sk), order),
            // every row holds L; the launch's causal rule shifts row j to L − q + 1 + j
            Case::DenseCausal { b, q, h, sk } => {
                DecodeSpec { causal: true, ..DecodeSpec::dense(b, q, h, sk, equal(b, q, sk), order) }
            }
            Case::DenseScheduled { b, h, sk } | Case::DenseUnsplit { b, h, sk } => {
                DecodeSpec::dense(b, 1, h, sk, equal(b, 1, sk), order)
            }
            Case::DenseRamp { b, h, sk, .. } => {
                DecodeSpec::dense(b, 1, h, sk, ramp_lens(b, sk).into_iter().map(|l| l as i32).collect(), order)
            }
            Case::Sparse { format, b, q, h, k } => DecodeSpec::sparse(format, b, q, h, SPARSE_CONTEXT, k, order),
            Case::Model1 { b, q, h, k } => {
                DecodeSpec { model1: true, ..DecodeSpec::sparse(KvFormat::Fp8_656, b, q, h, SPARSE_CONTEXT, k, order) }
            }
            Case::Engine(e) if e.sparse => DecodeSpec::sparse(KvFormat::Fp8_656, e.b, e.q, e.h, e.sk, e.topk, order),
            Case::Engine(e) => {
                // every row holds its request's length L; causal rows launch with the kernels'
                // causal rule (`DecodeInputs::args`), row j seeing L − q + 1 + j tokens
                let lens = decode_row_lens(&engine_lens(&e), e.q, false)?;
                DecodeSpec { causal: e.causal, ragged: e.ragged, ..DecodeSpec::dense(e.b, e.q, e.h, e.sk, lens, order) }
            }
            _ => return Ok(None),
        }))
    }

    /// The launcher's heuristic split count for this shape on `num_sms` SMs.
    pub fn heuristic_splits(&self, num_sms: usize) -> usize {
        decode::decode_num_splits(self.b, self.q, self.h, self.sparse, num_sms)
    }

    /// The shape the launcher's kernel choice sees ([`DecodeInputs::args`]' launch: a dense
    /// context of whole pages, a sparse one of the top-k).
    pub fn shape(&self) -> DecodeShape {
        let context = if self.sparse { self.topk } else { self.context.div_ceil(DECODE_BLOCK) * DECODE_BLOCK };
        DecodeShape {
            sparse: self.sparse,
            format: self.format,
            batch: self.b,
            nq: self.q,
            heads: self.h,
            context,
            causal: self.causal,
        }
    }

    /// Bytes of its device buffers (cache, queries, outputs, table or indices) without the
    /// workspace: what a bench row allocates a layer.
    pub fn device_bytes(&self) -> usize {
        let rows = self.b * self.q * self.h;
        let pages = self.context.div_ceil(DECODE_BLOCK);
        let lists =
            if self.sparse { self.b * self.q * self.topk * 4 } else { self.b * pages * 4 + self.row_lens.len() * 4 };
        let (d_qk, d_v) = self.dims();
        self.b * pages * self.page_bytes() + rows * (d_qk * 2 + d_v * 2 + 4) + lists
    }

    /// A query row's and an output row's values: 576 and 512, MODEL1's 512 and 512.
    fn dims(&self) -> (usize, usize) {
        if self.model1 {
            (MODEL1_D_QK, MODEL1_D_V)
        } else {
            (D_QK, D_V)
        }
    }

    /// Bytes of one page of [`DECODE_BLOCK`] tokens (MODEL1's padded to its 576-byte multiple).
    fn page_bytes(&self) -> usize {
        if self.model1 {
            model1_page_bytes(DECODE_BLOCK)
        } else {
            DECODE_BLOCK * self.format.token_bytes()
        }
    }

    /// A MODEL1 cache's geometry: every request's pages, packed.
    fn model1_pages(&self) -> Model1Pages {
        Model1Pages::new(self.b * self.context.div_ceil(DECODE_BLOCK), DECODE_BLOCK)
    }
}

/// A decode row's device buffers, made from its [`DecodeSpec`] with a workspace for up to
/// `max_splits` parts: random bf16 queries, a random cache, the block table in the spec's page
/// order, and the lengths (dense) or the index lists drawn through the table (sparse).
pub struct DecodeInputs {
    spec: DecodeSpec,
    q: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    ws: CudaSlice<u8>,
    cache: CudaSlice<u8>,
    /// Dense: the block table and lengths; sparse: the index lists (and an unused table slot).
    table: CudaSlice<i32>,
    lists: CudaSlice<i32>,
}

/// A decode launch's arguments over [`DecodeInputs`].
#[derive(Debug, Clone, Copy)]
pub enum DecodeArgs {
    Dense(DenseDecode),
    Sparse(SparseDecode),
    Model1(Model1Decode),
}

impl DecodeArgs {
    pub fn common_mut(&mut self) -> &mut DecodeCommon {
        match self {
            DecodeArgs::Dense(a) => &mut a.common,
            DecodeArgs::Sparse(a) => &mut a.common,
            DecodeArgs::Model1(a) => &mut a.common,
        }
    }

    /// One launch on the kernel `path` picks ([`DecodePath::Auto`]: the launcher's own choice,
    /// for MODEL1 wgmma lead on compute capability 9.0 unless `DCP_MLA_DECODE_PATH=mma`).
    pub fn launch(&self, dev: &Device, st: Stream, path: DecodePath) -> Result<()> {
        match self {
            DecodeArgs::Dense(a) => decode::mla_decode_dense_on(dev, st, a, path),
            DecodeArgs::Sparse(a) => decode::mla_decode_sparse_on(dev, st, a, path),
            DecodeArgs::Model1(a) => mla_decode_model1_on(dev, st, a, path),
        }
    }
}

impl DecodeInputs {
    pub fn new(s: &Arc<CudaStream>, rng: &mut Rng, spec: &DecodeSpec, max_splits: usize) -> Result<Self> {
        let (b, q, h) = (spec.b, spec.q, spec.h);
        let rows = b * q * h;
        let pages = spec.context.div_ceil(DECODE_BLOCK);
        let (d_qk, d_v) = spec.dims();
        let q_buf = up(s, &(0..rows * d_qk).map(|_| bf16::from_f32(rng.unit())).collect::<Vec<_>>())?;
        let cache = if spec.model1 {
            random_model1_cache(s, rng, spec.model1_pages())?
        } else {
            random_cache(s, rng, spec.format, b * pages * DECODE_BLOCK)?
        };
        let table = block_table(rng, b, pages, spec.order);
        let lists = if spec.sparse {
            sparse_indices(rng, &table, pages, DECODE_BLOCK, q, spec.context, spec.topk)
        } else {
            spec.row_lens.clone()
        };
        Ok(DecodeInputs {
            spec: spec.clone(),
            q: q_buf,
            out: zeros::<bf16>(s, rows * d_v)?,
            lse: zeros::<f32>(s, rows)?,
            ws: zeros::<u8>(s, decode::decode_workspace_bytes(b, q, h, spec.sparse, max_splits.max(1))?)?,
            cache,
            table: if spec.sparse { zeros::<i32>(s, 1)? } else { up(s, &table)? },
            lists: up(s, &lists)?,
        })
    }

    /// The arguments of a launch in `num_splits` parts (at most the `max_splits` the workspace
    /// was made for) that computes its split schedule.
    pub fn args(&self, s: &Arc<CudaStream>, num_splits: usize) -> DecodeArgs {
        let DecodeSpec { b, q, h, .. } = self.spec;
        let out = DecodeOut::Bf16(sl(s, &self.out));
        let common = DecodeCommon::new(sl(s, &self.q), b, q, h, out, sl(s, &self.lse), num_splits, sl(s, &self.ws));
        let pages = self.spec.context.div_ceil(DECODE_BLOCK);
        if self.spec.model1 {
            let main = Model1Source {
                cache: sl(s, &self.cache),
                pages: self.spec.model1_pages(),
                lists: IndexLists::new(sl(s, &self.lists), self.spec.topk),
            };
            DecodeArgs::Model1(Model1Decode::new(common, main))
        } else if self.spec.sparse {
            DecodeArgs::Sparse(SparseDecode {
                common,
                cache: CacheView::packed(sl(s, &self.cache), b * pages, DECODE_BLOCK),
                format: self.spec.format,
                lists: IndexLists::new(sl(s, &self.lists), self.spec.topk),
            })
        } else {
            DecodeArgs::Dense(DenseDecode {
                common,
                cache: CacheView::packed(sl(s, &self.cache), b * pages, DECODE_BLOCK),
                block_table: BlockTable::packed(sl(s, &self.table), pages),
                lens: sl(s, &self.lists),
                lens_strides: None,
                lens_rule: if self.spec.causal { decode::LensRule::single(true) } else { decode::LensRule::Local },
            })
        }
    }
}

/// Allocates and initialises the buffers of `row` and returns its launch.
pub fn prepare<'a>(dev: &'a Device, s: &Arc<CudaStream>, row: &BenchRow) -> Result<Launch<'a>> {
    prepare_layer(dev, s, row, 0)
}

/// [`prepare`] for layer `layer` of a graph row: each layer's inputs from its own seed. A decode
/// launch in parts computes its split schedule on its first call and reuses it after, as a
/// step's layers share one; but `DenseScheduled` (every launch computes it) and an engine row's
/// first layer (a step computes it once, in its first layer).
pub fn prepare_layer<'a>(dev: &'a Device, s: &Arc<CudaStream>, row: &BenchRow, layer: usize) -> Result<Launch<'a>> {
    let mut rng = Rng::new(0x5eed_1234_abcd_0001 ^ ((layer as u64) << 40));
    let p = Prep { dev, s, rng: &mut rng };
    if let Some(spec) = DecodeSpec::of(row)? {
        return prepare_decode(p, row, &spec, layer);
    }
    match row.case {
        Case::Fill { format, tokens } => prepare_fill(p, format, tokens),
        Case::Dense { .. }
        | Case::DenseCausal { .. }
        | Case::DenseRamp { .. }
        | Case::DenseUnsplit { .. }
        | Case::DenseScheduled { .. }
        | Case::Sparse { .. }
        | Case::Model1 { .. }
        | Case::Engine(_) => unreachable!("decode rows have a DecodeSpec"),
        Case::MergeTwo { t, h, input } => prepare_merge_two(p, t, h, input),
        Case::AgRsCorrect { d, t, h, contrib } => prepare_ag_rs_correct(p, d, t, h, contrib),
        Case::A2aCombine { d, t, h } => prepare_a2a_combine(p, d, t, h),
        Case::TopkLocal { rows, n, k } => prepare_topk_local(p, rows, n, k),
        Case::TopkPack { rows, k, d } => prepare_topk_pack(p, rows, k, d),
        Case::TopkMerge { rows, d, k } => prepare_topk_merge(p, rows, d, k),
        Case::TopkCompact { rows, d, k } => prepare_topk_compact(p, rows, d, k),
        Case::Flatten { format, prefix, d } => prepare_flatten(p, format, prefix, d),
        Case::DcpStep(st) => prepare_dcp_step(dev, s, st),
        Case::A2aPack { d, t, h } => prepare_a2a_pack(p, d, t, h),
        Case::Reorder { prefix, d } => prepare_reorder(p, prefix, d),
    }
}

/// A decode row's launch: the launcher's own choice of kernel and split count (the tuned
/// table's where it has a row), or the heuristic's for [`DECODE_ENGINE_HEURISTIC_FAMILY`]; the
/// split schedule computed by the first launch and reused after (but by `DenseScheduled` and an
/// engine row's first layer).
fn prepare_decode<'a>(p: Prep<'a, '_>, row: &BenchRow, spec: &DecodeSpec, layer: usize) -> Result<Launch<'a>> {
    let Prep { dev, s, rng } = p;
    let st = Stream::from_cudarc(s);
    let split = !matches!(row.case, Case::DenseUnsplit { .. } | Case::DenseRamp { split: false, .. });
    // the launcher's own choice (the tuned table's where it has a row), or the heuristic's
    let shape = spec.shape();
    let (path, splits) = if spec.model1 {
        // no tuned class: the launcher's kernel (DCP_MLA_DECODE_PATH=mma for the mma.sync one) and
        // the planner's split count (decode_num_splits)
        (DecodePath::Auto, spec.heuristic_splits(dev.num_sms()))
    } else if row.family == DECODE_ENGINE_HEURISTIC_FAMILY {
        let (sm90, num_sms) = (dev.compute_capability() == (9, 0), dev.num_sms());
        let path = shape
            .heuristic_path(sm90)
            .ok_or_else(|| Error::Unsupported(format!("{}: no decode kernel built", row.name())))?;
        (path, shape.heuristic_splits(num_sms))
    } else {
        (DecodePath::Auto, decode::decode_num_splits_on(dev, &shape)?)
    };
    let splits = if split { splits } else { 1 };
    let first_engine_layer = [DECODE_ENGINE_FAMILY, DECODE_ENGINE_HEURISTIC_FAMILY].contains(&row.family) && layer == 0;
    let reuse = !matches!(row.case, Case::DenseScheduled { .. }) && !first_engine_layer;
    let inputs = DecodeInputs::new(s, rng, spec, splits)?;
    let mut args = inputs.args(s, splits);
    Ok(Box::new(move || {
        let _ = &inputs;
        let r = args.launch(dev, st, path);
        if reuse {
            args.common_mut().schedule = DecodeSchedule::Reuse;
        }
        r
    }))
}

/// What preparing a row draws on: the device, the stream its buffers live on and the row's
/// random generator.
struct Prep<'a, 'p> {
    dev: &'a Device,
    s: &'p Arc<CudaStream>,
    rng: &'p mut Rng,
}

impl<'a> Prep<'a, '_> {
    /// `n` random values in [0, 1).
    fn units(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.rng.unit()).collect()
    }

    /// `n` random lse values in [0, 4).
    fn lses(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.rng.unit() * 4.0).collect()
    }

    /// `n` random bf16 values in [0, 1), on the device.
    fn bf16_units(&mut self, n: usize) -> Result<CudaSlice<bf16>> {
        up(self.s, &(0..n).map(|_| bf16::from_f32(self.rng.unit())).collect::<Vec<_>>())
    }

    /// The launch of `kernel(dev, stream, &args)`, owning `keep`: the buffers `args` points into.
    fn launch<K: 'a, A: 'a>(
        self,
        keep: K,
        args: A,
        kernel: fn(&Device, Stream, &A) -> Result<()>,
    ) -> Result<Launch<'a>> {
        let (dev, st) = (self.dev, Stream::from_cudarc(self.s));
        Ok(Box::new(move || {
            let _ = &keep;
            kernel(dev, st, &args)
        }))
    }
}

fn prepare_fill<'a>(mut p: Prep<'a, '_>, format: KvFormat, tokens: usize) -> Result<Launch<'a>> {
    let s = p.s;
    let block = DECODE_BLOCK;
    let pages = tokens.div_ceil(block);
    let ckv = p.bf16_units(tokens * D_LATENT)?;
    let kpe = p.bf16_units(tokens * D_ROPE)?;
    let req = zeros::<i32>(s, tokens)?;
    let pos = up(s, &(0..tokens as i32).collect::<Vec<_>>())?;
    let table = up(s, &(0..pages as i32).collect::<Vec<_>>())?;
    let cache = zeros::<u8>(s, pages * block * format.token_bytes())?;
    let args = KvFill {
        tokens: NewTokens::packed(sl(s, &ckv), sl(s, &kpe), sl(s, &req), sl(s, &pos)),
        block_table: BlockTable::packed(sl(s, &table), pages),
        batch: 1,
        cache: CacheView::packed(sl(s, &cache), pages, block),
        format,
        dcp: DcpLayout { size: 1, interleave: 1 },
        rank: 0,
    };
    p.launch((ckv, kpe, req, pos, table, cache), args, kv_fill)
}

fn prepare_merge_two<'a>(mut p: Prep<'a, '_>, t: usize, h: usize, input: RowsDtype) -> Result<Launch<'a>> {
    let (s, rows) = (p.s, t * h);
    let out_a = Part::upload(s, input, &p.units(rows * D_V))?;
    let out_b = Part::upload(s, input, &p.units(rows * D_V))?;
    let (lse_a, lse_b) = (up(s, &p.lses(rows))?, up(s, &p.lses(rows))?);
    let (out, lse) = (zeros::<bf16>(s, rows * D_V)?, zeros::<f32>(s, rows)?);
    let args = MergeTwo {
        out_a: out_a.rows(s),
        lse_a: sl(s, &lse_a),
        out_b: out_b.rows(s),
        lse_b: sl(s, &lse_b),
        lse_a_base: LseBase::E,
        lse_b_base: LseBase::E,
        out: CombineRows::Bf16(sl(s, &out)),
        lse: sl(s, &lse),
        rows,
        sink: None,
    };
    p.launch((out_a, out_b, lse_a, lse_b, out, lse), args, combine::merge_two)
}

fn prepare_ag_rs_correct<'a>(
    mut p: Prep<'a, '_>,
    d: usize,
    t: usize,
    h: usize,
    dtype: RowsDtype,
) -> Result<Launch<'a>> {
    let s = p.s;
    let out = p.bf16_units(t * h * D_V)?;
    let lse_all = up(s, &p.lses(d * t * h))?;
    let contrib = Part::zeros(s, dtype, t * h * D_V)?;
    let args = AgRsCorrect {
        out: CombineRows::Bf16(sl(s, &out)),
        lse_all: sl(s, &lse_all),
        lse_base: LseBase::E,
        contrib: contrib.rows(s),
        group: CombineGroup { num_tokens: t, local_heads: h / d, dcp_size: d },
        rank: 0,
    };
    p.launch((out, lse_all, contrib), args, combine::ag_rs_correct)
}

fn prepare_a2a_combine<'a>(p: Prep<'a, '_>, d: usize, t: usize, h: usize) -> Result<Launch<'a>> {
    let s = p.s;
    let h_l = h / d;
    let slot = a2a_aligned_slot_bytes(t, h_l)?;
    // each slot: [T·H_l·512 bf16 out][T·H_l fp32 lse] (reference::merge::a2a_pack's layout)
    let mut recv = vec![0u8; d * slot];
    for r in 0..d {
        let (outs, lses) = recv[r * slot..].split_at_mut(t * h_l * D_V * 2);
        for o in outs.chunks_mut(2) {
            o.copy_from_slice(&bf16::from_f32(p.rng.unit()).to_bits().to_le_bytes());
        }
        for l in lses[..t * h_l * 4].chunks_mut(4) {
            l.copy_from_slice(&(p.rng.unit() * 4.0).to_le_bytes());
        }
    }
    let recv = up(s, &recv)?;
    let (out, lse) = (zeros::<bf16>(s, t * h_l * D_V)?, zeros::<f32>(s, t * h_l)?);
    let args = A2aCombine {
        recv: sl(s, &recv),
        slot_bytes: slot,
        lse_base: LseBase::E,
        out: CombineRows::Bf16(sl(s, &out)),
        lse: sl(s, &lse),
        group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
        sink: None,
    };
    p.launch((recv, out, lse), args, combine::a2a_combine)
}

fn prepare_topk_local<'a>(mut p: Prep<'a, '_>, rows: usize, n: usize, k: usize) -> Result<Launch<'a>> {
    let s = p.s;
    let scores = up(s, &p.units(rows * n))?;
    let lens = up(s, &vec![n as i32; rows])?;
    let out = zeros::<i32>(s, rows * k)?;
    let args =
        LocalTopk { scores: sl(s, &scores), row_stride: n, cols: n, lens: sl(s, &lens), rows, k, out: sl(s, &out) };
    p.launch((scores, lens, out), args, topk::local_topk)
}

fn prepare_topk_pack<'a>(mut p: Prep<'a, '_>, rows: usize, k: usize, d: usize) -> Result<Launch<'a>> {
    let (s, n) = (p.s, 32768 / d);
    let scores = up(s, &p.units(rows * n))?;
    let idx = up(s, &(0..rows * k).map(|i| (i % k * (n / k)) as i32).collect::<Vec<_>>())?;
    let (cs, ci) = (zeros::<f32>(s, rows * k)?, zeros::<i32>(s, rows * k)?);
    let args = PackCandidates {
        local_idx: sl(s, &idx),
        scores: sl(s, &scores),
        row_stride: n,
        cols: n,
        rows,
        k,
        dcp: DcpLayout { size: d, interleave: 1 },
        rank: 1,
        cand_scores: sl(s, &cs),
        cand_ids: sl(s, &ci),
    };
    p.launch((scores, idx, cs, ci), args, topk::pack_candidates)
}

fn prepare_topk_merge<'a>(p: Prep<'a, '_>, rows: usize, d: usize, k: usize) -> Result<Launch<'a>> {
    let s = p.s;
    let (cs, ci) = candidates(p.rng, rows, d, k);
    let (cs, ci) = (up(s, &cs)?, up(s, &ci)?);
    let out = zeros::<i32>(s, rows * k)?;
    let args = GlobalMerge { cand_scores: sl(s, &cs), cand_ids: sl(s, &ci), dcp_size: d, rows, k, out: sl(s, &out) };
    p.launch((cs, ci, out), args, topk::global_merge)
}

fn prepare_topk_compact<'a>(p: Prep<'a, '_>, rows: usize, d: usize, k: usize) -> Result<Launch<'a>> {
    let (s, block, ctx) = (p.s, DECODE_BLOCK, 32768usize);
    let ids = up(s, &(0..rows * k).map(|_| (p.rng.next_u64() % ctx as u64) as i32).collect::<Vec<_>>())?;
    let stride = ctx / d / block;
    let table = up(s, &(0..(rows * stride) as i32).collect::<Vec<_>>())?;
    let (out, counts) = (zeros::<i32>(s, rows * k)?, zeros::<i32>(s, rows)?);
    let args = Compact {
        ids: sl(s, &ids),
        rows,
        k,
        dcp: DcpLayout { size: d, interleave: 1 },
        rank: 0,
        translate: Some(PageTranslate { block_table: sl(s, &table), stride, block_size: block, rows_per_request: 1 }),
        out: sl(s, &out),
        counts: sl(s, &counts),
    };
    p.launch((ids, table, out, counts), args, topk::compact)
}

/// The one chunk of a `prefix`-token prefill over a group of `d` ranks: the DCP layout, the
/// chunk plan and its piece table on the device.
fn prefill_chunk(s: &Arc<CudaStream>, prefix: usize, d: usize) -> Result<(DcpLayout, ChunkPlan, CudaSlice<i32>)> {
    let dcp = DcpLayout { size: d, interleave: 1 };
    let plan = plan_prefill_chunks(&[prefix as u64], dcp, DECODE_BLOCK, prefill_chunk_bytes(prefix as u64, d))?;
    let chunk = &plan.chunks[0];
    let pieces = up(s, &piece_table(chunk, chunk.pieces.len())?)?;
    Ok((dcp, plan, pieces))
}

fn prepare_flatten<'a>(p: Prep<'a, '_>, format: KvFormat, prefix: usize, d: usize) -> Result<Launch<'a>> {
    let (s, block) = (p.s, DECODE_BLOCK);
    let (dcp, plan, pieces) = prefill_chunk(s, prefix, d)?;
    let pages = (prefix / d).div_ceil(block);
    let cache = random_cache(s, p.rng, format, pages * block)?;
    let table = up(s, &(0..pages as i32).collect::<Vec<_>>())?;
    let out = zeros::<bf16>(s, plan.cap_rows * D_QK)?;
    let args = Flatten {
        cache: CacheView::packed(sl(s, &cache), pages, block),
        format,
        block_table: BlockTable::packed(sl(s, &table), pages),
        batch: 1,
        pieces: sl(s, &pieces),
        max_pieces: plan.chunks[0].pieces.len(),
        out: sl(s, &out),
        cap_rows: plan.cap_rows,
        dcp,
        rank: 0,
    };
    p.launch((pieces, cache, table, out), args, prefill::flatten)
}

fn prepare_dcp_step<'a>(dev: &'a Device, s: &Arc<CudaStream>, st: StepShape) -> Result<Launch<'a>> {
    let mut parts = step_parts(st)
        .into_iter()
        .map(|case| prepare(dev, s, &BenchRow::new("dcp_step", case, Target::None)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Box::new(move || parts.iter_mut().try_for_each(|launch| launch())))
}

fn prepare_a2a_pack<'a>(mut p: Prep<'a, '_>, d: usize, t: usize, h: usize) -> Result<Launch<'a>> {
    let (s, h_l) = (p.s, h / d);
    let slot = a2a_aligned_slot_bytes(t, h_l)?;
    let out = up(s, &p.units(t * h * D_V))?;
    let lse = up(s, &p.lses(t * h))?;
    let send = zeros::<u8>(s, d * slot)?;
    let args = A2aPack {
        out: CombineRows::F32(sl(s, &out)),
        lse: sl(s, &lse),
        send: sl(s, &send),
        slot_bytes: slot,
        group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
    };
    p.launch((out, lse, send), args, combine::a2a_pack)
}

fn prepare_reorder<'a>(mut p: Prep<'a, '_>, prefix: usize, d: usize) -> Result<Launch<'a>> {
    let s = p.s;
    let (dcp, plan, pieces) = prefill_chunk(s, prefix, d)?;
    let chunk = &plan.chunks[0];
    let gathered = p.bf16_units(d * plan.cap_rows * D_QK)?;
    let out = zeros::<bf16>(s, chunk.tokens * D_QK)?;
    let args = Reorder {
        gathered: sl(s, &gathered),
        cap_rows: plan.cap_rows,
        pieces: sl(s, &pieces),
        max_pieces: chunk.pieces.len(),
        out: sl(s, &out),
        out_rows: chunk.tokens,
        dcp,
    };
    p.launch((pieces, gathered, out), args, prefill::reorder)
}

/// Token rows encoded on the host before the pattern repeats across the cache.
const PATTERN_TOKENS: usize = 1 << 16;

/// A cache of `tokens` random token rows in `format` (FP8 rows encoded exactly as the fill
/// does): [`PATTERN_TOKENS`] random rows, repeated by device copies (generating gigabytes on the
/// host would take longer than the benchmark).
fn random_cache(s: &Arc<CudaStream>, rng: &mut Rng, format: KvFormat, tokens: usize) -> Result<CudaSlice<u8>> {
    let n = format.token_bytes();
    let mut bytes = vec![0u8; tokens.min(PATTERN_TOKENS) * n];
    let mut ckv = [bf16::ZERO; D_LATENT];
    let mut kpe = [bf16::ZERO; D_ROPE];
    for row in bytes.chunks_mut(n) {
        ckv.iter_mut().chain(kpe.iter_mut()).for_each(|x| *x = bf16::from_f32(rng.unit()));
        match format {
            KvFormat::Bf16 => {
                for (d, v) in row.chunks_mut(2).zip(ckv.iter().chain(&kpe)) {
                    d.copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
            KvFormat::Fp8_656 => dcp_mla::formats::encode_fp8_row(&ckv, &kpe, row),
        }
    }
    repeat_pattern(s, &bytes, tokens * n)
}

/// A packed MODEL1 cache of `pages`' geometry: random token rows encoded as the fill does,
/// [`PATTERN_TOKENS`] of them (whole pages) repeated across the cache as [`random_cache`] does.
fn random_model1_cache(s: &Arc<CudaStream>, rng: &mut Rng, pages: Model1Pages) -> Result<CudaSlice<u8>> {
    let pattern = Model1Pages::new(pages.num_pages.min(PATTERN_TOKENS / pages.block_size).max(1), pages.block_size);
    let mut bytes = vec![0u8; pattern.cache_bytes()];
    let mut row = [bf16::ZERO; MODEL1_D_QK];
    for slot in 0..pattern.slots() {
        row.iter_mut().for_each(|x| *x = bf16::from_f32(rng.unit()));
        encode_model1_token(&row, &pattern, slot, &mut bytes);
    }
    repeat_pattern(s, &bytes, pages.cache_bytes())
}

/// `total` bytes on the device: `pattern` over and over (the last copy cut short), by device
/// copies.
fn repeat_pattern(s: &Arc<CudaStream>, pattern: &[u8], total: usize) -> Result<CudaSlice<u8>> {
    let src = up(s, pattern)?;
    let mut out = zeros::<u8>(s, total)?;
    let mut at = 0;
    while at < total {
        let len = pattern.len().min(total - at);
        drv("cuMemcpyDtoDAsync", s.memcpy_dtod(&src.slice(..len), &mut out.slice_mut(at..at + len)))?;
        at += len;
    }
    Ok(out)
}

/// All-gathered candidates [D, rows, K]: distinct global ids (rank r holds ids ≡ r mod D, as
/// with I = 1) with random scores.
fn candidates(rng: &mut Rng, rows: usize, d: usize, k: usize) -> (Vec<f32>, Vec<i32>) {
    let mut scores = Vec::with_capacity(d * rows * k);
    let mut ids = Vec::with_capacity(d * rows * k);
    for r in 0..d {
        for _ in 0..rows {
            for j in 0..k {
                scores.push(rng.unit());
                ids.push((j * 4 * d + r) as i32);
            }
        }
    }
    (scores, ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_unique_and_targets_meaningful() {
        let rows = rows();
        let mut names: Vec<String> = rows.iter().map(|r| r.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), rows.len(), "row names are unique");
        // a FlashMLA row: b=128 q=2 H=64 K=2048 sparse is 2·128·2·64·2048·1088 FLOPs
        let sparse = rows.iter().find(|r| r.shape == "Fp8_656 b=128 q=2 H=64 K=2048").unwrap();
        assert_eq!(sparse.work().1, 2.0 * 128.0 * 2.0 * 64.0 * 2048.0 * 1088.0);
        // FlashMLA's 324 TFLOP/s there means 225.3 µs: the ratio at 225.3 µs is about 1
        let m = Measurement { us: 225.3, bytes: sparse.work().0, flops: sparse.work().1 };
        let r = sparse.target.ratio(&m, 4000.0).unwrap();
        assert!((r - 1.0).abs() < 0.01, "{r}");
    }

    #[test]
    fn model1_rows_are_flashmlas_shapes_with_its_counts_and_bar() {
        let rows = rows();
        // the comparison script pairs rows by family and these exact shape strings
        let shapes = ["Model1 b=128 q=1 H=64 K=512", "Model1 b=128 q=2 H=128 K=512", "Model1 b=64 q=2 H=64 K=2048"];
        for (shape, (b, q, h, k, flashmla_us)) in shapes.into_iter().zip(MODEL1_FLASHMLA_H100_US) {
            let r = rows.iter().find(|r| r.family == "mla_decode" && r.shape == shape);
            let r = r.unwrap_or_else(|| panic!("no mla_decode row `{shape}`"));
            assert_eq!(r.case, Case::Model1 { b, q, h, k });
            // b·q·K·584 + bf16 q and out of 512 values; 2·b·q·H·K·(512 + 512) FLOPs
            let (bytes, flops) = r.work();
            assert_eq!(bytes, (b * q * k * 584 + b * q * h * 512 * 2 * 2) as f64, "{shape}");
            assert_eq!(flops, 2.0 * (b * q * h * k) as f64 * 1024.0, "{shape}");
            // the bar: 0.90 of FlashMLA's speed, met exactly at its time / 0.9
            let m = Measurement { us: flashmla_us / 0.9, bytes, flops };
            let ratio = r.target.ratio(&m, 3000.0).unwrap();
            assert!((ratio - 1.0).abs() < 1e-9, "{shape}: {ratio}");
            // the FP8 sparse rows' inputs: 32,768 shuffled tokens a request, pages of 64, one source
            let spec = DecodeSpec::of(r).unwrap().unwrap();
            assert!(spec.model1 && spec.sparse, "{shape}");
            assert_eq!((spec.context, spec.topk, spec.order), (SPARSE_CONTEXT, k, PageOrder::Shuffled));
            let pages = spec.model1_pages();
            assert_eq!((pages.num_pages, pages.block_size), (b * SPARSE_CONTEXT / DECODE_BLOCK, DECODE_BLOCK));
            assert_eq!(pages.page_stride, 37440, "584·64 bytes rounded up to a multiple of 576");
            assert_eq!(spec.dims(), (512, 512));
        }
        // FlashMLA's 41.9 µs at b128 q1 H64 K512 is 205 TFLOP/s: the target 0.9 of it
        assert_eq!(rows.iter().find(|r| r.shape == shapes[0]).unwrap().target.describe(), "≥ 185 TFLOP/s");
        // `dcp-mla bench --filter Model1` runs these three rows and no other
        assert_eq!(rows.iter().filter(|r| r.name().contains("Model1")).count(), 3);
    }

    #[test]
    fn step_rows_split_the_work_and_their_summary_adds_the_collectives() {
        let dense = StepShape { sparse: false, h_l: 8, sk: 32768, q: 1, d: 1 };
        // without DCP: the fill and attention over every token with H_l heads
        assert_eq!(
            step_parts(dense),
            vec![Case::Fill { format: KvFormat::Bf16, tokens: 64 }, Case::Dense { b: 64, q: 1, h: 8, sk: 32768 }]
        );
        // D = 4: a quarter of the fill and of the tokens, four times the heads, and the a2a combine
        let d4 = StepShape { d: 4, ..dense };
        assert_eq!(step_parts(d4)[1], Case::Dense { b: 64, q: 1, h: 32, sk: 8192 });
        assert_eq!(step_parts(d4)[3], Case::A2aCombine { d: 4, t: 64, h: 32 });
        let sparse = StepShape { sparse: true, h_l: 16, sk: 8192, q: 6, d: 8 };
        let parts = step_parts(sparse);
        assert!(parts.contains(&Case::TopkMerge { rows: 384, d: 8, k: 2048 }));
        assert!(parts.contains(&Case::Sparse { format: KvFormat::Fp8_656, b: 64, q: 6, h: 128, k: 256 }));
        // a step's work is its parts': without DCP the fill's bytes and the attention's; with DCP
        // a rank does the same FLOPs (D·H_l heads over L/D tokens) and moves fewer bytes
        let (bytes, flops) = work(&Case::DcpStep(dense));
        let (fill, attn) = (work(&step_parts(dense)[0]), work(&step_parts(dense)[1]));
        assert_eq!((bytes, flops), (fill.0 + attn.0, attn.1));
        let (bytes4, flops4) = work(&Case::DcpStep(d4));
        assert_eq!(flops4, flops);
        assert!(bytes4 < bytes / 2.0, "{bytes4} vs {bytes}");
        // the summary: 600 µs alone; at D = 2 240 µs of kernels + 24.7 + 17 of NCCL
        let rows: Vec<BenchRow> = [1, 2]
            .into_iter()
            .map(|d| BenchRow::new("dcp_step", Case::DcpStep(StepShape { d, ..dense }), Target::None))
            .collect();
        let text = step_summary(&[(&rows[0], 600.0), (&rows[1], 240.0)]);
        let total = 240.0 + 24.7 + 17.0;
        assert_eq!(step_collectives_us(StepShape { d: 2, ..dense }), 24.7 + 17.0);
        assert!(text.contains(&format!("{total:.1} ({:.2})", 600.0 / total)), "{text}");
        assert!(text.contains("dense H_l=8 s_k=32768 q=1 "), "{text}");
    }

    #[test]
    fn block_tables_hold_every_page_once() {
        let ordered = block_table(&mut Rng::new(1), 4, 8, PageOrder::Ordered);
        assert_eq!(ordered, (0..32).collect::<Vec<_>>());
        let shuffled = block_table(&mut Rng::new(1), 4, 8, PageOrder::Shuffled);
        let mut sorted = shuffled.clone();
        sorted.sort();
        assert_eq!(sorted, ordered, "a permutation of all pages");
        assert_ne!(shuffled, ordered);
        assert_eq!(shuffled, block_table(&mut Rng::new(1), 4, 8, PageOrder::Shuffled), "seeded");
        assert_eq!(page_order(DECODE_ORDERED_FAMILY), PageOrder::Ordered);
        assert_eq!(page_order("mla_decode"), PageOrder::Shuffled);
        assert_eq!(page_order(DECODE_ENGINE_FAMILY), PageOrder::Shuffled);
    }

    #[test]
    fn sparse_indices_are_distinct_tokens_of_the_request_through_its_table() {
        let (requests, pages, block, q, context, k) = (3, 8, 4, 2, 32, 20);
        let table = block_table(&mut Rng::new(5), requests, pages, PageOrder::Shuffled);
        let idx = sparse_indices(&mut Rng::new(6), &table, pages, block, q, context, k);
        assert_eq!(idx.len(), requests * q * k);
        for (r, list) in idx.chunks(k).enumerate() {
            let own = &table[(r / q) * pages..(r / q + 1) * pages];
            let mut seen = std::collections::HashSet::new();
            for &i in list {
                // page·B + offset, the page one of the request's own
                assert!(own.contains(&(i / block as i32)), "row {r}: {i} is not in its request's pages");
                assert!(seen.insert(i), "row {r}: {i} twice");
            }
        }
        // the identity table gives the request's own token range
        let ordered = block_table(&mut Rng::new(5), requests, pages, PageOrder::Ordered);
        let idx = sparse_indices(&mut Rng::new(6), &ordered, pages, block, q, context, k);
        for (r, list) in idx.chunks(k).enumerate() {
            let base = ((r / q) * context) as i32;
            assert!(list.iter().all(|&i| (base..base + context as i32).contains(&i)));
        }
    }

    #[test]
    fn engine_rows_are_engine_views_shapes() {
        let rows = rows();
        let engine: Vec<&BenchRow> = rows.iter().filter(|r| r.family == DECODE_ENGINE_FAMILY).collect();
        assert_eq!(engine.len(), 12);
        assert_eq!(engine[0].shape, "dense b128 q1 H64 8K");
        assert_eq!(engine[11].shape, "sparse fp8 b64 q1 H128 K512");
        assert_eq!(graph_replays(DECODE_ENGINE_FAMILY), Some(15));
        assert_eq!(graph_replays(DECODE_GRAPH_FAMILY), Some(10));
        assert_eq!(graph_replays("mla_decode"), None);
        // ragged: uniform in [s_k/8, s_k], seeded, the same every call
        let ragged = ENGINE_SHAPES.iter().find(|e| e.ragged).unwrap();
        let lens = engine_lens(ragged);
        assert_eq!(lens, engine_lens(ragged));
        assert!(lens.iter().all(|&l| (4096..=32768).contains(&l)));
        assert!(lens.iter().any(|&l| l != lens[0]));
        // causal rows: L − q + 1 + j
        assert_eq!(decode_row_lens(&[8192, 100], 2, true).unwrap(), [8191, 8192, 99, 100]);
        assert_eq!(decode_row_lens(&[8192, 100], 2, false).unwrap(), [8192, 8192, 100, 100]);
        // counts: the q = 1 uniform row is `Dense`'s; a causal row reads the same KV, fewer FLOPs
        let q1 = engine.iter().find(|r| r.shape == "dense b128 q1 H64 8K").unwrap();
        assert_eq!(q1.work(), kernel_work(&Case::Dense { b: 128, q: 1, h: 64, sk: 8192 }));
        let q2 = engine.iter().find(|r| r.shape == "dense b128 q2 H64 8K causal").unwrap();
        let full = kernel_work(&Case::Dense { b: 128, q: 2, h: 64, sk: 8192 });
        assert_eq!(q2.work().0, full.0);
        assert_eq!(full.1 - q2.work().1, 2.0 * 128.0 * 64.0 * 1088.0, "one token less for each request's first row");
        // the specs: causal lengths, the shape's own sparse context
        let spec = DecodeSpec::of(q2).unwrap().unwrap();
        // every row holds its request's length; the kernels' causal rule gives row j its share
        assert!(spec.causal && !spec.ragged && spec.row_lens[..2] == [8192, 8192]);
        let k512 = DecodeSpec::of(engine[11]).unwrap().unwrap();
        assert_eq!((k512.sparse, k512.context, k512.topk, k512.format), (true, 8192, 512, KvFormat::Fp8_656));
        let r = DecodeSpec::of(engine.iter().find(|r| r.shape.ends_with("ragged")).unwrap()).unwrap().unwrap();
        assert!(r.ragged && !r.causal);
    }

    #[test]
    fn decode_rows_read_shuffled_tables_and_fit_the_card() {
        let rows = rows();
        // every decode row but the diagnosis ones reads a shuffled table; sparse rows draw from
        // 32,768 tokens a request
        let mut ordered = 0;
        for r in &rows {
            let Some(spec) = DecodeSpec::of(r).unwrap() else { continue };
            if r.family == DECODE_ORDERED_FAMILY {
                ordered += 1;
                assert_eq!(spec.order, PageOrder::Ordered);
            } else {
                assert_eq!(spec.order, PageOrder::Shuffled, "{}", r.name());
            }
            if spec.sparse && !matches!(r.case, Case::Engine(_)) {
                assert_eq!(spec.context, SPARSE_CONTEXT, "{}", r.name());
            }
            // a row's buffers (every layer of a graph row) stay well inside an 80 GB card
            let layers = if graph_replays(r.family).is_some() { GRAPH_LAYERS } else { 1 };
            let bytes = layers * spec.device_bytes();
            assert!(bytes < 24 << 30, "{}: {} GB", r.name(), bytes >> 30);
        }
        assert_eq!(ordered, 12);
        // b = 128 sparse FP8 at 32K: 128·32768·656 bytes of cache (≈ 2.75 GB), and a little more
        let fp8 = rows.iter().find(|r| r.shape == "Fp8_656 b=128 q=1 H=64 K=2048").unwrap();
        let bytes = DecodeSpec::of(fp8).unwrap().unwrap().device_bytes();
        let cache = 128 * 32768 * 656;
        assert!((cache..cache + cache / 50).contains(&bytes), "{bytes}");
    }

    #[test]
    fn ratios_follow_the_target_kind() {
        let m = Measurement { us: 10.0, bytes: 30e6, flops: 0.0 }; // 3000 GB/s
        assert!((Target::CopyFraction(0.75).ratio(&m, 4000.0).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(Target::MaxUs(5.0).ratio(&m, 1.0), Some(0.5));
        assert_eq!(Target::FasterThan { baseline_us: 40.0, factor: 2.0 }.ratio(&m, 1.0), Some(2.0));
        assert_eq!(Target::None.ratio(&m, 1.0), None);
        // the same-bytes copy took 9 µs of the row's 10: 0.9 of it, the 0.9 target met exactly
        assert_eq!(Target::SameBytes(0.9).ratio(&m, 1.0), None, "no copy measured");
        let r = Target::SameBytes(0.9).ratio_with(&m, 1.0, Some(0.9 * m.us)).unwrap();
        assert!((r - 1.0).abs() < 1e-12, "{r}");
    }
    #[test]
    fn the_data_path_rows_carry_the_same_bytes_ceiling() {
        let rows = rows();
        let data: Vec<String> = rows.iter().filter(|r| r.is_data_path()).map(|r| r.family.to_string()).collect();
        // the fills (BF16 and FP8, 128 and 8,192 tokens), the flattens, the reorder, every merge
        // and ag_rs / a2a combine; no decode, top-k or step row
        for family in ["kv_fill", "prefill_flatten", "prefill_reorder", "combine_merge_two", "combine_ag_rs_correct"] {
            assert!(data.iter().any(|f| f == family), "{family} has no data-path row");
        }
        assert!(data.iter().any(|f| f.starts_with("combine_a2a")), "the a2a rows");
        assert_eq!(rows.iter().filter(|r| r.family == "kv_fill" && r.is_data_path()).count(), 4);
        for r in rows.iter().filter(|r| r.is_data_path()) {
            assert!(r.work().0 > 0.0 && r.work().1 == 0.0, "{}: a data-path row moves bytes only", r.name());
        }
        assert!(!rows.iter().any(|r| r.is_data_path()
            && (r.family.starts_with("mla_decode") || r.family.starts_with("topk") || r.family == "dcp_step")));
        let c = SameBytesCopy { kernel_us: 3.5, memcpy_us: 3.7 };
        assert_eq!(c.us(), 3.5);
    }
}
