//! Launches from torch tensors read natively: the hot decode entry points without ctypes.
//!
//! `dcp_mla.ops` builds each operation's argument struct in Python (every tensor's pointer,
//! element count, dtype code and strides) and calls the C ABI through ctypes: ~6 µs of Python a
//! decode launch, most of it torch's per-attribute calls (`data_ptr`, `stride`, `shape`,
//! `is_contiguous`, each 0.1-0.25 µs). Here the same struct is filled from DLPack's C exchange
//! API, which torch (≥ 2.11) publishes as the `__dlpack_c_exchange_api__` capsule of
//! `torch.Tensor`: `dltensor_from_py_object_no_sync` fills a borrowed `DLTensor` (data pointer,
//! device, dtype, shape and strides pointing into the tensor itself) in tens of nanoseconds, and
//! `current_work_stream` gives torch's current stream of a device.
//!
//! The rules are ops.py's, value for value (`_tv`, `_t`, `_t1`, `_cache_t`, `_extent`, the
//! dtype codes): python/tests/test_native_launch.py fills both for the same tensors and
//! compares the structs byte for byte. Anything this path does not know (another dtype, a
//! tensor it cannot read, a negative stride, a scalar out of its field's range, a device whose
//! handle Python has not registered) returns FALLBACK, and ops.py takes its own path, which
//! raises the error naming the argument. The C ABI checks every launch either way.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use dcp_mla_ffi::{
    dcp_mla_launch_decode_dense, dcp_mla_launch_decode_sparse, DcpMlaDecodeDenseArgs, DcpMlaDecodeSparseArgs,
    DcpMlaDevice, DcpMlaTensor,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// What a native launch returns when it leaves the call to ops.py's own path.
pub const FALLBACK: i32 = -1;

// --- DLPack (dlpack.h, version 1.2 and later): the structs this path reads ----------------------

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct ExchangeApiHeader {
    version: DlPackVersion,
    prev_api: *mut ExchangeApiHeader,
}

type FromPyObject = unsafe extern "C" fn(py_object: *mut c_void, out: *mut DlTensor) -> c_int;
type CurrentStream = unsafe extern "C" fn(device_type: i32, device_id: i32, out: *mut *mut c_void) -> c_int;

/// DLPackExchangeAPI: the header, then five function pointers (this path calls two of them).
#[repr(C)]
struct ExchangeApi {
    header: ExchangeApiHeader,
    managed_tensor_allocator: *const c_void,
    managed_tensor_from_py_object_no_sync: *const c_void,
    managed_tensor_to_py_object_no_sync: *const c_void,
    dltensor_from_py_object_no_sync: Option<FromPyObject>,
    current_work_stream: Option<CurrentStream>,
}

const DL_CUDA: i32 = 2;
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_FLOAT8_E4M3FN: u8 = 10;

// The header's DCP_MLA_DTYPE_* codes.
const DTYPE_U8: i32 = 1;
const DTYPE_BF16: i32 = 2;
const DTYPE_F32: i32 = 3;
const DTYPE_I32: i32 = 4;

/// The exchange API torch published (null until `bind_tensor_api`).
static API: AtomicPtr<ExchangeApi> = AtomicPtr::new(std::ptr::null_mut());

/// The library's handle of each CUDA device ordinal, as ops.py's `_device` opened it (0: not yet).
const MAX_DEVICES: usize = 64;
static DEVICES: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

/// Binds the exchange API from `torch.Tensor.__dlpack_c_exchange_api__` (a capsule named
/// "dlpack_exchange_api"); returns its DLPack version (major, minor). Refuses a capsule of
/// another name, another major version or without the two functions this path calls.
#[pyfunction]
pub fn bind_tensor_api(capsule: &Bound<'_, PyAny>) -> PyResult<(u32, u32)> {
    const NAME: &CStr = c"dlpack_exchange_api";
    // SAFETY: PyCapsule_GetPointer checks the object is a capsule of this name (else it sets
    // an error and returns null); the capsule's pointer is torch's static exchange table.
    let api = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), NAME.as_ptr() as *const c_char) };
    if api.is_null() {
        return Err(PyErr::take(capsule.py())
            .unwrap_or_else(|| PyValueError::new_err("bind_tensor_api: the capsule holds no pointer")));
    }
    let api = api as *mut ExchangeApi;
    // SAFETY: a capsule of this name holds a DLPackExchangeAPI, whose header is stable across
    // versions; the function pointers are read only after the major version is checked.
    let (major, minor) = unsafe { ((*api).header.version.major, (*api).header.version.minor) };
    if major != 1 {
        return Err(PyValueError::new_err(format!("bind_tensor_api: DLPack {major}.{minor}, this reads 1.x")));
    }
    // SAFETY: as above, a 1.x table.
    let complete = unsafe { (*api).dltensor_from_py_object_no_sync.is_some() && (*api).current_work_stream.is_some() };
    if !complete {
        return Err(PyValueError::new_err(
            "bind_tensor_api: the table lacks dltensor_from_py_object_no_sync or current_work_stream",
        ));
    }
    API.store(api, Ordering::Release);
    Ok((major, minor))
}

/// Records the library's handle of device `index` (ops.py's `_device`, which keeps it open).
#[pyfunction]
pub fn register_device(index: usize, handle: usize) -> PyResult<()> {
    let slot = DEVICES
        .get(index)
        .ok_or_else(|| PyValueError::new_err(format!("register_device: index {index} ≥ {MAX_DEVICES}")))?;
    slot.store(handle, Ordering::Release);
    Ok(())
}

/// Torch's current stream of CUDA device `index` as the exchange API reports it (the stream a
/// native launch goes to), or None when no API is bound or it fails.
#[pyfunction]
pub fn current_stream(py: Python<'_>, index: i32) -> Option<usize> {
    stream(py, bound_api()?, index)
}

fn bound_api() -> Option<&'static ExchangeApi> {
    let api = API.load(Ordering::Acquire);
    // SAFETY: only bind_tensor_api stores it, after checking the table; torch's table is static.
    (!api.is_null()).then(|| unsafe { &*api })
}

/// Torch's current stream of CUDA device `index`; None (the error torch set cleared) on failure.
fn stream(py: Python<'_>, api: &ExchangeApi, index: i32) -> Option<usize> {
    let f = api.current_work_stream?;
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: torch's function writes one pointer; a failure returns nonzero with an error set.
    if unsafe { f(DL_CUDA, index, &mut out) } != 0 {
        PyErr::take(py);
        return None;
    }
    Some(out as usize)
}

// --- one tensor argument ----------------------------------------------------------------------

/// A tensor argument as DLPack reports it: its data pointer, device, dtype code and dims.
struct View {
    data: usize,
    device: DlDevice,
    dtype: DlDataType,
    code: i32,
    dims: [(usize, usize); 8],
    ndim: usize,
    numel: usize,
    extent: usize,
}

impl View {
    fn shape(&self, i: usize) -> Option<usize> {
        (i < self.ndim).then(|| self.dims[i].0)
    }

    fn stride(&self, i: usize) -> Option<usize> {
        (i < self.ndim).then(|| self.dims[i].1)
    }

    fn numel(&self) -> usize {
        self.numel
    }

    /// torch's is_contiguous: row-major strides over the dims of size other than 1 (an empty
    /// tensor is contiguous).
    fn contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut want = 1usize;
        for &(size, stride) in self.dims[..self.ndim].iter().rev() {
            if size != 1 {
                if stride != want {
                    return false;
                }
                want *= size;
            }
        }
        true
    }

    /// ops.py's `_extent`: the elements from the first to the last one its shape and strides
    /// reach (worked out, overflow-checked, when the view is read).
    fn extent(&self) -> usize {
        self.extent
    }

    fn tensor(&self, numel: usize, num_strides: u32, strides: [usize; 4]) -> DcpMlaTensor {
        DcpMlaTensor { data: self.data as *mut c_void, numel, dtype: self.code, num_strides, strides }
    }

    /// ops.py's `_t`: no strides.
    fn plain(&self) -> DcpMlaTensor {
        let n = if self.contiguous() { self.numel() } else { self.extent() };
        self.tensor(n, 0, [0; 4])
    }

    /// ops.py's `_tv(x, n)`: none when contiguous, else the first n strides, 0 for a dim of 1.
    fn strided(&self, n: usize) -> Option<DcpMlaTensor> {
        if self.contiguous() {
            return Some(self.tensor(self.numel(), 0, [0; 4]));
        }
        if self.ndim < n {
            return None;
        }
        let mut st = [0usize; 4];
        for (i, s) in st.iter_mut().enumerate().take(n) {
            let (size, stride) = self.dims[i];
            *s = if size > 1 { stride } else { 0 };
        }
        Some(self.tensor(self.extent(), n as u32, st))
    }

    /// ops.py's `_t1`: the row stride always given.
    fn rows(&self) -> Option<DcpMlaTensor> {
        let n = if self.contiguous() { self.numel() } else { self.extent() };
        Some(self.tensor(n, 1, [self.stride(0)?, 0, 0, 0]))
    }

    /// ops.py's `_cache_t`: a page stride only when the pages are not packed.
    fn pages(&self) -> Option<DcpMlaTensor> {
        if self.contiguous() {
            return Some(self.tensor(self.numel(), 0, [0; 4]));
        }
        let pages = self.shape(0)?;
        if pages <= 1 || self.stride(0)? == self.shape(1)? * self.shape(2)? {
            return Some(self.tensor(self.extent(), 0, [0; 4]));
        }
        Some(self.tensor(self.extent(), 1, [self.stride(0)?, 0, 0, 0]))
    }
}

fn dtype_code(t: DlDataType) -> Option<i32> {
    if t.lanes != 1 {
        return None;
    }
    match (t.code, t.bits) {
        (DL_BFLOAT, 16) => Some(DTYPE_BF16),
        (DL_FLOAT, 32) => Some(DTYPE_F32),
        (DL_INT, 32) => Some(DTYPE_I32),
        (DL_UINT, 8) | (DL_INT, 8) | (DL_FLOAT8_E4M3FN, 8) => Some(DTYPE_U8),
        _ => None,
    }
}

/// Reads one tensor through the exchange API; None (any error cleared) for an object it cannot
/// read, a dtype without a code, more than 8 dims or a negative stride.
fn view(api: &ExchangeApi, x: &Bound<'_, PyAny>) -> Option<View> {
    let f = api.dltensor_from_py_object_no_sync?;
    let mut dl = DlTensor {
        data: std::ptr::null_mut(),
        device: DlDevice { device_type: 0, device_id: 0 },
        ndim: 0,
        dtype: DlDataType { code: 0, bits: 0, lanes: 0 },
        shape: std::ptr::null(),
        strides: std::ptr::null(),
        byte_offset: 0,
    };
    // SAFETY: the object is borrowed for this call; torch fills `dl` with pointers into the
    // tensor, valid while it lives (the caller holds it), or returns nonzero with an error set.
    if unsafe { f(x.as_ptr() as *mut c_void, &mut dl) } != 0 {
        PyErr::take(x.py());
        return None;
    }
    let ndim = usize::try_from(dl.ndim).ok().filter(|&n| n <= 8)?;
    let mut dims = [(0usize, 0usize); 8];
    // numel, and the extent (1 + Σ (size − 1)·stride, 0 when empty), in i64 with overflow checks
    // (ops.py's values would not pack into the struct either)
    let (mut numel, mut extent) = (1i64, 1i64);
    for i in (0..ndim).rev() {
        // SAFETY: shape and strides (null: compact row-major) hold ndim entries.
        let size = unsafe { *dl.shape.add(i) };
        let stride = if dl.strides.is_null() { numel } else { unsafe { *dl.strides.add(i) } };
        dims[i] = (usize::try_from(size).ok()?, usize::try_from(stride).ok()?);
        numel = numel.checked_mul(size)?;
        extent = extent.checked_add((size - 1).max(0).checked_mul(stride)?)?;
    }
    if numel == 0 {
        extent = 0;
    }
    Some(View {
        data: (dl.data as usize).checked_add(usize::try_from(dl.byte_offset).ok()?)?,
        device: dl.device,
        dtype: dl.dtype,
        code: dtype_code(dl.dtype)?,
        dims,
        ndim,
        numel: usize::try_from(numel).ok()?,
        extent: usize::try_from(extent).ok()?,
    })
}

fn optional(api: &ExchangeApi, x: &Bound<'_, PyAny>) -> Option<Option<View>> {
    if x.is_none() {
        Some(None)
    } else {
        view(api, x).map(Some)
    }
}

fn size(v: i64) -> Option<usize> {
    usize::try_from(v).ok()
}

fn code(v: i64) -> Option<i32> {
    i32::try_from(v).ok()
}

/// The scale as the struct's f32, refusing a finite double it cannot hold (Python's struct
/// refuses those too, and ops.py's path names the field).
fn scale_f32(v: f64) -> Option<f32> {
    let s = v as f32;
    (s.is_finite() || !v.is_finite()).then_some(s)
}

/// The device and stream of a launch on q's device: None off CUDA, for an ordinal without a
/// registered handle, or when torch reports no stream.
fn device_stream(py: Python<'_>, api: &ExchangeApi, q: &View) -> Option<(*const DcpMlaDevice, *mut c_void)> {
    if q.device.device_type != DL_CUDA {
        return None;
    }
    let handle = DEVICES.get(usize::try_from(q.device.device_id).ok()?)?.load(Ordering::Acquire);
    if handle == 0 {
        return None;
    }
    Some((handle as *const DcpMlaDevice, stream(py, api, q.device.device_id)? as *mut c_void))
}

// --- the entry points -------------------------------------------------------------------------

/// A struct's address handed to the launch with the GIL released.
struct SendPtr<T>(*const T);
// SAFETY: the struct is read by the launch on this thread only, while the caller holds it and
// every tensor it points into.
unsafe impl<T> Send for SendPtr<T> {}

/// Copies the filled struct into `dst` (ops.py's struct of this operation for this thread, so
/// that `_last_launch` finds this launch's arguments as after a ctypes launch), then, unless
/// `fill_only`, launches it from there through `f`. FALLBACK when `dst_size` is not the
/// struct's size; 0 for a fill alone.
fn write_and_launch<T>(
    py: Python<'_>,
    f: unsafe extern "C" fn(*const T) -> dcp_mla_ffi::DcpMlaStatus,
    args: T,
    dst: usize,
    dst_size: usize,
    fill_only: bool,
) -> i32 {
    if dst == 0 || dst_size != size_of::<T>() {
        return FALLBACK;
    }
    // SAFETY: `dst` is the address of ops.py's ctypes struct of this entry point (dst_size
    // bytes, the struct's own layout, checked field by field against the header by the tests),
    // which lives as long as its thread.
    unsafe { (dst as *mut T).write_unaligned(args) };
    if fill_only {
        return 0;
    }
    launch_at(py, f, dst as *const T)
}

/// Launches the struct at `args` through `f` with the GIL released, as ctypes' CDLL calls do.
fn launch_at<T>(py: Python<'_>, f: unsafe extern "C" fn(*const T) -> dcp_mla_ffi::DcpMlaStatus, args: *const T) -> i32 {
    let args = SendPtr(args);
    py.detach(move || {
        let a = args;
        // SAFETY: a struct of the entry point's own type, held by the caller.
        unsafe { f(a.0) as i32 }
    })
}

/// ops.py's `_decode_dense` struct, filled from the tensors (None: FALLBACK). `dev_stream`
/// overrides the device and stream (the tests fill structs of CPU tensors with stand-ins).
#[allow(clippy::too_many_arguments)]
fn dense_args(
    api: &ExchangeApi,
    dev_stream: Option<(*const DcpMlaDevice, *mut c_void)>,
    [q, cache, block_table, lens, out, lse, workspace, sink]: [&Bound<'_, PyAny>; 8],
    scale: f64,
    [num_splits, schedule, lens_rule, empty_lse_inf, dcp_size, interleave, rank]: [i64; 7],
) -> Option<DcpMlaDecodeDenseArgs> {
    let qv = view(api, q)?;
    let (device, stream) = match dev_stream {
        Some(ds) => ds,
        None => device_stream(q.py(), api, &qv)?,
    };
    let cv = view(api, cache)?;
    let tv = view(api, block_table)?;
    if qv.ndim != 4 {
        return None;
    }
    Some(DcpMlaDecodeDenseArgs {
        struct_size: size_of::<DcpMlaDecodeDenseArgs>(),
        device,
        stream,
        q: qv.strided(3)?,
        out: view(api, out)?.strided(3)?,
        lse: view(api, lse)?.strided(3)?,
        workspace: optional(api, workspace)?.map_or_else(DcpMlaTensor::default, |v| v.plain()),
        cache: cv.pages()?,
        block_table: tv.rows()?,
        lens: view(api, lens)?.strided(2)?,
        sink: optional(api, sink)?.map_or_else(DcpMlaTensor::default, |v| v.plain()),
        batch: qv.dims[0].0,
        num_q: qv.dims[1].0,
        heads: qv.dims[2].0,
        num_splits: size(num_splits)?,
        num_pages: cv.shape(0)?,
        block_size: cv.shape(1)?,
        max_pages: tv.shape(1)?,
        dcp_size: size(dcp_size)?,
        interleave: size(interleave)?,
        rank: size(rank)?,
        scale: scale_f32(scale)?,
        schedule: code(schedule)?,
        lens_rule: code(lens_rule)?,
        empty_lse_inf: code(empty_lse_inf)?,
    })
}

/// ops.py's `_decode_sparse` struct, filled from the tensors (None: FALLBACK).
fn sparse_args(
    api: &ExchangeApi,
    dev_stream: Option<(*const DcpMlaDevice, *mut c_void)>,
    [q, cache, indices, topk_len, out, lse, workspace, sink]: [&Bound<'_, PyAny>; 8],
    scale: f64,
    [fmt, num_splits, schedule, empty_lse_inf]: [i64; 4],
) -> Option<DcpMlaDecodeSparseArgs> {
    let qv = view(api, q)?;
    let (device, stream) = match dev_stream {
        Some(ds) => ds,
        None => device_stream(q.py(), api, &qv)?,
    };
    let cv = view(api, cache)?;
    let iv = view(api, indices)?;
    if qv.ndim != 4 || iv.ndim == 0 {
        return None;
    }
    Some(DcpMlaDecodeSparseArgs {
        struct_size: size_of::<DcpMlaDecodeSparseArgs>(),
        device,
        stream,
        q: qv.strided(3)?,
        out: view(api, out)?.strided(3)?,
        lse: view(api, lse)?.strided(3)?,
        workspace: optional(api, workspace)?.map_or_else(DcpMlaTensor::default, |v| v.plain()),
        cache: cv.pages()?,
        indices: iv.strided(2)?,
        topk_len: match optional(api, topk_len)? {
            Some(v) => v.strided(2)?,
            None => DcpMlaTensor::default(),
        },
        sink: optional(api, sink)?.map_or_else(DcpMlaTensor::default, |v| v.plain()),
        batch: qv.dims[0].0,
        num_q: qv.dims[1].0,
        heads: qv.dims[2].0,
        num_splits: size(num_splits)?,
        num_pages: cv.shape(0)?,
        block_size: cv.shape(1)?,
        topk: iv.dims[iv.ndim - 1].0,
        scale: scale_f32(scale)?,
        schedule: code(schedule)?,
        format: code(fmt)?,
        empty_lse_inf: code(empty_lse_inf)?,
    })
}

/// `dcp_mla_launch_decode_dense` from torch tensors on q's device and torch's current stream
/// there, the arguments as ops.py's `_decode_dense` takes them after `dst` and `dst_size` (the
/// address and size of ops.py's struct of this entry point for this thread, which receives the
/// filled struct): the launch's status, or FALLBACK. `stand_in`, for the tests: a (device,
/// stream) pair put in the struct instead of q's, with tensors on any device; the struct is
/// filled into `dst` and not launched (0).
#[pyfunction]
#[pyo3(signature = (dst, dst_size, q, cache, block_table, lens, out, lse, workspace, sink, scale, num_splits,
                    schedule, lens_rule, empty_lse_inf, dcp_size, interleave, rank, stand_in=None))]
#[allow(clippy::too_many_arguments)]
pub fn decode_dense(
    py: Python<'_>,
    dst: usize,
    dst_size: usize,
    q: &Bound<'_, PyAny>,
    cache: &Bound<'_, PyAny>,
    block_table: &Bound<'_, PyAny>,
    lens: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    workspace: &Bound<'_, PyAny>,
    sink: &Bound<'_, PyAny>,
    scale: f64,
    num_splits: i64,
    schedule: i64,
    lens_rule: i64,
    empty_lse_inf: i64,
    dcp_size: i64,
    interleave: i64,
    rank: i64,
    stand_in: Option<(usize, usize)>,
) -> i32 {
    let Some(api) = bound_api() else { return FALLBACK };
    let tensors = [q, cache, block_table, lens, out, lse, workspace, sink];
    let scalars = [num_splits, schedule, lens_rule, empty_lse_inf, dcp_size, interleave, rank];
    match dense_args(api, stand_in.map(stand_in_ptrs), tensors, scale, scalars) {
        Some(a) => write_and_launch(py, dcp_mla_launch_decode_dense, a, dst, dst_size, stand_in.is_some()),
        None => FALLBACK,
    }
}

/// `dcp_mla_launch_decode_sparse` from torch tensors, as `decode_dense` (`stand_in` too).
#[pyfunction]
#[pyo3(signature = (dst, dst_size, q, cache, indices, topk_len, out, lse, workspace, sink, scale, fmt, num_splits,
                    schedule, empty_lse_inf, stand_in=None))]
#[allow(clippy::too_many_arguments)]
pub fn decode_sparse(
    py: Python<'_>,
    dst: usize,
    dst_size: usize,
    q: &Bound<'_, PyAny>,
    cache: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    topk_len: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    workspace: &Bound<'_, PyAny>,
    sink: &Bound<'_, PyAny>,
    scale: f64,
    fmt: i64,
    num_splits: i64,
    schedule: i64,
    empty_lse_inf: i64,
    stand_in: Option<(usize, usize)>,
) -> i32 {
    let Some(api) = bound_api() else { return FALLBACK };
    let tensors = [q, cache, indices, topk_len, out, lse, workspace, sink];
    let scalars = [fmt, num_splits, schedule, empty_lse_inf];
    match sparse_args(api, stand_in.map(stand_in_ptrs), tensors, scale, scalars) {
        Some(a) => write_and_launch(py, dcp_mla_launch_decode_sparse, a, dst, dst_size, stand_in.is_some()),
        None => FALLBACK,
    }
}

/// A test's (device, stream) stand-ins as the struct's pointers.
fn stand_in_ptrs((device, stream): (usize, usize)) -> (*const DcpMlaDevice, *mut c_void) {
    (device as *const DcpMlaDevice, stream as *mut c_void)
}

// --- replays of a remembered launch (ops.py's `_replay`) ---------------------------------------

/// The key of an ops-level replay: each of `tensors` (None: absent) as its dims, shape, strides,
/// DLPack dtype and device, in bytes; None where one cannot be read (ops.py then keys in Python,
/// `_fastlaunch.ops_key`: shape, strides, dtype and device, the same facts).
#[pyfunction]
pub fn tensor_key(tensors: &Bound<'_, PyTuple>) -> Option<Vec<u8>> {
    let api = bound_api()?;
    let mut key = Vec::with_capacity(tensors.len() * 80);
    for x in tensors.iter() {
        if x.is_none() {
            key.push(0xff);
            continue;
        }
        let v = view(api, &x)?;
        key.push(v.ndim as u8);
        key.extend_from_slice(&v.device.device_type.to_le_bytes());
        key.extend_from_slice(&v.device.device_id.to_le_bytes());
        key.extend_from_slice(&[v.dtype.code, v.dtype.bits]);
        key.extend_from_slice(&v.dtype.lanes.to_le_bytes());
        for &(size, stride) in &v.dims[..v.ndim] {
            key.extend_from_slice(&(size as u64).to_le_bytes());
            key.extend_from_slice(&(stride as u64).to_le_bytes());
        }
    }
    Some(key)
}

/// Replays a remembered decode launch: writes the data pointers of its eight tensors (q, out,
/// lse, workspace, cache, block_table or indices, lens or topk_len, sink) into the struct at
/// `buf` (a cached copy, `size` bytes) and launches it (`sparse`: decode_sparse's struct and
/// entry point, else decode_dense's). An absent tensor (None) writes 0, or with `keep_absent`
/// leaves its word as the checked call filled it: `_fastlaunch`'s `OpLaunch.write` and
/// `Launch.write` (the FlashMLA face's, which passes no workspace: its metadata's stays) then
/// `call`, without their per-tensor Python calls. The launch's status, or FALLBACK (a tensor it
/// cannot read, another size: the caller then writes and calls through ctypes).
#[pyfunction]
#[pyo3(signature = (sparse, buf, size, tensors, keep_absent=false))]
pub fn replay_decode(
    py: Python<'_>,
    sparse: bool,
    buf: usize,
    size: usize,
    tensors: &Bound<'_, PyTuple>,
    keep_absent: bool,
) -> i32 {
    use std::mem::offset_of;
    let Some(api) = bound_api() else { return FALLBACK };
    if buf == 0 || tensors.len() != 8 {
        return FALLBACK;
    }
    let mut data = [None; 8];
    for (d, x) in data.iter_mut().zip(tensors.iter()) {
        if !x.is_none() {
            match view(api, &x) {
                Some(v) => *d = Some(v.data),
                None => return FALLBACK,
            }
        }
    }
    if sparse {
        type A = DcpMlaDecodeSparseArgs;
        let fields = [
            offset_of!(A, q),
            offset_of!(A, out),
            offset_of!(A, lse),
            offset_of!(A, workspace),
            offset_of!(A, cache),
            offset_of!(A, indices),
            offset_of!(A, topk_len),
            offset_of!(A, sink),
        ];
        replay_at(py, dcp_mla_launch_decode_sparse, buf, size, fields, data, keep_absent)
    } else {
        type A = DcpMlaDecodeDenseArgs;
        let fields = [
            offset_of!(A, q),
            offset_of!(A, out),
            offset_of!(A, lse),
            offset_of!(A, workspace),
            offset_of!(A, cache),
            offset_of!(A, block_table),
            offset_of!(A, lens),
            offset_of!(A, sink),
        ];
        replay_at(py, dcp_mla_launch_decode_dense, buf, size, fields, data, keep_absent)
    }
}

/// Writes `data[i]` as the data pointer of the tensor field at byte offset `fields[i]` of the
/// struct at `buf` (an absent one: 0, or left as it is with `keep_absent`) and launches it
/// through `f`; FALLBACK when `size` is not the struct's.
fn replay_at<T>(
    py: Python<'_>,
    f: unsafe extern "C" fn(*const T) -> dcp_mla_ffi::DcpMlaStatus,
    buf: usize,
    size: usize,
    fields: [usize; 8],
    data: [Option<usize>; 8],
    keep_absent: bool,
) -> i32 {
    if size != size_of::<T>() {
        return FALLBACK;
    }
    let at = std::mem::offset_of!(DcpMlaTensor, data);
    for (field, d) in fields.into_iter().zip(data) {
        if d.is_none() && keep_absent {
            continue;
        }
        // SAFETY: `buf` is the address of the caller's cached struct of this entry point (`size`
        // bytes, checked), which its OpLaunch or Launch holds; a DcpMlaTensor's `data` is
        // pointer-aligned within it.
        unsafe { ((buf as *mut u8).add(field + at) as *mut usize).write(d.unwrap_or(0)) };
    }
    launch_at(py, f, buf as *const T)
}
