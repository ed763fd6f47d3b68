//! The CPU reference of every operation: the executable form of docs/contract.md. GPU kernels are
//! compared against these functions, bit for bit where docs/contract.md §9 says so.

pub mod attention;
pub mod fill;
pub mod merge;
pub mod model1;
pub mod prefill;
pub mod real;
pub mod sink;
pub mod tolerance;
pub mod topk;
