//! `dcp-mla`: the library at a terminal. `demo` runs one DCP decode step end to end and checks it
//! against full attention; `plan` sizes KV capacity and workspaces with the planner; `bench`
//! times every kernel family at the docs/performance.md shapes; `tune` measures the tuned decode
//! table; `kernels` lists the compiled variants.

mod cmd;

use clap::{Parser, Subcommand};
use cmd::{bench_cmd, demo, kernels, plan, tune_cmd};

#[derive(Debug, Parser)]
#[command(name = "dcp-mla", version, about = "CUDA kernels for decode context parallelism (DCP) with MLA")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One DCP decode step end to end (dense BF16 and sparse with distributed top-k), D ranks
    /// simulated on one GPU, or on the CPU reference without one; checked against full attention
    /// in fp64. Exits 1 if the check fails.
    Demo(demo::DemoArgs),
    /// KV token slots with and without DCP, per-rank workspaces for the largest batch, and the
    /// smallest D that fits a context. Exits 1 on a configuration the planner rejects.
    Plan(plan::PlanArgs),
    /// Every kernel family at the docs/performance.md shapes, timed with CUDA events after warm-up, against
    /// the same run's copy bandwidth and each row's target. Exits 2 without a GPU.
    Bench(bench_cmd::BenchArgs),
    /// Measures every decode variant × split count over the tuning grid's shape classes on this
    /// GPU and writes the tuned table the decode launcher's Auto choice reads. `--dry-run` prints
    /// the plan and its estimated time without a GPU. Exits 2 without a GPU (not a dry run).
    Tune(tune_cmd::TuneArgs),
    /// The compiled kernel variants with their ptxas registers, static and dynamic shared memory,
    /// stack and spills.
    Kernels {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Spellings of earlier releases, still accepted for one release with a warning on stderr:
/// (subcommand or "" for all, old option, new option).
const DEPRECATED_OPTIONS: [(&str, &str, &str); 4] = [
    ("", "--dcp", "--dcp-size"),
    ("", "--q", "--num-q"),
    ("plan", "--max-batch", "--batch"),
    // bench's `--json FILE` (an option with a value) is `--json-out FILE`; `--json` alone prints
    // JSON to stdout, as on plan and kernels
    ("bench", "--json", "--json-out"),
];

/// Rewrites the deprecated spellings of `args` (the command line after the program name) into
/// the current ones, with a warning on stderr for each: the options of [`DEPRECATED_OPTIONS`] and
/// the KV format `fp8` (now `fp8_656`, the name Python, C and the JSON use).
pub fn modernize_args(args: Vec<String>) -> (Vec<String>, Vec<String>) {
    let sub = args.iter().find(|a| !a.starts_with('-')).cloned().unwrap_or_default();
    let mut out = Vec::with_capacity(args.len());
    let mut warnings = Vec::new();
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        if a == "--" {
            out.push(a);
            out.extend(it.by_ref());
            break;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut name = name;
        if let Some(&(_, old, new)) =
            DEPRECATED_OPTIONS.iter().find(|(cmd, old, _)| (cmd.is_empty() || *cmd == sub) && name == *old)
        {
            // bench --json alone (no value follows) is the new flag, not the old option
            let takes_value = inline.is_some() || it.peek().is_some_and(|v| !v.starts_with('-'));
            if old != "--json" || takes_value {
                warnings.push(format!("`{old}` is deprecated and will be removed after the next release: use `{new}`"));
                name = new.to_string();
            }
        }
        if name == "--kv-format" {
            let value = match inline {
                Some(v) => Some(v),
                None => it.next(),
            };
            out.push(name);
            if let Some(mut v) = value {
                if v.eq_ignore_ascii_case("fp8") {
                    warnings.push(
                        "`--kv-format fp8` is deprecated and will be removed after the next release: use `--kv-format fp8_656`"
                            .into(),
                    );
                    v = "fp8_656".into();
                }
                out.push(v);
            }
            continue;
        }
        match inline {
            Some(v) => out.push(format!("{name}={v}")),
            None => out.push(name),
        }
    }
    (out, warnings)
}

fn main() {
    // Writing to a closed pipe (`dcp-mla plan | head -c1`) ends the process quietly, as it does
    // any Unix tool, instead of panicking inside println!.
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let mut args = std::env::args_os();
    let program = args.next().unwrap_or_else(|| "dcp-mla".into());
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let (args, warnings) = modernize_args(args);
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let cli = Cli::parse_from(std::iter::once(program.to_string_lossy().into_owned()).chain(args));
    let code = match cli.command {
        Command::Demo(a) => demo::run(&a),
        Command::Plan(a) => match plan::plan(&a) {
            Ok(v) if a.json => {
                println!("{}", serde_json::to_string_pretty(&v).expect("json"));
                0
            }
            Ok(v) => {
                plan::print(&v);
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
        Command::Bench(a) => bench_cmd::run(&a),
        Command::Tune(a) => tune_cmd::run(&a),
        Command::Kernels { json } => {
            kernels::run(json);
            0
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::modernize_args;

    fn m(args: &[&str]) -> (Vec<String>, usize) {
        let (a, w) = modernize_args(args.iter().map(|s| s.to_string()).collect());
        (a, w.len())
    }

    #[test]
    fn old_spellings_map_to_new_ones_with_a_warning() {
        let (a, w) = m(&["plan", "--dcp", "2", "--q=3", "--max-batch", "8", "--kv-format", "fp8"]);
        assert_eq!(a, ["plan", "--dcp-size", "2", "--num-q=3", "--batch", "8", "--kv-format", "fp8_656"]);
        assert_eq!(w, 4);
        let (a, w) = m(&["demo", "--kv-format=fp8", "--max-batch", "8"]);
        assert_eq!(a, ["demo", "--kv-format", "fp8_656", "--max-batch", "8"], "max-batch is plan's only");
        assert_eq!(w, 1);
        assert_eq!(
            m(&["bench", "--json", "out.json"]),
            (vec!["bench".into(), "--json-out".into(), "out.json".into()], 1)
        );
        assert_eq!(m(&["bench", "--json", "--filter", "x"]).1, 0, "bench --json alone is the flag");
        assert_eq!(m(&["plan", "--json"]).1, 0);
        let (a, w) = m(&["plan", "--dcp-size", "4", "--kv-format", "fp8_656", "--batch", "2"]);
        assert_eq!((a.len(), w), (7, 0));
    }
}
