//! Sparse top-k under DCP (docs/contract.md §6): [`local_topk`], [`pack_candidates`], [`global_merge`]
//! and [`compact`]. Reference: [`crate::reference::topk`]; kernels: `kernels-src/topk.cuh`.
//!
//! A decode step runs them in this order on every rank: local top-k over the rank's scores,
//! pack into (score, global id) candidates written into this rank's slot of a [D, rows, K]
//! buffer, all-gather that buffer (the caller's collective), merge to the global top-K ids, and
//! compact the ids this rank owns back to local positions or cache slots for sparse attention.

use super::{check_layout, check_len, compiled, launch_rows, product, to_i32};
use crate::abi::{DcpTopkCompactParams, DcpTopkMergeParams, DcpTopkPackParams, DcpTopkParams};
use crate::error::{Error, Result};
use crate::planner::{check_topk, DcpLayout, TOPK_SIZES};
use crate::runtime::registry;
use crate::runtime::{Device, DeviceSlice, LaunchAttrs, Stream};

/// Arguments of [`local_topk`].
#[derive(Debug, Clone, Copy)]
pub struct LocalTopk {
    /// fp32 [rows, row_stride]; row r's scores start at r·row_stride (64-bit offsets, so the
    /// buffer may exceed 2^31 elements). Only the first `cols` columns of a row are ever read.
    pub scores: DeviceSlice<f32>,
    pub row_stride: usize,
    /// N: the columns a row may use; a device-side length above it is clamped to it.
    pub cols: usize,
    /// int32 \[rows\]: valid length of each row, read on the device (negative counts as 0).
    pub lens: DeviceSlice<i32>,
    pub rows: usize,
    /// K: 256, 512, 1024 or 2048.
    pub k: usize,
    /// int32 [rows, k]: the selected indices in ascending order, −1 padded.
    pub out: DeviceSlice<i32>,
}

/// Whether this build holds the local top-k for this K (a capability query).
pub fn local_topk_compiled(k: usize) -> bool {
    u32::try_from(k).is_ok_and(|k| registry::topk_local(k).is_some())
}

/// Whether this build holds the global top-k merge for `dcp_size` ranks and this K.
pub fn global_merge_compiled(dcp_size: usize, k: usize) -> bool {
    match (u32::try_from(dcp_size), u32::try_from(k)) {
        (Ok(d), Ok(k)) => registry::topk_merge(d, k).is_some(),
        _ => false,
    }
}

/// Per row, the K best of the first len\[row\] scores by (score descending, index ascending; NaN
/// counts as −inf, −0 as +0), as ascending indices; a row with len ≤ K gives 0..len then −1.
/// Bit-identical to [`crate::reference::topk::local_topk`] (with cols = row_stride).
pub fn local_topk(dev: &Device, stream: Stream, a: &LocalTopk) -> Result<()> {
    local_topk_with(dev, stream, a, topk_schedule(dev, a.cols)?)
}

/// How [`local_topk`] spreads a row over the GPU (the same output either way, bit for bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopkSchedule {
    /// One CTA per row, streaming the row from memory once per radix pass (any GPU, any cols).
    CtaPerRow,
    /// One thread-block cluster of `ctas` CTAs per row (compute capability 9.0+; 1 ≤ ctas ≤ 8,
    /// ceil(cols / ctas) ≤ [`TOPK_CLUSTER_CHUNK`]): each CTA holds its chunk of the row in shared
    /// memory, so the row is read once and the whole GPU works on few rows.
    Cluster { ctas: usize },
    /// The same clusters with each CTA keeping only the top 16 bits of every key in shared
    /// memory, so it holds twice the columns ([`TOPK_CLUSTER_CHUNK_HALF`]) and a row needs half
    /// the CTAs; the elements left after the first two digits are listed and their full keys
    /// recomputed from the scores (compute capability 9.0+).
    HalfKeyCluster { ctas: usize },
}

/// The most scores one CTA of a [`TopkSchedule::Cluster`] holds (its dynamic shared memory: 128 KB).
pub const TOPK_CLUSTER_CHUNK: usize = 32768;
/// The most scores one CTA of a [`TopkSchedule::HalfKeyCluster`] holds (16-bit keys, 128 KB).
pub const TOPK_CLUSTER_CHUNK_HALF: usize = 65536;
/// The most CTAs of a top-k cluster (the portable cluster size; `kTopkClusterMax`).
pub const TOPK_CLUSTER_MAX: usize = 8;

/// The schedule [`local_topk`] uses for rows of `cols` columns on `dev`: on Hopper, clusters of
/// the fewest CTAs that hold the row (each CTA's selection passes cost the same whatever its
/// chunk, and the cluster's barriers grow with its size: on the H200 128 × 32768 ran in 21.7 µs
/// with 1 CTA a row, 36.7 with 2, 67.7 with 4): whole keys up to 32,768 columns, else half keys
/// (up to 8 × 65,536 columns), else one CTA per row. The environment variable
/// `DCP_MLA_TOPK_CLUSTER` (read once) overrides it: `0` for one CTA per row, `n` for clusters of
/// n with whole keys, `nh` (e.g. `2h`) with half keys (an error if n does not fit these columns).
pub fn topk_schedule(dev: &Device, cols: usize) -> Result<TopkSchedule> {
    static FORCED: std::sync::OnceLock<std::result::Result<Option<TopkSchedule>, String>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| match std::env::var("DCP_MLA_TOPK_CLUSTER") {
        Err(_) => Ok(None),
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => parse_forced_schedule(&v).map(Some),
    });
    if let Some(schedule) = forced.clone().map_err(|reason| Error::arg("DCP_MLA_TOPK_CLUSTER", reason))? {
        return Ok(schedule);
    }
    if dev.compute_capability().0 < 9 {
        return Ok(TopkSchedule::CtaPerRow);
    }
    Ok(auto_schedule(cols))
}

/// `DCP_MLA_TOPK_CLUSTER`'s value: `0`, `n` or `nh`.
fn parse_forced_schedule(v: &str) -> std::result::Result<TopkSchedule, String> {
    let (digits, half) = match v.strip_suffix('h') {
        Some(d) => (d, true),
        None => (v, false),
    };
    let bad = || format!("`{v}` is not 0 (one CTA per row), n (clusters of n) or nh (half-key clusters of n)");
    let c: usize = digits.parse().map_err(|_| bad())?;
    Ok(match (c, half) {
        (0, false) => TopkSchedule::CtaPerRow,
        (0, true) => return Err(bad()),
        (c, false) => TopkSchedule::Cluster { ctas: c },
        (c, true) => TopkSchedule::HalfKeyCluster { ctas: c },
    })
}

/// The scores each CTA of a `ctas`-CTA cluster holds: ceil(cols / ctas) rounded up to 4 (whole
/// 16-byte vectors), as `topk_local_cluster` computes it.
fn topk_cluster_chunk(cols: usize, ctas: usize) -> usize {
    cols.div_ceil(ctas).next_multiple_of(4)
}

fn auto_schedule(cols: usize) -> TopkSchedule {
    if cols <= TOPK_CLUSTER_CHUNK {
        return TopkSchedule::Cluster { ctas: 1 };
    }
    let fewest = cols.div_ceil(TOPK_CLUSTER_CHUNK_HALF);
    if fewest > TOPK_CLUSTER_MAX {
        return TopkSchedule::CtaPerRow;
    }
    TopkSchedule::HalfKeyCluster { ctas: fewest }
}

/// A cluster launch's grid (rows · ctas CTAs) and dynamic shared bytes (the chunk's keys of
/// `key_bits` bits, which the kernel traps on too few of), or the argument error.
fn cluster_launch(a: &LocalTopk, ctas: usize, key_bits: u32) -> Result<(u32, u32)> {
    let cap = if key_bits == 16 { TOPK_CLUSTER_CHUNK_HALF } else { TOPK_CLUSTER_CHUNK };
    ensure_arg!(
        (1..=TOPK_CLUSTER_MAX).contains(&ctas),
        "schedule",
        "a top-k cluster has 1 to {TOPK_CLUSTER_MAX} CTAs, not {ctas}"
    );
    let chunk = topk_cluster_chunk(a.cols, ctas);
    ensure_arg!(
        chunk <= cap,
        "schedule",
        "{ctas} CTAs a row hold {chunk} of the {} columns each, above {cap} ({key_bits}-bit keys)",
        a.cols
    );
    let grid = a
        .rows
        .checked_mul(ctas)
        .and_then(|g| u32::try_from(g).ok())
        .ok_or_else(|| Error::arg("rows", format!("{} rows of {ctas} CTAs exceed the grid limit", a.rows)))?;
    Ok((grid, (chunk.max(1) * key_bits as usize / 8) as u32))
}

/// [`local_topk`] with the schedule named (tests run every one against the reference).
pub fn local_topk_with(dev: &Device, stream: Stream, a: &LocalTopk, schedule: TopkSchedule) -> Result<()> {
    let params = local_topk_params(a)?;
    match schedule {
        TopkSchedule::CtaPerRow => {
            let id = compiled(registry::topk_local(a.k as u32), || format!("topk_local for K = {}", a.k))?;
            // SAFETY: local_topk_params checked every element the kernel reads and writes.
            unsafe { launch_rows(dev, stream, id, a.rows, 1, "rows", &params) }
        }
        TopkSchedule::Cluster { ctas } | TopkSchedule::HalfKeyCluster { ctas } => {
            let key_bits = if matches!(schedule, TopkSchedule::HalfKeyCluster { .. }) { 16 } else { 32 };
            let (grid, shared) = cluster_launch(a, ctas, key_bits)?;
            if dev.compute_capability().0 < 9 {
                return Err(Error::Unsupported("top-k clusters need compute capability 9.0".into()));
            }
            let id = compiled(registry::topk_local_cluster(a.k as u32, key_bits), || {
                format!("topk_local_cluster for K = {}, {key_bits}-bit keys", a.k)
            })?;
            if a.rows == 0 {
                return Ok(());
            }
            let attrs = LaunchAttrs { cluster: Some(ctas as u32), dependent: false };
            // SAFETY: local_topk_params checked every element the kernel reads and writes.
            unsafe { dev.launch_with(id, (grid, 1, 1), shared, stream, &params, attrs) }
        }
    }
}

fn local_topk_params(a: &LocalTopk) -> Result<DcpTopkParams> {
    ensure_arg!(TOPK_SIZES.contains(&a.k), "k", "K = {} is not one of the supported sizes {:?}", a.k, TOPK_SIZES);
    // The kernel walks a row in int32 tiles of 4096 elements: keep a tile's end in range.
    ensure_arg!(a.cols <= i32::MAX as usize - 4096, "cols", "{} is too long for one row (at most 2^31 - 4097)", a.cols);
    check_scores(&a.scores, a.rows, a.row_stride, a.cols)?;
    check_len("lens", &a.lens, a.rows)?;
    check_len("out", &a.out, product("rows", &[a.rows, a.k])?)?;
    let params = DcpTopkParams {
        scores: a.scores.ptr(),
        lens: a.lens.ptr(),
        out: a.out.ptr(),
        row_stride: a.row_stride as i64,
        rows: to_i32("rows", a.rows)?,
        cols: to_i32("cols", a.cols)?,
    };
    Ok(params)
}

/// Arguments of [`pack_candidates`].
#[derive(Debug, Clone, Copy)]
pub struct PackCandidates {
    /// int32 [rows, k]: this rank's local top-k (negative: unused).
    pub local_idx: DeviceSlice<i32>,
    /// The scores the local top-k ran on: fp32 [rows, row_stride], `cols` columns used.
    pub scores: DeviceSlice<f32>,
    pub row_stride: usize,
    pub cols: usize,
    pub rows: usize,
    pub k: usize,
    pub dcp: DcpLayout,
    pub rank: usize,
    /// fp32 [rows, k] and int32 [rows, k]: usually this rank's slot of the [D, rows, k] buffers
    /// that the all-gather fills.
    pub cand_scores: DeviceSlice<f32>,
    pub cand_ids: DeviceSlice<i32>,
}

/// Packs each local index l into (scores[row, l] bit for bit, global(l, rank) as int32 bits); a
/// negative index, or one at or beyond `cols` (never read), gives (−inf, −1). Bit-identical to
/// [`crate::reference::topk::pack_candidates`].
pub fn pack_candidates(dev: &Device, stream: Stream, a: &PackCandidates) -> Result<()> {
    let params = pack_params(a)?;
    let n = a.rows * a.k;
    if n == 0 {
        return Ok(());
    }
    let id = compiled(registry::topk_pack(), || "topk_pack".into())?;
    // A grid-stride loop: a few waves of blocks cover any size.
    let grid = n.div_ceil(id.info().block as usize).min(1 << 16) as u32;
    // SAFETY: pack_params checked every element the kernel reads and writes.
    unsafe { dev.launch(id, (grid, 1, 1), stream, &params) }
}

fn pack_params(a: &PackCandidates) -> Result<DcpTopkPackParams> {
    let (n, [dcp_size, dcp_rank, interleave]) = check_rows_of_k(a.rows, a.k, a.dcp, a.rank)?;
    check_scores(&a.scores, a.rows, a.row_stride, a.cols)?;
    check_len("local_idx", &a.local_idx, n)?;
    check_len("cand_scores", &a.cand_scores, n)?;
    check_len("cand_ids", &a.cand_ids, n)?;
    if a.cols > 0 {
        let top = a.dcp.global(a.cols as u64 - 1, a.rank);
        ensure_arg!(
            top <= i32::MAX as u64,
            "cols",
            "global id {top} of local index {} on rank {} overflows int32",
            a.cols - 1,
            a.rank
        );
    }
    let params = DcpTopkPackParams {
        local_idx: a.local_idx.ptr(),
        scores: a.scores.ptr(),
        cand_scores: a.cand_scores.ptr(),
        cand_ids: a.cand_ids.ptr(),
        row_stride: a.row_stride as i64,
        rows: to_i32("rows", a.rows)?,
        k: to_i32("k", a.k)?,
        cols: to_i32("cols", a.cols)?,
        dcp_size,
        dcp_rank,
        interleave,
    };
    Ok(params)
}

/// Arguments of [`global_merge`].
#[derive(Debug, Clone, Copy)]
pub struct GlobalMerge {
    /// fp32 [D, rows, k] and int32 [D, rows, k]: the all-gathered candidates, rank-major; a
    /// negative id marks an unused candidate.
    pub cand_scores: DeviceSlice<f32>,
    pub cand_ids: DeviceSlice<i32>,
    /// D.
    pub dcp_size: usize,
    pub rows: usize,
    /// K: 256, 512, 1024 or 2048, with D·K a multiple of 512.
    pub k: usize,
    /// int32 [rows, k]: the merged global ids in candidate order, −1 padded.
    pub out: DeviceSlice<i32>,
}

/// The exact global top-K of the D·K candidates of each row by (score descending, id
/// ascending), emitted in candidate order; with at most K valid candidates, all of them.
/// Bit-identical to [`crate::reference::topk::global_merge`]. Checks D·K % 512 == 0 on every
/// call, naming D and K.
pub fn global_merge(dev: &Device, stream: Stream, a: &GlobalMerge) -> Result<()> {
    let params = merge_params(a)?;
    let id = compiled(registry::topk_merge(a.dcp_size as u32, a.k as u32), || {
        format!("topk_merge for D = {}, K = {}", a.dcp_size, a.k)
    })?;
    // SAFETY: merge_params checked every element the kernel reads and writes.
    unsafe { launch_rows(dev, stream, id, a.rows, 1, "rows", &params) }
}

fn merge_params(a: &GlobalMerge) -> Result<DcpTopkMergeParams> {
    check_topk(a.dcp_size, a.k)?;
    let n = a.dcp_size.saturating_mul(a.rows).saturating_mul(a.k);
    check_len("cand_scores", &a.cand_scores, n)?;
    check_len("cand_ids", &a.cand_ids, n)?;
    check_len("out", &a.out, product("rows", &[a.rows, a.k])?)?;
    let params = DcpTopkMergeParams {
        cand_scores: a.cand_scores.ptr(),
        cand_ids: a.cand_ids.ptr(),
        out: a.out.ptr(),
        rows: to_i32("rows", a.rows)?,
        reserved: 0,
    };
    Ok(params)
}

/// The block table a [`compact`] translates through (the device twin of
/// [`crate::reference::topk::PageTranslate`]).
#[derive(Debug, Clone, Copy)]
pub struct PageTranslate {
    /// int32 [requests, stride] with requests = ceil(rows / rows_per_request).
    pub block_table: DeviceSlice<i32>,
    pub stride: usize,
    /// B: tokens per page.
    pub block_size: usize,
    /// q: row i belongs to request i / q.
    pub rows_per_request: usize,
}

/// Arguments of [`compact`].
#[derive(Debug, Clone, Copy)]
pub struct Compact {
    /// int32 [rows, k]: merged global ids, −1 unused.
    pub ids: DeviceSlice<i32>,
    pub rows: usize,
    pub k: usize,
    pub dcp: DcpLayout,
    pub rank: usize,
    /// Translate local positions to page·B + slot in the same pass.
    pub translate: Option<PageTranslate>,
    /// int32 [rows, k]: the kept ids, compacted to the front, −1 padded.
    pub out: DeviceSlice<i32>,
    /// int32 \[rows\]: kept ids per row.
    pub counts: DeviceSlice<i32>,
}

/// Keeps the ids `rank` owns, in order, as local positions (or page·B + slot; an owned id whose
/// page column is beyond the table or whose page is negative stays in place as −1 and is
/// counted), compacted to the front, −1 padded. Bit-identical to
/// [`crate::reference::topk::compact`].
pub fn compact(dev: &Device, stream: Stream, a: &Compact) -> Result<()> {
    let params = compact_params(a)?;
    let id = compiled(registry::topk_compact(), || "topk_compact".into())?;
    // SAFETY: compact_params checked every element the kernel reads and writes.
    unsafe { launch_rows(dev, stream, id, a.rows, 1, "rows", &params) }
}

fn compact_params(a: &Compact) -> Result<DcpTopkCompactParams> {
    let (n, [dcp_size, dcp_rank, interleave]) = check_rows_of_k(a.rows, a.k, a.dcp, a.rank)?;
    check_len("ids", &a.ids, n)?;
    check_len("out", &a.out, n)?;
    check_len("counts", &a.counts, a.rows)?;
    let mut params = DcpTopkCompactParams {
        ids: a.ids.ptr(),
        out: a.out.ptr(),
        counts: a.counts.ptr(),
        block_table: 0,
        block_table_stride: 0,
        rows: to_i32("rows", a.rows)?,
        k: to_i32("k", a.k)?,
        dcp_size,
        dcp_rank,
        interleave,
        translate: 0,
        block_size: 1,
        rows_per_request: 1,
        max_pages: 0,
        reserved: 0,
    };
    if let Some(t) = &a.translate {
        ensure_arg!(t.block_size >= 1, "translate.block_size", "must be at least 1");
        ensure_arg!(t.rows_per_request >= 1, "translate.rows_per_request", "must be at least 1");
        let requests = a.rows.div_ceil(t.rows_per_request);
        check_len("translate.block_table", &t.block_table, product("translate.stride", &[requests, t.stride])?)?;
        params.block_table = t.block_table.ptr();
        params.block_table_stride = t.stride as i64;
        params.translate = 1;
        params.block_size = to_i32("translate.block_size", t.block_size)?;
        params.rows_per_request = to_i32("translate.rows_per_request", t.rows_per_request)?;
        params.max_pages = to_i32("translate.stride", t.stride)?;
    }
    Ok(params)
}

/// K ≥ 1 candidates in each of `rows` rows (returns rows·K) of a rank's launch in a DCP group
/// (returns the kernels' layout, as [`check_layout`]).
fn check_rows_of_k(rows: usize, k: usize, dcp: DcpLayout, rank: usize) -> Result<(usize, [i32; 3])> {
    ensure_arg!(k >= 1, "k", "must be at least 1");
    let layout = check_layout(dcp, rank)?;
    Ok((product("rows", &[rows, k])?, layout))
}

/// The scores a top-k reads: `rows` rows `row_stride` apart of which the first `cols` are used.
fn check_scores(scores: &DeviceSlice<f32>, rows: usize, row_stride: usize, cols: usize) -> Result<()> {
    ensure_arg!(cols <= row_stride, "cols", "{cols} exceeds the row stride {row_stride}");
    check_extent("scores", scores, rows, row_stride, cols)
}

/// `rows` rows of `stride` elements of which the first `cols` may be read (no alignment needed:
/// scores are read one element at a time).
fn check_extent<T>(arg: &'static str, buf: &DeviceSlice<T>, rows: usize, stride: usize, cols: usize) -> Result<()> {
    let need = if cols == 0 { 0 } else { super::extent(arg, rows, stride, cols)? };
    check_len(arg, buf, need)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ops::test_util::{arg_of, fake};

    #[test]
    fn extents_name_the_buffer() {
        assert!(check_extent("scores", &fake::<f32>(2 * 100 + 50), 3, 100, 50).is_ok());
        assert_eq!(arg_of(check_extent("scores", &fake::<f32>(249), 3, 100, 50).unwrap_err()), "scores");
        // 64-bit extents: 2 rows of stride 2^31 - 2^20 plus 2^21 columns
        let stride = (1usize << 31) - (1 << 20);
        assert!(check_extent("scores", &fake::<f32>(stride + (1 << 21)), 2, stride, 1 << 21).is_ok());
        assert!(check_extent("scores", &fake::<f32>(0), 0, 7, 7).is_ok());
        // (rows − 1)·stride + cols wraps to 89 in release builds: refused, naming the argument
        assert_eq!(arg_of(check_extent("scores", &fake::<f32>(1000), 2, usize::MAX - 10, 100).unwrap_err()), "scores");
    }

    #[test]
    fn merge_checks_d_times_k_on_every_call() {
        let m = |d: usize, k: usize| GlobalMerge {
            cand_scores: fake(d * 4 * k),
            cand_ids: fake(d * 4 * k),
            dcp_size: d,
            rows: 4,
            k,
            out: fake(4 * k),
        };
        assert!(merge_params(&m(4, 2048)).is_ok());
        assert!(merge_params(&m(1, 512)).is_ok());
        assert!(merge_params(&m(2, 256)).is_ok() && merge_params(&m(1, 1024)).is_ok());
        // D·K not a multiple of 512, and K not a supported size: refused naming D and K
        let e = merge_params(&m(1, 256)).unwrap_err().to_string();
        assert!(e.contains("D = 1") && e.contains("K = 256"), "{e}");
        let e = merge_params(&m(2, 768)).unwrap_err().to_string();
        assert!(e.contains("D = 2") && e.contains("K = 768"), "{e}");
        let short = GlobalMerge { cand_ids: fake(4 * 4 * 512 - 1), ..m(4, 512) };
        assert_eq!(arg_of(merge_params(&short).unwrap_err()), "cand_ids");
    }

    /// Three rows of `stride` scores, `cols` of them used, K = 512, every buffer its exact size.
    fn three_rows(stride: usize, cols: usize) -> LocalTopk {
        LocalTopk {
            scores: fake(3 * stride),
            row_stride: stride,
            cols,
            lens: fake(3),
            rows: 3,
            k: 512,
            out: fake(3 * 512),
        }
    }

    #[test]
    fn local_topk_and_pack_validate() {
        let t = three_rows(1000, 1000);
        let p = local_topk_params(&t).unwrap();
        assert_eq!((p.rows, p.cols, p.row_stride), (3, 1000, 1000));
        assert_eq!(arg_of(local_topk_params(&LocalTopk { k: 768, ..t }).unwrap_err()), "k");
        assert!(local_topk_params(&LocalTopk { k: 256, ..t }).is_ok());
        assert_eq!(arg_of(local_topk_params(&LocalTopk { cols: 1001, ..t }).unwrap_err()), "cols");
        assert_eq!(arg_of(local_topk_params(&LocalTopk { lens: fake(2), ..t }).unwrap_err()), "lens");
        assert_eq!(arg_of(local_topk_params(&LocalTopk { out: fake(3 * 512 - 1), ..t }).unwrap_err()), "out");

        let pk = PackCandidates {
            local_idx: fake(2 * 512),
            scores: fake(2 * 1000),
            row_stride: 1000,
            cols: 1000,
            rows: 2,
            k: 512,
            dcp: DcpLayout { size: 8, interleave: 1 },
            rank: 7,
            cand_scores: fake(2 * 512),
            cand_ids: fake(2 * 512),
        };
        assert!(pack_params(&pk).is_ok());
        // the largest global id must fit int32: (2^28 - 1)·8 + 7 = 2^31 - 1 does, one more does not
        let fits = PackCandidates { scores: fake(1 << 30), row_stride: 1 << 28, cols: 1 << 28, ..pk };
        assert!(pack_params(&fits).is_ok());
        let wide = PackCandidates { cols: (1 << 28) + 1, row_stride: (1 << 28) + 1, ..fits };
        assert_eq!(arg_of(pack_params(&wide).unwrap_err()), "cols");
        assert_eq!(arg_of(pack_params(&PackCandidates { rank: 8, ..pk }).unwrap_err()), "rank");
    }

    #[test]
    fn topk_schedule_takes_the_fewest_ctas_that_hold_a_row() {
        assert_eq!(auto_schedule(131_072), TopkSchedule::HalfKeyCluster { ctas: 2 });
        assert_eq!(auto_schedule(32_768), TopkSchedule::Cluster { ctas: 1 });
        assert_eq!(auto_schedule(32_769), TopkSchedule::HalfKeyCluster { ctas: 1 });
        assert_eq!(auto_schedule(65_537), TopkSchedule::HalfKeyCluster { ctas: 2 });
        assert_eq!(auto_schedule(0), TopkSchedule::Cluster { ctas: 1 });
        assert_eq!(auto_schedule(8 * 65_536), TopkSchedule::HalfKeyCluster { ctas: 8 });
        assert_eq!(auto_schedule(8 * 65_536 + 1), TopkSchedule::CtaPerRow);
    }

    #[test]
    fn cluster_launches_are_checked() {
        let t = three_rows(40_003, 40_000);
        // 40,000 columns: 2 CTAs hold 20,000 each, 1 would hold 40,000 > 32,768
        assert_eq!(cluster_launch(&t, 2, 32).unwrap(), (6, 80_000));
        assert_eq!(cluster_launch(&t, 3, 32).unwrap(), (9, 4 * 13_336));
        for ctas in [0, 1, 9] {
            assert_eq!(arg_of(cluster_launch(&t, ctas, 32).unwrap_err()), "schedule", "{ctas} CTAs");
        }
        // half keys: one CTA holds the 40,000 (2 bytes each); 140,000 columns need 3
        assert_eq!(cluster_launch(&t, 1, 16).unwrap(), (3, 80_000));
        assert_eq!(cluster_launch(&t, 2, 16).unwrap(), (6, 40_000));
        let wide = three_rows(140_000, 140_000);
        assert_eq!(arg_of(cluster_launch(&wide, 2, 16).unwrap_err()), "schedule");
        assert_eq!(cluster_launch(&wide, 3, 16).unwrap(), (9, 2 * 46_668));
        let many = LocalTopk { rows: 1 << 30, ..t };
        assert_eq!(arg_of(cluster_launch(&many, 8, 32).unwrap_err()), "rows");
        assert_eq!(cluster_launch(&LocalTopk { cols: 0, ..t }, 1, 32).unwrap(), (3, 4));
    }

    #[test]
    fn forced_schedules_parse() {
        assert_eq!(parse_forced_schedule("0"), Ok(TopkSchedule::CtaPerRow));
        assert_eq!(parse_forced_schedule("4"), Ok(TopkSchedule::Cluster { ctas: 4 }));
        assert_eq!(parse_forced_schedule("2h"), Ok(TopkSchedule::HalfKeyCluster { ctas: 2 }));
        for bad in ["0h", "h", "x", "2hh", "-1"] {
            assert!(parse_forced_schedule(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn compact_validates_the_block_table() {
        let c = Compact {
            ids: fake(6 * 512),
            rows: 6,
            k: 512,
            dcp: DcpLayout { size: 2, interleave: 1 },
            rank: 1,
            translate: Some(PageTranslate {
                block_table: fake(3 * 10),
                stride: 10,
                block_size: 64,
                rows_per_request: 2,
            }),
            out: fake(6 * 512),
            counts: fake(6),
        };
        let p = compact_params(&c).unwrap();
        assert_eq!((p.translate, p.max_pages, p.rows_per_request), (1, 10, 2));
        let short = PageTranslate { block_table: fake(29), stride: 10, block_size: 64, rows_per_request: 2 };
        assert_eq!(
            arg_of(compact_params(&Compact { translate: Some(short), ..c }).unwrap_err()),
            "translate.block_table"
        );
        assert_eq!(arg_of(compact_params(&Compact { counts: fake(5), ..c }).unwrap_err()), "counts");
        assert_eq!(compact_params(&Compact { translate: None, ..c }).unwrap().translate, 0);
    }

    #[test]
    fn layout_checks_name_the_argument() {
        let d = DcpLayout { size: 4, interleave: 1 };
        assert!(check_layout(d, 3).is_ok());
        assert_eq!(arg_of(check_layout(d, 4).unwrap_err()), "rank");
        assert_eq!(arg_of(check_layout(DcpLayout { size: 0, interleave: 1 }, 0).unwrap_err()), "dcp_size");
        assert_eq!(arg_of(check_layout(DcpLayout { size: 2, interleave: 0 }, 0).unwrap_err()), "interleave");
    }
}
