//! The DCP group over NCCL: one communicator of D ranks (one process or thread per GPU) and the
//! collectives of a decode step. Every collective is enqueued on the caller's stream, allocates
//! nothing and never synchronises, so a step that uses them can be captured in a CUDA graph.

use crate::error::{Error, Result};
use crate::formats::D_QK;
use crate::ops::product;
use crate::runtime::{Device, DeviceSlice, Stream};
use cudarc::driver::{sys as cu_sys, CudaContext};
use cudarc::nccl::{result as nccl, sys, NcclType};
use half::bf16;
use std::ffi::c_void;
use std::sync::Arc;

/// Whether an NCCL library can be loaded on this machine (cudarc panics on the first NCCL call
/// without one; every constructor here checks first and returns [`Error::NoNccl`]).
pub fn nccl_present() -> bool {
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

fn nccl_err(call: &'static str) -> impl FnOnce(nccl::NcclError) -> Error {
    move |e| Error::Nccl { call, code: format!("{:?}", e.0) }
}

/// The NCCL unique id that rank 0 (or a launcher) creates and every rank passes to
/// [`DcpGroup::from_unique_id`]; 128 opaque bytes, safe to ship through a file or a socket.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(..)")
    }
}

impl UniqueId {
    /// A fresh id. The process that creates it hosts NCCL's bootstrap root, so it must live
    /// until every rank has joined.
    pub fn new() -> Result<Self> {
        if !nccl_present() {
            return Err(Error::NoNccl);
        }
        let id = nccl::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    /// Reads an id back from the 128 bytes of [`UniqueId::0`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let b: [u8; 128] =
            bytes.try_into().map_err(|_| Error::arg("unique_id", format!("holds {} bytes, not 128", bytes.len())))?;
        Ok(UniqueId(b))
    }
}

/// One rank of a DCP group: an NCCL communicator of `size` ranks on the device it was created on.
pub struct DcpGroup {
    comm: sys::ncclComm_t,
    ctx: Arc<CudaContext>,
    rank: usize,
    size: usize,
    /// Whether this object created the communicator (and destroys it when dropped).
    owned: bool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; &self methods
// only enqueue work and the driver context is bound before every call.
unsafe impl Send for DcpGroup {}
unsafe impl Sync for DcpGroup {}

impl std::fmt::Debug for DcpGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcpGroup").field("rank", &self.rank).field("size", &self.size).finish()
    }
}

impl Drop for DcpGroup {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: the communicator was created by this object and is destroyed once.
            let _ = unsafe { nccl::comm_destroy(self.comm) };
        }
    }
}

impl DcpGroup {
    /// Joins rank `rank` of a group of `size` on `dev` (one process per GPU, as engines run).
    /// Blocks until all `size` ranks have joined. Without libnccl: [`Error::NoNccl`].
    pub fn from_unique_id(dev: &Device, id: &UniqueId, rank: usize, size: usize) -> Result<Self> {
        ensure_arg!(size >= 1, "size", "must be at least 1");
        ensure_arg!(rank < size, "rank", "{rank} is not below the group size {size}");
        if !nccl_present() {
            return Err(Error::NoNccl);
        }
        let ctx = dev.context().clone();
        ctx.bind_to_thread().map_err(|source| Error::Driver { call: "cuCtxSetCurrent", source })?;
        let uid = sys::ncclUniqueId { internal: id.0.map(|b| b as std::ffi::c_char) };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out pointer; the id came from ncclGetUniqueId.
        unsafe { nccl::comm_init_rank(&mut comm, size as i32, uid, rank as i32) }
            .map_err(nccl_err("ncclCommInitRank"))?;
        Ok(DcpGroup { comm, ctx, rank, size, owned: true })
    }

    /// Wraps an existing communicator (an engine's DCP process group). It is borrowed: never
    /// destroyed here. Its rank and size are read from NCCL.
    ///
    /// # Safety
    /// `comm` must be a live `ncclComm_t` whose device is `dev`, and must outlive the group.
    pub unsafe fn from_raw_comm(dev: &Device, comm: *mut c_void) -> Result<Self> {
        ensure_arg!(!comm.is_null(), "comm", "is null");
        if !nccl_present() {
            return Err(Error::NoNccl);
        }
        let comm = comm as sys::ncclComm_t;
        let size = nccl::comm_count(comm).map_err(nccl_err("ncclCommCount"))? as usize;
        let rank = nccl::comm_user_rank(comm).map_err(nccl_err("ncclCommUserRank"))? as usize;
        let device = nccl::comm_cu_device(comm).map_err(nccl_err("ncclCommCuDevice"))? as usize;
        let ordinal = dev.context().ordinal();
        ensure_arg!(device == ordinal, "comm", "lives on device {device}, not on device {ordinal}");
        Ok(DcpGroup { comm, ctx: dev.context().clone(), rank, size, owned: false })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// D.
    pub fn size(&self) -> usize {
        self.size
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|source| Error::Driver { call: "cuCtxSetCurrent", source })
    }

    /// Enqueues the NCCL collective `f` (named `call` in its error) over `n` elements on this
    /// group's device; nothing for `n == 0`.
    fn enqueue(
        &self,
        n: usize,
        call: &'static str,
        f: impl FnOnce() -> std::result::Result<nccl::NcclStatus, nccl::NcclError>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        f().map_err(nccl_err(call))?;
        Ok(())
    }

    /// All-gather: `recv` \[D, n\] receives every rank's `send` \[n\] in rank order. `send` may be
    /// exactly this rank's slot of `recv` (in place).
    pub fn all_gather<T: NcclType>(
        &self,
        stream: Stream,
        send: DeviceSlice<T>,
        recv: DeviceSlice<T>,
        n: usize,
    ) -> Result<()> {
        let need = product("n", &[n, self.size])?;
        // NCCL's in-place form: `send` is this rank's slot of `recv`.
        let in_place = slot_addr(&recv, self.rank, n) == Some(send.ptr());
        check_send_recv(&send, n, &recv, need, in_place)?;
        // SAFETY: both buffers were checked to hold what NCCL reads and writes.
        self.enqueue(n, "ncclAllGather", || unsafe {
            nccl::all_gather(send.ptr() as _, recv.ptr() as _, n, T::as_nccl_type(), self.comm, stream.0 as _)
        })
    }

    /// All-gather in place: rank r's data is already at slot r of `buf` [D, n].
    pub fn all_gather_in_place<T: NcclType>(&self, stream: Stream, buf: DeviceSlice<T>, n: usize) -> Result<()> {
        let need = product("n", &[n, self.size])?;
        ensure_arg!(buf.len() >= need, "buf", "holds {} elements but [D, n] needs {need}", buf.len());
        // SAFETY: the slot lies inside `buf`, checked above.
        let own = unsafe { DeviceSlice::from_raw(buf.ptr() + (self.rank * n * std::mem::size_of::<T>()) as u64, n) };
        self.all_gather(stream, own, buf, n)
    }

    /// fp32 sum reduce-scatter: `send` \[D, n\] (block d destined to rank d), `recv` \[n\] receives
    /// the sum over ranks of block `rank`.
    pub fn reduce_scatter_sum(
        &self,
        stream: Stream,
        send: DeviceSlice<f32>,
        recv: DeviceSlice<f32>,
        n: usize,
    ) -> Result<()> {
        let need = product("n", &[n, self.size])?;
        // NCCL's in-place form: `recv` is this rank's slot of `send`.
        let in_place = slot_addr(&send, self.rank, n) == Some(recv.ptr());
        check_send_recv(&send, need, &recv, n, in_place)?;
        let (f32, sum) = (sys::ncclDataType_t::ncclFloat32, sys::ncclRedOp_t::ncclSum);
        // SAFETY: both buffers were checked to hold what NCCL reads and writes.
        self.enqueue(n, "ncclReduceScatter", || unsafe {
            nccl::reduce_scatter(send.ptr() as _, recv.ptr() as _, n, f32, sum, self.comm, stream.0 as _)
        })
    }

    /// All-to-all of byte slots: slot d of `send` [D, slot_bytes] goes to rank d, and slot r of
    /// `recv` [D, slot_bytes] receives what rank r sent here. NCCL has no all-to-all primitive:
    /// this is one group of D sends and D receives (one fused launch).
    pub fn all_to_all_bytes(
        &self,
        stream: Stream,
        send: DeviceSlice<u8>,
        recv: DeviceSlice<u8>,
        slot_bytes: usize,
    ) -> Result<()> {
        let need = product("slot_bytes", &[slot_bytes, self.size])?;
        check_send_recv(&send, need, &recv, need, false)?;
        if slot_bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let mut result = Ok(());
        let (bytes, comm, st) = (sys::ncclDataType_t::ncclUint8, self.comm, stream.0 as _);
        for peer in 0..self.size {
            let (off, to) = ((peer * slot_bytes) as u64, peer as i32);
            // SAFETY: slot `peer` lies inside both buffers (checked above).
            let r = unsafe {
                nccl::send((send.ptr() + off) as _, slot_bytes, bytes, to, comm, st)
                    .map_err(nccl_err("ncclSend"))
                    .and_then(|_| {
                        nccl::recv((recv.ptr() + off) as _, slot_bytes, bytes, to, comm, st)
                            .map_err(nccl_err("ncclRecv"))
                    })
            };
            if r.is_err() {
                result = r.map(|_| ());
                break;
            }
        }
        // The group must be closed whatever happened inside it.
        let end = nccl::group_end().map_err(nccl_err("ncclGroupEnd"));
        result?;
        end?;
        Ok(())
    }

    /// The query-head all-gather of a decode step: every rank's `q_local` [T, H_l, 576] lands in
    /// `staging` [D, T, H_l, 576], then D strided copies interleave it into `q_all` [T, D·H_l, 576]
    /// (head r·H_l + h of the gathered queries is head h of rank r), the layout attention reads.
    pub fn gather_query_heads(
        &self,
        stream: Stream,
        q_local: DeviceSlice<bf16>,
        staging: DeviceSlice<bf16>,
        q_all: DeviceSlice<bf16>,
        rows: usize,
        local_heads: usize,
    ) -> Result<()> {
        let n = product("rows", &[rows, local_heads, D_QK])?;
        let need = product("rows", &[n, self.size])?;
        ensure_arg!(q_all.len() >= need, "q_all", "holds {} values but [T, H, 576] needs {need}", q_all.len());
        self.all_gather(stream, q_local, staging, n)?;
        if n == 0 {
            return Ok(());
        }
        let width = local_heads * D_QK * 2;
        for r in 0..self.size {
            let copy = cu_sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: cu_sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: staging.ptr() + (r * n * 2) as u64,
                srcArray: std::ptr::null_mut(),
                srcPitch: width,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: cu_sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: q_all.ptr() + (r * width) as u64,
                dstArray: std::ptr::null_mut(),
                dstPitch: width * self.size,
                WidthInBytes: width,
                Height: rows,
            };
            // SAFETY: rows × width bytes at pitch `width` lie inside slot r of `staging`, and at
            // pitch D·width inside `q_all` (both checked above).
            unsafe { cu_sys::cuMemcpy2DAsync_v2(&copy, stream.0) }
                .result()
                .map_err(|source| Error::Driver { call: "cuMemcpy2DAsync", source })?;
        }
        Ok(())
    }

    /// The prefix all-gather of a prefill chunk (docs/contract.md §7): every rank's flattened rows
    /// `local` [cap, 576] bf16 land in `gathered` [D, cap, 576], ready for the reorder kernel.
    pub fn gather_prefix(
        &self,
        stream: Stream,
        local: DeviceSlice<bf16>,
        gathered: DeviceSlice<bf16>,
        cap_rows: usize,
    ) -> Result<()> {
        self.all_gather(stream, local, gathered, cap_rows * D_QK)
    }

    /// The candidate all-gather of distributed top-k (docs/contract.md §6): this rank's packed candidates
    /// are already in slot `rank` of `scores` [D, rows, k] fp32 and `ids` [D, rows, k] int32;
    /// both gathers run as one NCCL group.
    pub fn gather_candidates(
        &self,
        stream: Stream,
        scores: DeviceSlice<f32>,
        ids: DeviceSlice<i32>,
        rows: usize,
        k: usize,
    ) -> Result<()> {
        let n = product("rows", &[rows, k])?;
        let need = product("rows", &[n, self.size])?;
        ensure_arg!(ids.len() >= need, "ids", "holds {} values but [D, rows, k] needs {need}", ids.len());
        ensure_arg!(scores.len() >= need, "scores", "holds {} values but [D, rows, k] needs {need}", scores.len());
        self.bind()?;
        nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let a = self.all_gather_in_place(stream, scores, n);
        let b = if a.is_ok() { self.all_gather_in_place(stream, ids, n) } else { Ok(()) };
        let end = nccl::group_end().map_err(nccl_err("ncclGroupEnd"));
        a?;
        b?;
        end?;
        Ok(())
    }
}

/// The address of slot `slot` (of `n` elements each) of `base`; `None` where it overflows (no
/// buffer reaches it).
fn slot_addr<T>(base: &DeviceSlice<T>, slot: usize, n: usize) -> Option<u64> {
    let bytes = (slot as u64).checked_mul(n as u64)?.checked_mul(std::mem::size_of::<T>() as u64)?;
    base.ptr().checked_add(bytes)
}

/// A collective's two buffers: `send` holds the `send_n` elements NCCL reads, `recv` the `recv_n`
/// it writes, and they do not overlap unless `in_place` (the caller found them in the operation's
/// in-place form, the one overlap for which NCCL defines the result).
fn check_send_recv<T>(
    send: &DeviceSlice<T>,
    send_n: usize,
    recv: &DeviceSlice<T>,
    recv_n: usize,
    in_place: bool,
) -> Result<()> {
    ensure_arg!(send.len() >= send_n, "send", "holds {} elements but {send_n} are sent", send.len());
    ensure_arg!(recv.len() >= recv_n, "recv", "holds {} elements but {recv_n} are received", recv.len());
    let size = std::mem::size_of::<T>() as u64;
    let (send_end, recv_end) = (send.ptr() + send_n as u64 * size, recv.ptr() + recv_n as u64 * size);
    let disjoint = send_end <= recv.ptr() || recv_end <= send.ptr();
    ensure_arg!(in_place || disjoint, "recv", "overlaps `send` other than in the collective's in-place form");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_through_bytes() {
        let id = UniqueId([7u8; 128]);
        assert_eq!(UniqueId::from_bytes(&id.0).unwrap(), id);
        assert!(matches!(UniqueId::from_bytes(&[0u8; 12]), Err(Error::InvalidArgument { arg: "unique_id", .. })));
    }

    #[test]
    fn collective_buffers_are_sized_and_disjoint_unless_in_place() {
        use crate::ops::test_util::{arg_of, fake_at};
        let (send, recv) = (fake_at::<f32>(0x1000, 8), fake_at::<f32>(0x2000, 32));
        assert!(check_send_recv(&send, 8, &recv, 32, false).is_ok());
        assert_eq!(arg_of(check_send_recv(&send, 9, &recv, 32, false).unwrap_err()), "send");
        assert_eq!(arg_of(check_send_recv(&send, 8, &recv, 33, false).unwrap_err()), "recv");
        // send inside recv: refused unless it is the in-place form (the caller decides which slot)
        let inside = fake_at::<f32>(0x2000 + 8 * 4, 8);
        assert_eq!(arg_of(check_send_recv(&inside, 8, &recv, 32, false).unwrap_err()), "recv");
        assert!(check_send_recv(&inside, 8, &recv, 32, true).is_ok());
        // the in-place test's address: slot 2 of 8 elements, and an overflowing slot
        assert_eq!(slot_addr(&recv, 2, 8), Some(0x2000 + 2 * 8 * 4));
        assert_eq!(slot_addr(&recv, usize::MAX, 8), None);
        // touching ends do not overlap
        let after = fake_at::<f32>(0x2000 + 32 * 4, 8);
        assert!(check_send_recv(&after, 8, &recv, 32, false).is_ok());
    }

    #[test]
    fn missing_nccl_is_a_typed_error_not_a_panic() {
        if !nccl_present() {
            assert!(matches!(UniqueId::new(), Err(Error::NoNccl)));
        } else {
            assert!(UniqueId::new().is_ok());
        }
    }
}
