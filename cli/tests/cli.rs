//! The `dcp-mla` command: help, `plan` against the planner's functions, bad input, the CPU demo's
//! check, `bench` without a GPU, `tune`'s dry run, `--json` on every subcommand, and the
//! README's other promises (the C demo's build line, the license).

use dcp_mla::formats::KvFormat;
use dcp_mla::ops::decode::{decode_num_splits, decode_workspace_bytes};
use dcp_mla::planner::{self, workspace, DcpLayout};
use dcp_mla::runtime::Device;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The binary cargo built for this test; in a staged GPU run (scripts/gpu-stage.sh) the tests sit
/// in `tests/` beside `bin/dcp-mla`.
fn bin() -> PathBuf {
    if let Ok(p) = std::env::var("DCP_MLA_BIN") {
        return p.into();
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_dcp-mla"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().and_then(|d| d.parent()).map(|d| d.join("bin").join("dcp-mla")).expect("a staged bin/dcp-mla")
}

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run dcp-mla")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn help_explains_every_command_and_default() {
    let o = run(&["--help"]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    for cmd in ["demo", "plan", "bench", "tune", "kernels"] {
        assert!(out.contains(cmd), "--help lists `{cmd}`:\n{out}");
    }
    let o = run(&["demo", "--help"]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    for opt in [
        "--dcp-size",
        "--num-q",
        "--interleave",
        "--batch",
        "--context",
        "--local-heads",
        "--kv-format",
        "--cpu",
        "[default: 4]",
    ] {
        assert!(out.contains(opt), "demo --help shows `{opt}`:\n{out}");
    }
    let (out, _) = text(&run(&["plan", "--help"]));
    for opt in [
        "--gpu-mem",
        "--cache-fraction",
        "--layers",
        "--block-size",
        "--batch",
        "--json",
        "[default: 141GB]",
        "fp8_656",
    ] {
        assert!(out.contains(opt), "plan --help shows `{opt}`:\n{out}");
    }
}

#[test]
fn plan_prints_capacity_and_workspace() {
    let o = run(&["plan"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for s in ["without DCP (D = 1)", "with DCP    (D = 4)", "per-rank workspace", "smallest D"] {
        assert!(out.contains(s), "`{s}` in:\n{out}");
    }
}

#[test]
fn plan_json_agrees_with_the_planner() {
    for (fmt, format, d, i, q, context) in [
        ("bf16", KvFormat::Bf16, 2usize, 1usize, 2usize, 300_000u64),
        ("fp8_656", KvFormat::Fp8_656, 8, 4, 1, 5_000_000),
    ] {
        let (d_s, i_s, q_s, ctx_s) = (d.to_string(), i.to_string(), q.to_string(), context.to_string());
        let args = [
            "plan",
            "--json",
            "--gpu-mem",
            "80GiB",
            "--cache-fraction",
            "0.4",
            "--layers",
            "47",
            "--tp",
            "8",
            "--dcp-size",
            &d_s,
            "--interleave",
            &i_s,
            "--kv-format",
            fmt,
            "--block-size",
            "64",
            "--batch",
            "48",
            "--num-q",
            &q_s,
            "--local-heads",
            "16",
            "--topk",
            "2048",
            "--sms",
            "132",
            "--context",
            &ctx_s,
        ];
        let o = run(&args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("plan --json prints JSON");
        let per_layer = (80u64 << 30) as f64 * 0.4;
        let per_layer = per_layer as u64 / 47;
        assert_eq!(v["cache_bytes_per_layer"], per_layer);
        let pages = planner::pages_per_rank(per_layer, format, 64);
        assert_eq!(v["pages_per_rank"], pages);
        let without = planner::capacity_tokens(per_layer, format, 64, 1);
        let with = planner::capacity_tokens(per_layer, format, 64, d);
        assert_eq!(v["tokens_without_dcp"], without);
        assert_eq!(v["tokens_with_dcp"], with);
        assert_eq!(with, d as u64 * without, "capacity grows D-fold");
        let (b, h_l) = (48, 16);
        let h = d * h_l;
        let w = &v["workspace"];
        assert_eq!(w["heads"], h);
        assert_eq!(w["partial_out"], workspace::decode_out_f32_bytes(b, q, h).unwrap());
        assert_eq!(w["merge_ag_rs"], workspace::merge_ag_rs_bytes(d, b * q, h_l).unwrap());
        assert_eq!(w["merge_a2a"], workspace::merge_a2a_bytes(d, b * q, h_l).unwrap());
        assert_eq!(w["topk_bytes"], workspace::topk_bytes(d, b * q, 2048).unwrap());
        let split = [false, true]
            .map(|sparse| decode_workspace_bytes(b, q, h, sparse, decode_num_splits(b, q, h, sparse, 132)).unwrap())
            .into_iter()
            .max()
            .unwrap() as u64;
        assert_eq!(w["decode_split"], split);
        // the smallest D dividing tp whose pages hold the context; none of the smaller ones do
        let fits = |dd: usize| DcpLayout { size: dd, interleave: i }.pages_for(context, 64) <= pages;
        match v["min_dcp_for_context"].as_u64() {
            Some(m) => {
                let m = m as usize;
                assert!(8 % m == 0 && fits(m), "D = {m} fits {context} tokens");
                assert!([1, 2, 4, 8].iter().filter(|&&x| x < m).all(|&x| !fits(x)));
            }
            None => assert!(![1, 2, 4, 8].into_iter().any(fits), "some D fits {context} tokens"),
        }
    }
}

#[test]
fn plan_rejects_bad_input_with_a_message() {
    for (args, needle) in [
        (&["plan", "--tp", "8", "--dcp-size", "3"][..], "tp = 8 is not divisible by the DCP size D = 3"),
        (&["plan", "--tp", "6", "--dcp-size", "3"][..], "D = 3 is not supported"),
        (&["plan", "--num-q", "9"][..], "q = 9"),
        (&["plan", "--gpu-mem", "1MB"][..], "below one block"),
        (&["plan", "--cache-fraction", "1.5"][..], "--cache-fraction"),
        (&["plan", "--interleave", "3"][..], "interleave I = 3"),
        (&["plan", "--kv-lora-rank", "256"][..], "not supported"),
        (&["plan", "--dcp-size", "8", "--local-heads", "32"][..], "heads"),
    ] {
        let o = run(args);
        let (_, err) = text(&o);
        assert!(!o.status.success(), "{args:?} must fail");
        assert!(err.contains(needle), "{args:?}: `{needle}` in {err}");
    }
    let o = run(&["plan", "--gpu-mem", "lots"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("not a size"));
}

#[test]
fn cpu_demo_passes_its_check() {
    for args in [
        &["demo", "--cpu", "--batch", "2", "--context", "2500", "--local-heads", "4", "--topk", "512"][..],
        &[
            "demo",
            "--cpu",
            "--dcp-size",
            "2",
            "--interleave",
            "2",
            "--num-q",
            "2",
            "--batch",
            "3",
            "--context",
            "1500",
            "--local-heads",
            "8",
            "--topk",
            "512",
            "--kv-format",
            "bf16",
        ][..],
    ] {
        let o = run(args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}:\n{out}\n{err}");
        assert!(out.contains("CPU reference") && out.contains("check: PASS"), "{out}");
        assert!(out.contains("dense BF16") && out.contains("tokens without DCP"), "{out}");
    }
}

#[test]
fn old_spellings_still_work_with_a_deprecation_warning() {
    let new = run(&["plan", "--json", "--dcp-size", "2", "--batch", "8", "--num-q", "2", "--kv-format", "fp8_656"]);
    let old = run(&["plan", "--json", "--dcp", "2", "--max-batch", "8", "--q", "2", "--kv-format", "fp8"]);
    assert!(new.status.success() && old.status.success());
    assert_eq!(new.stdout, old.stdout, "the old spellings mean the same");
    let (_, err) = text(&old);
    for w in ["`--dcp` is deprecated", "`--max-batch` is deprecated", "`--q` is deprecated", "`--kv-format fp8`"] {
        assert!(err.contains(w), "{w} in {err}");
    }
    assert!(text(&new).1.is_empty(), "{}", text(&new).1);
    let v: serde_json::Value = serde_json::from_slice(&new.stdout).unwrap();
    assert_eq!((v["dcp_size"].as_u64(), v["kv_format"].as_str()), (Some(2), Some("fp8_656")));
    assert_eq!((v["workspace"]["batch"].as_u64(), v["workspace"]["num_q"].as_u64()), (Some(8), Some(2)));
}

#[test]
fn demo_refuses_a_dcp_size_without_kernels() {
    let o = run(&["demo", "--cpu", "--tp", "6", "--dcp-size", "3"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("D = 3 is not supported"), "{}", text(&o).1);
}

#[test]
fn demo_rejects_bad_configurations() {
    let o = run(&["demo", "--cpu", "--dcp-size", "4", "--topk", "768"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("K = 768"), "{}", text(&o).1);
    let o = run(&["demo", "--cpu", "--dcp-size", "1", "--tp", "1", "--topk", "256"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("D = 1") && text(&o).1.contains("K = 256"), "{}", text(&o).1);
}

#[test]
fn bench_exits_2_without_a_gpu_and_measures_with_one() {
    if Device::open(0).is_ok() {
        // With a GPU: one small row, measured against the same run's copy ceiling.
        let o = run(&["bench", "--filter", "kv_fill Bf16 tokens=128", "--warmup", "1", "--reps", "3"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        assert!(out.contains("copy ceiling") && out.contains("kv_fill Bf16 tokens=128"), "{out}");
        return;
    }
    let o = run(&["bench"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("needs a CUDA GPU"));
}

#[test]
fn tune_plans_without_a_gpu() {
    // the dry run needs no GPU: the plan, each class's variants and splits, and the estimate
    let o = run(&["tune", "--dry-run", "--sms", "132"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    for s in ["dense bf16 b=128 q=1 H=64 ctx=8192", "mla_decode_engine sparse fp8 b64 q1 H128 K512", "wgmma-lead-64x2"]
    {
        assert!(out.contains(s), "the plan shows `{s}`:\n{out}");
    }
    assert!(out.contains("estimated") && out.contains("an estimate"), "{out}");
    assert!(!out.contains("warning: over the budget"), "{out}");
    if Device::open(0).is_err() {
        let o = run(&["tune"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(text(&o).1.contains("needs a CUDA GPU"));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_demo_passes_its_check() {
    let o = run(&["demo", "--batch", "4", "--context", "8192", "--check-requests", "4"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("on the GPU") && out.contains("check: PASS"), "{out}");
}

#[test]
fn bad_counts_are_refused_by_option_name_without_a_crash() {
    for (args, needle) in [
        (&["plan", "--tp", "0"][..], "--tp"),
        (&["plan", "--context", "0"][..], "--context"),
        (&["plan", "--context-requests", "0"][..], "--context-requests"),
        (&["plan", "--tp", "-1"][..], "--tp"),
        (&["demo", "--cpu", "--batch", "-3"][..], "--batch"),
        // the same bound as demo's: the kernels' lengths are int32
        (&["plan", "--context", "1099511627776"][..], "context"),
        // refused before anything is allocated (used to abort on a 3.9 TB allocation)
        (&["demo", "--cpu", "--context", "2147483647"][..], "host memory"),
        // tune's counts, in a dry run as on a GPU (a 64-bit repetition count used to overflow)
        (&["tune", "--dry-run", "--reps", "18446744073709551615"][..], "--reps"),
        (&["tune", "--dry-run", "--warmup", "18446744073709551615"][..], "--warmup"),
        (&["tune", "--dry-run", "--reps", "0"][..], "--reps"),
        (&["tune", "--dry-run", "--sms", "0"][..], "--sms"),
        (&["tune", "--dry-run", "--filter", "no such class"][..], "--filter `no such class` matches no class"),
        (&["bench", "--reps", "0"][..], "--reps"),
        (&["bench", "--warmup", "18446744073709551615"][..], "--warmup"),
        (&["bench", "--filter", "no such row"][..], "--filter `no such row` matches no row"),
    ] {
        let o = run(args);
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{args:?} was accepted: {out}");
        assert!(err.contains(needle), "{args:?}: the error should name {needle:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{args:?} crashed: {err}");
    }
}

/// The subcommands `dcp-mla --help` lists (`help` aside).
fn subcommands() -> Vec<String> {
    let (out, _) = text(&run(&["--help"]));
    let list = out.split("Commands:").nth(1).expect("--help lists the commands");
    let list = list.split("\n\n").next().unwrap_or(list);
    list.lines()
        .filter_map(|l| l.strip_prefix("  ")?.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn every_subcommand_prints_json() {
    // the README: "`--json` prints JSON to stdout as on every subcommand"
    let cmds = subcommands();
    assert!(cmds.len() >= 5, "{cmds:?}");
    for cmd in &cmds {
        let (out, _) = text(&run(&[cmd, "--help"]));
        assert!(out.contains("--json"), "`dcp-mla {cmd}` has no --json:\n{out}");
    }
    let json = |args: &[&str]| -> serde_json::Value {
        let o = run(args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}:\n{out}\n{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} prints JSON ({e}):\n{out}"))
    };
    let v =
        json(&["demo", "--cpu", "--json", "--batch", "2", "--context", "1500", "--local-heads", "4", "--topk", "512"]);
    assert_eq!((v["device"].as_str(), v["pass"].as_bool()), (Some("cpu"), Some(true)), "{v}");
    assert_eq!((v["dcp_size"].as_u64(), v["batch"].as_u64()), (Some(4), Some(2)));
    let paths = v["check"]["paths"].as_array().unwrap();
    assert!(paths.len() == 2 && paths.iter().all(|p| p["pass"] == true && p["rel_l2"].as_f64().is_some()), "{v}");
    assert!(v["stages"].as_array().is_some_and(|s| !s.is_empty()) && v["capacity"]["tokens_with_dcp"].is_u64());
    let v = json(&["tune", "--dry-run", "--json", "--sms", "132", "--filter", "sparse fp8 b128 q2 H128"]);
    assert_eq!(v["num_sms"], 132);
    let classes = v["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 1, "{v}");
    assert_eq!(classes[0]["class"]["kv"], "fp8_656");
    assert!(classes[0]["variants"].as_array().unwrap().iter().any(|x| x == "wgmma-lead-64x2"), "{v}");
    assert!(v["estimated_s"].as_f64().unwrap() > 0.0);
    let v = json(&["plan", "--json"]);
    assert!(v["tokens_with_dcp"].is_u64());
    let v = json(&["kernels", "--json"]);
    assert!(v.as_array().is_some_and(|k| !k.is_empty()));
    if Device::open(0).is_err() {
        // bench takes --json, then says it needs a GPU (not a usage error)
        let o = run(&["bench", "--json"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(text(&o).1.contains("needs a CUDA GPU"), "{}", text(&o).1);
    }
}

#[test]
fn the_readme_keeps_its_promises() {
    let readme = include_str!("../../README.md");
    // the C demo is built into target/, not the repository root
    let c_builds: Vec<&str> = readme.lines().filter(|l| l.contains("ffi/examples/demo.c -I")).collect();
    assert!(!c_builds.is_empty(), "the README shows how to build the C demo");
    for l in readme.lines().chain(include_str!("../../ffi/examples/demo.c").lines()) {
        let words: Vec<&str> = l.split_whitespace().collect();
        for w in words.windows(2).filter(|w| w[0] == "-o") {
            assert!(w[1].starts_with("target/"), "`{l}` writes {} outside target/", w[1]);
        }
    }
    // a license section that agrees with Cargo.toml and the license files
    let license = readme.split("\n## License").nth(1).expect("the README has a License section");
    for s in ["MIT", "Apache-2.0", "LICENSE-MIT", "LICENSE-APACHE"] {
        assert!(license.contains(s), "the License section names {s}");
    }
    assert!(include_str!("../../Cargo.toml").contains("license = \"MIT OR Apache-2.0\""));
    assert!(include_str!("../../LICENSE-MIT").contains("MIT License"));
    assert!(include_str!("../../LICENSE-APACHE").contains("Apache License"));
    // docs/performance.md's opening names every card a section is measured on
    let perf = include_str!("../../docs/performance.md");
    let opening = perf.split("\n## ").next().unwrap();
    for card in ["H100", "H200"] {
        if perf.lines().any(|l| l.starts_with('#') && l.contains(card)) {
            assert!(opening.contains(card), "docs/performance.md has {card} sections; its opening should say so");
        }
    }
}
