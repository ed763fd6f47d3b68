//! The split-KV decode schedule (issue 5): how `P` parts (CTAs per row block) share a batch's
//! (sequence, KV tile) work so every SM gets about the same number of tiles, whatever the
//! sequences' lengths. This is the host mirror of `mla_decode_schedule` and of the piece loop of
//! the decode kernels (`kernels-src/decode/split_schedule.cuh`, `decode::for_each_piece`); the GPU tests compare the
//! device's unit prefix with [`schedule_units`] bit for bit.
//!
//! The work is a line of units. Sequence `s` owns `F + ceil(len_s / tile)` consecutive units:
//! [`SEQ_FIXED_UNITS`] = F for its fixed cost (a piece's start: Q and the first tiles' round
//! trips; its end: the last tile, the rows written, the combine) and one per tile; `U` is the
//! exclusive prefix, `U[s]..U[s + 1]`. Part `p` takes units `[p·W, (p + 1)·W)` with
//! `W = ceil(U[seqs] / P)`: a piece per sequence it touches. A sequence inside one part writes
//! its rows directly; a sequence spread over several parts writes one fp32 partial per part to
//! a workspace slot and the combine merges them. A part holds at most two such pieces (its first
//! and last sequence), so the workspace has `2·P` slots: slot `2p` for a piece that starts the
//! part, `2p + 1` for the one that ends it.

/// The sequences of a decode launch and the query rows each holds: requests with their q·H rows
/// (dense) or single query rows with their H heads (sparse: each has its own index list).
pub fn seq_shape(batch: usize, nq: usize, heads: usize, sparse: bool) -> (usize, usize) {
    // saturating: sizes beyond memory are refused by the launchers' checked arithmetic; a
    // planner query over them must not panic first
    if sparse {
        (batch.saturating_mul(nq), heads)
    } else {
        (batch, nq.saturating_mul(heads))
    }
}

/// A sequence's share of one part: tiles `[tile_begin, tile_end)` of sequence `seq`, written to
/// workspace slot `slot`, or directly to out/lse when `slot` is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub seq: usize,
    pub tile_begin: u64,
    pub tile_end: u64,
    pub slot: Option<usize>,
}

/// The units a sequence's fixed cost counts, in tiles: what a piece costs beyond its tiles. A
/// piece's start and end (Q and the first tile's round trips before its first S, ~10-12 µs on an
/// H100; the last tile and the rows' write after the stream) cost ~4 tiles of a memory-bound
/// CTA's stream each. Counted as 1, a part ending with a few tiles of the next sequence paid a
/// whole restart for them and finished last: split dense launches ran 5-6% longer (b = 64 1K-8K,
/// H = 16 and 64, against 8; 12 and more cost balance again: docs/performance.md). The decode
/// kernels' `kSeqFixedUnits` (`kernels-src/decode/split_schedule.cuh`) is this number.
pub const SEQ_FIXED_UNITS: u64 = 8;

/// Units of a sequence of `len` tokens with KV tiles of `tile` tokens.
pub fn seq_units(len: u64, tile: u64) -> u64 {
    SEQ_FIXED_UNITS + len.div_ceil(tile)
}

/// The exclusive prefix `U` (length `lens.len() + 1`) the device scheduler writes.
pub fn schedule_units(lens: &[u64], tile: u64) -> Vec<i64> {
    let mut u = Vec::with_capacity(lens.len() + 1);
    let mut acc = 0i64;
    u.push(0);
    for &l in lens {
        acc += seq_units(l, tile) as i64;
        u.push(acc);
    }
    u
}

/// Units per part: `ceil(U[seqs] / parts)`.
pub fn units_per_part(u: &[i64], parts: usize) -> i64 {
    let total = *u.last().unwrap_or(&0);
    (total + parts as i64 - 1) / parts as i64
}

/// The pieces of part `part`, in the order the kernel runs them, with the tiles the prefix counts;
/// [`piece_tiles_now`] gives the tiles a launch of other lengths (a reused schedule) computes.
pub fn part_pieces(u: &[i64], parts: usize, part: usize) -> Vec<Piece> {
    let seqs = u.len() - 1;
    let total = u[seqs];
    let w = units_per_part(u, parts);
    let (b, e) = (part as i64 * w, ((part as i64 + 1) * w).min(total));
    let mut out = Vec::new();
    if b >= e {
        return out;
    }
    // the sequence holding unit b: the last s with U[s] <= b
    let mut s = u.partition_point(|&x| x <= b) - 1;
    while s < seqs && u[s] < e {
        let (a, z) = (u[s], u[s + 1]);
        let first = a + SEQ_FIXED_UNITS as i64; // unit of tile 0
        let tile_begin = (b.max(first) - first).max(0) as u64;
        let tile_end = (e.min(z) - first).max(0) as u64;
        let (fp, lp) = (a / w, (z - 1) / w);
        let slot = (fp != lp).then(|| 2 * part + usize::from(part as i64 == fp && a > b));
        out.push(Piece { seq: s, tile_begin, tile_end: tile_end.max(tile_begin), slot });
        s += 1;
    }
    out
}

/// The tiles `[begin, end)` piece `pc` of part `part` computes in a launch whose sequence has
/// `tiles` KV tiles now: the decode kernels' rule (`for_each_piece`, `piece_tiles`). The
/// sequence's last piece (its part holds the sequence's last unit) runs to `tiles`, the others
/// keep the prefix's range, both clamped to `tiles`. With the lengths the prefix was made from
/// this is `(pc.tile_begin, pc.tile_end)`; with others (a reused schedule) every tile is still
/// computed once.
pub fn piece_tiles_now(u: &[i64], parts: usize, part: usize, pc: &Piece, tiles: u64) -> (u64, u64) {
    let w = units_per_part(u, parts);
    let e = ((part as i64 + 1) * w).min(*u.last().unwrap_or(&0));
    let end = if u[pc.seq + 1] <= e { tiles } else { pc.tile_end.min(tiles) };
    (pc.tile_begin.min(end), end)
}

/// The workspace slots holding sequence `seq`'s partials, in part order; empty when the
/// sequence lies inside one part (it wrote its rows directly).
pub fn seq_slots(u: &[i64], parts: usize, seq: usize) -> Vec<usize> {
    let w = units_per_part(u, parts);
    let (a, z) = (u[seq], u[seq + 1]);
    let (fp, lp) = (a / w, (z - 1) / w);
    if fp == lp {
        return Vec::new();
    }
    (fp..=lp).map(|q| 2 * q as usize + usize::from(q == fp && a > fp * w)).collect()
}

/// The split sequence the combine's CTAs of part `part` merge when its grid is by part
/// (`kernels-src/decode/combine.cuh`, `CombineGrid::ByPart`): the sequence holding the part's
/// last unit, when it starts in this part and runs past it. A split sequence holds the last unit
/// of its first part, so over all parts every split sequence has exactly one such part.
pub fn combine_part_owner(u: &[i64], parts: usize, part: usize) -> Option<usize> {
    let total = *u.last()?;
    let w = units_per_part(u, parts);
    let last = total.min((part as i64 + 1) * w) - 1;
    if last < part as i64 * w {
        return None;
    }
    let s = u.partition_point(|&x| x <= last) - 1;
    (u[s] / w == part as i64 && (u[s + 1] - 1) / w != part as i64).then_some(s)
}

/// The combine's part table as the schedule kernel writes it (`mla_decode_schedule`, at
/// [`crate::planner::split::SplitPlan::owner_offset`]): entry `part` is `[s, parts of s, 1 if s
/// starts after the part's first unit, 0]` for the split sequence `s` that starts in `part`
/// ([`combine_part_owner`]), else `[-1, 0, 0, 0]`.
pub fn combine_part_table(u: &[i64], parts: usize) -> Vec<[i32; 4]> {
    let mut table = vec![[-1, 0, 0, 0]; parts];
    let w = units_per_part(u, parts);
    for (s, pair) in u.windows(2).enumerate() {
        let (a, z) = (pair[0], pair[1]);
        let (fp, lp) = (a / w, (z - 1) / w);
        if fp != lp {
            table[fp as usize] = [s as i32, (lp - fp + 1) as i32, i32::from(a > fp * w), 0];
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile of every sequence is in exactly one piece, every sequence has a piece, slots
    /// are unique, and the combine's slot list is the pieces' slots.
    fn check(lens: &[u64], tile: u64, parts: usize) {
        let u = schedule_units(lens, tile);
        let mut seen: Vec<Vec<(u64, u64)>> = vec![Vec::new(); lens.len()];
        let mut slots_of: Vec<Vec<usize>> = vec![Vec::new(); lens.len()];
        let mut used = std::collections::HashSet::new();
        for p in 0..parts {
            for pc in part_pieces(&u, parts, p) {
                seen[pc.seq].push((pc.tile_begin, pc.tile_end));
                let now = piece_tiles_now(&u, parts, p, &pc, lens[pc.seq].div_ceil(tile));
                assert_eq!(now, (pc.tile_begin, pc.tile_end), "the prefix's own lengths keep the piece");
                if let Some(sl) = pc.slot {
                    assert!(sl / 2 == p, "slot {sl} of part {p}");
                    assert!(used.insert(sl), "slot {sl} used twice");
                    slots_of[pc.seq].push(sl);
                }
            }
        }
        for (s, &len) in lens.iter().enumerate() {
            let tiles = len.div_ceil(tile);
            let mut r = seen[s].clone();
            assert!(!r.is_empty(), "sequence {s} has no piece");
            r.sort();
            let mut next = 0;
            for (b, e) in r.into_iter().filter(|(b, e)| b < e) {
                assert_eq!(b, next, "gap or overlap in sequence {s}");
                assert!(e <= tiles);
                next = e;
            }
            assert_eq!(next, tiles, "sequence {s}: tiles covered");
            let covered: u64 = seen[s].iter().map(|(b, e)| e - b).sum();
            assert_eq!(covered, tiles, "sequence {s}: a tile covered twice");
            assert_eq!(seen[s].len() > 1, !slots_of[s].is_empty(), "sequence {s}: direct iff one piece");
            assert_eq!(seq_slots(&u, parts, s), slots_of[s], "sequence {s}: combine slots");
        }
        // the combine by part merges every split sequence once, at its first part
        let mut owners: Vec<usize> = (0..parts).filter_map(|p| combine_part_owner(&u, parts, p)).collect();
        let split: Vec<usize> = (0..lens.len()).filter(|&s| !slots_of[s].is_empty()).collect();
        owners.sort();
        assert_eq!(owners, split, "{lens:?} over {parts} parts: split sequences and their merging parts");
        // the schedule kernel's part table names the same owner for every part, with the
        // sequence's slots
        for (p, e) in combine_part_table(&u, parts).into_iter().enumerate() {
            match combine_part_owner(&u, parts, p) {
                None => assert_eq!(e, [-1, 0, 0, 0], "part {p} of {lens:?}"),
                Some(s) => {
                    let slots = seq_slots(&u, parts, s);
                    let first = 2 * p + e[2] as usize;
                    assert_eq!((e[0], e[1] as usize, slots[0]), (s as i32, slots.len(), first), "part {p} of {lens:?}");
                }
            }
        }
    }

    #[test]
    fn every_tile_once_every_sequence_written() {
        check(&[8192; 128], 64, 132);
        check(&[8192; 128], 64, 1);
        check(&[0, 1, 0, 0], 32, 8);
        check(&[100_000], 64, 132);
        check(&[0], 64, 132);
        check(&[65, 0, 4096, 1, 33, 32, 31, 20000, 0, 7], 32, 5);
        let mut rng = crate::rng::Rng::new(7);
        for _ in 0..300 {
            let n = 1 + rng.below(40) as usize;
            let lens: Vec<u64> = (0..n).map(|_| if rng.below(4) == 0 { 0 } else { rng.below(5000) }).collect();
            let tile = if rng.below(2) == 0 { 32 } else { 64 };
            check(&lens, tile, 1 + rng.below(140) as usize);
        }
    }

    /// A prefix made from other lengths (a reused schedule) still has every tile of the launch's
    /// lengths computed exactly once: longer, shorter and empty sequences, any part count.
    #[test]
    fn a_prefix_of_other_lengths_covers_every_tile_once() {
        let mut rng = crate::rng::Rng::new(11);
        let draw = |n: usize, rng: &mut crate::rng::Rng| -> Vec<u64> {
            (0..n).map(|_| if rng.below(4) == 0 { 0 } else { rng.below(5000) }).collect()
        };
        for round in 0..400 {
            let n = 1 + rng.below(40) as usize;
            let (made, now) = (draw(n, &mut rng), draw(n, &mut rng));
            let tile = if rng.below(2) == 0 { 32 } else { 64 };
            let parts = 1 + rng.below(140) as usize;
            let u = schedule_units(&made, tile);
            let mut seen: Vec<Vec<(u64, u64)>> = vec![Vec::new(); n];
            for p in 0..parts {
                for pc in part_pieces(&u, parts, p) {
                    seen[pc.seq].push(piece_tiles_now(&u, parts, p, &pc, now[pc.seq].div_ceil(tile)));
                }
            }
            for s in 0..n {
                let tiles = now[s].div_ceil(tile);
                let mut r = seen[s].clone();
                r.sort();
                let mut next = 0;
                for (b, e) in r.into_iter().filter(|(b, e)| b < e) {
                    assert_eq!(b, next, "round {round}: gap or overlap in sequence {s} ({made:?} → {now:?})");
                    next = e;
                }
                assert_eq!(next, tiles, "round {round}: sequence {s}'s tiles covered");
            }
        }
    }

    /// The kernels' fixed-cost units are the planner's (the GPU tests compare the device's prefix
    /// with [`schedule_units`] bit for bit; this keeps the two in step where no GPU runs).
    #[test]
    fn the_kernels_count_the_same_fixed_units() {
        let src = include_str!("../../kernels-src/decode/split_schedule.cuh");
        let want = format!("constexpr int kSeqFixedUnits = {SEQ_FIXED_UNITS};");
        assert!(src.contains(&want), "split_schedule.cuh lacks `{want}`");
    }

    #[test]
    fn parts_are_balanced() {
        // Whatever the lengths, no part gets more KV tiles than ceil(total units / parts), and
        // every part's units are tiles but for the fixed units of its sequences: what the SMs'
        // balance rests on.
        for lens in [vec![8192u64; 128], (1..=128).map(|i| 256 * i).collect(), vec![0, 1 << 20, 3, 0, 77]] {
            for parts in [1, 7, 132] {
                let u = schedule_units(&lens, 64);
                let w = units_per_part(&u, parts) as u64;
                let total = *u.last().unwrap() as u64;
                for p in 0..parts as u64 {
                    let load: u64 =
                        part_pieces(&u, parts, p as usize).iter().map(|pc| pc.tile_end - pc.tile_begin).sum();
                    assert!(load <= w, "{lens:?}: part {p} of {parts} holds {load} tiles > {w}");
                    // its units minus at most the fixed-cost units of each sequence are tiles
                    let units = total.min((p + 1) * w).saturating_sub(p * w);
                    assert!(
                        load >= units.saturating_sub(SEQ_FIXED_UNITS * lens.len() as u64),
                        "{lens:?}: part {p} of {parts}: {load} tiles"
                    );
                }
            }
        }
        // one long and many short sequences: the long one is spread over many parts
        let mut lens = vec![64u64; 100];
        lens.push(1 << 20);
        let u = schedule_units(&lens, 64);
        assert!(seq_slots(&u, 132, 100).len() > 100);
    }
}
