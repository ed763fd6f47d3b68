//! `dcp-mla demo`: one DCP decode step end to end, the dense BF16 path and the sparse path with
//! distributed top-k, D ranks simulated on one device (or on the CPU reference), checked against
//! full attention computed in fp64 without DCP (docs/contract.md §9 tolerances).

use super::plan::{count, count64, FormatArg, PlanArgs};
use super::problem::{add_time, place, Outputs, PathOutput, Problem, Spec};
use super::problem::{STAGE_COMBINE, STAGE_DENSE, STAGE_FILL, STAGE_SPARSE, STAGE_TOPK};
use clap::{Args, FromArgMatches};
use dcp_mla::formats::{D_LATENT, D_QK, D_ROPE, D_V};
use dcp_mla::planner::{causal_local_lens, DcpLayout};
use dcp_mla::reference::attention::{decode, decode_oracle, default_scale, QueryShape, Selection};
use dcp_mla::reference::fill::{fill, FillInput, PagedCache};
use dcp_mla::reference::merge::{ag_rs_contribution, ag_rs_finish, reduce_scatter, to_bf16};
use dcp_mla::reference::tolerance::{AttentionOracle, LSE_ABS, LSE_REL, OUT_ELEMENT_FACTOR, OUT_REL_L2};
use dcp_mla::reference::topk::{compact, global_merge, local_topk, pack_candidates, PageTranslate};
use dcp_mla::runtime::Device;
use dcp_mla::{KvFormat, LseBase};
use serde_json::json;
use std::time::Instant;

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// DCP size D: ranks that split the KV by token (simulated on one device); 1, 2, 4 or 8.
    #[arg(long = "dcp-size", value_parser = count(), allow_negative_numbers = true, short = 'd', default_value_t = 4)]
    pub dcp: usize,
    /// Interleave I: runs of I consecutive tokens per rank (must divide the block size).
    #[arg(long, value_parser = count(), allow_negative_numbers = true, short = 'i', default_value_t = 1)]
    pub interleave: usize,
    /// Tensor-parallel size (D must divide it).
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 8)]
    pub tp: usize,
    /// Requests in the batch [default: 64 on a GPU, 2 on the CPU].
    #[arg(long, value_parser = count(), allow_negative_numbers = true)]
    pub batch: Option<usize>,
    /// Tokens of the longest request; the others are up to a quarter shorter [default: 32768 on a
    /// GPU, 4096 on the CPU].
    #[arg(long, value_parser = count64(), allow_negative_numbers = true)]
    pub context: Option<u64>,
    /// Query heads per TP rank H_l; attention sees H = D·H_l gathered heads.
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 16)]
    pub local_heads: usize,
    /// Query rows per request (1 + MTP draft tokens, at most 8).
    #[arg(long = "num-q", value_parser = count(), allow_negative_numbers = true, default_value_t = 1)]
    pub q: usize,
    /// KV-cache format of the sparse path (the dense path is BF16).
    #[arg(long, value_enum, default_value = "fp8_656")]
    pub kv_format: FormatArg,
    /// Sparse top-k K (256, 512, 1024 or 2048; D·K must be a multiple of 512).
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 2048)]
    pub topk: usize,
    /// Tokens per page B.
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 64)]
    pub block_size: usize,
    /// Requests checked against the fp64 reference on the GPU (the CPU run checks all).
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 2)]
    pub check_requests: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run the CPU reference even when a GPU is present.
    #[arg(long)]
    pub cpu: bool,
    /// Print a JSON summary (the device, the shape, the stage times, the check and the KV
    /// capacity) instead of the report.
    #[arg(long)]
    pub json: bool,
}

/// The whole step on the CPU reference: every rank's fill, attention, top-k and combine.
pub fn run_cpu(p: &Problem) -> Outputs {
    let (d, t, k) = (p.dcp.size, p.rows(), p.k);
    let mut stages = Vec::new();
    let mut clock = |name, f: &mut dyn FnMut()| {
        let t0 = Instant::now();
        f();
        add_time(&mut stages, name, t0.elapsed().as_secs_f64() * 1e3);
    };
    let prefix_pos = p.prefix_positions();
    let prefix = FillInput {
        ckv: &p.ckv,
        ckv_stride: D_LATENT,
        kpe: &p.kpe,
        kpe_stride: D_ROPE,
        req_idx: &p.req_idx,
        positions: &prefix_pos,
    };
    let (ckv, kpe, req, pos) = p.new_tokens();
    let step =
        FillInput { ckv: &ckv, ckv_stride: D_LATENT, kpe: &kpe, kpe_stride: D_ROPE, req_idx: &req, positions: &pos };
    let mut dense_caches = Vec::new();
    let mut sparse_caches = Vec::new();
    for r in 0..d {
        // 0xff: NaN as bf16, e4m3 and fp32 scale, so a read of an unwritten slot shows
        let mut dense = vec![0xffu8; p.num_pages * p.block_size * KvFormat::Bf16.token_bytes()];
        let mut sparse = vec![0xffu8; p.num_pages * p.block_size * p.format.token_bytes()];
        // the cached prefix (untimed), then the step's new tokens
        fill(&prefix, &p.paged(KvFormat::Bf16), p.dcp, r, &mut dense);
        fill(&prefix, &p.paged(p.format), p.dcp, r, &mut sparse);
        clock(STAGE_FILL, &mut || {
            fill(&step, &p.paged(KvFormat::Bf16), p.dcp, r, &mut dense);
            fill(&step, &p.paged(p.format), p.dcp, r, &mut sparse);
        });
        dense_caches.push(dense);
        sparse_caches.push(sparse);
    }
    let sigma = default_scale();
    let mut parts = Vec::new();
    for (r, cache) in dense_caches.iter().enumerate() {
        let lens = p.local_lens(r);
        let mut res = (Vec::new(), Vec::new());
        clock(STAGE_DENSE, &mut || {
            res = decode::<f32>(
                &p.query,
                p.shape(),
                &p.paged(KvFormat::Bf16),
                cache,
                &Selection::Dense { lens: &lens },
                sigma,
            )
        });
        parts.push(res);
    }
    let dense = combine_cpu(p, &parts, &mut clock);

    let stride = p.local_stride();
    let (mut cand_s, mut cand_i) = (Vec::with_capacity(d * t * k), Vec::with_capacity(d * t * k));
    let mut merged = Vec::new();
    for r in 0..d {
        let (scores, lens) = p.local_scores(r);
        clock(STAGE_TOPK, &mut || {
            let idx = local_topk(&scores, t, stride, stride, &lens, k);
            let (s, i) = pack_candidates(&idx, &scores, stride, stride, k, p.dcp, r);
            cand_s.extend(s);
            cand_i.extend(i);
        });
    }
    for _ in 0..d {
        // every rank merges the same all-gathered candidates
        clock(STAGE_TOPK, &mut || merged = global_merge(&cand_s, &cand_i, d, t, k));
    }
    let mut parts = Vec::new();
    for (r, cache) in sparse_caches.iter().enumerate() {
        let mut sel = (Vec::new(), Vec::new());
        clock(STAGE_TOPK, &mut || sel = compact(&merged, k, p.dcp, r, Some(p.translate())));
        let mut res = (Vec::new(), Vec::new());
        clock(STAGE_SPARSE, &mut || {
            let s = Selection::Sparse { indices: &sel.0, k, topk_len: Some(&sel.1) };
            res = decode::<f32>(&p.query, p.shape(), &p.paged(p.format), cache, &s, sigma);
        });
        parts.push(res);
    }
    let sparse = combine_cpu(p, &parts, &mut clock);
    Outputs { dense, sparse, merged_ids: merged, stages }
}

/// The ag_rs combine on the reference: every rank's contribution from the all-gathered lse, the
/// reduce-scatter over heads, and the final cast of each rank's heads.
fn combine_cpu(
    p: &Problem,
    parts: &[(Vec<f32>, Vec<f32>)],
    clock: &mut impl FnMut(&'static str, &mut dyn FnMut()),
) -> PathOutput {
    let (d, t, h, h_l) = (p.dcp.size, p.rows(), p.heads, p.local_heads);
    let lse_all: Vec<f32> = parts.iter().flat_map(|(_, l)| l.iter().copied()).collect();
    let mut contribs = Vec::new();
    for (r, (out, _)) in parts.iter().enumerate() {
        clock(STAGE_COMBINE, &mut || contribs.push(ag_rs_contribution(r, out, &lse_all, d, t, h, LseBase::E)));
    }
    let mut res = PathOutput { out: vec![0.0; t * h * D_V], lse: vec![0.0; t * h] };
    for r in 0..d {
        let summed = reduce_scatter(&contribs, r, h_l, t);
        let mut fin = (Vec::new(), Vec::new());
        clock(STAGE_COMBINE, &mut || {
            let (o, l) = ag_rs_finish(&summed, &lse_all, d, t, h_l, LseBase::E, r * h_l, None);
            fin = (to_bf16(&o), l);
        });
        place(&mut res, r, h, h_l, t, &fin.0, &fin.1);
    }
    res
}

/// Errors of one path against the fp64 reference.
#[derive(Debug, Default)]
pub struct PathCheck {
    pub max_abs: f64,
    pub rel_l2: f64,
    pub max_lse: f64,
    pub failures: Vec<String>,
}

/// docs/contract.md §9 (the rule of reference::tolerance): out within 2^-6·A_c elementwise (the caller
/// checks the relative L2 over all requests); lse within 1e-5 + 2e-6·|ref|; inf/NaN positions
/// identical. Returns (Σ err², Σ ref²).
fn compare(what: &str, got_out: &[f32], got_lse: &[f32], want: &AttentionOracle, c: &mut PathCheck) -> (f64, f64) {
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    for (e, ((&g, &w), &a)) in got_out.iter().zip(&want.out).zip(&want.mean_abs_v).enumerate() {
        let g = g as f64;
        if g.is_nan() || g.is_finite() != w.is_finite() {
            c.failures.push(format!("{what}: out[{e}] = {g}, want {w}"));
            continue;
        }
        let diff = (g - w).abs();
        c.max_abs = c.max_abs.max(diff);
        if diff > OUT_ELEMENT_FACTOR * a {
            c.failures
                .push(format!("{what}: out[{e}] = {g}, want {w} (bound 2^-6·A_c = {:.2e})", OUT_ELEMENT_FACTOR * a));
        }
        err2 += diff * diff;
        ref2 += w * w;
    }
    for (e, (&g, &w)) in got_lse.iter().zip(&want.lse).enumerate() {
        let g = g as f64;
        if w.is_finite() {
            let diff = (g - w).abs();
            c.max_lse = c.max_lse.max(if diff.is_nan() { f64::INFINITY } else { diff });
            if diff.is_nan() || diff > LSE_ABS + LSE_REL * w.abs() {
                c.failures.push(format!("{what}: lse[{e}] = {g}, want {w}"));
            }
        } else if g != w {
            c.failures.push(format!("{what}: lse[{e}] = {g}, want {w}"));
        }
    }
    (err2, ref2)
}

/// The fp64 reference without DCP of request i (one rank holds every token), dense and sparse
/// over the reference's global top-k ids `ids` [q, K] of its rows.
fn reference_request(p: &Problem, i: usize, ids: &[i32]) -> [AttentionOracle; 2] {
    let one = DcpLayout { size: 1, interleave: 1 };
    let len = p.lens[i] as usize;
    let first = p.lens[..i].iter().sum::<u64>() as usize;
    let pages = len.div_ceil(p.block_size);
    let table: Vec<i32> = (0..pages as i32).collect();
    let req = vec![0i32; len];
    let input = FillInput {
        ckv: &p.ckv[first * D_LATENT..(first + len) * D_LATENT],
        ckv_stride: D_LATENT,
        kpe: &p.kpe[first * D_ROPE..(first + len) * D_ROPE],
        kpe_stride: D_ROPE,
        req_idx: &req,
        positions: &p.positions[first..first + len],
    };
    let paged = |format| PagedCache {
        block_table: &table,
        block_table_stride: pages,
        batch: 1,
        max_pages: pages,
        num_pages: pages,
        block_size: p.block_size,
        format,
    };
    let shape = QueryShape { batch: 1, rows: p.q, heads: p.heads };
    let query = &p.query[i * p.q * p.heads * D_QK..(i + 1) * p.q * p.heads * D_QK];
    let sigma = default_scale();
    let mut dense_bytes = vec![0xffu8; pages * p.block_size * KvFormat::Bf16.token_bytes()];
    fill(&input, &paged(KvFormat::Bf16), one, 0, &mut dense_bytes);
    let lens = causal_local_lens(&[p.lens[i]], &[p.q], one, 0).expect("lengths checked");
    let dense =
        decode_oracle(query, shape, &paged(KvFormat::Bf16), &dense_bytes, &Selection::Dense { lens: &lens }, sigma);
    drop(dense_bytes);
    let mut sparse_bytes = vec![0xffu8; pages * p.block_size * p.format.token_bytes()];
    fill(&input, &paged(p.format), one, 0, &mut sparse_bytes);
    let tr = PageTranslate { block_table: &table, stride: pages, block_size: p.block_size, rows_per_request: p.q };
    let (slots, counts) = compact(ids, p.k, one, 0, Some(tr));
    let sel = Selection::Sparse { indices: &slots, k: p.k, topk_len: Some(&counts) };
    let sparse = decode_oracle(query, shape, &paged(p.format), &sparse_bytes, &sel, sigma);
    [dense, sparse]
}

/// The check of one run: both paths on the sampled requests, the top-k ids on every row.
pub struct Check {
    pub paths: [PathCheck; 2],
    pub topk_rows_exact: usize,
    pub requests_checked: usize,
}

pub fn check(p: &Problem, o: &Outputs, sample: &[usize]) -> (Check, bool) {
    let (t, k, q, h) = (p.rows(), p.k, p.q, p.heads);
    // the global top-K of every row without DCP: local top-k over all tokens (ascending ids)
    let want_ids = local_topk(&p.scores, t, p.score_stride, p.score_stride, &p.row_lens(), k);
    let mut exact = 0;
    for row in 0..t {
        let mut got: Vec<i32> = o.merged_ids[row * k..(row + 1) * k].iter().copied().filter(|&x| x >= 0).collect();
        got.sort_unstable();
        let want: Vec<i32> = want_ids[row * k..(row + 1) * k].iter().copied().filter(|&x| x >= 0).collect();
        exact += (got == want) as usize;
    }
    let refs: Vec<[AttentionOracle; 2]> = std::thread::scope(|sc| {
        let handles: Vec<_> = sample
            .iter()
            .map(|&i| {
                let ids = &want_ids[i * q * k..(i + 1) * q * k];
                sc.spawn(move || reference_request(p, i, ids))
            })
            .collect();
        handles.into_iter().map(|hd| hd.join().expect("reference thread")).collect()
    });
    let mut paths = [PathCheck::default(), PathCheck::default()];
    for (pi, (c, got)) in paths.iter_mut().zip([&o.dense, &o.sparse]).enumerate() {
        let (mut err2, mut ref2) = (0.0, 0.0);
        for (&i, r) in sample.iter().zip(&refs) {
            let rows = i * q * h..(i + 1) * q * h;
            let (e, w) = compare(
                &format!("request {i}"),
                &got.out[rows.start * D_V..rows.end * D_V],
                &got.lse[rows.clone()],
                &r[pi],
                c,
            );
            err2 += e;
            ref2 += w;
        }
        c.rel_l2 = if ref2 > 0.0 { (err2 / ref2).sqrt() } else { err2.sqrt() };
        if c.rel_l2.is_nan() || c.rel_l2 > OUT_REL_L2 {
            c.failures.push(format!("relative L2 error {:.2e} exceeds {OUT_REL_L2:.0e}", c.rel_l2));
        }
    }
    let ok = paths.iter().all(|c| c.failures.is_empty()) && exact == t;
    (Check { paths, topk_rows_exact: exact, requests_checked: sample.len() }, ok)
}

/// Evenly spaced requests, the first and the last included.
pub fn sample_requests(batch: usize, n: usize) -> Vec<usize> {
    let n = n.clamp(1, batch);
    if n == 1 {
        return vec![0];
    }
    let mut v: Vec<usize> = (0..n).map(|j| j * (batch - 1) / (n - 1)).collect();
    v.dedup();
    v
}

/// KV capacity with and without DCP from `dcp-mla plan`'s defaults (H200, 61 layers).
fn capacity(a: &DemoArgs) -> Option<(serde_json::Value, String)> {
    let argv = [
        "plan".to_string(),
        format!("--tp={}", a.tp),
        format!("--dcp-size={}", a.dcp),
        format!("--interleave={}", a.interleave),
        format!("--block-size={}", a.block_size),
        format!("--local-heads={}", a.local_heads),
        format!("--topk={}", a.topk),
        format!("--kv-format={}", KvFormat::from(a.kv_format).name()),
    ];
    let m = PlanArgs::augment_args(clap::Command::new("plan")).try_get_matches_from(argv).ok()?;
    let pa = PlanArgs::from_arg_matches(&m).ok()?;
    let v = super::plan::plan(&pa).ok()?;
    let what = format!(
        "{:.0} GB × {} over {} layers, {}",
        pa.gpu_mem as f64 / 1e9,
        pa.cache_fraction,
        pa.layers,
        KvFormat::from(pa.kv_format).name()
    );
    Some((v, what))
}

/// Runs the demo; returns the process exit code (0 when the check passes).
pub fn run(a: &DemoArgs) -> i32 {
    let device = if a.cpu { Err("--cpu was given".to_string()) } else { Device::open(0).map_err(|e| e.to_string()) };
    let on_gpu = device.is_ok();
    let batch = a.batch.unwrap_or(if on_gpu { 64 } else { 2 });
    let context = a.context.unwrap_or(if on_gpu { 32768 } else { 4096 });
    let t0 = Instant::now();
    let spec = Spec {
        tp: a.tp,
        dcp: a.dcp,
        interleave: a.interleave,
        block_size: a.block_size,
        local_heads: a.local_heads,
        q: a.q,
        topk: a.topk,
        kv_format: a.kv_format.into(),
        seed: a.seed,
    };
    let p = match Problem::new(&spec, batch, context) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let gen_s = t0.elapsed().as_secs_f64();
    // the report, line by line; with --json, one summary at the end instead
    macro_rules! say {
        ($($t:tt)*) => {
            if !a.json {
                println!($($t)*);
            }
        };
    }
    match &device {
        Ok(dev) => say!(
            "dcp-mla demo: one DCP decode step on the GPU (compute capability {}.{}), D = {} ranks simulated on one device",
            dev.compute_capability().0,
            dev.compute_capability().1,
            p.dcp.size
        ),
        Err(why) => say!(
            "dcp-mla demo: no GPU ({why}): running the CPU reference at a small size, D = {} ranks simulated",
            p.dcp.size
        ),
    }
    let (lmin, lmax) = (p.lens.iter().min().unwrap(), p.lens.iter().max().unwrap());
    say!(
        "shape: batch {batch}, num_q {}, lengths {lmin}..{lmax}, H = D·H_l = {}·{} = {} heads, d_qk {D_QK}, d_v {D_V}, \
         B {}, I {}, tp {}, top-k {}, sparse cache {} (inputs generated in {gen_s:.1} s)",
        p.q,
        p.dcp.size,
        p.local_heads,
        p.heads,
        p.block_size,
        p.dcp.interleave,
        p.tp,
        p.k,
        p.format.name()
    );
    let outputs = match &device {
        Ok(dev) => match super::demo_gpu::run_gpu(dev, &p) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: the GPU run failed: {e}");
                return 1;
            }
        },
        Err(_) => run_cpu(&p),
    };
    say!("\n{:<40} {:>12}", "stage (mean per simulated rank)", if on_gpu { "µs" } else { "ms" });
    for (name, ms) in &outputs.stages {
        let per_rank = ms / p.dcp.size as f64;
        say!("  {:<38} {:>12.3}", name, if on_gpu { per_rank * 1e3 } else { per_rank });
    }
    let sample = if on_gpu { sample_requests(batch, a.check_requests) } else { (0..batch).collect() };
    let t1 = Instant::now();
    let (c, ok) = check(&p, &outputs, &sample);
    let check_s = t1.elapsed().as_secs_f64();
    say!(
        "\ncheck against full attention without DCP (fp64 reference, docs/contract.md §9), {} of {batch} requests, {:.1} s:",
        c.requests_checked,
        check_s
    );
    say!("  {:<22} {:>11} {:>10} {:>12}  result", "path", "max |err|", "rel L2", "max lse err");
    let names = ["dense BF16".to_string(), format!("sparse {} K={}", p.format.name(), p.k)];
    for (name, pc) in names.iter().zip(&c.paths) {
        say!(
            "  {:<22} {:>11.2e} {:>10.2e} {:>12.2e}  {}",
            name,
            pc.max_abs,
            pc.rel_l2,
            pc.max_lse,
            if pc.failures.is_empty() { "pass" } else { "FAIL" }
        );
        for f in pc.failures.iter().take(5) {
            say!("      {f}");
        }
    }
    say!(
        "  top-k ids: {} of {} rows equal the global top-{} without DCP{}",
        c.topk_rows_exact,
        p.rows(),
        p.k,
        if c.topk_rows_exact == p.rows() { " (exact)" } else { "  FAIL" }
    );
    let capacity = capacity(a);
    if let Some((v, what)) = &capacity {
        say!(
            "\nKV capacity (planner; {what}): {} tokens without DCP → {} with D = {} (×{:.0})",
            v["tokens_without_dcp"],
            v["tokens_with_dcp"],
            p.dcp.size,
            v["capacity_gain"].as_f64().unwrap_or(0.0)
        );
    }
    say!("\ncheck: {}", if ok { "PASS" } else { "FAIL" });
    if a.json {
        let (cc, cpu_reason) = match &device {
            Ok(dev) => (Some(dev.compute_capability()), None),
            Err(why) => (None, Some(why.clone())),
        };
        let stages: Vec<_> = outputs
            .stages
            .iter()
            .map(|(name, ms)| json!({ "stage": name, "ms_per_rank": ms / p.dcp.size as f64 }))
            .collect();
        let paths: Vec<_> = names
            .iter()
            .zip(&c.paths)
            .map(|(name, pc)| {
                json!({
                    "path": name,
                    "max_abs_err": pc.max_abs,
                    "rel_l2": pc.rel_l2,
                    "max_lse_err": pc.max_lse,
                    "pass": pc.failures.is_empty(),
                    "failures": pc.failures.iter().take(5).collect::<Vec<_>>(),
                })
            })
            .collect();
        let v = json!({
            "device": if on_gpu { "gpu" } else { "cpu" },
            "compute_capability": cc,
            "cpu_reason": cpu_reason,
            "dcp_size": p.dcp.size,
            "interleave": p.dcp.interleave,
            "tp": p.tp,
            "batch": batch,
            "num_q": p.q,
            "min_len": lmin,
            "max_len": lmax,
            "local_heads": p.local_heads,
            "heads": p.heads,
            "block_size": p.block_size,
            "topk": p.k,
            "kv_format": p.format.name(),
            "seed": a.seed,
            "inputs_s": gen_s,
            "stages": stages,
            "check": {
                "requests_checked": c.requests_checked,
                "seconds": check_s,
                "paths": paths,
                "topk_rows_exact": c.topk_rows_exact,
                "topk_rows": p.rows(),
            },
            "capacity": capacity.as_ref().map(|(v, what)| json!({
                "assumes": what,
                "tokens_without_dcp": v["tokens_without_dcp"],
                "tokens_with_dcp": v["tokens_with_dcp"],
                "capacity_gain": v["capacity_gain"],
            })),
            "pass": ok,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    }
    if ok {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_flags_what_spec_9_rejects() {
        let want = AttentionOracle {
            out: vec![0.5f64; D_V],
            lse: vec![2.0f64, f64::NEG_INFINITY],
            mean_abs_v: vec![0.75f64; D_V],
        };
        let mut c = PathCheck::default();
        let got: Vec<f32> = want.out.iter().map(|&x| x as f32 + 0.011).collect();
        compare("ok", &got, &[2.0, f32::NEG_INFINITY], &want, &mut c);
        assert!(c.failures.is_empty(), "within 2^-6·A_c = 0.0117: {:?}", c.failures);
        // one element off by 2.5% of 0.5 (beyond 2^-6·A_c), a NaN, an lse off by 1e-4, +inf for -inf
        let mut bad = got.clone();
        bad[3] = 0.5 * 1.025;
        bad[7] = f32::NAN;
        compare("bad", &bad, &[2.0001, f32::INFINITY], &want, &mut c);
        assert_eq!(c.failures.len(), 4, "{:?}", c.failures);
    }

    #[test]
    fn samples_include_both_ends() {
        assert_eq!(sample_requests(64, 2), vec![0, 63]);
        assert_eq!(sample_requests(5, 9), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_requests(7, 1), vec![0]);
    }
}
