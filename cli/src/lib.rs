//! The `dcp-mla` command's shared half: the benchmark rows, their inputs and CUDA-event timing
//! ([`mod@bench`]), and `dcp-mla tune`'s plan and measuring loop ([`bench::tune`]), which the binary
//! and `cargo bench` both run. Not part of the library's API: engines link `dcp-mla`, which
//! neither compiles nor exports any of this.

pub mod bench;
