//! One entry point per operation of docs/contract.md, each taking one argument struct and each a
//! thin shell around a launcher of `dcp_mla::ops`: read the struct by the compatibility rule
//! (`read_args`), convert its fields (checking null pointers, dtype codes, strides counts and
//! element alignment), check what can be checked without a device (variants, planner
//! constraints), then call the launcher, which validates every extent before it launches.
//!
//! Every struct starts with `struct_size`, `device` and `stream`, then its tensors, its sizes
//! (size_t) and its 4-byte codes, so that no field needs implicit padding; a struct whose codes
//! are odd in number ends with an explicit `_reserved` (must be 0). A later revision appends
//! fields whose zero is their default.

use crate::{device, fail, guard, read_args, stream, ArgsStruct, DcpMlaDevice, DcpMlaStatus, DcpMlaTensor, R};
use dcp_mla::formats::model1::{Model1Pages, MODEL1_D_NOPE, MODEL1_PAGE_ALIGN, MODEL1_TOKEN_BYTES};
use dcp_mla::formats::{D_LATENT, D_ROPE};
use dcp_mla::ops::combine::{self, A2aCombine, A2aPack, AgRsCorrect, AgRsFinish, CombineGroup, MergeTwo};
use dcp_mla::ops::decode::{self, DecodeCommon, DecodeOut, DenseDecode, IndexLists, SparseDecode};
use dcp_mla::ops::fill::{kv_fill, KvFill, NewTokens};
use dcp_mla::ops::model1::{self, Model1Decode, Model1Fill, Model1Source};
use dcp_mla::ops::prefill::{self, Flatten, Reorder};
use dcp_mla::ops::topk::{self, Compact, GlobalMerge, LocalTopk, PackCandidates, PageTranslate};
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::planner::{check_topk, DcpLayout};
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use dcp_mla::KvFormat;
use std::ffi::c_void;

/// The combine group of a C argument struct's `num_tokens`, `local_heads` and `dcp_size`.
macro_rules! combine_group {
    ($a:expr) => {
        CombineGroup { num_tokens: $a.num_tokens, local_heads: $a.local_heads, dcp_size: $a.dcp_size }
    };
}

/// The body of every entry point below: the struct is read (`read_args`), `convert` turns its
/// fields into the launcher's arguments and runs the checks that need no device, then the device
/// handle is looked at and `op` launches; `guard` maps the outcome (an error, a panic) to the
/// call's status.
///
/// # Safety
/// As for the entry points: `args` null or a struct of its `struct_size`, its `device` null or
/// an open handle, its `stream` null or a live stream of that context, and its tensors live
/// device memory of their `numel`.
unsafe fn launch<C: ArgsStruct, A>(
    args: *const C,
    op: fn(&Device, Stream, &A) -> dcp_mla::Result<()>,
    convert: impl FnOnce(&C) -> R<A>,
) -> DcpMlaStatus {
    guard(|| {
        let c = read_args(args)?;
        let a = convert(&c)?;
        Ok(op(device(c.device())?, stream(c.stream()), &a)?)
    })
}

macro_rules! args_structs {
    ($($t:ident = $first:literal),* $(,)?) => {$(
        // SAFETY: #[repr(C)], `struct_size`, `device` and `stream` first; its fields are raw
        // pointers, integers, floats and tensors, all valid as zero bytes.
        unsafe impl ArgsStruct for $t {
            const NAME: &'static str = stringify!($t);
            const FIRST_SIZE: usize = $first;
            fn device(&self) -> *const DcpMlaDevice {
                self.device
            }
            fn stream(&self) -> *mut c_void {
                self.stream
            }
        }

        /// All fields at their defaults (zero), `struct_size` this revision's size.
        impl Default for $t {
            fn default() -> Self {
                // SAFETY: all-zero bytes are a valid value (see the ArgsStruct impl).
                let mut a: Self = unsafe { std::mem::zeroed() };
                a.struct_size = std::mem::size_of::<Self>();
                a
            }
        }
    )*};
}

// The size of each struct at revision 5, where each appeared: the smallest `struct_size` a
// caller may pass. A revision that appends fields keeps these numbers.
args_structs! {
    DcpMlaKvFillArgs = 424,
    DcpMlaDecodeDenseArgs = 568,
    DcpMlaDecodeSparseArgs = 544,
    DcpMlaDecodeModel1Args = 736,
    DcpMlaKvFillModel1Args = 416,
    DcpMlaAgRsCorrectArgs = 232,
    DcpMlaAgRsFinishArgs = 344,
    DcpMlaA2aPackArgs = 224,
    DcpMlaA2aCombineArgs = 288,
    DcpMlaMergeTwoArgs = 432,
    DcpMlaTopkLocalArgs = 216,
    DcpMlaTopkPackArgs = 296,
    DcpMlaTopkMergeArgs = 216,
    DcpMlaTopkCompactArgs = 304,
    DcpMlaPrefillFlattenArgs = 328,
    DcpMlaPrefillReorderArgs = 232,
}

fn layout(dcp_size: usize, interleave: usize) -> DcpLayout {
    DcpLayout { size: dcp_size, interleave }
}

/// A `_reserved` field: 0, or refused by name (a later revision may give it a meaning).
fn reserved(name: &str, v: u32) -> R<()> {
    if v != 0 {
        return Err(crate::bad_arg(name, format!("{v}: reserved, must be 0")));
    }
    Ok(())
}

/// A field with `N` strides named `name` (the `strided!` of a field whose name is not its own).
fn strided_as<T, const N: usize>(t: DcpMlaTensor, name: &str) -> R<(T, Option<[usize; N]>)>
where
    DcpMlaTensor: crate::Arg<T>,
{
    let strides = t.strides::<N>(name)?;
    Ok((crate::Arg::arg(t.unstrided(), name)?, strides))
}

/// A field with one stride, the elements between its rows, named `name`: its view and that
/// stride, `default` (its contiguous layout's) when the caller gives none.
fn with_row_stride<T>(t: DcpMlaTensor, name: &str, default: usize) -> R<(T, usize)>
where
    DcpMlaTensor: crate::Arg<T>,
{
    let (view, stride) = strided_as::<T, 1>(t, name)?;
    Ok((view, stride.map_or(default, |[s]| s)))
}

/// A block table of `max_pages` columns read, its row stride from the tensor (default max_pages).
fn block_table(t: DcpMlaTensor, max_pages: usize) -> R<BlockTable> {
    let (table, stride) = with_row_stride(t, "block_table", max_pages)?;
    Ok(BlockTable { table, stride, max_pages })
}

/// A cache's byte view (its stride is read by `paged_cache` or `model1_pages`).
fn cache(t: &DcpMlaTensor) -> R<DeviceSlice<u8>> {
    crate::Arg::arg(t.unstrided(), "cache")
}

/// A 576-path cache of `num_pages` pages of `block_size` `format` rows: its bytes, and its page
/// stride in cache rows (`None`: packed pages) from `cache.strides[0]`, elements of its dtype
/// between page starts, which must be a whole number of `format` rows.
fn paged_cache(t: &DcpMlaTensor, format: KvFormat, num_pages: usize, block_size: usize) -> R<CacheView> {
    let page_stride = match t.strides::<1>("cache")? {
        None => None,
        Some([s]) => {
            let elem = crate::dtype_info(t.dtype).map_or(1, |(size, _)| size);
            let row = format.token_bytes();
            let bytes = s.checked_mul(elem).filter(|b| b % row == 0).ok_or_else(|| {
                crate::bad_arg(
                    "cache.strides",
                    format!(
                        "{s} elements of {elem} bytes between page starts is not a whole number of {row}-byte rows"
                    ),
                )
            })?;
            Some(bytes / row)
        }
    };
    Ok(CacheView { bytes: cache(t)?, num_pages, block_size, page_stride })
}

/// A fill's new tokens: `ckv` rows of `nope` values (its row stride, default `nope`), `kpe` rows
/// of 64, `req_idx` and `positions`.
fn new_tokens(
    ckv: DcpMlaTensor,
    kpe: DcpMlaTensor,
    req_idx: DcpMlaTensor,
    positions: DcpMlaTensor,
    nope: usize,
) -> R<NewTokens> {
    let (ckv, ckv_stride) = with_row_stride(ckv, "ckv", nope)?;
    let (kpe, kpe_stride) = with_row_stride(kpe, "kpe", D_ROPE)?;
    let (req_idx, positions) = (crate::Arg::arg(req_idx, "req_idx")?, crate::Arg::arg(positions, "positions")?);
    Ok(NewTokens { ckv, ckv_stride, kpe, kpe_stride, req_idx, positions })
}

/// The arguments of dcp_mla_launch_kv_fill.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaKvFillArgs {
    /// sizeof(DcpMlaKvFillArgs) as the caller was compiled (the header's compatibility rule).
    pub struct_size: usize,
    /// An open handle (dcp_mla_device_open).
    pub device: *const DcpMlaDevice,
    /// A cudaStream_t/CUstream of the device's context (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 [num_tokens, 512 + …]: c_kv in the first 512 values of a row; 1 stride (elements
    /// between tokens), default 512.
    pub ckv: DcpMlaTensor,
    /// bf16 [num_tokens, 64 + …]: k_pe in the first 64 values of a row; 1 stride, default 64.
    pub kpe: DcpMlaTensor,
    /// int32 [num_tokens]: each token's block-table row.
    pub req_idx: DcpMlaTensor,
    /// int32 [num_tokens]: each token's global position.
    pub positions: DcpMlaTensor,
    /// int32 [batch, …], the first `max_pages` columns used; 1 stride (elements between
    /// requests), default `max_pages`.
    pub block_table: DcpMlaTensor,
    /// This rank's cache [num_pages, …, row] in `format`, any dtype, the first `block_size` rows
    /// of each page its tokens; 1 stride (elements of its dtype between page starts, a whole
    /// number of rows, at least block_size of them), default packed pages.
    pub cache: DcpMlaTensor,
    /// Rows of `block_table`.
    pub batch: usize,
    /// Columns of `block_table` used.
    pub max_pages: usize,
    /// Pages of `cache`.
    pub num_pages: usize,
    /// Tokens per page B.
    pub block_size: usize,
    /// D, the DCP group size.
    pub dcp_size: usize,
    /// I, the interleave.
    pub interleave: usize,
    /// This rank r.
    pub rank: usize,
    /// The cache format (DCP_MLA_KV_*).
    pub format: i32,
    /// Padding: must be 0.
    pub _reserved: u32,
}

/// Writes each new token's KV into this rank's paged cache if this rank owns it
/// (docs/contract.md §2-3); bit-identical to the CPU reference. A token whose position is
/// negative, whose request index is outside [0, batch) or whose page is out of range is skipped.
///
/// # Safety
/// `args` must be null or point at `args->struct_size` readable bytes; every tensor must
/// describe live device memory of its `numel`; `device` an open handle; `stream` null or a live
/// stream of the device's context.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_kv_fill(args: *const DcpMlaKvFillArgs) -> DcpMlaStatus {
    launch(args, kv_fill, |a| {
        let format: KvFormat = arg!(a.format);
        reserved("_reserved", a._reserved)?;
        Ok(KvFill {
            tokens: new_tokens(a.ckv, a.kpe, a.req_idx, a.positions, D_LATENT)?,
            block_table: block_table(a.block_table, a.max_pages)?,
            batch: a.batch,
            cache: paged_cache(&a.cache, format, a.num_pages, a.block_size)?,
            format,
            dcp: layout(a.dcp_size, a.interleave),
            rank: a.rank,
        })
    })
}

/// The arguments of dcp_mla_launch_decode_dense (docs/contract.md §4).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaDecodeDenseArgs {
    /// sizeof(DcpMlaDecodeDenseArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 [batch, num_q, heads, 576]; 3 strides (elements between requests, query rows and
    /// heads; multiples of 8, each row's 576 values contiguous) for a view of a larger buffer,
    /// default contiguous. `numel` counts the elements from q's first to the end of its last row.
    pub q: DcpMlaTensor,
    /// bf16 or f32 [batch, num_q, heads, 512]; 3 strides as q's (no two rows overlapping, a
    /// multiple of 16 bytes), default contiguous.
    pub out: DcpMlaTensor,
    /// f32 [batch, num_q, heads], natural log, −inf for a row that sees no token; 3 strides as
    /// q's (FlashMLA's lse [b, h, s_q] is {h·s_q, 1, s_q}), default contiguous.
    pub lse: DcpMlaTensor,
    /// With more than 1 split, dcp_mla_decode_workspace_bytes bytes (16-byte aligned); with 1 it
    /// may be absent (null data).
    pub workspace: DcpMlaTensor,
    /// [num_pages, …, 576] bf16 (any dtype), the first `block_size` rows of each page its
    /// tokens; 1 stride (elements of its dtype between page starts, a whole number of rows, at
    /// least block_size of them), default packed pages.
    pub cache: DcpMlaTensor,
    /// int32 [batch, …], the first `max_pages` columns used; 1 stride (elements between
    /// requests), default `max_pages`.
    pub block_table: DcpMlaTensor,
    /// int32 [batch, num_q], what `lens_rule` says; 2 strides (elements between requests and
    /// query rows, any, 0 broadcasts: FlashMLA's per-request cache_seqlens is {1, 0}), default
    /// contiguous.
    pub lens: DcpMlaTensor,
    /// Optional f32 [heads] attention sinks (absent: none), FlashMLA's `attn_sink`: each row's
    /// out is scaled by e^lse / (e^lse + e^sink[h]), lse unchanged (docs/contract.md §4). Leave
    /// it absent on a DCP rank whose partial result a combine merges: give it to the combine.
    pub sink: DcpMlaTensor,
    /// Requests.
    pub batch: usize,
    /// Query rows per request (MTP).
    pub num_q: usize,
    /// Query heads.
    pub heads: usize,
    /// KV splits (dcp_mla_decode_num_splits, dcp_mla_decode_num_splits_on).
    pub num_splits: usize,
    /// Pages of `cache`.
    pub num_pages: usize,
    /// Tokens per page B.
    pub block_size: usize,
    /// Columns of `block_table` used.
    pub max_pages: usize,
    /// D (1, 2, 4 or 8); read with DCP_MLA_LENS_GLOBAL and GLOBAL_CAUSAL only (one GPU: 1).
    pub dcp_size: usize,
    /// I (≥ 1); read as dcp_size (one GPU: 1).
    pub interleave: usize,
    /// This rank (< dcp_size); read as dcp_size (one GPU: 0).
    pub rank: usize,
    /// The softmax scale σ (dcp_mla_default_scale()).
    pub scale: f32,
    /// DCP_MLA_SCHEDULE_COMPUTE (0), or DCP_MLA_SCHEDULE_REUSE to reuse the split schedule an
    /// earlier COMPUTE launch of the same batch, num_q, heads, num_splits and kind (dense or
    /// sparse, cache format) left in this workspace, e.g. the step's first layer: it saves a
    /// kernel and the wait for it. Exact whatever the lengths are now (other lengths cost only
    /// balance); a workspace whose schedule has another sequence count, part count or KV tile,
    /// or that no schedule wrote, makes the kernel trap. Ignored with one split.
    pub schedule: i32,
    /// What `lens` holds (DCP_MLA_LENS_*). LOCAL (0): each query row's local length. GLOBAL
    /// (1): each request's global length L, its num_q new tokens included (FlashMLA's
    /// cache_seqlens): every row sees n_r(L) tokens, the t < L of rank `rank`
    /// ((t / interleave) % dcp_size == rank). GLOBAL_CAUSAL (2): the same with causal MTP rows,
    /// row j sees n_r(max(L − num_q + 1 + j, 0)). The kernels work the rows' lengths out
    /// themselves: no lengths kernel before the decode.
    pub lens_rule: i32,
    /// Nonzero gives a row that sees no token lse = +inf (FlashMLA's convention) instead of
    /// −inf; out is 0 either way.
    pub empty_lse_inf: i32,
}

/// The [`DecodeCommon`] of a decode's argument struct, with the checks that need no device: dense,
/// sparse and MODEL1 decode share these fields by name but not a type (their C structs are
/// flat), hence a macro.
macro_rules! decode_common {
    ($a:ident) => {{
        let schedule = arg!($a.schedule);
        let (q, q_strides) = strided!($a.q, 3);
        let (out, out_strides): (DecodeOut, _) = strided!($a.out, 3);
        let (lse, lse_strides) = strided!($a.lse, 3);
        // The workspace is only touched with more than one split: an absent one is 0 bytes.
        let workspace = if $a.workspace.data.is_null() && $a.num_splits <= 1 {
            // SAFETY: an empty view is never dereferenced.
            unsafe { DeviceSlice::from_raw(0, 0) }
        } else {
            arg!($a.workspace)
        };
        DecodeCommon {
            q,
            q_strides,
            batch: $a.batch,
            nq: $a.num_q,
            heads: $a.heads,
            scale: $a.scale,
            out,
            lse,
            num_splits: $a.num_splits,
            workspace,
            schedule,
            sink: arg!($a.sink),
            out_strides,
            lse_strides,
            empty_lse_inf: $a.empty_lse_inf != 0,
        }
    }};
}

/// Dense MLA decode over the BF16 paged cache (docs/contract.md §4): row (i, j) attends to the
/// first `lens[i][j]` local tokens of request i (or, by `lens_rule`, its share of a global
/// length). The fields are documented on DcpMlaDecodeDenseArgs.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_decode_dense(args: *const DcpMlaDecodeDenseArgs) -> DcpMlaStatus {
    launch(args, decode::mla_decode_dense, |a| {
        let lens_rule = crate::lens_rule("lens_rule", a.lens_rule, a.dcp_size, a.interleave, a.rank)?;
        let common = decode_common!(a);
        let (lens, lens_strides) = strided!(a.lens, 2);
        Ok(DenseDecode {
            common,
            cache: paged_cache(&a.cache, KvFormat::Bf16, a.num_pages, a.block_size)?,
            block_table: block_table(a.block_table, a.max_pages)?,
            lens,
            lens_strides,
            lens_rule,
        })
    })
}

/// The arguments of dcp_mla_launch_decode_sparse (docs/contract.md §4); the fields it shares
/// with DcpMlaDecodeDenseArgs mean what they mean there.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaDecodeSparseArgs {
    /// sizeof(DcpMlaDecodeSparseArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// As for dense decode.
    pub q: DcpMlaTensor,
    /// As for dense decode.
    pub out: DcpMlaTensor,
    /// As for dense decode.
    pub lse: DcpMlaTensor,
    /// As for dense decode.
    pub workspace: DcpMlaTensor,
    /// [num_pages, …, row] in `format` (DCP_MLA_KV_*), any dtype; 1 stride as for dense decode.
    /// An index is still page·block_size + slot.
    pub cache: DcpMlaTensor,
    /// int32 [batch, num_q, topk]: cache rows page·block_size + slot (−1 or out of range:
    /// unused); 2 strides (elements between the lists' requests and query rows, each list
    /// contiguous), default contiguous.
    pub indices: DcpMlaTensor,
    /// Optional int32 [batch, num_q] (absent: every entry counts): only the first
    /// topk_len[i][j] entries count; 2 strides as dense decode's `lens` (FlashMLA's per-request
    /// topk_length is {1, 0}).
    pub topk_len: DcpMlaTensor,
    /// As for dense decode.
    pub sink: DcpMlaTensor,
    /// Requests.
    pub batch: usize,
    /// Query rows per request.
    pub num_q: usize,
    /// Query heads.
    pub heads: usize,
    /// KV splits.
    pub num_splits: usize,
    /// Pages of `cache`.
    pub num_pages: usize,
    /// Tokens per page B.
    pub block_size: usize,
    /// Entries per index list.
    pub topk: usize,
    /// The softmax scale σ.
    pub scale: f32,
    /// As for dense decode.
    pub schedule: i32,
    /// The cache format (DCP_MLA_KV_*).
    pub format: i32,
    /// As for dense decode.
    pub empty_lse_inf: i32,
}

/// Sparse MLA decode (docs/contract.md §4) over the BF16 or FP8-656 cache: row (i, j) attends
/// to the cache rows page·block_size + slot listed in `indices[i][j]`.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_decode_sparse(args: *const DcpMlaDecodeSparseArgs) -> DcpMlaStatus {
    launch(args, decode::mla_decode_sparse, |a| {
        let common = decode_common!(a);
        let format: KvFormat = arg!(a.format);
        let lists = index_lists("", a.indices, a.topk_len, a.topk)?;
        Ok(SparseDecode { common, cache: paged_cache(&a.cache, format, a.num_pages, a.block_size)?, format, lists })
    })
}

/// The arguments of dcp_mla_launch_decode_model1 (docs/contract.md §4, "MODEL1"): FlashMLA's
/// d_qk = 512 sparse decode over the page-wise FP8 MODEL1 cache, from one source or two (a cache,
/// its index lists and their lengths each); the fields it shares with DcpMlaDecodeSparseArgs mean
/// what they mean there.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaDecodeModel1Args {
    /// sizeof(DcpMlaDecodeModel1Args) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 [batch, num_q, heads, 512]; 3 strides as dense decode's q (multiples of 8, each row's
    /// 512 values contiguous), default contiguous.
    pub q: DcpMlaTensor,
    /// As for dense decode: [batch, num_q, heads, 512] (the whole 512-value row is V).
    pub out: DcpMlaTensor,
    /// As for dense decode.
    pub lse: DcpMlaTensor,
    /// As for dense decode (dcp_mla_decode_workspace_bytes with sparse = 1).
    pub workspace: DcpMlaTensor,
    /// The first source's MODEL1 cache (FlashMLA's k_cache), any dtype, 16-byte aligned:
    /// `num_pages` pages of `block_size` tokens B, each page the B tokens' value rows (448 e4m3,
    /// then 64 bf16) at 576·s, then their scale slots (7 ue8m0, 1 pad) at 576·B + 8·s, padded to
    /// a multiple of 576 bytes. 1 stride (elements of its dtype between page starts: a multiple
    /// of 576 bytes, at least the page's ceil(584·B / 576)·576), default packed pages of that
    /// size. It holds (num_pages − 1)·stride + ceil(584·B / 576)·576 bytes at least.
    pub cache: DcpMlaTensor,
    /// int32 [batch, num_q, topk]: addresses page·block_size + slot into `cache` (−1 or outside
    /// [0, num_pages·block_size): unused, never read); 2 strides as sparse decode's, default
    /// contiguous.
    pub indices: DcpMlaTensor,
    /// Optional int32 [batch, num_q] (absent: every entry counts): only the first
    /// topk_len[i][j] entries of indices[i][j] count (clamped to [0, topk]); 2 strides as dense
    /// decode's `lens` (FlashMLA's per-request topk_length [batch] is {1, 0}).
    pub topk_len: DcpMlaTensor,
    /// Optional second source's cache (FlashMLA's extra_k_cache), as `cache` with its own
    /// `extra_num_pages`, `extra_block_size` and page stride. Absent (null data): one source, and
    /// every other extra_* field must be absent or 0. Its entries follow the first list's in the
    /// same softmax.
    pub extra_cache: DcpMlaTensor,
    /// int32 [batch, num_q, extra_topk] into `extra_cache` (FlashMLA's
    /// extra_indices_in_kvcache), required with it; as `indices`.
    pub extra_indices: DcpMlaTensor,
    /// Optional int32 [batch, num_q] (FlashMLA's extra_topk_length), as `topk_len` for
    /// `extra_indices`.
    pub extra_topk_len: DcpMlaTensor,
    /// As for dense decode.
    pub sink: DcpMlaTensor,
    /// Requests.
    pub batch: usize,
    /// Query rows per request.
    pub num_q: usize,
    /// Query heads.
    pub heads: usize,
    /// KV splits (the sparse count of dcp_mla_decode_num_splits).
    pub num_splits: usize,
    /// Pages of `cache`.
    pub num_pages: usize,
    /// Tokens per page B of `cache`.
    pub block_size: usize,
    /// Entries per list of `indices`.
    pub topk: usize,
    /// Pages of `extra_cache` (0 without it).
    pub extra_num_pages: usize,
    /// Tokens per page of `extra_cache` (0 without it).
    pub extra_block_size: usize,
    /// Entries per list of `extra_indices` (0 without it).
    pub extra_topk: usize,
    /// The softmax scale σ; 0 (the default) is MODEL1's 512^-1/2 (FlashMLA's default, d_qk^-1/2),
    /// not dcp_mla_default_scale()'s 576^-1/2.
    pub scale: f32,
    /// As for dense decode.
    pub schedule: i32,
    /// As for dense decode.
    pub empty_lse_inf: i32,
    /// Padding: must be 0.
    pub _reserved: u32,
}

/// A MODEL1 cache's pages: the page stride in bytes from `t.strides[0]` (elements of its dtype),
/// by default packed pages of ceil(584·B / 576)·576 bytes. The launcher checks the stride (a
/// multiple of 576, at least a page) and the block size; a default that overflows is left to its
/// block-size check (stride 0).
fn model1_pages(t: &DcpMlaTensor, name: &str, num_pages: usize, block_size: usize) -> R<Model1Pages> {
    let page_stride = match t.strides::<1>(name)? {
        None => block_size
            .checked_mul(MODEL1_TOKEN_BYTES)
            .and_then(|b| b.div_ceil(MODEL1_PAGE_ALIGN).checked_mul(MODEL1_PAGE_ALIGN))
            .unwrap_or(0),
        Some([s]) => {
            let elem = crate::dtype_info(t.dtype).map_or(1, |(size, _)| size);
            s.checked_mul(elem).ok_or_else(|| {
                crate::bad_arg(
                    &format!("{name}.strides"),
                    format!("{s} elements of {elem} bytes between page starts overflow the address space"),
                )
            })?
        }
    };
    Ok(Model1Pages { num_pages, block_size, page_stride })
}

/// One MODEL1 source of a DcpMlaDecodeModel1Args, its fields named with `prefix` ("" or "extra_").
#[allow(clippy::too_many_arguments)]
fn model1_source(
    prefix: &str,
    cache: DcpMlaTensor,
    indices: DcpMlaTensor,
    topk_len: DcpMlaTensor,
    num_pages: usize,
    block_size: usize,
    topk: usize,
) -> R<Model1Source> {
    let name = |f: &str| format!("{prefix}{f}");
    let pages = model1_pages(&cache, &name("cache"), num_pages, block_size)?;
    let lists = index_lists(prefix, indices, topk_len, topk)?;
    Ok(Model1Source { cache: crate::Arg::arg(cache.unstrided(), &name("cache"))?, pages, lists })
}

/// Index lists of `topk` entries from their two tensors (2 strides each), their fields named with
/// `prefix` ("" or "extra_").
fn index_lists(prefix: &str, indices: DcpMlaTensor, topk_len: DcpMlaTensor, topk: usize) -> R<IndexLists> {
    let (indices, indices_strides) = strided_as(indices, &format!("{prefix}indices"))?;
    let (topk_len, topk_len_strides) = strided_as(topk_len, &format!("{prefix}topk_len"))?;
    Ok(IndexLists { indices, indices_strides, topk, topk_len, topk_len_strides })
}

/// MODEL1 sparse decode (docs/contract.md §4, "MODEL1"; FlashMLA's d_qk = 512 path): row (i, j)
/// attends to the valid entries of indices[i][j] in `cache`, then those of extra_indices[i][j]
/// in `extra_cache` when given, all in one softmax over the 512-value rows (the 448 dequantised
/// values and the 64 rope values; V is the whole row). lse is the natural log, −inf (or +inf with
/// empty_lse_inf) for a row that sees no token, whose out is 0; the sink and split-KV as for the
/// other decodes.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_decode_model1(args: *const DcpMlaDecodeModel1Args) -> DcpMlaStatus {
    launch(args, model1::mla_decode_model1, model1_decode)
}

/// dcp_mla_launch_decode_model1's fields as the launcher's arguments (the checks that need no device).
fn model1_decode(a: &DcpMlaDecodeModel1Args) -> R<Model1Decode> {
    reserved("_reserved", a._reserved)?;
    let mut common = decode_common!(a);
    if a.scale == 0.0 {
        common.scale = model1::model1_default_scale();
    }
    let main = model1_source("", a.cache, a.indices, a.topk_len, a.num_pages, a.block_size, a.topk)?;
    let extra = if a.extra_cache.data.is_null() {
        // a second source's field without its cache would go unused: refused by name
        let set = [
            ("extra_cache.num_strides", a.extra_cache.num_strides != 0),
            ("extra_indices", !a.extra_indices.data.is_null()),
            ("extra_topk_len", !a.extra_topk_len.data.is_null()),
            ("extra_num_pages", a.extra_num_pages != 0),
            ("extra_block_size", a.extra_block_size != 0),
            ("extra_topk", a.extra_topk != 0),
        ];
        if let Some((name, _)) = set.iter().find(|(_, s)| *s) {
            return Err(crate::bad_arg(
                name,
                "is set but extra_cache is absent (null data): give the second source's cache, or leave \
                 every extra_* field at 0",
            ));
        }
        None
    } else {
        Some(model1_source(
            "extra_",
            a.extra_cache,
            a.extra_indices,
            a.extra_topk_len,
            a.extra_num_pages,
            a.extra_block_size,
            a.extra_topk,
        )?)
    };
    Ok(Model1Decode { common, main, extra })
}

/// The arguments of dcp_mla_launch_kv_fill_model1 (docs/contract.md §3, "MODEL1").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaKvFillModel1Args {
    /// sizeof(DcpMlaKvFillModel1Args) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 [num_tokens, 448 + …]: the 448 values quantised to e4m3 in the first 448 of a row; 1
    /// stride (elements between tokens, a multiple of 8), default 448.
    pub ckv: DcpMlaTensor,
    /// bf16 [num_tokens, 64 + …]: the 64 rope values, kept in bf16, in the first 64 of a row; 1
    /// stride, default 64.
    pub kpe: DcpMlaTensor,
    /// int32 [num_tokens]: each token's block-table row.
    pub req_idx: DcpMlaTensor,
    /// int32 [num_tokens]: each token's global position (negative: skipped).
    pub positions: DcpMlaTensor,
    /// int32 [batch, …], the first `max_pages` columns used; 1 stride (elements between
    /// requests), default `max_pages`.
    pub block_table: DcpMlaTensor,
    /// This rank's MODEL1 cache, as dcp_mla_launch_decode_model1's `cache` (1 stride: elements
    /// between page starts, a multiple of 576 bytes; default packed pages).
    pub cache: DcpMlaTensor,
    /// Rows of `block_table`.
    pub batch: usize,
    /// Columns of `block_table` used.
    pub max_pages: usize,
    /// Pages of `cache`.
    pub num_pages: usize,
    /// Tokens per page B (a multiple of `interleave`).
    pub block_size: usize,
    /// D, the DCP group size.
    pub dcp_size: usize,
    /// I, the interleave.
    pub interleave: usize,
    /// This rank r.
    pub rank: usize,
}

/// Writes each new token into this rank's MODEL1 cache if this rank owns it (docs/contract.md
/// §2-3): its value row (448 e4m3 quantised in tiles of 64 with one power-of-two ue8m0 scale a
/// tile, then the 64 rope values in bf16) and its scale slot, bit-identical to the CPU
/// reference; nothing else of the cache, page padding included. A token whose position is
/// negative, whose request index is outside [0, batch) or whose page is out of range is skipped.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_kv_fill_model1(args: *const DcpMlaKvFillModel1Args) -> DcpMlaStatus {
    launch(args, model1::kv_fill_model1, model1_fill)
}

/// dcp_mla_launch_kv_fill_model1's fields as the launcher's arguments.
fn model1_fill(a: &DcpMlaKvFillModel1Args) -> R<Model1Fill> {
    Ok(Model1Fill {
        tokens: new_tokens(a.ckv, a.kpe, a.req_idx, a.positions, MODEL1_D_NOPE)?,
        block_table: block_table(a.block_table, a.max_pages)?,
        batch: a.batch,
        pages: model1_pages(&a.cache, "cache", a.num_pages, a.block_size)?,
        cache: cache(&a.cache)?,
        dcp: layout(a.dcp_size, a.interleave),
        rank: a.rank,
    })
}

/// The arguments of dcp_mla_launch_ag_rs_correct (docs/contract.md §5.1), on rank `rank` of
/// D = `dcp_size` (H = D·local_heads).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaAgRsCorrectArgs {
    /// sizeof(DcpMlaAgRsCorrectArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 or f32 [num_tokens, H, 512], this rank's partial attention output.
    pub out: DcpMlaTensor,
    /// f32 [D, num_tokens, H], every rank's lse (all-gathered), base `lse_base`.
    pub lse_all: DcpMlaTensor,
    /// f32 or bf16 [H, num_tokens, 512] (bf16: rounded to nearest even), written.
    pub contrib: DcpMlaTensor,
    /// Tokens T.
    pub num_tokens: usize,
    /// Heads per rank.
    pub local_heads: usize,
    /// D.
    pub dcp_size: usize,
    /// This rank.
    pub rank: usize,
    /// The base of `lse_all` (DCP_MLA_LSE_BASE_*).
    pub lse_base: i32,
    /// Padding: must be 0.
    pub _reserved: u32,
}

/// ag_rs combine, step 1: contrib[h, t, :] = (w_rank / S) · out[t, h, :] computed in f32,
/// head-major for a reduce-scatter.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_ag_rs_correct(args: *const DcpMlaAgRsCorrectArgs) -> DcpMlaStatus {
    launch(args, combine::ag_rs_correct, |a| {
        reserved("_reserved", a._reserved)?;
        Ok(AgRsCorrect {
            out: arg!(a.out),
            lse_all: arg!(a.lse_all),
            lse_base: arg!(a.lse_base),
            contrib: arg!(a.contrib),
            group: combine_group!(a),
            rank: a.rank,
        })
    })
}

/// The arguments of dcp_mla_launch_ag_rs_finish.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaAgRsFinishArgs {
    /// sizeof(DcpMlaAgRsFinishArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// f32 or bf16 [local_heads, num_tokens, 512], the reduce-scattered contributions.
    pub summed: DcpMlaTensor,
    /// f32 [D, num_tokens, D·local_heads], the same all-gathered lse, base `lse_base`.
    pub lse_all: DcpMlaTensor,
    /// bf16 or f32 [num_tokens, local_heads, 512], written.
    pub out: DcpMlaTensor,
    /// f32 [num_tokens, local_heads], written.
    pub lse: DcpMlaTensor,
    /// Optional f32 [local_heads] (absent: none), the attention sinks of this rank's heads
    /// (sink[j] for head rank·local_heads + j), applied once to the merged f32 rows before the
    /// cast.
    pub sink: DcpMlaTensor,
    /// Tokens T.
    pub num_tokens: usize,
    /// Heads per rank.
    pub local_heads: usize,
    /// D.
    pub dcp_size: usize,
    /// This rank.
    pub rank: usize,
    /// The base of `lse_all` (DCP_MLA_LSE_BASE_*).
    pub lse_base: i32,
    /// Padding: must be 0.
    pub _reserved: u32,
}

/// ag_rs combine, step 2: casts this rank's reduce-scattered heads to the output dtype and
/// writes their merged lse (natural log; −inf with out = 0 where every shard is empty).
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_ag_rs_finish(args: *const DcpMlaAgRsFinishArgs) -> DcpMlaStatus {
    launch(args, combine::ag_rs_finish, |a| {
        reserved("_reserved", a._reserved)?;
        Ok(AgRsFinish {
            summed: arg!(a.summed),
            lse_all: arg!(a.lse_all),
            lse_base: arg!(a.lse_base),
            out: arg!(a.out),
            lse: arg!(a.lse),
            group: combine_group!(a),
            rank: a.rank,
            sink: arg!(a.sink),
        })
    })
}

/// The arguments of dcp_mla_launch_a2a_pack (docs/contract.md §5.2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaA2aPackArgs {
    /// sizeof(DcpMlaA2aPackArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 or f32 [num_tokens, D·local_heads, 512].
    pub out: DcpMlaTensor,
    /// f32 [num_tokens, D·local_heads].
    pub lse: DcpMlaTensor,
    /// Bytes [D, slot_bytes] (any dtype), written.
    pub send: DcpMlaTensor,
    /// Bytes per slot (dcp_mla_a2a_slot_bytes).
    pub slot_bytes: usize,
    /// Tokens T.
    pub num_tokens: usize,
    /// Heads per rank.
    pub local_heads: usize,
    /// D.
    pub dcp_size: usize,
}

/// a2a combine, send side: packs this rank's out (as bf16) and lse into one slot per
/// destination rank d (heads [d·H_l, (d+1)·H_l)), so one all-to-all moves both.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_a2a_pack(args: *const DcpMlaA2aPackArgs) -> DcpMlaStatus {
    launch(args, combine::a2a_pack, |a| {
        Ok(A2aPack {
            out: arg!(a.out),
            lse: arg!(a.lse),
            send: arg!(a.send),
            slot_bytes: a.slot_bytes,
            group: combine_group!(a),
        })
    })
}

/// The arguments of dcp_mla_launch_a2a_combine.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaA2aCombineArgs {
    /// sizeof(DcpMlaA2aCombineArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// Bytes [D, slot_bytes]: slot r as source rank r packed it for this rank.
    pub recv: DcpMlaTensor,
    /// bf16 or f32 [num_tokens, local_heads, 512], written.
    pub out: DcpMlaTensor,
    /// f32 [num_tokens, local_heads], written.
    pub lse: DcpMlaTensor,
    /// Optional f32 [local_heads] (absent: none): as for dcp_mla_launch_ag_rs_finish.
    pub sink: DcpMlaTensor,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// Tokens T.
    pub num_tokens: usize,
    /// Heads per rank.
    pub local_heads: usize,
    /// D (compiled for 1, 2, 4, 8).
    pub dcp_size: usize,
    /// The base of the packed lse (DCP_MLA_LSE_BASE_*).
    pub lse_base: i32,
    /// Padding: must be 0.
    pub _reserved: u32,
}

/// a2a combine, receive side: the full merge (docs/contract.md §5) of the D received slots, in
/// f32, rank order, a source with coefficient 0 skipped (D = 1 is the identity: the one slot
/// unpacked, docs/contract.md §9's DCP identity at D = 1).
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_a2a_combine(args: *const DcpMlaA2aCombineArgs) -> DcpMlaStatus {
    launch(args, combine::a2a_combine, |a| {
        reserved("_reserved", a._reserved)?;
        let c = A2aCombine {
            recv: arg!(a.recv),
            slot_bytes: a.slot_bytes,
            lse_base: arg!(a.lse_base),
            out: arg!(a.out),
            lse: arg!(a.lse),
            group: combine_group!(a),
            sink: arg!(a.sink),
        };
        if !combine::a2a_combine_compiled(a.dcp_size, &c.out) {
            return Err(fail(
                DcpMlaStatus::Unsupported,
                format!("a2a combine for D = {} is not compiled (D in {:?})", a.dcp_size, combine::A2A_RANKS),
            ));
        }
        Ok(c)
    })
}

/// The arguments of dcp_mla_launch_merge_two (docs/contract.md §5.3).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaMergeTwoArgs {
    /// sizeof(DcpMlaMergeTwoArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 or f32 [rows, 512].
    pub out_a: DcpMlaTensor,
    /// f32 [rows], base `lse_a_base`.
    pub lse_a: DcpMlaTensor,
    /// [rows, 512], out_a's dtype.
    pub out_b: DcpMlaTensor,
    /// f32 [rows], base `lse_b_base`.
    pub lse_b: DcpMlaTensor,
    /// bf16 or f32 [rows, 512], written; of the inputs' dtype it may be exactly out_a or out_b
    /// (in place).
    pub out: DcpMlaTensor,
    /// f32 [rows], natural log, written.
    pub lse: DcpMlaTensor,
    /// Optional f32 [H] (absent: none): attention sinks applied to the merged rows, laid out
    /// [T, H] (head = row mod H, H = sink.numel dividing `rows`). Give it on the last merge of a
    /// chain only, so that the sink enters the softmax once.
    pub sink: DcpMlaTensor,
    /// Rows.
    pub rows: usize,
    /// The base of lse_a (DCP_MLA_LSE_BASE_*; a running natural-log result merged with a
    /// base-2 chunk is the normal case).
    pub lse_a_base: i32,
    /// The base of lse_b.
    pub lse_b_base: i32,
}

/// The two-way merge of chunked prefill: (out_a, lse_a) + (out_b, lse_b) over `rows` rows, f32
/// accumulation.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_merge_two(args: *const DcpMlaMergeTwoArgs) -> DcpMlaStatus {
    launch(args, combine::merge_two, |a| {
        Ok(MergeTwo {
            out_a: arg!(a.out_a),
            lse_a: arg!(a.lse_a),
            out_b: arg!(a.out_b),
            lse_b: arg!(a.lse_b),
            lse_a_base: arg!(a.lse_a_base),
            lse_b_base: arg!(a.lse_b_base),
            out: arg!(a.out),
            lse: arg!(a.lse),
            rows: a.rows,
            sink: arg!(a.sink),
        })
    })
}

/// The arguments of dcp_mla_launch_topk_local (docs/contract.md §6).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaTopkLocalArgs {
    /// sizeof(DcpMlaTopkLocalArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// f32 [rows, …], the first `cols` columns usable; 1 stride (elements between rows),
    /// default `cols`.
    pub scores: DcpMlaTensor,
    /// int32 [rows].
    pub lens: DcpMlaTensor,
    /// int32 [rows, k], written.
    pub out: DcpMlaTensor,
    /// Columns usable.
    pub cols: usize,
    /// Rows.
    pub rows: usize,
    /// K: 256, 512, 1024 or 2048.
    pub k: usize,
}

/// Local top-k: per row the K best of the first lens[row] scores by (score descending, index
/// ascending; NaN as −inf), as ascending indices, −1 padded.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_topk_local(args: *const DcpMlaTopkLocalArgs) -> DcpMlaStatus {
    launch(args, topk::local_topk, |a| {
        let (scores, row_stride) = with_row_stride(a.scores, "scores", a.cols)?;
        let t =
            LocalTopk { scores, row_stride, cols: a.cols, lens: arg!(a.lens), rows: a.rows, k: a.k, out: arg!(a.out) };
        if !topk::local_topk_compiled(a.k) {
            return Err(fail(
                DcpMlaStatus::Unsupported,
                format!("local top-k for K = {} is not compiled (K in 256, 512, 1024, 2048)", a.k),
            ));
        }
        Ok(t)
    })
}

/// The arguments of dcp_mla_launch_topk_pack.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaTopkPackArgs {
    /// sizeof(DcpMlaTopkPackArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// int32 [rows, k], this rank's local top-k.
    pub local_idx: DcpMlaTensor,
    /// f32 [rows, …], `cols` columns used; 1 stride as topk_local's, default `cols`.
    pub scores: DcpMlaTensor,
    /// f32 [rows, k], written (usually this rank's slot of the [D, rows, k] buffers the
    /// all-gather fills).
    pub cand_scores: DcpMlaTensor,
    /// int32 [rows, k], written.
    pub cand_ids: DcpMlaTensor,
    /// Columns used.
    pub cols: usize,
    /// Rows.
    pub rows: usize,
    /// K.
    pub k: usize,
    /// D.
    pub dcp_size: usize,
    /// I.
    pub interleave: usize,
    /// This rank.
    pub rank: usize,
}

/// Packs this rank's local top-k into candidates: (scores[row, l] bit for bit, global(l, rank))
/// per entry, (−inf, −1) for an unused one.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_topk_pack(args: *const DcpMlaTopkPackArgs) -> DcpMlaStatus {
    launch(args, topk::pack_candidates, |a| {
        let (scores, row_stride) = with_row_stride(a.scores, "scores", a.cols)?;
        Ok(PackCandidates {
            local_idx: arg!(a.local_idx),
            scores,
            row_stride,
            cols: a.cols,
            rows: a.rows,
            k: a.k,
            dcp: layout(a.dcp_size, a.interleave),
            rank: a.rank,
            cand_scores: arg!(a.cand_scores),
            cand_ids: arg!(a.cand_ids),
        })
    })
}

/// The arguments of dcp_mla_launch_topk_merge.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaTopkMergeArgs {
    /// sizeof(DcpMlaTopkMergeArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// f32 [D, rows, k], rank-major.
    pub cand_scores: DcpMlaTensor,
    /// int32 [D, rows, k], rank-major.
    pub cand_ids: DcpMlaTensor,
    /// int32 [rows, k], global ids, written.
    pub out: DcpMlaTensor,
    /// D.
    pub dcp_size: usize,
    /// Rows.
    pub rows: usize,
    /// K.
    pub k: usize,
}

/// Global merge (docs/contract.md §6): the exact top-K of the D·K all-gathered candidates per
/// row by (score descending, id ascending), in candidate order, −1 padded. D·K must be a
/// multiple of 512 (DCP_MLA_STATUS_INVALID_CONFIG otherwise, naming D and K).
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_topk_merge(args: *const DcpMlaTopkMergeArgs) -> DcpMlaStatus {
    launch(args, topk::global_merge, |a| {
        let m = GlobalMerge {
            cand_scores: arg!(a.cand_scores),
            cand_ids: arg!(a.cand_ids),
            dcp_size: a.dcp_size,
            rows: a.rows,
            k: a.k,
            out: arg!(a.out),
        };
        check_topk(a.dcp_size, a.k)?;
        if !topk::global_merge_compiled(a.dcp_size, a.k) {
            return Err(fail(
                DcpMlaStatus::Unsupported,
                format!("global top-k merge for D = {}, K = {} is not compiled (D in 1, 2, 4, 8)", a.dcp_size, a.k),
            ));
        }
        Ok(m)
    })
}

/// The arguments of dcp_mla_launch_topk_compact.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaTopkCompactArgs {
    /// sizeof(DcpMlaTopkCompactArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// int32 [rows, k], merged global ids.
    pub ids: DcpMlaTensor,
    /// Optional int32 [ceil(rows / rows_per_request), …] (absent: no translation); when given,
    /// 1 stride (elements between requests) is required.
    pub block_table: DcpMlaTensor,
    /// int32 [rows, k], written.
    pub out: DcpMlaTensor,
    /// int32 [rows], written.
    pub counts: DcpMlaTensor,
    /// Rows.
    pub rows: usize,
    /// K.
    pub k: usize,
    /// D.
    pub dcp_size: usize,
    /// I.
    pub interleave: usize,
    /// This rank.
    pub rank: usize,
    /// Tokens per page B (with `block_table`).
    pub block_size: usize,
    /// Row i belongs to request i / rows_per_request (with `block_table`).
    pub rows_per_request: usize,
}

/// Compaction for rank `rank` (docs/contract.md §6): keeps the ids this rank owns, as local
/// positions (or page·block_size + slot when `block_table` is given), compacted to the front,
/// −1 padded, with per-row counts.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_topk_compact(args: *const DcpMlaTopkCompactArgs) -> DcpMlaStatus {
    launch(args, topk::compact, |a| {
        let (block_table, stride): (Option<DeviceSlice<i32>>, _) = strided!(a.block_table, 1);
        let translate = match (block_table, stride) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(crate::bad_arg(
                    "block_table.num_strides",
                    "0: a translating compaction takes the table's row stride (1 stride)",
                ))
            }
            (Some(t), Some([stride])) => Some(PageTranslate {
                block_table: t,
                stride,
                block_size: a.block_size,
                rows_per_request: a.rows_per_request,
            }),
        };
        Ok(Compact {
            ids: arg!(a.ids),
            rows: a.rows,
            k: a.k,
            dcp: layout(a.dcp_size, a.interleave),
            rank: a.rank,
            translate,
            out: arg!(a.out),
            counts: arg!(a.counts),
        })
    })
}

/// The arguments of dcp_mla_launch_prefill_flatten (docs/contract.md §7).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaPrefillFlattenArgs {
    /// sizeof(DcpMlaPrefillFlattenArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// [num_pages, …, row] in `format`; 1 stride as for dcp_mla_launch_kv_fill.
    pub cache: DcpMlaTensor,
    /// int32 [batch, …], the first `max_pages` columns read; 1 stride, default `max_pages`.
    pub block_table: DcpMlaTensor,
    /// int32 [max_pieces, 8], the chunk's piece table (dcp_mla_prefill_piece_table).
    pub pieces: DcpMlaTensor,
    /// bf16 [cap_rows, 576], every row written.
    pub out: DcpMlaTensor,
    /// Pages of `cache`.
    pub num_pages: usize,
    /// Tokens per page B.
    pub block_size: usize,
    /// Rows of `block_table`.
    pub batch: usize,
    /// Columns of `block_table` read.
    pub max_pages: usize,
    /// Rows of `pieces`.
    pub max_pieces: usize,
    /// Rows of `out`.
    pub cap_rows: usize,
    /// D.
    pub dcp_size: usize,
    /// I.
    pub interleave: usize,
    /// This rank.
    pub rank: usize,
    /// The cache format (DCP_MLA_KV_*).
    pub format: i32,
    /// Padding: must be 0.
    pub _reserved: u32,
}

/// Prefill prefix flatten: writes this rank's rows of one chunk into its uniform bf16 buffer
/// (FP8-656 dequantised), zeros elsewhere; the chunk's layout is read from the device-side
/// piece table.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_prefill_flatten(args: *const DcpMlaPrefillFlattenArgs) -> DcpMlaStatus {
    launch(args, prefill::flatten, |a| {
        let format: KvFormat = arg!(a.format);
        reserved("_reserved", a._reserved)?;
        Ok(Flatten {
            cache: paged_cache(&a.cache, format, a.num_pages, a.block_size)?,
            format,
            block_table: block_table(a.block_table, a.max_pages)?,
            batch: a.batch,
            pieces: arg!(a.pieces),
            max_pieces: a.max_pieces,
            out: arg!(a.out),
            cap_rows: a.cap_rows,
            dcp: layout(a.dcp_size, a.interleave),
            rank: a.rank,
        })
    })
}

/// The arguments of dcp_mla_launch_prefill_reorder.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaPrefillReorderArgs {
    /// sizeof(DcpMlaPrefillReorderArgs) as the caller was compiled.
    pub struct_size: usize,
    /// An open handle.
    pub device: *const DcpMlaDevice,
    /// The stream (null: the legacy default stream).
    pub stream: *mut c_void,
    /// bf16 [D, cap_rows, 576], the all-gathered flatten buffers.
    pub gathered: DcpMlaTensor,
    /// int32 [max_pieces, 8] (the flatten's table).
    pub pieces: DcpMlaTensor,
    /// bf16 [out_rows, 576]; rows of other chunks are left as they are.
    pub out: DcpMlaTensor,
    /// Rows per rank of `gathered`.
    pub cap_rows: usize,
    /// Rows of `pieces`.
    pub max_pieces: usize,
    /// Rows of `out`.
    pub out_rows: usize,
    /// D.
    pub dcp_size: usize,
    /// I.
    pub interleave: usize,
}

/// Prefill reorder: writes every token of every piece from the all-gathered flatten buffers to
/// its global row.
///
/// # Safety
/// As for dcp_mla_launch_kv_fill.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_launch_prefill_reorder(args: *const DcpMlaPrefillReorderArgs) -> DcpMlaStatus {
    launch(args, prefill::reorder, |a| {
        Ok(Reorder {
            gathered: arg!(a.gathered),
            cap_rows: a.cap_rows,
            pieces: arg!(a.pieces),
            max_pieces: a.max_pieces,
            out: arg!(a.out),
            out_rows: a.out_rows,
            dcp: layout(a.dcp_size, a.interleave),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every struct appeared in revision 5: its first size is its size, and the smallest
    /// struct_size accepted. (A revision that appends fields keeps FIRST_SIZE and changes this.)
    #[test]
    fn first_sizes_are_the_revision_5_sizes() {
        fn check<T: ArgsStruct>() {
            assert_eq!(T::FIRST_SIZE, std::mem::size_of::<T>(), "{}", T::NAME);
        }
        check::<DcpMlaKvFillArgs>();
        check::<DcpMlaDecodeDenseArgs>();
        check::<DcpMlaDecodeSparseArgs>();
        check::<DcpMlaDecodeModel1Args>();
        check::<DcpMlaKvFillModel1Args>();
        check::<DcpMlaAgRsCorrectArgs>();
        check::<DcpMlaAgRsFinishArgs>();
        check::<DcpMlaA2aPackArgs>();
        check::<DcpMlaA2aCombineArgs>();
        check::<DcpMlaMergeTwoArgs>();
        check::<DcpMlaTopkLocalArgs>();
        check::<DcpMlaTopkPackArgs>();
        check::<DcpMlaTopkMergeArgs>();
        check::<DcpMlaTopkCompactArgs>();
        check::<DcpMlaPrefillFlattenArgs>();
        check::<DcpMlaPrefillReorderArgs>();
    }

    fn t(addr: usize, numel: usize, dtype: i32) -> DcpMlaTensor {
        DcpMlaTensor { data: addr as *mut c_void, numel, dtype, ..Default::default() }
    }

    /// One change to a well-formed argument struct.
    type Edit<A> = Box<dyn Fn(&mut A)>;

    fn with_stride(mut x: DcpMlaTensor, s: usize) -> DcpMlaTensor {
        x.num_strides = 1;
        x.strides[0] = s;
        x
    }

    const BF16: i32 = crate::DCP_MLA_DTYPE_BF16;
    const I32: i32 = crate::DCP_MLA_DTYPE_I32;
    const F32: i32 = crate::DCP_MLA_DTYPE_F32;
    const U8: i32 = crate::DCP_MLA_DTYPE_U8;

    /// A MODEL1 decode of 2 requests, 1 query row, 64 heads over a cache of 8 pages of 64 tokens
    /// (37,440 bytes a page) and, with `extra`, a second of 3 pages of 2 tokens (1,728 bytes a
    /// page) in a padded page dimension of 2,304 bytes: fake buffers, never dereferenced.
    fn model1_args(extra: bool) -> DcpMlaDecodeModel1Args {
        let rows = 2 * 64;
        let mut a = DcpMlaDecodeModel1Args {
            q: t(0x1000_0000, rows * 512, BF16),
            out: t(0x2000_0000, rows * 512, BF16),
            lse: t(0x3000_0000, rows, F32),
            cache: t(0x4000_0000, 8 * 37_440, U8),
            indices: t(0x5000_0000, 2 * 128, I32),
            topk_len: with_stride(t(0x5100_0000, 2, I32), 1),
            batch: 2,
            num_q: 1,
            heads: 64,
            num_splits: 1,
            num_pages: 8,
            block_size: 64,
            topk: 128,
            ..Default::default()
        };
        // FlashMLA's per-request topk_length [b]: strides {1, 0}
        a.topk_len.num_strides = 2;
        if extra {
            a.extra_cache = with_stride(t(0x6000_0000, 2 * 2_304 + 1_728, U8), 2_304);
            a.extra_indices = t(0x7000_0000, 2 * 64, I32);
            a.extra_num_pages = 3;
            a.extra_block_size = 2;
            a.extra_topk = 64;
        }
        a
    }

    /// The message of a MODEL1 decode's first error: the conversion's, else the launcher's checks'.
    fn model1_error(a: &DcpMlaDecodeModel1Args) -> Option<String> {
        match model1_decode(a) {
            Err(e) => Some(e.message),
            Ok(d) => model1::decode_checks(&d).err().map(|e| crate::FfiError::from(e).message),
        }
    }

    #[test]
    fn model1_decode_converts_and_passes_the_launchers_checks() {
        for extra in [false, true] {
            let a = model1_args(extra);
            assert_eq!(model1_error(&a), None, "extra {extra}");
            let d = model1_decode(&a).unwrap();
            assert_eq!(d.extra.is_some(), extra);
            // scale 0 (the field's default) is MODEL1's 512^-1/2, not the 576 path's
            assert_eq!(d.common.scale, model1::model1_default_scale());
            assert_eq!(d.main.pages.page_stride, 37_440, "packed pages by default: ceil(584·64 / 576)·576");
            assert_eq!(d.main.lists.topk_len_strides, Some([1, 0]));
            if extra {
                assert_eq!(d.extra.unwrap().pages.page_stride, 2_304, "the stride in bytes");
            }
        }
        let a = DcpMlaDecodeModel1Args { scale: 0.25, ..model1_args(false) };
        assert_eq!(model1_decode(&a).unwrap().common.scale, 0.25);
        // a stride in elements of a wider dtype is counted in bytes: 576 int32 elements = 2,304 bytes
        let mut a = model1_args(true);
        a.extra_cache = with_stride(t(0x6000_0000, (2 * 2_304 + 1_728) / 4, I32), 576);
        assert_eq!(model1_decode(&a).unwrap().extra.unwrap().pages.page_stride, 2_304);
    }

    #[test]
    fn model1_decode_errors_name_the_c_fields() {
        let cases: Vec<(&str, Edit<DcpMlaDecodeModel1Args>)> = vec![
            ("`_reserved`", Box::new(|a| a._reserved = 1)),
            ("`extra_indices`", Box::new(|a| a.extra_indices = t(0x7000_0000, 128, I32))),
            ("`extra_topk_len`", Box::new(|a| a.extra_topk_len = t(0x7000_0000, 2, I32))),
            ("`extra_num_pages`", Box::new(|a| a.extra_num_pages = 3)),
            ("`extra_block_size`", Box::new(|a| a.extra_block_size = 2)),
            ("`extra_topk`", Box::new(|a| a.extra_topk = 64)),
            ("`extra_cache.num_strides`", Box::new(|a| a.extra_cache.num_strides = 1)),
            ("`cache.num_strides`", Box::new(|a| a.cache.num_strides = 2)),
            ("`indices.num_strides`", Box::new(|a| a.indices.num_strides = 1)),
            ("`scale`", Box::new(|a| a.scale = -1.0)),
            ("`q`", Box::new(|a| a.q.numel -= 1)),
            ("`cache.strides`", Box::new(|a| a.cache = with_stride(a.cache, 37_440 + 8))),
            ("`cache.strides`", Box::new(|a| a.cache = with_stride(a.cache, 36_864))),
            ("`cache`", Box::new(|a| a.cache.numel -= 1)),
            ("`block_size`", Box::new(|a| a.block_size = 0)),
            ("`block_size`", Box::new(|a| a.block_size = usize::MAX / 2)),
            ("`topk_len`", Box::new(|a| a.topk_len = t(0x5100_0000, 1, I32))),
        ];
        for (needle, edit) in cases {
            let mut a = model1_args(false);
            edit(&mut a);
            let e = model1_error(&a).unwrap_or_else(|| panic!("{needle}: accepted"));
            assert!(e.contains(needle), "{needle}: {e}");
        }
        let extra_cases: Vec<(&str, Edit<DcpMlaDecodeModel1Args>)> = vec![
            ("`extra_indices`", Box::new(|a| a.extra_indices = DcpMlaTensor::default())),
            ("`extra_indices`", Box::new(|a| a.extra_indices.dtype = F32)),
            ("`extra_indices`", Box::new(|a| a.extra_indices.numel -= 1)),
            ("`extra_topk_len`", Box::new(|a| a.extra_topk_len = t(0x7100_0002, 2, I32))),
            ("`extra_topk_len.num_strides`", Box::new(|a| a.extra_topk_len = with_stride(t(0x7100_0000, 2, I32), 1))),
            (
                "`extra_topk_len.strides`",
                Box::new(|a| {
                    a.extra_topk_len = t(0x7100_0000, 2, I32);
                    a.extra_topk_len.num_strides = 2;
                    a.extra_topk_len.strides[0] = 1 << 63;
                }),
            ),
            ("`extra_cache.strides`", Box::new(|a| a.extra_cache.strides[0] = 2_000)),
            ("`extra_cache.strides`", Box::new(|a| a.extra_cache.strides[0] = 1_152)),
            ("`extra_cache`", Box::new(|a| a.extra_cache.numel -= 1)),
            ("`extra_cache`", Box::new(|a| a.extra_cache.data = 0x6000_0008 as *mut c_void)),
            ("`extra_block_size`", Box::new(|a| a.extra_block_size = 0)),
            ("`extra_num_pages`", Box::new(|a| a.extra_num_pages = usize::MAX / 4)),
            ("`extra_topk`", Box::new(|a| a.extra_topk = 0)),
        ];
        for (needle, edit) in extra_cases {
            let mut a = model1_args(true);
            edit(&mut a);
            let e = model1_error(&a).unwrap_or_else(|| panic!("{needle}: accepted"));
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    fn model1_fill_args() -> DcpMlaKvFillModel1Args {
        DcpMlaKvFillModel1Args {
            ckv: t(0x1000_0000, 4 * 448, BF16),
            kpe: t(0x2000_0000, 4 * 64, BF16),
            req_idx: t(0x3000_0000, 4, I32),
            positions: t(0x3100_0000, 4, I32),
            block_table: t(0x3200_0000, 8, I32),
            cache: t(0x4000_0000, 8 * 37_440, U8),
            batch: 1,
            max_pages: 8,
            num_pages: 8,
            block_size: 64,
            dcp_size: 2,
            interleave: 1,
            rank: 1,
            ..Default::default()
        }
    }

    #[test]
    fn model1_fill_converts_and_its_errors_name_the_c_fields() {
        let f = model1_fill(&model1_fill_args()).unwrap();
        assert_eq!((f.tokens.ckv_stride, f.tokens.kpe_stride, f.block_table.stride), (448, 64, 8), "the defaults");
        assert_eq!(f.pages.page_stride, 37_440);
        assert!(model1::fill_checks(&f).is_ok());
        let cases: Vec<(&str, Edit<DcpMlaKvFillModel1Args>)> = vec![
            ("`ckv`", Box::new(|a| a.ckv.data = std::ptr::null_mut())),
            ("`ckv`", Box::new(|a| a.ckv.numel -= 1)),
            ("`ckv`", Box::new(|a| a.ckv = with_stride(a.ckv, 440))),
            ("`kpe.num_strides`", Box::new(|a| a.kpe.num_strides = 2)),
            ("`positions`", Box::new(|a| a.positions.dtype = F32)),
            ("`req_idx`", Box::new(|a| a.req_idx.numel = 3)),
            ("`cache.strides`", Box::new(|a| a.cache = with_stride(a.cache, 37_440 + 576 / 2))),
            ("`cache`", Box::new(|a| a.cache.numel -= 1)),
            ("`interleave`", Box::new(|a| a.interleave = 3)),
            ("`rank`", Box::new(|a| a.rank = 2)),
            ("`block_table`", Box::new(|a| a.block_table.numel = 7)),
        ];
        for (needle, edit) in cases {
            let mut a = model1_fill_args();
            edit(&mut a);
            let e = match model1_fill(&a) {
                Err(e) => e.message,
                Ok(f) => model1::fill_checks(&f)
                    .err()
                    .map(|e| crate::FfiError::from(e).message)
                    .unwrap_or_else(|| panic!("{needle}: accepted")),
            };
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }
}
