//! MODEL1 on the GPU (docs/contract.md §3-§4, "MODEL1"): the fill bit for bit against
//! reference::model1's, the sparse decode over one and two sources against the fp64 oracle
//! (docs/contract.md §9) at topk_length 0, 1, K and beyond, split and unsplit, two sources bit for
//! bit equal to one cache holding both, and the DCP identity at D = 2, 4, 8; each on every MODEL1
//! kernel the device runs (mma.sync everywhere, wgmma lead on compute capability 9.0). Cache
//! slots no index reads hold 0xff bytes (NaN codes and NaN scales); outputs are poisoned before
//! each launch.

mod common;

use common::*;
use dcp_mla::catalogue::{model1_variants, DecodePath};
use dcp_mla::formats::model1::{
    encode_model1_token, Model1Pages, MODEL1_D_NOPE, MODEL1_D_QK, MODEL1_D_V, MODEL1_TILES,
};
use dcp_mla::formats::D_ROPE;
use dcp_mla::ops::decode::{decode_num_splits, decode_workspace_bytes, DecodeCommon, DecodeOut, IndexLists};
use dcp_mla::ops::fill::NewTokens;
use dcp_mla::ops::model1::*;
use dcp_mla::ops::BlockTable;
use dcp_mla::reference::attention::{apply_sink_oracle, QueryShape};
use dcp_mla::reference::fill::FillInput;
use dcp_mla::reference::merge::merge;
use dcp_mla::reference::model1::{decode_model1_oracle, fill_model1, Model1Cache, Model1Source as HostSource};
use dcp_mla::reference::tolerance::{check_attention, AttentionOracle};
use dcp_mla::reference::topk::{compact, PageTranslate};
use dcp_mla::{DcpLayout, LseBase};
use half::bf16;

const POISON: f32 = -7.0e37;

/// A MODEL1 row with tiles of different magnitudes (|v| ≤ 10, as the 576 path's tests keep it:
/// scores stay where f32 and the fp64 oracle agree), now and then a zero tile or one below the
/// scale floor.
fn random_row(rng: &mut Rng) -> Vec<bf16> {
    let mut row = Vec::with_capacity(MODEL1_D_QK);
    for _ in 0..MODEL1_TILES {
        let mag = match rng.below(8) {
            0 => 0.0,
            1 => 1e-5,
            _ => 0.1 + 9.9 * rng.unit().abs(),
        };
        row.extend((0..64).map(|_| bf16::from_f32(rng.unit() * mag)));
    }
    row.extend((0..D_ROPE).map(|_| bf16::from_f32(rng.unit() * 2.0)));
    row
}

/// A source's cache on the host: 0xff everywhere, `used` slots holding random rows.
struct HostCache {
    pages: Model1Pages,
    bytes: Vec<u8>,
    used: Vec<usize>,
}

impl HostCache {
    /// `num_pages` pages of `block_size` tokens, `extra_units` more 576-byte units apart than
    /// packed; half the slots written.
    fn new(rng: &mut Rng, num_pages: usize, block_size: usize, extra_units: usize) -> Self {
        let mut pages = Model1Pages::new(num_pages, block_size);
        pages.page_stride += 576 * extra_units;
        let mut bytes = vec![0xffu8; pages.cache_bytes()];
        let mut used: Vec<usize> = (0..pages.slots()).collect();
        rng.shuffle(&mut used);
        used.truncate(pages.slots().div_ceil(2));
        for &slot in &used {
            encode_model1_token(&random_row(rng), &pages, slot, &mut bytes);
        }
        HostCache { pages, bytes, used }
    }

    /// Index lists [rows, k]: used slots, with −1, other negatives and out-of-range entries mixed
    /// in; the rows in `empty` all −1.
    fn indices(&self, rng: &mut Rng, rows: usize, k: usize, empty: &[usize]) -> Vec<i32> {
        let slots = self.pages.slots() as i32;
        let mut idx = Vec::with_capacity(rows * k);
        for r in 0..rows {
            for _ in 0..k {
                idx.push(if empty.contains(&r) {
                    -1
                } else {
                    match rng.below(16) {
                        0 => -1,
                        1 => slots + rng.below(100) as i32,
                        2 => -2 - rng.below(100) as i32,
                        _ => self.used[rng.below(self.used.len() as u64) as usize] as i32,
                    }
                });
            }
        }
        idx
    }
}

/// One source's host data: its cache, lists [b·q, k] and per-request topk_len [b].
struct Src<'a> {
    cache: &'a HostCache,
    idx: Vec<i32>,
    k: usize,
    topk_len: Option<Vec<i32>>,
}

impl Src<'_> {
    fn host(&self) -> HostSource<'_> {
        HostSource {
            cache: &self.cache.bytes,
            pages: self.cache.pages,
            indices: &self.idx,
            k: self.k,
            topk_len: self.topk_len.as_deref(),
        }
    }
}

/// A source's device buffers, kept alive for a launch.
struct DevSrc {
    cache: cudarc::driver::CudaSlice<u8>,
    idx: cudarc::driver::CudaSlice<i32>,
    len: Option<cudarc::driver::CudaSlice<i32>>,
    pages: Model1Pages,
    k: usize,
}

impl DevSrc {
    fn new(s: &Src) -> Self {
        let st = stream();
        DevSrc {
            cache: upload(&st, &s.cache.bytes),
            idx: upload(&st, &s.idx),
            len: s.topk_len.as_ref().map(|t| upload(&st, t)),
            pages: s.cache.pages,
            k: s.k,
        }
    }

    fn arg(&self) -> Model1Source {
        let st = stream();
        Model1Source {
            cache: view(&st, &self.cache),
            pages: self.pages,
            lists: IndexLists {
                topk_len: self.len.as_ref().map(|t| view(&st, t)),
                // FlashMLA's per-request topk_length: [b], broadcast over the query rows
                topk_len_strides: Some([1, 0]),
                ..IndexLists::new(view(&st, &self.idx), self.k)
            },
        }
    }
}

/// Every MODEL1 kernel this device runs, with its name: mma.sync, and the wgmma variants on
/// compute capability 9.0. DCP_MLA_TEST_SCHEDULES (as gpu_decode's: `lead`, and here also `mma`)
/// keeps only those, for a sanitizer run; the kernels kept are printed, and none kept fails.
fn paths() -> Vec<(String, DecodePath)> {
    let sm90 = gpu().compute_capability() == (9, 0);
    let mut v: Vec<(String, DecodePath)> =
        model1_variants().into_iter().filter(|(_, p)| sm90 || !matches!(p, DecodePath::Wgmma { .. })).collect();
    if let Ok(only) = std::env::var("DCP_MLA_TEST_SCHEDULES") {
        let keep: Vec<&str> = only.split(',').map(str::trim).collect();
        v.retain(|(_, p)| match p {
            DecodePath::Wgmma { schedule, .. } => keep.contains(&schedule.name()),
            _ => keep.contains(&"mma"),
        });
        eprintln!("DCP_MLA_TEST_SCHEDULES={only}: MODEL1 kernels {v:?}");
        assert!(!v.is_empty(), "DCP_MLA_TEST_SCHEDULES={only} leaves no MODEL1 kernel");
    }
    v
}

/// Runs the MODEL1 decode on `path`'s kernel; returns (out as f32, lse).
#[allow(clippy::too_many_arguments)]
fn launch(
    path: DecodePath,
    q: &[bf16],
    shape: QueryShape,
    main: &Src,
    extra: Option<&Src>,
    splits: usize,
    f32_out: bool,
    sink: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let st = stream();
    let rows = shape.batch * shape.rows * shape.heads;
    let q_dev = upload(&st, q);
    let (m, e) = (DevSrc::new(main), extra.map(DevSrc::new));
    let out_bf16 = upload(&st, &vec![bf16::from_f32(POISON); rows * MODEL1_D_V]);
    let out_f32 = upload(&st, &vec![POISON; rows * MODEL1_D_V]);
    let lse = upload(&st, &vec![POISON; rows]);
    let ws_bytes = decode_workspace_bytes(shape.batch, shape.rows, shape.heads, true, splits).unwrap().max(16);
    let ws = upload(&st, &vec![0xffu8; ws_bytes]);
    let sink_dev = sink.map(|s| upload(&st, s));
    let out = if f32_out { DecodeOut::F32(view(&st, &out_f32)) } else { DecodeOut::Bf16(view(&st, &out_bf16)) };
    let common = DecodeCommon {
        scale: model1_default_scale(),
        sink: sink_dev.as_ref().map(|s| view(&st, s)),
        ..DecodeCommon::new(
            view(&st, &q_dev),
            shape.batch,
            shape.rows,
            shape.heads,
            out,
            view(&st, &lse),
            splits,
            view(&st, &ws),
        )
    };
    let a = Model1Decode { common, main: m.arg(), extra: e.as_ref().map(|e| e.arg()) };
    mla_decode_model1_on(gpu(), raw(&st), &a, path).expect("MODEL1 launch");
    st.synchronize().expect("kernel run");
    let out =
        if f32_out { download(&st, &out_f32) } else { download(&st, &out_bf16).iter().map(|x| x.to_f32()).collect() };
    (out, download(&st, &lse))
}

fn check(what: &str, out: &[f32], lse: &[f32], want: &AttentionOracle) {
    if let Err(e) = check_attention(what, out.iter().map(|&x| x as f64), lse.iter().map(|&x| x as f64), want) {
        panic!("{e}");
    }
}

fn random_q(rng: &mut Rng, shape: QueryShape) -> Vec<bf16> {
    (0..shape.batch * shape.rows * shape.heads * MODEL1_D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect()
}

/// Per-request topk_len [b] over the edges: 0, 1, K, beyond K, negative, and values between.
fn edge_lens(rng: &mut Rng, b: usize, k: usize) -> Vec<i32> {
    (0..b)
        .map(|i| match i % 6 {
            0 => k as i32,
            1 => 0,
            2 => 1,
            3 => k as i32 + 5,
            4 => -3,
            _ => rng.below(k as u64) as i32,
        })
        .collect()
}

fn num_sms() -> usize {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SMS;
    gpu().context().attribute(SMS).unwrap() as usize
}

/// (b, q, H, K, second source's K (0: none), with topk_len, block sizes, rows all −1).
type Case = (usize, usize, usize, usize, usize, bool, (usize, usize), &'static [usize]);

/// The decode against the fp64 oracle, one and two sources, topk_len at its edges, every
/// schedule: unsplit, the planner's split and 3 parts; bf16 and fp32 out; and with two sources
/// the same bits as one cache holding both sources' pages, its list the two lists' valid entries
/// one after the other.
#[test]
#[ignore = "needs a CUDA GPU"]
fn model1_decode_matches_reference() {
    let mut rng = Rng::new(seed());
    let sms = num_sms();
    let cases: &[Case] = &[
        (2, 1, 64, 128, 0, false, (64, 64), &[1]),
        (6, 2, 64, 512, 0, true, (64, 64), &[]),
        (6, 1, 64, 256, 64, true, (64, 64), &[3]),
        (3, 2, 128, 512, 128, true, (64, 2), &[0]),
        (1, 1, 16, 2048, 512, false, (64, 64), &[]),
        (7, 1, 96, 64, 32, true, (1, 7), &[]),
        (12, 1, 32, 96, 40, true, (16, 64), &[2, 5]),
        // more query rows than SMs, unsplit: several waves of CTAs
        (150, 1, 16, 128, 64, true, (64, 64), &[7]),
        // the bench's shapes, smaller: wgmma's 64-token tiles across both lists, two row blocks
        (8, 2, 128, 512, 0, true, (64, 64), &[]),
        (4, 2, 64, 2048, 200, true, (64, 64), &[5]),
    ];
    for (n, &(b, nq, heads, k1, k2, with_len, (bs1, bs2), empty)) in cases.iter().enumerate() {
        let shape = QueryShape { batch: b, rows: nq, heads };
        let c1 = HostCache::new(&mut rng, (2 * k1).div_ceil(bs1) + 1, bs1, n % 2);
        let c2 = HostCache::new(&mut rng, (2 * k2.max(1)).div_ceil(bs2) + 1, bs2, 0);
        let main = Src {
            cache: &c1,
            idx: c1.indices(&mut rng, b * nq, k1, empty),
            k: k1,
            topk_len: with_len.then(|| edge_lens(&mut rng, b, k1)),
        };
        let extra = (k2 > 0).then(|| Src {
            cache: &c2,
            idx: c2.indices(&mut rng, b * nq, k2, empty),
            k: k2,
            topk_len: with_len.then(|| edge_lens(&mut rng, b, k2)),
        });
        let q = random_q(&mut rng, shape);
        let want = decode_model1_oracle(
            &q,
            shape,
            &main.host(),
            extra.as_ref().map(|e| e.host()).as_ref(),
            model1_default_scale(),
        );
        let auto = decode_num_splits(b, nq, heads, true, sms);
        for (name, path) in paths() {
            for (splits, f32_out) in [(1, n % 2 == 0), (auto, n % 2 == 1), (3, true)] {
                let what = format!("{name}: case {n} b={b} q={nq} H={heads} K={k1}+{k2} splits={splits}");
                let (out, lse) = launch(path, &q, shape, &main, extra.as_ref(), splits, f32_out, None);
                check(&what, &out, &lse, &want);
                if let Some((one, src)) = extra.as_ref().and_then(|e| concatenated(&main, e, b, nq)) {
                    let single = Src { cache: &one, ..src };
                    let got = launch(path, &q, shape, &single, None, splits, f32_out, None);
                    assert!(same_bits(&(out, lse), &got), "{what}: two sources differ from one cache holding both");
                }
            }
        }
    }
}

/// One cache holding both sources' pages (the second's after the first's) and one list per
/// row: the first list's valid entries then the second's (readdressed), −1 after, its topk_len
/// their sum. Where the two caches' block sizes or page strides differ, None.
fn concatenated<'a>(a: &Src<'a>, e: &Src, b: usize, nq: usize) -> Option<(HostCache, Src<'a>)> {
    let (pa, pe) = (a.cache.pages, e.cache.pages);
    if pa.block_size != pe.block_size || pa.page_stride != pe.page_stride {
        return None;
    }
    let pages = Model1Pages { num_pages: pa.num_pages + pe.num_pages, ..pa };
    let mut bytes = vec![0xffu8; pages.cache_bytes()];
    bytes[..pa.cache_bytes()].copy_from_slice(&a.cache.bytes[..pa.cache_bytes()]);
    let at = pa.num_pages * pa.page_stride;
    bytes[at..at + pe.cache_bytes()].copy_from_slice(&e.cache.bytes[..pe.cache_bytes()]);
    let offset = pa.slots() as i32;
    let k = a.k + e.k;
    let used = |s: &Src, i: usize| s.topk_len.as_ref().map_or(s.k, |t| t[i].clamp(0, s.k as i32) as usize);
    let mut idx = vec![-1i32; b * nq * k];
    let mut lens = Vec::with_capacity(b);
    for i in 0..b {
        let (na, ne) = (used(a, i), used(e, i));
        lens.push((na + ne) as i32);
        for j in 0..nq {
            let r = i * nq + j;
            let row = &mut idx[r * k..(r + 1) * k];
            for (d, &v) in row[..na].iter_mut().zip(&a.idx[r * a.k..r * a.k + na]) {
                // an entry past the first cache stays past it (else it would address the second's pages)
                *d = if v >= 0 && (v as usize) < pa.slots() { v } else { -1 };
            }
            for (d, &v) in row[na..na + ne].iter_mut().zip(&e.idx[r * e.k..r * e.k + ne]) {
                // an unused entry of the second list stays unused (never an address in the first)
                *d = if v >= 0 && (v as usize) < pe.slots() { v + offset } else { -1 };
            }
        }
    }
    let cache = HostCache { pages, bytes, used: Vec::new() };
    Some((cache, Src { cache: a.cache, idx, k, topk_len: Some(lens) }))
}

fn same_bits(a: &(Vec<f32>, Vec<f32>), b: &(Vec<f32>, Vec<f32>)) -> bool {
    let eq = |x: &[f32], y: &[f32]| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
    eq(&a.0, &b.0) && eq(&a.1, &b.1)
}

/// The global tokens of one source: request i of length lens[i], every position filled.
struct Tokens {
    lens: Vec<u64>,
    nope: Vec<bf16>,
    rope: Vec<bf16>,
    req_idx: Vec<i32>,
    positions: Vec<i32>,
}

impl Tokens {
    fn new(lens: Vec<u64>, rng: &mut Rng) -> Self {
        let (mut nope, mut rope, mut req_idx, mut positions) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, &l) in lens.iter().enumerate() {
            for p in 0..l {
                let r = random_row(rng);
                nope.extend_from_slice(&r[..MODEL1_D_NOPE]);
                rope.extend_from_slice(&r[MODEL1_D_NOPE..]);
                req_idx.push(i as i32);
                positions.push(p as i32);
            }
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

/// One rank's cache of one source, filled by the GPU fill from `init` bytes (checked bit for
/// bit against reference::model1's fill of the same bytes), with a permuted block table.
struct RankCache {
    cache: HostCache,
    table: Vec<i32>,
    max_pages: usize,
}

impl RankCache {
    fn build(tok: &Tokens, dcp: DcpLayout, rank: usize, block_size: usize, rng: &mut Rng, init: u8) -> Self {
        let batch = tok.lens.len();
        let max_pages = tok.lens.iter().map(|&l| dcp.pages_for(l, block_size)).max().unwrap_or(0).max(1) as usize;
        let num_pages = batch * max_pages + 1; // one page no request maps
        let mut perm: Vec<i32> = (0..num_pages as i32).collect();
        rng.shuffle(&mut perm);
        let table = perm[..batch * max_pages].to_vec();
        let pages = Model1Pages::new(num_pages, block_size);
        let mut want = vec![init; pages.cache_bytes()];
        let host = Model1Cache { block_table: &table, block_table_stride: max_pages, batch, max_pages, pages };
        fill_model1(&tok.input(), &host, dcp, rank, &mut want);
        let got = gpu_fill(tok, &table, max_pages, batch, pages, dcp, rank, init);
        // the first differing byte, and where it lies in its page (value rows, scale slots, padding)
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            let (page, at) = (i / pages.page_stride, i % pages.page_stride);
            panic!(
                "kv_fill_model1 D={} I={} rank {rank} B={block_size}: byte {i} (page {page}, offset {at}) is {:#04x}, \
                 the reference's {:#04x}",
                dcp.size, dcp.interleave, got[i], want[i]
            );
        }
        RankCache { cache: HostCache { pages, bytes: got, used: Vec::new() }, table, max_pages }
    }

    fn translate(&self, q: usize) -> PageTranslate<'_> {
        PageTranslate {
            block_table: &self.table,
            stride: self.max_pages,
            block_size: self.cache.pages.block_size,
            rows_per_request: q,
        }
    }
}

/// The GPU fill of `tok` into a cache of `init` bytes; returns the cache's bytes.
#[allow(clippy::too_many_arguments)]
fn gpu_fill(
    tok: &Tokens,
    table: &[i32],
    max_pages: usize,
    batch: usize,
    pages: Model1Pages,
    dcp: DcpLayout,
    rank: usize,
    init: u8,
) -> Vec<u8> {
    let st = stream();
    let n = tok.positions.len();
    // rows a stride apart (456: 16-byte multiples, wider than the 448 read)
    let mut ckv = vec![bf16::from_f32(POISON); n * 456];
    for t in 0..n {
        ckv[t * 456..t * 456 + MODEL1_D_NOPE].copy_from_slice(&tok.nope[t * MODEL1_D_NOPE..(t + 1) * MODEL1_D_NOPE]);
    }
    let (ckv_d, kpe_d) = (upload(&st, &ckv), upload(&st, &tok.rope));
    let (req_d, pos_d) = (upload(&st, &tok.req_idx), upload(&st, &tok.positions));
    let table_d = upload(&st, table);
    let cache = upload(&st, &vec![init; pages.cache_bytes()]);
    let a = Model1Fill {
        tokens: NewTokens {
            ckv: view(&st, &ckv_d),
            ckv_stride: 456,
            kpe: view(&st, &kpe_d),
            kpe_stride: D_ROPE,
            req_idx: view(&st, &req_d),
            positions: view(&st, &pos_d),
        },
        block_table: BlockTable::packed(view(&st, &table_d), max_pages),
        batch,
        cache: view(&st, &cache),
        pages,
        dcp,
        rank,
    };
    kv_fill_model1(gpu(), raw(&st), &a).expect("MODEL1 fill");
    st.synchronize().expect("fill run");
    download(&st, &cache)
}

/// The fill against the reference, bit for bit, with non-finite inputs, at D = 1, 2, 4, 8 and
/// interleaves 1 to B (every other byte, the pages' padding included, keeps its value).
#[test]
#[ignore = "needs a CUDA GPU"]
fn model1_fill_matches_reference() {
    let mut rng = Rng::new(seed());
    for (d, interleave, block_size) in
        [(1, 1, 64), (1, 1, 1), (2, 1, 64), (2, 64, 64), (4, 2, 16), (8, 1, 2), (8, 3, 3)]
    {
        let dcp = DcpLayout { size: d, interleave };
        let mut tok = Tokens::new(vec![0, 1, 70, 200, 3], &mut rng);
        // non-finite inputs: inf (a tile scale of +inf), NaN (ignored by its tile's amax), huge values
        for (t, v) in [(0usize, bf16::INFINITY), (5, bf16::NAN), (9, bf16::NEG_INFINITY), (13, bf16::from_f32(3.0e38))]
        {
            tok.nope[t * MODEL1_D_NOPE + 64 * (t % 7) + 3] = v;
            tok.rope[t * D_ROPE + 1] = v;
        }
        // a padded token and one of a request outside the batch: skipped
        tok.positions[2] = -1;
        tok.req_idx[4] = 9;
        for rank in 0..d {
            RankCache::build(&tok, dcp, rank, block_size, &mut rng, 0xa5);
        }
    }
}

/// The ids a per-request topk_len leaves (the rest −1).
fn cut(ids: &[i32], topk_len: &[i32], q: usize, k: usize) -> Vec<i32> {
    let mut out = ids.to_vec();
    for (r, e) in out.chunks_mut(k).enumerate() {
        let used = topk_len[r / q].clamp(0, k as i32) as usize;
        e[used..].fill(-1);
    }
    out
}

/// Per-row global ids [b·q, k] (−1 between) and a per-request topk_len [b] covering 0, 1 and K.
fn draw_ids(lens: &[u64], q: usize, k: usize, rng: &mut Rng) -> (Vec<i32>, Vec<i32>) {
    let b = lens.len();
    let mut ids = vec![-1i32; b * q * k];
    for i in 0..b {
        for j in 0..q {
            for e in &mut ids[(i * q + j) * k..][..k] {
                if lens[i] > 0 && rng.below(4) != 0 {
                    *e = rng.below(lens[i]) as i32;
                }
            }
        }
    }
    let topk_len = (0..b).map(|i| [k as i32, 1, 0, rng.below(k as u64 + 2) as i32][i % 4]).collect();
    (ids, topk_len)
}

/// The DCP identity (docs/contract.md §4 "MODEL1 under DCP", §9): both sources sharded over D
/// ranks (each rank's caches filled by the GPU fill), each rank's lists its own entries compacted,
/// D rank-local GPU decodes without the sink (fp32 out, split and unsplit by rank) merged with the
/// sink once, against the fp64 oracle of one rank over both whole lists.
#[test]
#[ignore = "needs a CUDA GPU"]
fn model1_dcp_identity() {
    let mut rng = Rng::new(seed());
    let (q, h_l) = (2usize, 16usize);
    let lens_a = vec![1u64, 301, 140, 0];
    let lens_b = vec![40u64, 7, 0, 90];
    let (k_a, k_b) = (64usize, 32usize);
    for (d, interleave, sink_on) in [(2, 1, false), (4, 1, true), (4, 2, false), (8, 1, true), (8, 2, true)] {
        let dcp = DcpLayout { size: d, interleave };
        let one = DcpLayout { size: 1, interleave: 1 };
        let (h, b) = (d * h_l, lens_a.len());
        let (block_a, block_b) = (16, 2 * interleave);
        let tok_a = Tokens::new(lens_a.clone(), &mut rng);
        let tok_b = Tokens::new(lens_b.clone(), &mut rng);
        let full_a = RankCache::build(&tok_a, one, 0, block_a, &mut rng, 0xff);
        let full_b = RankCache::build(&tok_b, one, 0, block_b, &mut rng, 0xff);
        let shards_a: Vec<RankCache> =
            (0..d).map(|r| RankCache::build(&tok_a, dcp, r, block_a, &mut rng, 0xff)).collect();
        let shards_b: Vec<RankCache> =
            (0..d).map(|r| RankCache::build(&tok_b, dcp, r, block_b, &mut rng, 0xff)).collect();
        let (ids_a, len_a) = draw_ids(&lens_a, q, k_a, &mut rng);
        let (ids_b, len_b) = draw_ids(&lens_b, q, k_b, &mut rng);
        let shape = QueryShape { batch: b, rows: q, heads: h };
        let query = random_q(&mut rng, shape);
        let sink: Option<Vec<f32>> = sink_on.then(|| {
            (0..h)
                .map(|i| match i % 6 {
                    0 => f32::NEG_INFINITY,
                    1 => f32::INFINITY,
                    _ => 4.0 + 12.0 * rng.unit(),
                })
                .collect()
        });
        // one rank over all tokens: the lists through the D = 1 tables, page·B + slot
        let full =
            |rc: &RankCache, ids: &[i32], k: usize| -> Vec<i32> { compact(ids, k, one, 0, Some(rc.translate(q))).0 };
        let (fa, fb) =
            (full(&full_a, &cut(&ids_a, &len_a, q, k_a), k_a), full(&full_b, &cut(&ids_b, &len_b, q, k_b), k_b));
        let main = Src { cache: &full_a.cache, idx: fa, k: k_a, topk_len: None };
        let extra = Src { cache: &full_b.cache, idx: fb, k: k_b, topk_len: None };
        let mut want = decode_model1_oracle(&query, shape, &main.host(), Some(&extra.host()), model1_default_scale());
        if let Some(s) = &sink {
            apply_sink_oracle(&mut want, s);
        }
        // rank r: its own entries compacted; topk_len the longest compacted row of the request
        let rank_src = |ids: &[i32], lens: &[i32], k: usize, rc: &RankCache, r: usize| -> (Vec<i32>, Vec<i32>) {
            let (idx, counts) = compact(&cut(ids, lens, q, k), k, dcp, r, Some(rc.translate(q)));
            (idx, counts.chunks(q).map(|c| c.iter().copied().max().unwrap_or(0)).collect())
        };
        for (name, path) in paths() {
            let (mut outs, mut lses) = (Vec::new(), Vec::new());
            for r in 0..d {
                let (ia, la) = rank_src(&ids_a, &len_a, k_a, &shards_a[r], r);
                let (ib, lb) = rank_src(&ids_b, &len_b, k_b, &shards_b[r], r);
                let main = Src { cache: &shards_a[r].cache, idx: ia, k: k_a, topk_len: Some(la) };
                let extra = Src { cache: &shards_b[r].cache, idx: ib, k: k_b, topk_len: Some(lb) };
                let splits = if r % 2 == 0 { 1 } else { 3 };
                let (o, l) = launch(path, &query, shape, &main, Some(&extra), splits, true, None);
                outs.extend(o);
                lses.extend(l);
            }
            let (o, l) = merge(&outs, &lses, d, b * q * h, LseBase::E, sink.as_deref());
            check(&format!("{name}: D={d} I={interleave} sink={sink_on}"), &o, &l, &want);
        }
    }
}

/// A single-GPU launch with a sink applies it as the reference does.
#[test]
#[ignore = "needs a CUDA GPU"]
fn model1_sinks_match_reference() {
    let mut rng = Rng::new(seed());
    let shape = QueryShape { batch: 3, rows: 1, heads: 64 };
    let c1 = HostCache::new(&mut rng, 9, 64, 0);
    let main = Src { cache: &c1, idx: c1.indices(&mut rng, 3, 256, &[1]), k: 256, topk_len: None };
    let q = random_q(&mut rng, shape);
    let sink: Vec<f32> = (0..64)
        .map(|h| match h % 8 {
            0 => f32::NEG_INFINITY,
            3 => f32::INFINITY,
            _ => (rng.below(2000) as f32 - 1000.0) / 200.0,
        })
        .collect();
    let mut want = decode_model1_oracle(&q, shape, &main.host(), None, model1_default_scale());
    apply_sink_oracle(&mut want, &sink);
    for (name, path) in paths() {
        for splits in [1, 3] {
            let (out, lse) = launch(path, &q, shape, &main, None, splits, true, Some(&sink));
            check(&format!("{name}: sinks splits={splits}"), &out, &lse, &want);
        }
    }
}
