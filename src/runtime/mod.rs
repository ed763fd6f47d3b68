//! The runtime layer on cudarc's driver API, loaded with dlopen: open a device, load the
//! embedded kernel modules once, and launch entry points on a caller-supplied stream.

pub mod registry;

use crate::error::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext};
use registry::{KernelId, KERNELS, MODULES};
use std::marker::PhantomData;
use std::sync::Arc;

/// A CUDA device with every kernel module of this build loaded.
pub struct Device {
    ctx: Arc<CudaContext>,
    /// Per entry point (indexed like [`KERNELS`]): its function handle, or why it is unavailable.
    functions: Vec<std::result::Result<sys::CUfunction, String>>,
    /// Per entry point: the dynamic shared memory it has been opted into (0: the default 48 KiB),
    /// so the driver call happens once per size rather than on every launch.
    shared_opt_in: Vec<std::sync::atomic::AtomicU32>,
    compute_capability: (i32, i32),
    /// Read once at open: every launch that leaves the kernel choice to the library asks for it.
    num_sms: usize,
}

// SAFETY: CUfunction handles are immutable driver objects usable from any thread once the
// owning context is current; every launch binds the context first.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ctx.ordinal())
            .field("compute_capability", &self.compute_capability)
            .finish()
    }
}

impl Device {
    /// Opens device `ordinal` and loads every embedded module. Without a driver this returns
    /// [`Error::NoDriver`]; without such a device, [`Error::NoDevice`]. It never panics.
    pub fn open(ordinal: usize) -> Result<Self> {
        // cudarc panics when libcuda cannot be loaded; look for it first.
        let present = std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err(Error::NoDriver);
        }
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| Error::NoDevice { ordinal, reason: "the driver panicked while opening it".into() })?
            .map_err(|e| Error::NoDevice { ordinal, reason: e.to_string() })?;
        let compute_capability =
            ctx.compute_capability().map_err(|source| Error::Driver { call: "cuDeviceGetAttribute", source })?;
        let num_sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|source| Error::Driver { call: "cuDeviceGetAttribute", source })? as usize;
        ctx.bind_to_thread().map_err(|source| Error::Driver { call: "cuCtxSetCurrent", source })?;
        let mut modules = Vec::with_capacity(MODULES.len());
        for m in MODULES {
            // SAFETY: the image is a fatbin produced by nvcc, embedded with 64-byte alignment.
            modules.push(unsafe { cu::module::load_data(m.image.as_ptr().cast()) }.map_err(|e| e.to_string()));
        }
        let functions = KERNELS
            .iter()
            .map(|k| {
                let module =
                    modules[k.module].as_ref().map_err(|e| format!("module `{}` failed to load: {e}", k.family))?;
                let name = std::ffi::CString::new(k.symbol).unwrap();
                // SAFETY: module is a live module handle; the name is NUL-terminated.
                unsafe { cu::module::get_function(*module, name) }.map_err(|e| format!("{}: {e}", k.symbol))
            })
            .collect();
        let shared_opt_in = KERNELS.iter().map(|_| std::sync::atomic::AtomicU32::new(0)).collect();
        Ok(Device { ctx, functions, shared_opt_in, compute_capability, num_sms })
    }

    /// Makes the device's context current on the calling thread: a thread the engine started
    /// may have none, and every launch and `cuTensorMapEncodeTiled` need one.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|source| Error::Driver { call: "cuCtxSetCurrent", source })
    }

    /// The cudarc context, for allocations and streams in Rust callers and tests.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device's SM count, read when it was opened: what `ops::decode::decode_num_splits`
    /// plans one wave of CTAs for.
    pub fn num_sms(&self) -> usize {
        self.num_sms
    }

    /// Launches `id` with launch attributes beyond the grid (thread-block clusters, a
    /// programmatic dependent launch, [`LaunchAttrs`]); [`Device::launch`] is this without them.
    ///
    /// # Safety
    /// As for [`Device::launch`]; a dependent launch's kernel must also `griddep_wait()` before
    /// reading anything the stream's previous kernel writes.
    pub(crate) unsafe fn launch_with<P: Copy>(
        &self,
        id: KernelId<P>,
        grid: (u32, u32, u32),
        shared_bytes: u32,
        stream: Stream,
        params: &P,
        attrs: LaunchAttrs,
    ) -> Result<()> {
        let LaunchAttrs { dependent, cluster } = attrs;
        let info = id.info();
        let f = *self.functions[id.index()]
            .as_ref()
            .map_err(|e| Error::Unsupported(format!("kernel {} cannot run on this device: {e}", info.symbol)))?;
        self.bind()?;
        // Static plus dynamic shared memory above 48 KiB must be opted into per function (once
        // per size: a larger opt-in covers every smaller launch). Any dynamic size is opted
        // into, since a kernel's static shared memory counts towards the 48 KiB as well.
        let opted = &self.shared_opt_in[id.index()];
        if shared_bytes > opted.load(std::sync::atomic::Ordering::Relaxed) {
            cu::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes as i32,
            )
            .map_err(|source| Error::Driver { call: "cuFuncSetAttribute", source })?;
            opted.fetch_max(shared_bytes, std::sync::atomic::Ordering::Relaxed);
        }
        // cuLaunchKernel takes an array of pointers to the arguments; the one argument is the
        // params struct, passed by value.
        let mut args = [params as *const P as *mut std::ffi::c_void];
        let programmatic = dependent && self.compute_capability.0 >= 9 && pdl_enabled();
        if !programmatic && cluster.is_none() {
            return cu::launch_kernel(f, grid, (info.block, 1, 1), shared_bytes, stream.0, &mut args)
                .map_err(|source| Error::Driver { call: "cuLaunchKernel", source });
        }
        // Programmatic dependent launch: the kernel may start while the stream's previous kernel
        // runs and waits for it with griddepcontrol.wait (kernels-src/common.cuh). Captured
        // into a graph as a programmatic edge. A cluster launch groups `cluster` consecutive
        // CTAs along x into one thread-block cluster (the grid's x a multiple of it).
        let mut attrs: [sys::CUlaunchAttribute; 2] = std::mem::zeroed();
        let mut n = 0;
        if programmatic {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        if let Some(c) = cluster {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = c;
            attrs[n].value.clusterDim.y = 1;
            attrs[n].value.clusterDim.z = 1;
            n += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: info.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared_bytes,
            hStream: stream.0,
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        sys::cuLaunchKernelEx(&config, f, args.as_mut_ptr(), std::ptr::null_mut())
            .result()
            .map_err(|source| Error::Driver { call: "cuLaunchKernelEx", source })
    }

    /// Reads every byte of `buf` on `stream` (8 CTAs an SM), writing nothing: what the
    /// benchmarks run before each timed launch to evict the L2 cache (`dcp-mla bench`'s method).
    /// `sink` is written only if the xor of an all-zero `buf` were non-zero, i.e. never; `buf`
    /// must be zeros. Not for engines.
    #[doc(hidden)]
    pub fn evict_l2(&self, stream: Stream, buf: DeviceSlice<u8>, sink: DeviceSlice<u32>) -> Result<()> {
        let id = registry::bench_l2_evict().ok_or_else(|| Error::Unsupported("bench_l2_evict".into()))?;
        if sink.is_empty() {
            return Err(Error::arg("sink", "must hold one u32"));
        }
        let params = crate::abi::DcpL2EvictParams {
            buf: buf.ptr(),
            sink: sink.ptr(),
            bytes: buf.len() as i64,
            never: 1,
            reserved: 0,
        };
        let grid = 8 * self.num_sms() as u32;
        // SAFETY: the kernel reads the `bytes` bytes of `buf` (a slice of that length) and writes
        // at most the one u32 of `sink`.
        unsafe { self.launch(id, (grid, 1, 1), stream, &params) }
    }

    /// Copies `src` into `dst` (`src.len()` bytes, a multiple of 16, both 16-byte aligned, not
    /// overlapping) on `stream` with the benchmarks' copy kernel (4 CTAs an SM): the same-bytes
    /// ceiling `dcp-mla bench` compares a data-path row with. Not for engines.
    #[doc(hidden)]
    pub fn copy_bytes(&self, stream: Stream, src: DeviceSlice<u8>, dst: DeviceSlice<u8>) -> Result<()> {
        let id = registry::bench_copy().ok_or_else(|| Error::Unsupported("bench_copy".into()))?;
        let n = src.len();
        if n % 16 != 0 || src.ptr() % 16 != 0 || dst.ptr() % 16 != 0 {
            return Err(Error::arg(
                "src",
                format!("{n} bytes at {:#x} → {:#x}: 16-byte multiples only", src.ptr(), dst.ptr()),
            ));
        }
        if dst.len() < n {
            return Err(Error::arg("dst", format!("{} bytes, {n} needed", dst.len())));
        }
        let (a, b) = (src.ptr(), dst.ptr());
        if a < b + n as u64 && b < a + n as u64 && n > 0 {
            return Err(Error::arg("dst", "overlaps src"));
        }
        let params = crate::abi::DcpBenchCopyParams { src: a, dst: b, bytes: n as i64 };
        let grid = 4 * self.num_sms() as u32;
        // SAFETY: the kernel reads the n bytes of `src` and writes the n bytes of `dst`, both
        // slices of at least that length, checked not to overlap.
        unsafe { self.launch(id, (grid, 1, 1), stream, &params) }
    }

    /// Launches `id` with `params` passed by value as its single argument, without dynamic shared
    /// memory or launch attributes ([`Device::launch_with`] takes both).
    ///
    /// # Safety
    /// Every device pointer in `params` (the struct `id`'s kernel takes: the type says so) must
    /// be valid for what the kernel reads and writes.
    pub(crate) unsafe fn launch<P: Copy>(
        &self,
        id: KernelId<P>,
        grid: (u32, u32, u32),
        stream: Stream,
        params: &P,
    ) -> Result<()> {
        self.launch_with(id, grid, 0, stream, params, LaunchAttrs::default())
    }
}

/// Launch attributes beyond the grid ([`Device::launch_with`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LaunchAttrs {
    /// A programmatic dependent of the stream's previous kernel (compute capability 9.0+; a plain
    /// launch elsewhere): it may start before that kernel ends, and must `griddep_wait()` before
    /// reading anything that kernel writes.
    pub dependent: bool,
    /// Thread-block clusters of this many consecutive CTAs along x (compute capability 9.0+;
    /// `grid.0` a multiple of it, at most 8 without the non-portable opt-in); `None`: no cluster.
    pub cluster: Option<u32>,
}

/// A 2-D tiled TMA descriptor (`CUtensorMap`, 128 bytes) over a row-major bf16 matrix of
/// `rows` × `cols` at device address `base`, rows `row_bytes` apart, read in boxes of
/// `box_cols` × `box_rows` with 128-byte swizzling; reads outside the matrix fill zeros. A
/// pure host-side encoding (no device work, so CUDA-graph capture is unaffected); it goes into a
/// kernel's `__grid_constant__` params. The driver encodes it in `dev`'s context, which it makes
/// current on the calling thread first (an engine's thread may have none).
pub(crate) fn tensor_map_bf16_2d(
    dev: &Device,
    base: u64,
    rows: u64,
    cols: u64,
    row_bytes: u64,
    box_cols: u32,
    box_rows: u32,
) -> Result<[u64; 16]> {
    dev.bind()?;
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [cols, rows];
    let strides = [row_bytes];
    let boxes = [box_cols, box_rows];
    let elem_strides = [1u32, 1];
    // SAFETY: every pointer is to a live local array of the rank the call is told (2; strides
    // has rank − 1 entries); the driver only writes `map`.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    status.result().map_err(|source| Error::Driver { call: "cuTensorMapEncodeTiled", source })?;
    Ok(map.opaque)
}

/// Whether dependent launches use programmatic dependent launch; `DCP_MLA_PDL=0` turns it off
/// (read once), to measure what it saves.
fn pdl_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("DCP_MLA_PDL").map_or(true, |v| v != "0"))
}

/// A CUDA stream handle owned by the caller (the engine). Null is the legacy default stream.
#[derive(Debug, Clone, Copy)]
pub struct Stream(pub(crate) sys::CUstream);

impl Stream {
    /// The stream of a cudarc [`cudarc::driver::CudaStream`].
    pub fn from_cudarc(s: &cudarc::driver::CudaStream) -> Self {
        Stream(s.cu_stream())
    }

    /// # Safety
    /// `raw` must be null or a live `CUstream`/`cudaStream_t` of the device's context.
    pub unsafe fn from_raw(raw: *mut std::ffi::c_void) -> Self {
        Stream(raw as sys::CUstream)
    }

    /// The legacy default stream.
    pub fn null() -> Self {
        Stream(std::ptr::null_mut())
    }
}

/// A typed view of caller-owned device memory: a pointer and an element count, which the
/// launchers use to check that a kernel stays inside the buffer.
#[derive(Debug)]
pub struct DeviceSlice<T> {
    ptr: u64,
    len: usize,
    _t: PhantomData<*const T>,
}

impl<T> Clone for DeviceSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<T> {}

impl<T> DeviceSlice<T> {
    /// # Safety
    /// `ptr` must point to `len` elements of device memory that stay valid while kernels
    /// launched with this view run.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        DeviceSlice { ptr, len, _t: PhantomData }
    }

    /// A view of a whole cudarc allocation.
    pub fn of<S: cudarc::driver::DevicePtr<T>>(s: &S, stream: &cudarc::driver::CudaStream) -> Self {
        let (ptr, _sync) = s.device_ptr(stream);
        DeviceSlice { ptr, len: cudarc::driver::DeviceSlice::len(s), _t: PhantomData }
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The same memory viewed as bytes.
    pub fn bytes(&self) -> DeviceSlice<u8> {
        DeviceSlice { ptr: self.ptr, len: self.len * std::mem::size_of::<T>(), _t: PhantomData }
    }
}
