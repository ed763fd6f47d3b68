//! Runs the kernel code generator (codegen/) and compiles the ABI layout probe.

use dcp_mla_codegen::{build, nvcc, BuildConfig};
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let kernels = root.join("kernels-src");
    println!("cargo:rerun-if-changed=kernels-src");
    println!("cargo:rerun-if-changed={}", nvcc::LOCAL_NVCC);
    for v in ["DCP_MLA_NVCC", "CUDA_HOME", "DCP_MLA_NVCC_JOBS"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let nvcc = match nvcc::find_nvcc(&root) {
        Ok(p) => p,
        Err(e) => fail(&e),
    };
    // One cache for every profile and target dir of this checkout: a rebuild after `cargo clean`
    // or in another profile reuses fatbins whose sources, flags and compiler are unchanged.
    let cache_dir = std::env::var_os("DCP_MLA_KERNEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".toolchain/kernel-cache"));
    println!("cargo:rerun-if-env-changed=DCP_MLA_KERNEL_CACHE");
    let jobs = std::env::var("DCP_MLA_NVCC_JOBS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let cfg = BuildConfig { kernels_dir: kernels.clone(), out_dir: out.clone(), cache_dir, nvcc, jobs };
    match build(&cfg) {
        Ok(r) => {
            if std::env::var_os("DCP_MLA_CODEGEN_VERBOSE").is_some() {
                println!(
                    "cargo:warning=dcp-mla codegen: {} kernels in {} families, nvcc ran {} times, {} from cache",
                    r.kernels, r.families, r.nvcc_runs, r.cached
                );
            }
        }
        Err(e) => fail(&e),
    }
    println!("cargo:rerun-if-env-changed=DCP_MLA_CODEGEN_VERBOSE");
    cc::Build::new().file(out.join("abi_probe.c")).include(&kernels).compile("dcp_mla_abi_probe");
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    println!("cargo:warning={msg}");
    std::process::exit(1);
}
