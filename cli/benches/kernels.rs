//! Kernel microbenchmarks on the GPU (criterion, timed with CUDA events) over the rows of
//! [`dcp_mla_cli::bench::rows`], the same definitions `dcp-mla bench` runs, then a table of each
//! row's median against its docs/performance.md target and the same run's copy bandwidth. Without a GPU:
//! a message and exit code 2.

use criterion::{Criterion, Throughput};
use dcp_mla_cli::bench::{events_elapsed, gpu_or_exit, graph_replays, measure_us, prepare, rows, Measurement, Timer};
use std::time::Duration;

fn main() {
    let dev = gpu_or_exit("the dcp-mla benchmarks need");
    let s = dev.context().default_stream();
    let mut timer = Timer::new(&dev, s.clone(), 5, 30).expect("timer");
    let copy_gbs = timer.copy_gbs().expect("copy ceiling");
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let mut table = Vec::new();
    for row in rows() {
        let (bytes, flops) = row.work();
        // criterion times back-to-back launches of one layer; a graph row is a graph of layers,
        // which only the table's figure (measure_us) times
        if graph_replays(row.family).is_none() {
            let mut launch = prepare(&dev, &s, &row).unwrap_or_else(|e| panic!("{}: {e}", row.name()));
            let mut g = c.benchmark_group(row.family);
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_function(&row.shape, |b| b.iter_custom(|it| events_elapsed(&s, it, &mut launch).expect("launch")));
            g.finish();
        }
        let us = measure_us(&dev, &mut timer, &row).unwrap_or_else(|e| panic!("{}: {e}", row.name()));
        table.push((row, Measurement { us, bytes, flops }));
    }
    c.final_summary();

    println!("\ncopy ceiling: {copy_gbs:.0} GB/s (2 GiB device-to-device, read + write)");
    println!("{:<52} {:>10} {:>9} {:>9} {:>8} {:>7}  target", "row", "µs", "GB/s", "TFLOP/s", "of copy", "ratio");
    for (row, m) in table {
        let ratio = row.target.ratio(&m, copy_gbs).map_or("-".into(), |r| format!("{r:.2}"));
        println!(
            "{:<52} {:>10.2} {:>9.0} {:>9.1} {:>7.1}% {:>7}  {}",
            row.name(),
            m.us,
            m.gbs(),
            m.tflops(),
            100.0 * m.gbs() / copy_gbs,
            ratio,
            row.target.describe()
        );
    }
}
