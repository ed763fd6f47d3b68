//! `dcp-mla-codegen check [KERNELS_DIR]`: checks the kernel DSL and lists every variant.
//! `dcp-mla-codegen build KERNELS_DIR OUT_DIR`: runs the whole generator and prints its report.

use dcp_mla_codegen::{build, check_dsl, nvcc, BuildConfig};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let kernels = args.get(1).map(PathBuf::from).unwrap_or_else(|| repo.join("kernels-src"));
    let result = match args.first().map(String::as_str) {
        Some("check") => check_dsl(&kernels).map(|(_, fams)| {
            for f in fams {
                for v in &f.variants {
                    println!("{}", v.describe(&f.spec.name));
                }
            }
        }),
        Some("build") if args.len() == 3 => nvcc::find_nvcc(&repo).and_then(|nvcc| {
            let out = PathBuf::from(&args[2]);
            let cfg = BuildConfig {
                kernels_dir: kernels,
                cache_dir: out.join("cache"),
                out_dir: out,
                nvcc,
                jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
            };
            build(&cfg).map(|r| println!("{r:#?}"))
        }),
        _ => Err("usage: dcp-mla-codegen check [KERNELS_DIR] | build KERNELS_DIR OUT_DIR".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
