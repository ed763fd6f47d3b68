//! The demo's GPU run: the D ranks' kernels launched one rank after another on one device, the
//! collectives (all-gather of the lse, reduce-scatter of the contributions) simulated by copies.

use super::problem::{add_time, place, Outputs, PathOutput, Problem};
use super::problem::{STAGE_COMBINE, STAGE_DENSE, STAGE_FILL, STAGE_SPARSE, STAGE_TOPK};
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use dcp_mla::formats::D_V;
use dcp_mla::ops::combine::{ag_rs_correct, ag_rs_finish, AgRsCorrect, AgRsFinish, CombineGroup, CombineRows};
use dcp_mla::ops::decode::{
    decode_num_splits, decode_workspace_bytes, mla_decode_dense, mla_decode_sparse, DecodeCommon, DecodeOut,
    DenseDecode, IndexLists, LensRule, SparseDecode,
};
use dcp_mla::ops::fill::{kv_fill, KvFill, NewTokens};
use dcp_mla::ops::topk::{compact, global_merge, local_topk, pack_candidates, Compact, GlobalMerge, LocalTopk};
use dcp_mla::ops::topk::{PackCandidates, PageTranslate};
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::reference::attention::default_scale;
use dcp_mla::reference::merge::reduce_scatter;
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use dcp_mla::{KvFormat, LseBase, Result};
use dcp_mla_cli::bench::{drv, sl, up};
use half::bf16;
use std::sync::Arc;

fn down<T: DeviceRepr + ValidAsZeroBits + Clone + Default>(s: &Arc<CudaStream>, d: &CudaSlice<T>) -> Result<Vec<T>> {
    drv("cuMemcpyDtoHAsync", s.clone_dtoh(d))
}

/// A buffer of n elements with every byte set to `byte` (0xff: NaN in bf16 and fp32, so an
/// output a kernel fails to write, or a cache slot it should not read, shows in the check).
fn poisoned<T: DeviceRepr + ValidAsZeroBits>(s: &Arc<CudaStream>, n: usize, byte: u8) -> Result<CudaSlice<T>> {
    let buf = drv("cuMemAlloc", s.alloc_zeros::<T>(n.max(1)))?;
    {
        let (ptr, _sync) = buf.device_ptr(s);
        // SAFETY: the allocation holds n.max(1) elements of T on this stream's context.
        let r = unsafe {
            cudarc::driver::result::memset_d8_async(ptr, byte, n.max(1) * std::mem::size_of::<T>(), s.cu_stream())
        };
        drv("cuMemsetD8Async", r)?;
    }
    Ok(buf)
}

/// One rank's decode output: out [T, H, 512] and lse [T, H], fp32.
type RankOutput = (CudaSlice<f32>, CudaSlice<f32>);

/// Per-stage totals timed with CUDA events.
struct Clock {
    s: Arc<CudaStream>,
    stages: Vec<(&'static str, f64)>,
}

impl Clock {
    fn time(&mut self, name: &'static str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let ctx = self.s.context();
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let a = drv("cuEventCreate", ctx.new_event(timed))?;
        let b = drv("cuEventCreate", ctx.new_event(timed))?;
        drv("cuEventRecord", a.record(&self.s))?;
        f()?;
        drv("cuEventRecord", b.record(&self.s))?;
        let ms = drv("cuEventElapsedTime", a.elapsed_ms(&b))? as f64;
        add_time(&mut self.stages, name, ms);
        Ok(())
    }

    /// [`Clock::time`] of one rank's decode, the stream synchronised after it.
    fn time_decode(&mut self, name: &'static str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        self.time(name, f)?;
        drv("cuStreamSynchronize", self.s.synchronize())
    }
}

pub fn run_gpu(dev: &Device, p: &Problem) -> Result<Outputs> {
    let s = dev.context().default_stream();
    let st = Stream::from_cudarc(&s);
    let mut clock = Clock { s: s.clone(), stages: Vec::new() };
    let (d, b, q, h, k, t) = (p.dcp.size, p.batch(), p.q, p.heads, p.k, p.rows());
    let sms = dev.num_sms();
    let sigma = default_scale();

    let d_table = up(&s, &p.table)?;
    let d_query = up(&s, &p.query)?;
    // the cached prefix (filled untimed) and the step's q new tokens per request (timed)
    let (ckv, kpe, req, pos) = p.new_tokens();
    let sets = [
        (up(&s, &p.ckv)?, up(&s, &p.kpe)?, up(&s, &p.req_idx)?, up(&s, &p.prefix_positions())?),
        (up(&s, &ckv)?, up(&s, &kpe)?, up(&s, &req)?, up(&s, &pos)?),
    ];

    // every rank fills its caches from the same new tokens, keeping only those it owns
    let mut dense_caches = Vec::new();
    let mut sparse_caches = Vec::new();
    for r in 0..d {
        let mut pair = Vec::new();
        for format in [KvFormat::Bf16, p.format] {
            let cache = poisoned::<u8>(&s, p.num_pages * p.block_size * format.token_bytes(), 0xff)?;
            for (n, (ckv, kpe, req, pos)) in sets.iter().enumerate() {
                let args = KvFill {
                    tokens: NewTokens::packed(sl(&s, ckv), sl(&s, kpe), sl(&s, req), sl(&s, pos)),
                    block_table: BlockTable::packed(sl(&s, &d_table), p.max_pages),
                    batch: b,
                    cache: CacheView::packed(sl(&s, &cache), p.num_pages, p.block_size),
                    format,
                    dcp: p.dcp,
                    rank: r,
                };
                if n == 0 {
                    kv_fill(dev, st, &args)?;
                } else {
                    clock.time(STAGE_FILL, || kv_fill(dev, st, &args))?;
                }
            }
            pair.push(cache);
        }
        sparse_caches.push(pair.pop().expect("two caches"));
        dense_caches.push(pair.pop().expect("two caches"));
    }

    let dense_splits = decode_num_splits(b, q, h, false, sms);
    let sparse_splits = decode_num_splits(b, q, h, true, sms);
    let ws_bytes = decode_workspace_bytes(b, q, h, false, dense_splits)?.max(decode_workspace_bytes(
        b,
        q,
        h,
        true,
        sparse_splits,
    )?);
    let ws = poisoned::<u8>(&s, ws_bytes, 0xff)?;
    // one rank's decode, timed: `launch` runs it given its common arguments, writing a fresh
    // poisoned out and lse, which the combine of its path then takes
    let decode_rank = |clock: &mut Clock, stage, splits, launch: &dyn Fn(DecodeCommon) -> Result<()>| {
        let out = poisoned::<f32>(&s, t * h * D_V, 0xff)?;
        let lse = poisoned::<f32>(&s, t * h, 0xff)?;
        let (out_view, lse_view) = (DecodeOut::F32(sl(&s, &out)), sl(&s, &lse));
        let common = DecodeCommon {
            scale: sigma,
            ..DecodeCommon::new(sl(&s, &d_query), b, q, h, out_view, lse_view, splits, sl(&s, &ws))
        };
        clock.time_decode(stage, || launch(common))?;
        Ok::<RankOutput, dcp_mla::Error>((out, lse))
    };

    let mut parts = Vec::new();
    for (r, cache) in dense_caches.iter().enumerate() {
        let lens = up(&s, &p.local_lens(r))?;
        let dense = |common| DenseDecode {
            common,
            cache: CacheView::packed(sl(&s, cache), p.num_pages, p.block_size),
            block_table: BlockTable::packed(sl(&s, &d_table), p.max_pages),
            lens: sl(&s, &lens),
            lens_strides: None,
            lens_rule: LensRule::Local,
        };
        parts.push(decode_rank(&mut clock, STAGE_DENSE, dense_splits, &|c| mla_decode_dense(dev, st, &dense(c)))?);
    }
    let dense = combine_gpu(dev, &s, &mut clock, p, &parts)?;

    // distributed top-k: local top-k and pack on every rank into its slot of the all-gathered
    // candidate buffers (one device: the all-gather is the shared buffer), then merge and compact
    let stride = p.local_stride();
    let cand_s = poisoned::<f32>(&s, d * t * k, 0xff)?;
    let cand_i = poisoned::<i32>(&s, d * t * k, 0x7f)?;
    let mut keep = Vec::new();
    for r in 0..d {
        let (scores, lens) = p.local_scores(r);
        let (scores, lens) = (up(&s, &scores)?, up(&s, &lens)?);
        let local = poisoned::<i32>(&s, t * k, 0x7f)?;
        let topk_args = LocalTopk {
            scores: sl(&s, &scores),
            row_stride: stride,
            cols: stride,
            lens: sl(&s, &lens),
            rows: t,
            k,
            out: sl(&s, &local),
        };
        let slot = r * t * k..(r + 1) * t * k;
        let pack_args = PackCandidates {
            local_idx: sl(&s, &local),
            scores: sl(&s, &scores),
            row_stride: stride,
            cols: stride,
            rows: t,
            k,
            dcp: p.dcp,
            rank: r,
            cand_scores: DeviceSlice::of(&cand_s.slice(slot.clone()), &s),
            cand_ids: DeviceSlice::of(&cand_i.slice(slot), &s),
        };
        clock.time(STAGE_TOPK, || {
            local_topk(dev, st, &topk_args)?;
            pack_candidates(dev, st, &pack_args)
        })?;
        keep.push((scores, lens, local));
    }
    let merged = poisoned::<i32>(&s, t * k, 0x7f)?;
    let merge_args = GlobalMerge {
        cand_scores: sl(&s, &cand_s),
        cand_ids: sl(&s, &cand_i),
        dcp_size: d,
        rows: t,
        k,
        out: sl(&s, &merged),
    };
    let mut parts = Vec::new();
    for (r, cache) in sparse_caches.iter().enumerate() {
        let idx = poisoned::<i32>(&s, t * k, 0x7f)?;
        let counts = poisoned::<i32>(&s, t, 0x7f)?;
        let compact_args = Compact {
            ids: sl(&s, &merged),
            rows: t,
            k,
            dcp: p.dcp,
            rank: r,
            translate: Some(PageTranslate {
                block_table: sl(&s, &d_table),
                stride: p.max_pages,
                block_size: p.block_size,
                rows_per_request: q,
            }),
            out: sl(&s, &idx),
            counts: sl(&s, &counts),
        };
        // every rank merges the same candidates, then keeps the ids it owns
        clock.time(STAGE_TOPK, || {
            global_merge(dev, st, &merge_args)?;
            compact(dev, st, &compact_args)
        })?;
        let sparse = |common| SparseDecode {
            common,
            cache: CacheView::packed(sl(&s, cache), p.num_pages, p.block_size),
            format: p.format,
            lists: IndexLists { topk_len: Some(sl(&s, &counts)), ..IndexLists::new(sl(&s, &idx), k) },
        };
        parts.push(decode_rank(&mut clock, STAGE_SPARSE, sparse_splits, &|c| mla_decode_sparse(dev, st, &sparse(c)))?);
    }
    let sparse = combine_gpu(dev, &s, &mut clock, p, &parts)?;
    let merged_ids = down(&s, &merged)?;
    drop(keep);
    Ok(Outputs { dense, sparse, merged_ids, stages: clock.stages })
}

/// The ag_rs combine: all-gather of the lse (device copies), every rank's fp32 contribution,
/// the reduce-scatter over heads (summed on the host in rank order, in fp32), and the final
/// cast of each rank's heads to bf16. `parts` holds each rank's decode output and lse.
fn combine_gpu(
    dev: &Device,
    s: &Arc<CudaStream>,
    clock: &mut Clock,
    p: &Problem,
    parts: &[RankOutput],
) -> Result<PathOutput> {
    let st = Stream::from_cudarc(s);
    let (d, t, h, h_l) = (p.dcp.size, p.rows(), p.heads, p.local_heads);
    let n = t * h;
    let mut lse_all = poisoned::<f32>(s, d * n, 0xff)?;
    for (r, (_, l)) in parts.iter().enumerate() {
        drv("cuMemcpyDtoDAsync", s.memcpy_dtod(&l.slice(..n), &mut lse_all.slice_mut(r * n..(r + 1) * n)))?;
    }
    let mut contribs = Vec::new();
    for (r, (out, _)) in parts.iter().enumerate() {
        let contrib = poisoned::<f32>(s, n * D_V, 0xff)?;
        let args = AgRsCorrect {
            out: CombineRows::F32(sl(s, out)),
            lse_all: sl(s, &lse_all),
            lse_base: LseBase::E,
            contrib: CombineRows::F32(sl(s, &contrib)),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            rank: r,
        };
        clock.time(STAGE_COMBINE, || ag_rs_correct(dev, st, &args))?;
        contribs.push(down(s, &contrib)?);
    }
    let mut res = PathOutput { out: vec![0.0; n * D_V], lse: vec![0.0; n] };
    for r in 0..d {
        let summed = up(s, &reduce_scatter(&contribs, r, h_l, t))?;
        let out = poisoned::<bf16>(s, t * h_l * D_V, 0xff)?;
        let lse = poisoned::<f32>(s, t * h_l, 0xff)?;
        let args = AgRsFinish {
            summed: CombineRows::F32(sl(s, &summed)),
            lse_all: sl(s, &lse_all),
            lse_base: LseBase::E,
            out: CombineRows::Bf16(sl(s, &out)),
            lse: sl(s, &lse),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            rank: r,
            sink: None,
        };
        clock.time(STAGE_COMBINE, || ag_rs_finish(dev, st, &args))?;
        place(&mut res, r, h, h_l, t, &down(s, &out)?, &down(s, &lse)?);
    }
    Ok(res)
}
