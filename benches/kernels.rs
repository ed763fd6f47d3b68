//! Kernel microbenchmarks on the GPU (criterion, timed with CUDA events), plus a table of each
//! row's throughput as a ratio to the same run's device-to-device copy bandwidth and its
//! PERF.md target. Without a GPU: a message and exit code 2.

use criterion::{Criterion, Throughput};
use cudarc::driver::{CudaContext, CudaStream};
use dcp_mla::formats::{KvFormat, D_LATENT, D_ROPE};
use dcp_mla::ops::fill::{kv_fill, KvFill};
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use dcp_mla::DcpLayout;
use half::bf16;
use std::sync::Arc;
use std::time::Duration;

/// Median milliseconds of `f` over `reps` event-timed launches after a warm-up.
fn time_ms(ctx: &Arc<CudaContext>, s: &Arc<CudaStream>, reps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let a = ctx.new_event(None).unwrap();
            let b = ctx.new_event(None).unwrap();
            a.record(s).unwrap();
            f();
            b.record(s).unwrap();
            b.synchronize().unwrap();
            a.elapsed_ms(&b).unwrap() as f64
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Criterion's iteration body: `iters` launches between two events.
fn events(ctx: &Arc<CudaContext>, s: &Arc<CudaStream>, iters: u64, mut f: impl FnMut()) -> Duration {
    let a = ctx.new_event(None).unwrap();
    let b = ctx.new_event(None).unwrap();
    a.record(s).unwrap();
    for _ in 0..iters {
        f();
    }
    b.record(s).unwrap();
    b.synchronize().unwrap();
    Duration::from_secs_f64(a.elapsed_ms(&b).unwrap() as f64 / 1e3)
}

struct Row {
    name: String,
    us: f64,
    bytes: f64,
    target: String,
}

fn main() {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("the dcp-mla benchmarks need a CUDA GPU: {e}");
            std::process::exit(2);
        }
    };
    let ctx = dev.context().clone();
    let s = ctx.default_stream();
    let mut c = Criterion::default().configure_from_args().warm_up_time(Duration::from_millis(300));
    let mut rows = Vec::new();

    // Ceiling: a 2 GiB device-to-device copy, bytes read + written.
    let n = 1usize << 31;
    let src = s.alloc_zeros::<u8>(n).unwrap();
    let mut dst = s.alloc_zeros::<u8>(n).unwrap();
    let copy_ms = time_ms(&ctx, &s, 20, || s.memcpy_dtod(&src, &mut dst).unwrap());
    let copy_gbs = 2.0 * n as f64 / copy_ms / 1e6;
    drop((src, dst));

    let mut g = c.benchmark_group("kv_fill");
    for format in [KvFormat::Bf16, KvFormat::Fp8_656] {
        for tokens in [128usize, 8192] {
            let b = 64;
            let pages = tokens.div_ceil(b);
            let ckv = s.alloc_zeros::<bf16>(tokens * D_LATENT).unwrap();
            let kpe = s.alloc_zeros::<bf16>(tokens * D_ROPE).unwrap();
            let req = s.clone_htod(&vec![0i32; tokens]).unwrap();
            let pos = s.clone_htod(&(0..tokens as i32).collect::<Vec<_>>()).unwrap();
            let table = s.clone_htod(&(0..pages as i32).collect::<Vec<_>>()).unwrap();
            let cache = s.alloc_zeros::<u8>(pages * b * format.token_bytes()).unwrap();
            let args = KvFill {
                ckv: DeviceSlice::of(&ckv, &s),
                ckv_stride: D_LATENT,
                kpe: DeviceSlice::of(&kpe, &s),
                kpe_stride: D_ROPE,
                req_idx: DeviceSlice::of(&req, &s),
                positions: DeviceSlice::of(&pos, &s),
                block_table: DeviceSlice::of(&table, &s),
                block_table_stride: pages,
                batch: 1,
                max_pages: pages,
                cache: DeviceSlice::of(&cache, &s),
                num_pages: pages,
                block_size: b,
                format,
                dcp: DcpLayout { size: 1, interleave: 1 },
                rank: 0,
            };
            let st = Stream::from_cudarc(&s);
            let bytes = (tokens * (D_LATENT + D_ROPE) * 2 + tokens * format.token_bytes()) as f64;
            let name = format!("{format:?}/{tokens}");
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_function(&name, |bch| bch.iter_custom(|it| events(&ctx, &s, it, || kv_fill(&dev, st, &args).unwrap())));
            let ms = time_ms(&ctx, &s, 50, || kv_fill(&dev, st, &args).unwrap());
            let target = if tokens <= 128 { "≤ 5 µs".to_string() } else { "≥ 70% of copy".to_string() };
            rows.push(Row { name: format!("kv_fill {name}"), us: ms * 1e3, bytes, target });
        }
    }
    g.finish();
    c.final_summary();

    println!("\ncopy ceiling: {copy_gbs:.0} GB/s (2 GiB device-to-device, read + write)");
    println!("{:<28} {:>10} {:>10} {:>9}  target", "row", "µs", "GB/s", "of copy");
    for r in rows {
        let gbs = r.bytes / r.us / 1e3;
        println!("{:<28} {:>10.2} {:>10.0} {:>8.1}%  {}", r.name, r.us, gbs, 100.0 * gbs / copy_gbs, r.target);
    }
}
