//! Safe launchers. Each one validates its arguments (returning an error that names the
//! offending one), allocates nothing, never synchronises, and launches on the caller's stream.
//! Lengths, tables and indices stay in device memory, so captured CUDA graphs replay correctly.

pub mod combine;
pub mod decode;
pub mod fill;
pub mod model1;
pub mod prefill;
pub mod topk;

use crate::error::{Error, Result};
use crate::formats::KvFormat;
use crate::planner::DcpLayout;
use crate::runtime::registry::KernelId;
use crate::runtime::{Device, DeviceSlice, Stream};
use half::bf16;

/// The element type of [`Rows`], the vocabulary of the DSL's `dtype` axis (the registry
/// implements `From<RowsDtype>` for it, as it does for the cache format's `format` axis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsDtype {
    Bf16,
    F32,
}

impl RowsDtype {
    /// Bytes of one value.
    pub fn bytes(self) -> usize {
        match self {
            RowsDtype::Bf16 => 2,
            RowsDtype::F32 => 4,
        }
    }
}

/// Rows of 512 values in bf16 or fp32: a decode's attention output [batch, q, H, 512], or a
/// combine's input or output. One type for every launcher ([`decode::DecodeOut`] and
/// [`combine::CombineRows`] name it where it plays those parts) and for the C ABI.
#[derive(Debug, Clone, Copy)]
pub enum Rows {
    Bf16(DeviceSlice<bf16>),
    F32(DeviceSlice<f32>),
}

impl Rows {
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            Rows::Bf16(s) => s.ptr(),
            Rows::F32(s) => s.ptr(),
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            Rows::Bf16(s) => s.len(),
            Rows::F32(s) => s.len(),
        }
    }
    pub(crate) fn is_f32(&self) -> bool {
        matches!(self, Rows::F32(_))
    }
    pub fn dtype(&self) -> RowsDtype {
        if self.is_f32() {
            RowsDtype::F32
        } else {
            RowsDtype::Bf16
        }
    }
    pub(crate) fn elem_bytes(&self) -> u64 {
        self.dtype().bytes() as u64
    }
}

/// A device buffer as the launchers' checks see it: where it starts, how many elements it holds
/// and their size ([`DeviceSlice`] of any element, [`Rows`] of bf16 or fp32).
pub(crate) trait Buffer {
    fn addr(&self) -> u64;
    fn elems(&self) -> usize;
    fn elem_size(&self) -> usize;
}

impl<T> Buffer for DeviceSlice<T> {
    fn addr(&self) -> u64 {
        self.ptr()
    }
    fn elems(&self) -> usize {
        self.len()
    }
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>()
    }
}

impl Buffer for Rows {
    fn addr(&self) -> u64 {
        self.ptr()
    }
    fn elems(&self) -> usize {
        self.len()
    }
    fn elem_size(&self) -> usize {
        self.dtype().bytes()
    }
}

/// `buf`, named `arg`, holds at least `need` elements and, unless none are needed, starts on an
/// `align`-byte boundary (1: anywhere).
pub(crate) fn check_buf(arg: &'static str, buf: &impl Buffer, need: usize, align: u64) -> Result<()> {
    ensure_arg!(buf.elems() >= need, arg, "holds {} elements but {need} are needed", buf.elems());
    ensure_aligned!(buf.addr() % align == 0 || need == 0, arg, "pointer {:#x} is not {align}-byte aligned", buf.addr());
    Ok(())
}

/// Elements that `rows` rows of `stride` elements address when the first `width` of each are
/// read: (rows − 1)·stride + width (0 without rows), or an error naming `arg` when that, or the
/// stride the kernels take as int64, does not fit. Caller sizes come from C callers on trust:
/// a wrapped product would pass the length check and read outside the buffer.
pub(crate) fn extent(arg: &'static str, rows: usize, stride: usize, width: usize) -> Result<usize> {
    ensure_arg!(i64::try_from(stride).is_ok(), arg, "row stride {stride} exceeds the kernels' int64 range");
    if rows == 0 {
        return Ok(0);
    }
    (rows - 1).checked_mul(stride).and_then(|n| n.checked_add(width)).filter(|&n| i64::try_from(n).is_ok()).ok_or_else(
        || Error::arg(arg, format!("{rows} rows of stride {stride} (width {width}) overflow the address range")),
    )
}

/// Elements a strided view addresses: Σ (count − 1)·stride over `dims` (count, stride) plus the
/// contiguous innermost `width`, or 0 when a count is 0; an error naming `arg` when a stride does
/// not fit the kernels' int64 or the sum overflows (caller strides come from C on trust).
pub(crate) fn strided_extent(arg: &'static str, dims: &[(usize, usize)], width: usize) -> Result<usize> {
    if dims.iter().any(|&(n, _)| n == 0) {
        return Ok(0);
    }
    let mut end = Some(width);
    for &(n, stride) in dims {
        ensure_arg!(i64::try_from(stride).is_ok(), arg, "stride {stride} exceeds the kernels' int64 range");
        end = end.and_then(|e| (n - 1).checked_mul(stride).and_then(|x| x.checked_add(e)));
    }
    end.filter(|&e| i64::try_from(e).is_ok()).ok_or_else(|| {
        Error::arg(arg, format!("the view of {dims:?} (count, stride) and width {width} overflows the address range"))
    })
}

/// A view of `counts` items (outermost first) of `width` contiguous elements at `strides`, in a
/// buffer `arg` of `len` elements: returns the strides the kernels take, a dim of one entry's set
/// to 0 (never stepped over, so whatever the caller's view had there is never refused), after
/// checking that each is a multiple of `align` elements (misaligned, naming `strides_arg`) and
/// that the view lies within `len` (naming `strides_arg` when its extent overflows, `arg` when the
/// buffer is too short).
pub(crate) fn view_strides<const N: usize>(
    arg: &'static str,
    strides_arg: &'static str,
    len: usize,
    strides: [usize; N],
    counts: [usize; N],
    width: usize,
    align: usize,
) -> Result<[usize; N]> {
    let strides: [usize; N] = std::array::from_fn(|i| if counts[i] > 1 { strides[i] } else { 0 });
    ensure_aligned!(
        strides.iter().all(|s| s % align == 0),
        strides_arg,
        "{strides:?} are not all multiples of {align} elements: the kernels access whole vectors"
    );
    let dims: [(usize, usize); N] = std::array::from_fn(|i| (counts[i], strides[i]));
    let need = strided_extent(strides_arg, &dims, width)?;
    ensure_arg!(len >= need, arg, "holds {len} elements but the view {dims:?} (count, stride) of {width} needs {need}");
    Ok(strides)
}

/// No two of a written view's items share an element (a race, and a silently wrong result):
/// ordered by stride, each stride (of [`view_strides`]) steps over everything inside it.
fn items_apart<const N: usize>(
    arg: &'static str,
    strides_arg: &'static str,
    strides: [usize; N],
    counts: [usize; N],
    width: usize,
) -> Result<()> {
    if counts.contains(&0) {
        return Ok(()); // no items: none can share an element (and the other counts may be anything)
    }
    let mut dims: [(usize, usize); N] = std::array::from_fn(|i| (counts[i], strides[i]));
    dims.sort_unstable_by_key(|&(_, s)| s);
    let mut inner = width;
    for (n, s) in dims.into_iter().filter(|&(n, _)| n > 1) {
        ensure_arg!(
            s >= inner,
            strides_arg,
            "{strides:?} make items of `{arg}` overlap (a stride of {s} within {inner})"
        );
        let span = (n - 1).checked_mul(s).and_then(|x| x.checked_add(inner));
        ensure_arg!(span.is_some(), strides_arg, "{strides:?} with counts {counts:?} span more than the address space");
        inner = span.unwrap_or(usize::MAX);
    }
    Ok(())
}

/// A strided view's shape: `counts` items (outermost first) of `width` contiguous elements, whose
/// strides and pointer are multiples of `align` bytes (the kernels' vector accesses; an element's
/// size at least); `written` when the kernels write it, and no two items may then share an
/// element. [`View::strides`] checks a buffer's view of this shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<const N: usize> {
    pub counts: [usize; N],
    pub width: usize,
    pub align: usize,
    pub written: bool,
}

impl<const N: usize> View<N> {
    /// [`view_strides`] of `buf` (named `arg`, its strides `strides_arg`) at `strides` (`None`:
    /// contiguous), then (`written`) its items kept apart, then its pointer's alignment; returns
    /// the kernels' strides.
    pub(crate) fn strides(
        self,
        arg: &'static str,
        strides_arg: &'static str,
        buf: &impl Buffer,
        strides: Option<[usize; N]>,
    ) -> Result<[usize; N]> {
        let View { counts, width, align, written } = self;
        // contiguous: each stride steps over everything inside it (saturating: an overflow is
        // refused as the view's extent)
        let strides = strides.unwrap_or_else(|| {
            let mut s = [0; N];
            let mut inner = width;
            for i in (0..N).rev() {
                s[i] = inner;
                inner = inner.saturating_mul(counts[i]);
            }
            s
        });
        let strides = view_strides(arg, strides_arg, buf.elems(), strides, counts, width, align / buf.elem_size())?;
        if written {
            items_apart(arg, strides_arg, strides, counts, width)?;
        }
        ensure_aligned!(buf.addr() % align as u64 == 0, arg, "pointer {:#x} is not {align}-byte aligned", buf.addr());
        Ok(strides)
    }
}

/// Checks that `buf` holds `rows` rows of `stride` elements of which the first `width` are read,
/// and that each row starts on a 16-byte boundary (the kernels use 16-byte vector accesses).
pub(crate) fn check_rows<T>(
    arg: &'static str,
    buf: &DeviceSlice<T>,
    rows: usize,
    stride: usize,
    width: usize,
) -> Result<()> {
    let size = std::mem::size_of::<T>();
    ensure_arg!(stride >= width, arg, "row stride {stride} is less than the row width {width}");
    let stride_bytes = stride.checked_mul(size);
    ensure_aligned!(
        stride_bytes.is_some_and(|b| b % 16 == 0),
        arg,
        "row stride of {stride} elements ({stride_bytes:?} bytes) is not a multiple of 16 bytes"
    );
    ensure_aligned!(buf.ptr() % 16 == 0 || rows == 0, arg, "pointer {:#x} is not 16-byte aligned", buf.ptr());
    let need = extent(arg, rows, stride, width)?;
    ensure_arg!(buf.len() >= need, arg, "holds {} elements but {rows} rows need {need}", buf.len());
    Ok(())
}

/// The product of caller counts (elements of a buffer, rows of a launch), or an error naming `arg`
/// when it wraps: never a small "valid" size from a wrapped product.
pub(crate) fn product(arg: &'static str, factors: &[usize]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |n, &f| n.checked_mul(f))
        .ok_or_else(|| Error::arg(arg, format!("the product {factors:?} overflows the address range")))
}

/// The product of caller counts as a count of rows of 512 values, checked so that the rows'
/// elements (rows·512) fit too: the launchers then size their buffers from it unchecked.
pub(crate) fn row_count(arg: &'static str, factors: &[usize]) -> Result<usize> {
    let rows = product(arg, factors)?;
    product(arg, &[rows, crate::formats::D_V])?;
    Ok(rows)
}

/// A DCP group and this rank's place in it: at least one rank, runs of at least one token, and
/// `rank` inside the group. Returns the kernels' int32 `[dcp_size, dcp_rank, interleave]`.
pub(crate) fn check_layout(dcp: DcpLayout, rank: usize) -> Result<[i32; 3]> {
    ensure_arg!(dcp.size >= 1, "dcp_size", "must be at least 1");
    ensure_arg!(dcp.interleave >= 1, "interleave", "must be at least 1");
    ensure_arg!(rank < dcp.size, "rank", "{rank} is not below the group size {}", dcp.size);
    Ok([to_i32("dcp_size", dcp.size)?, to_i32("rank", rank)?, to_i32("interleave", dcp.interleave)?])
}

/// `buf` holds at least `need` elements ([`check_buf`] with no alignment).
pub(crate) fn check_len<T>(arg: &'static str, buf: &DeviceSlice<T>, need: usize) -> Result<()> {
    check_buf(arg, buf, need, 1)
}

/// A block table: int32, a row a request of `stride` entries (cache page numbers, one a logical
/// page of `block_size` tokens), of which the first `max_pages` are read; an entry outside the
/// cache's pages is a page not there (its tokens are skipped or read as nothing, never addressed).
#[derive(Debug, Clone, Copy)]
pub struct BlockTable {
    pub table: DeviceSlice<i32>,
    /// Entries from one request's row to the next (≥ `max_pages`; FlashMLA's `block_table` is
    /// [batch, max_pages] with stride max_pages).
    pub stride: usize,
    /// Columns read: a request holds at most max_pages·block_size tokens on this rank.
    pub max_pages: usize,
}

impl BlockTable {
    /// A contiguous [rows, max_pages] table.
    pub fn packed(table: DeviceSlice<i32>, max_pages: usize) -> Self {
        BlockTable { table, stride: max_pages, max_pages }
    }

    /// `batch` rows: `max_pages` within the stride, and the table holding every entry read.
    /// Errors name the C ABI's fields (`block_table`, `block_table_stride`, `max_pages`).
    pub(crate) fn check(&self, batch: usize) -> Result<()> {
        let BlockTable { table, stride, max_pages } = *self;
        ensure_arg!(max_pages <= stride, "max_pages", "{max_pages} exceeds the block-table stride {stride}");
        let need = extent("block_table_stride", batch, stride, max_pages)?;
        ensure_arg!(table.len() >= need, "block_table", "holds {} entries but {batch} rows need {need}", table.len());
        Ok(())
    }
}

/// This rank's paged cache of the 576-value path (BF16 or FP8-656, the launch names the format)
/// as bytes: `num_pages` pages of `block_size` token rows, whose starts lie `page_stride` rows
/// apart (MODEL1's page-wise cache has its own geometry,
/// [`Model1Pages`](crate::formats::model1::Model1Pages)).
#[derive(Debug, Clone, Copy)]
pub struct CacheView {
    /// [num_pages, page_stride, token bytes of the format], of which the first `block_size` rows
    /// of each page are its tokens; 16-byte aligned (the kernels move 16-byte vectors).
    pub bytes: DeviceSlice<u8>,
    pub num_pages: usize,
    /// B: tokens a page; an index into the cache is page·B + slot.
    pub block_size: usize,
    /// Cache rows from one page's start to the next's, at least `block_size` (a view of a larger
    /// page dimension); `None`: `block_size`, packed pages.
    pub page_stride: Option<usize>,
}

impl CacheView {
    /// Packed pages: [num_pages, block_size, token bytes].
    pub fn packed(bytes: DeviceSlice<u8>, num_pages: usize, block_size: usize) -> Self {
        CacheView { bytes, num_pages, block_size, page_stride: None }
    }

    /// Rows from one page's start to the next's: `page_stride`, else `block_size`.
    pub fn page_rows(&self) -> usize {
        self.page_stride.unwrap_or(self.block_size)
    }

    /// The view against its buffer, its tokens in `format`: at least one token a page, pages at
    /// least that far apart, every row addressable by the kernels' int32 cache rows, and the
    /// buffer long enough (the last page needs only its `block_size` rows) and 16-byte aligned.
    /// Errors name the C ABI's fields. Returns the kernels' page_rows: a token's cache row is
    /// page·page_rows + slot.
    pub(crate) fn check(&self, format: KvFormat) -> Result<i32> {
        let CacheView { bytes, num_pages, block_size, .. } = *self;
        ensure_arg!(block_size >= 1, "block_size", "must be at least 1");
        let page_rows = self.page_rows();
        ensure_arg!(
            page_rows >= block_size,
            "page_stride",
            "{page_rows} rows is less than the block size {block_size}"
        );
        let rows = num_pages.checked_mul(page_rows);
        ensure_arg!(
            rows.is_some_and(|n| n <= i32::MAX as usize),
            "num_pages",
            "{num_pages} pages {page_rows} rows apart exceed the int32 cache addresses"
        );
        let need = strided_extent("page_stride", &[(num_pages, page_rows)], block_size)
            .ok()
            .and_then(|n| n.checked_mul(format.token_bytes()));
        ensure_arg!(
            need.is_some_and(|n| bytes.len() >= n),
            "cache",
            "holds {} bytes but {num_pages} pages of {block_size} {format:?} tokens, {page_rows} rows apart, need {need:?}",
            bytes.len()
        );
        ensure_aligned!(bytes.ptr() % 16 == 0, "cache", "pointer {:#x} is not 16-byte aligned", bytes.ptr());
        Ok(page_rows as i32)
    }
}

/// An optional fp32 attention sink per head (docs/contract.md §4) of a result with `heads` heads:
/// at least `heads` values (the first `heads` are read), 4-byte aligned. Returns the kernels'
/// pointer, 0 for none.
pub(crate) fn check_sink(sink: Option<&DeviceSlice<f32>>, heads: usize) -> Result<u64> {
    let Some(s) = sink else { return Ok(0) };
    ensure_arg!(s.len() >= heads, "sink", "holds {} values but {heads} heads need one each", s.len());
    ensure_aligned!(s.ptr() % 4 == 0, "sink", "pointer {:#x} is not 4-byte aligned", s.ptr());
    ensure_arg!(s.ptr() != 0, "sink", "is a null pointer (pass None for no sink)");
    Ok(s.ptr())
}

/// Converts a host-side count to the kernels' int32, naming the argument when it does not fit.
pub(crate) fn to_i32(arg: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::arg(arg, format!("{v} exceeds the kernels' int32 range")))
}

/// The kernel `id`, or [`Error::Unsupported`] naming `what` when this build does not hold it.
pub(crate) fn compiled<P>(id: Option<KernelId<P>>, what: impl FnOnce() -> String) -> Result<KernelId<P>> {
    id.ok_or_else(|| Error::Unsupported(what()))
}

/// Launches `id` over `rows` rows, `rows_per_block` of them a CTA, with `params`; nothing for no
/// rows. A grid past the x limit (2^31 − 1) is refused naming `arg`.
///
/// # Safety
/// `params` must have passed every check of the buffers the kernel addresses.
pub(crate) unsafe fn launch_rows<P: Copy>(
    dev: &Device,
    stream: Stream,
    id: KernelId<P>,
    rows: usize,
    rows_per_block: usize,
    arg: &'static str,
    params: &P,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let grid = rows.div_ceil(rows_per_block);
    ensure_arg!(grid <= i32::MAX as usize, arg, "{rows} rows exceed one launch's grid");
    // SAFETY: the caller's contract.
    unsafe { dev.launch(id, (grid as u32, 1, 1), stream, params) }
}

/// [`launch_rows`] with one warp a row.
///
/// # Safety
/// As for [`launch_rows`].
pub(crate) unsafe fn launch_warp_rows<P: Copy>(
    dev: &Device,
    stream: Stream,
    id: KernelId<P>,
    rows: usize,
    arg: &'static str,
    params: &P,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch_rows(dev, stream, id, rows, (id.info().block / 32) as usize, arg, params) }
}

#[cfg(test)]
mod tests {
    use super::test_util::{arg_of, fake, fake_at};
    use super::*;

    #[test]
    fn wrapped_extents_are_refused() {
        assert_eq!(extent("x", 0, 7, 5).unwrap(), 0);
        assert_eq!(extent("x", 3, 10, 4).unwrap(), 24);
        // (rows − 1)·stride fits, + width wraps: the case that used to pass as a tiny extent
        assert_eq!(arg_of(extent("x", 2, usize::MAX - 10, 100).unwrap_err()), "x");
        assert_eq!(arg_of(extent("x", 3, usize::MAX / 2 + 1, 1).unwrap_err()), "x");
        // a stride the kernels' int64 cannot hold, even for one row
        assert_eq!(arg_of(extent("x", 1, 1 << 63, 1).unwrap_err()), "x");
        // check_rows: a stride whose byte size wraps to a multiple of 16
        let s = usize::MAX / 4 + 1; // × 4 bytes = 2^64 ≡ 0
        assert_eq!(arg_of(check_rows::<f32>("y", &fake(1 << 20), 2, s, 4).unwrap_err()), "y");
        assert!(check_rows::<f32>("y", &fake(20), 2, 16, 4).is_ok());
    }

    #[test]
    fn views_default_to_contiguous_and_check_the_pointer() {
        let v = View { counts: [2, 3, 4], width: 512, align: 16, written: false };
        let read = |v: View<3>, buf: DeviceSlice<bf16>, s| v.strides("q", "q_strides", &buf, s);
        assert_eq!(read(v, fake(24 * 512), None).unwrap(), [6144, 2048, 512]);
        // a dim of one entry takes stride 0
        let one = View { counts: [1, 3, 4], ..v };
        assert_eq!(read(one, fake(12 * 512), None).unwrap(), [0, 2048, 512]);
        assert_eq!(arg_of(read(v, fake(24 * 512 - 1), None).unwrap_err()), "q");
        // 16 bytes: bf16 strides in multiples of 8 elements, and the pointer on a 16-byte boundary
        assert_eq!(arg_of(read(v, fake(1 << 20), Some([6144, 2048, 516])).unwrap_err()), "q_strides");
        assert_eq!(arg_of(read(v, fake_at(0x1008, 24 * 512), None).unwrap_err()), "q");
        // a contiguous view too large to address is refused by name, not wrapped
        let huge = View { counts: [usize::MAX / 2, 3, 4], ..v };
        assert_eq!(arg_of(read(huge, fake(1 << 20), None).unwrap_err()), "q_strides");
        // written: items may not overlap; fp32 lse 4-byte aligned
        let lse = View { counts: [2, 3, 4], width: 1, align: 4, written: true };
        assert!(lse.strides("lse", "lse_strides", &fake::<f32>(24), Some([12, 1, 3])).is_ok());
        assert_eq!(
            arg_of(lse.strides("lse", "lse_strides", &fake::<f32>(24), Some([12, 1, 1])).unwrap_err()),
            "lse_strides"
        );
        let read_lse = View { written: false, ..lse };
        assert!(read_lse.strides("lse", "lse_strides", &fake::<f32>(24), Some([12, 1, 1])).is_ok());
    }

    #[test]
    fn buffers_are_checked_by_length_and_alignment() {
        assert!(check_buf("lse", &fake::<f32>(8), 8, 4).is_ok());
        assert_eq!(arg_of(check_buf("lse", &fake::<f32>(7), 8, 4).unwrap_err()), "lse");
        assert_eq!(arg_of(check_buf("lse", &fake_at::<f32>(0x1002, 8), 8, 4).unwrap_err()), "lse");
        // nothing needed: any pointer
        assert!(check_buf("lse", &fake_at::<f32>(0x1002, 0), 0, 4).is_ok());
        let rows = Rows::Bf16(fake(2 * 512));
        assert!(check_buf("out", &rows, 2 * 512, 16).is_ok());
        assert_eq!(rows.elem_size(), 2);
        assert_eq!(check_layout(DcpLayout { size: 4, interleave: 2 }, 3).unwrap(), [4, 3, 2]);
    }
}

/// Helpers for the launchers' host-side validation tests.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::error::Error;
    use crate::runtime::DeviceSlice;

    /// A view at `ptr` that is never dereferenced: validation only reads the pointer and length.
    pub fn fake_at<T>(ptr: u64, len: usize) -> DeviceSlice<T> {
        // SAFETY: nothing is launched with it.
        unsafe { DeviceSlice::from_raw(ptr, len) }
    }

    /// A 16-byte-aligned fake view of `len` elements.
    pub fn fake<T>(len: usize) -> DeviceSlice<T> {
        fake_at(0x1000, len)
    }

    /// Four new tokens of a fill, their c_kv rows `nope` values wide.
    pub fn tokens(nope: usize) -> crate::ops::fill::NewTokens {
        crate::ops::fill::NewTokens {
            ckv: fake(4 * nope),
            ckv_stride: nope,
            kpe: fake(4 * 64),
            kpe_stride: 64,
            req_idx: fake(4),
            positions: fake(4),
        }
    }

    /// The argument an invalid or misaligned argument error names; panics on any other error.
    pub fn arg_of(e: Error) -> &'static str {
        e.argument().unwrap_or_else(|| panic!("expected an invalid argument, got {e}"))
    }
}
