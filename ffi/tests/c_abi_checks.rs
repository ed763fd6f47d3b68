//! Builds `tests/c/abi_checks.c` with the system C compiler, links it against the staticlib and
//! runs it: the C ABI driven from C with wrapped sizes and null pointers (planner queries and
//! their errors, then valid calls). Needs no GPU. A staged run (no compiler, no target folder)
//! sets `DCP_MLA_ABI_CHECKS` to the program built here (`target/<profile>/dcp_mla_abi_checks`).

mod common;

use std::path::PathBuf;
use std::process::Command;

#[test]
fn c_caller_gets_named_errors_for_wrapped_sizes_and_null_pointers() {
    let program = match std::env::var_os("DCP_MLA_ABI_CHECKS") {
        Some(p) => PathBuf::from(p),
        None => common::build_c("tests/c/abi_checks.c", "dcp_mla_abi_checks"),
    };
    let run = Command::new(&program).output().expect("running abi_checks");
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success() && text.contains("abi checks: PASS"), "{text}");
}
