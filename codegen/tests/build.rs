//! The generator end to end on a small copy of kernels-src (the fill family only): a second
//! build with nothing changed runs nvcc zero times, a change recompiles, and a variant that
//! breaks D·K % 512 fails with a message naming D and K. Needs nvcc (scripts/setup-cuda.sh).

use dcp_mla_codegen::{build, nvcc, BuildConfig};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn small_kernels(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["abi.h", "common.cuh", "fill.cuh"] {
        std::fs::copy(repo().join("kernels-src").join(f), dir.join(f)).unwrap();
    }
    let full = std::fs::read_to_string(repo().join("kernels-src/kernels.toml")).unwrap();
    // Keep the [targets] table and the kv_fill family.
    let mut dsl = String::new();
    for block in full.split("[[family]]") {
        if dsl.is_empty() {
            dsl.push_str(block);
        } else if block.contains("name = \"kv_fill\"") {
            dsl.push_str("[[family]]");
            dsl.push_str(block);
        }
    }
    // [rust_types] may only name axes of kept families (codegen checks it): the fill keeps `format`
    let dsl: String = dsl
        .lines()
        .filter(|l| !l.contains("= \"crate::") || l.starts_with("format = "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(dir.join("kernels.toml"), dsl).unwrap();
}

fn config(tmp: &Path) -> BuildConfig {
    BuildConfig {
        kernels_dir: tmp.join("ks"),
        out_dir: tmp.join("out"),
        cache_dir: tmp.join("cache"),
        nvcc: nvcc::find_nvcc(&repo()).expect("nvcc (run scripts/setup-cuda.sh)"),
        jobs: 2,
    }
}

#[test]
fn cached_rebuild_runs_no_nvcc_and_changes_recompile() {
    let tmp = tempfile::tempdir().unwrap();
    small_kernels(&tmp.path().join("ks"));
    let cfg = config(tmp.path());
    let first = build(&cfg).expect("first build");
    assert_eq!(first.nvcc_runs, 1, "one family, one nvcc run");
    assert_eq!(first.kernels, 2);
    assert!(first.fatbin_bytes["kv_fill"] > 0);
    for arch in ["sm_90a", "sm_80"] {
        assert!(first.ptxas["dcp_kv_fill__format_fp8_656"].iter().any(|e| e.arch == arch), "{arch} report");
    }
    let registry = std::fs::read_to_string(cfg.out_dir.join("registry.rs")).unwrap();
    assert!(registry.contains("pub fn kv_fill(format: axes::Format)"));

    let second = build(&cfg).expect("second build");
    assert_eq!(second.nvcc_runs, 0, "nothing changed: nvcc must not run");
    assert_eq!(second.cached, 1);

    // Touching a header's content changes the key.
    let h = cfg.kernels_dir.join("common.cuh");
    let text = std::fs::read_to_string(&h).unwrap();
    std::fs::write(&h, format!("{text}\n// changed\n")).unwrap();
    assert_eq!(build(&cfg).expect("third build").nvcc_runs, 1);
}

#[test]
fn variant_breaking_dk_rule_fails_codegen_naming_d_and_k() {
    let tmp = tempfile::tempdir().unwrap();
    small_kernels(&tmp.path().join("ks"));
    let cfg = config(tmp.path());
    let dsl = cfg.kernels_dir.join("kernels.toml");
    let mut text = std::fs::read_to_string(&dsl).unwrap();
    text.push_str(
        "\n[[family]]\nname = \"topk_merge_bad\"\nheader = \"fill.cuh\"\ntemplate = \"t\"\nparams = \"DcpKvFillParams\"\nblock = 256\naxes = { D = [1], K = [256] }\nconstraints = [\"D*K % 512 == 0\"]\n",
    );
    std::fs::write(&dsl, text).unwrap();
    let err = build(&cfg).unwrap_err();
    assert!(err.contains("D = 1, K = 256"), "{err}");
    assert!(err.contains("D*K % 512 == 0"), "{err}");
    assert!(!cfg.out_dir.join("kernels/topk_merge_bad.fatbin").exists(), "nothing compiled");
}

#[test]
fn hot_kernel_that_spills_fails_the_build() {
    let tmp = tempfile::tempdir().unwrap();
    let ks = tmp.path().join("ks");
    small_kernels(&ks);
    // A kernel that must spill: 160 values live at once under a 64-register cap (1024 threads).
    std::fs::write(
        ks.join("spill.cuh"),
        "#pragma once\n#include \"abi.h\"\nnamespace dcp {\ntemplate <int N> __device__ void spill(const DcpKvFillParams& p) {\n  const float* x = (const float*)p.ckv;\n  float a[N];\n#pragma unroll\n  for (int i = 0; i < N; ++i) a[i] = x[i * p.num_tokens + threadIdx.x];\n  float s = 0;\n#pragma unroll\n  for (int i = 0; i < N; ++i)\n#pragma unroll\n    for (int j = 0; j < N; ++j) s = fmaf(a[i], a[(i + j) % N], s);\n  ((float*)p.cache)[threadIdx.x] = s;\n}\n}\n",
    )
    .unwrap();
    let dsl = ks.join("kernels.toml");
    let mut text = std::fs::read_to_string(&dsl).unwrap();
    text.push_str("\n[[family]]\nname = \"spiller\"\nheader = \"spill.cuh\"\ntemplate = \"spill\"\nparams = \"DcpKvFillParams\"\nblock = 1024\nhot = true\naxes = { N = [160] }\n");
    std::fs::write(&dsl, text).unwrap();
    let err = build(&config(tmp.path())).unwrap_err();
    assert!(err.contains("spill") && err.contains("dcp_spiller__N_160"), "{err}");
}
