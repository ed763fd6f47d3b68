//! Distributed top-k (docs/contract.md §6): local top-k on each shard, pack, global merge and compaction
//! equal one top-K over all tokens exactly, with heavy ties, NaN and −0.

use dcp_mla::reference::topk::{compact, global_merge, local_topk, pack_candidates};
use dcp_mla::DcpLayout;
use proptest::prelude::*;

/// A tie-heavy score alphabet: NaN counts as −inf, −0 equals +0.
fn score() -> impl Strategy<Value = f32> {
    prop::sample::select(vec![0.0f32, -0.0, 1.0, 2.0, 2.0, 2.0, f32::NAN, f32::NEG_INFINITY, -1.0, 3.5])
}

/// Runs the distributed pipeline on `rows` global rows of `scores` (stride n) with per-row
/// lengths `lens`; returns the merged ids [rows, k] and checks the compaction on the way.
fn distributed(scores: &[f32], n: usize, lens: &[i32], dcp: DcpLayout, k: usize) -> Vec<i32> {
    let (rows, d) = (lens.len(), dcp.size);
    let mut cand_s = Vec::new();
    let mut cand_i = Vec::new();
    for r in 0..d {
        // rank r's scores: its local positions, with a stride wider than needed and garbage after
        let stride = dcp.local_len(n as u64, r) as usize + 3;
        let mut local = vec![f32::INFINITY; rows * stride];
        let mut local_lens = Vec::new();
        for row in 0..rows {
            for l in 0..dcp.local_len(n as u64, r) {
                local[row * stride + l as usize] = scores[row * n + dcp.global(l, r) as usize];
            }
            local_lens.push(dcp.local_len(lens[row] as u64, r) as i32);
        }
        let idx = local_topk(&local, rows, stride, stride, &local_lens, k);
        let (s, i) = pack_candidates(&idx, &local, stride, stride, k, dcp, r);
        cand_s.extend(s);
        cand_i.extend(i);
    }
    let merged = global_merge(&cand_s, &cand_i, d, rows, k);
    // the output is a subsequence of the valid candidates, in candidate order
    for row in 0..rows {
        let cands: Vec<i32> =
            (0..d).flat_map(|r| cand_i[(r * rows + row) * k..][..k].to_vec()).filter(|&x| x >= 0).collect();
        let mut it = cands.iter();
        for &g in merged[row * k..(row + 1) * k].iter().take_while(|&&g| g >= 0) {
            assert!(it.any(|&c| c == g), "row {row}: {g} out of candidate order");
        }
    }
    // compaction: the ranks' owned ids, mapped back, partition the merged ids in order
    let mut back: Vec<Vec<i32>> = vec![Vec::new(); rows];
    for r in 0..d {
        let (local, counts) = compact(&merged, k, dcp, r, None);
        for row in 0..rows {
            let c = counts[row] as usize;
            let kept = &local[row * k..(row + 1) * k];
            assert!(kept[c..].iter().all(|&x| x == -1), "padding after the count");
            let owned: Vec<i32> = merged[row * k..(row + 1) * k]
                .iter()
                .copied()
                .filter(|&g| g >= 0 && dcp.owner(g as u64) == r)
                .collect();
            let mapped: Vec<i32> = kept[..c].iter().map(|&l| dcp.global(l as u64, r) as i32).collect();
            assert_eq!(mapped, owned, "rank {r} row {row}: stable compaction of its own ids");
            back[row].extend(mapped);
        }
    }
    for row in 0..rows {
        let valid = merged[row * k..(row + 1) * k].iter().filter(|&&g| g >= 0).count();
        assert_eq!(back[row].len(), valid);
    }
    merged
}

fn sorted_valid(x: &[i32]) -> Vec<i32> {
    let mut v: Vec<i32> = x.iter().copied().filter(|&g| g >= 0).collect();
    v.sort_unstable();
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn distributed_topk_equals_global_topk(
        d in prop::sample::select(vec![1usize, 2, 4, 8]),
        interleave in prop::sample::select(vec![1usize, 2, 4, 64]),
        k in prop::sample::select(vec![1usize, 4, 16, 64, 256]),
        // lengths around K and around each rank's share of K are the edges: n reaches 2,000
        n in prop_oneof![0usize..160, 160usize..2000],
        rows in 1usize..4,
        seed_scores in prop::collection::vec(score(), 500),
        // explicit length kinds per row: 0, K − 1, K, K + 1, n, and a random fraction of n
        len_kind in prop::collection::vec((0usize..6, 0u32..=100), 3),
    ) {
        let dcp = DcpLayout { size: d, interleave };
        // scores cycle with a period coprime to most n: ties across ranks and rows
        let scores: Vec<f32> = (0..rows * n).map(|i| seed_scores[(i * 7 + i / 3) % seed_scores.len()]).collect();
        let lens: Vec<i32> = (0..rows)
            .map(|r| {
                let (kind, frac) = len_kind[r];
                let l = [0, k.saturating_sub(1), k, k + 1, n, n * frac as usize / 100][kind];
                l.min(n) as i32
            })
            .collect();
        let merged = distributed(&scores, n, &lens, dcp, k);
        let global = local_topk(&scores, rows, n, n, &lens, k);
        for row in 0..rows {
            prop_assert_eq!(sorted_valid(&merged[row * k..(row + 1) * k]), sorted_valid(&global[row * k..(row + 1) * k]), "row {}", row);
        }
    }
}

#[test]
fn realistic_size_at_d4_k512() {
    // 4096 tokens, scores from 64 distinct values: many ties across ranks
    let (n, k, rows) = (4096usize, 512, 2);
    let mut x = 0x2545_F491u64;
    let scores: Vec<f32> = (0..rows * n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 64) as f32 - 20.0
        })
        .collect();
    let lens = [n as i32, 3000];
    for dcp in [DcpLayout { size: 4, interleave: 1 }, DcpLayout { size: 4, interleave: 64 }] {
        let merged = distributed(&scores, n, &lens, dcp, k);
        let global = local_topk(&scores, rows, n, n, &lens, k);
        for row in 0..rows {
            assert_eq!(sorted_valid(&merged[row * k..(row + 1) * k]), sorted_valid(&global[row * k..(row + 1) * k]));
        }
    }
}

#[test]
fn issue_compaction_case() {
    let (ids, counts) = compact(&[1, 8, 3, -1, 6, 4], 6, DcpLayout { size: 2, interleave: 1 }, 0, None);
    assert_eq!(ids, vec![4, 3, 2, -1, -1, -1]);
    assert_eq!(counts, vec![3]);
}

#[test]
fn ids_above_2_pow_24_survive() {
    // local 2^24 + 1 on rank 1 of D = 2: global 2^25 + 3, not representable as f32
    let dcp = DcpLayout { size: 2, interleave: 1 };
    let l = (1usize << 24) + 1;
    let mut scores = vec![0.0f32; l + 1];
    scores[l] = 5.0;
    let idx = local_topk(&scores, 1, l + 1, l + 1, &[(l + 1) as i32], 1);
    assert_eq!(idx, vec![l as i32]);
    let (s, ids) = pack_candidates(&idx, &scores, l + 1, l + 1, 1, dcp, 1);
    assert_eq!((s[0], ids[0]), (5.0, (1 << 25) + 3));
    let merged = global_merge(&[f32::NEG_INFINITY, 5.0], &[-1, ids[0]], 2, 1, 1);
    assert_eq!(merged, vec![(1 << 25) + 3]);
    assert_eq!(compact(&merged, 1, dcp, 1, None).0, vec![l as i32]);
}
