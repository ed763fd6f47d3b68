//! The planner: the exact cases of issue 3 and property tests of ownership, lengths, pages and
//! the prefill chunk plan (docs/contract.md §2, §7, §8).

use dcp_mla::planner::{
    capacity_tokens, causal_local_lens, check_heads, check_topk, local_slot, plan_prefill_chunks, prefill_chunk_bytes,
    DcpConfig,
};
use dcp_mla::{DcpLayout, Error, KvFormat};
use proptest::prelude::*;

#[path = "common/edge_ints.rs"]
mod edge_ints;
use edge_ints::{any_u64, any_usize};

fn layout(size: usize, interleave: usize) -> DcpLayout {
    DcpLayout { size, interleave }
}

#[test]
fn local_lengths_at_d4() {
    let dcp = layout(4, 1);
    let lens = [0u64, 1, 3, 4, 5, 255, 256, 257];
    let expect: [[u64; 4]; 8] = [
        [0, 0, 0, 0],
        [1, 0, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
        [2, 1, 1, 1],
        [64, 64, 64, 63],
        [64, 64, 64, 64],
        [65, 64, 64, 64],
    ];
    for (&len, want) in lens.iter().zip(expect) {
        let got: Vec<u64> = (0..4).map(|r| dcp.local_len(len, r)).collect();
        assert_eq!(got, want, "L = {len}");
    }
    let pages: Vec<u64> = lens.iter().map(|&l| dcp.pages_for(l, 64)).collect();
    assert_eq!(pages, [0, 1, 1, 1, 1, 1, 1, 2]);
}

#[test]
fn mtp_causal_lengths_at_d2_rank1() {
    let dcp = layout(2, 1);
    assert_eq!(dcp.local_lens(&[5, 8], 1), vec![2, 4]);
    assert_eq!(causal_local_lens(&[5, 8], &[2, 3], dcp, 1).unwrap(), vec![2, 2, 3, 3, 4]);
}

#[test]
fn prefix_chunk_plan_at_d4() {
    let (dcp, b) = (layout(4, 1), 64);
    let lens = [131072u64, 259, 0];
    let budget = 64 << 20;
    let plan = plan_prefill_chunks(&lens, dcp, b, budget).unwrap();
    assert_eq!(plan.chunk_tokens % (b * 4), 0);
    assert!(plan.workspace_bytes <= budget);
    assert_eq!(plan.workspace_bytes, prefill_chunk_bytes(plan.chunk_tokens as u64, 4));
    // the largest multiple of B·D that fits: one more logical block would not
    assert!(prefill_chunk_bytes((plan.chunk_tokens + b * 4) as u64, 4) > budget);
    check_plan(&plan, &lens, dcp, b);
    // request 1 (259 tokens) spans two logical blocks; its rank lengths are n_r(259)
    let p1: Vec<_> = plan.chunks.iter().flat_map(|c| &c.pieces).filter(|p| p.request == 1).collect();
    let n: Vec<usize> = (0..4).map(|r| p1.iter().map(|p| p.local_len[r]).sum()).collect();
    assert_eq!(n, vec![65, 65, 65, 64]);
    assert!(plan.chunks.iter().flat_map(|c| &c.pieces).all(|p| p.request != 2));
}

/// Every request's prefix is covered by its pieces in order, each piece starts at a multiple of
/// B·D, and each piece fits its reserved rows inside the chunk's per-rank capacity.
fn check_plan(plan: &dcp_mla::planner::ChunkPlan, lens: &[u64], dcp: DcpLayout, b: usize) {
    let unit = b * dcp.size;
    assert_eq!(plan.cap_rows * dcp.size, plan.chunk_tokens);
    let mut next = vec![0usize; lens.len()];
    for c in &plan.chunks {
        assert!(!c.pieces.is_empty());
        let mut rows = 0;
        let mut out = 0;
        for p in &c.pieces {
            assert_eq!(p.global_start, next[p.request], "pieces of a request are in order");
            assert_eq!(p.global_start % unit, 0);
            assert_eq!(p.local_start, p.global_start / dcp.size);
            assert_eq!(p.row_offset, rows);
            assert_eq!(p.rows % b, 0);
            assert_eq!(p.out_offset, out);
            for r in 0..dcp.size {
                assert_eq!(p.local_len[r] as u64, dcp.local_len(p.global_len as u64, r));
                assert!(p.local_len[r] <= p.rows);
                // the piece's rows on rank r are exactly its tokens' local positions
                let lo = dcp.local_len(p.global_start as u64, r) as usize;
                assert_eq!(lo, p.local_start);
            }
            rows += p.rows;
            out += p.global_len;
            next[p.request] += p.global_len;
        }
        assert!(rows <= plan.cap_rows, "chunk over capacity");
        assert_eq!(c.tokens, out);
        assert!(c.tokens <= plan.chunk_tokens);
    }
    assert_eq!(next.iter().map(|&n| n as u64).collect::<Vec<_>>(), lens, "every prefix fully covered");
}

#[test]
fn configuration_errors_are_typed_and_named() {
    let msg = |e: Error| match e {
        Error::InvalidConfig(m) => m,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    assert!(msg(DcpConfig::new(8, 3, 1, 64).unwrap_err()).contains("tp = 8"));
    assert!(msg(DcpConfig::new(8, 4, 3, 64).unwrap_err()).contains("I = 3"));
    assert!(msg(DcpConfig::new(8, 0, 1, 64).unwrap_err()).contains("D = 0"));
    let cfg = DcpConfig::new(8, 4, 2, 64).unwrap();
    assert_eq!(cfg.logical_block(), 256);
    assert!(msg(check_topk(4, 768).unwrap_err()).contains("K = 768"));
    // the D·K % 512 rule is live: K = 256 needs D ≥ 2
    let e = msg(check_topk(1, 256).unwrap_err());
    assert!(e.contains("D = 1") && e.contains("K = 256"), "{e}");
    for d in [1, 2, 4, 8] {
        for k in [256, 512, 1024, 2048] {
            assert_eq!(check_topk(d, k).is_ok(), d * k % 512 == 0, "D = {d}, K = {k}");
        }
    }
    assert!(msg(check_heads(8, 32).unwrap_err()).contains("8·32"));
    assert!(check_heads(0, 8).is_err());
    assert_eq!(check_heads(8, 16).unwrap(), 128);
    assert!(msg(causal_local_lens(&[1u64 << 31], &[1], layout(1, 1), 0).unwrap_err()).contains("overflows"));
    assert!(msg(causal_local_lens(&[2], &[3], layout(1, 1), 0).unwrap_err()).contains("shorter"));
    assert!(causal_local_lens(&[9], &[9], layout(1, 1), 0).is_err(), "q beyond 8");
    assert!(msg(plan_prefill_chunks(&[1u64 << 31], layout(4, 1), 64, 1 << 30).unwrap_err()).contains("overflows"));
    assert!(msg(plan_prefill_chunks(&[10], layout(4, 1), 64, 1000).unwrap_err()).contains("budget"));
}

#[test]
fn capacity_and_addressing() {
    // 1 GiB per rank of FP8-656 pages of 64 tokens
    let one = capacity_tokens(1 << 30, KvFormat::Fp8_656, 64, 1);
    assert_eq!(one, (1u64 << 30) / (64 * 656) * 64);
    assert_eq!(capacity_tokens(1 << 30, KvFormat::Fp8_656, 64, 4), 4 * one);
    assert_eq!(capacity_tokens(1 << 30, KvFormat::Bf16, 64, 2), (1u64 << 30) / (64 * 1152) * 128);
    let row = [7, -1, 2];
    assert_eq!(local_slot(&row, 4, 8, 5), None, "negative page");
    assert_eq!(local_slot(&row, 4, 8, 1), Some(29));
    assert_eq!(local_slot(&row, 4, 8, 9), Some(9));
    assert_eq!(local_slot(&row, 4, 8, 12), None, "beyond the table row");
    assert_eq!(local_slot(&row, 4, 7, 1), None, "page beyond the cache");
}

fn any_layout() -> impl Strategy<Value = (DcpLayout, usize)> {
    (prop::sample::select(vec![1usize, 2, 4, 8]), prop::sample::select(vec![1usize, 2, 4, 64]))
        .prop_map(|(d, i)| (layout(d, i), 64))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn ownership_is_a_bijection((dcp, b) in any_layout(), len in 0u64..1200) {
        let mut seen = vec![vec![false; len as usize]; dcp.size];
        for t in 0..len {
            let (r, l) = (dcp.owner(t), dcp.local(t));
            prop_assert_eq!(dcp.global(l, r), t);
            prop_assert!(l < dcp.local_len(len, r), "local index within n_r");
            prop_assert!(!seen[r][l as usize]);
            seen[r][l as usize] = true;
            let (ar, col, slot) = dcp.address(t, b);
            prop_assert_eq!((ar, col * b as u64 + slot), (r, l));
        }
        let total: u64 = (0..dcp.size).map(|r| dcp.local_len(len, r)).sum();
        prop_assert_eq!(total, len);
        for (r, s) in seen.iter().enumerate() {
            // rank r's local positions are exactly 0..n_r(L)
            prop_assert_eq!(s.iter().filter(|&&x| x).count() as u64, dcp.local_len(len, r));
            prop_assert!(s.iter().take(dcp.local_len(len, r) as usize).all(|&x| x));
        }
        prop_assert_eq!(dcp.pages_for(len, b), (0..dcp.size).map(|r| dcp.local_len(len, r).div_ceil(b as u64)).max().unwrap());
    }

    #[test]
    fn causal_lengths_follow_the_rows((dcp, _b) in any_layout(), reqs in prop::collection::vec((0u64..600, 1usize..=8), 1..5)) {
        let lens: Vec<u64> = reqs.iter().map(|&(l, q)| l + q as u64).collect();
        let qs: Vec<usize> = reqs.iter().map(|&(_, q)| q).collect();
        let per_rank: Vec<Vec<i32>> = (0..dcp.size).map(|r| causal_local_lens(&lens, &qs, dcp, r).unwrap()).collect();
        let mut row = 0;
        for (&len, &q) in lens.iter().zip(&qs) {
            for j in 0..q {
                let c = len - q as u64 + 1 + j as u64;
                let sum: i64 = per_rank.iter().map(|v| v[row] as i64).sum();
                prop_assert_eq!(sum as u64, c, "the ranks together see c_j tokens");
                for (r, v) in per_rank.iter().enumerate() {
                    // a token is visible on its owner iff its global position is < c_j
                    let brute = (0..c).filter(|&t| dcp.owner(t) == r).count() as i32;
                    prop_assert_eq!(v[row], brute);
                }
                row += 1;
            }
            for (r, v) in per_rank.iter().enumerate() {
                prop_assert_eq!(v[row - 1] as u64, dcp.local_len(len, r), "the last row sees the whole request");
            }
        }
    }

    #[test]
    fn chunk_plans_cover_and_fit(
        (dcp, _) in any_layout(),
        b in prop::sample::select(vec![16usize, 64]),
        lens in prop::collection::vec(prop_oneof![Just(0u64), 0u64..5000], 0..5),
        blocks in 1u64..40,
    ) {
        let dcp = layout(dcp.size, dcp.interleave.min(b));
        let budget = prefill_chunk_bytes((b * dcp.size) as u64, dcp.size) * blocks + blocks * 7;
        let plan = plan_prefill_chunks(&lens, dcp, b, budget).unwrap();
        prop_assert!(plan.workspace_bytes <= budget);
        prop_assert_eq!(plan.chunk_tokens % (b * dcp.size), 0);
        check_plan(&plan, &lens, dcp, b);
        if lens.iter().all(|&l| l == 0) {
            prop_assert!(plan.chunks.is_empty());
        }
    }
}

/// Every D but 1, 2, 4 and 8 is refused by the config check and the decode-shape check, naming D.
#[test]
fn only_the_built_dcp_sizes_plan() {
    use dcp_mla::planner::{check_decode_shape, DCP_SIZES};
    for d in 0..=16usize {
        let built = DCP_SIZES.contains(&d);
        assert_eq!(DcpConfig::new(d.max(1) * 8, d, 1, 64).is_ok(), built, "D = {d}");
        let shape = check_decode_shape(d, 1, 1, 1, 1);
        assert_eq!(shape.is_ok(), built, "D = {d}");
        if !built {
            assert!(shape.unwrap_err().to_string().contains(&format!("D = {d}")));
        }
    }
    // the kernels the sizes stand for: the a2a combine and the top-k merge are compiled for each
    for d in DCP_SIZES {
        assert!(dcp_mla::ops::topk::global_merge_compiled(d, 2048), "topk_merge D = {d}");
    }
}

#[test]
fn decode_shape_names_what_is_out_of_range() {
    use dcp_mla::planner::check_decode_shape;
    assert_eq!(check_decode_shape(4, 16, 2, 64, 131072).unwrap(), 64);
    for ((d, h_l, q, b, ctx), needle) in [
        ((8, 32, 1, 1, 10), "heads"),
        ((4, 16, 9, 1, 10), "q = 9"),
        ((4, 16, 0, 1, 10), "q = 0"),
        ((4, 16, 1, 0, 10), "batch = 0"),
        ((4, 16, 4, 1, 3), "context = 3"),
        ((4, 16, 1, 1, 1 << 40), "context"),
        ((4, 16, 8, usize::MAX, 10), "batch·q"),
    ] {
        let e = check_decode_shape(d, h_l, q, b, ctx).unwrap_err().to_string();
        assert!(e.contains(needle), "{:?}: `{needle}` in {e}", (d, h_l, q, b, ctx));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The planner's public entry points take any integers: each gives a result or a typed
    /// error, never a panic (overflow checks are on in tests), and what a validated
    /// configuration returns is consistent.
    #[test]
    fn planner_entry_points_never_panic(
        tp in any_usize(), d in any_usize(), i in any_usize(), b in any_usize(), h_l in any_usize(),
        q in any_usize(), batch in any_usize(), k in any_usize(), sms in any_usize(), t in any_u64(),
        len in any_u64(), bytes in any_u64(), lens in proptest::collection::vec(any_u64(), 0..4),
        qs in proptest::collection::vec(any_usize(), 0..4),
    ) {
        use dcp_mla::ops::combine::a2a_aligned_slot_bytes;
        use dcp_mla::ops::decode::{decode_num_splits, decode_workspace_bytes};
        use dcp_mla::planner::{check_decode_shape, check_i32, pages_per_rank, workspace};
        let _ = check_topk(d, k);
        let _ = check_heads(d, h_l);
        let _ = check_i32("x", len as u128);
        let _ = check_decode_shape(d, h_l, q, batch, len);
        for sparse in [false, true] {
            let splits = decode_num_splits(batch, q, h_l, sparse, sms);
            prop_assert!(splits >= 1);
            let _ = decode_workspace_bytes(batch, q, h_l, sparse, splits);
            let _ = decode_workspace_bytes(batch, q, h_l, sparse, sms);
        }
        let _ = a2a_aligned_slot_bytes(batch, h_l);
        let _ = workspace::merge_ag_rs_bytes(d, batch, h_l);
        let _ = workspace::merge_a2a_bytes(d, batch, h_l);
        let _ = workspace::merge_gathered_bytes(d, batch, h_l);
        let _ = workspace::topk_bytes(d, batch, k);
        let _ = workspace::decode_out_f32_bytes(batch, q, h_l);
        let _ = prefill_chunk_bytes(len, d);
        for format in [KvFormat::Bf16, KvFormat::Fp8_656] {
            let _ = capacity_tokens(bytes, format, b, d);
            let _ = pages_per_rank(bytes, format, b);
        }
        if let Ok(cfg) = DcpConfig::new(tp, d, i, b) {
            let dcp = cfg.dcp;
            let (r, col, slot) = dcp.address(t, b);
            prop_assert!(r < dcp.size && slot < b as u64);
            prop_assert_eq!(dcp.global(col * b as u64 + slot, r), t);
            prop_assert!(dcp.local_len(len, r) <= len);
            let _ = dcp.pages_for(len, b);
            let _ = cfg.logical_block();
            let n = lens.len().min(qs.len());
            let _ = causal_local_lens(&lens[..n], &qs[..n], dcp, r);
            let _ = plan_prefill_chunks(&lens, dcp, b, bytes);
        } else if DcpConfig::new(d, d, i, b).is_err() {
            // a layout the planner refuses whatever the TP size (tp alone may be what failed)
            prop_assert!(plan_prefill_chunks(&lens, layout(d, i), b, bytes).is_err());
        }
    }
}
