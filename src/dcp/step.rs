//! A whole DCP decode step of one attention layer on one rank: fill of the new tokens on their
//! owner, query-head gather, local dense or sparse attention (sparse: distributed top-k from this
//! rank's indexer scores), and the combine in either shape. [`DecodeStep`] owns every buffer,
//! allocated once from planner sizes, so the same step can be captured in a CUDA graph and
//! replayed; inputs are rewritten in place between steps.

use super::group::DcpGroup;
use crate::error::{Error, Result};
use crate::formats::{KvFormat, D_LATENT, D_QK, D_ROPE, D_V};
use crate::ops::combine::{self, a2a_aligned_slot_bytes, CombineRows};
use crate::ops::decode::{self, DecodeCommon, DecodeOut, IndexLists};
use crate::ops::fill::{kv_fill, KvFill, NewTokens};
use crate::ops::{topk, BlockTable, CacheView};
use crate::planner::{causal_local_lens, check_heads, check_topk, DcpConfig, DcpLayout, MAX_Q_ROWS};
use crate::runtime::{Device, DeviceSlice, Stream};
use crate::LseBase;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use std::sync::Arc;

/// Which attention a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// Dense over the BF16 cache: row (i, j) sees every local token of its causal length.
    Dense,
    /// Sparse over the top-`k` tokens of the indexer scores, selected across the group.
    Sparse { k: usize, format: KvFormat },
}

impl Attention {
    pub fn format(&self) -> KvFormat {
        match self {
            Attention::Dense => KvFormat::Bf16,
            Attention::Sparse { format, .. } => *format,
        }
    }
}

/// The two communication shapes of the combine (docs/contract.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CombineShape {
    /// All-gather of lse, fp32 head-major contributions, fp32 reduce-scatter, cast.
    AgRs,
    /// One all-to-all of packed bf16 out + fp32 lse, full merge on the receiver.
    A2a,
}

/// The shape of one step on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepConfig {
    /// b: requests.
    pub batch: usize,
    /// q: query rows (new tokens) per request.
    pub nq: usize,
    /// H_l: query heads of this rank; attention sees H = D·H_l.
    pub local_heads: usize,
    pub dcp: DcpLayout,
    /// B: tokens per page.
    pub block_size: usize,
    /// Block-table columns per request: the pages of the longest request on every rank.
    pub max_pages: usize,
    /// Pages of this rank's cache.
    pub num_pages: usize,
    pub attention: Attention,
    /// Softmax scale σ.
    pub scale: f32,
}

impl StepConfig {
    /// A step for `batch` requests of up to `max_len` tokens each, with one private run of
    /// pages per request (the planner's pages_for), B = `block_size` and the default scale.
    pub fn for_context(
        batch: usize,
        nq: usize,
        local_heads: usize,
        dcp: DcpLayout,
        block_size: usize,
        max_len: u64,
        attention: Attention,
    ) -> Self {
        let max_pages = (dcp.pages_for(max_len, block_size) as usize).max(1);
        StepConfig {
            batch,
            nq,
            local_heads,
            dcp,
            block_size,
            max_pages,
            num_pages: batch * max_pages,
            attention,
            scale: decode::default_scale(),
        }
    }

    /// T = b·q query rows.
    pub fn rows(&self) -> usize {
        self.batch * self.nq
    }

    /// The combines' T, H_l and D.
    pub fn combine_group(&self) -> combine::CombineGroup {
        combine::CombineGroup { num_tokens: self.rows(), local_heads: self.local_heads, dcp_size: self.dcp.size }
    }

    /// H = D·H_l.
    pub fn heads(&self) -> usize {
        self.dcp.size * self.local_heads
    }

    /// Local tokens a request can hold on one rank: the indexer-score columns of sparse steps.
    pub fn local_capacity(&self) -> usize {
        self.max_pages * self.block_size
    }

    fn validate(&self, group_size: usize) -> Result<()> {
        DcpConfig::new(self.dcp.size, self.dcp.size, self.dcp.interleave, self.block_size)?;
        ensure_arg!(
            self.dcp.size == group_size,
            "dcp.size",
            "{} differs from the group's {group_size} ranks",
            self.dcp.size
        );
        ensure_arg!(self.batch >= 1, "batch", "must be at least 1");
        ensure_arg!((1..=MAX_Q_ROWS).contains(&self.nq), "nq", "{} is not in 1..={MAX_Q_ROWS}", self.nq);
        check_heads(self.dcp.size, self.local_heads)?;
        ensure_arg!(self.max_pages >= 1, "max_pages", "must be at least 1");
        ensure_arg!(self.num_pages >= 1, "num_pages", "must be at least 1");
        if let Attention::Sparse { k, .. } = self.attention {
            check_topk(self.dcp.size, k)?;
        }
        Ok(())
    }
}

/// The stages of a step, in the order [`DecodeStep::stages`] lists them; collectives are
/// separate stages so that a benchmark can time each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// KV fill of the new tokens this rank owns.
    Fill,
    /// All-gather of the query heads (and their interleave into [T, H, 576]).
    GatherQueries,
    /// Sparse: local top-k of this rank's scores and candidate packing.
    LocalTopk,
    /// Sparse: all-gather of the candidates.
    GatherCandidates,
    /// Sparse: global merge and compaction to this rank's cache slots.
    MergeTopk,
    /// Local attention over this rank's shard, all H heads.
    Attend,
    /// ag_rs: all-gather of the lse.
    AgGatherLse,
    /// ag_rs: the fp32 head-major contribution.
    AgCorrect,
    /// ag_rs: fp32 reduce-scatter over heads.
    AgReduceScatter,
    /// ag_rs: cast of this rank's heads and their merged lse.
    AgFinish,
    /// a2a: pack one slot per destination.
    A2aPack,
    /// a2a: the all-to-all.
    A2aExchange,
    /// a2a: merge of the received slots.
    A2aCombine,
}

impl Stage {
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Fill => "fill",
            Stage::GatherQueries => "gather q (NCCL)",
            Stage::LocalTopk => "local top-k + pack",
            Stage::GatherCandidates => "gather candidates (NCCL)",
            Stage::MergeTopk => "merge + compact",
            Stage::Attend => "attention",
            Stage::AgGatherLse => "ag_rs: gather lse (NCCL)",
            Stage::AgCorrect => "ag_rs: correct",
            Stage::AgReduceScatter => "ag_rs: reduce-scatter (NCCL)",
            Stage::AgFinish => "ag_rs: finish",
            Stage::A2aPack => "a2a: pack",
            Stage::A2aExchange => "a2a: all-to-all (NCCL)",
            Stage::A2aCombine => "a2a: combine",
        }
    }

    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            Stage::GatherQueries
                | Stage::GatherCandidates
                | Stage::AgGatherLse
                | Stage::AgReduceScatter
                | Stage::A2aExchange
        )
    }
}

/// Device views of every buffer, taken once (the pointers never change, so a captured graph
/// stays valid).
#[derive(Debug, Clone, Copy)]
struct Views {
    q_local: DeviceSlice<bf16>,
    ckv: DeviceSlice<bf16>,
    kpe: DeviceSlice<bf16>,
    positions: DeviceSlice<i32>,
    req_idx: DeviceSlice<i32>,
    block_table: DeviceSlice<i32>,
    lens: DeviceSlice<i32>,
    scores: DeviceSlice<f32>,
    cache: DeviceSlice<u8>,
    q_staging: DeviceSlice<bf16>,
    q_all: DeviceSlice<bf16>,
    attn_out: DeviceSlice<f32>,
    attn_lse: DeviceSlice<f32>,
    split_ws: DeviceSlice<u8>,
    local_idx: DeviceSlice<i32>,
    cand_scores: DeviceSlice<f32>,
    cand_ids: DeviceSlice<i32>,
    merged: DeviceSlice<i32>,
    indices: DeviceSlice<i32>,
    counts: DeviceSlice<i32>,
    lse_all: DeviceSlice<f32>,
    contrib: DeviceSlice<f32>,
    summed: DeviceSlice<f32>,
    a2a_send: DeviceSlice<u8>,
    a2a_recv: DeviceSlice<u8>,
    out: DeviceSlice<bf16>,
    lse: DeviceSlice<f32>,
    /// The attention sinks of this rank's H_l heads (sink_buf) when set (see [`DecodeStep::set_sinks`]).
    sink: Option<DeviceSlice<f32>>,
    sink_buf: DeviceSlice<f32>,
}

/// Every buffer of a step (kept alive for the views).
struct Buffers {
    q_local: CudaSlice<bf16>,
    ckv: CudaSlice<bf16>,
    kpe: CudaSlice<bf16>,
    positions: CudaSlice<i32>,
    req_idx: CudaSlice<i32>,
    block_table: CudaSlice<i32>,
    lens: CudaSlice<i32>,
    scores: CudaSlice<f32>,
    cache: CudaSlice<u8>,
    out: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    sink: CudaSlice<f32>,
    _scratch: Vec<Box<dyn std::any::Any>>,
}

/// One rank's decode step of one layer (see the module docs). Inputs are written with the
/// `set_*` methods (host copies, outside any graph), then [`DecodeStep::run`] (or a graph captured
/// from it) enqueues the whole step on the step's stream; [`DecodeStep::output`] reads this
/// rank's H_l heads of the result: out [T, H_l, 512] bf16 and lse [T, H_l] (natural log).
pub struct DecodeStep<'a> {
    dev: &'a Device,
    group: &'a DcpGroup,
    stream: Arc<CudaStream>,
    cfg: StepConfig,
    num_splits: usize,
    slot_bytes: usize,
    buf: Buffers,
    v: Views,
}

fn alloc<T: DeviceRepr + ValidAsZeroBits>(s: &Arc<CudaStream>, n: usize) -> Result<(CudaSlice<T>, DeviceSlice<T>)> {
    // One element at least, so every view has a real pointer.
    let b = s.alloc_zeros::<T>(n.max(1)).map_err(|source| Error::Driver { call: "cuMemAlloc", source })?;
    let ptr = DeviceSlice::of(&b, s).ptr();
    // SAFETY: the allocation holds at least n elements and lives as long as the step.
    Ok((b, unsafe { DeviceSlice::from_raw(ptr, n) }))
}

/// Allocates a scratch buffer that is only reached through its view, kept alive in `keep`.
fn scratch<T: DeviceRepr + ValidAsZeroBits + 'static>(
    s: &Arc<CudaStream>,
    n: usize,
    keep: &mut Vec<Box<dyn std::any::Any>>,
) -> Result<DeviceSlice<T>> {
    let (b, v) = alloc::<T>(s, n)?;
    keep.push(Box::new(b));
    Ok(v)
}

/// The stages of a step, in order.
pub fn stage_order(attention: Attention, shape: CombineShape) -> Vec<Stage> {
    let mut v = vec![Stage::Fill, Stage::GatherQueries];
    if matches!(attention, Attention::Sparse { .. }) {
        v.extend([Stage::LocalTopk, Stage::GatherCandidates, Stage::MergeTopk]);
    }
    v.push(Stage::Attend);
    match shape {
        CombineShape::AgRs => v.extend([Stage::AgGatherLse, Stage::AgCorrect, Stage::AgReduceScatter, Stage::AgFinish]),
        CombineShape::A2a => v.extend([Stage::A2aPack, Stage::A2aExchange, Stage::A2aCombine]),
    }
    v
}

impl<'a> DecodeStep<'a> {
    /// Allocates every buffer for `cfg` on `stream` (zeroed). The group decides D and this rank.
    pub fn new(dev: &'a Device, group: &'a DcpGroup, stream: Arc<CudaStream>, cfg: StepConfig) -> Result<Self> {
        cfg.validate(group.size())?;
        let s = &stream;
        let (d, t, h_l, h) = (cfg.dcp.size, cfg.rows(), cfg.local_heads, cfg.heads());
        let sparse = matches!(cfg.attention, Attention::Sparse { .. });
        let k = match cfg.attention {
            Attention::Sparse { k, .. } => k,
            Attention::Dense => 0,
        };
        // the attention's split count as its launch chooses it (the tuned table's where it has a
        // row for this rank's shard: small local contexts run best unsplit)
        let shape = crate::planner::choice::DecodeShape {
            sparse,
            format: cfg.attention.format(),
            batch: cfg.batch,
            nq: cfg.nq,
            heads: h,
            context: if sparse { k } else { cfg.max_pages * cfg.block_size },
            causal: false,
        };
        let num_splits = decode::decode_num_splits_on(dev, &shape)?;
        let slot_bytes = a2a_aligned_slot_bytes(t, h_l)?;
        let cols = if sparse { cfg.local_capacity() } else { 0 };
        let cache_bytes = cfg.num_pages * cfg.block_size * cfg.attention.format().token_bytes();
        let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
        let sc = &mut keep;
        let (q_local, q_local_v) = alloc::<bf16>(s, t * h_l * D_QK)?;
        let (ckv, ckv_v) = alloc::<bf16>(s, t * D_LATENT)?;
        let (kpe, kpe_v) = alloc::<bf16>(s, t * D_ROPE)?;
        let (positions, positions_v) = alloc::<i32>(s, t)?;
        let (req_idx, req_idx_v) = alloc::<i32>(s, t)?;
        let (block_table, block_table_v) = alloc::<i32>(s, cfg.batch * cfg.max_pages)?;
        let (lens, lens_v) = alloc::<i32>(s, t)?;
        let (scores, scores_v) = alloc::<f32>(s, t * cols)?;
        let (cache, cache_v) = alloc::<u8>(s, cache_bytes)?;
        let (out, out_v) = alloc::<bf16>(s, t * h_l * D_V)?;
        let (lse, lse_v) = alloc::<f32>(s, t * h_l)?;
        let (sink, sink_v) = alloc::<f32>(s, h_l)?;
        let v = Views {
            q_local: q_local_v,
            ckv: ckv_v,
            kpe: kpe_v,
            positions: positions_v,
            req_idx: req_idx_v,
            block_table: block_table_v,
            lens: lens_v,
            scores: scores_v,
            cache: cache_v,
            q_staging: scratch::<bf16>(s, d * t * h_l * D_QK, sc)?,
            q_all: scratch::<bf16>(s, t * h * D_QK, sc)?,
            attn_out: scratch::<f32>(s, t * h * D_V, sc)?,
            attn_lse: scratch::<f32>(s, t * h, sc)?,
            split_ws: scratch::<u8>(s, decode::decode_workspace_bytes(cfg.batch, cfg.nq, h, sparse, num_splits)?, sc)?,
            local_idx: scratch::<i32>(s, t * k, sc)?,
            cand_scores: scratch::<f32>(s, d * t * k, sc)?,
            cand_ids: scratch::<i32>(s, d * t * k, sc)?,
            merged: scratch::<i32>(s, t * k, sc)?,
            indices: scratch::<i32>(s, t * k, sc)?,
            counts: scratch::<i32>(s, t, sc)?,
            lse_all: scratch::<f32>(s, d * t * h, sc)?,
            contrib: scratch::<f32>(s, h * t * D_V, sc)?,
            summed: scratch::<f32>(s, h_l * t * D_V, sc)?,
            a2a_send: scratch::<u8>(s, d * slot_bytes, sc)?,
            a2a_recv: scratch::<u8>(s, d * slot_bytes, sc)?,
            out: out_v,
            lse: lse_v,
            sink: None,
            sink_buf: sink_v,
        };
        let buf = Buffers {
            q_local,
            ckv,
            kpe,
            positions,
            req_idx,
            block_table,
            lens,
            scores,
            cache,
            out,
            lse,
            sink,
            _scratch: keep,
        };
        Ok(DecodeStep { dev, group, stream, cfg, num_splits, slot_bytes, buf, v })
    }

    pub fn config(&self) -> &StepConfig {
        &self.cfg
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// KV splits the attention uses (from the shapes only).
    pub fn num_splits(&self) -> usize {
        self.num_splits
    }

    fn raw(&self) -> Stream {
        Stream::from_cudarc(&self.stream)
    }

    fn upload<T: DeviceRepr>(
        stream: &Arc<CudaStream>,
        arg: &'static str,
        host: &[T],
        dst: &mut CudaSlice<T>,
        n: usize,
    ) -> Result<()> {
        ensure_arg!(host.len() == n, arg, "holds {} values but the step needs {n}", host.len());
        if n == 0 {
            return Ok(());
        }
        let mut view = dst.slice_mut(0..n);
        stream.memcpy_htod(host, &mut view).map_err(|source| Error::Driver { call: "cuMemcpyHtoDAsync", source })
    }

    /// This rank's queries: bf16 [T, H_l, 576] (its TP heads).
    pub fn set_queries(&mut self, q: &[bf16]) -> Result<()> {
        let n = self.cfg.rows() * self.cfg.local_heads * D_QK;
        Self::upload(&self.stream, "q", q, &mut self.buf.q_local, n)
    }

    /// The new tokens' KV, one per query row (T rows, the same on every rank): c_kv [T, 512]
    /// and k_pe [T, 64] bf16.
    pub fn set_new_kv(&mut self, ckv: &[bf16], kpe: &[bf16]) -> Result<()> {
        let t = self.cfg.rows();
        Self::upload(&self.stream, "ckv", ckv, &mut self.buf.ckv, t * D_LATENT)?;
        Self::upload(&self.stream, "kpe", kpe, &mut self.buf.kpe, t * D_ROPE)
    }

    /// The block table shared by the group: int32 [batch, max_pages].
    pub fn set_block_table(&mut self, table: &[i32]) -> Result<()> {
        let n = self.cfg.batch * self.cfg.max_pages;
        Self::upload(&self.stream, "block_table", table, &mut self.buf.block_table, n)
    }

    /// The total length of each request, including its q new tokens (docs/contract.md §2): derives the
    /// new tokens' positions and this rank's causal local length of every query row.
    pub fn set_lengths(&mut self, lens: &[u64]) -> Result<()> {
        let c = self.cfg;
        ensure_arg!(lens.len() == c.batch, "lens", "has {} entries for {} requests", lens.len(), c.batch);
        let cap = (c.local_capacity() * c.dcp.size) as u64;
        for (i, &l) in lens.iter().enumerate() {
            ensure_arg!(l <= cap, "lens", "request {i}: {l} tokens exceed the {cap} the block table holds");
        }
        let local = causal_local_lens(lens, &vec![c.nq; c.batch], c.dcp, self.group.rank())?;
        let mut positions = Vec::with_capacity(c.rows());
        let mut req_idx = Vec::with_capacity(c.rows());
        for (i, &l) in lens.iter().enumerate() {
            for j in 0..c.nq {
                positions.push((l - c.nq as u64 + j as u64) as i32);
                req_idx.push(i as i32);
            }
        }
        Self::upload(&self.stream, "positions", &positions, &mut self.buf.positions, c.rows())?;
        Self::upload(&self.stream, "req_idx", &req_idx, &mut self.buf.req_idx, c.rows())?;
        Self::upload(&self.stream, "lens", &local, &mut self.buf.lens, c.rows())
    }

    /// Sparse steps: this rank's indexer scores, fp32 [T, local_capacity]: column l of row
    /// (i, j) scores local token l of request i. Columns past the row's causal length are never read.
    pub fn set_scores(&mut self, scores: &[f32]) -> Result<()> {
        let n = self.cfg.rows()
            * if matches!(self.cfg.attention, Attention::Sparse { .. }) { self.cfg.local_capacity() } else { 0 };
        Self::upload(&self.stream, "scores", scores, &mut self.buf.scores, n)
    }

    /// This rank's whole cache as bytes [num_pages, B, row bytes] (e.g. the context before the step).
    pub fn set_cache(&mut self, bytes: &[u8]) -> Result<()> {
        let n = self.cfg.num_pages * self.cfg.block_size * self.cfg.attention.format().token_bytes();
        Self::upload(&self.stream, "cache", bytes, &mut self.buf.cache, n)
    }

    /// The attention sinks of this rank's H_l heads (FlashMLA's `attn_sink`, docs/contract.md §4:
    /// its TP shard of the model's per-head sinks, sink\[j\] for head rank·H_l + j), applied once by
    /// the combine's last step (ag_rs finish or a2a combine), never by the ranks' attention; `None`
    /// removes them. A step captured in a graph keeps the choice it was captured with (the values
    /// may be rewritten in place).
    pub fn set_sinks(&mut self, sinks: Option<&[f32]>) -> Result<()> {
        let h_l = self.cfg.local_heads;
        match sinks {
            Some(v) => {
                Self::upload(&self.stream, "sinks", v, &mut self.buf.sink, h_l)?;
                self.v.sink = Some(self.v.sink_buf);
            }
            None => self.v.sink = None,
        }
        Ok(())
    }

    /// Overwrites the outputs (tests poison them before a run).
    pub fn fill_outputs(&mut self, out: bf16, lse: f32) -> Result<()> {
        let t = self.cfg.rows() * self.cfg.local_heads;
        Self::upload(&self.stream, "out", &vec![out; t * D_V], &mut self.buf.out, t * D_V)?;
        Self::upload(&self.stream, "lse", &vec![lse; t], &mut self.buf.lse, t)
    }

    /// Waits for the stream, then reads this rank's out [T, H_l, 512] and lse [T, H_l].
    pub fn output(&self) -> Result<(Vec<bf16>, Vec<f32>)> {
        let t = self.cfg.rows() * self.cfg.local_heads;
        let drv = |source| Error::Driver { call: "cuMemcpyDtoH", source };
        let out = self.stream.clone_dtoh(&self.buf.out.slice(0..t * D_V)).map_err(drv)?;
        let lse = self.stream.clone_dtoh(&self.buf.lse.slice(0..t)).map_err(drv)?;
        self.stream.synchronize().map_err(|source| Error::Driver { call: "cuStreamSynchronize", source })?;
        Ok((out, lse))
    }

    /// This rank's cache as bytes, after the stream drains.
    pub fn cache(&self) -> Result<Vec<u8>> {
        let out =
            self.stream.clone_dtoh(&self.buf.cache).map_err(|source| Error::Driver { call: "cuMemcpyDtoH", source })?;
        let n = self.cfg.num_pages * self.cfg.block_size * self.cfg.attention.format().token_bytes();
        Ok(out[..n].to_vec())
    }

    /// The stages of one step with the combine in `shape`.
    pub fn stages(&self, shape: CombineShape) -> Vec<Stage> {
        stage_order(self.cfg.attention, shape)
    }

    /// Enqueues the whole step. Every rank of the group must run it (same shape, same order).
    pub fn run(&self, shape: CombineShape) -> Result<()> {
        for s in self.stages(shape) {
            self.run_stage(s)?;
        }
        Ok(())
    }

    /// Enqueues one stage (see [`DecodeStep::stages`] for the order they need).
    pub fn run_stage(&self, stage: Stage) -> Result<()> {
        let (c, v, st, g) = (&self.cfg, &self.v, self.raw(), self.group);
        let (t, h_l) = (c.rows(), c.local_heads);
        match stage {
            Stage::Fill => self.fill(),
            Stage::GatherQueries => g.gather_query_heads(st, v.q_local, v.q_staging, v.q_all, t, h_l),
            Stage::LocalTopk => self.local_topk(),
            Stage::GatherCandidates => {
                let k = self.topk("GatherCandidates")?;
                g.gather_candidates(st, v.cand_scores, v.cand_ids, t, k)
            }
            Stage::MergeTopk => self.merge_topk(),
            Stage::Attend => self.attend(),
            Stage::AgGatherLse => g.all_gather(st, v.attn_lse, v.lse_all, t * c.heads()),
            Stage::AgCorrect => self.ag_correct(),
            Stage::AgReduceScatter => g.reduce_scatter_sum(st, v.contrib, v.summed, h_l * t * D_V),
            Stage::AgFinish => self.ag_finish(),
            Stage::A2aPack => self.a2a_pack(),
            Stage::A2aExchange => g.all_to_all_bytes(st, v.a2a_send, v.a2a_recv, self.slot_bytes),
            Stage::A2aCombine => self.a2a_combine(),
        }
    }

    /// The step's top-k K; a sparse stage of a dense step is refused by name.
    fn topk(&self, stage: &str) -> Result<usize> {
        match self.cfg.attention {
            Attention::Sparse { k, .. } => Ok(k),
            Attention::Dense => Err(Error::Unsupported(format!("stage {stage} of a dense step"))),
        }
    }

    /// This rank's cache: packed pages of the step's block size.
    fn cache_view(&self) -> CacheView {
        CacheView::packed(self.v.cache, self.cfg.num_pages, self.cfg.block_size)
    }

    /// [`Stage::Fill`]: this rank's share of the new tokens into its cache.
    fn fill(&self) -> Result<()> {
        let (c, v) = (&self.cfg, &self.v);
        let rank = self.group.rank();
        kv_fill(
            self.dev,
            self.raw(),
            &KvFill {
                tokens: NewTokens::packed(v.ckv, v.kpe, v.req_idx, v.positions),
                block_table: BlockTable::packed(v.block_table, c.max_pages),
                batch: c.batch,
                cache: self.cache_view(),
                format: c.attention.format(),
                dcp: c.dcp,
                rank,
            },
        )
    }

    /// [`Stage::LocalTopk`]: the local top-k of this rank's columns, packed as its candidates.
    fn local_topk(&self) -> Result<()> {
        let k = self.topk("LocalTopk")?;
        let (c, v, dev, st) = (&self.cfg, &self.v, self.dev, self.raw());
        let (t, cols, rank) = (c.rows(), c.local_capacity(), self.group.rank());
        topk::local_topk(
            dev,
            st,
            &topk::LocalTopk { scores: v.scores, row_stride: cols, cols, lens: v.lens, rows: t, k, out: v.local_idx },
        )?;
        let slot = (rank * t * k) as u64;
        // SAFETY: slot `rank` of the [D, T, K] candidate buffers lies inside them.
        let (cand_scores, cand_ids) = unsafe {
            (
                DeviceSlice::from_raw(v.cand_scores.ptr() + slot * 4, t * k),
                DeviceSlice::from_raw(v.cand_ids.ptr() + slot * 4, t * k),
            )
        };
        topk::pack_candidates(
            dev,
            st,
            &topk::PackCandidates {
                local_idx: v.local_idx,
                scores: v.scores,
                row_stride: cols,
                cols,
                rows: t,
                k,
                dcp: c.dcp,
                rank,
                cand_scores,
                cand_ids,
            },
        )
    }

    /// [`Stage::MergeTopk`]: the exact global merge of every rank's candidates, compacted to this
    /// rank's own tokens as cache indices.
    fn merge_topk(&self) -> Result<()> {
        let k = self.topk("MergeTopk")?;
        let (c, v, dev, st) = (&self.cfg, &self.v, self.dev, self.raw());
        let (d, t, rank) = (c.dcp.size, c.rows(), self.group.rank());
        topk::global_merge(
            dev,
            st,
            &topk::GlobalMerge {
                cand_scores: v.cand_scores,
                cand_ids: v.cand_ids,
                dcp_size: d,
                rows: t,
                k,
                out: v.merged,
            },
        )?;
        topk::compact(
            dev,
            st,
            &topk::Compact {
                ids: v.merged,
                rows: t,
                k,
                dcp: c.dcp,
                rank,
                translate: Some(topk::PageTranslate {
                    block_table: v.block_table,
                    stride: c.max_pages,
                    block_size: c.block_size,
                    rows_per_request: c.nq,
                }),
                out: v.indices,
                counts: v.counts,
            },
        )
    }

    /// [`Stage::Attend`]: this rank's attention over its shard (dense or sparse).
    fn attend(&self) -> Result<()> {
        let (c, v, dev, st) = (&self.cfg, &self.v, self.dev, self.raw());
        let out = DecodeOut::F32(v.attn_out);
        let common = DecodeCommon {
            scale: c.scale,
            ..DecodeCommon::new(v.q_all, c.batch, c.nq, c.heads(), out, v.attn_lse, self.num_splits, v.split_ws)
        };
        match c.attention {
            Attention::Dense => decode::mla_decode_dense(
                dev,
                st,
                &decode::DenseDecode {
                    common,
                    cache: self.cache_view(),
                    block_table: BlockTable::packed(v.block_table, c.max_pages),
                    lens: v.lens,
                    lens_strides: None,
                    lens_rule: decode::LensRule::Local,
                },
            ),
            Attention::Sparse { k, format } => decode::mla_decode_sparse(
                dev,
                st,
                &decode::SparseDecode {
                    common,
                    cache: self.cache_view(),
                    format,
                    lists: IndexLists { topk_len: Some(v.counts), ..IndexLists::new(v.indices, k) },
                },
            ),
        }
    }

    /// [`Stage::AgCorrect`]: this rank's LSE-weighted contribution, head-major.
    fn ag_correct(&self) -> Result<()> {
        let (c, v, dev, st) = (&self.cfg, &self.v, self.dev, self.raw());
        let rank = self.group.rank();
        combine::ag_rs_correct(
            dev,
            st,
            &combine::AgRsCorrect {
                out: CombineRows::F32(v.attn_out),
                lse_all: v.lse_all,
                lse_base: LseBase::E,
                contrib: CombineRows::F32(v.contrib),
                group: c.combine_group(),
                rank,
            },
        )
    }

    /// [`Stage::AgFinish`]: the reduce-scattered heads cast to the step's output.
    fn ag_finish(&self) -> Result<()> {
        let (c, v, dev, st) = (&self.cfg, &self.v, self.dev, self.raw());
        let rank = self.group.rank();
        combine::ag_rs_finish(
            dev,
            st,
            &combine::AgRsFinish {
                summed: CombineRows::F32(v.summed),
                lse_all: v.lse_all,
                lse_base: LseBase::E,
                out: CombineRows::Bf16(v.out),
                lse: v.lse,
                group: c.combine_group(),
                rank,
                sink: v.sink,
            },
        )
    }

    /// [`Stage::A2aPack`]: the partial results packed a slot a destination rank.
    fn a2a_pack(&self) -> Result<()> {
        let (c, v, dev, st) = (&self.cfg, &self.v, self.dev, self.raw());
        combine::a2a_pack(
            dev,
            st,
            &combine::A2aPack {
                out: CombineRows::F32(v.attn_out),
                lse: v.attn_lse,
                send: v.a2a_send,
                slot_bytes: self.slot_bytes,
                group: c.combine_group(),
            },
        )
    }

    /// [`Stage::A2aCombine`]: the received slots merged into this rank's heads.
    fn a2a_combine(&self) -> Result<()> {
        let (c, v, dev, st) = (&self.cfg, &self.v, self.dev, self.raw());
        combine::a2a_combine(
            dev,
            st,
            &combine::A2aCombine {
                recv: v.a2a_recv,
                slot_bytes: self.slot_bytes,
                lse_base: LseBase::E,
                out: CombineRows::Bf16(v.out),
                lse: v.lse,
                group: c.combine_group(),
                sink: v.sink,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(d: usize, attention: Attention) -> StepConfig {
        StepConfig::for_context(4, 2, 8, DcpLayout { size: d, interleave: 1 }, 64, 1000, attention)
    }

    #[test]
    fn sizes_come_from_the_planner() {
        let c = cfg(2, Attention::Dense);
        // 1000 tokens over D = 2 ranks of 64-token pages: ceil(1000 / 128) = 8 pages per request.
        assert_eq!((c.max_pages, c.num_pages, c.rows(), c.heads()), (8, 32, 8, 16));
        assert_eq!(c.local_capacity(), 512);
    }

    #[test]
    fn invalid_configs_are_typed_errors() {
        assert!(cfg(2, Attention::Dense).validate(2).is_ok());
        assert!(matches!(cfg(2, Attention::Dense).validate(4), Err(Error::InvalidArgument { arg: "dcp.size", .. })));
        let e = cfg(1, Attention::Sparse { k: 256, format: KvFormat::Fp8_656 }).validate(1).unwrap_err();
        assert!(e.to_string().contains("K = 256") && e.to_string().contains("D = 1"), "{e}");
        let e = StepConfig { local_heads: 80, ..cfg(2, Attention::Dense) }.validate(2).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        let e = StepConfig { nq: 9, ..cfg(2, Attention::Dense) }.validate(2).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: "nq", .. }), "{e}");
    }

    #[test]
    fn collectives_sit_between_their_producers_and_consumers() {
        for a in [Attention::Dense, Attention::Sparse { k: 512, format: KvFormat::Fp8_656 }] {
            for s in [CombineShape::AgRs, CombineShape::A2a] {
                let order = stage_order(a, s);
                let at = |x: Stage| order.iter().position(|&y| y == x);
                assert!(at(Stage::Fill) < at(Stage::Attend) && at(Stage::GatherQueries) < at(Stage::Attend));
                let sparse = matches!(a, Attention::Sparse { .. });
                if sparse {
                    assert!(at(Stage::LocalTopk) < at(Stage::GatherCandidates));
                    assert!(at(Stage::GatherCandidates) < at(Stage::MergeTopk));
                    assert!(at(Stage::MergeTopk) < at(Stage::Attend));
                }
                let combine = match s {
                    CombineShape::AgRs => {
                        vec![Stage::AgGatherLse, Stage::AgCorrect, Stage::AgReduceScatter, Stage::AgFinish]
                    }
                    CombineShape::A2a => vec![Stage::A2aPack, Stage::A2aExchange, Stage::A2aCombine],
                };
                assert_eq!(&order[order.len() - combine.len()..], &combine[..]);
                let collectives = order.iter().filter(|x| x.is_collective()).count();
                assert_eq!(collectives, 1 + sparse as usize + combine.iter().filter(|x| x.is_collective()).count());
            }
        }
    }
}
