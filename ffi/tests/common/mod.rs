//! What the C-program tests share: building a C source against the staticlib.

use std::path::{Path, PathBuf};

/// `target/<profile>`, where cargo leaves the staticlib (test binaries live in its `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// Compiles `source` (relative to the ffi crate) with the system C compiler (found by the cc
/// crate), `-Wall -Werror`, links it against `libdcp_mla_ffi.a` and returns the program,
/// `target/<profile>/<name>`.
pub fn build_c(source: &str, name: &str) -> PathBuf {
    let dir = profile_dir();
    let lib = dir.join("libdcp_mla_ffi.a");
    assert!(
        lib.exists(),
        "{} is missing: run `cargo build --workspace` first (cargo test does not build staticlibs)",
        lib.display()
    );
    let ffi = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(name);
    let target = env!("DCP_MLA_FFI_TARGET");
    let compiler =
        cc::Build::new().target(target).host(target).opt_level(1).cargo_metadata(false).warnings(true).get_compiler();
    let mut cmd = compiler.to_command();
    cmd.arg(ffi.join(source))
        .arg("-I")
        .arg(ffi.join("include"))
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&out)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm"]);
    let o = cmd.output().expect("running the C compiler");
    assert!(
        o.status.success(),
        "compiling {source} failed: {cmd:?}\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}
