//! C ABI of dcp-mla (work in progress: see the C-ABI issue). For now it exports the version.

use std::ffi::c_char;

/// The library version as a NUL-terminated string, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn dcp_mla_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
