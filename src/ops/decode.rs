//! MLA decode attention on one rank's shard (docs/contract.md §4): dense over the BF16 paged cache and
//! sparse over index lists into the BF16 or FP8-656 cache, with optional split-KV.
//!
//! Kernels: `kernels-src/decode/` — `sm80.cuh` (family `mla_decode`), `split_schedule.cuh`
//! (`mla_decode_schedule`), `combine.cuh` (`mla_decode_combine`) and, on Hopper, `sm90_trio.cuh`
//! over `sm90_base.cuh` (`mla_decode_sm90_trio`: trio, trio_split and lead, see [`DecodePath`]).
//!
//! Split-KV (`num_splits = P > 1`): a schedule kernel reads the row lengths (or index counts) on
//! the device and writes the sequences' unit prefix into the workspace; each of the P parts of
//! a row block then takes an equal share of the batch's (sequence, KV tile) units, across
//! sequences, so SMs stay balanced when lengths differ; a sequence spread over several parts
//! leaves fp32 partials that a combine kernel merges (docs/contract.md §5). Everything the split depends
//! on is computed on the device, so a captured graph replays correctly when lengths or indices
//! change. [`crate::planner::schedule`] is the host mirror and explains the partition.
//!
//! The prefix depends only on the lengths, so the layers of one decode step can share it: the
//! first launch of a step computes it ([`DecodeSchedule::Compute`]) and the others reuse it from
//! the same workspace ([`DecodeSchedule::Reuse`]), which saves the schedule kernel and the wait
//! for it (as FlashMLA's metadata is made once a step). A reused prefix made for other lengths
//! costs balance, never correctness: a sequence's last piece runs to its last tile.

use super::{to_i32, BlockTable, CacheView};
use crate::abi::{DcpMlaDecodeCombineParams, DcpMlaDecodeParams};
use crate::catalogue::kv_axis;
use crate::error::{Error, Result};
use crate::formats::{KvFormat, D_QK, D_V};
use crate::planner::choice::{choose_decode, DecodeShape};
use crate::planner::schedule::seq_shape;
use crate::planner::split::row_blocks_per_seq;
use crate::planner::{DcpLayout, DCP_SIZES};
use crate::runtime::registry::{self, axes, KernelId};
use crate::runtime::{tensor_map_bf16_2d, Device, DeviceSlice, LaunchAttrs, Stream};
use half::bf16;

pub use crate::catalogue::{sm90_variants, DecodePath, Sm90Schedule, Sm90Variant};
pub use crate::planner::choice::decode_num_splits_on;
pub use crate::planner::split::{decode_num_splits, SplitPlan, MAX_SPLITS, ROWS_PER_CTA};

/// The softmax scale docs/contract.md §4 defaults to: 576^-½.
pub fn default_scale() -> f32 {
    (D_QK as f32).powf(-0.5)
}

/// Where the attention output goes: bf16 (the default) or fp32 [batch, q, H, 512].
pub type DecodeOut = super::Rows;

/// Whether a split launch (`num_splits > 1`) computes the split schedule (the unit prefix in
/// the workspace) or reuses the one already there. One-part launches have no schedule and
/// ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeSchedule {
    /// Compute the prefix from this launch's lengths (or index counts): a one-CTA kernel before
    /// the decode, which waits for it.
    #[default]
    Compute,
    /// Reuse the prefix an earlier `Compute` launch left in this workspace, e.g. the first layer's
    /// of the same step, made for the same batch, nq, heads, `num_splits` and decode kernel. The
    /// decode kernel checks the prefix's stamp and traps (the stream then reports a launch
    /// failure) when its sequence count, part count or KV tile differ from this launch's, or
    /// when no schedule wrote it. Lengths may differ from the computing launch's: the result is
    /// exact either way (any prefix of this launch's sequences covers every tile once), only the
    /// balance between SMs is the older lengths'.
    Reuse,
}

/// What every decode launch shares: the queries, the outputs and the split-KV workspace.
#[derive(Debug, Clone, Copy)]
pub struct DecodeCommon {
    /// bf16 [batch, nq, heads, 576] with strides `q_strides` (each row's 576 values contiguous).
    pub q: DeviceSlice<bf16>,
    /// Elements between q's requests, query rows and heads (docs/contract.md §4: a view of a larger
    /// buffer, as engines slice one), each a multiple of 8 so that rows stay 16-byte aligned;
    /// `None`: contiguous, [nq·heads·576, heads·576, 576].
    pub q_strides: Option<[usize; 3]>,
    pub batch: usize,
    /// Query rows per request (1 + MTP draft tokens).
    pub nq: usize,
    /// Gathered query heads H.
    pub heads: usize,
    /// Softmax scale σ (see [`default_scale`]).
    pub scale: f32,
    /// [batch, nq, heads, 512] with strides `out_strides`.
    pub out: DecodeOut,
    /// Elements between out's requests, query rows and heads, each row 16-byte aligned and no two
    /// rows overlapping; `None`: contiguous, [nq·heads·512, heads·512, 512].
    pub out_strides: Option<[usize; 3]>,
    /// fp32 [batch, nq, heads], natural log; −inf for a row that sees no token; strides
    /// `lse_strides`.
    pub lse: DeviceSlice<f32>,
    /// Elements between lse's requests, query rows and heads, in any order as long as no two
    /// values share an element (FlashMLA's [b, h, s_q] lse is [h·s_q, 1, s_q]); `None`:
    /// contiguous, [nq·heads, heads, 1].
    pub lse_strides: Option<[usize; 3]>,
    /// A row that sees no token gets lse = +inf (FlashMLA's convention) instead of −inf; out is 0
    /// either way, and the combines take both.
    pub empty_lse_inf: bool,
    /// KV splits per CTA row block (see [`decode_num_splits`]); 1 needs no workspace.
    pub num_splits: usize,
    /// At least [`decode_workspace_bytes`] bytes when `num_splits > 1`, 16-byte aligned.
    pub workspace: DeviceSlice<u8>,
    /// Compute the split schedule into `workspace`, or reuse the one there (see [`DecodeSchedule`]).
    pub schedule: DecodeSchedule,
    /// fp32 \[heads\] attention sinks (docs/contract.md §4, FlashMLA's `attn_sink`): each row's out
    /// is scaled by e^lse / (e^lse + e^sink\[h\]), lse unchanged. `None` on a rank whose result a DCP
    /// combine merges: the sink belongs to the combine (see [`crate::ops::combine`]), once.
    pub sink: Option<DeviceSlice<f32>>,
}

impl DecodeCommon {
    /// A launch over contiguous q, out and lse, with the default scale, no sink and −inf for an
    /// empty row's lse, computing its split schedule: what a caller changes goes in by struct
    /// update, `DecodeCommon { sink: Some(s), ..DecodeCommon::new(..) }`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: DeviceSlice<bf16>,
        batch: usize,
        nq: usize,
        heads: usize,
        out: DecodeOut,
        lse: DeviceSlice<f32>,
        num_splits: usize,
        workspace: DeviceSlice<u8>,
    ) -> Self {
        DecodeCommon {
            q,
            q_strides: None,
            batch,
            nq,
            heads,
            scale: default_scale(),
            out,
            out_strides: None,
            lse,
            lse_strides: None,
            empty_lse_inf: false,
            num_splits,
            workspace,
            schedule: DecodeSchedule::Compute,
            sink: None,
        }
    }
}

/// Dense decode over the BF16 paged cache: row (i, j) attends to the first `lens[i][j]` local
/// tokens of request i, through its block-table row.
#[derive(Debug, Clone, Copy)]
pub struct DenseDecode {
    pub common: DecodeCommon,
    /// This rank's BF16 cache: rows of 576 bf16.
    pub cache: CacheView,
    /// `batch` rows: request i's tokens are in the pages of row i.
    pub block_table: BlockTable,
    /// int32 [batch, nq]: what [`DenseDecode::lens_rule`] says, local lengths per query row by
    /// default; the rows' local lengths are clamped on the device to [0, max_pages·block_size].
    pub lens: DeviceSlice<i32>,
    /// Elements between `lens`' requests and query rows, any (0 broadcasts one value: \[batch\]
    /// global lengths are `Some([1, 0])`); `None`: contiguous, [nq, 1].
    pub lens_strides: Option<[usize; 2]>,
    /// What `lens` holds: the rows' local lengths, or the requests' global lengths from which
    /// the kernels work out each row's share on this rank (causal MTP rows included), with no
    /// lengths kernel before the decode.
    pub lens_rule: LensRule,
}

/// What a dense decode's `lens` hold (docs/contract.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LensRule {
    /// Each query row's local length on this rank, as given.
    #[default]
    Local,
    /// Each request's global length L, its nq new tokens included (FlashMLA's `cache_seqlens`).
    /// Every row sees this rank's n_r(L) tokens (docs/contract.md §2: the t < L with
    /// (t / I) % D = r); with `causal`, row j of nq sees n_r(max(L − nq + 1 + j, 0)), the causal
    /// rule of MTP rows. D = 1 (`DcpLayout { size: 1, interleave: 1 }`, rank 0) is one GPU.
    Global { dcp: DcpLayout, rank: usize, causal: bool },
}

impl LensRule {
    /// One GPU's global lengths: D = 1, causal or not (what FlashMLA's interface passes).
    pub fn single(causal: bool) -> Self {
        LensRule::Global { dcp: DcpLayout { size: 1, interleave: 1 }, rank: 0, causal }
    }

    /// The local length of row `j` of `nq` of a request whose `lens` entry is `len` (the host
    /// mirror of the kernels' `dense_row_len`, before the clamp to the block table's capacity).
    pub fn row_len(&self, len: i64, nq: usize, j: usize) -> u64 {
        let len = len.max(0) as u64;
        match *self {
            LensRule::Local => len,
            LensRule::Global { dcp, rank, causal } => {
                let g = if causal { len.saturating_sub((nq - 1 - j) as u64) } else { len };
                dcp.local_len(g, rank)
            }
        }
    }
}

/// Sparse decode: row (i, j) attends to the cache rows `page·B + slot` its index list names.
#[derive(Debug, Clone, Copy)]
pub struct SparseDecode {
    pub common: DecodeCommon,
    /// This rank's cache, its rows in `format`; an index is page·block_size + slot, whatever the
    /// page stride.
    pub cache: CacheView,
    pub format: KvFormat,
    pub lists: IndexLists,
}

/// The index lists of a sparse decode ([`SparseDecode`], and each source of a MODEL1 decode,
/// [`crate::ops::model1::Model1Source`]): row (i, j) attends to the cache rows `page·B + slot`
/// listed in `indices[i][j]` (−1 or out of range: unused, never read), the first
/// `topk_len[i][j]` of them when lengths are given.
#[derive(Debug, Clone, Copy)]
pub struct IndexLists {
    /// int32 [batch, nq, topk] with strides `indices_strides` (each list contiguous).
    pub indices: DeviceSlice<i32>,
    /// Elements between the index lists' requests and query rows; `None`: contiguous,
    /// [nq·topk, topk].
    pub indices_strides: Option<[usize; 2]>,
    pub topk: usize,
    /// int32 \[batch, nq\]: only the first topk_len\[i\]\[j\] entries count (clamped to
    /// \[0, topk\]); `None`: all topk.
    pub topk_len: Option<DeviceSlice<i32>>,
    /// Elements between `topk_len`'s requests and query rows, any (0 broadcasts: FlashMLA's
    /// per-request `topk_length` is \[batch\] with strides \[1, 0\]); `None`: contiguous, \[nq, 1\].
    pub topk_len_strides: Option<[usize; 2]>,
}

impl IndexLists {
    /// Contiguous lists of `topk` entries, every entry counted: what goes in by struct update,
    /// `IndexLists { topk_len: Some(t), ..IndexLists::new(indices, topk) }`.
    pub fn new(indices: DeviceSlice<i32>, topk: usize) -> Self {
        IndexLists { indices, indices_strides: None, topk, topk_len: None, topk_len_strides: None }
    }

    /// The lists of a launch of `c`'s rows: at least one entry and fewer than the kernels' int32
    /// token counts, `indices` and `topk_len` holding their views (4-byte aligned). Errors name
    /// `n`'s fields. Returns what the kernels take.
    pub(super) fn check(&self, c: &DecodeCommon, n: &ListNames) -> Result<ListParams> {
        ensure_arg!(self.topk >= 1, n.topk, "must be at least 1");
        ensure_arg!(self.topk <= MAX_DECODE_TOKENS, n.topk, "{} exceeds the kernels' int32 token counts", self.topk);
        let indices = super::View { counts: [c.batch, c.nq], width: self.topk, align: 4, written: false };
        let [sb, ss] = indices.strides(n.indices, n.indices_strides, &self.indices, self.indices_strides)?;
        let len_strides = match &self.topk_len {
            Some(t) => length_strides(n.topk_len, n.topk_len_strides, t, self.topk_len_strides, c)?,
            None => [0, 0],
        };
        Ok(ListParams {
            indices: self.indices.ptr(),
            topk_len: self.topk_len.map_or(0, |t| t.ptr()),
            indices_strides: [sb as i64, ss as i64],
            len_strides,
            topk: to_i32(n.topk, self.topk)?,
        })
    }
}

/// The argument names of [`IndexLists`]' fields, as the C ABI spells them.
pub(super) struct ListNames {
    pub(super) indices: &'static str,
    pub(super) indices_strides: &'static str,
    pub(super) topk: &'static str,
    pub(super) topk_len: &'static str,
    pub(super) topk_len_strides: &'static str,
}

/// The names of the (first) index lists' fields.
pub(super) const LISTS: ListNames = ListNames {
    indices: "indices",
    indices_strides: "indices_strides",
    topk: "topk",
    topk_len: "topk_len",
    topk_len_strides: "topk_len_strides",
};

/// Checked index lists as the kernels take them.
pub(super) struct ListParams {
    pub(super) indices: u64,
    pub(super) topk_len: u64,
    pub(super) indices_strides: [i64; 2],
    pub(super) len_strides: [i64; 2],
    pub(super) topk: i32,
}

impl ListParams {
    /// Sets the kernels' fields of the (first) index lists.
    pub(super) fn write(&self, p: &mut DcpMlaDecodeParams) {
        (p.indices, p.topk_len, p.topk) = (self.indices, self.topk_len, self.topk);
        [p.indices_stride_b, p.indices_stride_s] = self.indices_strides;
        [p.len_stride_b, p.len_stride_s] = self.len_strides;
    }
}

/// Bytes of the split-KV workspace ([`SplitPlan`]): the schedule's int64 unit prefix
/// [sequences + 1], then fp32 partial out [2·num_splits, rows per sequence, 512] and lse
/// [2·num_splits, rows per sequence]; 0 when `num_splits <= 1`. `sparse`: for
/// [`mla_decode_sparse`] (a sequence is one query row). An error names the argument whose size
/// does not fit (the product overflows 64 bits or the address range).
pub fn decode_workspace_bytes(batch: usize, nq: usize, heads: usize, sparse: bool, num_splits: usize) -> Result<usize> {
    SplitPlan::new(batch, nq, heads, sparse, num_splits)?.host_bytes()
}

/// The most dynamic shared memory a CTA of the mma.sync decode kernels (the sm_80 fallback
/// every supported GPU must run) takes: the registry's size, evaluated from the kernel source.
pub fn fallback_shared_bytes() -> usize {
    axes::Kv::ALL
        .iter()
        .filter_map(|&kv| mma_kernel(kv))
        .map(|(id, _)| id.info().dynamic_shared_bytes as usize)
        .max()
        .unwrap_or(0)
}

/// The mma.sync kernel for `kv` and its tile (kernels.toml's `tile` axis, which the kernel checks
/// against the tile it is written for).
fn mma_kernel(kv: axes::Kv) -> Option<(KernelId<DcpMlaDecodeParams>, u32)> {
    let &((_, tile), _) = registry::MLA_DECODE_VARIANTS.iter().find(|((k, _), _)| *k == kv)?;
    registry::mla_decode(kv, tile).map(|id| (id, tile))
}

/// A decode kernel, its dynamic shared memory and its KV tile (what the split schedule counts).
pub(super) struct Kernel {
    pub(super) id: KernelId<DcpMlaDecodeParams>,
    pub(super) shared_bytes: usize,
    pub(super) tile: u32,
    /// Loads whole dense tiles by TMA when the params carry a tensor map (the dense wgmma kernel).
    pub(super) takes_tensor_map: bool,
}

impl Kernel {
    /// Launches this kernel over `grid` with its dynamic shared memory, as a programmatic
    /// dependent of the stream's previous kernel when `dependent`.
    ///
    /// # Safety
    /// As for [`Device::launch_with`].
    unsafe fn launch(
        &self,
        dev: &Device,
        grid: (u32, u32, u32),
        dependent: bool,
        stream: Stream,
        params: &DcpMlaDecodeParams,
    ) -> Result<()> {
        let attrs = LaunchAttrs { dependent, cluster: None };
        // SAFETY: the caller's contract.
        unsafe { dev.launch_with(self.id, grid, self.shared_bytes as u32, stream, params, attrs) }
    }
}

/// The kernel of `path` (never `Auto`: [`choose_decode`] resolves it) for a launch over `format`
/// (`sparse`: index lists, else the dense block table) on `dev`; `Error::Unsupported` when it
/// cannot run here (wgmma on a device that is not compute capability 9.0, or a variant not
/// built for this kind of launch).
fn decode_kernel(dev: &Device, format: KvFormat, sparse: bool, path: DecodePath) -> Result<Kernel> {
    let kv = kv_axis(format, sparse);
    // the registry holds exactly the variants kernels.toml builds for `kv`
    let kernel = match path {
        DecodePath::Mma => mma_kernel(kv).map(|(id, tile)| Kernel {
            id,
            shared_bytes: id.info().dynamic_shared_bytes as usize,
            tile,
            takes_tensor_map: false,
        }),
        DecodePath::Wgmma { tile, stages, schedule } if dev.compute_capability() == (9, 0) => {
            registry::mla_decode_sm90_trio(kv, tile, stages, schedule).map(|id| Kernel {
                id,
                shared_bytes: id.info().dynamic_shared_bytes as usize,
                tile,
                takes_tensor_map: kv == axes::Kv::DenseBf16,
            })
        }
        DecodePath::Wgmma { .. } | DecodePath::Auto => None,
    };
    let kind = if sparse { "sparse" } else { "dense" };
    kernel.ok_or_else(|| Error::Unsupported(format!("mla_decode {kind} {format:?} on {path:?}")))
}

/// Dense decode (docs/contract.md §4). Validates every argument, allocates nothing, never synchronises.
/// Runs the kernel [`DecodePath::Auto`] picks.
pub fn mla_decode_dense(dev: &Device, stream: Stream, a: &DenseDecode) -> Result<()> {
    mla_decode_dense_on(dev, stream, a, DecodePath::Auto)
}

/// [`mla_decode_dense`] on a chosen kernel; `Error::Unsupported` when it cannot run on `dev`.
pub fn mla_decode_dense_on(dev: &Device, stream: Stream, a: &DenseDecode, path: DecodePath) -> Result<()> {
    let mut params = dense_params(a)?;
    let choice = choose_decode(dev, &dense_shape(a), path)?;
    let kernel = decode_kernel(dev, KvFormat::Bf16, false, choice.path)?;
    let page_rows = params.page_rows as usize;
    if kernel.takes_tensor_map && tma_enabled() && dense_tma_fits(a.cache.num_pages, a.cache.block_size, page_rows) {
        params.kv_tmap = dense_tensor_map(dev, a, page_rows, kernel.tile)?;
        params.kv_tma = 1;
    }
    launch(dev, stream, &kernel, &a.common, &mut params, false)
}

/// The shape of a dense launch as the kernel choice sees it (its context: the block table's
/// capacity).
pub fn dense_shape(a: &DenseDecode) -> DecodeShape {
    let c = &a.common;
    DecodeShape {
        sparse: false,
        format: KvFormat::Bf16,
        batch: c.batch,
        nq: c.nq,
        heads: c.heads,
        context: a.block_table.max_pages.saturating_mul(a.cache.block_size),
        causal: matches!(a.lens_rule, LensRule::Global { causal: true, .. }),
    }
}

/// The shape of a sparse launch as the kernel choice sees it (its context: the top-k).
pub fn sparse_shape(a: &SparseDecode) -> DecodeShape {
    let c = &a.common;
    DecodeShape {
        sparse: true,
        format: a.format,
        batch: c.batch,
        nq: c.nq,
        heads: c.heads,
        context: a.lists.topk,
        causal: false,
    }
}

/// The dense cache's TMA descriptor: [num_pages·page_rows rows, 576] bf16; a box is one 128-byte
/// column block of a tile's tokens, or of one page's B tokens when B is smaller (a tile then spans
/// whole pages); the kernel works out the same box size.
fn dense_tensor_map(dev: &Device, a: &DenseDecode, page_rows: usize, tile: u32) -> Result<[u64; 16]> {
    let box_rows = a.cache.block_size.min(tile as usize) as u32;
    let rows = (a.cache.num_pages * page_rows) as u64;
    tensor_map_bf16_2d(dev, a.cache.bytes.ptr(), rows, D_QK as u64, (D_QK * 2) as u64, 64, box_rows)
}

/// The pieces of a dense launch's host path, for `benches/host_time.rs` to time apart (not an API).
#[doc(hidden)]
pub mod host_pieces {
    use super::*;

    /// Every argument check and the kernel parameters, without the kernel choice or the launch.
    pub fn checks(a: &DenseDecode) -> Result<()> {
        dense_params(a).map(|_| ())
    }

    /// The kernel choice of an Auto launch (the tuned table's lookup and the registry's).
    pub fn choice(dev: &Device, a: &DenseDecode) -> Result<()> {
        let choice = choose_decode(dev, &dense_shape(a), DecodePath::Auto)?;
        decode_kernel(dev, KvFormat::Bf16, false, choice.path).map(|_| ())
    }

    /// The dense cache's TMA descriptor (`cuTensorMapEncodeTiled`, the context bound first), as every TMA launch encodes it.
    pub fn tensor_map(dev: &Device, a: &DenseDecode) -> Result<()> {
        dense_tensor_map(dev, a, a.cache.page_rows(), 64).map(|_| ())
    }
}

/// Tokens a decode CTA may iterate over at most: its tile counts are int32 sums of a length and
/// a tile (≤ 64) on the device, so lengths stay this far below INT32_MAX.
pub(super) const MAX_DECODE_TOKENS: usize = i32::MAX as usize - 64;

/// Every check of a dense launch, and its kernel parameters (without the kernel's tensor map).
fn dense_params(a: &DenseDecode) -> Result<DcpMlaDecodeParams> {
    let mut params = validate_common(&a.common, false, D_QK)?;
    let c = &a.common;
    set_cache(&mut params, &a.cache, KvFormat::Bf16)?;
    a.block_table.check(c.batch)?;
    ensure_arg!(
        a.block_table.max_pages.checked_mul(a.cache.block_size).is_some_and(|n| n <= MAX_DECODE_TOKENS),
        "max_pages",
        "{} pages of {} tokens exceed the kernels' int32 token counts (at most {MAX_DECODE_TOKENS})",
        a.block_table.max_pages,
        a.cache.block_size
    );
    [params.len_stride_b, params.len_stride_s] = length_strides("lens", "lens_strides", &a.lens, a.lens_strides, c)?;
    if let LensRule::Global { dcp, rank, causal } = a.lens_rule {
        ensure_arg!(DCP_SIZES.contains(&dcp.size), "lens_rule", "DCP size {} is not one of {DCP_SIZES:?}", dcp.size);
        ensure_arg!(
            dcp.interleave >= 1 && dcp.size * dcp.interleave <= i32::MAX as usize,
            "lens_rule",
            "interleave {} must be at least 1 and D·I fit an int32",
            dcp.interleave
        );
        ensure_arg!(rank < dcp.size, "lens_rule", "rank {rank} is not below the DCP size {}", dcp.size);
        params.lens_rule = if causal { 2 } else { 1 };
        params.causal_shift = causal as i32;
        let cycle = dcp.size * dcp.interleave;
        (params.dcp_cycle_magic, params.dcp_cycle_shift) = high_word_divisor(cycle);
        (params.dcp_cycle, params.dcp_interleave, params.dcp_rank_start) =
            (cycle as i32, dcp.interleave as i32, (rank * dcp.interleave) as i32);
    }
    params.block_table = a.block_table.table.ptr();
    params.block_table_stride = a.block_table.stride as i64;
    params.lens = a.lens.ptr();
    params.max_pages = to_i32("max_pages", a.block_table.max_pages)?;
    Ok(params)
}

/// The magic number and shift that divide v (0 ≤ v < 2^31: a sparse index, a global length) by
/// an invariant B (the block size, D·I) without a divide: floor(v / B) = (v · m) >> s with s = 31 + ceil(log2 B) and
/// m = ceil(2^s / B) (m < 2^32). Exact because m·B − 2^s < B ≤ 2^(s − 31) (Granlund and
/// Montgomery, "Division by invariant integers using multiplication", 1994, theorem 4.2).
/// Total over usize (in u128, so a B past the int32 range the launchers refuse never overflows
/// here: their checks name the field).
pub(crate) fn invariant_divisor(block_size: usize) -> (u32, i32) {
    let b = block_size.max(1) as u128;
    let l = 128 - (b - 1).leading_zeros() as u128; // ceil(log2 B); 0 for B = 1
    let shift = 31 + l;
    let magic = (1u128 << shift).div_ceil(b);
    (magic as u32, shift as i32)
}

/// [`invariant_divisor`] for kernels that take the high word of a 32-bit product
/// (`__umulhi(v, magic) >> shift`): the shift less 32, valid for d ≥ 2 (s ≥ 32); d ≤ 1 gives
/// (0, 0), and the kernels use v itself.
pub(crate) fn high_word_divisor(d: usize) -> (u32, i32) {
    if d < 2 {
        return (0, 0);
    }
    let (magic, shift) = invariant_divisor(d);
    (magic, shift - 32)
}

/// Whether the dense cache's shape lets whole tiles load by TMA: pages of a power-of-two size of
/// at least 8 tokens (a tile of 64 then covers whole pages or lies in one, and a box starts on a
/// 1024-byte swizzle atom), and rows addressable by the int32 coordinates, with the row just past
/// the end (where the kernel points invalid pages, for zero fill) among them. A page stride
/// (`page_rows` rows from page to page) keeps each box inside its page's first B rows.
fn dense_tma_fits(num_pages: usize, block_size: usize, page_rows: usize) -> bool {
    // a cache of no pages has no tensor map to encode (every row is empty: the cp.async path)
    num_pages >= 1
        && block_size.is_power_of_two()
        && block_size >= 8
        && num_pages.checked_mul(page_rows).is_some_and(|n| n + 64 <= i32::MAX as usize)
}

/// Whether the dense wgmma kernel loads its tiles by TMA; `DCP_MLA_TMA=0` makes it use its
/// cp.async path (read once), to measure what TMA saves.
fn tma_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("DCP_MLA_TMA").map_or(true, |v| v != "0"))
}

/// Sparse decode (docs/contract.md §4) over the BF16 or FP8-656 cache. Validates every argument,
/// allocates nothing, never synchronises. Runs the kernel [`DecodePath::Auto`] picks.
pub fn mla_decode_sparse(dev: &Device, stream: Stream, a: &SparseDecode) -> Result<()> {
    mla_decode_sparse_on(dev, stream, a, DecodePath::Auto)
}

/// [`mla_decode_sparse`] on a chosen kernel; `Error::Unsupported` when it cannot run on `dev`.
pub fn mla_decode_sparse_on(dev: &Device, stream: Stream, a: &SparseDecode, path: DecodePath) -> Result<()> {
    let mut params = sparse_params(a)?;
    let choice = choose_decode(dev, &sparse_shape(a), path)?;
    let kernel = decode_kernel(dev, a.format, true, choice.path)?;
    launch(dev, stream, &kernel, &a.common, &mut params, true)
}

/// Every check of a sparse launch, and its kernel parameters.
fn sparse_params(a: &SparseDecode) -> Result<DcpMlaDecodeParams> {
    let mut params = validate_common(&a.common, true, D_QK)?;
    let c = &a.common;
    set_cache(&mut params, &a.cache, a.format)?;
    // an index page·B + slot splits by a multiply and a shift in the kernels (no division a token)
    (params.page_div_magic, params.page_div_shift) = invariant_divisor(a.cache.block_size);
    a.lists.check(c, &LISTS)?.write(&mut params);
    Ok(params)
}

/// Checks `cache` with its rows in `format` ([`CacheView::check`]) and sets the kernels' cache
/// fields (both 576-path decodes).
fn set_cache(p: &mut DcpMlaDecodeParams, cache: &CacheView, format: KvFormat) -> Result<()> {
    p.page_rows = cache.check(format)?;
    p.cache = cache.bytes.ptr();
    p.num_pages = to_i32("num_pages", cache.num_pages)?;
    p.block_size = to_i32("block_size", cache.block_size)?;
    Ok(())
}

/// The kernels' strides of per-row int32 values [batch, nq] (lengths) at `strides` (`None`:
/// contiguous): any, 0 included (a broadcast is only read).
pub(super) fn length_strides(
    arg: &'static str,
    strides_arg: &'static str,
    buf: &DeviceSlice<i32>,
    strides: Option<[usize; 2]>,
    c: &DecodeCommon,
) -> Result<[i64; 2]> {
    let lengths = super::View { counts: [c.batch, c.nq], width: 1, align: 4, written: false };
    let s = lengths.strides(arg, strides_arg, buf, strides)?;
    Ok(s.map(|x| x as i64))
}

/// The checks every decode launch shares, and the parameters they fix; `q_width`: the values of
/// a query row (576, or MODEL1's 512).
pub(super) fn validate_common(c: &DecodeCommon, sparse: bool, q_width: usize) -> Result<DcpMlaDecodeParams> {
    ensure_arg!(c.nq >= 1, "nq", "must be at least 1");
    ensure_arg!(c.heads >= 1, "heads", "must be at least 1");
    // each on its own too: with batch = 0 the row count below is 0 whatever they are
    ensure_arg!(c.nq <= i32::MAX as usize, "nq", "{} exceeds the kernels' int32", c.nq);
    ensure_arg!(c.heads <= i32::MAX as usize, "heads", "{} exceeds the kernels' int32", c.heads);
    ensure_arg!(c.batch <= 65535, "batch", "{} exceeds the grid limit 65535", c.batch);
    ensure_arg!((1..=MAX_SPLITS).contains(&c.num_splits), "num_splits", "{} is not in 1..={MAX_SPLITS}", c.num_splits);
    ensure_arg!(c.scale.is_finite() && c.scale > 0.0, "scale", "{} is not a positive finite number", c.scale);
    let rows = c.batch.checked_mul(c.nq).and_then(|n| n.checked_mul(c.heads));
    ensure_arg!(
        rows.is_some_and(|n| n <= i32::MAX as usize),
        "heads",
        "batch·nq·heads overflows the kernels' int32 row count"
    );
    let counts = [c.batch, c.nq, c.heads];
    // q's rows load and out's rows are written in 16-byte pieces
    let q = super::View { counts, width: q_width, align: 16, written: false };
    let [sb, ss, sh] = q.strides("q", "q_strides", &c.q, c.q_strides)?;
    let out = super::View { counts, width: D_V, align: 16, written: true };
    let out_strides = out.strides("out", "out_strides", &c.out, c.out_strides)?;
    let lse = super::View { counts, width: 1, align: 4, written: true };
    let lse_strides = lse.strides("lse", "lse_strides", &c.lse, c.lse_strides)?;
    let sink = super::check_sink(c.sink.as_ref(), c.heads)?;
    let plan = SplitPlan::new(c.batch, c.nq, c.heads, sparse, c.num_splits)?;
    let ws_need = plan.host_bytes()?;
    ensure_arg!(
        c.workspace.len() >= ws_need,
        "workspace",
        "holds {} bytes but {} splits need {ws_need} (decode_workspace_bytes)",
        c.workspace.len(),
        c.num_splits
    );
    ensure_aligned!(
        ws_need == 0 || c.workspace.ptr() % 16 == 0,
        "workspace",
        "pointer {:#x} is not 16-byte aligned",
        c.workspace.ptr()
    );
    // workspace: unit prefix, then partial out and lse of 2·num_splits slots (the plan's offsets)
    let sched = c.workspace.ptr();
    let (ws_out, ws_lse) = (sched + plan.out_offset, sched + plan.lse_offset);
    let (heads_magic, heads_shift) = high_word_divisor(c.heads);
    Ok(DcpMlaDecodeParams {
        q: c.q.ptr(),
        cache: 0,
        block_table: 0,
        lens: 0,
        indices: 0,
        topk_len: 0,
        out: c.out.ptr(),
        lse: c.lse.ptr(),
        sched: if ws_need > 0 { sched } else { 0 },
        sched_stamp: if ws_need > 0 { sched + plan.stamp_offset } else { 0 },
        ws_out: if ws_need > 0 { ws_out } else { 0 },
        ws_lse: if ws_need > 0 { ws_lse } else { 0 },
        sink,
        block_table_stride: 0,
        q_stride_b: sb as i64,
        q_stride_s: ss as i64,
        q_stride_h: sh as i64,
        indices_stride_b: 0,
        indices_stride_s: 0,
        len_stride_b: 0,
        len_stride_s: 0,
        out_stride_b: out_strides[0] as i64,
        out_stride_s: out_strides[1] as i64,
        out_stride_h: out_strides[2] as i64,
        lse_stride_b: lse_strides[0] as i64,
        lse_stride_s: lse_strides[1] as i64,
        lse_stride_h: lse_strides[2] as i64,
        page_rows: 1,
        empty_lse_inf: c.empty_lse_inf as i32,
        page_div_magic: 0,
        page_div_shift: 0,
        lens_rule: 0,
        causal_shift: 0,
        dcp_cycle: 1,
        dcp_cycle_magic: 0,
        dcp_cycle_shift: 0,
        heads_magic,
        heads_shift,
        dcp_interleave: 1,
        dcp_rank_start: 0,
        scale_log2: c.scale * std::f32::consts::LOG2_E,
        batch: c.batch as i32,
        nq: c.nq as i32,
        heads: c.heads as i32,
        num_pages: 0,
        block_size: 1,
        max_pages: 0,
        topk: 0,
        num_splits: c.num_splits as i32,
        sched_tile: 0,
        out_f32: c.out.is_f32() as i32,
        kv_tmap: [0; 16],
        kv_tma: 0,
        extra_cache: 0,
        extra_indices: 0,
        extra_topk_len: 0,
        extra_indices_stride_b: 0,
        extra_indices_stride_s: 0,
        extra_len_stride_b: 0,
        extra_len_stride_s: 0,
        extra_topk: 0,
        extra_num_pages: 0,
        extra_block_size: 1,
        extra_page_rows: 1,
        extra_page_div_magic: 0,
        extra_page_div_shift: 0,
    })
}

/// The combine's grid: a CTA per (part, 8 rows) when each split row has few partials (many
/// sequences), a CTA per row of every sequence, its warps splitting the partials, when few
/// sequences spread over many parts give each split row about parts / seqs of them
/// (kernels-src/decode/combine.cuh says why; NOTES.md at 628d1db, thirteenth session).
fn combine_grid(parts: usize, seqs: usize) -> axes::Grid {
    if parts >= 4 * seqs {
        axes::Grid::Row
    } else {
        axes::Grid::Part
    }
}

pub(super) fn launch(
    dev: &Device,
    stream: Stream,
    kernel: &Kernel,
    c: &DecodeCommon,
    params: &mut DcpMlaDecodeParams,
    sparse: bool,
) -> Result<()> {
    let rows = c.batch * c.nq * c.heads;
    if rows == 0 {
        return Ok(());
    }
    let rb = row_blocks_per_seq(c.nq, c.heads, sparse) as u32;
    if c.num_splits <= 1 {
        // a CTA per (sequence, row block); sparse sequences are (request, query row) pairs
        let grid = if sparse { (rb * c.nq as u32, c.batch as u32, 1) } else { (rb, c.batch as u32, 1) };
        // SAFETY: the validate functions checked every buffer against the extents the kernel
        // addresses; lengths and indices are clamped or skipped on the device.
        return unsafe { kernel.launch(dev, grid, false, stream, params) };
    }
    params.sched_tile = kernel.tile as i32;
    let schedule = registry::mla_decode_schedule().ok_or_else(|| Error::Unsupported("mla_decode_schedule".into()))?;
    let (seqs, seq_rows) = seq_shape(c.batch, c.nq, c.heads, sparse);
    let by = combine_grid(c.num_splits, seqs);
    let combine = registry::mla_decode_combine(by).ok_or_else(|| Error::Unsupported("mla_decode_combine".into()))?;
    // SAFETY: as above; the workspace holds the unit prefix, its stamp and 2·num_splits slots
    // (validated), which the schedule writes and the decode and combine kernels read and write.
    unsafe {
        // schedule → decode → combine as programmatic dependents (Hopper): each launch's setup
        // overlaps the previous kernel, which it waits for on the device before reading
        let grid = (rb, 1, c.num_splits as u32);
        match c.schedule {
            DecodeSchedule::Compute => {
                dev.launch(schedule, (1, 1, 1), stream, params)?;
                kernel.launch(dev, grid, true, stream, params)?;
            }
            // the prefix is already in the workspace (its stamp is checked on the device)
            DecodeSchedule::Reuse => kernel.launch(dev, grid, false, stream, params)?,
        }
        let merge = DcpMlaDecodeCombineParams {
            sched: params.sched,
            ws_out: params.ws_out,
            ws_lse: params.ws_lse,
            out: params.out,
            lse: params.lse,
            sink: params.sink,
            out_stride_b: params.out_stride_b,
            out_stride_s: params.out_stride_s,
            out_stride_h: params.out_stride_h,
            lse_stride_b: params.lse_stride_b,
            lse_stride_s: params.lse_stride_s,
            lse_stride_h: params.lse_stride_h,
            seqs: seqs as i32,
            rows_per_seq: seq_rows as i32,
            num_splits: params.num_splits,
            out_f32: params.out_f32,
            heads: params.heads,
            nq: params.nq,
            sparse: sparse as i32,
            empty_lse_inf: params.empty_lse_inf,
        };
        let grid = match by {
            // a CTA per (part, group of rows, a warp each)
            axes::Grid::Part => (c.num_splits as u32, seq_rows.div_ceil(combine.info().block as usize / 32) as u32, 1),
            // a CTA per row of every sequence
            axes::Grid::Row => (rows as u32, 1, 1),
        };
        dev.launch_with(combine, grid, 0, stream, &merge, LaunchAttrs { dependent: true, cluster: None })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::{arg_of, fake};

    fn common(batch: usize, nq: usize, heads: usize) -> DecodeCommon {
        let rows = batch * nq * heads;
        DecodeCommon::new(
            fake(rows * D_QK),
            batch,
            nq,
            heads,
            DecodeOut::Bf16(fake(rows * D_V)),
            fake(rows),
            1,
            fake(0),
        )
    }

    fn dense(batch: usize, stride: usize, max_pages: usize, block_size: usize) -> DenseDecode {
        DenseDecode {
            common: common(batch, 1, 16),
            cache: CacheView::packed(fake(4 * block_size * D_QK * 2), 4, block_size),
            block_table: BlockTable { table: fake(1 << 40), stride, max_pages },
            lens: fake(batch),
            lens_strides: None,
            lens_rule: LensRule::Local,
        }
    }

    /// A divisor past the int32 range (which the launchers refuse by name) neither panics nor
    /// overflows here: the checks run in any order (the fuzz tests found heads = 2^32 + 1 with
    /// batch = 0 reaching it).
    #[test]
    fn divisors_are_total() {
        for d in [1usize << 31, (1 << 32) + 1, usize::MAX / 2, usize::MAX] {
            let (_, s) = invariant_divisor(d);
            assert!(s > 31, "{d}");
            let _ = high_word_divisor(d);
        }
    }

    /// The kernels' magic-number divisions, on the host: floor(v / d) for every d the launchers
    /// compute one for, at the ends and across the range of v.
    #[test]
    fn invariant_division_is_exact() {
        let div = |v: u32, d: usize| {
            let (m, s) = invariant_divisor(d);
            ((v as u64 * m as u64) >> s) as u32
        };
        let hi = |v: u32, d: usize| {
            let (m, s) = high_word_divisor(d);
            if d < 2 {
                v
            } else {
                (((v as u64 * m as u64) >> 32) as u32) >> s
            }
        };
        let mut rng = crate::rng::Rng::new(7);
        let divisors = (1..=1100usize).chain([4095, 4096, 4097, 65_537, 1 << 20, (1 << 30) + 3, i32::MAX as usize]);
        for d in divisors {
            let mut vs: Vec<u32> = vec![0, 1, d as u32 - 1, d as u32, i32::MAX as u32, i32::MAX as u32 - 1];
            vs.extend(
                (1..4u64)
                    .flat_map(|k| [k * d as u64 - 1, k * d as u64])
                    .filter(|&v| v <= i32::MAX as u64)
                    .map(|v| v as u32),
            );
            vs.extend((0..64).map(|_| rng.below(i32::MAX as u64) as u32));
            for v in vs {
                let want = v / d as u32;
                assert_eq!(div(v, d), want, "{v} / {d}");
                assert_eq!(hi(v, d), want, "{v} / {d} (high word)");
            }
        }
    }

    /// The length rule's host mirror against the contract's definitions: a row's local length is
    /// the number of owned tokens among the first L − (nq − 1 − j) (causal) or L.
    #[test]
    fn lens_rule_counts_the_rows_owned_tokens() {
        for (d, i) in [(1, 1), (2, 1), (4, 64), (8, 1), (8, 64), (2, 3)] {
            let dcp = DcpLayout { size: d, interleave: i };
            for rank in 0..d {
                for len in [0i64, 1, 5, 63, 64, 65, 600, 1337] {
                    for nq in [1usize, 2, 6] {
                        for j in 0..nq {
                            for causal in [false, true] {
                                let rule = LensRule::Global { dcp, rank, causal };
                                let g = if causal { (len - (nq - 1 - j) as i64).max(0) } else { len } as u64;
                                let want = (0..g).filter(|&t| dcp.owner(t) == rank).count() as u64;
                                assert_eq!(rule.row_len(len, nq, j), want, "D={d} I={i} r={rank} L={len} j={j}");
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(LensRule::Local.row_len(-3, 2, 0), 0);
        assert_eq!(LensRule::single(true).row_len(10, 6, 0), 5);
    }

    #[test]
    fn lens_rule_refuses_layouts_without_kernels() {
        let mut a = dense(2, 4, 4, 64);
        for (dcp, rank) in [((3, 1), 0), ((2, 0), 0), ((4, 1), 4)] {
            a.lens_rule = LensRule::Global { dcp: DcpLayout { size: dcp.0, interleave: dcp.1 }, rank, causal: true };
            assert_eq!(arg_of(dense_params(&a).unwrap_err()), "lens_rule", "{dcp:?} rank {rank}");
        }
        a.lens_rule = LensRule::Global { dcp: DcpLayout { size: 8, interleave: 64 }, rank: 7, causal: true };
        let p = dense_params(&a).unwrap();
        assert_eq!(
            (p.lens_rule, p.causal_shift, p.dcp_cycle, p.dcp_interleave, p.dcp_rank_start),
            (2, 1, 512, 64, 448)
        );
    }

    #[test]
    fn dense_sizes_that_wrap_or_overflow_int32_counts_are_refused() {
        assert!(dense_params(&dense(4, 100, 100, 64)).is_ok());
        // (batch − 1)·stride + max_pages wraps past usize::MAX to a small count in release builds
        let e = dense_params(&dense(2, usize::MAX - 10, 20, 64)).unwrap_err();
        assert_eq!(arg_of(e), "block_table_stride");
        // max_pages·B within 64 of INT32_MAX: the device's tile counts (n + tile − 1) would wrap
        let e = dense_params(&dense(1, 1 << 25, (i32::MAX as usize) / 64, 64)).unwrap_err();
        assert_eq!(arg_of(e), "max_pages");
        assert!(dense_params(&dense(1, 1 << 25, (i32::MAX as usize - 64) / 64, 64)).is_ok());
    }

    #[test]
    fn strided_views_are_checked_against_their_extent() {
        use crate::ops::test_util::fake_at;
        // q [2, 1, 16, 576] as a view with padded heads (640) and requests (16·640 + 640)
        let strided = |q_len: usize, strides: [usize; 3]| {
            let mut d = dense(2, 4, 4, 64);
            d.common.q = fake_at(0x4000, q_len);
            d.common.q_strides = Some(strides);
            dense_params(&d)
        };
        let need = 10880 + 15 * 640 + 576;
        let p = strided(need, [10880, 10240, 640]).unwrap();
        assert_eq!((p.q_stride_b, p.q_stride_s, p.q_stride_h), (10880, 0, 640), "nq = 1: no row stride");
        assert_eq!(arg_of(strided(need - 1, [10880, 10240, 640]).unwrap_err()), "q");
        assert_eq!(arg_of(strided(need, [10880, 10240, 644]).unwrap_err()), "q_strides");
        assert_eq!(arg_of(strided(need, [1 << 63, 0, 576]).unwrap_err()), "q_strides");
        // contiguous by default: the strides the kernels used before views (nq = 1: no row stride)
        let p = dense_params(&dense(2, 4, 4, 64)).unwrap();
        assert_eq!((p.q_stride_b, p.q_stride_s, p.q_stride_h), (16 * 576, 0, 576));
        // the stride of a dim of one entry is never used, so never refused
        assert_eq!(strided(need, [10880, 3, 640]).unwrap().q_stride_s, 0);
        // pages 67 rows apart: the last page needs only its 64 rows
        let paged = |bytes: usize, stride: Option<usize>| {
            let mut d = dense(2, 4, 4, 64);
            d.cache.bytes = fake_at(0x8000, bytes);
            d.cache.page_stride = stride;
            dense_params(&d)
        };
        let row = D_QK * 2;
        assert_eq!(paged((3 * 67 + 64) * row, Some(67)).unwrap().page_rows, 67);
        assert_eq!(arg_of(paged((3 * 67 + 64) * row - 1, Some(67)).unwrap_err()), "cache");
        assert_eq!(arg_of(paged(4 * 64 * row, Some(63)).unwrap_err()), "page_stride");
        assert_eq!(paged(4 * 64 * row, None).unwrap().page_rows, 64);
        // index lists [2, 2, 512] 600 apart within a request, 1300 between requests
        let sparse = |len: usize, strides: Option<[usize; 2]>| {
            let c = common(2, 2, 16);
            sparse_params(&SparseDecode {
                common: c,
                cache: CacheView::packed(fake(4 * 64 * D_QK * 2), 4, 64),
                format: KvFormat::Bf16,
                lists: IndexLists { indices_strides: strides, ..IndexLists::new(fake_at(0x9000, len), 512) },
            })
        };
        let p = sparse(1300 + 600 + 512, Some([1300, 600])).unwrap();
        assert_eq!((p.indices_stride_b, p.indices_stride_s), (1300, 600));
        assert_eq!(arg_of(sparse(1300 + 600 + 511, Some([1300, 600])).unwrap_err()), "indices");
        assert_eq!(sparse(2048, None).unwrap().indices_stride_s, 512);
        // lengths: [batch, nq] at any strides, a broadcast (0) included
        let mut d = dense(3, 4, 4, 64);
        let c = common(3, 2, 16);
        assert_eq!(length_strides("lens", "lens_strides", &fake(3), Some([1, 0]), &c).unwrap(), [1, 0]);
        assert_eq!(arg_of(length_strides("lens", "lens_strides", &fake(2), Some([1, 0]), &c).unwrap_err()), "lens");
        assert_eq!(length_strides("lens", "lens_strides", &fake(6), None, &c).unwrap(), [2, 1]);
        d.lens_strides = Some([0, 0]);
        assert_eq!(dense_params(&d).map(|p| (p.len_stride_b, p.len_stride_s)).unwrap(), (0, 0));
        // sparse pages a stride apart: any B (the kernels divide an index by B with a magic number)
        let odd = |page_stride| {
            let mut c = common(1, 1, 16);
            c.q = fake(16 * D_QK);
            sparse_params(&SparseDecode {
                common: c,
                cache: CacheView { page_stride, ..CacheView::packed(fake(4 * 50 * D_QK * 2), 4, 48) },
                format: KvFormat::Bf16,
                lists: IndexLists::new(fake(512), 512),
            })
        };
        // any block size a stride apart: the kernels divide an index by B with a magic number
        let p = odd(Some(50)).unwrap();
        assert!(odd(None).is_ok() && odd(Some(48)).is_ok());
        assert_eq!((p.page_rows, p.page_div_magic, p.page_div_shift), (50, 2_863_311_531, 37));
    }

    #[test]
    fn written_views_must_not_overlap() {
        let v = |len, strides: [usize; 3], counts, width| {
            let out = crate::ops::View { counts, width, align: 4, written: true };
            out.strides("out", "out_strides", &fake::<f32>(len), Some(strides))
        };
        // contiguous [2, 3, 4] rows of 512, and FlashMLA's lse [b, h, s_q] as a [b, s_q, h] view
        assert_eq!(v(24 * 512, [6144, 2048, 512], [2, 3, 4], 512).unwrap(), [6144, 2048, 512]);
        assert_eq!(v(24, [12, 1, 3], [2, 3, 4], 1).unwrap(), [12, 1, 3]);
        // padded heads (640 apart) are fine; heads 256 apart overlap; a broadcast (0) overlaps
        assert!(v(2 * 3 * 4 * 640, [7680, 2560, 640], [2, 3, 4], 512).is_ok());
        assert_eq!(arg_of(v(1 << 20, [6144, 2048, 256], [2, 3, 4], 512).unwrap_err()), "out_strides");
        assert_eq!(arg_of(v(1 << 20, [0, 2048, 512], [2, 3, 4], 512).unwrap_err()), "out_strides");
        // query rows interleaved inside a head's span overlap too
        assert_eq!(arg_of(v(1 << 20, [6144, 512, 1024], [2, 3, 4], 512).unwrap_err()), "out_strides");
        // too short for the view; a dim of one entry takes any stride
        assert_eq!(arg_of(v(24 * 512 - 1, [6144, 2048, 512], [2, 3, 4], 512).unwrap_err()), "out");
        assert_eq!(v(4 * 512, [7, 99, 512], [1, 1, 4], 512).unwrap(), [0, 0, 512]);
        // through the launcher: out rows 16-byte aligned (bf16: strides multiples of 8)
        let mut d = dense(2, 4, 4, 64);
        d.common.out_strides = Some([16 * 520, 0, 520]);
        d.common.out = DecodeOut::Bf16(fake(2 * 16 * 520));
        assert_eq!(dense_params(&d).unwrap().out_stride_h, 520);
        d.common.out_strides = Some([16 * 516, 0, 516]);
        assert_eq!(arg_of(dense_params(&d).unwrap_err()), "out_strides");
    }

    #[test]
    fn sinks_need_one_aligned_value_per_head() {
        let with = |sink| {
            let mut d = dense(2, 4, 4, 64);
            d.common.sink = Some(sink);
            dense_params(&d)
        };
        assert_eq!(dense_params(&dense(2, 4, 4, 64)).unwrap().sink, 0, "no sink: a null pointer");
        assert_eq!(with(crate::ops::test_util::fake_at(0x2000, 16)).unwrap().sink, 0x2000);
        assert_eq!(arg_of(with(crate::ops::test_util::fake_at(0x2000, 15)).unwrap_err()), "sink");
        assert_eq!(arg_of(with(crate::ops::test_util::fake_at(0x2002, 16)).unwrap_err()), "sink");
        assert_eq!(arg_of(with(crate::ops::test_util::fake_at(0, 16)).unwrap_err()), "sink");
    }

    #[test]
    fn sparse_topk_near_int32_max_is_refused() {
        let s = |topk: usize| SparseDecode {
            common: common(1, 1, 16),
            cache: CacheView::packed(fake(4 * 64 * D_QK * 2), 4, 64),
            format: KvFormat::Bf16,
            lists: IndexLists::new(fake(1usize << 31), topk),
        };
        assert!(sparse_params(&s(2048)).is_ok());
        assert_eq!(arg_of(sparse_params(&s(i32::MAX as usize - 10)).unwrap_err()), "topk");
    }

    #[test]
    fn workspace_holds_the_prefix_and_two_slots_per_part() {
        assert_eq!(decode_workspace_bytes(2, 3, 16, false, 1).unwrap(), 0);
        // dense: 2 sequences of 48 rows; prefix of 3 int64 rounded up to 32 bytes, its stamp 16,
        // the part table 5·16, the partials from the next 128 bytes
        assert_eq!(decode_workspace_bytes(2, 3, 16, false, 5).unwrap(), 128 + 10 * 48 * 513 * 4);
        // sparse: 6 sequences of 16 rows; prefix of 7 int64 = 56 -> 64 bytes, its stamp 16, the
        // part table 80 -> 256
        assert_eq!(decode_workspace_bytes(2, 3, 16, true, 5).unwrap(), 256 + 10 * 16 * 513 * 4);
    }

    /// A shipped variant's dynamic shared memory, as the registry holds it (evaluated from the
    /// kernel source at build time).
    fn smem(id: Option<KernelId<DcpMlaDecodeParams>>) -> usize {
        id.expect("variant in kernels.toml").info().dynamic_shared_bytes as usize
    }

    #[test]
    fn shared_memory_fits_sm80() {
        // sm_80's opt-in limit is 163 KiB per block.
        for kv in [axes::Kv::DenseBf16, axes::Kv::SparseBf16, axes::Kv::SparseFp8] {
            let bytes = smem(mma_kernel(kv).map(|(id, _)| id));
            assert!(bytes <= 163 * 1024, "{kv:?}: {bytes}");
        }
        let mma = |kv| smem(mma_kernel(kv).map(|(id, _)| id));
        assert_eq!(fallback_shared_bytes(), mma(axes::Kv::SparseFp8));
        // the layouts decode/sm80.cuh describes (a change of layout updates these)
        assert_eq!(mma(axes::Kv::DenseBf16), 155_904);
        assert_eq!(mma(axes::Kv::SparseFp8), 160_512);
    }

    #[test]
    fn sm90_variants_fit_hopper_and_are_built() {
        // sm_90's opt-in limit is 227 KiB per block.
        for (format, sparse) in [(KvFormat::Bf16, false), (KvFormat::Bf16, true), (KvFormat::Fp8_656, true)] {
            for (tile, stages, schedule) in sm90_variants(format, sparse) {
                let bytes = smem(registry::mla_decode_sm90_trio(kv_axis(format, sparse), tile, stages, schedule));
                assert!(bytes <= 227 * 1024, "{format:?} sparse {sparse} {tile}x{stages} {schedule:?}: {bytes}");
            }
        }
        // the layouts decode/sm90_base.cuh describes (a change of layout updates these)
        let dense =
            |tile, stages, schedule| smem(registry::mla_decode_sm90_trio(axes::Kv::DenseBf16, tile, stages, schedule));
        let base = 1024 + 73_728 + 2 * 64 * 1156;
        let trio = base + 2 * 256 + 512 + 48;
        assert_eq!(dense(64, 2, Sm90Schedule::Trio), trio, "a factor slot a buffer");
        assert_eq!(dense(64, 2, Sm90Schedule::TrioSplit), trio + 16, "P's second hand-over");
        let fp8 =
            |tile, stages, schedule| smem(registry::mla_decode_sm90_trio(axes::Kv::SparseFp8, tile, stages, schedule));
        assert_eq!(fp8(64, 2, Sm90Schedule::Lead), trio + 8, "trio's layout and Q's mbarrier");
    }

    #[test]
    fn combine_grid_follows_partials_per_row() {
        // b = 128 over 128-132 parts: ~2 partials a split row, a CTA per (part, 8 rows)
        assert_eq!(combine_grid(132, 128), axes::Grid::Part);
        assert_eq!(combine_grid(22, 128), axes::Grid::Part);
        // b = 2 over 132 parts: ~66 partials a split row, a CTA per row with its warps splitting them
        assert_eq!(combine_grid(132, 2), axes::Grid::Row);
        assert_eq!(combine_grid(8, 2), axes::Grid::Row);
        assert_eq!(combine_grid(7, 2), axes::Grid::Part);
    }

    #[test]
    fn tma_takes_power_of_two_pages_of_8_or_more() {
        assert!(dense_tma_fits(1000, 64, 64));
        assert!(dense_tma_fits(1000, 8, 8), "eight pages a tile, each box on a 1024-byte atom");
        assert!(dense_tma_fits(10, 256, 256));
        assert!(!dense_tma_fits(1000, 4, 4), "a 4-token box would start mid-atom");
        assert!(!dense_tma_fits(1000, 48, 48), "a tile would straddle pages");
        assert!(!dense_tma_fits(1000, 1, 1));
        assert!(!dense_tma_fits(0, 64, 64), "no pages: no tensor map to encode");
        // rows (and the zero-fill row past the end) must fit the int32 coordinates
        assert!(dense_tma_fits((i32::MAX as usize - 64) / 64, 64, 64));
        // a page stride: boxes stay in their pages, the rows count the stride
        assert!(dense_tma_fits(1000, 64, 65));
        assert!(!dense_tma_fits((i32::MAX as usize - 64) / 64, 64, 128));
        assert!(!dense_tma_fits(i32::MAX as usize / 64, 64, 64));
        assert!(!dense_tma_fits(usize::MAX / 2, 64, 64));
    }

    #[test]
    fn each_decode_kind_has_one_default_variant_listed_first() {
        for kv in axes::Kv::ALL.iter().copied() {
            let marked = registry::MLA_DECODE_SM90_TRIO_VARIANTS
                .iter()
                .filter(|((k, ..), default)| *k == kv && *default)
                .count();
            assert_eq!(marked, 1, "{kv:?}: kernels.toml must mark exactly one wgmma variant `default`");
        }
        assert_eq!(sm90_variants(KvFormat::Bf16, false)[0], (64, 2, Sm90Schedule::Trio));
        assert_eq!(sm90_variants(KvFormat::Bf16, true)[0], (64, 2, Sm90Schedule::Trio));
        assert_eq!(sm90_variants(KvFormat::Fp8_656, true), vec![(64, 2, Sm90Schedule::Lead)], "FP8: lead");
        // every listed variant resolves to a kernel, and the mma.sync tile comes from kernels.toml
        for (format, sparse) in [(KvFormat::Bf16, false), (KvFormat::Bf16, true), (KvFormat::Fp8_656, true)] {
            for (t, st, sc) in sm90_variants(format, sparse) {
                assert!(registry::mla_decode_sm90_trio(kv_axis(format, sparse), t, st, sc).is_some());
            }
        }
        assert_eq!(mma_kernel(axes::Kv::DenseBf16).map(|(_, tile)| tile), Some(32));
    }
}
