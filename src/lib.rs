//! dcp-mla: CUDA kernels for decode context parallelism (DCP) with multi-head latent attention.
//!
//! Layers, from the bottom:
//! - [`abi`]: the kernel parameter structs, generated from `kernels-src/abi.h`;
//! - [`runtime`]: device, embedded kernel modules and the generated kernel registry (cudarc,
//!   loaded dynamically: no CUDA is needed to build, link or run the CPU parts);
//! - [`catalogue`]: the decode kernels this build ships, their names and the heuristic among them;
//! - [`ops`]: safe launchers that validate arguments and launch on a caller's stream;
//! - [`planner`]: ownership, lengths, pages, capacity and workspace sizes, the tuned decode table
//!   and the choice of a decode kernel (host only);
//! - [`formats`]: the KV-cache formats and their exact quantisation;
//! - [`reference`](mod@reference): the CPU reference of every operation (docs/contract.md's executable form).

pub mod abi;

pub mod catalogue;
#[macro_use]
pub mod error;
pub mod dcp;
pub mod formats;
pub mod ops;
pub mod planner;
pub mod reference;
pub mod rng;
pub mod runtime;

pub use error::{Error, Result};
pub use formats::{KvFormat, LseBase};
pub use planner::DcpLayout;
