//! Builds `tests/c/abi_checks.c` with the system C compiler, links it against the staticlib and
//! runs it: the C ABI driven from C with wrapped sizes and null pointers (planner queries and
//! their errors, then valid calls; needs no GPU), and with `--device` the launchers with wrapped
//! sizes, null and misaligned buffers, then a valid launch (needs a GPU). A staged run (no
//! compiler, no target folder) sets `DCP_MLA_ABI_CHECKS` to the program built here
//! (`target/<profile>/dcp_mla_abi_checks`).

mod common;

use std::path::PathBuf;
use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let program = match std::env::var_os("DCP_MLA_ABI_CHECKS") {
        Some(p) => PathBuf::from(p),
        None => common::build_c("tests/c/abi_checks.c", "dcp_mla_abi_checks"),
    };
    let run = Command::new(&program).args(args).output().expect("running abi_checks");
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    (run.status.success() && text.contains("abi checks: PASS"), text)
}

#[test]
fn c_caller_gets_named_errors_for_wrapped_sizes_and_null_pointers() {
    let (ok, text) = run(&[]);
    assert!(ok, "{text}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn c_caller_gets_named_errors_from_the_launchers_then_a_valid_launch_runs() {
    let (ok, text) = run(&["--device"]);
    assert!(ok && text.contains("launcher checks ran on device 0"), "{text}");
}
