//! The DCP decode step across GPUs (one process per GPU, over NCCL): b = 64 requests of a 32K
//! context, H = D·H_l for H_l ∈ {8, 16}, dense BF16 and sparse FP8-656 (K = 2048). Times every
//! stage (each collective separately) and the whole step, eager and graph-replayed, with the
//! combine as ag_rs and as a2a; rank 0 prints the table.
//!
//! D = 2 unless `DCP_MLA_BENCH_D` says otherwise (4 or 8 on larger machines); exits with status
//! 2 when the machine has fewer GPUs. The process spawns itself once per rank.

use cudarc::driver::{sys, CudaContext, CudaStream};
use dcp_mla::dcp::{
    exchange_id_via_file, library_path_with_libnccl, visible_devices, Attention, CombineShape, DcpGroup, DecodeStep,
    StepConfig,
};
use dcp_mla::formats::{KvFormat, D_QK};
use dcp_mla::runtime::Device;
use dcp_mla::DcpLayout;
use half::bf16;
use std::process::Command;
use std::sync::Arc;

const RANK: &str = "DCP_MLA_BENCH_RANK";
const SIZE: &str = "DCP_MLA_BENCH_SIZE";
const ID_FILE: &str = "DCP_MLA_BENCH_ID";
const BATCH: usize = 64;
const CONTEXT: u64 = 32768;
const REPS: usize = 20;

fn main() {
    if std::env::var(RANK).is_ok() {
        worker();
        return;
    }
    let d: usize = std::env::var("DCP_MLA_BENCH_D").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let have = visible_devices();
    if have < d || d < 2 {
        eprintln!("bench step: needs D = {d} ≥ 2 GPUs, this machine has {have}");
        std::process::exit(2);
    }
    let path = std::env::temp_dir().join(format!("dcp-mla-bench-id-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let lib_path = library_path_with_libnccl();
    let exe = std::env::current_exe().expect("own executable");
    let children: Vec<_> = (0..d)
        .map(|r| {
            Command::new(&exe)
                .env(RANK, r.to_string())
                .env(SIZE, d.to_string())
                .env(ID_FILE, &path)
                .env("NCCL_NVLS_ENABLE", "0")
                .envs(lib_path.iter().map(|p| ("LD_LIBRARY_PATH", p)))
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        let status = c.wait().expect("wait");
        if !status.success() {
            eprintln!("bench step: rank {r} failed: {status}");
            ok = false;
        }
    }
    let _ = std::fs::remove_file(&path);
    std::process::exit(if ok { 0 } else { 1 });
}

/// Median of event-timed runs of `f`, in microseconds.
fn time_us(ctx: &Arc<CudaContext>, s: &Arc<CudaStream>, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..REPS)
        .map(|_| {
            let a = ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
            let b = ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
            a.record(s).unwrap();
            f();
            b.record(s).unwrap();
            a.elapsed_ms(&b).unwrap() as f64 * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn worker() {
    let rank: usize = std::env::var(RANK).unwrap().parse().unwrap();
    let d: usize = std::env::var(SIZE).unwrap().parse().unwrap();
    let dev = Device::open(rank).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    let path = std::env::var(ID_FILE).unwrap();
    let id = exchange_id_via_file(rank, std::path::Path::new(&path)).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    let group = DcpGroup::from_unique_id(&dev, &id, rank, d).expect("join");
    let ctx = dev.context().clone();
    let dcp = DcpLayout { size: d, interleave: 1 };
    let print = rank == 0;
    if print {
        println!("DCP decode step, D = {d}, b = {BATCH}, context {CONTEXT}, q = 1 (µs, median of {REPS}, rank 0)");
        println!("{:<34} {:>4} {:>8} {:>10} {:>10}", "stage", "H_l", "attn", "ag_rs", "a2a");
    }
    for attention in [Attention::Dense, Attention::Sparse { k: 2048, format: KvFormat::Fp8_656 }] {
        for h_l in [8, 16] {
            let cfg = StepConfig::for_context(BATCH, 1, h_l, dcp, 64, CONTEXT, attention);
            let s = ctx.new_stream().unwrap();
            let mut step = DecodeStep::new(&dev, &group, s.clone(), cfg).expect("step");
            let table: Vec<i32> = (0..cfg.num_pages as i32).collect();
            step.set_block_table(&table).unwrap();
            step.set_lengths(&vec![CONTEXT; BATCH]).unwrap();
            let q: Vec<bf16> =
                (0..cfg.rows() * h_l * D_QK).map(|i| bf16::from_f32(((i * 7919) % 251) as f32 / 251.0 - 0.5)).collect();
            step.set_queries(&q).unwrap();
            if let Attention::Sparse { .. } = attention {
                let cols = cfg.local_capacity();
                let scores: Vec<f32> =
                    (0..cfg.rows() * cols).map(|i| ((i as u64 * 2_654_435_761) % 1_000_003) as f32).collect();
                step.set_scores(&scores).unwrap();
            }
            let name = match attention {
                Attention::Dense => "dense",
                Attention::Sparse { .. } => "fp8 K2k",
            };
            let mut rows: Vec<(String, [f64; 2])> = Vec::new();
            for (col, shape) in [CombineShape::AgRs, CombineShape::A2a].into_iter().enumerate() {
                for _ in 0..3 {
                    step.run(shape).expect("warm-up");
                }
                s.synchronize().unwrap();
                for stage in step.stages(shape) {
                    let us = time_us(&ctx, &s, || step.run_stage(stage).expect("stage"));
                    let label = stage.name().to_string();
                    match rows.iter_mut().find(|(n, _)| *n == label) {
                        Some(r) => r.1[col] = us,
                        None => {
                            let mut v = [f64::NAN; 2];
                            v[col] = us;
                            rows.push((label, v));
                        }
                    }
                }
                let whole = time_us(&ctx, &s, || step.run(shape).expect("step"));
                s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
                let captured = step.run(shape);
                let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
                captured.expect("capture");
                let graph = graph.expect("end capture").expect("a graph");
                graph.launch().unwrap();
                let replay = time_us(&ctx, &s, || graph.launch().unwrap());
                for (label, us) in [("whole step, eager", whole), ("whole step, graph replay", replay)] {
                    match rows.iter_mut().find(|(n, _)| n == label) {
                        Some(r) => r.1[col] = us,
                        None => {
                            let mut v = [f64::NAN; 2];
                            v[col] = us;
                            rows.push((label.to_string(), v));
                        }
                    }
                }
            }
            if print {
                let cell = |x: f64| if x.is_nan() { "-".to_string() } else { format!("{x:.1}") };
                for (label, v) in &rows {
                    println!("{label:<34} {h_l:>4} {name:>8} {:>10} {:>10}", cell(v[0]), cell(v[1]));
                }
            }
        }
    }
}
