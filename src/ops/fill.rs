//! KV-cache fill launcher (docs/contract.md §2-3). Reference: [`crate::reference::fill`].

use super::{compiled, launch_warp_rows, BlockTable, CacheView};
use crate::abi::DcpKvFillParams;
use crate::error::Result;
use crate::formats::{KvFormat, D_LATENT, D_ROPE};
use crate::planner::DcpLayout;
use crate::runtime::registry;
use crate::runtime::{Device, DeviceSlice, Stream};
use half::bf16;

/// The new tokens of a fill ([`kv_fill`], [`crate::ops::model1::kv_fill_model1`]): their values
/// and where each goes, in device memory as the kernels read them (the device side of
/// [`crate::reference::fill::FillInput`]).
#[derive(Debug, Clone, Copy)]
pub struct NewTokens {
    /// bf16 [num_tokens, ckv_stride]: the latent values in the first of each row (c_kv's 512 for
    /// [`kv_fill`], MODEL1's 448 quantised "nope" values for its fill; a stride of 16-byte
    /// multiples).
    pub ckv: DeviceSlice<bf16>,
    pub ckv_stride: usize,
    /// bf16 [num_tokens, kpe_stride]: k_pe, the 64 rope values, in the first 64 of each row.
    pub kpe: DeviceSlice<bf16>,
    pub kpe_stride: usize,
    /// int32 \[num_tokens\]: block-table row of each token.
    pub req_idx: DeviceSlice<i32>,
    /// int32 \[num_tokens\]: global position of each token; negative skips it (padding).
    pub positions: DeviceSlice<i32>,
}

impl NewTokens {
    /// [`kv_fill`]'s tokens in contiguous rows: c_kv [num_tokens, 512] and k_pe [num_tokens, 64].
    pub fn packed(
        ckv: DeviceSlice<bf16>,
        kpe: DeviceSlice<bf16>,
        req_idx: DeviceSlice<i32>,
        positions: DeviceSlice<i32>,
    ) -> Self {
        NewTokens { ckv, ckv_stride: D_LATENT, kpe, kpe_stride: D_ROPE, req_idx, positions }
    }
}

/// Arguments of [`kv_fill`]: the new tokens, where they go, and this rank's cache.
#[derive(Debug, Clone, Copy)]
pub struct KvFill {
    /// c_kv (512 values a row) and k_pe, each token's request and position.
    pub tokens: NewTokens,
    /// `batch` rows: token i's page is row req_idx\[i\]'s entry for its logical page.
    pub block_table: BlockTable,
    pub batch: usize,
    /// This rank's cache, its rows `format.token_bytes()` bytes.
    pub cache: CacheView,
    pub format: KvFormat,
    pub dcp: DcpLayout,
    pub rank: usize,
}

/// Up to this many tokens [`kv_fill`] runs the kernel that loads each token's values before its
/// owner and page (its bytes in flight during those two dependent loads): it takes 38 registers,
/// 6 CTAs of 256 an SM, so one wave holds 6,336 tokens on 132 SMs; above, the kernel capped at 8
/// CTAs an SM (one wave up to 8,448 tokens), which loads them after the owner is known.
pub const EARLY_FILL_MAX_TOKENS: usize = 4096;

/// Writes each new token's KV into this rank's cache if this rank owns it (docs/contract.md §3):
/// bit-identical to [`crate::reference::fill::fill`]. A token whose position is negative, whose
/// request index is outside `0..batch`, or whose page is beyond `max_pages` or maps to a page
/// outside `0..num_pages` is skipped: the kernel never writes outside the cache.
pub fn kv_fill(dev: &Device, stream: Stream, a: &KvFill) -> Result<()> {
    let params = validate(a)?;
    let id = if params.num_tokens as usize <= EARLY_FILL_MAX_TOKENS {
        compiled(registry::kv_fill_early(a.format.into()), || format!("kv_fill_early for {:?}", a.format))?
    } else {
        compiled(registry::kv_fill(a.format.into()), || format!("kv_fill for {:?}", a.format))?
    };
    // SAFETY: validate() checked every buffer against the extents the kernel addresses.
    unsafe { launch_warp_rows(dev, stream, id, params.num_tokens as usize, "positions", &params) }
}

fn validate(a: &KvFill) -> Result<DcpKvFillParams> {
    fill_params!(a, D_LATENT, a.cache.bytes, a.cache.num_pages, a.cache.block_size, a.cache.check(a.format))
}

/// The checks and kernel parameters both fills share ([`kv_fill`] and
/// [`crate::ops::model1::kv_fill_model1`]), over an argument struct with [`KvFill`]'s `tokens`,
/// `block_table`, `batch`, `dcp` and `rank`: `positions` and `req_idx` of one length, `ckv` rows
/// of `$nope` values and `kpe` rows of 64, the DCP layout, a block size (`$block_size`, of
/// `$num_pages` pages in the bytes `$cache`) that is at least 1 and a multiple of the interleave,
/// the block table, then `$page_rows`, the format's own cache checks (an expression, evaluated
/// last), which give the kernels' page_rows. A macro because the two argument structs share
/// these fields but not a type (their caches differ).
macro_rules! fill_params {
    ($a:expr, $nope:expr, $cache:expr, $num_pages:expr, $block_size:expr, $page_rows:expr) => {{
        use $crate::ops::{check_layout, check_rows, to_i32};
        let f = $a;
        let tokens = &f.tokens;
        let t = tokens.positions.len();
        ensure_arg!(tokens.req_idx.len() == t, "req_idx", "has {} entries but positions has {t}", tokens.req_idx.len());
        check_rows("ckv", &tokens.ckv, t, tokens.ckv_stride, $nope)?;
        check_rows("kpe", &tokens.kpe, t, tokens.kpe_stride, $crate::formats::D_ROPE)?;
        let [dcp_size, dcp_rank, interleave] = check_layout(f.dcp, f.rank)?;
        let (num_pages, block_size): (usize, usize) = ($num_pages, $block_size);
        ensure_arg!(block_size >= 1, "block_size", "must be at least 1");
        ensure_arg!(
            block_size % f.dcp.interleave == 0,
            "interleave",
            "{} does not divide the block size {block_size}",
            f.dcp.interleave
        );
        f.block_table.check(f.batch)?;
        let page_rows: i32 = $page_rows?;
        let cache: $crate::runtime::DeviceSlice<u8> = $cache;
        Ok($crate::abi::DcpKvFillParams {
            ckv: tokens.ckv.ptr(),
            kpe: tokens.kpe.ptr(),
            req_idx: tokens.req_idx.ptr(),
            positions: tokens.positions.ptr(),
            block_table: f.block_table.table.ptr(),
            cache: cache.ptr(),
            ckv_stride: tokens.ckv_stride as i64,
            kpe_stride: tokens.kpe_stride as i64,
            block_table_stride: f.block_table.stride as i64,
            num_tokens: to_i32("positions", t)?,
            batch: to_i32("batch", f.batch)?,
            max_pages: to_i32("max_pages", f.block_table.max_pages)?,
            num_pages: to_i32("num_pages", num_pages)?,
            block_size: to_i32("block_size", block_size)?,
            dcp_size,
            dcp_rank,
            interleave,
            page_rows,
            reserved: 0,
        })
    }};
}
pub(crate) use fill_params;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::{arg_of, fake, tokens};

    fn fill(dcp: DcpLayout) -> KvFill {
        KvFill {
            tokens: tokens(512),
            block_table: BlockTable::packed(fake(8), 8),
            batch: 1,
            cache: CacheView::packed(fake(8 * 64 * 1152), 8, 64),
            format: KvFormat::Bf16,
            dcp,
            rank: 0,
        }
    }

    #[test]
    fn errors_name_the_c_parameters() {
        assert!(validate(&fill(DcpLayout { size: 2, interleave: 1 })).is_ok());
        // the C caller wrote dcp_size and interleave (not the Rust fields dcp.size, dcp.interleave)
        assert_eq!(arg_of(validate(&fill(DcpLayout { size: 0, interleave: 1 })).unwrap_err()), "dcp_size");
        assert_eq!(arg_of(validate(&fill(DcpLayout { size: 2, interleave: 0 })).unwrap_err()), "interleave");
    }
}
