//! Passes the target triple to the tests (tests/c_demo.rs asks the cc crate for the C compiler
//! of this target). The code targets the capability query needs come from the kernel registry
//! (`dcp_mla::runtime::registry::SASS_TARGETS`), not from kernels.toml.

fn main() {
    println!("cargo:rustc-env=DCP_MLA_FFI_TARGET={}", std::env::var("TARGET").unwrap());
}
