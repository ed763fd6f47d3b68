//! Builds `tests/c/abi_checks.c` with the system C compiler, links it against the staticlib and
//! runs it: the C ABI driven from C with wrapped sizes and null pointers (planner queries and
//! their errors, then valid calls). Needs no GPU. A staged run (no compiler, no target folder)
//! sets `DCP_MLA_ABI_CHECKS` to the program built here (`target/<profile>/dcp_mla_abi_checks`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`, where cargo leaves the staticlib (this binary lives in its `deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

#[test]
fn c_caller_gets_named_errors_for_wrapped_sizes_and_null_pointers() {
    let program = match std::env::var_os("DCP_MLA_ABI_CHECKS") {
        Some(p) => PathBuf::from(p),
        None => build(),
    };
    let run = Command::new(&program).output().expect("running abi_checks");
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success() && text.contains("abi checks: PASS"), "{text}");
}

/// Compiles and links the C program against the staticlib; returns its path.
fn build() -> PathBuf {
    let dir = profile_dir();
    let lib = dir.join("libdcp_mla_ffi.a");
    assert!(lib.exists(), "{} is missing: run `cargo build --workspace` first", lib.display());
    let ffi = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join("dcp_mla_abi_checks");
    let target = env!("DCP_MLA_FFI_TARGET");
    let compiler =
        cc::Build::new().target(target).host(target).opt_level(1).cargo_metadata(false).warnings(true).get_compiler();
    let mut cmd = compiler.to_command();
    cmd.arg(ffi.join("tests/c/abi_checks.c"))
        .arg("-I")
        .arg(ffi.join("include"))
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&out)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm"]);
    let o = cmd.output().expect("running the C compiler");
    assert!(o.status.success(), "compiling abi_checks.c failed: {cmd:?}\n{}", String::from_utf8_lossy(&o.stderr));
    out
}
