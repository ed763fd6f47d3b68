//! Workspace sizes of every operation (docs/contract.md §8): the caller allocates them once, launchers
//! never allocate. Sizes are bytes; layouts are row-major as the reference documents them.
//!
//! Every size is computed with checked arithmetic and returns an error naming an argument when
//! it does not fit in 64 bits: the sizes come from callers on trust (through the C ABI too), and a
//! wrapped product would report a tiny workspace as a success.

use super::size::checked;
use crate::error::{Error, Result};
use crate::formats::D_V;

fn sum(arg: &'static str, parts: &[Result<u64>]) -> Result<u64> {
    let mut total = 0u64;
    for p in parts {
        let v = p.as_ref().map_err(|e| Error::arg(arg, e.to_string()))?;
        total = total.checked_add(*v).ok_or_else(|| Error::arg(arg, "the workspace's parts overflow 64 bits"))?;
    }
    Ok(total)
}

/// ag_rs merge of T rows on one rank with H_l local heads in a group of D: the all-gathered lse
/// [D, T, H] fp32 and the head-major fp32 contribution [H, T, 512], with H = D·H_l gathered heads,
/// plus the reduce-scattered sum [H_l, T, 512] fp32.
pub fn merge_ag_rs_bytes(d: usize, t: usize, h_l: usize) -> Result<u64> {
    let (d, t, h_l) = (d as u64, t as u64, h_l as u64);
    let h = checked("local_heads", "D·H_l", &[d, h_l], 0)?;
    sum(
        "num_tokens",
        &[
            checked("num_tokens", "the gathered lse D·T·H·4", &[d, t, h, 4], 0),
            checked("num_tokens", "the contribution H·T·512·4", &[h, t, D_V as u64, 4], 0),
            checked("num_tokens", "the reduced sum H_l·T·512·4", &[h_l, t, D_V as u64, 4], 0),
        ],
    )
}

/// One a2a slot, tight: `[T × H_l × 512 bf16 out][T × H_l fp32 lse]` (the CPU reference's
/// packing; sizes there are the reference's own, so this one is unchecked).
pub const fn a2a_slot_bytes(t: usize, h_l: usize) -> usize {
    t * h_l * (D_V * 2 + 4)
}

/// One a2a slot as the launchers take it: [`a2a_slot_bytes`] (T·H_l·(1024 + 4)) rounded up to a
/// multiple of 16 bytes, so that every slot of a [D, slot] buffer starts 16-byte aligned (the
/// combine kernels use 16-byte vectors). Equals the tight size whenever T·H_l is a multiple of 4.
pub fn a2a_slot_bytes_aligned(t: usize, h_l: usize) -> Result<usize> {
    let tight = checked("num_tokens", "the a2a slot T·H_l·1028", &[t as u64, h_l as u64, D_V as u64 * 2 + 4], 0)?;
    tight
        .checked_next_multiple_of(16)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| Error::arg("num_tokens", format!("an a2a slot of {tight} bytes overflows the address range")))
}

/// a2a merge: a send and a receive buffer of [D, slot] each, slot = [`a2a_slot_bytes_aligned`];
/// the D slots together carry the gathered D·H_l heads.
pub fn merge_a2a_bytes(d: usize, t: usize, h_l: usize) -> Result<u64> {
    let slot = a2a_slot_bytes_aligned(t, h_l)? as u64;
    checked("dcp_size", "the a2a buffers 2·D·slot", &[2, d as u64, slot], 0)
}

/// The plain merge of D gathered partials of T rows of H_l heads: out [D, T, H_l, 512] fp32 and
/// lse [D, T, H_l] fp32.
pub fn merge_gathered_bytes(d: usize, t: usize, h_l: usize) -> Result<u64> {
    checked(
        "num_tokens",
        "the gathered partials D·T·H_l·2052",
        &[d as u64, t as u64, h_l as u64, D_V as u64 * 4 + 4],
        0,
    )
}

/// Distributed top-k of `rows` rows: this rank's local top-k [rows, K] int32, its packed
/// candidates (fp32 score + int32 id) [rows, K], the all-gathered candidates [D, rows, K] of
/// both, and the merged ids [rows, K] int32.
pub fn topk_bytes(d: usize, rows: usize, k: usize) -> Result<u64> {
    let rk = checked("rows", "rows·K", &[rows as u64, k as u64], 0)?;
    // rk·4 + rk·8 + D·rk·8 + rk·4 = rk·(16 + 8·D)
    let per = checked("dcp_size", "16 + 8·D", &[8, d as u64], 16)?;
    checked("rows", "rows·K·(16 + 8·D)", &[rk, per], 0)
}

/// A rank's decode result in fp32 (what the ag_rs combine reads): out [b, q, H, 512] and lse
/// [b, q, H], H being the gathered heads D·H_l.
pub fn decode_out_f32_bytes(b: usize, q: usize, h: usize) -> Result<u64> {
    checked("batch", "the fp32 decode result b·q·H·2052", &[b as u64, q as u64, h as u64, D_V as u64 * 4 + 4], 0)
}

/// The split-KV decode workspace: [`super::split::SplitPlan`]'s bytes (its layout and offsets
/// live there, computed once for the launcher and for these size queries).
pub fn decode_split_bytes(b: usize, q: usize, h: usize, sparse: bool, parts: usize) -> Result<u64> {
    Ok(super::split::SplitPlan::new(b, q, h, sparse, parts)?.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(e: Error) -> &'static str {
        match e {
            Error::InvalidArgument { arg, .. } => arg,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn sizes_match_their_layouts() {
        assert_eq!(merge_ag_rs_bytes(4, 128, 16).unwrap(), 4 * 128 * 64 * 4 + 64 * 128 * 512 * 4 + 16 * 128 * 512 * 4);
        assert_eq!(a2a_slot_bytes_aligned(128, 16).unwrap(), a2a_slot_bytes(128, 16));
        assert_eq!(a2a_slot_bytes_aligned(1, 1).unwrap(), 1040);
        assert_eq!(merge_a2a_bytes(4, 1, 1).unwrap(), 2 * 4 * 1040);
        assert_eq!(topk_bytes(4, 128, 2048).unwrap(), 128 * 2048 * (4 + 8 + 4 * 8 + 4));
        assert_eq!(decode_split_bytes(2, 3, 16, false, 1).unwrap(), 0);
        assert_eq!(decode_split_bytes(2, 3, 16, false, 5).unwrap(), 128 + 10 * 48 * 513 * 4);
        // sparse: six sequences, their prefix, stamp and part table take 256 bytes
        assert_eq!(decode_split_bytes(2, 3, 16, true, 5).unwrap(), 256 + 10 * 16 * 513 * 4);
    }

    #[test]
    fn sizes_that_overflow_are_errors_not_wrapped_values() {
        let big = usize::MAX / 2;
        assert_eq!(arg(merge_ag_rs_bytes(8, big, 16).unwrap_err()), "num_tokens");
        assert_eq!(arg(merge_ag_rs_bytes(big, 1, big).unwrap_err()), "local_heads");
        assert_eq!(arg(a2a_slot_bytes_aligned(big, 3).unwrap_err()), "num_tokens");
        assert_eq!(arg(merge_a2a_bytes(big, 1 << 20, 1).unwrap_err()), "dcp_size");
        assert_eq!(arg(merge_gathered_bytes(4, big, 2).unwrap_err()), "num_tokens");
        assert_eq!(arg(topk_bytes(4, big, 2048).unwrap_err()), "rows");
        assert_eq!(arg(topk_bytes(big, 1, 1).unwrap_err()), "dcp_size");
        assert_eq!(arg(decode_out_f32_bytes(big, 2, 64).unwrap_err()), "batch");
        assert_eq!(arg(decode_split_bytes(4, 1, 64, false, big).unwrap_err()), "num_splits");
        assert_eq!(arg(decode_split_bytes(4, big, 64, false, 2).unwrap_err()), "heads");
        // the largest size that fits still works
        assert!(topk_bytes(1, 1 << 20, 2048).is_ok());
    }
}
