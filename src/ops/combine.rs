//! The DCP combine launchers (docs/contract.md §5) in its three shapes. Reference:
//! [`crate::reference::merge`]; kernels: `kernels-src/combine.cuh`.
//!
//! - ag_rs: [`ag_rs_correct`] writes this rank's head-major contribution (fp32 or bf16) from the
//!   all-gathered lse; the caller reduce-scatters the contributions over heads; [`ag_rs_finish`]
//!   casts this rank's heads to the output dtype and writes their merged lse.
//! - a2a: [`a2a_pack`] packs out (bf16) and lse (fp32) into one slot per destination rank; the
//!   caller runs one all-to-all; [`a2a_combine`] merges the D received slots.
//! - [`merge_two`]: the two-way merge of chunked prefill, bf16 or fp32 in, bf16 or fp32 out.
//!
//! Every lse input comes with its base ([`LseBase`]); every lse output is a natural log.

use super::{check_buf, check_layout, compiled, launch_warp_rows, product, row_count, to_i32};
use crate::abi::{DcpA2aCombineParams, DcpA2aPackParams, DcpAgRsCorrectParams, DcpAgRsFinishParams, DcpMergeTwoParams};
use crate::error::Result;
use crate::formats::{LseBase, D_V};
use crate::planner::DcpLayout;
use crate::runtime::registry::{self, axes, KernelId};
use crate::runtime::{Device, DeviceSlice, Stream};

/// The largest group size the ag_rs kernels take (they read D at run time).
pub const AG_RS_MAX_RANKS: usize = 8;

/// Group sizes the a2a combine is compiled for (it specialises on D).
pub const A2A_RANKS: [usize; 4] = [1, 2, 4, 8];

/// Rows of 512 values, bf16 or fp32: an attention output read by a combine, or a combine's output.
pub type CombineRows = super::Rows;

impl super::Rows {
    /// The DSL's `dtype` axis of these rows (a combine's input or output).
    fn axis(&self) -> axes::Dtype {
        self.dtype().into()
    }
    /// The bytes `rows` rows of 512 occupy from the start.
    fn extent(&self, rows: usize) -> Extent {
        Extent { ptr: self.ptr(), bytes: rows as u64 * D_V as u64 * self.elem_bytes() }
    }
}

/// The a2a slot size the launchers accept: the planner's
/// [`crate::planner::workspace::a2a_slot_bytes_aligned`].
pub fn a2a_aligned_slot_bytes(num_tokens: usize, local_heads: usize) -> Result<usize> {
    crate::planner::workspace::a2a_slot_bytes_aligned(num_tokens, local_heads)
}

/// The tokens, heads and ranks of a combine: T = `num_tokens` query rows of H = D·H_l heads, each
/// of the D = `dcp_size` ranks holding H_l = `local_heads` of them after the combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CombineGroup {
    pub num_tokens: usize,
    pub local_heads: usize,
    pub dcp_size: usize,
}

impl CombineGroup {
    /// Checks D (at most `max_ranks`), `rank` and H_l; returns H = D·H_l.
    fn heads(&self, rank: usize, max_ranks: usize) -> Result<usize> {
        let CombineGroup { local_heads, dcp_size, .. } = *self;
        ensure_arg!(dcp_size <= max_ranks, "dcp_size", "{dcp_size} exceeds the {max_ranks} ranks this kernel takes");
        check_layout(DcpLayout { size: dcp_size, interleave: 1 }, rank)?;
        let heads = dcp_size.checked_mul(local_heads);
        ensure_arg!(heads.is_some(), "local_heads", "{local_heads} heads times D = {dcp_size} overflows");
        Ok(heads.unwrap_or_default())
    }

    /// T and H_l as the kernels take them, each error naming its field.
    fn params(&self) -> Result<(i32, i32)> {
        Ok((to_i32("num_tokens", self.num_tokens)?, to_i32("local_heads", self.local_heads)?))
    }
}

/// Arguments of [`ag_rs_correct`] on rank `rank` of the group, H = D·H_l.
#[derive(Debug, Clone, Copy)]
pub struct AgRsCorrect {
    /// This rank's partial attention output [T, H, 512], bf16 or fp32, contiguous.
    pub out: CombineRows,
    /// fp32 [D, T, H]: every rank's lse (all-gathered), in `lse_base`.
    pub lse_all: DeviceSlice<f32>,
    pub lse_base: LseBase,
    /// [H, T, 512]: written; head-major, ready for a reduce-scatter over heads. fp32 (what
    /// docs/contract.md §5.1 prefers: only the final cast rounds) or bf16 (rounded to nearest even,
    /// as engines reduce-scatter today).
    pub contrib: CombineRows,
    pub group: CombineGroup,
    pub rank: usize,
}

/// Arguments of [`ag_rs_finish`] on rank `rank`, which holds heads [rank·H_l, (rank+1)·H_l).
#[derive(Debug, Clone, Copy)]
pub struct AgRsFinish {
    /// [H_l, T, 512], fp32 or bf16: the reduce-scattered sum of every rank's contribution to this
    /// rank's heads.
    pub summed: CombineRows,
    /// fp32 [D, T, D·H_l]: the same all-gathered lse the contributions used, in `lse_base`.
    pub lse_all: DeviceSlice<f32>,
    pub lse_base: LseBase,
    /// [T, H_l, 512] bf16 (rounded to nearest even) or fp32: written.
    pub out: CombineRows,
    /// fp32 [T, H_l]: the merged lse, natural log; written.
    pub lse: DeviceSlice<f32>,
    pub group: CombineGroup,
    pub rank: usize,
    /// fp32 \[H_l\]: the attention sinks of this rank's heads (sink\[j\] for head rank·H_l + j), applied
    /// once to the merged fp32 rows before the cast (docs/contract.md §5); `None`: no sink.
    pub sink: Option<DeviceSlice<f32>>,
}

/// Arguments of [`a2a_pack`] on one source rank.
#[derive(Debug, Clone, Copy)]
pub struct A2aPack {
    /// This rank's partial attention output [T, D·H_l, 512]; fp32 is rounded to bf16 (nearest even).
    pub out: CombineRows,
    /// fp32 [T, D·H_l], copied bit for bit (in whatever base the producer used).
    pub lse: DeviceSlice<f32>,
    /// Bytes [D, slot_bytes]: slot d = [T·H_l·512 bf16 out][T·H_l fp32 lse] of heads
    /// [d·H_l, (d+1)·H_l); written (bytes past the tight slot size are left alone).
    pub send: DeviceSlice<u8>,
    /// At least [`crate::reference::merge::a2a_slot_bytes`], a multiple of 16 (see [`a2a_aligned_slot_bytes`]).
    pub slot_bytes: usize,
    pub group: CombineGroup,
}

/// Arguments of [`a2a_combine`] on one destination rank.
#[derive(Debug, Clone, Copy)]
pub struct A2aCombine {
    /// Bytes [D, slot_bytes]: slot r as source rank r packed it for this rank.
    pub recv: DeviceSlice<u8>,
    /// The slot size the senders used.
    pub slot_bytes: usize,
    /// The base of the lse inside the slots.
    pub lse_base: LseBase,
    /// [T, H_l, 512] bf16 (rounded to nearest even) or fp32: written.
    pub out: CombineRows,
    /// fp32 [T, H_l]: the merged lse, natural log; written.
    pub lse: DeviceSlice<f32>,
    pub group: CombineGroup,
    /// fp32 \[H_l\]: the attention sinks of this rank's heads (sink\[j\] for head rank·H_l + j), applied
    /// once to the merged fp32 rows before the cast (docs/contract.md §5); `None`: no sink.
    pub sink: Option<DeviceSlice<f32>>,
}

/// Arguments of [`merge_two`]: `rows` rows (T·H) of two partial results.
#[derive(Debug, Clone, Copy)]
pub struct MergeTwo {
    /// [rows, 512], bf16 (as an attention kernel writes it) or fp32 (a running merge's result);
    /// `out_b` must have the same dtype.
    pub out_a: CombineRows,
    /// fp32 \[rows\], in `lse_a_base`.
    pub lse_a: DeviceSlice<f32>,
    pub out_b: CombineRows,
    /// fp32 \[rows\], in `lse_b_base`.
    pub lse_b: DeviceSlice<f32>,
    /// The base of each input's lse (docs/contract.md §5.3): a running result in natural log (this merge's
    /// own output) merged with a base-2 chunk from another kernel is the normal case.
    pub lse_a_base: LseBase,
    pub lse_b_base: LseBase,
    /// [rows, 512] fp32 or bf16: written. An `out` of the inputs' dtype may be exactly `out_a` or
    /// `out_b` (accumulating chunk after chunk in place); any other overlap is rejected.
    pub out: CombineRows,
    /// fp32 \[rows\], natural log: written. May be exactly `lse_a` or `lse_b`.
    pub lse: DeviceSlice<f32>,
    pub rows: usize,
    /// fp32 \[H\]: attention sinks applied to the merged rows, laid out \[T, H\] (head = row mod H, with
    /// H = the slice's length, which must divide `rows`). Pass it on the last merge of a chain
    /// only: the running result carries no sink, or the sink would enter the softmax once a chunk.
    pub sink: Option<DeviceSlice<f32>>,
}

/// ag_rs step 1 (docs/contract.md §5.1): `contrib[h, t, :] = (w_rank / S) · out[t, h, :]` in fp32 (stored
/// as `contrib`'s dtype), exactly 0 where w_rank / S = 0 (an empty shard's NaN never leaks).
/// Matches [`crate::reference::merge::ag_rs_contribution`] (followed by `to_bf16` for a bf16
/// contribution).
pub fn ag_rs_correct(dev: &Device, stream: Stream, a: &AgRsCorrect) -> Result<()> {
    let id = registry::combine_ag_rs_correct(a.out.axis(), a.contrib.dtype().into());
    // SAFETY: the parameters are validate_ag_rs_correct's.
    unsafe { launch_checked(dev, stream, id, "combine_ag_rs_correct", validate_ag_rs_correct(a)?) }
}

fn validate_ag_rs_correct(a: &AgRsCorrect) -> Result<(DcpAgRsCorrectParams, usize)> {
    let g = a.group;
    let heads = g.heads(a.rank, AG_RS_MAX_RANKS)?;
    let rows = row_count("num_tokens", &[g.num_tokens, heads])?;
    let lse_all = product("num_tokens", &[g.dcp_size, rows])?;
    check_rows_buf("out", &a.out, rows)?;
    check_buf("lse_all", &a.lse_all, lse_all, 4)?;
    check_rows_buf("contrib", &a.contrib, rows)?;
    let contrib = a.contrib.extent(rows);
    disjoint("contrib", contrib, "out", a.out.extent(rows))?;
    disjoint("contrib", contrib, "lse_all", f32_extent(&a.lse_all, lse_all))?;
    let params = DcpAgRsCorrectParams {
        out: a.out.ptr(),
        lse_all: a.lse_all.ptr(),
        contrib: a.contrib.ptr(),
        num_tokens: to_i32("num_tokens", g.num_tokens)?,
        num_heads: to_i32("local_heads", heads)?,
        dcp_size: g.dcp_size as i32,
        dcp_rank: a.rank as i32,
        lse_base2: base2(a.lse_base),
        reserved: 0,
    };
    Ok((params, rows))
}

/// ag_rs step 2: `out[t, hl, :]` = `summed[hl, t, :]` cast to the output dtype, and `lse[t, hl]` =
/// the merged lse of head rank·H_l + hl; a row whose shards are all empty gets out = 0 and lse = −inf.
/// Matches [`crate::reference::merge::ag_rs_finish`] on `summed` widened to fp32 (followed by
/// `to_bf16` for bf16 output).
pub fn ag_rs_finish(dev: &Device, stream: Stream, a: &AgRsFinish) -> Result<()> {
    let id = registry::combine_ag_rs_finish(a.summed.dtype().into(), a.out.axis());
    // SAFETY: the parameters are validate_ag_rs_finish's.
    unsafe { launch_checked(dev, stream, id, "combine_ag_rs_finish", validate_ag_rs_finish(a)?) }
}

fn validate_ag_rs_finish(a: &AgRsFinish) -> Result<(DcpAgRsFinishParams, usize)> {
    let g = a.group;
    let heads = g.heads(a.rank, AG_RS_MAX_RANKS)?;
    let rows = row_count("num_tokens", &[g.num_tokens, g.local_heads])?;
    let lse_all = product("num_tokens", &[g.dcp_size, g.num_tokens, heads])?;
    check_rows_buf("summed", &a.summed, rows)?;
    check_buf("lse_all", &a.lse_all, lse_all, 4)?;
    let inputs = [("summed", a.summed.extent(rows)), ("lse_all", f32_extent(&a.lse_all, lse_all))];
    let sink = check_merged(&a.out, &a.lse, rows, &inputs, a.sink.as_ref(), g.local_heads)?;
    let (num_tokens, local_heads) = g.params()?;
    let params = DcpAgRsFinishParams {
        summed: a.summed.ptr(),
        lse_all: a.lse_all.ptr(),
        out: a.out.ptr(),
        lse_out: a.lse.ptr(),
        sink,
        num_tokens,
        local_heads,
        dcp_size: g.dcp_size as i32,
        dcp_rank: a.rank as i32,
        lse_base2: base2(a.lse_base),
        reserved: 0,
    };
    Ok((params, rows))
}

/// a2a send side: packs this rank's out and lse into one slot per destination (docs/contract.md §5.2),
/// byte for byte [`crate::reference::merge::a2a_pack`] for bf16 `out`.
pub fn a2a_pack(dev: &Device, stream: Stream, a: &A2aPack) -> Result<()> {
    let id = registry::combine_a2a_pack(a.out.axis());
    // SAFETY: the parameters are validate_a2a_pack's.
    unsafe { launch_checked(dev, stream, id, "combine_a2a_pack", validate_a2a_pack(a)?) }
}

fn validate_a2a_pack(a: &A2aPack) -> Result<(DcpA2aPackParams, usize)> {
    let g = a.group;
    let heads = g.heads(0, usize::MAX)?;
    let rows = row_count("num_tokens", &[g.num_tokens, heads])?;
    check_rows_buf("out", &a.out, rows)?;
    check_buf("lse", &a.lse, rows, 4)?;
    let send = check_slots("send", &a.send, a.slot_bytes, g)?;
    disjoint("send", send, "out", a.out.extent(rows))?;
    disjoint("send", send, "lse", f32_extent(&a.lse, rows))?;
    let (num_tokens, local_heads) = g.params()?;
    let params = DcpA2aPackParams {
        out: a.out.ptr(),
        lse: a.lse.ptr(),
        send: a.send.ptr(),
        slot_bytes: a.slot_bytes as i64,
        num_tokens,
        local_heads,
        dcp_size: to_i32("dcp_size", g.dcp_size)?,
        reserved: 0,
    };
    Ok((params, rows))
}

/// Whether this build holds the a2a combine for `dcp_size` ranks writing `out`'s dtype (a
/// capability query: the C ABI answers UNSUPPORTED from it before touching the device).
pub fn a2a_combine_compiled(dcp_size: usize, out: &CombineRows) -> bool {
    u32::try_from(dcp_size).is_ok_and(|d| registry::combine_a2a(d, out.axis()).is_some())
}

/// a2a receive side: the full merge (docs/contract.md §5) of the D received slots into out [T, H_l, 512]
/// and lse [T, H_l], accumulated in fp32 in rank order; a source whose coefficient is 0 is
/// skipped. Matches [`crate::reference::merge::a2a_combine`]. D must be one of [`A2A_RANKS`].
pub fn a2a_combine(dev: &Device, stream: Stream, a: &A2aCombine) -> Result<()> {
    let id = registry::combine_a2a(a.group.dcp_size as u32, a.out.axis());
    // SAFETY: the parameters are validate_a2a_combine's.
    unsafe { launch_checked(dev, stream, id, "combine_a2a", validate_a2a_combine(a)?) }
}

fn validate_a2a_combine(a: &A2aCombine) -> Result<(DcpA2aCombineParams, usize)> {
    let g = a.group;
    g.heads(0, usize::MAX)?;
    ensure_arg!(
        A2A_RANKS.contains(&g.dcp_size),
        "dcp_size",
        "the a2a combine is compiled for D in {A2A_RANKS:?}, not D = {}",
        g.dcp_size
    );
    let rows = row_count("num_tokens", &[g.num_tokens, g.local_heads])?;
    let recv = check_slots("recv", &a.recv, a.slot_bytes, g)?;
    let sink = check_merged(&a.out, &a.lse, rows, &[("recv", recv)], a.sink.as_ref(), g.local_heads)?;
    let (num_tokens, local_heads) = g.params()?;
    let params = DcpA2aCombineParams {
        recv: a.recv.ptr(),
        out: a.out.ptr(),
        lse_out: a.lse.ptr(),
        sink,
        slot_bytes: a.slot_bytes as i64,
        num_tokens,
        local_heads,
        lse_base2: base2(a.lse_base),
        reserved: 0,
    };
    Ok((params, rows))
}

/// The two-way merge of chunked prefill (docs/contract.md §5.3): (out_a, lse_a) + (out_b, lse_b) → out, lse,
/// fp32 accumulation, a part with coefficient 0 skipped. Matches
/// [`crate::reference::merge::merge_two`] on the inputs widened to fp32 (bf16 → fp32 is exact),
/// followed by `to_bf16` for bf16 output.
pub fn merge_two(dev: &Device, stream: Stream, a: &MergeTwo) -> Result<()> {
    let id = registry::combine_merge_two(a.out_a.dtype().into(), a.out.axis());
    // SAFETY: the parameters are validate_merge_two's.
    unsafe { launch_checked(dev, stream, id, "combine_merge_two", validate_merge_two(a)?) }
}

fn validate_merge_two(a: &MergeTwo) -> Result<(DcpMergeTwoParams, usize)> {
    let rows = row_count("rows", &[a.rows])?;
    ensure_arg!(
        a.out_b.dtype() == a.out_a.dtype(),
        "out_b",
        "is {:?} where out_a is {:?}: the two inputs share one dtype",
        a.out_b.dtype(),
        a.out_a.dtype()
    );
    check_rows_buf("out_a", &a.out_a, rows)?;
    check_buf("lse_a", &a.lse_a, rows, 4)?;
    check_rows_buf("out_b", &a.out_b, rows)?;
    check_buf("lse_b", &a.lse_b, rows, 4)?;
    check_rows_buf("out", &a.out, rows)?;
    check_buf("lse", &a.lse, rows, 4)?;
    let out = a.out.extent(rows);
    let lse = f32_extent(&a.lse, rows);
    let (out_a, out_b) = (a.out_a.extent(rows), a.out_b.extent(rows));
    let (lse_a, lse_b) = (f32_extent(&a.lse_a, rows), f32_extent(&a.lse_b, rows));
    same_or_disjoint("out", out, "out_a", out_a)?;
    same_or_disjoint("out", out, "out_b", out_b)?;
    same_or_disjoint("lse", lse, "lse_a", lse_a)?;
    same_or_disjoint("lse", lse, "lse_b", lse_b)?;
    for (name, e) in [("lse", lse), ("lse_a", lse_a), ("lse_b", lse_b)] {
        disjoint("out", out, name, e)?;
    }
    disjoint("lse", lse, "out_a", out_a)?;
    disjoint("lse", lse, "out_b", out_b)?;
    let sink_heads = a.sink.map_or(1, |s| s.len());
    ensure_arg!(
        sink_heads >= 1 && rows % sink_heads == 0,
        "sink",
        "holds {sink_heads} values, which is not a head count dividing the {rows} rows"
    );
    let sink = sink_param(a.sink.as_ref(), sink_heads, rows, &[out, lse])?;
    let params = DcpMergeTwoParams {
        out_a: a.out_a.ptr(),
        lse_a: a.lse_a.ptr(),
        out_b: a.out_b.ptr(),
        lse_b: a.lse_b.ptr(),
        out: a.out.ptr(),
        lse_out: a.lse.ptr(),
        sink,
        rows: rows as i64,
        lse_a_base2: base2(a.lse_a_base),
        lse_b_base2: base2(a.lse_b_base),
        sink_heads: to_i32("sink", sink_heads)?,
        reserved: 0,
    };
    Ok((params, rows))
}

/// The merged result of a combine over `rows` rows, `out` [rows, 512] and its fp32 natural-log
/// `lse` \[rows\]: both checked, kept apart from each other and from every one of `inputs` (named
/// extents the launch reads), and the sinks of `heads` heads kept apart from both
/// ([`sink_param`]). Returns the kernels' sink pointer.
fn check_merged(
    out: &CombineRows,
    lse: &DeviceSlice<f32>,
    rows: usize,
    inputs: &[(&str, Extent)],
    sink: Option<&DeviceSlice<f32>>,
    heads: usize,
) -> Result<u64> {
    check_rows_buf("out", out, rows)?;
    check_buf("lse", lse, rows, 4)?;
    let (out, lse) = (out.extent(rows), f32_extent(lse, rows));
    disjoint("out", out, "lse", lse)?;
    for &(name, e) in inputs {
        disjoint("out", out, name, e)?;
        disjoint("lse", lse, name, e)?;
    }
    sink_param(sink, heads, rows, &[out, lse])
}

/// A buffer of `rows` contiguous rows of 512 values (a count [`row_count`] checked), 16-byte
/// aligned.
fn check_rows_buf(arg: &'static str, buf: &CombineRows, rows: usize) -> Result<()> {
    check_buf(arg, buf, rows * D_V, 16)
}

/// A [D, slot_bytes] a2a buffer; returns its extent.
fn check_slots(arg: &'static str, buf: &DeviceSlice<u8>, slot_bytes: usize, g: CombineGroup) -> Result<Extent> {
    let CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d } = g;
    let tight = t.checked_mul(h_l).and_then(|n| n.checked_mul(D_V * 2 + 4));
    ensure_arg!(
        tight.is_some_and(|n| slot_bytes >= n),
        "slot_bytes",
        "{slot_bytes} is less than the {tight:?} bytes of T = {t} rows of H_l = {h_l} heads"
    );
    ensure_arg!(
        slot_bytes % 16 == 0,
        "slot_bytes",
        "{slot_bytes} is not a multiple of 16 (slots must start 16-byte aligned: use a2a_aligned_slot_bytes)"
    );
    let need = d.checked_mul(slot_bytes);
    ensure_arg!(
        need.is_some_and(|n| buf.len() >= n),
        arg,
        "holds {} bytes but {d} slots of {slot_bytes} need {need:?}",
        buf.len()
    );
    ensure_aligned!(buf.ptr() % 16 == 0, arg, "pointer {:#x} is not 16-byte aligned", buf.ptr());
    Ok(Extent { ptr: buf.ptr(), bytes: (d * slot_bytes) as u64 })
}

/// The bytes a kernel touches in one buffer, for overlap checks.
#[derive(Debug, Clone, Copy)]
struct Extent {
    ptr: u64,
    bytes: u64,
}

impl Extent {
    fn overlaps(self, o: Extent) -> bool {
        self.bytes != 0
            && o.bytes != 0
            && self.ptr < o.ptr.saturating_add(o.bytes)
            && o.ptr < self.ptr.saturating_add(self.bytes)
    }
}

fn f32_extent(buf: &DeviceSlice<f32>, n: usize) -> Extent {
    Extent { ptr: buf.ptr(), bytes: n as u64 * 4 }
}

fn disjoint(arg: &'static str, a: Extent, other: &str, b: Extent) -> Result<()> {
    ensure_arg!(!a.overlaps(b), arg, "overlaps `{other}`");
    Ok(())
}

/// In-place use is fine when both views are the very same bytes: each row is read before written.
fn same_or_disjoint(arg: &'static str, a: Extent, other: &str, b: Extent) -> Result<()> {
    ensure_arg!(
        (a.ptr == b.ptr && a.bytes == b.bytes) || !a.overlaps(b),
        arg,
        "overlaps `{other}` without being exactly the same buffer"
    );
    Ok(())
}

/// The kernels' sink pointer (0 for none) after [`super::check_sink`], with the sinks kept apart
/// from what the launch writes (`written`: out and lse), for a launch of `rows` rows (the kernels
/// find a row's head by a 32-bit remainder).
fn sink_param(sink: Option<&DeviceSlice<f32>>, heads: usize, rows: usize, written: &[Extent]) -> Result<u64> {
    let ptr = super::check_sink(sink, heads)?;
    if let Some(s) = sink {
        ensure_arg!(u32::try_from(rows).is_ok(), "sink", "with {rows} rows (2^32 or more) is not supported");
        let e = f32_extent(s, heads);
        for &w in written {
            disjoint("sink", e, "out or lse", w)?;
        }
    }
    Ok(ptr)
}

fn base2(base: LseBase) -> i32 {
    match base {
        LseBase::E => 0,
        LseBase::Two => 1,
    }
}

/// Launches a combine kernel, one warp a row, on the parameters and row count its validator
/// returned.
///
/// # Safety
/// The parameters and row count must be what the validator of `id`'s family returned: the
/// buffers they name were checked against the extents the kernel addresses.
unsafe fn launch_checked<P: Copy>(
    dev: &Device,
    stream: Stream,
    id: Option<KernelId<P>>,
    family: &'static str,
    (params, rows): (P, usize),
) -> Result<()> {
    let id = compiled(id, || format!("{family}: variant not compiled into this build"))?;
    // SAFETY: the caller's contract.
    unsafe { launch_warp_rows(dev, stream, id, rows, "num_tokens", &params) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::reference::merge::a2a_slot_bytes;

    use crate::ops::test_util::{arg_of, fake_at as slice};

    fn err_arg(r: Result<()>) -> &'static str {
        arg_of(r.expect_err("expected an invalid argument"))
    }

    #[test]
    fn aligned_slot_rounds_up_only_when_needed() {
        assert_eq!(a2a_aligned_slot_bytes(128, 16).unwrap(), a2a_slot_bytes(128, 16));
        assert_eq!(a2a_aligned_slot_bytes(1, 2).unwrap(), 2064);
        assert_eq!(a2a_aligned_slot_bytes(1, 2).unwrap() % 16, 0);
    }

    #[test]
    fn ag_rs_validation_names_the_argument() {
        let (t, h_l, d) = (4, 2, 2);
        let rows = t * d * h_l;
        let good = AgRsCorrect {
            out: CombineRows::Bf16(slice(0x1000_0000, rows * D_V)),
            lse_all: slice(0x2000_0000, d * rows),
            lse_base: LseBase::E,
            contrib: CombineRows::F32(slice(0x3000_0000, rows * D_V)),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            rank: 1,
        };
        let check = |a: AgRsCorrect| validate_ag_rs_correct(&a).map(|_| ());
        let (params, n) = validate_ag_rs_correct(&good).unwrap();
        assert_eq!((n, params.num_heads, params.dcp_rank), (rows, (d * h_l) as i32, 1));
        assert_eq!(err_arg(check(AgRsCorrect { rank: 2, ..good })), "rank");
        assert_eq!(
            err_arg(check(AgRsCorrect { group: CombineGroup { dcp_size: 9, ..good.group }, rank: 0, ..good })),
            "dcp_size"
        );
        assert_eq!(err_arg(check(AgRsCorrect { lse_all: slice(0x2000_0000, d * rows - 1), ..good })), "lse_all");
        assert_eq!(
            err_arg(check(AgRsCorrect { out: CombineRows::F32(slice(0x1000_0008, rows * D_V)), ..good })),
            "out"
        );
        let contrib_at = |addr, n, f32: bool| {
            if f32 {
                CombineRows::F32(slice(addr, n))
            } else {
                CombineRows::Bf16(slice(addr, n))
            }
        };
        assert_eq!(
            err_arg(check(AgRsCorrect { contrib: contrib_at(0x1000_0000 + 512, rows * D_V, true), ..good })),
            "contrib"
        );
        // a bf16 contribution: sized and aligned by its own elements
        assert!(check(AgRsCorrect { contrib: contrib_at(0x3000_0000, rows * D_V, false), ..good }).is_ok());
        assert_eq!(
            err_arg(check(AgRsCorrect { contrib: contrib_at(0x3000_0000, rows * D_V - 1, false), ..good })),
            "contrib"
        );
        assert_eq!(
            err_arg(check(AgRsCorrect { contrib: contrib_at(0x3000_0008, rows * D_V, false), ..good })),
            "contrib"
        );

        let finish = AgRsFinish {
            summed: CombineRows::F32(slice(0x1000_0000, t * h_l * D_V)),
            lse_all: slice(0x2000_0000, d * rows),
            lse_base: LseBase::Two,
            out: CombineRows::Bf16(slice(0x3000_0000, t * h_l * D_V)),
            lse: slice(0x4000_0000, t * h_l),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            rank: 0,
            sink: None,
        };
        let check = |a: AgRsFinish| validate_ag_rs_finish(&a).map(|_| ());
        assert!(check(finish).is_ok());
        assert_eq!(err_arg(check(AgRsFinish { lse: slice(0x3000_0000 + 16, t * h_l), ..finish })), "out");
        assert_eq!(
            err_arg(check(AgRsFinish { summed: contrib_at(0x1000_0000, t * h_l * D_V - 1, true), ..finish })),
            "summed"
        );
        assert!(check(AgRsFinish { summed: contrib_at(0x1000_0000, t * h_l * D_V, false), ..finish }).is_ok());
        assert_eq!(
            err_arg(check(AgRsFinish { summed: contrib_at(0x1000_0000, t * h_l * D_V - 1, false), ..finish })),
            "summed"
        );
    }

    #[test]
    fn a2a_validation_names_the_argument() {
        let (t, h_l, d) = (3, 4, 4);
        let slot = a2a_slot_bytes(t, h_l);
        let pack = A2aPack {
            out: CombineRows::F32(slice(0x1000_0000, t * d * h_l * D_V)),
            lse: slice(0x2000_0000, t * d * h_l),
            send: slice(0x3000_0000, d * slot),
            slot_bytes: slot,
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
        };
        assert!(validate_a2a_pack(&pack).is_ok());
        assert_eq!(err_arg(validate_a2a_pack(&A2aPack { slot_bytes: slot + 8, ..pack }).map(|_| ())), "slot_bytes");
        assert_eq!(
            err_arg(validate_a2a_pack(&A2aPack { lse: slice(0x3000_0000, t * d * h_l), ..pack }).map(|_| ())),
            "send"
        );
        let comb = A2aCombine {
            recv: slice(0x3000_0000, d * slot),
            slot_bytes: slot,
            lse_base: LseBase::E,
            out: CombineRows::Bf16(slice(0x1000_0000, t * h_l * D_V)),
            lse: slice(0x2000_0000, t * h_l),
            group: CombineGroup { num_tokens: t, local_heads: h_l, dcp_size: d },
            sink: None,
        };
        assert!(validate_a2a_combine(&comb).is_ok());
        assert_eq!(
            err_arg(
                validate_a2a_combine(&A2aCombine { group: CombineGroup { dcp_size: 3, ..comb.group }, ..comb })
                    .map(|_| ())
            ),
            "dcp_size"
        );
        // D = 1 is compiled (the DCP identity at D = 1); its one slot is a smaller recv
        assert!(validate_a2a_combine(&A2aCombine {
            group: CombineGroup { dcp_size: 1, ..comb.group },
            recv: slice(0x3000_0000, slot),
            ..comb
        })
        .is_ok());
        let huge = A2aCombine { group: CombineGroup { num_tokens: usize::MAX / 64, ..comb.group }, ..comb };
        assert_eq!(err_arg(validate_a2a_combine(&huge).map(|_| ())), "num_tokens");
        assert_eq!(
            err_arg(
                validate_a2a_pack(&A2aPack {
                    group: CombineGroup { num_tokens: usize::MAX / 64, ..pack.group },
                    ..pack
                })
                .map(|_| ())
            ),
            "num_tokens"
        );
        assert_eq!(
            err_arg(validate_a2a_combine(&A2aCombine { lse: slice(0x2000_0000, 1), ..comb }).map(|_| ())),
            "lse"
        );
    }

    #[test]
    fn merge_two_accepts_exact_in_place_only() {
        let rows = 10;
        let m = MergeTwo {
            out_a: CombineRows::F32(slice(0x1000_0000, rows * D_V)),
            lse_a: slice(0x2000_0000, rows),
            out_b: CombineRows::F32(slice(0x3000_0000, rows * D_V)),
            lse_b: slice(0x4000_0000, rows),
            lse_a_base: LseBase::E,
            lse_b_base: LseBase::E,
            out: CombineRows::F32(slice(0x5000_0000, rows * D_V)),
            lse: slice(0x6000_0000, rows),
            rows,
            sink: None,
        };
        let check = |a: MergeTwo| validate_merge_two(&a).map(|_| ());
        assert!(check(m).is_ok());
        assert!(check(MergeTwo { out: m.out_a, lse: m.lse_b, ..m }).is_ok());
        assert_eq!(
            err_arg(check(MergeTwo { out: CombineRows::F32(slice(0x1000_0000 + 2048, rows * D_V)), ..m })),
            "out"
        );
        assert_eq!(err_arg(check(MergeTwo { out: CombineRows::Bf16(slice(0x1000_0000, rows * D_V)), ..m })), "out");
        assert_eq!(err_arg(check(MergeTwo { lse: slice(0x2000_0004, rows), ..m })), "lse");
        // bf16 inputs: a bf16 out may be exactly one of them, an fp32 out over their bytes may not
        let (a16, b16) =
            (CombineRows::Bf16(slice(0x1000_0000, rows * D_V)), CombineRows::Bf16(slice(0x3000_0000, rows * D_V)));
        let h = MergeTwo { out_a: a16, out_b: b16, ..m };
        assert!(check(h).is_ok());
        assert!(check(MergeTwo { out: b16, ..h }).is_ok());
        assert_eq!(err_arg(check(MergeTwo { out: CombineRows::F32(slice(0x1000_0000, rows * D_V)), ..h })), "out");
        // the two inputs share one dtype
        assert_eq!(err_arg(check(MergeTwo { out_b: b16, ..m })), "out_b");
        // a bf16 input too short for its rows, by its own element size
        assert_eq!(
            err_arg(check(MergeTwo { out_a: CombineRows::Bf16(slice(0x1000_0000, rows * D_V - 1)), ..h })),
            "out_a"
        );
        // rows·512 wraps (a C caller's size, on trust): refused by name, not a panic or a tiny size
        assert_eq!(err_arg(check(MergeTwo { rows: usize::MAX / 256, ..m })), "rows");
        // sinks: H values dividing the rows, apart from what the merge writes
        let sink = |ptr, n| Some(slice::<f32>(ptr, n));
        assert!(check(MergeTwo { sink: sink(0x7000_0000, 2), ..m }).is_ok());
        let p = validate_merge_two(&MergeTwo { sink: sink(0x7000_0000, 2), ..m }).unwrap().0;
        assert_eq!((p.sink, p.sink_heads), (0x7000_0000, 2));
        assert_eq!(err_arg(check(MergeTwo { sink: sink(0x7000_0000, 3), ..m })), "sink");
        assert_eq!(err_arg(check(MergeTwo { sink: sink(0x7000_0000, 0), ..m })), "sink");
        assert_eq!(err_arg(check(MergeTwo { sink: sink(0x6000_0000, 2), ..m })), "sink");
        assert_eq!(err_arg(check(MergeTwo { sink: sink(0x7000_0002, 2), ..m })), "sink");
    }

    #[test]
    fn slots_must_be_aligned_and_large_enough() {
        let grp = |dcp_size, num_tokens, local_heads| CombineGroup { num_tokens, local_heads, dcp_size };
        let buf = slice::<u8>(0x1000_0000, 1 << 20);
        assert!(check_slots("send", &buf, a2a_slot_bytes(4, 8), grp(2, 4, 8)).is_ok());
        let e = check_slots("send", &buf, a2a_slot_bytes(1, 2), grp(2, 1, 2)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: "slot_bytes", .. }), "{e}");
        let e = check_slots("send", &buf, a2a_slot_bytes(4, 8) - 16, grp(2, 4, 8)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: "slot_bytes", .. }), "{e}");
        let e = check_slots("recv", &slice::<u8>(0x1000_0000, 100), a2a_slot_bytes(4, 8), grp(2, 4, 8)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: "recv", .. }), "{e}");
    }

    #[test]
    fn in_place_merge_is_exact_aliasing_only() {
        let a = Extent { ptr: 0x1000, bytes: 4096 };
        assert!(same_or_disjoint("out", a, "out_a", a).is_ok());
        assert!(same_or_disjoint("out", a, "out_a", Extent { ptr: 0x2000, bytes: 4096 }).is_ok());
        assert!(same_or_disjoint("out", a, "out_a", Extent { ptr: 0x1800, bytes: 4096 }).is_err());
        assert!(disjoint("out", a, "lse", Extent { ptr: 0x1ffc, bytes: 4 }).is_err());
        assert!(disjoint("out", a, "lse", Extent { ptr: 0x2000, bytes: 4 }).is_ok());
        assert!(disjoint("out", Extent { ptr: 0x1000, bytes: 0 }, "lse", a).is_ok());
    }
}
