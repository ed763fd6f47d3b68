//! The checked-in header `include/dcp_mla.h` must be what cbindgen generates from `src/`
//! today. After changing the ABI, regenerate it with
//! `DCP_MLA_BLESS=1 cargo test -p dcp-mla-ffi --test header`.

use std::path::PathBuf;

/// The ffi crate's folder: where it was built, or `ffi/` under the working directory when the
/// test binary runs on another machine (a staged GPU run from the repository root).
fn ffi_dir() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if built.join("cbindgen.toml").exists() {
        built
    } else {
        PathBuf::from("ffi")
    }
}

fn generate(dir: &std::path::Path) -> String {
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("reading cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen failed on ffi/src");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen wrote UTF-8")
}

#[test]
fn header_matches_the_rust_source() {
    let dir = ffi_dir();
    let fresh = generate(&dir);
    let path = dir.join("include/dcp_mla.h");
    if std::env::var_os("DCP_MLA_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("writing the header");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != fresh {
        let line = checked_in.lines().zip(fresh.lines()).position(|(a, b)| a != b).map_or(0, |i| i + 1);
        panic!(
            "{} differs from the header cbindgen generates from ffi/src (first difference near line {line}); \
             regenerate it with DCP_MLA_BLESS=1 cargo test -p dcp-mla-ffi --test header",
            path.display()
        );
    }
}

#[test]
fn header_declares_every_exported_function() {
    let fresh = generate(&ffi_dir());
    let src: String = ["lib.rs", "ops.rs", "planner.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(ffi_dir().join("src").join(f)).expect("reading ffi/src"))
        .collect();
    let exported: Vec<&str> =
        src.split("extern \"C\" fn ").skip(1).map(|rest| rest.split('(').next().unwrap_or_default()).collect();
    assert!(exported.len() > 30, "found only {} exported functions", exported.len());
    assert!(fresh.contains("DCP_MLA_STATUS_NO_DEVICE"), "status enum missing");
    // The Python package declares the ctypes types of every function it can call.
    let lib_py = ffi_dir().join("../python/dcp_mla/_lib.py");
    let python = std::fs::read_to_string(&lib_py).expect("reading python/dcp_mla/_lib.py");
    for f in exported {
        assert!(fresh.contains(&format!("{f}(")), "the header lacks {f}");
        assert!(python.contains(&format!("\"{f}\"")), "python/dcp_mla/_lib.py does not declare {f}");
    }
}
