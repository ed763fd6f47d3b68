//! The MODEL1 path of the CPU reference (docs/contract.md §3-§4, "MODEL1"; docs/semantics.md):
//! - the page-wise FP8 codec round-trips: dequantise(quantise(x)) is the documented rounding, and
//!   quantise(dequantise(bytes)) gives the same bytes for every canonical tile (the same values
//!   for every tile with a finite scale the fill can write);
//! - decode over two sources equals decode over one cache holding both sets of rows, bit for bit;
//! - the DCP identity: both caches sharded by §2's ownership over D ranks (the fill writing each
//!   token on its owner only), D rank-local decodes merged by the combine equal one rank over all
//!   tokens, with and without sinks;
//! - the fill writes exactly the owner rank's slot of every token and no other byte.
//!
//! Caches are poisoned with 0xff (NaN as e4m3, as a ue8m0 scale and as bf16) before they are
//! filled, block tables are permuted.

use dcp_mla::formats::model1::{
    decode_model1_token, decode_model1_token_bf16, dequantize_model1_cache, encode_model1_token,
    model1_tile_is_canonical, quantize_model1_cache, Model1Pages, MODEL1_D_NOPE, MODEL1_D_QK, MODEL1_D_V,
    MODEL1_PAGE_ALIGN, MODEL1_TILE, MODEL1_TILES,
};
use dcp_mla::formats::{e4m3_decode, e4m3_encode, fp8_group_scale, D_ROPE};
use dcp_mla::reference::attention::{apply_sink_oracle, QueryShape};
use dcp_mla::reference::fill::FillInput;
use dcp_mla::reference::merge::{a2a_combine, a2a_pack, a2a_slot_bytes, merge, to_bf16};
use dcp_mla::reference::model1::{
    decode_model1, decode_model1_oracle, fill_model1, model1_default_scale, Model1Cache, Model1Source,
};
use dcp_mla::reference::tolerance::{check_attention, AttentionOracle};
use dcp_mla::reference::topk::{compact, PageTranslate};
use dcp_mla::rng::Rng;
use dcp_mla::{DcpLayout, LseBase};
use half::bf16;
use proptest::prelude::*;

/// A random MODEL1 row: tiles of different magnitudes (so their scales differ), now and then an
/// all-zero tile or one below the 2^-13 scale floor; with `wide` (the codec's tests) also tiles
/// of magnitude 3000. Attention's tests keep |v| ≤ 10 as the 576 path's tests do: scores in the
/// thousands would underflow p in f32 where the f64 oracle keeps it (a limit of f32, not of the
/// path under test).
fn random_row(rng: &mut Rng, wide: bool) -> Vec<bf16> {
    let mut row = Vec::with_capacity(MODEL1_D_QK);
    for t in 0..MODEL1_TILES {
        let mag = match rng.below(8) {
            0 => 0.0,
            1 => 1e-6,
            2 if wide => 3000.0,
            _ => (1 + t % 4 * 3) as f32,
        };
        row.extend((0..MODEL1_TILE).map(|_| bf16::from_f32(rng.unit() * mag)));
    }
    row.extend((0..D_ROPE).map(|_| bf16::from_f32(rng.unit() * 2.0)));
    row
}

fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// quantise → dequantise is the documented rounding of every value, and what it writes is
    /// canonical where it must be; quantise(dequantise(bytes)) returns the bytes.
    #[test]
    fn codec_roundtrip(
        num_pages in 1usize..=3,
        block_size in prop::sample::select(vec![1usize, 2, 3, 5, 64]),
        extra_units in 0usize..=2,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let mut pages = Model1Pages::new(num_pages, block_size);
        pages.page_stride += extra_units * MODEL1_PAGE_ALIGN; // a view with a larger page stride
        prop_assert_eq!(pages.page_stride % MODEL1_PAGE_ALIGN, 0);
        let rows: Vec<bf16> = (0..pages.slots()).flat_map(|_| random_row(&mut rng, true)).collect();
        let bytes = quantize_model1_cache(&rows, &pages);
        prop_assert_eq!(bytes.len(), pages.cache_bytes());
        for slot in 0..pages.slots() {
            let x = &rows[slot * MODEL1_D_QK..][..MODEL1_D_QK];
            let d = decode_model1_token(&bytes, &pages, slot);
            for t in 0..MODEL1_TILES {
                let tile = &x[t * MODEL1_TILE..][..MODEL1_TILE];
                let scale = fp8_group_scale(tile.iter().fold(0f32, |m, v| m.max(v.to_f32().abs())));
                for i in 0..MODEL1_TILE {
                    let (xi, di) = (tile[i].to_f32(), d[t * MODEL1_TILE + i]);
                    // the documented rounding: e4m3(x / scale), nearest even, saturating, times scale
                    prop_assert!(same_f32(di, e4m3_decode(e4m3_encode(xi / scale)) * scale));
                    // within half an e4m3 step: 2^-4 relative, 2^-10·scale absolute below the normals
                    prop_assert!((di - xi).abs() <= (xi.abs() / 16.0).max(scale * f32::powi(2.0, -10)), "{} vs {}", xi, di);
                }
            }
            for i in MODEL1_D_NOPE..MODEL1_D_QK {
                prop_assert_eq!(d[i], x[i].to_f32());
            }
            // bf16 dequantisation is exact and keeps the rope bits
            let b = decode_model1_token_bf16(&bytes, &pages, slot);
            for i in 0..MODEL1_D_QK {
                prop_assert!(same_f32(b[i].to_f32(), d[i]));
            }
            prop_assert_eq!(&b[MODEL1_D_NOPE..], &x[MODEL1_D_NOPE..]);
        }
        // quantise(dequantise(bytes)): the same values always, the same bytes for canonical tiles
        let again = quantize_model1_cache(&dequantize_model1_cache(&bytes, &pages), &pages);
        for slot in 0..pages.slots() {
            let (ro, so) = (pages.row_offset(slot), pages.scale_offset(slot));
            for t in 0..MODEL1_TILES {
                let codes = &bytes[ro + t * MODEL1_TILE..][..MODEL1_TILE];
                if model1_tile_is_canonical(bytes[so + t], codes) {
                    prop_assert_eq!(again[so + t], bytes[so + t]);
                    prop_assert_eq!(&again[ro + t * MODEL1_TILE..][..MODEL1_TILE], codes);
                }
            }
            prop_assert_eq!(&again[ro + MODEL1_D_NOPE..ro + MODEL1_D_QK + D_ROPE], &bytes[ro + MODEL1_D_NOPE..ro + MODEL1_D_QK + D_ROPE]);
            let (a, b) = (decode_model1_token(&again, &pages, slot), decode_model1_token(&bytes, &pages, slot));
            prop_assert!(a.iter().zip(&b).all(|(&a, &b)| same_f32(a, b)), "slot {}", slot);
        }
    }

    /// Arbitrary bytes: every tile with a scale byte the fill writes (114..=247) and finite values
    /// keeps its values through dequantise → quantise → dequantise, and canonical tiles keep their
    /// bytes. Scale bytes up to 240 keep every value finite (448·2^113 < 2^128).
    #[test]
    fn codec_fixed_point_on_any_bytes(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let pages = Model1Pages::new(1, 4);
        let mut bytes: Vec<u8> = (0..pages.cache_bytes()).map(|_| rng.below(256) as u8).collect();
        for slot in 0..4 {
            for t in 0..MODEL1_TILES {
                bytes[pages.scale_offset(slot) + t] = 114 + rng.below(127) as u8;
            }
        }
        let again = quantize_model1_cache(&dequantize_model1_cache(&bytes, &pages), &pages);
        for slot in 0..4 {
            let (a, b) = (decode_model1_token(&again, &pages, slot), decode_model1_token(&bytes, &pages, slot));
            prop_assert!(a.iter().zip(&b).all(|(&a, &b)| same_f32(a, b)), "slot {}", slot);
            let (ro, so) = (pages.row_offset(slot), pages.scale_offset(slot));
            for t in 0..MODEL1_TILES {
                let codes = &bytes[ro + t * MODEL1_TILE..][..MODEL1_TILE];
                if model1_tile_is_canonical(bytes[so + t], codes) {
                    prop_assert_eq!(&again[ro + t * MODEL1_TILE..][..MODEL1_TILE], codes);
                }
            }
        }
    }
}

/// A tile whose largest value rounds down to 224·scale is not canonical: it re-quantises with half
/// the scale (other bytes, the same values).
#[test]
fn non_canonical_tile_keeps_its_values() {
    let pages = Model1Pages::new(1, 1);
    let mut row = vec![bf16::ZERO; MODEL1_D_QK];
    row[0] = bf16::from_f32(225.0 / 256.0); // amax / 448 ≈ 0.00196 → scale 2^-8; 225 → code 224
    row[1] = bf16::from_f32(-0.25);
    let bytes = quantize_model1_cache(&row, &pages);
    let so = pages.scale_offset(0);
    assert_eq!(bytes[so], 127 - 8);
    assert!(!model1_tile_is_canonical(bytes[so], &bytes[..MODEL1_TILE]));
    let again = quantize_model1_cache(&dequantize_model1_cache(&bytes, &pages), &pages);
    assert_eq!(again[so], 127 - 9);
    assert_eq!(decode_model1_token(&again, &pages, 0), decode_model1_token(&bytes, &pages, 0));
}

/// A source of random rows for the concatenation property: every slot holds a row, a few are
/// poisoned (NaN) and never picked by a used entry.
struct Source {
    pages: Model1Pages,
    rows: Vec<bf16>,
    poisoned: Vec<bool>,
    bytes: Vec<u8>,
}

impl Source {
    fn new(num_pages: usize, block_size: usize, rng: &mut Rng) -> Self {
        let pages = Model1Pages::new(num_pages, block_size);
        let mut rows = Vec::new();
        let mut poisoned = Vec::new();
        for _ in 0..pages.slots() {
            let p = rng.below(5) == 0;
            let mut r = random_row(rng, false);
            if p {
                r.fill(bf16::NAN);
            }
            rows.extend(r);
            poisoned.push(p);
        }
        let bytes = quantize_model1_cache(&rows, &pages);
        Source { pages, rows, poisoned, bytes }
    }

    /// [b, q, k] entries and the used length of each request: a used entry is −1, an address
    /// outside the cache, or a slot that is not poisoned; an entry past the used length may be
    /// anything (a poisoned slot included: it is never read).
    /// With `with_len`, a topk_len [b] in [−1, k + 1] (else every entry is used).
    fn indices(&self, rows: usize, q: usize, k: usize, with_len: bool, rng: &mut Rng) -> (Vec<i32>, Option<Vec<i32>>) {
        let slots = self.pages.slots();
        let clean: Vec<usize> = (0..slots).filter(|&s| !self.poisoned[s]).collect();
        let b = rows / q;
        let lens: Option<Vec<i32>> = with_len.then(|| (0..b).map(|_| rng.below(k as u64 + 3) as i32 - 1).collect());
        let mut idx = vec![-1i32; rows * k];
        for (r, e) in idx.chunks_mut(k).enumerate() {
            let used = lens.as_ref().map_or(k, |l| l[r / q].clamp(0, k as i32) as usize);
            for (c, x) in e.iter_mut().enumerate() {
                *x = match rng.below(6) {
                    0 => -1,
                    1 => [slots as i32, i32::MAX, -7][rng.below(3) as usize],
                    _ if c >= used => rng.below(slots as u64) as i32,
                    _ if clean.is_empty() => -1,
                    _ => clean[rng.below(clean.len() as u64) as usize] as i32,
                };
            }
        }
        (idx, lens)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Two sources in one softmax equal one cache holding both sets of rows with one list (the
    /// first source's used entries, then the second's), bit for bit in f32 and in the f64 oracle.
    #[test]
    fn two_sources_equal_their_concatenation(
        b in 1usize..=2,
        q in 1usize..=2,
        h in 1usize..=3,
        (pages_a, block_a) in (1usize..=3, prop::sample::select(vec![1usize, 2, 3, 64])),
        (pages_b, block_b) in (1usize..=3, prop::sample::select(vec![1usize, 4, 5])),
        k_a in 1usize..=8,
        k_b in 1usize..=8,
        lens_a in any::<bool>(),
        lens_b in any::<bool>(),
        block_c in prop::sample::select(vec![1usize, 3, 64]),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let (a, bb) = (Source::new(pages_a, block_a, &mut rng), Source::new(pages_b, block_b, &mut rng));
        let rows = b * q;
        let (idx_a, len_a) = a.indices(rows, q, k_a, lens_a, &mut rng);
        let (idx_b, len_b) = bb.indices(rows, q, k_b, lens_b, &mut rng);
        // the concatenated cache: a's slots, then b's, in pages of block_c
        let (na, nb) = (a.pages.slots(), bb.pages.slots());
        let num_c = (na + nb).div_ceil(block_c);
        let pages_c = Model1Pages::new(num_c, block_c);
        let mut rows_c = [a.rows.clone(), bb.rows.clone()].concat();
        rows_c.resize(pages_c.slots() * MODEL1_D_QK, bf16::NAN);
        let bytes_c = quantize_model1_cache(&rows_c, &pages_c);
        let used = |len: &Option<Vec<i32>>, k: usize, r: usize| len.as_ref().map_or(k, |l| l[r / q].clamp(0, k as i32) as usize);
        let mut idx_c = vec![-1i32; rows * (k_a + k_b)];
        for r in 0..rows {
            let c = &mut idx_c[r * (k_a + k_b)..][..k_a + k_b];
            for e in 0..used(&len_a, k_a, r) {
                let x = idx_a[r * k_a + e];
                c[e] = if x >= 0 && (x as usize) < na { x } else { -1 };
            }
            for e in 0..used(&len_b, k_b, r) {
                let x = idx_b[r * k_b + e];
                c[k_a + e] = if x >= 0 && (x as usize) < nb { na as i32 + x } else { -1 };
            }
        }
        let query: Vec<bf16> = (0..rows * h * MODEL1_D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect();
        let shape = QueryShape { batch: b, rows: q, heads: h };
        let sigma = model1_default_scale();
        let src_a = Model1Source { cache: &a.bytes, pages: a.pages, indices: &idx_a, k: k_a, topk_len: len_a.as_deref() };
        let src_b = Model1Source { cache: &bb.bytes, pages: bb.pages, indices: &idx_b, k: k_b, topk_len: len_b.as_deref() };
        let src_c = Model1Source { cache: &bytes_c, pages: pages_c, indices: &idx_c, k: k_a + k_b, topk_len: None };
        let two = decode_model1::<f32>(&query, shape, &src_a, Some(&src_b), sigma);
        let one = decode_model1::<f32>(&query, shape, &src_c, None, sigma);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&two.0), bits(&one.0));
        prop_assert_eq!(bits(&two.1), bits(&one.1));
        prop_assert!(two.0.iter().all(|x| !x.is_nan()), "no used entry reads a poisoned slot");
        let (o2, o1) = (decode_model1_oracle(&query, shape, &src_a, Some(&src_b), sigma), decode_model1_oracle(&query, shape, &src_c, None, sigma));
        prop_assert!(o2.out == o1.out && o2.lse == o1.lse && o2.mean_abs_v == o1.mean_abs_v);
        // and the f32 reference is within docs/contract.md §9 of its own oracle
        if let Err(e) = check_attention("f32 vs oracle", two.0.iter().map(|&x| x as f64), two.1.iter().map(|&x| x as f64), &o2) {
            panic!("{e}");
        }
    }
}

/// The global tokens of one source: a request i of length lens[i], every position filled.
struct Tokens {
    lens: Vec<u64>,
    nope: Vec<bf16>,
    rope: Vec<bf16>,
    req_idx: Vec<i32>,
    positions: Vec<i32>,
}

impl Tokens {
    fn new(lens: Vec<u64>, rng: &mut Rng) -> Self {
        let n = lens.iter().sum::<u64>() as usize;
        let mut nope = Vec::with_capacity(n * MODEL1_D_NOPE);
        let mut rope = Vec::with_capacity(n * D_ROPE);
        for _ in 0..n {
            let r = random_row(rng, false);
            nope.extend_from_slice(&r[..MODEL1_D_NOPE]);
            rope.extend_from_slice(&r[MODEL1_D_NOPE..]);
        }
        let mut req_idx = Vec::new();
        let mut positions = Vec::new();
        for (i, &l) in lens.iter().enumerate() {
            req_idx.extend(std::iter::repeat_n(i as i32, l as usize));
            positions.extend(0..l as i32);
        }
        Tokens { lens, nope, rope, req_idx, positions }
    }

    fn input(&self) -> FillInput<'_> {
        FillInput {
            ckv: &self.nope,
            ckv_stride: MODEL1_D_NOPE,
            kpe: &self.rope,
            kpe_stride: D_ROPE,
            req_idx: &self.req_idx,
            positions: &self.positions,
        }
    }
}

/// One rank's cache of one source: 0xff-poisoned, a permuted block table, filled by the fill.
struct RankCache {
    bytes: Vec<u8>,
    table: Vec<i32>,
    max_pages: usize,
    pages: Model1Pages,
    batch: usize,
}

impl RankCache {
    fn build(tok: &Tokens, dcp: DcpLayout, rank: usize, block_size: usize, rng: &mut Rng) -> Self {
        let batch = tok.lens.len();
        let max_pages = tok.lens.iter().map(|&l| dcp.pages_for(l, block_size)).max().unwrap_or(0).max(1) as usize;
        let num_pages = batch * max_pages + 1; // one page no request maps
        let mut perm: Vec<i32> = (0..num_pages as i32).collect();
        rng.shuffle(&mut perm);
        let table = perm[..batch * max_pages].to_vec();
        let pages = Model1Pages::new(num_pages, block_size);
        let mut bytes = vec![0xffu8; pages.cache_bytes()];
        let rc = RankCache { bytes: Vec::new(), table, max_pages, pages, batch };
        fill_model1(&tok.input(), &rc.cache(), dcp, rank, &mut bytes);
        RankCache { bytes, ..rc }
    }

    fn cache(&self) -> Model1Cache<'_> {
        Model1Cache {
            block_table: &self.table,
            block_table_stride: self.max_pages,
            batch: self.batch,
            max_pages: self.max_pages,
            pages: self.pages,
        }
    }

    /// Global ids [b·q, k] of a one-rank cache (D = 1: local = global) as page·B + slot, in place.
    fn translate_in_place(&self, ids: &[i32], q: usize, k: usize) -> Vec<i32> {
        let bs = self.pages.block_size;
        ids.iter()
            .enumerate()
            .map(|(e, &id)| {
                if id < 0 {
                    return -1;
                }
                let page = self.table[(e / k / q) * self.max_pages + id as usize / bs];
                page * bs as i32 + id % bs as i32
            })
            .collect()
    }

    fn translate(&self, q: usize) -> PageTranslate<'_> {
        PageTranslate {
            block_table: &self.table,
            stride: self.max_pages,
            block_size: self.pages.block_size,
            rows_per_request: q,
        }
    }
}

/// Per-row global ids [b·q, k] of one source (−1 between, one row in four all −1) and a
/// per-request topk_len [b] that cuts some lists short.
fn draw_ids(lens: &[u64], q: usize, k: usize, rng: &mut Rng) -> (Vec<i32>, Vec<i32>) {
    let b = lens.len();
    let mut ids = vec![-1i32; b * q * k];
    for i in 0..b {
        for j in 0..q {
            let all_empty = rng.below(4) == 0;
            for e in &mut ids[(i * q + j) * k..][..k] {
                if lens[i] > 0 && !all_empty && rng.below(4) != 0 {
                    *e = rng.below(lens[i]) as i32;
                }
            }
        }
    }
    let topk_len = (0..b).map(|_| rng.below(k as u64 + 2) as i32).collect();
    (ids, topk_len)
}

/// The ids a per-request topk_len leaves (the rest −1): what a rank's list is compacted from.
fn cut(ids: &[i32], topk_len: &[i32], q: usize, k: usize) -> Vec<i32> {
    let mut out = ids.to_vec();
    for (r, e) in out.chunks_mut(k).enumerate() {
        let used = topk_len[r / q].clamp(0, k as i32) as usize;
        e[used..].fill(-1);
    }
    out
}

#[derive(Debug, Clone)]
struct DcpCase {
    dcp: DcpLayout,
    block_a: usize,
    block_b: Option<usize>,
    q: usize,
    h_l: usize,
    lens_a: Vec<u64>,
    lens_b: Vec<u64>,
    sink: bool,
    seed: u64,
}

fn check_dcp_identity(c: &DcpCase) {
    let mut rng = Rng::new(c.seed);
    let (d, q, h_l) = (c.dcp.size, c.q, c.h_l);
    let h = d * h_l;
    let b = c.lens_a.len();
    let t = b * q;
    let (k_a, k_b) = (10, 6);
    let tok_a = Tokens::new(c.lens_a.clone(), &mut rng);
    let tok_b = Tokens::new(c.lens_b.clone(), &mut rng);
    let one = DcpLayout { size: 1, interleave: 1 };
    let full_a = RankCache::build(&tok_a, one, 0, c.block_a, &mut rng);
    let shards_a: Vec<RankCache> = (0..d).map(|r| RankCache::build(&tok_a, c.dcp, r, c.block_a, &mut rng)).collect();
    let extra = c.block_b.map(|bb| {
        let full = RankCache::build(&tok_b, one, 0, bb, &mut rng);
        let shards: Vec<RankCache> = (0..d).map(|r| RankCache::build(&tok_b, c.dcp, r, bb, &mut rng)).collect();
        (full, shards)
    });
    let (ids_a, len_a) = draw_ids(&c.lens_a, q, k_a, &mut rng);
    let (ids_b, len_b) = draw_ids(&c.lens_b, q, k_b, &mut rng);
    let query: Vec<bf16> = (0..t * h * MODEL1_D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect();
    let shape = QueryShape { batch: b, rows: q, heads: h };
    let sigma = model1_default_scale();
    let sink: Option<Vec<f32>> = c.sink.then(|| {
        (0..h)
            .map(|_| match rng.below(6) {
                0 => f32::NEG_INFINITY,
                1 => f32::INFINITY,
                _ => 4.0 + 12.0 * rng.unit(),
            })
            .collect()
    });

    // one rank over all tokens: the full lists translated in place through the D = 1 tables (−1
    // where they are −1), with the per-request topk_len; the f64 oracle with the sink applied once
    let full_idx_a = full_a.translate_in_place(&ids_a, q, k_a);
    let full_idx_b = extra.as_ref().map(|(f, _)| f.translate_in_place(&ids_b, q, k_b));
    let main = Model1Source {
        cache: &full_a.bytes,
        pages: full_a.pages,
        indices: &full_idx_a,
        k: k_a,
        topk_len: Some(&len_a),
    };
    let ext = extra.as_ref().map(|(f, _)| Model1Source {
        cache: &f.bytes,
        pages: f.pages,
        indices: full_idx_b.as_deref().unwrap(),
        k: k_b,
        topk_len: Some(&len_b),
    });
    let mut oracle = decode_model1_oracle(&query, shape, &main, ext.as_ref(), sigma);
    if let Some(s) = &sink {
        apply_sink_oracle(&mut oracle, s);
    }
    assert!(oracle.out.iter().all(|x| !x.is_nan()), "the oracle never reads a poisoned slot");

    // rank r: each list cut at its topk_len, its own entries compacted to page·B + slot; its
    // topk_len the longest compacted row of the request (the rest of a row is −1)
    let rank_lists = |ids: &[i32], lens: &[i32], k: usize, rc: &RankCache, r: usize| -> (Vec<i32>, Vec<i32>) {
        let (idx, counts) = compact(&cut(ids, lens, q, k), k, c.dcp, r, Some(rc.translate(q)));
        let per_req = counts.chunks(q).map(|c| c.iter().copied().max().unwrap_or(0)).collect();
        (idx, per_req)
    };
    let run = |r: usize, f64_: bool| -> (Vec<f64>, Vec<f64>) {
        let (ia, la) = rank_lists(&ids_a, &len_a, k_a, &shards_a[r], r);
        let main = Model1Source {
            cache: &shards_a[r].bytes,
            pages: shards_a[r].pages,
            indices: &ia,
            k: k_a,
            topk_len: Some(&la),
        };
        let lists_b = extra.as_ref().map(|(_, s)| rank_lists(&ids_b, &len_b, k_b, &s[r], r));
        let ext = extra.as_ref().zip(lists_b.as_ref()).map(|((_, s), (ib, lb))| Model1Source {
            cache: &s[r].bytes,
            pages: s[r].pages,
            indices: ib,
            k: k_b,
            topk_len: Some(lb),
        });
        if f64_ {
            decode_model1::<f64>(&query, shape, &main, ext.as_ref(), sigma)
        } else {
            let (o, l) = decode_model1::<f32>(&query, shape, &main, ext.as_ref(), sigma);
            (o.iter().map(|&x| x as f64).collect(), l.iter().map(|&x| x as f64).collect())
        }
    };

    // f64 shards merged in f64 (the sink once, after): the identity itself, to rounding
    let parts64: Vec<_> = (0..d).map(|r| run(r, true)).collect();
    let (o, l) = merge(
        &parts64.iter().flat_map(|p| p.0.clone()).collect::<Vec<_>>(),
        &parts64.iter().flat_map(|p| p.1.clone()).collect::<Vec<_>>(),
        d,
        t * h,
        LseBase::E,
        sink.as_deref(),
    );
    for (i, (g, w)) in o.iter().zip(&oracle.out).chain(l.iter().zip(&oracle.lse)).enumerate() {
        let ok = if w.is_finite() { (g - w).abs() <= 1e-9 * (1.0 + w.abs()) } else { g == w };
        assert!(ok, "f64 identity [{i}]: {g} vs {w}");
    }

    // f32 shards as the kernels produce them, merged by the combine: within docs/contract.md §9
    let parts: Vec<(Vec<f32>, Vec<f32>)> = (0..d)
        .map(|r| {
            let (o, l) = run(r, false);
            (o.iter().map(|&x| x as f32).collect(), l.iter().map(|&x| x as f32).collect())
        })
        .collect();
    let outs: Vec<f32> = parts.iter().flat_map(|p| p.0.clone()).collect();
    let lses: Vec<f32> = parts.iter().flat_map(|p| p.1.clone()).collect();
    let (o, l) = merge(&outs, &lses, d, t * h, LseBase::E, sink.as_deref());
    let spec9 = |what: &str, o: &[f32], l: &[f32], want: &AttentionOracle| {
        if let Err(e) = check_attention(what, o.iter().map(|&x| x as f64), l.iter().map(|&x| x as f64), want) {
            panic!("{e}");
        }
    };
    spec9("merge", &o, &l, &oracle);
    // the a2a combine with bf16 partials, rank by rank over its H_l heads
    let slot = a2a_slot_bytes(t, h_l);
    let packed: Vec<Vec<u8>> = parts.iter().map(|(o, l)| a2a_pack(&to_bf16(o), l, d, t, h)).collect();
    for rank in 0..d {
        let recv: Vec<u8> = packed.iter().flat_map(|p| p[rank * slot..(rank + 1) * slot].to_vec()).collect();
        let rank_sink = sink.as_ref().map(|s| &s[rank * h_l..(rank + 1) * h_l]);
        let (o, l) = a2a_combine(&recv, d, t, h_l, LseBase::E, rank_sink);
        let heads = |x: &[f64], w: usize| -> Vec<f64> {
            (0..t).flat_map(|ti| x[(ti * h + rank * h_l) * w..(ti * h + rank * h_l + h_l) * w].to_vec()).collect()
        };
        let want = AttentionOracle {
            out: heads(&oracle.out, MODEL1_D_V),
            lse: heads(&oracle.lse, 1),
            mean_abs_v: heads(&oracle.mean_abs_v, MODEL1_D_V),
        };
        spec9("a2a", &o, &l, &want);
    }
}

fn dcp_case(ds: Vec<usize>, sink: bool) -> impl Strategy<Value = DcpCase> {
    (
        prop::sample::select(ds),
        0usize..3,
        prop::sample::select(vec![2usize, 4, 64]),
        prop::option::of(prop::sample::select(vec![1usize, 3, 8])),
        1usize..=2,
        1usize..=2,
        prop::collection::vec((0usize..6, 0u64..80, 0u64..40), 1..=2),
        any::<u64>(),
    )
        .prop_map(move |(d, i, block_a, block_b, q, h_l, lens, seed)| {
            // lengths 0, 1, B − 1, B, B + 1 and random for the first source
            let special = |k: usize, r: u64| [0, 1, block_a as u64 - 1, block_a as u64, block_a as u64 + 1, r][k];
            // I divides both sources' B (docs/contract.md §1): the second's B is a multiple of I
            let interleave = [1, 2, block_a][i];
            DcpCase {
                dcp: DcpLayout { size: d, interleave },
                block_a,
                block_b: block_b.map(|f| f * interleave),
                q,
                h_l,
                lens_a: lens.iter().map(|&(k, r, _)| special(k, r)).collect(),
                lens_b: lens.iter().map(|&(_, _, r)| r).collect(),
                sink,
                seed,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// D ∈ {1, 2, 4, 8}, one or two sources (the second with its own block size, a multiple of I),
    /// I ∈ {1, 2, B}.
    #[test]
    fn model1_dcp_identity(c in dcp_case(vec![1, 2, 4, 8], false)) {
        check_dcp_identity(&c);
    }

    /// With sinks (finite, −inf, +inf) at every D from 1 to 8: the ranks attend without them and
    /// the combine applies them once.
    #[test]
    fn model1_dcp_identity_with_sinks(c in dcp_case((1..=8).collect(), true)) {
        check_dcp_identity(&c);
    }

    /// The fill writes every token on its owner rank only, at the slot §2 gives it, as the codec
    /// encodes it; no other byte of any rank's cache changes.
    #[test]
    fn fill_writes_owner_slots_only(
        d in prop::sample::select(vec![1usize, 2, 3, 4, 8]),
        i in 0usize..3,
        block_size in prop::sample::select(vec![1usize, 2, 4, 5]),
        lens in prop::collection::vec(0u64..40, 1..=3),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let dcp = DcpLayout { size: d, interleave: [1, block_size, block_size][i] };
        let tok = Tokens::new(lens.clone(), &mut rng);
        let shards: Vec<RankCache> = (0..d).map(|r| RankCache::build(&tok, dcp, r, block_size, &mut rng)).collect();
        for (r, rc) in shards.iter().enumerate() {
            // the expected cache, from §2's formulas: poison, then each owned token encoded at its slot
            let mut want = vec![0xffu8; rc.pages.cache_bytes()];
            let mut n = 0usize;
            for (tidx, (&req, &pos)) in tok.req_idx.iter().zip(&tok.positions).enumerate() {
                let (di, ii) = (d as u64, dcp.interleave as u64);
                let p = pos as u64;
                if ((p / ii) % di) as usize != r {
                    continue;
                }
                let local = (p / (di * ii)) * ii + p % ii;
                let page = rc.table[req as usize * rc.max_pages + (local as usize) / block_size] as usize;
                let slot = page * block_size + local as usize % block_size;
                let mut row = tok.nope[tidx * MODEL1_D_NOPE..][..MODEL1_D_NOPE].to_vec();
                row.extend_from_slice(&tok.rope[tidx * D_ROPE..][..D_ROPE]);
                encode_model1_token(&row, &rc.pages, slot, &mut want);
                n += 1;
            }
            prop_assert!(rc.bytes == want, "rank {} differs from the owner-only fill", r);
            prop_assert_eq!(n as u64, lens.iter().map(|&l| dcp.local_len(l, r)).sum::<u64>());
        }
    }
}

/// Every rank but one empty (one token at D = 8), with both sources and sinks.
#[test]
fn one_token_at_d8() {
    for sink in [false, true] {
        check_dcp_identity(&DcpCase {
            dcp: DcpLayout { size: 8, interleave: 1 },
            block_a: 4,
            block_b: Some(3),
            q: 1,
            h_l: 1,
            lens_a: vec![1, 2],
            lens_b: vec![0, 1],
            sink,
            seed: 7,
        });
    }
}
