//! The subcommands, one module each (`problem`: the demo's shared problem).

pub mod bench_cmd;
pub mod demo;
pub mod demo_gpu;
pub mod kernels;
pub mod plan;
pub mod problem;
pub mod tune_cmd;
