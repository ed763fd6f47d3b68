//! Passes the target triple to the tests (tests/c_demo.rs asks the cc crate for the C compiler
//! of this target) and the code targets of `kernels-src/kernels.toml` to the capability query.
use std::path::Path;

fn main() {
    println!("cargo:rustc-env=DCP_MLA_FFI_TARGET={}", std::env::var("TARGET").unwrap());
    let toml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels-src/kernels.toml");
    println!("cargo:rerun-if-changed={}", toml.display());
    let text = std::fs::read_to_string(&toml).unwrap_or_else(|e| panic!("reading {}: {e}", toml.display()));
    let (sass, ptx) = targets(&text).unwrap_or_else(|| panic!("no [targets] sass/ptx in {}", toml.display()));
    println!("cargo:rustc-env=DCP_MLA_SASS_TARGETS={}", sass.join(","));
    println!("cargo:rustc-env=DCP_MLA_PTX_TARGET={ptx}");
}

/// The `sass = [...]` and `ptx = "..."` lines of the `[targets]` table.
fn targets(text: &str) -> Option<(Vec<String>, String)> {
    let mut in_targets = false;
    let (mut sass, mut ptx) = (None, None);
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') && !line.starts_with("[[") && line.ends_with(']') && !line.contains('=') {
            in_targets = line == "[targets]";
            continue;
        }
        if !in_targets {
            continue;
        }
        let strings = |v: &str| -> Vec<String> { v.split('"').skip(1).step_by(2).map(str::to_string).collect() };
        if let Some(v) = line.strip_prefix("sass") {
            sass = Some(strings(v));
        } else if let Some(v) = line.strip_prefix("ptx") {
            ptx = strings(v).into_iter().next();
        }
    }
    Some((sass?, ptx?))
}
