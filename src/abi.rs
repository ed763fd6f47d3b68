//! Kernel parameter structs: Rust mirrors generated from `kernels-src/abi.h`, the only place
//! they are defined. `tests/abi_layout.rs` checks every size, alignment and offset against the
//! C compiler's layout.

include!(concat!(env!("OUT_DIR"), "/abi.rs"));
