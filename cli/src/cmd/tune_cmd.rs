//! `dcp-mla tune`: measures every decode variant × split count over the shape classes of
//! `dcp_mla_cli::bench::tune::tune_plan` on this GPU and writes the tuned table
//! (`dcp_mla::planner::tune`) the decode launcher's `Auto` choice reads. `--dry-run` prints the
//! plan and its estimated time without a GPU.

use super::plan::{count, launches};
use dcp_mla::planner::tune::{set_tune_table, CardId, TuneCard, TuneTable, TUNE_TABLE_ENV};
use dcp_mla::runtime::Device;
use dcp_mla_cli::bench::tune::{
    estimate_s, measure_plan, tune_plan, Measured, TunePlan, H100_MODEL, TUNE_BUDGET_S, WIN_MARGIN,
};
use dcp_mla_cli::bench::Timer;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct TuneArgs {
    /// Print the plan of runs and its estimated time, measure nothing (no GPU needed).
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON on stdout: the plan (with `--dry-run`) or the measured table (what the file
    /// holds); the human report goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// Where to write the table (default: tuning/<card>.json, the card's name in lower case).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Only the classes whose label or source row contains this text (an error if none does).
    #[arg(long)]
    pub filter: Option<String>,
    /// SMs to plan for without a GPU (a dry run; with a GPU its own count is used).
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 132)]
    pub sms: usize,
    /// Untimed launches before each run is measured (as `dcp-mla bench`), at most 1,000,000.
    #[arg(long, value_parser = launches(0), allow_negative_numbers = true, default_value_t = 5)]
    pub warmup: usize,
    /// Timed launches per run, the median kept (as `dcp-mla bench`), 1 to 1,000,000.
    #[arg(long, value_parser = launches(1), allow_negative_numbers = true, default_value_t = 30)]
    pub reps: usize,
    /// The commit the table is measured on (default: `git rev-parse --short HEAD`).
    #[arg(long)]
    pub commit: Option<String>,
}

/// Exit code: 0 done, 1 an error (or a run failed), 2 without a GPU (not a dry run).
pub fn run(a: &TuneArgs) -> i32 {
    let dev = Device::open(0);
    if a.dry_run {
        let sms = dev.as_ref().ok().map(|d| d.num_sms()).unwrap_or(a.sms);
        return match dry_run(a, sms) {
            Ok(v) if a.json => {
                println!("{}", serde_json::to_string_pretty(&v).expect("json"));
                0
            }
            Ok(v) => {
                let _ = print_plan(&v, &mut std::io::stdout().lock());
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

/// The plan for `sms` SMs, or a message: the grid's error, or a `--filter` that keeps no class.
fn plan_of(a: &TuneArgs, sms: usize) -> Result<TunePlan, String> {
    let plan = tune_plan(sms, a.filter.as_deref()).map_err(|e| e.to_string())?;
    if plan.classes.is_empty() {
        return Err(format!(
            "--filter `{}` matches no class of the tuning grid (`dcp-mla tune --dry-run` lists them)",
            a.filter.as_deref().unwrap_or("")
        ));
    }
    Ok(plan)
}

/// The dry run on a card of `sms` SMs: the plan and its estimate as JSON (the human report is
/// printed from the same value), or a message naming the offending option.
pub fn dry_run(a: &TuneArgs, sms: usize) -> Result<Value, String> {
    plan_of(a, sms).map(|p| plan_json(&p, a))
}

/// The plan as JSON: each class (its table fields, label and source row), its runs' variants and
/// split counts, and the model's estimate of each class and of the whole.
fn plan_json(plan: &TunePlan, a: &TuneArgs) -> Value {
    let classes: Vec<Value> = plan
        .classes
        .iter()
        .map(|c| {
            let one = TunePlan { num_sms: plan.num_sms, classes: vec![c.clone()] };
            let s = estimate_s(&one, a.warmup, a.reps, &H100_MODEL) - H100_MODEL.startup_s;
            let mut variants: Vec<&str> = Vec::new();
            for r in &c.runs {
                if !variants.contains(&r.variant.as_str()) {
                    variants.push(&r.variant);
                }
            }
            let mut splits: Vec<usize> = c.runs.iter().map(|r| r.num_splits).collect();
            splits.sort_unstable();
            splits.dedup();
            let k = &c.class;
            json!({
                "label": k.label(),
                "class": k.to_json(),
                "source": c.source,
                "runs": c.runs.len(),
                "variants": variants,
                "splits": splits,
                "estimated_s": s,
            })
        })
        .collect();
    let runs: usize = plan.classes.iter().map(|c| c.runs.len()).sum();
    let total = estimate_s(plan, a.warmup, a.reps, &H100_MODEL);
    json!({
        "num_sms": plan.num_sms,
        "warmup": a.warmup,
        "reps": a.reps,
        "filter": a.filter,
        "classes": classes,
        "runs": runs,
        "estimated_s": total,
        "budget_s": TUNE_BUDGET_S,
        "over_budget": total > TUNE_BUDGET_S,
        "model": "bench::tune::H100_MODEL",
        "mma_factor": H100_MODEL.mma_factor,
    })
}

/// Prints the plan of [`plan_json`] as a table to `w`.
fn print_plan(v: &Value, w: &mut dyn Write) -> std::io::Result<()> {
    let u = |x: &Value| x.as_u64().unwrap_or(0);
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    writeln!(
        w,
        "dcp-mla tune: plan for {} SMs, {} warm-up + {} timed launches a run",
        u(&v["num_sms"]),
        u(&v["warmup"]),
        u(&v["reps"])
    )?;
    writeln!(w, "{:<52} {:>5} {:>8}  source", "class", "runs", "est. s")?;
    let classes = v["classes"].as_array().map_or(&[][..], |c| c.as_slice());
    for c in classes {
        let list = |k: &str| -> Vec<String> {
            c[k].as_array().map_or(Vec::new(), |x| {
                x.iter().map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string)).collect()
            })
        };
        writeln!(
            w,
            "{:<52} {:>5} {:>8.1}  {}",
            c["label"].as_str().unwrap_or(""),
            u(&c["runs"]),
            f(&c["estimated_s"]),
            c["source"].as_str().unwrap_or("")
        )?;
        writeln!(w, "{:<52} variants {}; splits [{}]", "", list("variants").join(", "), list("splits").join(", "))?;
    }
    let total = f(&v["estimated_s"]);
    let budget = f(&v["budget_s"]);
    writeln!(
        w,
        "{} classes, {} runs (+ the heuristic's a class); estimated {:.0} s on an H100 ({:.1} min; budget {:.0} min)",
        classes.len(),
        u(&v["runs"]),
        total,
        total / 60.0,
        budget / 60.0
    )?;
    writeln!(
        w,
        "the time is an estimate from a roofline model of docs/performance.md's H100 figures \
         (bench::tune::H100_MODEL, mma.sync assumed {}× slower than wgmma), not a measurement",
        f(&v["mma_factor"])
    )?;
    if v["over_budget"].as_bool() == Some(true) {
        writeln!(w, "warning: over the budget; pass --filter or fewer --reps")?;
    }
    Ok(())
}

fn tune(dev: &Device, a: &TuneArgs) -> Result<i32, String> {
    let e = |e: dcp_mla::Error| e.to_string();
    // with --json, stdout holds the table alone and the report goes to stderr
    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
    let w: &mut dyn Write = if a.json { &mut stderr } else { &mut stdout };
    // the baseline is the launcher's heuristic: no tuned table (whatever DCP_MLA_TUNE_TABLE or
    // the build's embedded table say), and no DCP_MLA_DECODE_PATH override
    set_tune_table(None);
    if std::env::var_os("DCP_MLA_DECODE_PATH").is_some_and(|v| !v.is_empty()) {
        eprintln!("warning: DCP_MLA_DECODE_PATH is set: the heuristic baseline runs the kernel it names");
    }
    let card = card_of(dev).map_err(e)?;
    let plan = plan_of(a, card.sm_count as usize)?;
    let _ = print_plan(&plan_json(&plan, a), w);
    let mut timer = Timer::new(dev, dev.context().default_stream(), a.warmup, a.reps).map_err(e)?;
    let started = std::time::Instant::now();
    let n = plan.classes.len();
    let measured = measure_plan(dev, &mut timer, &plan, &mut |i, c| {
        eprintln!("[{:>2}/{n}] {:<52} ({:.0} s)", i + 1, c.class.label(), started.elapsed().as_secs_f64());
    })
    .map_err(e)?;
    let _ = print_results(&measured, w);
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
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let text = table.to_json();
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if a.json {
        print!("{text}");
    }
    let _ = writeln!(
        w,
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

fn print_results(measured: &[Measured], w: &mut dyn Write) -> std::io::Result<()> {
    writeln!(w, "{:<44} {:>16} {:>28} {:>16} {:>13}", "class", "heuristic µs", "row (variant, splits)", "µs", "gain")?;
    writeln!(w, "{:<44} {:>16} {:>28} {:>16} {:>13}", "", "equal / ragged", "", "equal / ragged", "equal/ragged")?;
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
                writeln!(
                    w,
                    "{:<44} {:>16} {:>28} {:>16} {:>13}",
                    m.class.label(),
                    heur,
                    format!("{} P={}", b.variant, b.num_splits),
                    pair(b.us, b.ragged_us),
                    g
                )?;
            }
            None => writeln!(w, "{:<44} {:>16} {:>28}", m.class.label(), heur, "every run failed")?,
        }
        for (r, t) in &m.runs {
            if let Err(e) = t {
                writeln!(w, "    {} P={} failed: {e}", r.variant, r.num_splits)?;
            }
        }
    }
    Ok(())
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
    use crate::plan::tests::{any_number, parse_like_the_binary};
    use proptest::prelude::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// `dcp-mla tune --dry-run ARGS` as the binary parses it (with `--sms` for the card, as
    /// without a GPU): Ok(the plan or its error message), or Err (clap's message) when the
    /// command line does not parse.
    fn dry(args: &[String]) -> Result<Result<Value, String>, String> {
        let args: Vec<String> = std::iter::once("--dry-run".to_string()).chain(args.iter().cloned()).collect();
        let a: TuneArgs = parse_like_the_binary("tune", &args)?;
        Ok(dry_run(&a, a.sms))
    }

    fn s(a: &[&str]) -> Vec<String> {
        a.iter().map(|x| x.to_string()).collect()
    }

    /// Filters: some that keep classes, some that keep none.
    fn any_filter() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("dense".to_string()),
            Just("sparse fp8 b128 q2 H128".to_string()),
            Just("mla_decode_engine".to_string()),
            Just("q=6".to_string()),
            Just(String::new()),
            "[a-z0-9 =]{0,12}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Every numeric option of `tune` with any integer, and any filter: clap refuses it
        /// naming the option, or the dry run returns a plan with a finite estimate or a message
        /// naming the filter. No panic, the table printed from the plan included.
        #[test]
        fn tune_takes_any_integer_without_a_panic(
            values in proptest::collection::vec(any_number(), 3),
            pick in proptest::collection::vec(any::<bool>(), 4),
            filter in any_filter(),
        ) {
            let options = ["--sms", "--warmup", "--reps"];
            let mut args = Vec::new();
            for ((o, v), &on) in options.iter().zip(&values).zip(&pick) {
                if on {
                    args.push(format!("{o}={v}"));
                }
            }
            if pick[3] {
                args.push(format!("--filter={filter}"));
            }
            match dry(&args) {
                Err(e) => prop_assert!(options.iter().any(|o| e.contains(o)), "{args:?}: {e}"),
                Ok(Err(e)) => prop_assert!(pick[3] && e.contains("--filter") && e.contains(&filter), "{args:?}: {e}"),
                Ok(Ok(v)) => {
                    let classes = v["classes"].as_array().unwrap();
                    prop_assert!(!classes.is_empty());
                    let total = v["estimated_s"].as_f64().unwrap();
                    prop_assert!(total.is_finite() && total > 0.0, "{total}");
                    for c in classes {
                        let est = c["estimated_s"].as_f64().unwrap();
                        prop_assert!(est.is_finite() && est >= 0.0 && est <= total, "{est} of {total}");
                        prop_assert!(c["runs"].as_u64().unwrap() >= 1);
                    }
                    let mut text = Vec::new();
                    print_plan(&v, &mut text).unwrap();
                    prop_assert!(String::from_utf8(text).unwrap().contains("estimated"));
                }
            }
        }
    }

    #[test]
    fn tune_refuses_bad_counts_and_empty_filters_by_name() {
        for (args, needle) in [
            (s(&["--reps", "0"]), "--reps"),
            (s(&["--reps", "18446744073709551615"]), "--reps"),
            (s(&["--reps", "1000001"]), "--reps"),
            (s(&["--warmup", "18446744073709551615"]), "--warmup"),
            (s(&["--warmup", "-1"]), "--warmup"),
            (s(&["--sms", "0"]), "--sms"),
            (s(&["--sms", "-132"]), "--sms"),
        ] {
            let e = dry(&args).unwrap_err();
            assert!(e.contains(needle), "{args:?}: `{needle}` in {e}");
        }
        let e = dry(&s(&["--filter", "no such class"])).unwrap().unwrap_err();
        assert!(e.contains("--filter `no such class` matches no class"), "{e}");
        // the bounds themselves plan, and the estimate stays finite
        let v = dry(&s(&["--reps", "1000000", "--warmup", "1000000", "--sms", "1"])).unwrap().unwrap();
        assert!(v["estimated_s"].as_f64().unwrap().is_finite() && v["over_budget"] == true);
        let v = dry(&s(&["--reps", "1", "--warmup", "0", "--filter", "dense b128 q1 H64 8K"])).unwrap().unwrap();
        assert_eq!((v["reps"].as_u64(), v["warmup"].as_u64()), (Some(1), Some(0)));
        assert!(v["classes"][0]["splits"].as_array().is_some_and(|x| !x.is_empty()));
        assert_eq!(v["classes"][0]["class"]["kv"], "bf16");
    }

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
