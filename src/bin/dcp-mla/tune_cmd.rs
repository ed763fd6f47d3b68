//! `dcp-mla tune`: measures every decode variant × split count over the shape classes of
//! `dcp_mla::bench::tune::tune_plan` on this GPU and writes the tuned table
//! (`dcp_mla::planner::tune`) the decode launcher's `Auto` choice reads. `--dry-run` prints the
//! plan and its estimated time without a GPU.

use dcp_mla::bench::tune::{
    estimate_s, measure_plan, tune_plan, Measured, TunePlan, H100_MODEL, TUNE_BUDGET_S, WIN_MARGIN,
};
use dcp_mla::bench::Timer;
use dcp_mla::planner::tune::{set_tune_table, CardId, TuneCard, TuneTable, TUNE_TABLE_ENV};
use dcp_mla::runtime::Device;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct TuneArgs {
    /// Print the plan of runs and its estimated time, measure nothing (no GPU needed).
    #[arg(long)]
    pub dry_run: bool,
    /// Where to write the table (default: tuning/<card>.json, the card's name in lower case).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Only the classes whose label or source row contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// SMs to plan for without a GPU (a dry run; with a GPU its own count is used).
    #[arg(long, default_value_t = 132)]
    pub sms: usize,
    /// Untimed launches before each run is measured (as `dcp-mla bench`).
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Timed launches per run, the median kept (as `dcp-mla bench`).
    #[arg(long, default_value_t = 30)]
    pub reps: usize,
    /// The commit the table is measured on (default: `git rev-parse --short HEAD`).
    #[arg(long)]
    pub commit: Option<String>,
}

/// Exit code: 0 done, 1 an error (or a run failed), 2 without a GPU (not a dry run).
pub fn run(a: &TuneArgs) -> i32 {
    let dev = Device::open(0);
    if a.dry_run {
        let sms = dev.as_ref().ok().and_then(|d| d.num_sms().ok()).unwrap_or(a.sms);
        return match tune_plan(sms, a.filter.as_deref()) {
            Ok(plan) => {
                print_plan(&plan, a);
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        };
    }
    let dev = match dev {
        Ok(d) => d,
        Err(e) => {
            eprintln!("dcp-mla tune needs a CUDA GPU ({e}); `--dry-run` prints the plan without one");
            return 2;
        }
    };
    match tune(&dev, a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn print_plan(plan: &TunePlan, a: &TuneArgs) {
    println!("dcp-mla tune: plan for {} SMs, {} warm-up + {} timed launches a run", plan.num_sms, a.warmup, a.reps);
    println!("{:<52} {:>5} {:>8}  source", "class", "runs", "est. s");
    let mut runs = 0;
    for c in &plan.classes {
        let one = TunePlan { num_sms: plan.num_sms, classes: vec![c.clone()] };
        let s = estimate_s(&one, a.warmup, a.reps, &H100_MODEL) - H100_MODEL.startup_s;
        let variants: Vec<&str> = c.runs.iter().map(|r| r.variant.as_str()).fold(Vec::new(), |mut v, x| {
            if !v.contains(&x) {
                v.push(x);
            }
            v
        });
        let mut splits: Vec<usize> = c.runs.iter().map(|r| r.num_splits).collect();
        splits.sort_unstable();
        splits.dedup();
        println!("{:<52} {:>5} {:>8.1}  {}", c.class.label(), c.runs.len(), s, c.source);
        println!("{:<52} variants {}; splits {:?}", "", variants.join(", "), splits);
        runs += c.runs.len();
    }
    let total = estimate_s(plan, a.warmup, a.reps, &H100_MODEL);
    println!(
        "{} classes, {runs} runs (+ the heuristic's a class); estimated {:.0} s on an H100 ({:.1} min; budget {:.0} min)",
        plan.classes.len(),
        total,
        total / 60.0,
        TUNE_BUDGET_S / 60.0
    );
    println!(
        "the time is an estimate from a roofline model of docs/performance.md's H100 figures \
         (bench::tune::H100_MODEL, mma.sync assumed {}× slower than wgmma), not a measurement",
        H100_MODEL.mma_factor
    );
    if total > TUNE_BUDGET_S {
        println!("warning: over the budget; pass --filter or fewer --reps");
    }
}

fn tune(dev: &Device, a: &TuneArgs) -> dcp_mla::Result<i32> {
    // the baseline is the launcher's heuristic: no tuned table (whatever DCP_MLA_TUNE_TABLE or
    // the build's embedded table say), and no DCP_MLA_DECODE_PATH override
    set_tune_table(None);
    if std::env::var_os("DCP_MLA_DECODE_PATH").is_some_and(|v| !v.is_empty()) {
        eprintln!("warning: DCP_MLA_DECODE_PATH is set: the heuristic baseline runs the kernel it names");
    }
    let card = card_of(dev)?;
    let plan = tune_plan(card.sm_count as usize, a.filter.as_deref())?;
    print_plan(&plan, a);
    let mut timer = Timer::new(dev, dev.context().default_stream(), a.warmup, a.reps)?;
    let started = std::time::Instant::now();
    let n = plan.classes.len();
    let measured = measure_plan(dev, &mut timer, &plan, &mut |i, c| {
        eprintln!("[{:>2}/{n}] {:<52} ({:.0} s)", i + 1, c.class.label(), started.elapsed().as_secs_f64());
    })?;
    print_results(&measured);
    let failed: usize = measured.iter().map(|m| m.runs.iter().filter(|(_, t)| t.is_err()).count()).sum();
    let table = TuneTable {
        card,
        commit: a.commit.clone().unwrap_or_else(git_commit),
        date: utc_date(std::time::SystemTime::now()),
        method: format!(
            "dcp-mla tune: each (variant, num_splits) timed as dcp-mla bench times a flushed row (L2 evicted before \
             each launch), median of {} after {} warm-ups, split schedule reused; dense classes on equal and on \
             ragged lengths (uniform in [L/8, L]); a run replaces the heuristic only if it is {}% faster on both; \
             {:.0} s",
            a.reps,
            a.warmup,
            WIN_MARGIN * 100.0,
            started.elapsed().as_secs_f64()
        ),
        rows: measured.iter().filter_map(Measured::best).collect(),
    };
    let path = a.out.clone().unwrap_or_else(|| PathBuf::from(format!("tuning/{}.json", card_slug(&table.card.name))));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| dcp_mla::Error::InvalidConfig(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(&path, table.to_json())
        .map_err(|e| dcp_mla::Error::InvalidConfig(format!("cannot write {}: {e}", path.display())))?;
    println!(
        "wrote {} ({} rows); use it with {TUNE_TABLE_ENV}={} or commit it (docs/performance.md, \"Tuned decode table\")",
        path.display(),
        table.rows.len(),
        path.display()
    );
    if failed > 0 {
        eprintln!("{failed} runs failed (listed above)");
        return Ok(1);
    }
    Ok(0)
}

/// The card's identity and clocks, as a table's header records them.
fn card_of(dev: &Device) -> dcp_mla::Result<TuneCard> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let CardId { name, sm_count } = CardId::of(dev)?;
    let mhz = |attr| dev.context().attribute(attr).map(|khz| (khz / 1000) as u32).unwrap_or(0);
    Ok(TuneCard {
        name,
        sm_count,
        sm_clock_mhz: mhz(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        mem_clock_mhz: mhz(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
    })
}

fn print_results(measured: &[Measured]) {
    println!("{:<44} {:>16} {:>28} {:>16} {:>13}", "class", "heuristic µs", "row (variant, splits)", "µs", "gain");
    println!("{:<44} {:>16} {:>28} {:>16} {:>13}", "", "equal / ragged", "", "equal / ragged", "equal/ragged");
    let pair = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
        (Some(a), None) => format!("{a:.1}"),
        _ => "-".into(),
    };
    for m in measured {
        let heur = m.heuristic.as_ref().map_or("failed".to_string(), |t| pair(Some(t.equal), t.ragged));
        match m.best() {
            Some(b) => {
                let gain = |h: Option<f64>, t: Option<f64>| h.zip(t).map(|(h, t)| h / t);
                let g = match (gain(b.heuristic_us, b.us), gain(b.heuristic_ragged_us, b.ragged_us)) {
                    (Some(e), Some(r)) => format!("{e:.3}/{r:.3}"),
                    (Some(e), None) => format!("{e:.3}"),
                    _ => "-".into(),
                };
                println!(
                    "{:<44} {:>16} {:>28} {:>16} {:>13}",
                    m.class.label(),
                    heur,
                    format!("{} P={}", b.variant, b.num_splits),
                    pair(b.us, b.ragged_us),
                    g
                );
            }
            None => println!("{:<52} {:>12} {:>28}", m.class.label(), heur, "every run failed"),
        }
        for (r, t) in &m.runs {
            if let Err(e) = t {
                println!("    {} P={} failed: {e}", r.variant, r.num_splits);
            }
        }
    }
}

/// `NVIDIA H100 80GB HBM3` → `nvidia-h100-80gb-hbm3`.
fn card_slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.is_empty() && !s.ends_with('-') {
            s.push('-');
        }
    }
    s.trim_end_matches('-').to_string()
}

/// `git rev-parse --short HEAD` in the working directory, or `unknown`.
fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// `YYYY-MM-DD` (UTC) of `t`.
fn utc_date(t: std::time::SystemTime) -> String {
    let days = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    // the civil date of a day count (Howard Hinnant's days_from_civil, inverted)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn dates_and_slugs() {
        assert_eq!(utc_date(UNIX_EPOCH), "1970-01-01");
        // 2026-12-05 13:21 UTC
        assert_eq!(utc_date(UNIX_EPOCH + Duration::from_secs(1_796_476_860)), "2026-12-05");
        assert_eq!(utc_date(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29");
        assert_eq!(card_slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(card_slug("NVIDIA H200"), "nvidia-h200");
    }
}
