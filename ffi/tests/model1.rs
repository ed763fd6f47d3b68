//! MODEL1 through the C ABI on a GPU: dcp_mla_launch_kv_fill_model1 writes the bytes the CPU
//! reference writes (one and two ranks, a cache whose pages are a view of a padded page
//! dimension), and dcp_mla_launch_decode_model1 over two sources (q a strided view, FlashMLA's
//! per-request topk_length as strides {1, 0}, scale 0, unsplit and split) matches the fp64 oracle
//! at MODEL1's default scale 512^-1/2. Without a GPU the tests are ignored (the device run
//! includes them).

use dcp_mla::formats::model1::{Model1Pages, MODEL1_D_NOPE, MODEL1_D_QK, MODEL1_D_V};
use dcp_mla::reference::attention::QueryShape;
use dcp_mla::reference::fill::FillInput;
use dcp_mla::reference::model1::{decode_model1_oracle, fill_model1, model1_default_scale, Model1Cache, Model1Source};
use dcp_mla::reference::tolerance::check_attention;
use dcp_mla::rng::Rng;
use dcp_mla::DcpLayout;
use dcp_mla_ffi::*;
use half::bf16;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

fn last() -> String {
    // SAFETY: valid until the next call on this thread.
    unsafe { CStr::from_ptr(dcp_mla_last_error()) }.to_string_lossy().into_owned()
}

fn ok(s: DcpMlaStatus, what: &str) {
    assert_eq!(s, DcpMlaStatus::Success, "{what}: {}", last());
}

/// Device memory of one test, freed on drop.
struct Gpu {
    dev: *mut DcpMlaDevice,
    allocs: Vec<*mut c_void>,
}

impl Gpu {
    fn open() -> Self {
        let mut dev = null_mut();
        // SAFETY: a valid out-pointer.
        ok(unsafe { dcp_mla_device_open(0, &mut dev) }, "this GPU test needs a CUDA device");
        Gpu { dev, allocs: Vec::new() }
    }

    fn up<T: Copy>(&mut self, host: &[T]) -> usize {
        let bytes = std::mem::size_of_val(host).max(1);
        let mut p = null_mut();
        // SAFETY: an open handle; `host` holds `bytes` readable bytes (or one, never read, when empty).
        unsafe {
            ok(dcp_mla_malloc(self.dev, bytes, &mut p), "malloc");
            ok(dcp_mla_memcpy_htod(self.dev, p, host.as_ptr().cast(), std::mem::size_of_val(host)), "htod");
        }
        self.allocs.push(p);
        p as usize
    }

    fn down<T: Copy + Default>(&self, p: usize, n: usize) -> Vec<T> {
        let mut host = vec![T::default(); n];
        // SAFETY: `p` holds at least n elements of T (allocated by `up` with them).
        unsafe {
            ok(dcp_mla_synchronize(self.dev), "synchronize");
            ok(dcp_mla_memcpy_dtoh(self.dev, host.as_mut_ptr().cast(), p as *const c_void, n * size_of::<T>()), "dtoh");
        }
        host
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: every pointer came from dcp_mla_malloc on this handle; the work is synchronised.
        unsafe {
            dcp_mla_synchronize(self.dev);
            for &p in &self.allocs {
                dcp_mla_free(self.dev, p);
            }
            dcp_mla_device_close(self.dev);
        }
    }
}

fn tensor(p: usize, numel: usize, dtype: i32, strides: &[usize]) -> DcpMlaTensor {
    let mut t = DcpMlaTensor { data: p as *mut c_void, numel, dtype, ..Default::default() };
    t.num_strides = strides.len() as u32;
    t.strides[..strides.len()].copy_from_slice(strides);
    t
}

/// Tokens of `lens` requests: [T, 512] bf16 rows (448 nope of mixed magnitude, 64 rope), their
/// request and position.
fn tokens(rng: &mut Rng, lens: &[usize]) -> (Vec<bf16>, Vec<i32>, Vec<i32>) {
    let (mut rows, mut req, mut pos) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &n) in lens.iter().enumerate() {
        for p in 0..n {
            for t in 0..MODEL1_D_QK {
                let mag = if t < MODEL1_D_NOPE { [0.0, 0.05, 3.0, 9.0][(t / 64 + p) % 4] } else { 1.0 };
                rows.push(bf16::from_f32(rng.unit() * mag));
            }
            req.push(i as i32);
            pos.push(p as i32);
        }
    }
    (rows, req, pos)
}

/// A block table [batch, max_pages] over `num_pages` shuffled pages, max_pages enough for every
/// request of `lens` on any rank of `dcp` (rank 0 holds the most).
fn table(rng: &mut Rng, lens: &[usize], b: usize, dcp: DcpLayout, num_pages: usize) -> (Vec<i32>, usize) {
    let max_pages = max_pages(lens, b, dcp);
    let mut pages: Vec<i32> = (0..num_pages as i32).collect();
    rng.shuffle(&mut pages);
    assert!(lens.len() * max_pages <= num_pages);
    (pages[..lens.len() * max_pages].to_vec(), max_pages)
}

fn max_pages(lens: &[usize], b: usize, dcp: DcpLayout) -> usize {
    lens.iter().map(|&n| dcp.local_len(n as u64, 0).div_ceil(b as u64) as usize).max().unwrap()
}

/// One cache filled through the C ABI: its pages, device address, host bytes (the reference's
/// fill of the same tokens) and block table.
struct Filled {
    pages: Model1Pages,
    dev: usize,
    host: Vec<u8>,
    table: Vec<i32>,
    max_pages: usize,
}

#[allow(clippy::too_many_arguments)]
fn fill(
    gpu: &mut Gpu,
    rng: &mut Rng,
    lens: &[usize],
    rows: &[bf16],
    req: &[i32],
    pos: &[i32],
    block_size: usize,
    extra_units: usize,
    dcp: DcpLayout,
    rank: usize,
) -> Filled {
    let mut pages = Model1Pages::new(0, block_size);
    pages.num_pages = lens.len() * max_pages(lens, block_size, dcp) + 2;
    pages.page_stride += 576 * extra_units;
    let (table, max_pages) = table(rng, lens, block_size, dcp, pages.num_pages);
    let mut host = vec![0xa5u8; pages.cache_bytes()];
    let dev = gpu.up(&host);
    // ckv and kpe as views of the [T, 512] rows, as an engine splits one row
    let (d_rows, d_req, d_pos, d_table) = (gpu.up(rows), gpu.up(req), gpu.up(pos), gpu.up(&table));
    let t = req.len();
    let a = DcpMlaKvFillModel1Args {
        device: gpu.dev,
        ckv: tensor(d_rows, (t - 1) * MODEL1_D_QK + MODEL1_D_NOPE, DCP_MLA_DTYPE_BF16, &[MODEL1_D_QK]),
        kpe: tensor(d_rows + 2 * MODEL1_D_NOPE, (t - 1) * MODEL1_D_QK + 64, DCP_MLA_DTYPE_BF16, &[MODEL1_D_QK]),
        req_idx: tensor(d_req, t, DCP_MLA_DTYPE_I32, &[]),
        positions: tensor(d_pos, t, DCP_MLA_DTYPE_I32, &[]),
        block_table: tensor(d_table, table.len(), DCP_MLA_DTYPE_I32, &[]),
        cache: tensor(dev, pages.cache_bytes(), DCP_MLA_DTYPE_U8, &[pages.page_stride]),
        batch: lens.len(),
        max_pages,
        num_pages: pages.num_pages,
        block_size,
        dcp_size: dcp.size,
        interleave: dcp.interleave,
        rank,
        ..Default::default()
    };
    // SAFETY: every tensor is device memory of the numel given.
    ok(unsafe { dcp_mla_launch_kv_fill_model1(&a) }, "kv_fill_model1");
    let input = FillInput {
        ckv: rows,
        ckv_stride: MODEL1_D_QK,
        kpe: &rows[MODEL1_D_NOPE..],
        kpe_stride: MODEL1_D_QK,
        req_idx: req,
        positions: pos,
    };
    let cache = Model1Cache { block_table: &table, block_table_stride: max_pages, batch: lens.len(), max_pages, pages };
    fill_model1(&input, &cache, dcp, rank, &mut host);
    Filled { pages, dev, host, table, max_pages }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn model1_fill_through_the_c_abi_writes_the_reference_bytes() {
    let mut gpu = Gpu::open();
    let mut rng = Rng::new(11);
    let lens = [37, 0, 70, 5];
    let (rows, req, pos) = tokens(&mut rng, &lens);
    for (b, extra_units, d, i) in [(3, 1, 1, 1), (64, 0, 2, 1), (4, 2, 4, 2)] {
        let dcp = DcpLayout { size: d, interleave: i };
        for rank in 0..d {
            let f = fill(&mut gpu, &mut rng, &lens, &rows, &req, &pos, b, extra_units, dcp, rank);
            let got: Vec<u8> = gpu.down(f.dev, f.host.len());
            if let Some(at) = got.iter().zip(&f.host).position(|(g, w)| g != w) {
                panic!(
                    "B = {b}, D = {d}, I = {i}, rank {rank}: byte {at} is {:#04x}, the reference's {:#04x}",
                    got[at], f.host[at]
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn model1_decode_through_the_c_abi_matches_the_oracle() {
    let mut gpu = Gpu::open();
    let mut rng = Rng::new(12);
    let one = DcpLayout { size: 1, interleave: 1 };
    let (b, nq, heads, k1, k2) = (3usize, 2usize, 16usize, 40usize, 24usize);
    let (lens1, lens2) = ([37usize, 70, 9], [50usize, 3, 64]);
    let (r1, q1, p1) = tokens(&mut rng, &lens1);
    let main = fill(&mut gpu, &mut rng, &lens1, &r1, &q1, &p1, 3, 1, one, 0);
    let (r2, q2, p2) = tokens(&mut rng, &lens2);
    let extra = fill(&mut gpu, &mut rng, &lens2, &r2, &q2, &p2, 64, 0, one, 0);
    // index lists [b, nq, k]: tokens of the request through its block-table row, −1 mixed in
    let lists = |rng: &mut Rng, f: &Filled, lens: &[usize], k: usize| -> Vec<i32> {
        let bs = f.pages.block_size;
        let mut idx = Vec::with_capacity(b * nq * k);
        for (i, &n) in lens.iter().enumerate() {
            for _ in 0..nq * k {
                idx.push(if n == 0 || rng.below(8) == 0 {
                    -1
                } else {
                    let p = rng.below(n as u64) as usize;
                    f.table[i * f.max_pages + p / bs] * bs as i32 + (p % bs) as i32
                });
            }
        }
        idx
    };
    let (idx1, idx2) = (lists(&mut rng, &main, &lens1, k1), lists(&mut rng, &extra, &lens2, k2));
    // FlashMLA's per-request topk_length [b]: all, fewer, beyond K; the extra's 0, some, all
    let (len1, len2) = (vec![k1 as i32, 17, k1 as i32 + 9], vec![0, 5, k2 as i32]);
    let shape = QueryShape { batch: b, rows: nq, heads };
    let n = b * nq * heads;
    let q: Vec<bf16> = (0..n * MODEL1_D_QK).map(|_| bf16::from_f32(rng.unit())).collect();
    // q as a view: rows of 640 values, the 128 past each row NaN
    let mut q_view = vec![bf16::NAN; n * 640];
    for r in 0..n {
        q_view[r * 640..][..MODEL1_D_QK].copy_from_slice(&q[r * MODEL1_D_QK..][..MODEL1_D_QK]);
    }
    let want = decode_model1_oracle(
        &q,
        shape,
        &Model1Source { cache: &main.host, pages: main.pages, indices: &idx1, k: k1, topk_len: Some(&len1) },
        Some(&Model1Source { cache: &extra.host, pages: extra.pages, indices: &idx2, k: k2, topk_len: Some(&len2) }),
        model1_default_scale(),
    );
    let (d_q, d_i1, d_i2, d_l1, d_l2) = (gpu.up(&q_view), gpu.up(&idx1), gpu.up(&idx2), gpu.up(&len1), gpu.up(&len2));
    for splits in [1usize, 2] {
        let mut ws_bytes = 0usize;
        // SAFETY: a valid out-pointer.
        ok(unsafe { dcp_mla_decode_workspace_bytes(b, nq, heads, 1, splits, &mut ws_bytes) }, "workspace bytes");
        let d_ws = gpu.up(&vec![0u8; ws_bytes.max(16)]);
        let d_out = gpu.up(&vec![bf16::from_f32(-7.0e37); n * MODEL1_D_V]);
        let d_lse = gpu.up(&vec![-7.0e37f32; n]);
        let a = DcpMlaDecodeModel1Args {
            device: gpu.dev,
            q: tensor(d_q, n * 640, DCP_MLA_DTYPE_BF16, &[nq * heads * 640, heads * 640, 640]),
            out: tensor(d_out, n * MODEL1_D_V, DCP_MLA_DTYPE_BF16, &[]),
            lse: tensor(d_lse, n, DCP_MLA_DTYPE_F32, &[]),
            workspace: tensor(d_ws, ws_bytes.max(16), DCP_MLA_DTYPE_U8, &[]),
            cache: tensor(main.dev, main.host.len(), DCP_MLA_DTYPE_U8, &[main.pages.page_stride]),
            indices: tensor(d_i1, idx1.len(), DCP_MLA_DTYPE_I32, &[]),
            topk_len: tensor(d_l1, b, DCP_MLA_DTYPE_I32, &[1, 0]),
            extra_cache: tensor(extra.dev, extra.host.len(), DCP_MLA_DTYPE_U8, &[]),
            extra_indices: tensor(d_i2, idx2.len(), DCP_MLA_DTYPE_I32, &[]),
            extra_topk_len: tensor(d_l2, b, DCP_MLA_DTYPE_I32, &[1, 0]),
            batch: b,
            num_q: nq,
            heads,
            num_splits: splits,
            num_pages: main.pages.num_pages,
            block_size: main.pages.block_size,
            topk: k1,
            extra_num_pages: extra.pages.num_pages,
            extra_block_size: extra.pages.block_size,
            extra_topk: k2,
            // 0: MODEL1's 512^-1/2
            scale: 0.0,
            ..Default::default()
        };
        // SAFETY: every tensor is device memory of the numel given.
        ok(unsafe { dcp_mla_launch_decode_model1(&a) }, "decode_model1");
        let out: Vec<u16> = gpu.down(d_out, n * MODEL1_D_V);
        let lse: Vec<f32> = gpu.down(d_lse, n);
        let out = out.iter().map(|&x| bf16::from_bits(x).to_f64());
        if let Err(e) = check_attention(&format!("splits {splits}"), out, lse.iter().map(|&x| x as f64), &want) {
            panic!("{e}");
        }
    }
}
