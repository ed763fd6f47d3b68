//! MODEL1 on the GPU (docs/contract.md §3-§4, "MODEL1"; FlashMLA's `d_qk = 512` sparse path):
//! the sparse decode over the page-wise FP8 cache of [`crate::formats::model1`], one or two
//! sources in one softmax, and the cache's fill. References: [`crate::reference::model1`].
//!
//! Kernels: `kernels-src/decode/model1.cuh` (family `mla_decode_model1`, mma.sync: sm_80 and
//! sm_90), and on compute capability 9.0 `kernels-src/decode/sm90_trio.cuh`'s lead schedule over
//! MODEL1's cache (family `mla_decode_model1_sm90_lead`, wgmma, `wgmma-lead-64x2`), the default on
//! 9.0 ([`crate::catalogue::model1_heuristic_path`]; `DCP_MLA_DECODE_PATH` or
//! [`mla_decode_model1_on`] name either); split launches through the decode's
//! own schedule and combine ([`crate::ops::decode`]); `kernels-src/fill.cuh` (`kv_fill_model1`).

use super::decode::{launch, validate_common, DecodeCommon, IndexLists, Kernel, ListNames, LISTS, MAX_DECODE_TOKENS};
use super::fill::NewTokens;
use super::{compiled, launch_warp_rows, to_i32, BlockTable};
use crate::abi::{DcpKvFillParams, DcpMlaDecodeParams};
use crate::catalogue::{env_path, model1_heuristic_path, model1_ships, variant_name, DecodePath};
use crate::error::Result;
use crate::formats::model1::{
    model1_page_bytes, Model1Pages, MODEL1_D_NOPE, MODEL1_D_QK, MODEL1_PAGE_ALIGN, MODEL1_TOKEN_BYTES,
};
use crate::planner::DcpLayout;
use crate::runtime::registry;
use crate::runtime::{Device, DeviceSlice, Stream};

pub use crate::reference::model1::model1_default_scale;

/// One source of a MODEL1 decode on the device: a page-wise FP8 cache and the index lists that
/// pick from it.
#[derive(Debug, Clone, Copy)]
pub struct Model1Source {
    /// The cache tensor's bytes (FlashMLA's `k_cache` / `extra_k_cache`), 16-byte aligned, at
    /// least `pages.cache_bytes()` of them.
    pub cache: DeviceSlice<u8>,
    /// Pages, block size B and the page stride in bytes (a multiple of 576, at least
    /// [`model1_page_bytes`]`(B)`).
    pub pages: Model1Pages,
    /// int32 [batch, nq, topk] addresses page·B + slot (an address outside [0, num_pages·B) is
    /// unused and never read) and their counts (FlashMLA's per-request `topk_length` is \[batch\]
    /// with strides \[1, 0\]).
    pub lists: IndexLists,
}

/// A MODEL1 sparse decode: `common.q` is bf16 [batch, nq, heads, 512] (its strides in
/// `common.q_strides`), `common.scale` σ. Out [batch, nq, heads, 512] and lse as every decode's,
/// sinks and splits included.
///
/// Build one with [`Model1Decode::new`], which sets MODEL1's default scale
/// ([`model1_default_scale`], 512^-½, FlashMLA's `d_qk^-½`); a `common` from
/// [`DecodeCommon::new`] carries the 576 path's 576^-½ instead.
#[derive(Debug, Clone, Copy)]
pub struct Model1Decode {
    pub common: DecodeCommon,
    /// The first source (FlashMLA's `k_cache`, `indices`, `topk_length`).
    pub main: Model1Source,
    /// The second (`extra_k_cache`, `extra_indices_in_kvcache`, `extra_topk_length`): its
    /// entries follow the first list's in the same softmax.
    pub extra: Option<Model1Source>,
}

impl Model1Decode {
    /// A decode of `main` alone: `common` as [`DecodeCommon::new`] builds it, its scale replaced
    /// by MODEL1's default ([`model1_default_scale`]); the rest goes in by struct update,
    /// `Model1Decode { extra: Some(e), ..Model1Decode::new(..) }`, or through `common` (a scale
    /// of the caller's own included).
    pub fn new(common: DecodeCommon, main: Model1Source) -> Self {
        Model1Decode { common: DecodeCommon { scale: model1_default_scale(), ..common }, main, extra: None }
    }
}

/// The argument names of a source's fields, as the C ABI spells them.
struct Names {
    cache: &'static str,
    block_size: &'static str,
    num_pages: &'static str,
    page_stride: &'static str,
    lists: ListNames,
}

const MAIN: Names = Names {
    cache: "cache",
    block_size: "block_size",
    num_pages: "num_pages",
    page_stride: "page_stride",
    lists: LISTS,
};

const EXTRA: Names = Names {
    cache: "extra_cache",
    block_size: "extra_block_size",
    num_pages: "extra_num_pages",
    page_stride: "extra_page_stride",
    lists: ListNames {
        indices: "extra_indices",
        indices_strides: "extra_indices_strides",
        topk: "extra_topk",
        topk_len: "extra_topk_len",
        topk_len_strides: "extra_topk_len_strides",
    },
};

/// A MODEL1 cache's pages against its buffer: returns page_rows, the page stride in 576-byte
/// units (what the kernels take).
fn check_model1_cache(cache: &DeviceSlice<u8>, pages: &Model1Pages, n: &Names) -> Result<i32> {
    let Model1Pages { num_pages, block_size, page_stride } = *pages;
    ensure_arg!(block_size >= 1, n.block_size, "must be at least 1");
    // model1_page_bytes(B), checked: 584·B rounded up to a multiple of 576
    let min = block_size
        .checked_mul(MODEL1_TOKEN_BYTES)
        .and_then(|b| b.div_ceil(MODEL1_PAGE_ALIGN).checked_mul(MODEL1_PAGE_ALIGN));
    debug_assert!(min.is_none_or(|m| m == model1_page_bytes(block_size)));
    ensure_arg!(min.is_some(), n.block_size, "{block_size} tokens a page overflow the page size");
    let min = min.unwrap_or(0);
    ensure_arg!(
        page_stride >= min && page_stride % MODEL1_PAGE_ALIGN == 0,
        n.page_stride,
        "{page_stride} bytes is not a multiple of {MODEL1_PAGE_ALIGN} of at least {min} (the page of {block_size} tokens)"
    );
    ensure_arg!(
        num_pages.checked_mul(block_size).is_some_and(|s| s <= i32::MAX as usize),
        n.num_pages,
        "{num_pages} pages of {block_size} tokens exceed the int32 addresses page·B + slot"
    );
    let need = (num_pages.max(1) - 1).checked_mul(page_stride).and_then(|x| x.checked_add(min));
    let need = if num_pages == 0 { Some(0) } else { need };
    ensure_arg!(
        need.is_some_and(|b| cache.len() >= b),
        n.cache,
        "holds {} bytes but {num_pages} pages of {block_size} MODEL1 tokens, {page_stride} bytes apart, need {need:?}",
        cache.len()
    );
    ensure_aligned!(cache.ptr() % 16 == 0, n.cache, "pointer {:#x} is not 16-byte aligned", cache.ptr());
    to_i32(n.page_stride, page_stride / MODEL1_PAGE_ALIGN)
}

/// One source's checks; sets its fields of `params` (the first source's in the fields the 576
/// path's sparse decode uses, the second's in `extra_*`).
fn source_params(
    s: &Model1Source,
    c: &DecodeCommon,
    n: &Names,
    params: &mut DcpMlaDecodeParams,
    extra: bool,
) -> Result<()> {
    let page_rows = check_model1_cache(&s.cache, &s.pages, n)?;
    let lists = s.lists.check(c, &n.lists)?;
    // an index page·B + slot splits by a multiply and a shift in the kernel
    let (magic, shift) = super::decode::invariant_divisor(s.pages.block_size);
    let (num_pages, block_size) = (to_i32(n.num_pages, s.pages.num_pages)?, to_i32(n.block_size, s.pages.block_size)?);
    if extra {
        params.extra_cache = s.cache.ptr();
        (params.extra_indices, params.extra_topk_len, params.extra_topk) = (lists.indices, lists.topk_len, lists.topk);
        [params.extra_indices_stride_b, params.extra_indices_stride_s] = lists.indices_strides;
        [params.extra_len_stride_b, params.extra_len_stride_s] = lists.len_strides;
        (params.extra_num_pages, params.extra_block_size) = (num_pages, block_size);
        (params.extra_page_rows, params.extra_page_div_magic, params.extra_page_div_shift) = (page_rows, magic, shift);
    } else {
        params.cache = s.cache.ptr();
        lists.write(params);
        (params.num_pages, params.block_size) = (num_pages, block_size);
        (params.page_rows, params.page_div_magic, params.page_div_shift) = (page_rows, magic, shift);
    }
    Ok(())
}

/// Every check of a MODEL1 launch, and its kernel parameters.
fn decode_params(a: &Model1Decode) -> Result<DcpMlaDecodeParams> {
    let c = &a.common;
    let mut params = validate_common(c, true, MODEL1_D_QK)?;
    source_params(&a.main, c, &MAIN, &mut params, false)?;
    if let Some(e) = &a.extra {
        source_params(e, c, &EXTRA, &mut params, true)?;
        ensure_arg!(
            a.main.lists.topk + e.lists.topk <= MAX_DECODE_TOKENS,
            "extra_topk",
            "{} and {} entries together exceed the kernels' int32 token counts",
            a.main.lists.topk,
            e.lists.topk
        );
    }
    Ok(params)
}

/// The MODEL1 kernel a launch on a device of compute capability 9.0 (`sm90`) or not runs for
/// `path`: a named path as it is (a variant MODEL1 does not ship, or wgmma off 9.0, is refused
/// when the kernel is looked up); `Auto` as `DCP_MLA_DECODE_PATH` names it (a variant of another
/// kind, which MODEL1 does not ship, falls back to the heuristic), else the heuristic
/// ([`model1_heuristic_path`]: wgmma lead on 9.0, mma.sync elsewhere).
pub fn model1_path(sm90: bool, path: DecodePath) -> Result<DecodePath> {
    match path {
        DecodePath::Auto => match env_path()? {
            Some(p) if model1_ships(p) => Ok(p),
            _ => model1_heuristic_path(sm90).ok_or_else(|| crate::Error::Unsupported("mla_decode_model1".into())),
        },
        p => Ok(p),
    }
}

/// The kernel of `path` (never `Auto`: [`model1_path`] resolves it) on a device of compute
/// capability 9.0 (`sm90`) or not, and its KV tile (what the split schedule counts);
/// `Error::Unsupported` where it cannot run (wgmma off 9.0, or a variant MODEL1 does not ship).
fn model1_kernel(sm90: bool, path: DecodePath) -> Result<Kernel> {
    let d = MODEL1_D_QK as u32;
    let found = match path {
        DecodePath::Mma => registry::MLA_DECODE_MODEL1_VARIANTS
            .iter()
            .find(|((d_qk, _), _)| *d_qk == d)
            .and_then(|&((d_qk, tile), _)| Some((registry::mla_decode_model1(d_qk, tile)?, tile))),
        DecodePath::Wgmma { tile, stages, schedule } if sm90 => {
            registry::mla_decode_model1_sm90_lead(d, tile, stages, schedule).map(|id| (id, tile))
        }
        DecodePath::Wgmma { .. } | DecodePath::Auto => None,
    };
    let (id, tile) =
        found.ok_or_else(|| crate::Error::Unsupported(format!("mla_decode_model1 on {}", variant_name(path))))?;
    Ok(Kernel { id, shared_bytes: id.info().dynamic_shared_bytes as usize, tile, takes_tensor_map: false })
}

/// MODEL1 sparse decode (docs/contract.md §4, "MODEL1"): row (i, j) attends to the valid entries
/// of its first list, then those of its second, in one softmax (natural-log lse, sinks, empty and
/// NaN rows as every decode). Validates every argument, allocates nothing, never synchronises;
/// `common.num_splits > 1` splits the lists' tokens over parts as the 576 path's sparse decode
/// does ([`crate::ops::decode::decode_workspace_bytes`] with `sparse`).
pub fn mla_decode_model1(dev: &Device, stream: Stream, a: &Model1Decode) -> Result<()> {
    mla_decode_model1_on(dev, stream, a, DecodePath::Auto)
}

/// [`mla_decode_model1`] on the kernel `path` names: [`DecodePath::Mma`] (the mma.sync kernel,
/// any supported device), `Wgmma` naming one of [`crate::catalogue::model1_sm90_variants`]
/// (compute capability 9.0 only; else `Error::Unsupported`), or `Auto` (the launcher's choice,
/// [`model1_path`]). The outputs meet the same tolerance on every kernel (docs/contract.md §9).
pub fn mla_decode_model1_on(dev: &Device, stream: Stream, a: &Model1Decode, path: DecodePath) -> Result<()> {
    let mut params = decode_params(a)?;
    let sm90 = dev.compute_capability() == (9, 0);
    let kernel = model1_kernel(sm90, model1_path(sm90, path)?)?;
    launch(dev, stream, &kernel, &a.common, &mut params, true)
}

/// Every check [`mla_decode_model1`] runs before it launches, without a device (the C ABI's
/// tests name its fields through it; not an API).
#[doc(hidden)]
pub fn decode_checks(a: &Model1Decode) -> Result<()> {
    decode_params(a).map(|_| ())
}

/// Arguments of [`kv_fill_model1`]: the new tokens, where they go, and this rank's MODEL1 cache.
#[derive(Debug, Clone, Copy)]
pub struct Model1Fill {
    /// The 448 quantised ("nope") values in the first 448 of each `ckv` row and the 64 rope
    /// values of each `kpe` row, each token's request and position.
    pub tokens: NewTokens,
    /// `batch` rows: token i's page is row req_idx\[i\]'s entry for its logical page.
    pub block_table: BlockTable,
    pub batch: usize,
    /// This rank's MODEL1 cache, `pages` of it (page stride in bytes, a multiple of 576).
    pub cache: DeviceSlice<u8>,
    pub pages: Model1Pages,
    pub dcp: DcpLayout,
    pub rank: usize,
}

/// Writes each new token into this rank's MODEL1 cache if this rank owns it (docs/contract.md
/// §3): its value row and scale slot, bit-identical to
/// [`crate::reference::model1::fill_model1`]; nothing else of the cache, page padding included.
/// A token whose position is negative, whose request index is outside `0..batch`, or whose page
/// is beyond `max_pages` or maps outside `0..num_pages` is skipped.
pub fn kv_fill_model1(dev: &Device, stream: Stream, a: &Model1Fill) -> Result<()> {
    let params = fill_params(a)?;
    let id = compiled(registry::kv_fill_model1(), || "kv_fill_model1".into())?;
    // SAFETY: fill_params checked every buffer against the extents the kernel addresses.
    unsafe { launch_warp_rows(dev, stream, id, params.num_tokens as usize, "positions", &params) }
}

/// Every check [`kv_fill_model1`] runs before it launches, without a device (as
/// [`decode_checks`]; not an API).
#[doc(hidden)]
pub fn fill_checks(a: &Model1Fill) -> Result<()> {
    fill_params(a).map(|_| ())
}

fn fill_params(a: &Model1Fill) -> Result<DcpKvFillParams> {
    super::fill::fill_params!(
        a,
        MODEL1_D_NOPE,
        a.cache,
        a.pages.num_pages,
        a.pages.block_size,
        check_model1_cache(&a.cache, &a.pages, &MAIN)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::decode::DecodeOut;
    use crate::ops::test_util::{arg_of, fake, tokens};

    fn source(batch: usize, nq: usize, topk: usize, pages: Model1Pages) -> Model1Source {
        Model1Source {
            cache: fake(pages.cache_bytes()),
            pages,
            lists: IndexLists {
                topk_len: Some(fake(batch)),
                topk_len_strides: Some([1, 0]),
                ..IndexLists::new(fake(batch * nq * topk), topk)
            },
        }
    }

    fn decode(extra: bool) -> Model1Decode {
        let (batch, nq, heads) = (2, 1, 64);
        let rows = batch * nq * heads;
        Model1Decode {
            extra: extra.then(|| source(batch, nq, 64, Model1Pages::new(3, 2))),
            ..Model1Decode::new(
                DecodeCommon::new(
                    fake(rows * 512),
                    batch,
                    nq,
                    heads,
                    DecodeOut::Bf16(fake(rows * 512)),
                    fake(rows),
                    1,
                    fake(0),
                ),
                source(batch, nq, 128, Model1Pages::new(8, 64)),
            )
        }
    }

    #[test]
    fn the_kernel_follows_the_path_and_the_device() {
        let lead = DecodePath::Wgmma { tile: 64, stages: 2, schedule: crate::catalogue::Sm90Schedule::Lead };
        // (DCP_MLA_DECODE_PATH is unset in the test suite: Auto is the heuristic)
        if std::env::var_os("DCP_MLA_DECODE_PATH").is_none() {
            assert_eq!(model1_path(true, DecodePath::Auto).unwrap(), lead);
            assert_eq!(model1_path(false, DecodePath::Auto).unwrap(), DecodePath::Mma);
        }
        assert_eq!(model1_path(false, lead).unwrap(), lead, "a named path is kept (the kernel refuses it)");
        let k = model1_kernel(true, lead).unwrap();
        assert_eq!((k.tile, k.id.info().block), (64, 384));
        assert!(k.shared_bytes <= 227 * 1024, "{}", k.shared_bytes);
        let k = model1_kernel(true, DecodePath::Mma).unwrap();
        assert_eq!((k.tile, k.id.info().block), (32, 256));
        assert!(model1_kernel(false, DecodePath::Mma).is_ok());
        assert!(matches!(model1_kernel(false, lead), Err(crate::Error::Unsupported(_))), "wgmma off sm_90");
        assert_eq!(model1_path(true, lead).unwrap(), lead);
        let trio = DecodePath::Wgmma { tile: 64, stages: 2, schedule: crate::catalogue::Sm90Schedule::Trio };
        assert!(matches!(model1_kernel(true, trio), Err(crate::Error::Unsupported(_))), "not a MODEL1 variant");
    }

    #[test]
    fn the_default_scale_is_model1s() {
        let a = decode(false);
        assert_eq!(a.common.scale, model1_default_scale());
        assert_eq!(a.common.scale, 512f32.powf(-0.5));
        let p = decode_params(&a).unwrap();
        assert_eq!(p.scale_log2, model1_default_scale() * std::f32::consts::LOG2_E);
    }

    #[test]
    fn decode_errors_name_the_fields() {
        assert!(decode_params(&decode(false)).is_ok());
        let p = decode_params(&decode(true)).unwrap();
        // page strides in 576-byte units: 64 tokens → 65 units; 2 tokens → 3
        assert_eq!((p.page_rows, p.extra_page_rows, p.extra_topk, p.extra_block_size), (65, 3, 64, 2));
        assert_eq!((p.len_stride_b, p.len_stride_s), (1, 0));
        // q is 512 values a row: a 576-value q buffer's worth is not needed, a shorter one fails
        let mut a = decode(true);
        a.common.q = fake(2 * 64 * 512 - 1);
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "q");
        let mut a = decode(true);
        a.extra.as_mut().unwrap().pages.page_stride = 1_000;
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "extra_page_stride");
        let mut a = decode(true);
        a.main.pages.page_stride = 65 * 576 - 576;
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "page_stride");
        let mut a = decode(true);
        a.extra.as_mut().unwrap().cache = fake(3 * 1_728 - 1);
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "extra_cache");
        let mut a = decode(true);
        a.extra.as_mut().unwrap().lists.topk = 0;
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "extra_topk");
        let mut a = decode(true);
        a.extra.as_mut().unwrap().lists.indices = fake(2 * 64 - 1);
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "extra_indices");
        let mut a = decode(true);
        a.extra.as_mut().unwrap().lists.topk_len = Some(fake(1));
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "extra_topk_len");
        let mut a = decode(false);
        a.main.lists.topk_len = Some(fake(1));
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "topk_len");
        let mut a = decode(false);
        a.main.pages.block_size = 0;
        assert_eq!(arg_of(decode_params(&a).unwrap_err()), "block_size");
        // with batch = 0 no row count bounds them: each is refused past int32 on its own
        type Setter = fn(&mut Model1Decode);
        let heads: Setter = |a| a.common.heads = (1 << 32) + 1;
        let nq: Setter = |a| a.common.nq = 1 << 31;
        for (field, set) in [("heads", heads), ("nq", nq)] {
            let mut a = decode(false);
            a.common.batch = 0;
            set(&mut a);
            assert_eq!(arg_of(decode_params(&a).unwrap_err()), field);
        }
    }

    fn fill() -> Model1Fill {
        let pages = Model1Pages::new(8, 64);
        Model1Fill {
            tokens: tokens(448),
            block_table: BlockTable::packed(fake(8), 8),
            batch: 1,
            cache: fake(pages.cache_bytes()),
            pages,
            dcp: DcpLayout { size: 2, interleave: 1 },
            rank: 1,
        }
    }

    #[test]
    fn fill_errors_name_the_fields() {
        let p = fill_params(&fill()).unwrap();
        assert_eq!((p.page_rows, p.block_size, p.dcp_rank), (65, 64, 1));
        let mut a = fill();
        a.tokens.ckv_stride = 440;
        assert_eq!(arg_of(fill_params(&a).unwrap_err()), "ckv");
        let mut a = fill();
        a.cache = fake(a.pages.cache_bytes() - 1);
        assert_eq!(arg_of(fill_params(&a).unwrap_err()), "cache");
        let mut a = fill();
        a.dcp.interleave = 3;
        assert_eq!(arg_of(fill_params(&a).unwrap_err()), "interleave");
        let mut a = fill();
        a.pages.page_stride += 1;
        assert_eq!(arg_of(fill_params(&a).unwrap_err()), "page_stride");
    }
}
