//! The DCP identities of the CPU reference (docs/contract.md §2-§5, §7, §9): for D ∈ {1, 2, 4, 8} and
//! I ∈ {1, 2, B}, attention over the D shards merged in each of the three merge shapes equals
//! attention over all tokens, dense and sparse; fill → flatten → reorder returns every token bit
//! for bit. Caches are poisoned with NaN before the fill, block tables are permuted.
//! With attention sinks (docs/contract.md §4), for every D in 1..=8: the shards attend without
//! the sink and each combine applies it once after merging, which equals attention over all tokens
//! with the sink.

use dcp_mla::formats::{decode_fp8_row_bf16, encode_fp8_row, KvFormat, D_LATENT, D_QK, D_ROPE, D_V};
use dcp_mla::planner::{causal_local_lens, plan_prefill_chunks, prefill_chunk_bytes};
use dcp_mla::reference::attention::{apply_sink_oracle, decode, decode_oracle, default_scale, QueryShape, Selection};
use dcp_mla::reference::fill::{fill, FillInput, PagedCache};
use dcp_mla::reference::merge::{
    a2a_combine, a2a_pack, a2a_slot_bytes, ag_rs_contribution, ag_rs_finish, merge, reduce_scatter, to_bf16,
};
use dcp_mla::reference::prefill::{flatten_chunk, reorder_chunk};
use dcp_mla::reference::tolerance::{check_attention, AttentionOracle};
use dcp_mla::reference::topk::{compact, PageTranslate};
use dcp_mla::{DcpLayout, LseBase};
use half::bf16;
use proptest::prelude::*;

use dcp_mla::rng::Rng;

/// The tokens of a batch, every position of every request, as the fill reads them.
struct Tokens {
    lens: Vec<u64>,
    ckv: Vec<bf16>,
    kpe: Vec<bf16>,
    req_idx: Vec<i32>,
    positions: Vec<i32>,
}

impl Tokens {
    fn new(lens: Vec<u64>, rng: &mut Rng) -> Self {
        let n: u64 = lens.iter().sum();
        // FP8 groups get different magnitudes so the group scales differ
        let ckv =
            (0..n as usize * D_LATENT).map(|i| bf16::from_f32(rng.unit() * (1 + (i / 128) % 4 * 3) as f32)).collect();
        let kpe = (0..n as usize * D_ROPE).map(|_| bf16::from_f32(rng.unit())).collect();
        let mut req_idx = Vec::new();
        let mut positions = Vec::new();
        for (i, &l) in lens.iter().enumerate() {
            req_idx.extend(std::iter::repeat_n(i as i32, l as usize));
            positions.extend(0..l as i32);
        }
        Tokens { lens, ckv, kpe, req_idx, positions }
    }

    fn token(&self, req: usize, pos: usize) -> usize {
        self.lens[..req].iter().sum::<u64>() as usize + pos
    }

    /// The 576 values attention and flatten must see for a token, as bf16 bits.
    fn expected_row(&self, format: KvFormat, req: usize, pos: usize) -> Vec<u16> {
        let t = self.token(req, pos);
        let (ckv, kpe) = (&self.ckv[t * D_LATENT..][..D_LATENT], &self.kpe[t * D_ROPE..][..D_ROPE]);
        match format {
            KvFormat::Bf16 => ckv.iter().chain(kpe).map(|v| v.to_bits()).collect(),
            KvFormat::Fp8_656 => {
                let mut row = [0u8; 656];
                encode_fp8_row(ckv, kpe, &mut row);
                decode_fp8_row_bf16(&row).iter().map(|v| v.to_bits()).collect()
            }
        }
    }
}

/// One rank's cache: NaN-poisoned bytes, filled with the tokens it owns, and its permuted table.
struct RankCache {
    bytes: Vec<u8>,
    table: Vec<i32>,
    max_pages: usize,
    num_pages: usize,
    block_size: usize,
    format: KvFormat,
    batch: usize,
}

impl RankCache {
    fn build(tok: &Tokens, dcp: DcpLayout, rank: usize, block_size: usize, format: KvFormat, rng: &mut Rng) -> Self {
        let batch = tok.lens.len();
        let max_pages = tok.lens.iter().map(|&l| dcp.pages_for(l, block_size)).max().unwrap_or(0).max(1) as usize;
        let num_pages = batch * max_pages + 1; // one page no request maps
        let mut perm: Vec<i32> = (0..num_pages as i32).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let table = perm[..batch * max_pages].to_vec();
        // 0xff: NaN as bf16, as e4m3 and as an fp32 scale
        let mut bytes = vec![0xffu8; num_pages * block_size * format.token_bytes()];
        let rc = RankCache { bytes: Vec::new(), table, max_pages, num_pages, block_size, format, batch };
        let input = FillInput {
            ckv: &tok.ckv,
            ckv_stride: D_LATENT,
            kpe: &tok.kpe,
            kpe_stride: D_ROPE,
            req_idx: &tok.req_idx,
            positions: &tok.positions,
        };
        fill(&input, &rc.paged(), dcp, rank, &mut bytes);
        RankCache { bytes, ..rc }
    }

    fn paged(&self) -> PagedCache<'_> {
        PagedCache {
            block_table: &self.table,
            block_table_stride: self.max_pages,
            batch: self.batch,
            max_pages: self.max_pages,
            num_pages: self.num_pages,
            block_size: self.block_size,
            format: self.format,
        }
    }

    fn translate(&self, q: usize) -> PageTranslate<'_> {
        PageTranslate {
            block_table: &self.table,
            stride: self.max_pages,
            block_size: self.block_size,
            rows_per_request: q,
        }
    }
}

/// Elementwise closeness within abs or rel (the f64 identity's rounding); inf/NaN positions exact.
fn assert_close(what: &str, got: &[f32], want: &[f64], abs: f64, rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        if !w.is_finite() || !g.is_finite() {
            assert!(g == w || (g.is_nan() && w.is_nan()), "{what}[{i}]: {g} vs {w}");
            continue;
        }
        assert!((g - w).abs() <= abs || (g - w).abs() <= rel * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

/// Rows of heads [h0, h0 + h_l) of a [T, H, w] tensor.
fn heads<T: Copy>(x: &[T], t: usize, h: usize, h0: usize, h_l: usize, w: usize) -> Vec<T> {
    (0..t).flat_map(|ti| x[(ti * h + h0) * w..(ti * h + h0 + h_l) * w].to_vec()).collect()
}

#[derive(Debug, Clone)]
struct Case {
    dcp: DcpLayout,
    block_size: usize,
    format: KvFormat,
    q: usize,
    h_l: usize,
    lens: Vec<u64>,
    sparse: bool,
    base: LseBase,
    /// With per-head attention sinks, drawn from the seed: finite, −inf and +inf.
    sink: bool,
    seed: u64,
}

/// One sink per head of H: −inf (no effect) and +inf (out = 0) one in six each, else finite in
/// [−8, 16), around and beyond the rows' lse. From its own generator, so a case's other inputs do
/// not depend on whether it has sinks.
fn draw_sinks(seed: u64, h: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed ^ 0x5149_4e4b_5349_4e4b);
    (0..h)
        .map(|_| match rng.below(6) {
            0 => f32::NEG_INFINITY,
            1 => f32::INFINITY,
            _ => 4.0 + 12.0 * rng.unit(),
        })
        .collect()
}

/// Runs one case: the full-cache oracle (D = 1, f64) against the D shards merged three ways.
fn check_identity(c: &Case) {
    let mut rng = Rng::new(c.seed);
    let (d, q, h_l) = (c.dcp.size, c.q, c.h_l);
    let h = d * h_l;
    let b = c.lens.len();
    let t = b * q;
    let tok = Tokens::new(c.lens.clone(), &mut rng);
    let one = DcpLayout { size: 1, interleave: 1 };
    let full = RankCache::build(&tok, one, 0, c.block_size, c.format, &mut rng);
    let shards: Vec<RankCache> =
        (0..d).map(|r| RankCache::build(&tok, c.dcp, r, c.block_size, c.format, &mut rng)).collect();
    let query: Vec<bf16> = (0..t * h * D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect();
    let shape = QueryShape { batch: b, rows: q, heads: h };
    let qs = vec![q; b];
    let sigma = default_scale();
    // the sinks of the H gathered heads; rank r's combine applies those of its heads [r·H_l, (r+1)·H_l)
    let sink: Option<Vec<f32>> = c.sink.then(|| draw_sinks(c.seed, h));
    let rank_sink = |rank: usize| sink.as_ref().map(|s| &s[rank * h_l..(rank + 1) * h_l]);

    // sparse: each row picks up to kk global positions it may see (c_j), with -1 entries between;
    // one row in four is all -1 on purpose (a row that attends to nothing)
    let kk = 12;
    let mut ids = vec![-1i32; t * kk];
    if c.sparse {
        for i in 0..b {
            for j in 0..q {
                let c_j = c.lens[i] - q as u64 + 1 + j as u64;
                let all_empty = rng.below(4) == 0;
                for e in &mut ids[(i * q + j) * kk..][..kk] {
                    if c_j > 0 && !all_empty && rng.below(4) != 0 {
                        *e = rng.below(c_j) as i32;
                    }
                }
            }
        }
    }
    let run_f64 = |dcp: DcpLayout, rank: usize, rc: &RankCache| -> AttentionOracle {
        if c.sparse {
            let (idx, counts) = compact(&ids, kk, dcp, rank, Some(rc.translate(q)));
            decode_oracle(
                &query,
                shape,
                &rc.paged(),
                &rc.bytes,
                &Selection::Sparse { indices: &idx, k: kk, topk_len: Some(&counts) },
                sigma,
            )
        } else {
            let lens = causal_local_lens(&c.lens, &qs, dcp, rank).unwrap();
            decode_oracle(&query, shape, &rc.paged(), &rc.bytes, &Selection::Dense { lens: &lens }, sigma)
        }
    };
    let run_f32 = |rank: usize, rc: &RankCache| -> (Vec<f32>, Vec<f32>) {
        if c.sparse {
            let (idx, counts) = compact(&ids, kk, c.dcp, rank, Some(rc.translate(q)));
            decode::<f32>(
                &query,
                shape,
                &rc.paged(),
                &rc.bytes,
                &Selection::Sparse { indices: &idx, k: kk, topk_len: Some(&counts) },
                sigma,
            )
        } else {
            let lens = causal_local_lens(&c.lens, &qs, c.dcp, rank).unwrap();
            decode::<f32>(&query, shape, &rc.paged(), &rc.bytes, &Selection::Dense { lens: &lens }, sigma)
        }
    };
    // docs/contract.md §9's oracle (out, lse and A_c) over all tokens, on one rank: with sinks, the
    // sink applied to that one result
    let mut oracle = run_f64(one, 0, &full);
    if let Some(s) = &sink {
        apply_sink_oracle(&mut oracle, s);
    }
    let (want_out, want_lse) = (&oracle.out, &oracle.lse);
    assert!(want_out.iter().all(|x| !x.is_nan()), "the oracle never reads a poisoned slot");
    let oracle_heads = |rank: usize| AttentionOracle {
        out: heads(&oracle.out, t, h, rank * h_l, h_l, D_V),
        lse: heads(&oracle.lse, t, h, rank * h_l, h_l, 1),
        mean_abs_v: heads(&oracle.mean_abs_v, t, h, rank * h_l, h_l, D_V),
    };
    let spec9 = |what: &str, o: &[f32], l: &[f32], want: &AttentionOracle| {
        if let Err(e) = check_attention(what, o.iter().map(|&x| x as f64), l.iter().map(|&x| x as f64), want) {
            panic!("{e}");
        }
    };

    // f64 shards (no sink) merged in f64 (the sink applied once, after): the identity itself, to rounding
    let parts64: Vec<_> = (0..d).map(|r| run_f64(c.dcp, r, &shards[r])).collect();
    let (o, l) = merge(
        &parts64.iter().flat_map(|p| p.out.clone()).collect::<Vec<_>>(),
        &parts64.iter().flat_map(|p| p.lse.clone()).collect::<Vec<_>>(),
        d,
        t * h,
        LseBase::E,
        sink.as_deref(),
    );
    let o32: Vec<f32> = o.iter().map(|&x| x as f32).collect();
    let l32: Vec<f32> = l.iter().map(|&x| x as f32).collect();
    assert_close("f64 identity out", &o32, want_out, 1e-6, 1e-6);
    assert_close("f64 identity lse", &l32, want_lse, 1e-6, 0.0);

    // f32 shards, as the kernels produce them
    let parts: Vec<_> = (0..d).map(|r| run_f32(r, &shards[r])).collect();
    let outs: Vec<f32> = parts.iter().flat_map(|p| p.0.clone()).collect();
    let lse_e: Vec<f32> = parts.iter().flat_map(|p| p.1.clone()).collect();
    // the producer's base: base 2 lse is lse / ln 2
    let lse_in: Vec<f32> = match c.base {
        LseBase::E => lse_e.clone(),
        LseBase::Two => lse_e.iter().map(|&x| x / std::f32::consts::LN_2).collect(),
    };

    // shape 1: the plain merge
    let (o, l) = merge(&outs, &lse_in, d, t * h, c.base, sink.as_deref());
    spec9("merge", &o, &l, &oracle);

    // shape 2: ag_rs. Contribution, reduce-scatter over heads, finish, cast to bf16
    let contribs: Vec<Vec<f32>> =
        (0..d).map(|r| ag_rs_contribution(r, &parts[r].0, &lse_in, d, t, h, c.base)).collect();
    for rank in 0..d {
        let summed = reduce_scatter(&contribs, rank, h_l, t);
        let (o, l) = ag_rs_finish(&summed, &lse_in, d, t, h_l, c.base, rank * h_l, rank_sink(rank));
        let want = oracle_heads(rank);
        spec9("ag_rs", &o, &l, &want);
        let cast: Vec<f32> = to_bf16(&o).iter().map(|v| v.to_f32()).collect();
        spec9("ag_rs bf16", &cast, &l, &want);
    }

    // shape 3: a2a with bf16 partials; empty shards report FlashMLA's +inf and a NaN out
    let slot = a2a_slot_bytes(t, h_l);
    let packed: Vec<Vec<u8>> = (0..d)
        .map(|r| {
            let mut out = to_bf16(&parts[r].0);
            let mut lse = lse_in[r * t * h..(r + 1) * t * h].to_vec();
            for (row, l) in lse.iter_mut().enumerate() {
                if *l == f32::NEG_INFINITY {
                    *l = f32::INFINITY;
                    out[row * D_V..(row + 1) * D_V].fill(bf16::NAN);
                }
            }
            a2a_pack(&out, &lse, d, t, h)
        })
        .collect();
    // bf16 partials: docs/contract.md §9's 2^-6·A_c covers their rounding (2^-8·A_c) beside the kernel's
    for rank in 0..d {
        let recv: Vec<u8> = packed.iter().flat_map(|p| p[rank * slot..(rank + 1) * slot].to_vec()).collect();
        let (o, l) = a2a_combine(&recv, d, t, h_l, c.base, rank_sink(rank));
        spec9("a2a", &o, &l, &oracle_heads(rank));
    }
}

fn case_strategy(sparse: bool, ds: Vec<usize>, sink: bool) -> impl Strategy<Value = Case> {
    (
        prop::sample::select(ds),
        0usize..3,
        // pages of 4 and 8 tokens make many pages per request; 64 is the engines' usual size
        prop::sample::select(vec![4usize, 8, 64]),
        any::<bool>(),
        1usize..=3,
        1usize..=2,
        prop::collection::vec((0usize..6, 0u64..200), 1..=2),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(move |(d, i, block_size, fp8, q, h_l, lens, base2, seed)| {
            let interleave = [1, 2, block_size][i];
            // lengths 0 (which a decode step makes q: the request's own new tokens), 1, B − 1,
            // B, B + 1 and random, drawn on purpose; per-rank lengths of 0 (empty shards) follow
            // from short requests at large D
            let special = |(k, r): (usize, u64)| -> u64 {
                let l = [0, 1, block_size as u64 - 1, block_size as u64, block_size as u64 + 1, r][k];
                l.max(q as u64)
            };
            Case {
                dcp: DcpLayout { size: d, interleave },
                block_size,
                format: if fp8 { KvFormat::Fp8_656 } else { KvFormat::Bf16 },
                q,
                h_l,
                lens: lens.into_iter().map(special).collect(),
                sparse,
                base: if base2 { LseBase::Two } else { LseBase::E },
                sink,
                seed,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn dense_dcp_identity(c in case_strategy(false, vec![1, 2, 4, 8], false)) {
        check_identity(&c);
    }

    #[test]
    fn sparse_dcp_identity(c in case_strategy(true, vec![1, 2, 4, 8], false)) {
        check_identity(&c);
    }

    /// Sinks under DCP: D in 1..=8 (not only the powers of two), each combine applying the
    /// sinks of its heads once, after merging; equals one rank over all tokens with the sinks.
    #[test]
    fn dense_dcp_identity_with_sinks(c in case_strategy(false, (1..=8).collect(), true)) {
        check_identity(&c);
    }

    #[test]
    fn sparse_dcp_identity_with_sinks(c in case_strategy(true, (1..=8).collect(), true)) {
        check_identity(&c);
    }

    #[test]
    fn fill_flatten_reorder_roundtrip(
        d in prop::sample::select(vec![1usize, 2, 4, 8]),
        i in 0usize..3,
        block_size in prop::sample::select(vec![4usize, 8, 16]),
        fp8 in any::<bool>(),
        lens in prop::collection::vec(prop_oneof![Just(0u64), 0u64..300], 1..4),
        blocks in 1u64..6,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let dcp = DcpLayout { size: d, interleave: [1, 2, block_size][i] };
        let format = if fp8 { KvFormat::Fp8_656 } else { KvFormat::Bf16 };
        let tok = Tokens::new(lens.clone(), &mut rng);
        let shards: Vec<RankCache> = (0..d).map(|r| RankCache::build(&tok, dcp, r, block_size, format, &mut rng)).collect();
        let budget = prefill_chunk_bytes((block_size * d) as u64, d) * blocks;
        let plan = plan_prefill_chunks(&lens, dcp, block_size, budget).unwrap();
        let mut seen = 0u64;
        for ci in 0..plan.chunks.len() {
            let flat: Vec<Vec<bf16>> = (0..d)
                .map(|r| flatten_chunk(&plan, ci, r, &shards[r].paged(), &shards[r].bytes))
                .collect();
            for (r, f) in flat.iter().enumerate() {
                prop_assert_eq!(f.len(), plan.cap_rows * D_QK);
                // rows a piece reserves beyond its local length, and rows no piece uses, are zero
                let mut used = vec![false; plan.cap_rows];
                for p in &plan.chunks[ci].pieces {
                    used[p.row_offset..p.row_offset + p.local_len[r]].iter_mut().for_each(|u| *u = true);
                }
                for (row, u) in used.iter().enumerate() {
                    if !u {
                        prop_assert!(f[row * D_QK..(row + 1) * D_QK].iter().all(|v| v.to_bits() == 0), "rank {} row {} not zero", r, row);
                    }
                }
            }
            let gathered: Vec<bf16> = flat.concat();
            let out = reorder_chunk(&plan, ci, &gathered, dcp);
            for p in &plan.chunks[ci].pieces {
                for g in 0..p.global_len {
                    let got: Vec<u16> = out[(p.out_offset + g) * D_QK..][..D_QK].iter().map(|v| v.to_bits()).collect();
                    prop_assert_eq!(got, tok.expected_row(format, p.request, p.global_start + g), "request {} token {}", p.request, p.global_start + g);
                }
                seen += p.global_len as u64;
            }
        }
        prop_assert_eq!(seen, lens.iter().sum::<u64>());
    }
}

/// A fixed case where every rank but one is empty for the first rows (L = q = 1 at D = 8).
#[test]
fn one_token_at_d8_leaves_seven_ranks_empty() {
    for sparse in [false, true] {
        check_identity(&Case {
            dcp: DcpLayout { size: 8, interleave: 1 },
            block_size: 4,
            format: KvFormat::Fp8_656,
            q: 1,
            h_l: 1,
            lens: vec![1, 2],
            sparse,
            base: LseBase::E,
            sink: false,
            seed: 7,
        });
    }
}

/// The same with sinks at D = 8 and D = 7: rows whose only token sits on one rank, and sparse rows
/// that attend to nothing (which must stay 0 whatever the sink).
#[test]
fn one_token_with_sinks_at_d8_and_d7() {
    for (d, seed) in [(8, 7), (7, 11)] {
        for sparse in [false, true] {
            check_identity(&Case {
                dcp: DcpLayout { size: d, interleave: 1 },
                block_size: 4,
                format: KvFormat::Bf16,
                q: 1,
                h_l: 2,
                lens: vec![1, 2],
                sparse,
                base: LseBase::E,
                sink: true,
                seed,
            });
        }
    }
}
