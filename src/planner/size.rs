//! Checked size arithmetic for the planner's byte counts (the workspace sizes and the split-KV
//! plan): the sizes come from callers on trust (through the C ABI too), and a wrapped product
//! would report a tiny buffer as a success.

use crate::error::{Error, Result};

/// The product of `factors` plus `add`, or an error naming `arg` with the operation's values.
pub(super) fn checked(arg: &'static str, what: &str, factors: &[u64], add: u64) -> Result<u64> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .and_then(|p| p.checked_add(add))
        .ok_or_else(|| Error::arg(arg, format!("{what} of {factors:?} overflows 64 bits")))
}
