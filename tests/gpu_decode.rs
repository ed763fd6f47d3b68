//! MLA decode attention on the GPU against the fp64 CPU reference (docs/contract.md §4, §9): dense over
//! the BF16 cache, sparse over BF16 and FP8-656, split-KV, the DCP identity and graph replay.
//! Every cache slot that no length or index covers holds NaN; outputs are poisoned (with a finite
//! value no attention gives) before launch.

mod common;

use common::*;
use cudarc::driver::sys;
use dcp_mla::formats::{encode_fp8_row, KvFormat, D_LATENT, D_QK, D_V};
use dcp_mla::ops::decode::*;
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::planner::schedule;
use dcp_mla::planner::split::sched_stamp;
use dcp_mla::reference::attention::{apply_sink_oracle, decode_oracle, QueryShape, Selection};
use dcp_mla::reference::fill::PagedCache;
use dcp_mla::reference::merge::merge_f64;
use dcp_mla::reference::tolerance::{check_attention, AttentionOracle};
use dcp_mla::runtime::{DeviceSlice, Stream};
use dcp_mla::{DcpLayout, LseBase};
use half::bf16;

/// One rank's paged cache on the host: a permuted block table and token rows, of which only
/// the written ones hold data; every other slot holds NaN (bf16 NaN, or 0xff bytes in FP8).
struct HostCache {
    format: KvFormat,
    block_size: usize,
    num_pages: usize,
    max_pages: usize,
    stride: usize,
    batch: usize,
    table: Vec<i32>,
    bytes: Vec<u8>,
}

impl HostCache {
    /// `pages[i]` pages for request i, at permuted physical pages, plus a few spare pages.
    fn new(rng: &mut Rng, format: KvFormat, block_size: usize, pages: &[usize]) -> Self {
        let batch = pages.len();
        let max_pages = pages.iter().copied().max().unwrap_or(0).max(1);
        let stride = max_pages + 2;
        let num_pages = pages.iter().sum::<usize>() + 3;
        let mut perm: Vec<i32> = (0..num_pages as i32).collect();
        rng.shuffle(&mut perm);
        let mut table = vec![-1i32; batch * stride];
        let mut next = 0;
        for (i, &n) in pages.iter().enumerate() {
            for c in 0..n {
                table[i * stride + c] = perm[next];
                next += 1;
            }
        }
        let nan_row: Vec<u8> = match format {
            KvFormat::Bf16 => (0..D_QK).flat_map(|_| bf16::NAN.to_bits().to_le_bytes()).collect(),
            KvFormat::Fp8_656 => vec![0xff; format.token_bytes()],
        };
        let bytes = nan_row.repeat(num_pages * block_size);
        HostCache { format, block_size, num_pages, max_pages, stride, batch, table, bytes }
    }

    fn paged(&self) -> PagedCache<'_> {
        PagedCache {
            block_table: &self.table,
            block_table_stride: self.stride,
            batch: self.batch,
            max_pages: self.max_pages,
            num_pages: self.num_pages,
            block_size: self.block_size,
            format: self.format,
        }
    }

    /// Cache row (page·B + slot) of local token `l` of request `i`.
    fn slot(&self, i: usize, l: usize) -> usize {
        self.table[i * self.stride + l / self.block_size] as usize * self.block_size + l % self.block_size
    }

    /// Writes one token row (576 values: c_kv then k_pe) into cache row `slot`.
    fn write(&mut self, slot: usize, row: &[bf16]) {
        let n = self.format.token_bytes();
        let dst = &mut self.bytes[slot * n..(slot + 1) * n];
        match self.format {
            KvFormat::Bf16 => {
                for (d, v) in dst.chunks_mut(2).zip(row) {
                    d.copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
            KvFormat::Fp8_656 => encode_fp8_row(&row[..D_LATENT], &row[D_LATENT..], dst),
        }
    }
}

fn random_row(rng: &mut Rng) -> Vec<bf16> {
    (0..D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect()
}

fn random_q(rng: &mut Rng, shape: QueryShape) -> Vec<bf16> {
    (0..shape.batch * shape.rows * shape.heads * D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect()
}

fn num_sms() -> usize {
    gpu().context().attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap() as usize
}

/// What outputs hold before a launch: finite and far from any attention value, so a row the
/// kernel leaves unwritten fails every check, NaN and −inf expectations included.
const POISON: f32 = -7.0e37;

/// Device outputs of one launch, poisoned before it.
struct DevOut {
    out_bf16: cudarc::driver::CudaSlice<bf16>,
    out_f32: cudarc::driver::CudaSlice<f32>,
    lse: cudarc::driver::CudaSlice<f32>,
    ws: cudarc::driver::CudaSlice<u8>,
    f32_out: bool,
}

impl DevOut {
    fn new(shape: QueryShape, splits: usize, f32_out: bool) -> Self {
        let s = stream();
        let rows = shape.batch * shape.rows * shape.heads;
        let ws = |sparse| decode_workspace_bytes(shape.batch, shape.rows, shape.heads, sparse, splits).unwrap();
        let ws_bytes = ws(false).max(ws(true)).max(16);
        DevOut {
            out_bf16: upload(&s, &vec![bf16::from_f32(POISON); rows * D_V]),
            out_f32: upload(&s, &vec![POISON; rows * D_V]),
            lse: upload(&s, &vec![POISON; rows]),
            ws: upload(&s, &vec![0xffu8; ws_bytes]),
            f32_out,
        }
    }

    fn common(&self, q: DeviceSlice<bf16>, shape: QueryShape, splits: usize) -> DecodeCommon {
        let s = stream();
        let out = if self.f32_out {
            DecodeOut::F32(view(&s, &self.out_f32))
        } else {
            DecodeOut::Bf16(view(&s, &self.out_bf16))
        };
        DecodeCommon::new(q, shape.batch, shape.rows, shape.heads, out, view(&s, &self.lse), splits, view(&s, &self.ws))
    }

    /// (out as f32, lse) after the stream drains.
    fn read(&self) -> (Vec<f32>, Vec<f32>) {
        let s = stream();
        s.synchronize().expect("kernel run");
        let out = if self.f32_out {
            download(&s, &self.out_f32)
        } else {
            download(&s, &self.out_bf16).iter().map(|x| x.to_f32()).collect()
        };
        (out, download(&s, &self.lse))
    }

    /// With a split launch, asserts that the unit prefix the schedule kernel wrote at the start
    /// of the workspace is the host mirror's for these sequence lengths and KV tile, and that its
    /// stamp names the tile, the sequences and the parts.
    fn check_schedule(&self, what: &str, splits: usize, seq_tokens: &[u64], tile: u64) {
        if splits <= 1 {
            return;
        }
        let bytes = download(&stream(), &self.ws);
        let got: Vec<i64> =
            bytes[..(seq_tokens.len() + 1) * 8].chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, schedule::schedule_units(seq_tokens, tile), "{what}: split schedule");
        let seqs = seq_tokens.len();
        // the stamp's offset depends on the sequence count only (sparse: a sequence a row)
        let at = SplitPlan::new(seqs, 1, 1, true, splits).unwrap().stamp_offset as usize;
        let stamp: Vec<i32> = bytes[at..at + 16].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(stamp, sched_stamp(tile as usize, seqs, splits), "{what}: the schedule's stamp");
        // the combine's part table after the stamp
        let at = at + 16;
        let table: Vec<[i32; 4]> = bytes[at..at + 16 * splits]
            .chunks(16)
            .map(|c| std::array::from_fn(|k| i32::from_le_bytes(c[4 * k..4 * k + 4].try_into().unwrap())))
            .collect();
        assert_eq!(table, schedule::combine_part_table(&got, splits), "{what}: the combine's part table");
    }

    /// Fills out and lse with the poison again (a second launch into the same outputs).
    fn poison(&mut self) {
        let s = stream();
        let rows = self.lse.len();
        s.memcpy_htod(&vec![bf16::from_f32(POISON); rows * D_V], &mut self.out_bf16).unwrap();
        s.memcpy_htod(&vec![POISON; rows * D_V], &mut self.out_f32).unwrap();
        s.memcpy_htod(&vec![POISON; rows], &mut self.lse).unwrap();
    }
}

/// docs/contract.md §9 against the fp64 oracle (reference::tolerance): out within 2^-6·A_c elementwise and
/// 3e-3 relative L2, lse within 1e-5 + 2e-6·|ref|, NaN/inf positions identical.
fn check(what: &str, out: &[f32], lse: &[f32], want: &AttentionOracle) {
    let got = check_attention(what, out.iter().map(|&x| x as f64), lse.iter().map(|&x| x as f64), want);
    if let Err(e) = got {
        panic!("{e}");
    }
}

/// Builds a cache holding `tokens[i]` local tokens of request i (NaN elsewhere).
fn dense_cache(rng: &mut Rng, format: KvFormat, block_size: usize, tokens: &[usize]) -> HostCache {
    dense_cache_of(rng, format, block_size, tokens, |rng, _, _| random_row(rng))
}

/// dense_cache with token l of a request of n tokens made by `row(rng, l, n)`.
fn dense_cache_of(
    rng: &mut Rng,
    format: KvFormat,
    block_size: usize,
    tokens: &[usize],
    mut row: impl FnMut(&mut Rng, usize, usize) -> Vec<bf16>,
) -> HostCache {
    let pages: Vec<usize> = tokens.iter().map(|&n| n.div_ceil(block_size)).collect();
    let mut hc = HostCache::new(rng, format, block_size, &pages);
    for (i, &n) in tokens.iter().enumerate() {
        for l in 0..n {
            let row = row(rng, l, n);
            let slot = hc.slot(i, l);
            hc.write(slot, &row);
        }
    }
    hc
}

/// The dense kernels this device runs: mma.sync everywhere, and on compute capability 9.0 each
/// shipped wgmma variant too.
fn dense_paths() -> Vec<DecodePath> {
    let mut v = vec![DecodePath::Mma];
    if gpu().compute_capability() == (9, 0) {
        v.extend(sm90_variants(KvFormat::Bf16, false).into_iter().map(|(tile, stages, schedule)| DecodePath::Wgmma {
            tile,
            stages,
            schedule,
        }));
    }
    narrowed(v, "dense")
}

/// DCP_MLA_TEST_SCHEDULES=lead,trio: only those sm90 schedules (kernels.toml's spelling), so that
/// a sanitizer run fits a device call (`scripts/gpu-run.sh racecheck-decode` sets it, one
/// schedule set a run; `tests` never does). The paths kept are printed; a format left with none
/// fails, never passes by running nothing.
fn narrowed(mut v: Vec<DecodePath>, what: &str) -> Vec<DecodePath> {
    if let Ok(only) = std::env::var("DCP_MLA_TEST_SCHEDULES") {
        let keep: Vec<&str> = only.split(',').map(str::trim).collect();
        v.retain(|p| matches!(p, DecodePath::Wgmma { schedule, .. } if keep.contains(&schedule.name())));
        eprintln!("DCP_MLA_TEST_SCHEDULES={only}: {what} paths {v:?}");
        assert!(!v.is_empty(), "DCP_MLA_TEST_SCHEDULES={only} leaves no {what} path: name one of its schedules too");
    }
    v
}

/// KV tokens per schedule unit of the kernel `path` names: the wgmma variant's tile, or the
/// mma.sync kernels' 32 (these tests always name the kernel they launch).
fn schedule_tile(path: DecodePath) -> u64 {
    match path {
        DecodePath::Wgmma { tile, .. } => tile as u64,
        DecodePath::Mma => 32,
        DecodePath::Auto => unreachable!("the tests name the kernel they launch"),
    }
}

/// A dense launch's inputs on the device (q, cache, block table, lengths); `lens` is mutable so a
/// test can relaunch with other lengths.
struct DenseDev {
    q: cudarc::driver::CudaSlice<bf16>,
    cache: cudarc::driver::CudaSlice<u8>,
    table: cudarc::driver::CudaSlice<i32>,
    lens: cudarc::driver::CudaSlice<i32>,
}

impl DenseDev {
    fn new(hc: &HostCache, q: &[bf16], lens: &[i32]) -> Self {
        let s = stream();
        DenseDev {
            q: upload(&s, q),
            cache: upload(&s, &hc.bytes),
            table: upload(&s, &hc.table),
            lens: upload(&s, lens),
        }
    }

    /// The launch of these inputs over `hc`'s pages into `outs` in `splits` parts.
    fn args(&self, hc: &HostCache, outs: &DevOut, shape: QueryShape, splits: usize) -> DenseDecode {
        let s = stream();
        DenseDecode {
            common: outs.common(view(&s, &self.q), shape, splits),
            cache: CacheView::packed(view(&s, &self.cache), hc.num_pages, hc.block_size),
            block_table: BlockTable { table: view(&s, &self.table), stride: hc.stride, max_pages: hc.max_pages },
            lens: view(&s, &self.lens),
            lens_strides: None,
            lens_rule: LensRule::Local,
        }
    }
}

/// Tokens the split schedule counts for each request: its longest row, clamped to the block
/// table's capacity.
fn dense_seq_tokens(hc: &HostCache, lens: &[i32], nq: usize) -> Vec<u64> {
    let cap = (hc.max_pages * hc.block_size) as i64;
    lens.chunks(nq).map(|r| r.iter().map(|&l| (l as i64).clamp(0, cap)).max().unwrap() as u64).collect()
}

/// A sparse launch's inputs on the device (q, cache, indices, optional topk_len).
struct SparseDev {
    q: cudarc::driver::CudaSlice<bf16>,
    cache: cudarc::driver::CudaSlice<u8>,
    idx: cudarc::driver::CudaSlice<i32>,
    topk_len: Option<cudarc::driver::CudaSlice<i32>>,
}

impl SparseDev {
    fn new(hc: &HostCache, q: &[bf16], idx: &[i32], topk_len: Option<&[i32]>) -> Self {
        let s = stream();
        SparseDev {
            q: upload(&s, q),
            cache: upload(&s, &hc.bytes),
            idx: upload(&s, idx),
            topk_len: topk_len.map(|t| upload(&s, t)),
        }
    }

    fn args(&self, hc: &HostCache, outs: &DevOut, shape: QueryShape, k: usize, splits: usize) -> SparseDecode {
        let s = stream();
        SparseDecode {
            common: outs.common(view(&s, &self.q), shape, splits),
            cache: CacheView::packed(view(&s, &self.cache), hc.num_pages, hc.block_size),
            format: hc.format,
            lists: IndexLists {
                topk_len: self.topk_len.as_ref().map(|t| view(&s, t)),
                ..IndexLists::new(view(&s, &self.idx), k)
            },
        }
    }
}

/// One dense launch of `path` into fresh poisoned outputs, with optional attention sinks (one per
/// head); checks the split schedule it left and returns (out as f32, lse).
#[allow(clippy::too_many_arguments)]
fn launch_dense(
    path: DecodePath,
    hc: &HostCache,
    q: &[bf16],
    shape: QueryShape,
    lens: &[i32],
    splits: usize,
    f32_out: bool,
    sink: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let s = stream();
    let dev = DenseDev::new(hc, q, lens);
    let outs = DevOut::new(shape, splits, f32_out);
    let sink_dev = sink.map(|v| upload(&s, v));
    let mut args = dev.args(hc, &outs, shape, splits);
    args.common.sink = sink_dev.as_ref().map(|d| view(&s, d));
    mla_decode_dense_on(gpu(), raw(&s), &args, path).expect("dense launch");
    let res = outs.read();
    outs.check_schedule(&format!("{path:?}"), splits, &dense_seq_tokens(hc, lens, shape.rows), schedule_tile(path));
    res
}

/// Row lengths of MTP rows: row j of a request of total length L sees L − q + 1 + j global
/// tokens (at least 0), of which rank r holds n_r.
fn mtp_lens(totals: &[usize], nq: usize, dcp: DcpLayout, r: usize) -> Vec<i32> {
    let mut v = Vec::new();
    for &l in totals {
        for j in 0..nq {
            let c = (l + 1 + j).saturating_sub(nq);
            v.push(dcp.local_len(c as u64, r) as i32);
        }
    }
    v
}

/// (request totals, q, H, block size, layout, rank).
type DenseCase = (&'static [usize], usize, usize, usize, DcpLayout, usize);

/// A batch of 64 short requests of varied lengths (0, 1, block edges and up to 180), so b = 64
/// stays cheap for the fp64 reference.
static BATCH_64_TOTALS: [usize; 64] = batch_64_totals();

const fn batch_64_totals() -> [usize; 64] {
    let mut t = [0usize; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = (i * 37 + 11) % 181;
        i += 1;
    }
    t[0] = 0;
    t[1] = 1;
    t[2] = 15;
    t[3] = 16;
    t[4] = 17;
    t[5] = 64;
    t[6] = 65;
    t
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dense_bf16_matches_reference() {
    let mut rng = Rng::new(seed());
    let one = DcpLayout { size: 1, interleave: 1 };
    let two = DcpLayout { size: 2, interleave: 1 };
    // (batch totals, q, H, block size, layout, rank)
    let cases: &[DenseCase] = &[
        (&[0], 1, 16, 64, one, 0),
        (&[1, 20], 1, 16, 64, one, 0),
        (&[63, 64, 65, 140, 2, 0], 2, 64, 64, one, 0),
        (&[140, 65], 4, 16, 16, two, 1),
        (&[70], 6, 128, 64, one, 0),
        (&[4096], 1, 64, 64, one, 0),
        (&[4096, 17], 2, 32, 64, two, 0),
        // uneven lengths: the split schedule spreads the long rows over many parts
        (&[6000, 0, 3, 64, 2000, 65, 1], 2, 32, 64, one, 0),
        (&BATCH_64_TOTALS, 2, 16, 16, one, 0),
        // the longest context of the matrix; b = 1 keeps the fp64 reference near 0.6 s
        (&[16384], 1, 32, 64, one, 0),
        // page sizes around the dense wgmma kernel's TMA boxes: 8 tokens (the smallest it takes,
        // eight pages a tile), 128 (two tiles a page), 48 (not a power of two: cp.async)
        (&[200, 70], 2, 16, 8, one, 0),
        (&[300, 129], 1, 64, 128, one, 0),
        (&[150, 40], 1, 16, 48, one, 0),
    ];
    let sms = num_sms();
    for (n, &(totals, nq, heads, block_size, dcp, rank)) in cases.iter().enumerate() {
        let shape = QueryShape { batch: totals.len(), rows: nq, heads };
        let lens = mtp_lens(totals, nq, dcp, rank);
        let tokens: Vec<usize> = lens.chunks(nq).map(|r| *r.iter().max().unwrap() as usize).collect();
        let hc = dense_cache(&mut rng, KvFormat::Bf16, block_size, &tokens);
        let q = random_q(&mut rng, shape);
        let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens: &lens }, default_scale());
        let auto = decode_num_splits(shape.batch, nq, heads, false, sms);
        for path in dense_paths() {
            for (splits, f32_out) in [(1, n % 2 == 0), (auto, n % 2 == 1), (7, false)] {
                let (out, lse) = launch_dense(path, &hc, &q, shape, &lens, splits, f32_out, None);
                let what = format!("{path:?} case {n} {totals:?} q={nq} H={heads} splits={splits}");
                check(&what, &out, &lse, &want);
            }
        }
    }
}

/// One token row scaled by `f` (then rounded to bf16): scores grow with f.
fn scaled_row(rng: &mut Rng, f: f32) -> Vec<bf16> {
    random_row(rng).into_iter().map(|v| bf16::from_f32(v.to_f32() * f)).collect()
}

/// How much a token's row is scaled at position `l` of a row of `n`: doubling from tile to tile
/// over the first six 64-token tiles (a tile's max then passes the running one by up to ~18 in
/// log2 units, beyond the scorers' lazy slack of 8, so those tiles are redone exactly), flat
/// after that (the lazy p are kept), and a jump in the last 70 tokens.
fn growth(l: usize, n: usize) -> f32 {
    if l + 70 >= n && n > 6 * 64 + 70 {
        16.0
    } else {
        0.25 * (1u32 << (l / 64).min(5)) as f32
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn growing_scores_match_reference() {
    // The Hopper scorers take a clean tile's p against the row's running max and redo the tile
    // when its max grew by more than the slack: rows whose scores rise, settle and jump should
    // take both paths (tools/diag/lazy-max-sim.py counts both on rows like these; the test itself
    // checks only the results), and must stay within docs/contract.md §9 either way.
    let mut rng = Rng::new(seed());
    let one = DcpLayout { size: 1, interleave: 1 };
    let sms = num_sms();
    for &(totals, nq, heads) in
        &[(&[3000usize, 1100, 700][..], 1usize, 64usize), (&[2200, 900][..], 2, 64), (&[1500][..], 1, 128)]
    {
        let shape = QueryShape { batch: totals.len(), rows: nq, heads };
        let lens = mtp_lens(totals, nq, one, 0);
        let tokens: Vec<usize> = lens.chunks(nq).map(|r| *r.iter().max().unwrap() as usize).collect();
        let hc = dense_cache_of(&mut rng, KvFormat::Bf16, 64, &tokens, |rng, l, n| scaled_row(rng, growth(l, n)));
        let q = random_q(&mut rng, shape);
        let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens: &lens }, default_scale());
        let auto = decode_num_splits(shape.batch, nq, heads, false, sms);
        for path in dense_paths() {
            for (splits, f32_out) in [(1, true), (auto, false)] {
                let (out, lse) = launch_dense(path, &hc, &q, shape, &lens, splits, f32_out, None);
                check(&format!("growing {path:?} {totals:?} q={nq} H={heads} splits={splits}"), &out, &lse, &want);
            }
        }
    }
    // Sparse, every index valid (clean tiles), listed in the order of their rows' growth.
    for format in [KvFormat::Bf16, KvFormat::Fp8_656] {
        let (batch, nq, k) = (2usize, 2usize, 2048usize);
        for heads in [64, 128] {
            let shape = QueryShape { batch, rows: nq, heads };
            let pages = k.div_ceil(64) + 1;
            let mut hc = HostCache::new(&mut rng, format, 64, &[pages]);
            let total = hc.num_pages * 64;
            let mut slots: Vec<usize> = (0..total).collect();
            rng.shuffle(&mut slots);
            slots.truncate(k);
            for (l, &slot) in slots.iter().enumerate() {
                let row = scaled_row(&mut rng, growth(l, k));
                hc.write(slot, &row);
            }
            let idx: Vec<i32> = (0..batch * nq).flat_map(|_| slots.iter().map(|&s| s as i32)).collect();
            let q = random_q(&mut rng, shape);
            let sel = Selection::Sparse { indices: &idx, k, topk_len: None };
            let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &sel, default_scale());
            for path in sparse_paths(format) {
                let (out, lse) = launch_sparse(path, &hc, &q, shape, &idx, k, None, 1, false, None);
                check(&format!("growing sparse {format:?} {path:?} H={heads}"), &out, &lse, &want);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nan_inputs_make_their_rows_nan() {
    // docs/contract.md §9: a NaN in q, or in a cache row a query row reads (its k part or only its v part),
    // makes that row's whole out and its lse NaN, never a finite or empty-looking (−inf) result,
    // also once the KV is split (the combine must not read the NaN lse as an empty piece); NaN
    // in slots no row reads never leaks. Outputs start as a finite poison, so a row left
    // unwritten cannot pass for NaN.
    let mut rng = Rng::new(seed());
    let shape = QueryShape { batch: 4, rows: 1, heads: 64 };
    let lens = [700, 333, 129, 190];
    let tokens = lens.map(|l| l as usize);
    let mut hc = dense_cache(&mut rng, KvFormat::Bf16, 64, &tokens);
    let mut q = random_q(&mut rng, shape);
    q[(5 * D_QK) + 17] = bf16::NAN; // request 0, head 5
    let mut row: Vec<bf16> = (0..D_QK).map(|_| bf16::from_f32(0.25)).collect();
    // request 1: token 200's k (dim 515, a rope dim) is NaN: every head of request 1 sees a NaN score
    row[515] = bf16::NAN;
    hc.write(hc.slot(1, 200), &row);
    // request 3: token 150's v (dim 300: the second column half) alone is NaN; its scores are finite
    row[515] = bf16::from_f32(0.25);
    row[300] = bf16::NAN;
    hc.write(hc.slot(3, 150), &row);
    let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens: &lens }, default_scale());
    assert!(want.lse[5].is_nan() && want.lse[64].is_nan() && want.lse[2 * 64].is_finite() && want.lse[3 * 64].is_nan());
    assert!(want.out[3 * 64 * D_V..].iter().all(|x| x.is_nan()), "the oracle's v-only NaN rows are NaN throughout");
    for path in dense_paths() {
        for splits in [1, 5] {
            let (out, lse) = launch_dense(path, &hc, &q, shape, &lens, splits, splits == 5, None);
            check(&format!("{path:?} NaN rows splits={splits}"), &out, &lse, &want);
        }
    }
    // sparse, BF16 and FP8: a v-only NaN (FP8: a NaN e4m3 code in group 1) in a picked token
    // makes the rows that pick it NaN; the rows that do not pick it stay finite
    for format in [KvFormat::Bf16, KvFormat::Fp8_656] {
        let shape = QueryShape { batch: 1, rows: 3, heads: 64 };
        let k = 512;
        let (mut hc, mut idx) = sparse_case(&mut rng, format, shape, k, &[]);
        let bad =
            idx[k..2 * k].iter().copied().find(|&x| x >= 0 && (x as usize) < hc.num_pages * hc.block_size).unwrap();
        for (i, x) in idx.iter_mut().enumerate() {
            if *x == bad && !(k..2 * k).contains(&i) {
                *x = -1; // only row 1 reads the bad token
            }
        }
        let mut row = random_row(&mut rng);
        row[200] = bf16::NAN;
        hc.write(bad as usize, &row);
        let q = random_q(&mut rng, shape);
        let sel = Selection::Sparse { indices: &idx, k, topk_len: None };
        let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &sel, default_scale());
        assert!(want.lse[64..128].iter().all(|x| x.is_nan()) && want.lse[..64].iter().all(|x| x.is_finite()));
        for path in sparse_paths(format) {
            for splits in [1, 3] {
                let (out, lse) = launch_sparse(path, &hc, &q, shape, &idx, k, None, splits, false, None);
                check(&format!("{path:?} {format:?} v-only NaN splits={splits}"), &out, &lse, &want);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dense_invalid_pages_are_skipped() {
    // Block-table entries inside a request's length that name no page (−1, or past num_pages)
    // hide their tokens: whole tiles of them (TMA boxes pointed past the cache, zero-filled) and
    // parts of tiles, for pages of 64 and of 16 tokens.
    let mut rng = Rng::new(seed());
    for block_size in [64, 16] {
        let shape = QueryShape { batch: 2, rows: 1, heads: 64 };
        let lens = [700, 333];
        let tokens = lens.map(|l| l as usize);
        let mut hc = dense_cache(&mut rng, KvFormat::Bf16, block_size, &tokens);
        let bad = hc.num_pages as i32 + 7;
        for (i, c) in [(0, 1), (0, 5), (1, 2), (1, 333 / block_size)] {
            hc.table[i * hc.stride + c] = if c % 2 == 0 { -1 } else { bad };
        }
        let q = random_q(&mut rng, shape);
        let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens: &lens }, default_scale());
        for path in dense_paths() {
            for splits in [1, 5] {
                let (out, lse) = launch_dense(path, &hc, &q, shape, &lens, splits, false, None);
                check(&format!("{path:?} B={block_size} splits={splits}"), &out, &lse, &want);
            }
        }
        // a cache of no pages: every entry names no page, so every row is empty (0, −inf); an
        // argument like any other, not a failure of the TMA descriptor's encoding
        let hc = HostCache { num_pages: 0, ..hc };
        let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens: &lens }, default_scale());
        assert!(want.lse.iter().all(|&l| l == f64::NEG_INFINITY));
        for path in dense_paths() {
            let (out, lse) = launch_dense(path, &hc, &q, shape, &lens, 1, false, None);
            check(&format!("{path:?} B={block_size} no pages"), &out, &lse, &want);
        }
    }
}

/// A cache whose `used` random slots hold data (NaN elsewhere), and index rows drawn from them
/// with −1 and out-of-range entries mixed in. `empty_rows` rows are all −1.
fn sparse_case(
    rng: &mut Rng,
    format: KvFormat,
    shape: QueryShape,
    k: usize,
    empty_rows: &[usize],
) -> (HostCache, Vec<i32>) {
    let block_size = 64;
    let pages = (2 * k).div_ceil(block_size) + 1;
    let mut hc = HostCache::new(rng, format, block_size, &[pages]);
    let total = hc.num_pages * block_size;
    let mut used: Vec<usize> = (0..total).collect();
    rng.shuffle(&mut used);
    used.truncate(total / 2);
    for &slot in &used {
        let row = random_row(rng);
        hc.write(slot, &row);
    }
    let rows = shape.batch * shape.rows;
    let mut idx = Vec::with_capacity(rows * k);
    for r in 0..rows {
        for _ in 0..k {
            let v = if empty_rows.contains(&r) {
                -1
            } else {
                match rng.below(16) {
                    0 => -1,
                    1 => total as i32 + rng.below(100) as i32, // out of range: unused
                    2 => -2 - rng.below(100) as i32,
                    _ => used[rng.below(used.len() as u64) as usize] as i32,
                }
            };
            idx.push(v);
        }
    }
    (hc, idx)
}

/// The sparse kernels this device runs for a format: mma.sync everywhere, and on compute
/// capability 9.0 each wgmma variant shipped for the format too.
fn sparse_paths(format: KvFormat) -> Vec<DecodePath> {
    let mut v = vec![DecodePath::Mma];
    if gpu().compute_capability() == (9, 0) {
        let shipped = sm90_variants(format, true);
        v.extend(shipped.into_iter().map(|(tile, stages, schedule)| DecodePath::Wgmma { tile, stages, schedule }));
    }
    narrowed(v, &format!("{format:?}"))
}

/// As [`launch_dense`], over index lists (optional per-row counts `topk_len`).
#[allow(clippy::too_many_arguments)]
fn launch_sparse(
    path: DecodePath,
    hc: &HostCache,
    q: &[bf16],
    shape: QueryShape,
    idx: &[i32],
    k: usize,
    topk_len: Option<&[i32]>,
    splits: usize,
    f32_out: bool,
    sink: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let s = stream();
    let dev = SparseDev::new(hc, q, idx, topk_len);
    let outs = DevOut::new(shape, splits, f32_out);
    let sink_dev = sink.map(|v| upload(&s, v));
    let mut args = dev.args(hc, &outs, shape, k, splits);
    args.common.sink = sink_dev.as_ref().map(|d| view(&s, d));
    mla_decode_sparse_on(gpu(), raw(&s), &args, path).expect("sparse launch");
    let res = outs.read();
    let rows = shape.batch * shape.rows;
    let seq_tokens: Vec<u64> =
        (0..rows).map(|i| topk_len.map_or(k as i64, |t| (t[i] as i64).clamp(0, k as i64)) as u64).collect();
    outs.check_schedule(&format!("sparse {path:?}"), splits, &seq_tokens, schedule_tile(path));
    res
}

/// (format, b, q, H, K, with topk_len, rows that are all −1).
type SparseCase = (KvFormat, usize, usize, usize, usize, bool, &'static [usize]);

#[test]
#[ignore = "needs a CUDA GPU"]
fn sparse_matches_reference() {
    let mut rng = Rng::new(seed());
    let sms = num_sms();
    // (format, b, q, H, K, with topk_len, rows that are all −1)
    let cases: &[SparseCase] = &[
        (KvFormat::Fp8_656, 2, 2, 64, 512, true, &[1]),
        (KvFormat::Bf16, 1, 1, 128, 2048, false, &[]),
        (KvFormat::Fp8_656, 3, 1, 16, 512, false, &[0, 2]),
        (KvFormat::Fp8_656, 1, 4, 32, 2048, true, &[]),
        (KvFormat::Bf16, 2, 6, 16, 512, true, &[5]),
        (KvFormat::Fp8_656, 1, 1, 16, 512, false, &[0]),
        (KvFormat::Bf16, 2, 2, 32, 2048, true, &[2]),
        // two row blocks a query row (two CTAs of one list), the second block full (128) or half
        // empty (96)
        (KvFormat::Fp8_656, 2, 2, 128, 2048, true, &[1]),
        (KvFormat::Fp8_656, 3, 1, 96, 512, false, &[2]),
        // more query rows than SMs, unsplit: several waves of CTAs (lists of length 0 among them)
        (KvFormat::Fp8_656, 150, 2, 16, 512, true, &[7]),
    ];
    for (n, &(format, batch, nq, heads, k, with_len, empty)) in cases.iter().enumerate() {
        let shape = QueryShape { batch, rows: nq, heads };
        let (hc, idx) = sparse_case(&mut rng, format, shape, k, empty);
        // topk_len: 0, K, beyond K and random values in between
        let tl: Vec<i32> = (0..batch * nq)
            .map(|r| match r % 4 {
                0 => k as i32,
                1 => 0,
                2 => k as i32 + 5,
                _ => rng.below(k as u64) as i32,
            })
            .collect();
        let tl = with_len.then_some(tl.as_slice());
        let q = random_q(&mut rng, shape);
        let sel = Selection::Sparse { indices: &idx, k, topk_len: tl };
        let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &sel, default_scale());
        for &r in empty {
            assert!(want.lse[r * heads] == f64::NEG_INFINITY);
        }
        let auto = decode_num_splits(batch, nq, heads, true, sms);
        for (path, (splits, f32_out)) in sparse_paths(format)
            .into_iter()
            .flat_map(|p| [(1, n % 2 == 1), (auto, n % 2 == 0), (3, false)].map(|x| (p, x)))
        {
            let (out, lse) = launch_sparse(path, &hc, &q, shape, &idx, k, tl, splits, f32_out, None);
            check(
                &format!("{path:?} case {n} {format:?} b={batch} q={nq} H={heads} K={k} splits={splits}"),
                &out,
                &lse,
                &want,
            );
        }
    }
}

/// Sinks of `heads` heads covering the contract's cases (docs/contract.md §4): finite values
/// around the rows' lse (so the factor lies well inside (0, 1)), −inf (out unchanged), +inf
/// (out 0) and NaN (out NaN on a row that reads tokens, 0 on an empty one).
fn sinks(rng: &mut Rng, heads: usize) -> Vec<f32> {
    (0..heads)
        .map(|h| match h % 8 {
            0 => f32::NEG_INFINITY,
            3 => f32::INFINITY,
            5 => f32::NAN,
            _ => (rng.below(2000) as f32 - 1000.0) / 200.0,
        })
        .collect()
}

/// Attention sinks in decode on every schedule, unsplit and split (the split rows take theirs in
/// the combine, the others in the decode epilogue), BF16 and fp32 out: out equals the oracle's
/// out scaled by e^lse / (e^lse + e^sink) within docs/contract.md §9's bound (scaled likewise),
/// and lse is the tokens' alone.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sinks_scale_rows_like_the_reference() {
    let mut rng = Rng::new(seed());
    let sms = num_sms();
    let one = DcpLayout { size: 1, interleave: 1 };
    // dense: an empty request, MTP rows, two row blocks (H = 128), a long row split many ways
    for (n, &(totals, nq, heads)) in
        [(&[0usize, 70, 200][..], 2usize, 16usize), (&[130, 5][..], 1, 128), (&[3000][..], 1, 64)].iter().enumerate()
    {
        let shape = QueryShape { batch: totals.len(), rows: nq, heads };
        let lens = mtp_lens(totals, nq, one, 0);
        let tokens: Vec<usize> = lens.chunks(nq).map(|r| *r.iter().max().unwrap() as usize).collect();
        let hc = dense_cache(&mut rng, KvFormat::Bf16, 64, &tokens);
        let q = random_q(&mut rng, shape);
        let sink = sinks(&mut rng, heads);
        let mut want =
            decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens: &lens }, default_scale());
        apply_sink_oracle(&mut want, &sink);
        let auto = decode_num_splits(shape.batch, nq, heads, false, sms);
        for path in dense_paths() {
            for (splits, f32_out) in [(1, n % 2 == 0), (auto, n % 2 == 1), (7, true)] {
                let (out, lse) = launch_dense(path, &hc, &q, shape, &lens, splits, f32_out, Some(&sink));
                check(&format!("sink {path:?} dense case {n} splits={splits}"), &out, &lse, &want);
            }
        }
    }
    // sparse: both formats, an all −1 row, two row blocks (FP8, H = 128)
    let cases: &[SparseCase] = &[
        (KvFormat::Fp8_656, 2, 2, 64, 512, false, &[1]),
        (KvFormat::Bf16, 1, 2, 32, 2048, false, &[]),
        (KvFormat::Fp8_656, 2, 2, 128, 2048, false, &[2]),
    ];
    for (n, &(format, batch, nq, heads, k, _, empty)) in cases.iter().enumerate() {
        let shape = QueryShape { batch, rows: nq, heads };
        let (hc, idx) = sparse_case(&mut rng, format, shape, k, empty);
        let q = random_q(&mut rng, shape);
        let sink = sinks(&mut rng, heads);
        let sel = Selection::Sparse { indices: &idx, k, topk_len: None };
        let mut want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &sel, default_scale());
        apply_sink_oracle(&mut want, &sink);
        let auto = decode_num_splits(batch, nq, heads, true, sms);
        for path in sparse_paths(format) {
            for (splits, f32_out) in [(1, n % 2 == 1), (auto, n % 2 == 0), (3, true)] {
                let (out, lse) = launch_sparse(path, &hc, &q, shape, &idx, k, None, splits, f32_out, Some(&sink));
                check(&format!("sink {path:?} sparse case {n} {format:?} splits={splits}"), &out, &lse, &want);
            }
        }
    }
}

/// `data` [outer.., inner] laid out with `pad` more slots in each of its dims (innermost: `pad_inner`
/// more elements), the slots outside the view filled with `fill`; returns the buffer and the
/// view's strides (outermost first, without the innermost 1).
fn padded<T: Copy>(data: &[T], dims: &[usize], pad: usize, pad_inner: usize, fill: T) -> (Vec<T>, Vec<usize>) {
    let inner = *dims.last().unwrap();
    let mut big: Vec<usize> = dims.iter().map(|d| d + pad).collect();
    *big.last_mut().unwrap() = inner + pad_inner;
    let mut strides = vec![1usize; dims.len()];
    for i in (0..dims.len() - 1).rev() {
        strides[i] = strides[i + 1] * big[i + 1];
    }
    let mut buf = vec![fill; big.iter().product()];
    for (i, chunk) in data.chunks(inner).enumerate() {
        // the row's index in each outer dim
        let (mut rest, mut at) = (i, 0);
        for d in (0..dims.len() - 1).rev() {
            at += (rest % dims[d]) * strides[d];
            rest /= dims[d];
        }
        buf[at..at + inner].copy_from_slice(chunk);
    }
    strides.pop();
    (buf, strides)
}

/// fp32 out and lse as views: out [b, q, H, 512] in rows 576 apart with a spare head a query row,
/// lse in FlashMLA's [b, H, q] layout (the [b, q, H] view's strides [H·q, 1, q]); every other
/// element holds the poison. `read` gives both in [b, q, H] order.
struct ViewOutputs {
    out: cudarc::driver::CudaSlice<f32>,
    lse: cudarc::driver::CudaSlice<f32>,
    shape: QueryShape,
}

impl ViewOutputs {
    const PITCH: usize = 576;

    fn new(shape: QueryShape) -> Self {
        let s = stream();
        let (b, q, h) = (shape.batch, shape.rows, shape.heads);
        ViewOutputs {
            out: upload(&s, &vec![POISON; b * q * (h + 1) * Self::PITCH]),
            lse: upload(&s, &vec![POISON; b * h * q]),
            shape,
        }
    }

    /// Points `c`'s out and lse at the views.
    fn attach(&self, c: &mut DecodeCommon) {
        let s = stream();
        let (q, h) = (self.shape.rows, self.shape.heads);
        c.out = DecodeOut::F32(view(&s, &self.out));
        c.out_strides = Some([q * (h + 1) * Self::PITCH, (h + 1) * Self::PITCH, Self::PITCH]);
        c.lse = view(&s, &self.lse);
        c.lse_strides = Some([h * q, 1, q]);
    }

    fn read(&self) -> (Vec<f32>, Vec<f32>) {
        let s = stream();
        s.synchronize().expect("kernel run");
        let (b, q, h) = (self.shape.batch, self.shape.rows, self.shape.heads);
        let (big, lse_big) = (download(&s, &self.out), download(&s, &self.lse));
        let mut out = Vec::with_capacity(b * q * h * D_V);
        let mut lse = Vec::with_capacity(b * q * h);
        for i in 0..b {
            for j in 0..q {
                for k in 0..h {
                    let row = ((i * q + j) * (h + 1) + k) * Self::PITCH;
                    out.extend_from_slice(&big[row..row + D_V]);
                    lse.push(lse_big[(i * h + k) * q + j]);
                }
            }
        }
        // nothing outside the views was written
        let inside = b * q * h * D_V;
        assert_eq!(big.iter().filter(|x| x.to_bits() == POISON.to_bits()).count(), big.len() - inside);
        (out, lse)
    }
}

/// The same pages with `extra` more rows after each page's `block_size` (0xff bytes: NaN in bf16
/// and FP8), as a view of a larger page dimension; returns the bytes and the page stride in rows.
fn padded_pages(hc: &HostCache, extra: usize) -> (Vec<u8>, usize) {
    let row = hc.format.token_bytes();
    let page = hc.block_size * row;
    let stride = hc.block_size + extra;
    let mut buf = vec![0xffu8; hc.num_pages * stride * row];
    for (p, bytes) in hc.bytes.chunks(page).enumerate() {
        buf[p * stride * row..][..page].copy_from_slice(bytes);
    }
    (buf, stride)
}

/// Two launches' (out, lse) are equal bit for bit, their lengths included (a zip alone would
/// pass a short read).
fn assert_same_bits(what: &str, want: &(Vec<f32>, Vec<f32>), got: &(Vec<f32>, Vec<f32>)) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert!(bits(&want.0) == bits(&got.0), "{what}: out");
    assert!(bits(&want.1) == bits(&got.1), "{what}: lse");
}

/// Strided views (docs/contract.md §4): q, the index lists, the cache's pages, the lengths, out
/// (rows 576 apart) and lse (FlashMLA's [b, H, q] layout; dense also with its +inf for an empty
/// row, `empty_lse_inf`) as views of larger buffers (NaN or a negative length in every slot outside the view; the sparse
/// index counts one a request, broadcast over its query rows by a stride of 0) give bit for bit
/// the contiguous launch's out and lse, on every schedule, unsplit and split.
#[test]
#[ignore = "needs a CUDA GPU"]
fn strided_views_match_contiguous() {
    let mut rng = Rng::new(seed());
    let s = stream();
    let nan_q = bf16::from_bits(0x7fc0);
    // dense: MTP rows, two row blocks, pages of 64 (TMA) and 48 (cp.async)
    for (n, &(totals, nq, heads, block_size)) in
        [(&[300usize, 0, 65][..], 2usize, 64usize, 64usize), (&[200, 90][..], 1, 16, 48)].iter().enumerate()
    {
        let shape = QueryShape { batch: totals.len(), rows: nq, heads };
        let lens = mtp_lens(totals, nq, DcpLayout { size: 1, interleave: 1 }, 0);
        let tokens: Vec<usize> = lens.chunks(nq).map(|r| *r.iter().max().unwrap() as usize).collect();
        let hc = dense_cache(&mut rng, KvFormat::Bf16, block_size, &tokens);
        let q = random_q(&mut rng, shape);
        let (q_big, q_strides) = padded(&q, &[shape.batch, nq, heads, D_QK], 1, 64, nan_q);
        let (cache_big, page_stride) = padded_pages(&hc, 3);
        let (lens_big, lens_strides) = padded(&lens, &[shape.batch, nq], 1, 1, -5);
        let dev = DenseDev::new(&hc, &q, &lens);
        let (d_q, d_cache, d_lens) = (upload(&s, &q_big), upload(&s, &cache_big), upload(&s, &lens_big));
        for path in dense_paths() {
            for splits in [1, 5] {
                let plain = DevOut::new(shape, splits, true);
                mla_decode_dense_on(gpu(), raw(&s), &dev.args(&hc, &plain, shape, splits), path).expect("dense launch");
                let strided = DevOut::new(shape, splits, true);
                let mut args = dev.args(&hc, &strided, shape, splits);
                args.common.q = view(&s, &d_q);
                args.common.q_strides = Some([q_strides[0], q_strides[1], q_strides[2]]);
                args.cache.bytes = view(&s, &d_cache);
                args.cache.page_stride = Some(page_stride);
                args.lens = view(&s, &d_lens);
                // `padded` gives the outer dims' strides; the last dim's is 1
                args.lens_strides = Some([lens_strides[0], 1]);
                let views = ViewOutputs::new(shape);
                views.attach(&mut args.common);
                // and FlashMLA's +inf for a row that sees no token (request 1 here), split or not
                args.common.empty_lse_inf = true;
                mla_decode_dense_on(gpu(), raw(&s), &args, path).expect("strided dense launch");
                let (want, got) = (plain.read(), views.read());
                let what = format!("strided dense case {n} {path:?} splits={splits}");
                // FlashMLA's +inf where the contiguous launch wrote −inf for an empty row
                let flashmla = |x: f32| if x == f32::NEG_INFINITY { f32::INFINITY } else { x };
                let want = (want.0, want.1.into_iter().map(flashmla).collect());
                assert_same_bits(&what, &want, &got);
            }
        }
    }
    // sparse: both formats, two row blocks
    for (n, &(format, batch, nq, heads, k)) in [
        (KvFormat::Fp8_656, 2usize, 2usize, 64usize, 512usize),
        (KvFormat::Bf16, 1, 2, 32, 2048),
        (KvFormat::Fp8_656, 2, 1, 128, 2048),
    ]
    .iter()
    .enumerate()
    {
        let shape = QueryShape { batch, rows: nq, heads };
        let (hc, idx) = sparse_case(&mut rng, format, shape, k, &[]);
        let q = random_q(&mut rng, shape);
        let (q_big, q_strides) = padded(&q, &[batch, nq, heads, D_QK], 1, 64, nan_q);
        let (idx_big, idx_strides) = padded(&idx, &[batch, nq, k], 1, 5, 0);
        let (cache_big, page_stride) = padded_pages(&hc, 1);
        // one index count a request (FlashMLA's topk_length), broadcast over its query rows
        let per_request: Vec<i32> = (0..batch).map(|i| (k - 37 * (i + 1)) as i32).collect();
        let per_row: Vec<i32> = per_request.iter().flat_map(|&n| std::iter::repeat_n(n, nq)).collect();
        let d_per_request = upload(&s, &per_request);
        let dev = SparseDev::new(&hc, &q, &idx, Some(&per_row));
        let (d_q, d_idx, d_cache) = (upload(&s, &q_big), upload(&s, &idx_big), upload(&s, &cache_big));
        for path in sparse_paths(format) {
            for splits in [1, 3] {
                let plain = DevOut::new(shape, splits, true);
                mla_decode_sparse_on(gpu(), raw(&s), &dev.args(&hc, &plain, shape, k, splits), path)
                    .expect("sparse launch");
                let strided = DevOut::new(shape, splits, true);
                let mut args = dev.args(&hc, &strided, shape, k, splits);
                args.common.q = view(&s, &d_q);
                args.common.q_strides = Some([q_strides[0], q_strides[1], q_strides[2]]);
                args.lists.indices = view(&s, &d_idx);
                args.lists.indices_strides = Some([idx_strides[0], idx_strides[1]]);
                args.cache.bytes = view(&s, &d_cache);
                args.cache.page_stride = Some(page_stride);
                args.lists.topk_len = Some(view(&s, &d_per_request));
                args.lists.topk_len_strides = Some([1, 0]);
                let views = ViewOutputs::new(shape);
                views.attach(&mut args.common);
                mla_decode_sparse_on(gpu(), raw(&s), &args, path).expect("strided sparse launch");
                let (want, got) = (plain.read(), views.read());
                let what = format!("strided sparse case {n} {format:?} {path:?} splits={splits}");
                assert_same_bits(&what, &want, &got);
            }
        }
    }
}

/// Sparse pages of any block size a stride apart (FlashMLA's own tests use B = 61, 53, 69 and
/// 576 with a page stride of B + 1): the kernels divide an index by B with the launcher's magic
/// number, and the page view gives bit for bit the packed launch's out and lse (packed pages
/// read index v at cache row v, whatever B is), on every schedule, unsplit and split.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sparse_pages_of_any_block_size_a_stride_apart() {
    let mut rng = Rng::new(seed());
    let s = stream();
    for (n, &(format, batch, nq, heads, k, b, extra)) in [
        (KvFormat::Fp8_656, 2usize, 2usize, 64usize, 512usize, 61usize, 1usize),
        (KvFormat::Bf16, 1, 1, 32, 2048, 53, 3),
        (KvFormat::Fp8_656, 2, 1, 128, 2048, 576, 1),
        (KvFormat::Fp8_656, 1, 1, 64, 512, 69, 1),
        (KvFormat::Bf16, 1, 2, 64, 512, 1, 2),
    ]
    .iter()
    .enumerate()
    {
        let shape = QueryShape { batch, rows: nq, heads };
        let (mut hc, idx) = sparse_case(&mut rng, format, shape, k, &[]);
        // the same rows as packed pages of b tokens; indices past the last whole page are
        // unused in both launches
        let rows = hc.num_pages * hc.block_size;
        hc.block_size = b;
        hc.num_pages = rows / b;
        hc.bytes.truncate(hc.num_pages * b * format.token_bytes());
        let q = random_q(&mut rng, shape);
        let (cache_big, page_stride) = padded_pages(&hc, extra);
        let dev = SparseDev::new(&hc, &q, &idx, None);
        let d_cache = upload(&s, &cache_big);
        for path in sparse_paths(format) {
            for splits in [1, 3] {
                let plain = DevOut::new(shape, splits, true);
                mla_decode_sparse_on(gpu(), raw(&s), &dev.args(&hc, &plain, shape, k, splits), path)
                    .expect("sparse launch");
                let strided = DevOut::new(shape, splits, true);
                let mut args = dev.args(&hc, &strided, shape, k, splits);
                args.cache.bytes = view(&s, &d_cache);
                args.cache.page_stride = Some(page_stride);
                mla_decode_sparse_on(gpu(), raw(&s), &args, path).expect("sparse launch over a page view");
                let (want, got) = (plain.read(), strided.read());
                let what = format!("case {n} {format:?} B={b} stride {page_stride} {path:?} splits={splits}");
                assert!(want.1.iter().any(|l| l.is_finite()), "{what}: no row read a token");
                assert_same_bits(&what, &want, &got);
            }
        }
    }
}

/// The kernels' length rule (`DenseDecode::lens_rule`): each request's global length, causal
/// MTP rows or not, on ranks of D = 1, 2, 4, 8 with I = 1 and 64, gives bit for bit the launch
/// whose rows' local lengths were worked out on the host (`LensRule::row_len`, checked against
/// the contract's ownership rule on the CPU), on every schedule, unsplit and split; the global
/// lengths are read as a [b] tensor broadcast over the rows (strides {1, 0}).
#[test]
#[ignore = "needs a CUDA GPU"]
fn global_lengths_match_the_rows_local_lengths() {
    let mut rng = Rng::new(seed());
    let s = stream();
    let totals: [i32; 5] = [700, 0, 65, 1, 130];
    for (d, i) in [(1usize, 1usize), (2, 1), (2, 64), (4, 1), (4, 64), (8, 1), (8, 64)] {
        let dcp = DcpLayout { size: d, interleave: i };
        for (nq, heads) in [(1usize, 64usize), (2, 64), (6, 16)] {
            let rank = (d * 5 + nq) % d; // a rank that varies with the case
            for causal in [false, true] {
                let rule = LensRule::Global { dcp, rank, causal };
                let shape = QueryShape { batch: totals.len(), rows: nq, heads };
                let local: Vec<i32> =
                    totals.iter().flat_map(|&l| (0..nq).map(move |j| rule.row_len(l as i64, nq, j) as i32)).collect();
                let tokens: Vec<usize> = local.chunks(nq).map(|r| *r.iter().max().unwrap() as usize).collect();
                let hc = dense_cache(&mut rng, KvFormat::Bf16, 64, &tokens);
                let q = random_q(&mut rng, shape);
                let dev = DenseDev::new(&hc, &q, &local);
                let d_global = upload(&s, &totals);
                for path in dense_paths() {
                    for splits in [1, 5] {
                        let plain = DevOut::new(shape, splits, true);
                        mla_decode_dense_on(gpu(), raw(&s), &dev.args(&hc, &plain, shape, splits), path)
                            .expect("dense launch");
                        let ruled = DevOut::new(shape, splits, true);
                        let mut args = dev.args(&hc, &ruled, shape, splits);
                        args.lens = view(&s, &d_global);
                        args.lens_strides = Some([1, 0]);
                        args.lens_rule = rule;
                        mla_decode_dense_on(gpu(), raw(&s), &args, path).expect("dense launch, global lengths");
                        let (want, got) = (plain.read(), ruled.read());
                        let what =
                            format!("D={d} I={i} r={rank} q={nq} H={heads} causal={causal} {path:?} splits={splits}");
                        assert_same_bits(&what, &want, &got);
                        ruled.check_schedule(&what, splits, &dense_seq_tokens(&hc, &local, nq), schedule_tile(path));
                    }
                }
            }
        }
    }
}

/// Shards sequences over D ∈ {2, 4, 8} ranks on one GPU (each rank's cache holds only its
/// tokens, NaN elsewhere), runs the per-shard dense kernel with fp32 output, merges with the
/// reference merge, and compares with attention over the whole sequence.
#[test]
#[ignore = "needs a CUDA GPU"]
fn dcp_identity_dense() {
    let mut rng = Rng::new(seed());
    let (nq, heads, block_size) = (2, 16, 16);
    // 1 token: every rank but 0 is empty for the first row; 301: not divisible by D·I
    let totals = [1usize, 301, 140];
    let shape = QueryShape { batch: totals.len(), rows: nq, heads };
    let n_rows = shape.batch * nq * heads;
    let q = random_q(&mut rng, shape);
    // The whole sequences: global token t of request i.
    let global: Vec<Vec<Vec<bf16>>> = totals.iter().map(|&l| (0..l).map(|_| random_row(&mut rng)).collect()).collect();
    let one = DcpLayout { size: 1, interleave: 1 };
    let full_lens = mtp_lens(&totals, nq, one, 0);
    let mut full = HostCache::new(&mut rng, KvFormat::Bf16, block_size, &totals.map(|l| l.div_ceil(block_size)));
    for (i, seq) in global.iter().enumerate() {
        for (t, row) in seq.iter().enumerate() {
            let slot = full.slot(i, t);
            full.write(slot, row);
        }
    }
    let want =
        decode_oracle(&q, shape, &full.paged(), &full.bytes, &Selection::Dense { lens: &full_lens }, default_scale());
    for (path, (d, interleave)) in
        dense_paths().into_iter().flat_map(|p| [(2, 1), (4, 1), (4, 2), (8, 1), (8, 2)].map(|c| (p, c)))
    {
        let dcp = DcpLayout { size: d, interleave };
        let mut outs = Vec::new();
        let mut lses = Vec::new();
        for r in 0..d {
            let lens = mtp_lens(&totals, nq, dcp, r);
            let pages: Vec<usize> =
                totals.iter().map(|&l| (dcp.local_len(l as u64, r) as usize).div_ceil(block_size)).collect();
            let mut hc = HostCache::new(&mut rng, KvFormat::Bf16, block_size, &pages);
            for (i, seq) in global.iter().enumerate() {
                for (t, row) in seq.iter().enumerate() {
                    if dcp.owner(t as u64) == r {
                        let slot = hc.slot(i, dcp.local(t as u64) as usize);
                        hc.write(slot, row);
                    }
                }
            }
            let splits = if r % 2 == 0 { 1 } else { 3 };
            let (out, lse) = launch_dense(path, &hc, &q, shape, &lens, splits, true, None);
            outs.extend(out);
            lses.extend(lse);
        }
        let (out, lse) = merge_f64(&outs, &lses, d, n_rows, LseBase::E);
        let out: Vec<f32> = out.iter().map(|&x| x as f32).collect();
        let lse: Vec<f32> = lse.iter().map(|&x| x as f32).collect();
        check(&format!("{path:?} D={d} I={interleave}"), &out, &lse, &want);
    }
}

/// Captures dense and sparse decode (with splits, so the combine is captured too) into one
/// graph, then replays it after changing the lengths and indices in place.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_with_changed_lengths_and_indices() {
    for path in dense_paths() {
        graph_replay_case(path);
    }
}

fn graph_replay_case(path: DecodePath) {
    let mut rng = Rng::new(seed());
    let s = gpu().context().new_stream().expect("stream");
    let shape = QueryShape { batch: 2, rows: 2, heads: 32 };
    let splits = 5;
    let k = 512;
    let hc = dense_cache(&mut rng, KvFormat::Bf16, 64, &[300, 300]);
    let (shc, idx_a) = sparse_case(&mut rng, KvFormat::Fp8_656, shape, k, &[]);
    let (_, idx_b) = sparse_case(&mut rng, KvFormat::Fp8_656, shape, k, &[2]);
    // idx_b was drawn from another cache's used slots: remap it onto this cache's used slots so
    // no NaN slot is indexed.
    let used: Vec<i32> = idx_a.iter().copied().filter(|&v| v >= 0 && (v as usize) < shc.num_pages * 64).collect();
    let idx_b: Vec<i32> = idx_b.iter().map(|&v| if v >= 0 { used[v as usize % used.len()] } else { v }).collect();
    let q = random_q(&mut rng, shape);
    let lens_a = vec![300, 299, 0, 1];
    let lens_b = vec![64, 65, 280, 137];

    let d_q = s.clone_htod(&q).unwrap();
    let d_cache = s.clone_htod(&hc.bytes).unwrap();
    let d_table = s.clone_htod(&hc.table).unwrap();
    let mut d_lens = s.clone_htod(&lens_a).unwrap();
    let d_scache = s.clone_htod(&shc.bytes).unwrap();
    let mut d_idx = s.clone_htod(&idx_a).unwrap();
    let rows = shape.batch * shape.rows * shape.heads;
    let ws_bytes = decode_workspace_bytes(shape.batch, shape.rows, shape.heads, false, splits).unwrap();
    let sws_bytes = decode_workspace_bytes(shape.batch, shape.rows, shape.heads, true, splits).unwrap();
    let mut d_out = s.clone_htod(&vec![bf16::from_f32(POISON); rows * D_V]).unwrap();
    let d_lse = s.clone_htod(&vec![POISON; rows]).unwrap();
    let d_sout = s.clone_htod(&vec![POISON; rows * D_V]).unwrap();
    let d_slse = s.clone_htod(&vec![POISON; rows]).unwrap();
    let d_ws = s.clone_htod(&vec![0xffu8; ws_bytes]).unwrap();
    let d_sws = s.clone_htod(&vec![0xffu8; sws_bytes]).unwrap();
    let common = |out: DecodeOut, lse, ws| {
        DecodeCommon::new(DeviceSlice::of(&d_q, &s), shape.batch, shape.rows, shape.heads, out, lse, splits, ws)
    };
    let dense = DenseDecode {
        common: common(
            DecodeOut::Bf16(DeviceSlice::of(&d_out, &s)),
            DeviceSlice::of(&d_lse, &s),
            DeviceSlice::of(&d_ws, &s),
        ),
        cache: CacheView::packed(DeviceSlice::of(&d_cache, &s), hc.num_pages, hc.block_size),
        block_table: BlockTable { table: DeviceSlice::of(&d_table, &s), stride: hc.stride, max_pages: hc.max_pages },
        lens: DeviceSlice::of(&d_lens, &s),
        lens_strides: None,
        lens_rule: LensRule::Local,
    };
    let sparse = SparseDecode {
        common: common(
            DecodeOut::F32(DeviceSlice::of(&d_sout, &s)),
            DeviceSlice::of(&d_slse, &s),
            DeviceSlice::of(&d_sws, &s),
        ),
        cache: CacheView::packed(DeviceSlice::of(&d_scache, &s), shc.num_pages, shc.block_size),
        format: KvFormat::Fp8_656,
        lists: IndexLists::new(DeviceSlice::of(&d_idx, &s), k),
    };
    let rs = Stream::from_cudarc(&s);
    // A first eager launch (outside capture) opts the kernels into their shared memory.
    mla_decode_dense_on(gpu(), rs, &dense, path).unwrap();
    mla_decode_sparse(gpu(), rs, &sparse).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    mla_decode_dense_on(gpu(), rs, &dense, path).unwrap();
    mla_decode_sparse(gpu(), rs, &sparse).unwrap();
    let graph = s.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a graph");

    for (lens, idx) in [(&lens_a, &idx_a), (&lens_b, &idx_b)] {
        s.memcpy_htod(lens, &mut d_lens).unwrap();
        s.memcpy_htod(idx, &mut d_idx).unwrap();
        s.memcpy_htod(&vec![bf16::from_f32(POISON); rows * D_V], &mut d_out).unwrap();
        graph.launch().unwrap();
        s.synchronize().unwrap();
        let out: Vec<f32> = s.clone_dtoh(&d_out).unwrap().iter().map(|x| x.to_f32()).collect();
        let lse = s.clone_dtoh(&d_lse).unwrap();
        let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens }, default_scale());
        check(&format!("{path:?} graph dense lens {lens:?}"), &out, &lse, &want);
        let out = s.clone_dtoh(&d_sout).unwrap();
        let lse = s.clone_dtoh(&d_slse).unwrap();
        let sel = Selection::Sparse { indices: idx, k, topk_len: None };
        let want = decode_oracle(&q, shape, &shc.paged(), &shc.bytes, &sel, default_scale());
        check("graph sparse", &out, &lse, &want);
    }
}

/// A step's later layers reuse the split schedule of its first (DecodeSchedule::Reuse): with the
/// lengths it was made for, and with other lengths (longer, shorter, empty), every dense and
/// sparse kernel's result is the reference's for the lengths of the launch, and the reusing
/// launch leaves the prefix as it was.
#[test]
#[ignore = "needs a CUDA GPU"]
fn reused_schedule_is_exact_whatever_the_lengths() {
    let mut rng = Rng::new(seed());
    let s = stream();
    let one = DcpLayout { size: 1, interleave: 1 };
    // dense: b = 4, q = 2, H = 32 over 9 parts; lengths A schedule, B grow, shrink and empty rows
    let shape = QueryShape { batch: 4, rows: 2, heads: 32 };
    let (totals_a, totals_b) = ([300usize, 10, 0, 64], [900usize, 700, 40, 0]);
    let (lens_a, lens_b) = (mtp_lens(&totals_a, 2, one, 0), mtp_lens(&totals_b, 2, one, 0));
    let hc = dense_cache(&mut rng, KvFormat::Bf16, 64, &[900, 700, 300, 64]);
    let q = random_q(&mut rng, shape);
    let splits = 9;
    let seq_a = dense_seq_tokens(&hc, &lens_a, 2);
    for path in dense_paths() {
        let mut dev = DenseDev::new(&hc, &q, &lens_a);
        let mut outs = DevOut::new(shape, splits, true);
        let mut args = dev.args(&hc, &outs, shape, splits);
        mla_decode_dense_on(gpu(), raw(&s), &args, path).expect("dense launch");
        for (lens, label) in [(&lens_a, "the same lengths"), (&lens_b, "other lengths")] {
            s.memcpy_htod(lens, &mut dev.lens).unwrap();
            outs.poison();
            args.common.schedule = DecodeSchedule::Reuse;
            mla_decode_dense_on(gpu(), raw(&s), &args, path).expect("dense launch, schedule reused");
            let (out, lse) = outs.read();
            let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &Selection::Dense { lens }, default_scale());
            check(&format!("{path:?} dense, schedule reused with {label}"), &out, &lse, &want);
            outs.check_schedule(&format!("{path:?} dense, after a reuse"), splits, &seq_a, schedule_tile(path));
        }
    }
    // sparse FP8: b = 2, q = 2, H = 16, K = 512 over 3 parts; topk_len A schedules, B differs
    let shape = QueryShape { batch: 2, rows: 2, heads: 16 };
    let k = 512;
    let (hc, idx) = sparse_case(&mut rng, KvFormat::Fp8_656, shape, k, &[]);
    let (tl_a, tl_b) = (vec![100, 0, 512, 7], vec![512, 300, 0, 64]);
    let q = random_q(&mut rng, shape);
    let splits = 3;
    let seq_a: Vec<u64> = tl_a.iter().map(|&n| n as u64).collect();
    for path in sparse_paths(KvFormat::Fp8_656) {
        let mut dev = SparseDev::new(&hc, &q, &idx, Some(&tl_a));
        let mut outs = DevOut::new(shape, splits, false);
        let mut args = dev.args(&hc, &outs, shape, k, splits);
        mla_decode_sparse_on(gpu(), raw(&s), &args, path).expect("sparse launch");
        for (tl, label) in [(&tl_a, "the same lengths"), (&tl_b, "other lengths")] {
            s.memcpy_htod(tl, dev.topk_len.as_mut().expect("topk_len")).unwrap();
            outs.poison();
            args.common.schedule = DecodeSchedule::Reuse;
            mla_decode_sparse_on(gpu(), raw(&s), &args, path).expect("sparse launch, schedule reused");
            let (out, lse) = outs.read();
            let sel = Selection::Sparse { indices: &idx, k, topk_len: Some(tl) };
            let want = decode_oracle(&q, shape, &hc.paged(), &hc.bytes, &sel, default_scale());
            check(&format!("{path:?} sparse, schedule reused with {label}"), &out, &lse, &want);
            outs.check_schedule(&format!("{path:?} sparse, after a reuse"), splits, &seq_a, schedule_tile(path));
        }
    }
}

/// A reused schedule that the launch cannot use traps rather than being computed from: a
/// workspace no schedule wrote, and one scheduled for another part count (the stamp's check,
/// kernels-src/decode/split_schedule.cuh). A trap ends the CUDA context, so each case runs in a
/// child process of this test binary, and this test checks that each child saw its launch fail.
/// (The sanitizer runs skip it: a trap is what they report.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn reuse_of_a_foreign_schedule_traps() {
    const CASE: &str = "DCP_MLA_TEST_TRAP_CASE";
    if let Ok(case) = std::env::var(CASE) {
        trap_child(&case);
    }
    for case in ["unscheduled", "other_parts"] {
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", "reuse_of_a_foreign_schedule_traps", "--include-ignored", "--nocapture"])
            .env(CASE, case)
            .output()
            .expect("spawning the test binary");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains(&format!("trapped: {case}")), "{case}: {text}");
    }
}

/// The child of reuse_of_a_foreign_schedule_traps: a dense split launch that reuses a schedule it
/// must not use; exits the process once the stream reported the failure (the context is gone,
/// so nothing is freed).
fn trap_child(case: &str) -> ! {
    let s = stream();
    let mut rng = Rng::new(seed());
    let shape = QueryShape { batch: 2, rows: 1, heads: 16 };
    let hc = dense_cache(&mut rng, KvFormat::Bf16, 64, &[300, 200]);
    let q = random_q(&mut rng, shape);
    let dev = DenseDev::new(&hc, &q, &[300, 200]);
    // the workspace holds 5 parts' slots and starts as 0xff bytes: no stamp
    let outs = DevOut::new(shape, 5, false);
    let mut args = dev.args(&hc, &outs, shape, 5);
    match case {
        "unscheduled" => {}
        "other_parts" => {
            args.common.num_splits = 3;
            mla_decode_dense(gpu(), raw(&s), &args).expect("the computing launch");
            s.synchronize().expect("the computing launch runs");
            args.common.num_splits = 5;
        }
        _ => panic!("unknown case {case}"),
    }
    args.common.schedule = DecodeSchedule::Reuse;
    mla_decode_dense(gpu(), raw(&s), &args).expect("the reusing launch is queued");
    let r = s.synchronize();
    assert!(r.is_err(), "{case}: the launch reusing a foreign schedule did not trap");
    println!("trapped: {case}: {:?}", r.unwrap_err());
    std::process::exit(0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn invalid_arguments_are_named() {
    let s = stream();
    let mut rng = Rng::new(1);
    let shape = QueryShape { batch: 2, rows: 1, heads: 16 };
    let hc = dense_cache(&mut rng, KvFormat::Bf16, 64, &[10, 10]);
    let q = random_q(&mut rng, shape);
    let (d_q, d_cache, d_table) = (upload(&s, &q), upload(&s, &hc.bytes), upload(&s, &hc.table));
    let d_lens = upload(&s, &[5i32]);
    let outs = DevOut::new(shape, 4, false);
    let base = DenseDecode {
        common: outs.common(view(&s, &d_q), shape, 1),
        cache: CacheView::packed(view(&s, &d_cache), hc.num_pages, hc.block_size),
        block_table: BlockTable { table: view(&s, &d_table), stride: hc.stride, max_pages: hc.max_pages },
        lens: view(&s, &d_lens),
        lens_strides: None,
        lens_rule: LensRule::Local,
    };
    let arg_of = |a: &DenseDecode| match mla_decode_dense(gpu(), raw(&s), a) {
        Err(e) if e.argument().is_some() => e.argument().unwrap(),
        other => panic!("expected an invalid argument, got {other:?}"),
    };
    assert_eq!(arg_of(&base), "lens"); // one length for two requests
    let d_lens2 = upload(&s, &[5i32, 6]);
    let ok = DenseDecode { lens: view(&s, &d_lens2), ..base };
    assert!(mla_decode_dense(gpu(), raw(&s), &ok).is_ok());
    let mut a = ok;
    a.common.num_splits = 0;
    assert_eq!(arg_of(&a), "num_splits");
    let mut a = ok;
    a.common.num_splits = 8; // workspace sized for 4 splits
    assert_eq!(arg_of(&a), "workspace");
    let mut a = ok;
    a.common.q = unsafe { DeviceSlice::from_raw(view(&s, &d_q).ptr() + 2, q.len() - 8) };
    assert_eq!(arg_of(&a), "q");
    let mut a = ok;
    a.block_table.max_pages = hc.stride + 1;
    assert_eq!(arg_of(&a), "max_pages");
    let mut a = ok;
    a.cache.num_pages = hc.num_pages + 1;
    assert_eq!(arg_of(&a), "cache");
    let mut a = ok;
    a.common.scale = f32::NAN;
    assert_eq!(arg_of(&a), "scale");
    s.synchronize().unwrap();
}
