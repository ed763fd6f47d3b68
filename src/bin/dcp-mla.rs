//! `dcp-mla`: the library at a terminal. `demo` runs one DCP decode step end to end and checks it
//! against full attention; `plan` sizes KV capacity and workspaces with the planner; `bench`
//! times every kernel family at the docs/performance.md shapes; `tune` measures the tuned decode
//! table; `kernels` lists the compiled variants.

#[path = "dcp-mla/bench_cmd.rs"]
mod bench_cmd;
#[path = "dcp-mla/demo.rs"]
mod demo;
#[path = "dcp-mla/demo_gpu.rs"]
mod demo_gpu;
#[path = "dcp-mla/kernels.rs"]
mod kernels;
#[path = "dcp-mla/plan.rs"]
mod plan;
#[path = "dcp-mla/problem.rs"]
mod problem;
#[path = "dcp-mla/tune_cmd.rs"]
mod tune_cmd;

use clap::{Parser, Subcommand};

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
    /// The compiled kernel variants with their ptxas registers, shared memory, stack and spills.
    Kernels {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let cli = Cli::parse();
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
