//! The `dcp_mla._native` extension module of the Python package (`python/dcp_mla`).
//!
//! The package calls the library through its C ABI (`ffi/include/dcp_mla.h`) with ctypes, so
//! Python, C and C++ clients share one interface, one set of argument checks and one error
//! vocabulary. This crate links that ABI (every `dcp_mla_*` symbol of `dcp-mla-ffi`, exported
//! from this shared object) and gives it the `PyInit__native` entry point that lets pip install
//! it and Python import it; `dcp_mla/_lib.py` then opens the same file with ctypes. The hot
//! decode launches also have native entry points here (`launch`), which fill the same argument
//! structs from torch tensors without ctypes.

use pyo3::prelude::*;

mod launch;

// Keeps the whole C ABI crate linked, and with it every symbol ctypes looks up.
use dcp_mla_ffi as _;

/// The library's version (the same string as `dcp_mla_version()` of the C ABI).
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The C ABI version this module exports (`DCP_MLA_ABI_VERSION`).
#[pyfunction]
fn abi_version() -> u32 {
    dcp_mla_ffi::dcp_mla_abi_version()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(abi_version, m)?)?;
    m.add_function(wrap_pyfunction!(launch::bind_tensor_api, m)?)?;
    m.add_function(wrap_pyfunction!(launch::register_device, m)?)?;
    m.add_function(wrap_pyfunction!(launch::current_stream, m)?)?;
    m.add_function(wrap_pyfunction!(launch::decode_dense, m)?)?;
    m.add_function(wrap_pyfunction!(launch::decode_sparse, m)?)?;
    m.add_function(wrap_pyfunction!(launch::tensor_key, m)?)?;
    m.add_function(wrap_pyfunction!(launch::replay_decode, m)?)?;
    m.add("FALLBACK", launch::FALLBACK)?;
    Ok(())
}
