//! Workspace sizes of every operation (SPEC.md §8): the caller allocates them once, launchers
//! never allocate. Sizes are bytes; layouts are row-major as the reference documents them.

use crate::formats::D_V;
use crate::reference::merge::a2a_slot_bytes;

/// ag_rs merge of T rows on one rank with H_l local heads in a group of D: the all-gathered lse
/// [D, T, H] fp32 and the head-major fp32 contribution [H, T, 512], with H = D·H_l gathered heads,
/// plus the reduce-scattered sum [H_l, T, 512] fp32.
pub fn merge_ag_rs_bytes(d: usize, t: usize, h_l: usize) -> u64 {
    let (d, t, h_l) = (d as u64, t as u64, h_l as u64);
    let h = d * h_l;
    d * t * h * 4 + h * t * D_V as u64 * 4 + h_l * t * D_V as u64 * 4
}

/// One a2a slot as the launchers take it: [`a2a_slot_bytes`] (T·H_l·(1024 + 4)) rounded up to a
/// multiple of 16 bytes, so that every slot of a [D, slot] buffer starts 16-byte aligned (the
/// combine kernels use 16-byte vectors). Equals the tight size whenever T·H_l is a multiple of 4.
pub fn a2a_slot_bytes_aligned(t: usize, h_l: usize) -> usize {
    a2a_slot_bytes(t, h_l).next_multiple_of(16)
}

/// a2a merge: a send and a receive buffer of [D, slot] each, slot = [`a2a_slot_bytes_aligned`];
/// the D slots together carry the gathered D·H_l heads.
pub fn merge_a2a_bytes(d: usize, t: usize, h_l: usize) -> u64 {
    2 * d as u64 * a2a_slot_bytes_aligned(t, h_l) as u64
}

/// The plain merge of D gathered partials of T rows of H_l heads: out [D, T, H_l, 512] fp32 and
/// lse [D, T, H_l] fp32.
pub fn merge_gathered_bytes(d: usize, t: usize, h_l: usize) -> u64 {
    d as u64 * t as u64 * h_l as u64 * (D_V as u64 * 4 + 4)
}

/// Distributed top-k of `rows` rows: this rank's local top-k [rows, K] int32, its packed
/// candidates (fp32 score + int32 id) [rows, K], the all-gathered candidates [D, rows, K] of
/// both, and the merged ids [rows, K] int32.
pub fn topk_bytes(d: usize, rows: usize, k: usize) -> u64 {
    let rk = rows as u64 * k as u64;
    rk * 4 + rk * 8 + d as u64 * rk * 8 + rk * 4
}

/// A rank's decode result in fp32 (what the ag_rs combine reads): out [b, q, H, 512] and lse
/// [b, q, H], H being the gathered heads D·H_l.
pub fn decode_out_f32_bytes(b: usize, q: usize, h: usize) -> u64 {
    b as u64 * q as u64 * h as u64 * (D_V as u64 * 4 + 4)
}

/// The split-KV decode workspace (src/planner/schedule.rs): the int64 unit prefix of the
/// sequences (16-byte aligned), then fp32 partial out [2·parts, rows per sequence, 512] and lse
/// [2·parts, rows per sequence]; 0 for one part. A sequence is a request (dense: q·H rows) or
/// one query row of a request (sparse: H rows).
pub fn decode_split_bytes(b: usize, q: usize, h: usize, sparse: bool, parts: usize) -> u64 {
    if parts <= 1 {
        return 0;
    }
    let (seqs, rows) = super::schedule::seq_shape(b, q, h, sparse);
    super::schedule::prefix_bytes(seqs) as u64 + 2 * parts as u64 * rows as u64 * (D_V as u64 * 4 + 4)
}
