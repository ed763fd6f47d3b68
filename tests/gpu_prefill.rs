//! Prefill over a cached prefix (docs/contract.md §7) on the GPU against the CPU reference
//! (`dcp_mla::reference::prefill`), bit for bit: every rank flattens its rows of every planned
//! chunk straight into its slot of the gathered [D, cap, 576] buffer (BF16 copy or FP8-656
//! dequantisation), then the reorder writes global order.
//!
//! Inputs: fresh random caches, permuted block tables with holes (−1 and out-of-range pages, so
//! some rows must come out zero), prefix lengths 0, 1, B−1, B, B+1 and lengths not divisible by
//! D·I, several chunks per batch, D ∈ {1, 2, 4, 8}, I ∈ {1, 2}; one CUDA graph replayed over the
//! chunks of a plan with only the device-side piece table changing. Outputs are poisoned first.

mod common;

use common::*;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaSlice;
use dcp_mla::formats::{encode_bf16_row, encode_fp8_row, KvFormat, D_LATENT, D_QK, D_ROPE};
use dcp_mla::ops::prefill::*;
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::planner::{plan_prefill_chunks, prefill_chunk_bytes, ChunkPlan};
use dcp_mla::reference::fill::PagedCache;
use dcp_mla::reference::prefill as reference;
use dcp_mla::runtime::DeviceSlice;
use dcp_mla::DcpLayout;
use half::bf16;

const POISON: u16 = 0x7fc1;

/// A batch's caches on every rank and the shared block table.
struct Batch {
    dcp: DcpLayout,
    format: KvFormat,
    block_size: usize,
    lens: Vec<u64>,
    num_pages: usize,
    stride: usize,
    /// Columns of the table the kernels may read: one fewer than the longest request needs, so
    /// its last page comes out zero; the columns beyond hold valid pages that must not be read.
    max_pages: usize,
    table: Vec<i32>,
    caches: Vec<Vec<u8>>,
    plan: ChunkPlan,
}

fn batch(rng: &mut Rng, dcp: DcpLayout, format: KvFormat, block_size: usize, lens: Vec<u64>) -> Batch {
    let d = dcp.size;
    let unit = (block_size * d) as u64;
    let max_pages = lens.iter().map(|&l| l.div_ceil(unit) as usize).max().unwrap_or(0).max(1);
    let stride = max_pages + 2;
    let num_pages = lens.len() * max_pages + 3;
    let mut pages: Vec<i32> = (0..num_pages as i32).collect();
    rng.shuffle(&mut pages);
    let mut table = vec![-1i32; lens.len() * stride];
    for r in 0..lens.len() {
        for c in 0..stride {
            table[r * stride + c] = match rng.below(25) {
                0 => -1,
                1 => num_pages as i32 + rng.below(5) as i32, // beyond the cache: never read
                _ => pages[(r * stride + c) % num_pages],
            };
        }
    }
    let row = format.token_bytes();
    let caches = (0..d)
        .map(|_| {
            let mut cache = vec![0u8; num_pages * block_size * row];
            for slot in cache.chunks_mut(row) {
                let ckv: Vec<bf16> = (0..D_LATENT).map(|i| bf16::from_f32(rng.unit() * (1 + i % 7) as f32)).collect();
                let kpe: Vec<bf16> = (0..D_ROPE).map(|_| bf16::from_f32(rng.unit())).collect();
                match format {
                    KvFormat::Bf16 => {
                        let mut r = [bf16::ZERO; D_QK];
                        encode_bf16_row(&ckv, &kpe, &mut r);
                        for (o, v) in slot.chunks_mut(2).zip(r) {
                            o.copy_from_slice(&v.to_bits().to_le_bytes());
                        }
                    }
                    KvFormat::Fp8_656 => encode_fp8_row(&ckv, &kpe, slot),
                }
            }
            cache
        })
        .collect();
    // About three chunks for the whole batch.
    let units: u64 = lens.iter().map(|&l| l.div_ceil(unit)).sum();
    let budget = prefill_chunk_bytes(unit * units.div_ceil(3).max(1), d);
    let plan = plan_prefill_chunks(&lens, dcp, block_size, budget).expect("plan");
    Batch { dcp, format, block_size, lens, num_pages, stride, max_pages: max_pages - 1, table, caches, plan }
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check_rows(what: &str, got: &[bf16], want: &[bf16]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (g, w) = (bits(got), bits(want));
    if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
        panic!("{what}: first mismatch at row {} value {}: got {:#06x} want {:#06x}", i / D_QK, i % D_QK, g[i], w[i]);
    }
}

/// Device buffers of one batch: caches, table, gathered buffer, output and piece table.
struct DeviceBatch {
    caches: Vec<CudaSlice<u8>>,
    table: CudaSlice<i32>,
    gathered: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    pieces: CudaSlice<i32>,
    max_pieces: usize,
}

fn device_batch(s: &std::sync::Arc<cudarc::driver::CudaStream>, b: &Batch) -> DeviceBatch {
    let cap = b.plan.cap_rows;
    let max_pieces = b.plan.chunks.iter().map(|c| c.pieces.len()).max().unwrap_or(0) + 3;
    DeviceBatch {
        caches: b.caches.iter().map(|c| upload(s, c)).collect(),
        table: upload(s, &b.table),
        gathered: upload(s, &vec![bf16::from_bits(POISON); b.dcp.size * cap * D_QK]),
        out: upload(s, &vec![bf16::from_bits(POISON); b.plan.chunk_tokens * D_QK]),
        pieces: upload(s, &vec![0i32; max_pieces * PIECE_FIELDS]),
        max_pieces,
    }
}

/// The launch arguments of every rank's flatten (into its gathered slot) and of the reorder.
fn launches(s: &std::sync::Arc<cudarc::driver::CudaStream>, b: &Batch, g: &DeviceBatch) -> (Vec<Flatten>, Reorder) {
    let cap = b.plan.cap_rows;
    let gathered = view(s, &g.gathered);
    let flattens = (0..b.dcp.size)
        .map(|rank| Flatten {
            cache: CacheView::packed(view(s, &g.caches[rank]), b.num_pages, b.block_size),
            format: b.format,
            block_table: BlockTable { table: view(s, &g.table), stride: b.stride, max_pages: b.max_pages },
            batch: b.lens.len(),
            pieces: view(s, &g.pieces),
            max_pieces: g.max_pieces,
            // SAFETY: rank r's slot [r·cap, (r+1)·cap) rows of the gathered buffer.
            out: unsafe { DeviceSlice::from_raw(gathered.ptr() + (rank * cap * D_QK * 2) as u64, cap * D_QK) },
            cap_rows: cap,
            dcp: b.dcp,
            rank,
        })
        .collect();
    let reorder = Reorder {
        gathered,
        cap_rows: cap,
        pieces: view(s, &g.pieces),
        max_pieces: g.max_pieces,
        out: view(s, &g.out),
        out_rows: b.plan.chunk_tokens,
        dcp: b.dcp,
    };
    (flattens, reorder)
}

/// Compares the gathered buffer and the reordered output of chunk `c` with the reference; rows
/// of the output beyond the chunk's tokens must still hold the poison.
fn check_chunk(tag: &str, s: &std::sync::Arc<cudarc::driver::CudaStream>, b: &Batch, g: &DeviceBatch, c: usize) {
    let gathered = download(s, &g.gathered);
    let cap = b.plan.cap_rows;
    for rank in 0..b.dcp.size {
        let cache = PagedCache {
            block_table: &b.table,
            block_table_stride: b.stride,
            batch: b.lens.len(),
            max_pages: b.max_pages,
            num_pages: b.num_pages,
            block_size: b.block_size,
            format: b.format,
        };
        let want = reference::flatten_chunk(&b.plan, c, rank, &cache, &b.caches[rank]);
        check_rows(
            &format!("{tag}: chunk {c} flatten rank {rank}"),
            &gathered[rank * cap * D_QK..(rank + 1) * cap * D_QK],
            &want,
        );
    }
    let want = reference::reorder_chunk(&b.plan, c, &gathered, b.dcp);
    let out = download(s, &g.out);
    let tokens = b.plan.chunks[c].tokens;
    check_rows(&format!("{tag}: chunk {c} reorder"), &out[..tokens * D_QK], &want);
    assert!(
        bits(&out[tokens * D_QK..]).iter().all(|&x| x == POISON),
        "{tag}: chunk {c}: reorder wrote beyond its tokens"
    );
}

fn lens_for(rng: &mut Rng, block_size: usize, d: usize, i: usize) -> Vec<u64> {
    let b = block_size as u64;
    let mut lens = vec![0, 1, b - 1, b, b + 1, (d * i) as u64 * 7 + 3];
    lens.extend((0..3).map(|_| 1 + rng.below(3000)));
    rng.shuffle(&mut lens);
    lens
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flatten_and_reorder_match_reference() {
    let s = stream();
    let dev = gpu();
    let mut rng = Rng::new(seed());
    for format in [KvFormat::Bf16, KvFormat::Fp8_656] {
        for (d, i, block_size) in [(1, 1, 64), (2, 1, 16), (4, 2, 16), (8, 1, 64), (8, 2, 16)] {
            let dcp = DcpLayout { size: d, interleave: i };
            let lens = lens_for(&mut rng, block_size, d, i);
            let b = batch(&mut rng, dcp, format, block_size, lens);
            let g = device_batch(&s, &b);
            let (flattens, reorder_args) = launches(&s, &b, &g);
            // every rank's cache again as a view of a larger page dimension: 3 spare rows a page,
            // 0xff bytes (NaN in both formats), which a flatten must never read
            let (row, spare) = (format.token_bytes(), 3);
            let page_views: Vec<_> = b
                .caches
                .iter()
                .map(|c| {
                    let mut big = vec![0xffu8; b.num_pages * (block_size + spare) * row];
                    for (p, page) in c.chunks(block_size * row).enumerate() {
                        big[p * (block_size + spare) * row..][..page.len()].copy_from_slice(page);
                    }
                    upload(&s, &big)
                })
                .collect();
            let mut g = g;
            let tag = format!("{format:?} D = {d} I = {i} B = {block_size}");
            assert!(!b.plan.chunks.is_empty(), "{tag}: the plan has chunks");
            for c in 0..b.plan.chunks.len() {
                s.memcpy_htod(&piece_table(&b.plan.chunks[c], g.max_pieces).unwrap(), &mut g.pieces).unwrap();
                s.memcpy_htod(&vec![bf16::from_bits(POISON); d * b.plan.cap_rows * D_QK], &mut g.gathered).unwrap();
                s.memcpy_htod(&vec![bf16::from_bits(POISON); b.plan.chunk_tokens * D_QK], &mut g.out).unwrap();
                for f in &flattens {
                    flatten(dev, raw(&s), f).expect("flatten");
                }
                reorder(dev, raw(&s), &reorder_args).expect("reorder");
                s.synchronize().unwrap();
                check_chunk(&tag, &s, &b, &g, c);
                // the page views flatten to the same rows, bit for bit
                let packed = download(&s, &g.gathered);
                s.memcpy_htod(&vec![bf16::from_bits(POISON); d * b.plan.cap_rows * D_QK], &mut g.gathered).unwrap();
                for (f, cache) in flattens.iter().zip(&page_views) {
                    let args = Flatten {
                        cache: CacheView { bytes: view(&s, cache), page_stride: Some(block_size + spare), ..f.cache },
                        ..*f
                    };
                    flatten(dev, raw(&s), &args).expect("flatten of a page view");
                }
                assert!(bits(&download(&s, &g.gathered)) == bits(&packed), "{tag}: chunk {c}: page-view flatten");
            }
        }
    }
}

/// Every rank's flatten and the reorder captured once in a CUDA graph, replayed for each chunk
/// of the plan with only the device-side piece table rewritten.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_reads_new_piece_tables() {
    let dev = gpu();
    let s = dev.context().new_stream().expect("stream");
    let mut rng = Rng::new(seed());
    let dcp = DcpLayout { size: 4, interleave: 1 };
    let block_size = 16;
    let lens = lens_for(&mut rng, block_size, 4, 1);
    let b = batch(&mut rng, dcp, KvFormat::Fp8_656, block_size, lens);
    assert!(b.plan.chunks.len() >= 2, "the plan needs several chunks");
    let g = device_batch(&s, &b);
    let (flattens, reorder_args) = launches(&s, &b, &g);
    let mut g = g;
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin_capture");
    let launched =
        flattens.iter().try_for_each(|f| flatten(dev, raw(&s), f)).and_then(|_| reorder(dev, raw(&s), &reorder_args));
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).expect("end_capture").expect("a graph");
    launched.expect("launch during capture");
    for c in (0..b.plan.chunks.len()).rev() {
        s.memcpy_htod(&piece_table(&b.plan.chunks[c], g.max_pieces).unwrap(), &mut g.pieces).unwrap();
        s.memcpy_htod(&vec![bf16::from_bits(POISON); 4 * b.plan.cap_rows * D_QK], &mut g.gathered).unwrap();
        s.memcpy_htod(&vec![bf16::from_bits(POISON); b.plan.chunk_tokens * D_QK], &mut g.out).unwrap();
        graph.launch().expect("graph launch");
        s.synchronize().unwrap();
        check_chunk("graph replay", &s, &b, &g, c);
    }
}
