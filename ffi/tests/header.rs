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

/// The header's declarations: every line of `header` with its comments removed, whitespace
/// collapsed, and the `DCP_MLA_ABI_VERSION` define left out (it is the key, not the content).
fn declarations(header: &str) -> String {
    let mut text = String::new();
    let mut rest = header;
    // drop /* ... */ blocks, then // line comments
    while let Some(start) = rest.find("/*") {
        text.push_str(&rest[..start]);
        rest = rest[start..].find("*/").map_or("", |end| &rest[start + end + 2..]);
    }
    text.push_str(rest);
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .filter(|l| !l.trim_start().starts_with("#define DCP_MLA_ABI_VERSION "))
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `DCP_MLA_ABI_VERSION` as the header defines it.
fn header_revision(header: &str) -> u32 {
    header
        .lines()
        .find_map(|l| l.strip_prefix("#define DCP_MLA_ABI_VERSION "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the header defines DCP_MLA_ABI_VERSION")
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// ABI discipline: the declarations of `include/dcp_mla.h` hash to the value
/// `abi-revisions.sha256` records for the header's `DCP_MLA_ABI_VERSION`, that revision is the
/// newest the file records, and the Python package expects it. Changing a prototype, a struct or
/// a code therefore fails here until the revision is bumped (ffi/src/lib.rs) and the new
/// revision's line (printed below) is appended to ffi/abi-revisions.sha256.
#[test]
fn header_prototypes_match_the_abi_revision() {
    let dir = ffi_dir();
    let header = std::fs::read_to_string(dir.join("include/dcp_mla.h")).expect("reading the header");
    let revision = header_revision(&header);
    let hash = sha256_hex(&declarations(&header));
    let recorded = std::fs::read_to_string(dir.join("abi-revisions.sha256")).unwrap_or_default();
    let lines: Vec<(u32, &str)> = recorded
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (rev, h) = l.split_once(char::is_whitespace).expect("`<revision> <sha256>` lines");
            (rev.parse().expect("a revision number"), h.trim())
        })
        .collect();
    let newest = lines.iter().map(|&(r, _)| r).max().unwrap_or(0);
    let line = format!("{revision} {hash}");
    match lines.iter().find(|&&(r, _)| r == revision) {
        Some(&(_, h)) if h == hash => {}
        Some(_) => panic!(
            "header prototypes changed: bump DCP_MLA_ABI_VERSION and update the hash \
             (revision {revision} is recorded with other declarations; bump DCP_MLA_ABI_VERSION in ffi/src/lib.rs \
             and ABI_VERSION in python/dcp_mla/_lib.py, regenerate the header with \
             DCP_MLA_BLESS=1 cargo test -p dcp-mla-ffi --test header, then append the line this test prints for the \
             new revision to ffi/abi-revisions.sha256; this header's line: `{line}`)"
        ),
        None => panic!(
            "header prototypes changed: bump DCP_MLA_ABI_VERSION and update the hash \
             (revision {revision} is not in ffi/abi-revisions.sha256: append the line `{line}`)"
        ),
    }
    assert_eq!(
        revision, newest,
        "DCP_MLA_ABI_VERSION {revision} is older than the newest revision ffi/abi-revisions.sha256 records ({newest})"
    );
    let lib_py = std::fs::read_to_string(dir.join("../python/dcp_mla/_lib.py")).expect("reading _lib.py");
    let python = lib_py.lines().find_map(|l| l.strip_prefix("ABI_VERSION = ")).map(str::trim);
    assert_eq!(
        python,
        Some(revision.to_string().as_str()),
        "python/dcp_mla/_lib.py's ABI_VERSION must be the header's DCP_MLA_ABI_VERSION {revision}"
    );
}

#[test]
fn declarations_ignore_comments_and_layout_only() {
    let a = "// c\n#define DCP_MLA_ABI_VERSION 3\n/* block\n comment */ int f(int a,\n          int b);\n";
    let b = "#define DCP_MLA_ABI_VERSION 4\nint f(int a, int b); // other words\n";
    assert_eq!(declarations(a), declarations(b));
    assert_eq!(declarations(a), "int f(int a, int b);");
    assert_ne!(declarations(a), declarations("int f(int a, size_t b);"));
    assert_eq!(header_revision(a), 3);
}
