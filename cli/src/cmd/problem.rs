//! The demo's problem: one decode step's inputs in global (non-DCP) order, what a backend (the
//! CPU reference or the GPU kernels) returns, and the helpers both backends share. Its own
//! module so that `demo` (which runs and checks a step) and `demo_gpu` (the GPU backend) both
//! depend on it and not on each other.

use dcp_mla::formats::{D_LATENT, D_QK, D_ROPE, D_V};
use dcp_mla::planner::{self, causal_local_lens, DcpConfig, DcpLayout};
use dcp_mla::reference::attention::QueryShape;
use dcp_mla::reference::fill::PagedCache;
use dcp_mla::reference::topk::PageTranslate;
use dcp_mla::rng::Rng;
use dcp_mla::KvFormat;
use half::bf16;

/// What a problem is made from (the demo's options that shape it).
#[derive(Debug, Clone)]
pub struct Spec {
    pub tp: usize,
    pub dcp: usize,
    pub interleave: usize,
    pub block_size: usize,
    pub local_heads: usize,
    pub q: usize,
    pub topk: usize,
    pub kv_format: KvFormat,
    pub seed: u64,
}

/// `n` values `f(rng, index)`, generated on every core in chunks seeded by position, so the
/// result does not depend on the number of threads.
fn generate<T: Copy + Default + Send>(n: usize, seed: u64, f: impl Fn(&mut Rng, usize) -> T + Sync) -> Vec<T> {
    const CHUNK: usize = 1 << 20;
    let mut v = vec![T::default(); n];
    let threads = std::thread::available_parallelism().map_or(1, |x| x.get());
    let mut chunks: Vec<(usize, &mut [T])> = v.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        while !chunks.is_empty() {
            let group: Vec<(usize, &mut [T])> = chunks.drain(..per.min(chunks.len())).collect();
            let f = &f;
            sc.spawn(move || {
                for (ci, c) in group {
                    let mut rng = Rng::new(seed ^ (ci as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
                    for (j, x) in c.iter_mut().enumerate() {
                        *x = f(&mut rng, ci * CHUNK + j);
                    }
                }
            });
        }
    });
    v
}

/// The inputs of one decode step, in global (non-DCP) order.
pub struct Problem {
    pub dcp: DcpLayout,
    pub tp: usize,
    pub block_size: usize,
    pub local_heads: usize,
    pub heads: usize,
    pub q: usize,
    pub k: usize,
    pub format: KvFormat,
    /// Total length of each request, its q new tokens included.
    pub lens: Vec<u64>,
    /// Token rows of every request, concatenated: c_kv [n, 512] and k_pe [n, 64].
    pub ckv: Vec<bf16>,
    pub kpe: Vec<bf16>,
    pub req_idx: Vec<i32>,
    pub positions: Vec<i32>,
    /// [b, q, H, 576].
    pub query: Vec<bf16>,
    /// Indexer scores of every row over the global tokens: [b·q, score_stride].
    pub scores: Vec<f32>,
    pub score_stride: usize,
    /// The block table all ranks share: [b, max_pages], permuted pages.
    pub table: Vec<i32>,
    pub max_pages: usize,
    pub num_pages: usize,
}

impl Problem {
    pub fn new(a: &Spec, batch: usize, context: u64) -> Result<Self, String> {
        // the planner's checks, the same `plan`, the C ABI and Python run
        let cfg = DcpConfig::new(a.tp, a.dcp, a.interleave, a.block_size).map_err(|e| e.to_string())?;
        let heads =
            planner::check_decode_shape(a.dcp, a.local_heads, a.q, batch, context).map_err(|e| e.to_string())?;
        planner::check_topk(a.dcp, a.topk).map_err(|e| e.to_string())?;
        check_host_memory(batch, a.q, heads, context)?;
        let mut rng = Rng::new(a.seed);
        let lens: Vec<u64> = (0..batch)
            .map(|i| if i == 0 { context } else { (context - rng.below(context / 4 + 1)).max(a.q as u64) })
            .collect();
        let n: usize = lens.iter().sum::<u64>() as usize;
        // c_kv groups of 128 channels get magnitudes 1..4 so the FP8 group scales differ
        let ckv =
            generate(n * D_LATENT, rng.next_u64(), |r, e| bf16::from_f32(r.unit() * (1 + (e % D_LATENT) / 128) as f32));
        let kpe = generate(n * D_ROPE, rng.next_u64(), |r, _| bf16::from_f32(r.unit()));
        let mut req_idx = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        for (i, &l) in lens.iter().enumerate() {
            req_idx.extend(std::iter::repeat_n(i as i32, l as usize));
            positions.extend(0..l as i32);
        }
        let query = generate(batch * a.q * heads * D_QK, rng.next_u64(), |r, _| bf16::from_f32(r.unit()));
        let score_stride = context as usize;
        let scores = generate(batch * a.q * score_stride, rng.next_u64(), |r, _| r.unit() * 8.0);
        let max_pages = lens.iter().map(|&l| cfg.dcp.pages_for(l, a.block_size)).max().unwrap_or(1).max(1) as usize;
        let num_pages = batch * max_pages + 1; // a page no request maps
        let mut table: Vec<i32> = (0..num_pages as i32).collect();
        for i in (1..table.len()).rev() {
            table.swap(i, rng.below(i as u64 + 1) as usize);
        }
        table.truncate(batch * max_pages);
        Ok(Problem {
            dcp: cfg.dcp,
            tp: a.tp,
            block_size: a.block_size,
            local_heads: a.local_heads,
            heads,
            q: a.q,
            k: a.topk,
            format: a.kv_format,
            lens,
            ckv,
            kpe,
            req_idx,
            positions,
            query,
            scores,
            score_stride,
            table,
            max_pages,
            num_pages,
        })
    }

    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Query rows T = b·q.
    pub fn rows(&self) -> usize {
        self.batch() * self.q
    }

    pub fn shape(&self) -> QueryShape {
        QueryShape { batch: self.batch(), rows: self.q, heads: self.heads }
    }

    /// The cached prefix: every token but each request's q new ones (their positions −1: skipped).
    pub fn prefix_positions(&self) -> Vec<i32> {
        let mut pos = self.positions.clone();
        let mut first = 0;
        for &l in &self.lens {
            let l = l as usize;
            pos[first + l - self.q..first + l].fill(-1);
            first += l;
        }
        pos
    }

    /// The step's new tokens, the last q of each request: (c_kv, k_pe, req_idx, positions).
    pub fn new_tokens(&self) -> (Vec<bf16>, Vec<bf16>, Vec<i32>, Vec<i32>) {
        let (mut ckv, mut kpe, mut req, mut pos) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut first = 0;
        for (i, &l) in self.lens.iter().enumerate() {
            let l = l as usize;
            for t in first + l - self.q..first + l {
                ckv.extend_from_slice(&self.ckv[t * D_LATENT..(t + 1) * D_LATENT]);
                kpe.extend_from_slice(&self.kpe[t * D_ROPE..(t + 1) * D_ROPE]);
                req.push(i as i32);
                pos.push(self.positions[t]);
            }
            first += l;
        }
        (ckv, kpe, req, pos)
    }

    pub fn paged(&self, format: KvFormat) -> PagedCache<'_> {
        PagedCache {
            block_table: &self.table,
            block_table_stride: self.max_pages,
            batch: self.batch(),
            max_pages: self.max_pages,
            num_pages: self.num_pages,
            block_size: self.block_size,
            format,
        }
    }

    pub fn translate(&self) -> PageTranslate<'_> {
        PageTranslate {
            block_table: &self.table,
            stride: self.max_pages,
            block_size: self.block_size,
            rows_per_request: self.q,
        }
    }

    /// Causal local lengths of every row on rank r (docs/contract.md §2).
    pub fn local_lens(&self, r: usize) -> Vec<i32> {
        causal_local_lens(&self.lens, &vec![self.q; self.batch()], self.dcp, r).expect("lengths checked")
    }

    /// Global lengths of every row: c_j = L − q + 1 + j.
    pub fn row_lens(&self) -> Vec<i32> {
        causal_local_lens(&self.lens, &vec![self.q; self.batch()], DcpLayout { size: 1, interleave: 1 }, 0)
            .expect("lengths checked")
    }

    /// Row stride of every rank's local scores: the most tokens a rank holds.
    pub fn local_stride(&self) -> usize {
        (self.dcp.local_len(self.score_stride as u64, 0) as usize).max(1)
    }

    /// Rank r's indexer scores over its local tokens [T, local_stride] and their lengths.
    pub fn local_scores(&self, r: usize) -> (Vec<f32>, Vec<i32>) {
        let stride = self.local_stride();
        let lens = self.local_lens(r);
        let mut s = vec![f32::NAN; self.rows() * stride];
        for (row, &n) in lens.iter().enumerate() {
            for l in 0..n as usize {
                let g = self.dcp.global(l as u64, r) as usize;
                s[row * stride + l] = self.scores[row * self.score_stride + g];
            }
        }
        (s, lens)
    }
}

/// The combined output of one path: out [T, H, 512] (bf16 values as f32) and lse [T, H].
pub struct PathOutput {
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
}

/// What a backend returns: both paths, the merged top-k ids [T, K], and per-stage times.
pub struct Outputs {
    pub dense: PathOutput,
    pub sparse: PathOutput,
    pub merged_ids: Vec<i32>,
    /// (stage, total milliseconds over the D simulated ranks).
    pub stages: Vec<(&'static str, f64)>,
}

pub fn add_time(stages: &mut Vec<(&'static str, f64)>, name: &'static str, ms: f64) {
    match stages.iter_mut().find(|(n, _)| *n == name) {
        Some(s) => s.1 += ms,
        None => stages.push((name, ms)),
    }
}

pub const STAGE_FILL: &str = "KV fill of the new tokens (both caches)";
pub const STAGE_DENSE: &str = "dense decode (BF16)";
pub const STAGE_TOPK: &str = "top-k (local, pack, merge, compact)";
pub const STAGE_SPARSE: &str = "sparse decode";
pub const STAGE_COMBINE: &str = "combine (ag_rs correct + finish)";

/// Writes rank r's heads [T, H_l, 512] into the full [T, H, 512] output.
pub fn place(res: &mut PathOutput, r: usize, h: usize, h_l: usize, t: usize, out: &[bf16], lse: &[f32]) {
    for ti in 0..t {
        for hl in 0..h_l {
            let dst = ti * h + r * h_l + hl;
            let src = ti * h_l + hl;
            for (o, v) in res.out[dst * D_V..][..D_V].iter_mut().zip(&out[src * D_V..][..D_V]) {
                *o = v.to_f32();
            }
            res.lse[dst] = lse[src];
        }
    }
}

/// The host memory the demo's problem takes, estimated from its largest parts: per token c_kv and
/// k_pe (bf16), its request and position, and the BF16 and FP8 caches the reference fills; per
/// query row its q and its top-k scores over the context. An upper bound within a small factor.
pub fn host_bytes(batch: usize, q: usize, heads: usize, context: u64) -> u128 {
    let tokens = batch as u128 * context as u128;
    let per_token = (D_LATENT + D_ROPE) as u128 * 2 + 8 + KvFormat::Bf16.token_bytes() as u128 + 656;
    let rows = batch as u128 * q as u128;
    tokens * per_token + rows * heads as u128 * D_QK as u128 * 2 + rows * context as u128 * 4
}

/// Refuses a problem that would not fit in this machine's available memory (MemAvailable of
/// /proc/meminfo; no check where that cannot be read), before anything is allocated: an
/// allocation failure aborts the process.
fn check_host_memory(batch: usize, q: usize, heads: usize, context: u64) -> Result<(), String> {
    let need = host_bytes(batch, q, heads, context);
    let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<u128>().ok()? * 1024)
    });
    match avail {
        Some(avail) if need > avail => Err(format!(
            "--batch {batch} × --context {context} needs about {:.1} GiB of host memory, more than the {:.1} GiB \
             available: use a smaller --batch or --context",
            need as f64 / (1u64 << 30) as f64,
            avail as f64 / (1u64 << 30) as f64
        )),
        _ => Ok(()),
    }
}
