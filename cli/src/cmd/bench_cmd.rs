//! `dcp-mla bench`: every row of `dcp_mla_cli::bench::rows` on the GPU, with the same run's copy
//! ceiling, each row's ratio to its docs/performance.md target, and JSON / CSV outputs
//! (`--json`: JSON on stdout; `--json-out FILE`, `--csv FILE`: files).

use super::plan::launches;
use dcp_mla::runtime::Device;
use dcp_mla_cli::bench::{measure_us, rows, step_summary, BenchRow, Measurement, SameBytesCopy, Timer};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Print the results as JSON to stdout instead of the table (as `plan --json` and
    /// `kernels --json` do).
    #[arg(long)]
    pub json: bool,
    /// Write the results as JSON to this file (besides the table, or the JSON on stdout). The
    /// older `--json FILE` still means this, with a warning, until the next release.
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    /// Write the results as CSV to this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Only rows whose name contains this text (e.g. `mla_decode`, `topk`), or any of several
    /// texts separated by commas (`mla_decode_engine,kv_fill`; no row name has a comma).
    #[arg(long)]
    pub filter: Option<String>,
    /// Untimed launches before each row is measured, at most 1,000,000.
    #[arg(long, value_parser = launches(0), allow_negative_numbers = true, default_value_t = 5)]
    pub warmup: usize,
    /// Timed launches per row (the median is reported), 1 to 1,000,000.
    #[arg(long, value_parser = launches(1), allow_negative_numbers = true, default_value_t = 30)]
    pub reps: usize,
    /// Ignore any tuned decode table (`DCP_MLA_TUNE_TABLE` or the build's own): the decode
    /// launcher's heuristic everywhere, to compare against a run with the table.
    #[arg(long)]
    pub heuristic: bool,
}

struct Result_ {
    row: BenchRow,
    m: Measurement,
    ratio: Option<f64>,
    /// A data-path row's same-bytes copy ([`BenchRow::is_data_path`]).
    same: Option<SameBytesCopy>,
}

impl Result_ {
    /// The same-bytes copy's µs over the row's: 1 is the row at the speed of moving its bytes.
    fn of_same_bytes(&self) -> Option<f64> {
        self.same.map(|c| c.us() / self.m.us)
    }
}

/// Whether `--filter` text `filter` keeps the row `name`: it contains one of the filter's
/// comma-separated texts (each trimmed, empty ones ignored; a filter of none keeps every row).
pub fn filter_keeps(filter: &str, name: &str) -> bool {
    let mut texts = filter.split(',').map(str::trim).filter(|f| !f.is_empty()).peekable();
    texts.peek().is_none() || texts.any(|f| name.contains(f))
}

/// Exit code: 0 when every row ran, 1 when a row failed (or `--filter` keeps none), 2 without a
/// GPU.
pub fn run(a: &BenchArgs) -> i32 {
    let selected: Vec<BenchRow> =
        rows().into_iter().filter(|r| a.filter.as_deref().is_none_or(|f| filter_keeps(f, &r.name()))).collect();
    if selected.is_empty() {
        // checked first: a filter that keeps nothing is an error with or without a GPU
        eprintln!("error: --filter `{}` matches no row of dcp-mla bench", a.filter.as_deref().unwrap_or(""));
        return 1;
    }
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("dcp-mla bench needs a CUDA GPU: {e}");
            return 2;
        }
    };
    if a.heuristic {
        dcp_mla::planner::tune::set_tune_table(None);
    }
    let tune_table = tune_table_json(&dev);
    match &tune_table {
        serde_json::Value::Null => eprintln!("tuned decode table: none (the launcher's heuristic)"),
        t => eprintln!("tuned decode table: {t}"),
    }
    let s = dev.context().default_stream();
    let mut timer = match Timer::new(&dev, s.clone(), a.warmup, a.reps) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    eprint!("measuring the copy ceiling ...");
    let copy_gbs = match timer.copy_gbs() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("\nerror: copy ceiling: {e}");
            return 1;
        }
    };
    eprintln!(" {copy_gbs:.0} GB/s");
    let mut results = Vec::new();
    let mut failed = Vec::new();
    let mut same_bytes: std::collections::HashMap<u64, SameBytesCopy> = std::collections::HashMap::new();
    let n = selected.len();
    let tty = std::io::stderr().is_terminal();
    for (i, row) in selected.into_iter().enumerate() {
        // a terminal gets one progress line rewritten in place, a log one line per row
        if tty {
            eprint!("\r\x1b[2K[{:>2}/{n}] {}", i + 1, row.name());
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("[{:>2}/{n}] {}", i + 1, row.name());
        }
        let measured = measure_us(&dev, &mut timer, &row);
        match measured {
            Ok(us) => {
                let (bytes, flops) = row.work();
                let m = Measurement { us, bytes, flops };
                // a data-path row's fair ceiling: a copy of its bytes in this run (once a size)
                let same = if row.is_data_path() {
                    let key = bytes.to_bits();
                    match same_bytes.get(&key) {
                        Some(c) => Some(*c),
                        None => match timer.same_bytes_copy(bytes) {
                            Ok(c) => {
                                same_bytes.insert(key, c);
                                Some(c)
                            }
                            Err(e) => {
                                eprintln!("\n{}: same-bytes copy: {e}", row.name());
                                failed.push(format!("{} (same-bytes copy)", row.name()));
                                None
                            }
                        },
                    }
                } else {
                    None
                };
                let ratio = row.target.ratio_with(&m, copy_gbs, same.map(|c| c.us()));
                results.push(Result_ { row, m, ratio, same });
            }
            Err(e) => {
                eprintln!("\n{}: {e}", row.name());
                failed.push(row.name());
            }
        }
    }
    if tty {
        eprint!("\r\x1b[2K");
    }
    eprintln!("{} rows measured", results.len());
    let json = to_json(&dev, &results, copy_gbs, &failed, &tune_table);
    if a.json {
        println!("{json}");
    } else {
        print_table(&results, copy_gbs);
        let steps: Vec<(&BenchRow, f64)> = results.iter().map(|r| (&r.row, r.m.us)).collect();
        if steps.iter().any(|(r, _)| r.family == "dcp_step") {
            print!("{}", step_summary(&steps));
        }
    }
    if let Some(path) = &a.json_out {
        if let Err(e) = std::fs::write(path, &json) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return 1;
        }
    }
    if let Some(path) = &a.csv {
        if let Err(e) = std::fs::write(path, to_csv(&results, copy_gbs)) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return 1;
        }
    }
    if failed.is_empty() {
        0
    } else {
        eprintln!("{} rows failed: {}", failed.len(), failed.join(", "));
        1
    }
}

fn print_table(results: &[Result_], copy_gbs: f64) {
    println!("copy ceiling: {copy_gbs:.0} GB/s (2 GiB device-to-device, read + write); same-bytes: a device copy of the row's own bytes in this run (the faster of a copy kernel and cudaMemcpyAsync) over the row's µs");
    println!(
        "{:<52} {:>10} {:>9} {:>9} {:>8} {:>10} {:>7}  target",
        "row", "µs", "GB/s", "TFLOP/s", "of copy", "same-bytes", "ratio"
    );
    for r in results {
        println!(
            "{:<52} {:>10.2} {:>9.0} {:>9.1} {:>7.1}% {:>10} {:>7}  {}",
            r.row.name(),
            r.m.us,
            r.m.gbs(),
            r.m.tflops(),
            100.0 * r.m.gbs() / copy_gbs,
            r.of_same_bytes().map_or("-".into(), |x| format!("{x:.2}")),
            r.ratio.map_or("-".into(), |x| format!("{x:.2}")),
            r.row.target.describe()
        );
    }
    let met = results.iter().filter(|r| r.ratio.is_some_and(|x| x >= 1.0)).count();
    let with = results.iter().filter(|r| r.ratio.is_some()).count();
    println!("{met} of {with} targets met (ratio ≥ 1)");
}

/// The tuned decode table in force for `dev` (null: none, the launcher's heuristic), as the JSON
/// output records it.
fn tune_table_json(dev: &Device) -> serde_json::Value {
    match dcp_mla::planner::tune::active_table(dev) {
        Ok(None) => serde_json::Value::Null,
        Ok(Some(t)) => serde_json::json!({
            "card": t.card.name, "commit": t.commit, "date": t.date, "rows": t.rows.len()
        }),
        Err(e) => serde_json::json!({ "refused": e.to_string() }),
    }
}

fn to_json(
    dev: &Device,
    results: &[Result_],
    copy_gbs: f64,
    failed: &[String],
    tune_table: &serde_json::Value,
) -> String {
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.row.name(),
                "family": r.row.family,
                "shape": r.row.shape,
                "us": r.m.us,
                "bytes": r.m.bytes,
                "flops": r.m.flops,
                "gbs": r.m.gbs(),
                "tflops": r.m.tflops(),
                "of_copy": r.m.gbs() / copy_gbs,
                "target": r.row.target.describe(),
                "ratio": r.ratio,
                "met": r.ratio.map(|x| x >= 1.0),
                "copy_same_bytes_us": r.same.map(|c| c.us()),
                "copy_same_bytes_kernel_us": r.same.map(|c| c.kernel_us),
                "copy_same_bytes_memcpy_us": r.same.map(|c| c.memcpy_us),
                "of_copy_same_bytes": r.of_same_bytes(),
            })
        })
        .collect();
    let v = serde_json::json!({
        "compute_capability": format!("{:?}", dev.compute_capability()),
        "copy_gbs": copy_gbs,
        "rows": rows,
        "failed": failed,
        "tune_table": tune_table,
    });
    serde_json::to_string_pretty(&v).expect("json")
}

fn to_csv(results: &[Result_], copy_gbs: f64) -> String {
    let mut s =
        String::from("name,family,shape,us,gbs,tflops,of_copy,target,ratio,copy_same_bytes_us,of_copy_same_bytes\n");
    for r in results {
        s += &format!(
            "\"{}\",{},\"{}\",{:.3},{:.1},{:.2},{:.4},\"{}\",{},{},{}\n",
            r.row.name(),
            r.row.family,
            r.row.shape,
            r.m.us,
            r.m.gbs(),
            r.m.tflops(),
            r.m.gbs() / copy_gbs,
            r.row.target.describe(),
            r.ratio.map_or(String::new(), |x| format!("{x:.3}")),
            r.same.map_or(String::new(), |c| format!("{:.3}", c.us())),
            r.of_same_bytes().map_or(String::new(), |x| format!("{x:.4}"))
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::filter_keeps;
    use dcp_mla_cli::bench::rows;

    #[test]
    fn a_filter_keeps_rows_containing_any_of_its_comma_separated_texts() {
        let name = "mla_decode_engine dense b128 q1 H64 8K";
        assert!(filter_keeps("mla_decode_engine", name));
        assert!(filter_keeps("kv_fill,mla_decode_engine", name));
        assert!(filter_keeps(" kv_fill , b128 q1 ", name));
        assert!(!filter_keeps("kv_fill,topk", name));
        // empty texts are ignored, not "matches everything"
        assert!(!filter_keeps("kv_fill,", name));
        assert!(filter_keeps("", name) && filter_keeps(" , ", name));
        // the split is unambiguous: no row's name has a comma
        for r in rows() {
            assert!(!r.name().contains(','), "{}", r.name());
        }
    }
}
