//! The C ABI of dcp-mla for inference engines (header: `ffi/include/dcp_mla.h`, generated from
//! this crate by cbindgen; `tests/header.rs` fails when it drifts).
//!
//! Conventions of every entry point:
//! - it returns a [`DcpMlaStatus`]; on failure [`dcp_mla_last_error`] gives a message naming the
//!   argument (an argument struct's field) and the reason, and nothing was written or launched;
//! - an operation takes one argument struct (`ffi/src/ops.rs`), read by `read_args` under the
//!   compatibility rule the header states (`struct_size` first, fields only appended, zero the
//!   default of every field);
//! - no panic crosses the boundary: each body runs inside `catch_unwind` and a panic becomes
//!   `DCP_MLA_STATUS_INTERNAL`;
//! - device buffers are [`DcpMlaTensor`]s (pointer, element count, dtype code, strides); the
//!   stream is the caller's `cudaStream_t`/`CUstream` as `void*` (null: the legacy default
//!   stream); workspaces are the caller's, sized by the planner queries; launchers never allocate
//!   and never synchronise;
//! - the tensors' own checks (null pointers, dtype and format codes, element alignment), the
//!   supported variants and planner constraints such as D·K % 512 == 0 run before the device
//!   handle is looked at; a launcher's size, extent, overlap and 16-byte alignment checks run
//!   after it (a null device is refused first), still before anything is launched.

/// One field of an argument struct converted for a launcher ([`Arg`]): `arg!(a.field)`, its error
/// naming the field, or `arg!(a.field as "name")` naming it otherwise. A tensor field converted
/// this way takes no strides (`num_strides` 0); `strided!(a.field, N)` takes N.
macro_rules! arg {
    ($s:ident . $f:ident) => {
        $crate::Arg::arg($s.$f, stringify!($f))?
    };
    ($s:ident . $f:ident as $name:literal) => {
        $crate::Arg::arg($s.$f, $name)?
    };
}

/// A tensor field with N strides (or 0, its default layout): `(view, Option<[usize; N]>)`.
macro_rules! strided {
    ($s:ident . $f:ident, $n:literal) => {{
        let strides = $s.$f.strides::<$n>(stringify!($f))?;
        ($crate::Arg::arg($s.$f.unstrided(), stringify!($f))?, strides)
    }};
}

// The entry points' docs are the header's comments (cbindgen copies them verbatim), where
// `[rows, 512]` or `lens[i]` is a shape or an element, not a link: rustdoc's escapes (`\[rows\]`)
// would show in the C header, so its link lint is off for these two modules.
#[allow(rustdoc::broken_intra_doc_links)]
mod ops;
#[allow(rustdoc::broken_intra_doc_links)]
mod planner;
// The positional entry points of revisions 1-4, kept as refusals (not in the header).
mod compat;

use dcp_mla::runtime::registry::KERNELS;
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

pub use ops::*;
pub use planner::*;

/// What a call did. Every failure comes with a message from [`dcp_mla_last_error`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcpMlaStatus {
    /// The call succeeded (a launch was queued on the stream).
    Success = 0,
    /// An argument has a wrong size, shape, stride, range or overlap.
    InvalidArgument = 1,
    /// A required pointer (device buffer, handle or output) is null.
    NullPointer = 2,
    /// A pointer or stride is not aligned as the kernel needs.
    Misaligned = 3,
    /// A dtype, KV-format or lse-base code is unknown or not accepted for that argument.
    BadDtype = 4,
    /// The planner rejects the configuration (e.g. D·K not a multiple of 512, D not dividing tp).
    InvalidConfig = 5,
    /// The kernel variant is not compiled into this build, or cannot run on this device.
    Unsupported = 6,
    /// No CUDA driver or no device with that ordinal on this machine.
    NoDevice = 7,
    /// A CUDA driver call failed.
    CudaError = 8,
    /// A bug in dcp-mla (a panic was caught at the boundary).
    Internal = 9,
}

/// The ABI revision of this header. Any change to the header's declarations (a prototype, a
/// struct, an enum or a code) comes with a new revision and a new line in ffi/abi-revisions.sha256,
/// which ffi/tests/header.rs checks; python/dcp_mla/_lib.py's ABI_VERSION follows it. (Revision 3
/// changed several times before that check existed: see CHANGELOG.md.) From revision 5 on, an
/// operation's argument struct grows by appending fields (see the header's compatibility rule),
/// so a caller built against an older revision's struct keeps working.
pub const DCP_MLA_ABI_VERSION: u32 = 5;

/// Dtype code: bytes (caches, workspaces, a2a buffers).
pub const DCP_MLA_DTYPE_U8: i32 = 1;
/// Dtype code: bfloat16.
pub const DCP_MLA_DTYPE_BF16: i32 = 2;
/// Dtype code: float32.
pub const DCP_MLA_DTYPE_F32: i32 = 3;
/// Dtype code: int32.
pub const DCP_MLA_DTYPE_I32: i32 = 4;

/// KV-cache format code: 576 bf16 per token, [512 c_kv | 64 k_pe].
pub const DCP_MLA_KV_BF16: i32 = 1;
/// KV-cache format code: FlashMLA's FP8 "656" row (512 e4m3, 4 fp32 scales, 64 bf16 k_pe).
pub const DCP_MLA_KV_FP8_656: i32 = 2;

/// Decode schedule code: a split launch computes its schedule into the workspace.
pub const DCP_MLA_SCHEDULE_COMPUTE: i32 = 0;
/// Decode schedule code: a split launch reuses the schedule an earlier launch of the same shape
/// left in the workspace (e.g. the step's first layer); see dcp_mla_launch_decode_dense.
pub const DCP_MLA_SCHEDULE_REUSE: i32 = 1;

/// Dense decode lengths code: `lens` holds each query row's local length.
pub const DCP_MLA_LENS_LOCAL: i32 = 0;
/// Dense decode lengths code: `lens` holds each request's global length; the kernels work out
/// every row's share on the rank (see dcp_mla_launch_decode_dense).
pub const DCP_MLA_LENS_GLOBAL: i32 = 1;
/// Dense decode lengths code: as DCP_MLA_LENS_GLOBAL, with causal MTP rows.
pub const DCP_MLA_LENS_GLOBAL_CAUSAL: i32 = 2;

/// LSE base code: natural log (dcp-mla's and FlashMLA's kernels).
pub const DCP_MLA_LSE_BASE_E: i32 = 1;
/// LSE base code: base 2 (FlashInfer-style kernels).
pub const DCP_MLA_LSE_BASE_2: i32 = 2;

/// A device buffer: `numel` elements of dtype `dtype` (a `DCP_MLA_DTYPE_*` code) at `data`, with
/// its strides. Launchers check every kernel access against `numel`. Byte buffers (caches,
/// workspaces, a2a slots) accept any dtype and count `numel` times its size. All zero (what a
/// zero-initialised argument struct holds) is an absent tensor.
///
/// `num_strides` 0 is the layout the field documents as its default (contiguous, packed pages);
/// otherwise it is the number of strides the field takes (its documentation says how many and
/// what they step over), given in `strides[0..num_strides]` in elements of `dtype`; any other
/// count is refused, naming `<field>.num_strides`. A field that takes no strides needs 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DcpMlaTensor {
    /// Device pointer (CUDA unified addressing), or null for an absent optional buffer.
    pub data: *mut c_void,
    /// Number of elements: for a strided view, the extent from its first element to the end of
    /// its last.
    pub numel: usize,
    /// One of the `DCP_MLA_DTYPE_*` codes.
    pub dtype: i32,
    /// How many of `strides` are given: 0 (the field's default layout) or the count it takes.
    pub num_strides: u32,
    /// Strides in elements, outermost first; entries past `num_strides` are not read.
    pub strides: [usize; 4],
}

/// An absent tensor (all zero).
impl Default for DcpMlaTensor {
    fn default() -> Self {
        DcpMlaTensor { data: std::ptr::null_mut(), numel: 0, dtype: 0, num_strides: 0, strides: [0; 4] }
    }
}

/// An open CUDA device with every kernel of this build loaded (opaque).
pub struct DcpMlaDevice {
    dev: Device,
}

/// A failed call: its status and message.
#[derive(Debug)]
pub(crate) struct FfiError {
    pub status: DcpMlaStatus,
    pub message: String,
}

pub(crate) type R<T> = Result<T, FfiError>;

pub(crate) fn fail(status: DcpMlaStatus, message: impl Into<String>) -> FfiError {
    FfiError { status, message: message.into() }
}

pub(crate) fn bad_arg(arg: &str, reason: impl std::fmt::Display) -> FfiError {
    fail(DcpMlaStatus::InvalidArgument, format!("invalid argument `{arg}`: {reason}"))
}

/// The status of a library error.
fn status_of(e: &dcp_mla::Error) -> DcpMlaStatus {
    use dcp_mla::Error as E;
    match e {
        E::Misaligned { .. } => DcpMlaStatus::Misaligned,
        E::InvalidArgument { .. } => DcpMlaStatus::InvalidArgument,
        E::InvalidConfig(_) => DcpMlaStatus::InvalidConfig,
        E::Unsupported(_) => DcpMlaStatus::Unsupported,
        E::NoDriver | E::NoDevice { .. } => DcpMlaStatus::NoDevice,
        E::Driver { .. } => DcpMlaStatus::CudaError,
        // Multi-GPU groups need libnccl: like a missing driver, the machine lacks it.
        E::NoNccl => DcpMlaStatus::NoDevice,
        E::Nccl { .. } => DcpMlaStatus::CudaError,
        #[allow(unreachable_patterns)]
        _ => DcpMlaStatus::Internal,
    }
}

/// The C field a launcher's argument name stands for: its strides live in the tensor
/// descriptors (`q_strides` is `q.strides`, `page_stride` is `cache.strides`), and `nq` is
/// `num_q`.
fn c_field(arg: &str) -> String {
    match arg {
        "nq" => "num_q".into(),
        "page_stride" => "cache.strides".into(),
        "extra_page_stride" => "extra_cache.strides".into(),
        "row_stride" => "scores.strides".into(),
        _ => match arg.strip_suffix("_strides").or_else(|| arg.strip_suffix("_stride")) {
            Some(tensor) => format!("{tensor}.strides"),
            None => arg.into(),
        },
    }
}

impl From<dcp_mla::Error> for FfiError {
    fn from(e: dcp_mla::Error) -> Self {
        use dcp_mla::Error as E;
        let message = match &e {
            E::InvalidArgument { arg, reason } => format!("invalid argument `{}`: {reason}", c_field(arg)),
            E::Misaligned { arg, reason } => format!("misaligned argument `{}`: {reason}", c_field(arg)),
            _ => e.to_string(),
        };
        fail(status_of(&e), message)
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A NUL inside a message would truncate it in C: replace it.
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs an entry point's body: a panic becomes `Internal`, an error sets the thread's last
/// error, success clears it.
pub(crate) fn guard(body: impl FnOnce() -> R<()>) -> DcpMlaStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error("");
            DcpMlaStatus::Success
        }
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".into());
            set_last_error(&format!("internal error (a bug in dcp-mla, please report it): {what}"));
            DcpMlaStatus::Internal
        }
    }
}

/// Writes `v` through a caller's out-pointer, or fails naming it when it is null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(arg: &str, out: *mut T, v: T) -> R<()> {
    if out.is_null() {
        return Err(fail(DcpMlaStatus::NullPointer, format!("`{arg}` is a null output pointer")));
    }
    out.write(v);
    Ok(())
}

/// An operation's argument struct (ops.rs): `#[repr(C)]`, `struct_size` its first field, then
/// `device` and `stream`; all-zero bytes are a valid value of it (null pointers, zero integers,
/// absent tensors), and every field's zero is its default.
///
/// # Safety
/// Implementors must have that layout and that all-zero validity.
pub(crate) unsafe trait ArgsStruct: Copy {
    /// The C name, e.g. "DcpMlaDecodeDenseArgs" (errors name its fields by it).
    const NAME: &'static str;
    /// The struct's size at the revision it appeared in (revision 5 for every struct so far): the
    /// smallest `struct_size` accepted. A later revision appends fields and keeps this value.
    const FIRST_SIZE: usize;
    fn device(&self) -> *const DcpMlaDevice;
    fn stream(&self) -> *mut c_void;
}

/// The most bytes a `struct_size` may claim: a larger value is no struct of this ABI (an
/// uninitialised size, or a pointer that is no argument struct), refused without reading.
pub(crate) const MAX_STRUCT_SIZE: usize = 4096;

/// Reads a caller's argument struct by the compatibility rule of the header: `struct_size` bytes
/// of it (at least `T::FIRST_SIZE`), the fields past them at their defaults (zero); a struct
/// larger than this revision's is accepted only when its extra bytes are all zero.
///
/// # Safety
/// `p` must be null or point at `struct_size` readable bytes (what the caller's struct holds).
pub(crate) unsafe fn read_args<T: ArgsStruct>(p: *const T) -> R<T> {
    let name = T::NAME;
    if p.is_null() {
        return Err(fail(DcpMlaStatus::NullPointer, format!("`args` is a null {name} pointer")));
    }
    let size = std::ptr::read_unaligned(p.cast::<usize>());
    let known = std::mem::size_of::<T>();
    let field = format!("{name}.struct_size");
    if size < T::FIRST_SIZE {
        return Err(bad_arg(
            &field,
            format!(
                "{size} bytes is smaller than any revision of {name} ({} bytes at ABI revision 5): set it to \
                 sizeof({name})",
                T::FIRST_SIZE
            ),
        ));
    }
    if size > MAX_STRUCT_SIZE {
        return Err(bad_arg(&field, format!("{size} bytes is no size of {name} (at most {MAX_STRUCT_SIZE})")));
    }
    if size > known {
        let tail = std::slice::from_raw_parts(p.cast::<u8>().add(known), size - known);
        if let Some(at) = tail.iter().position(|&b| b != 0) {
            return Err(bad_arg(
                &field,
                format!(
                    "{size} bytes, and byte {} is not zero: fields of a newer ABI revision than this \
                     library's ({DCP_MLA_ABI_VERSION}, {known} bytes) are set, and this library cannot honour them",
                    known + at
                ),
            ));
        }
    }
    // SAFETY: the trait's contract: all-zero bytes are a valid T.
    let mut out: T = std::mem::zeroed();
    std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&mut out as *mut T).cast::<u8>(), size.min(known));
    Ok(out)
}

/// A dtype code's element size and name, or None for an unknown code.
pub(crate) fn dtype_info(code: i32) -> Option<(usize, &'static str)> {
    match code {
        DCP_MLA_DTYPE_U8 => Some((1, "u8")),
        DCP_MLA_DTYPE_BF16 => Some((2, "bf16")),
        DCP_MLA_DTYPE_F32 => Some((4, "f32")),
        DCP_MLA_DTYPE_I32 => Some((4, "i32")),
        _ => None,
    }
}

/// Element types of the typed views, with their dtype codes.
pub(crate) trait Elem {
    const DTYPE: i32;
}
impl Elem for half::bf16 {
    const DTYPE: i32 = DCP_MLA_DTYPE_BF16;
}
impl Elem for f32 {
    const DTYPE: i32 = DCP_MLA_DTYPE_F32;
}
impl Elem for i32 {
    const DTYPE: i32 = DCP_MLA_DTYPE_I32;
}

impl DcpMlaTensor {
    fn is_absent(&self) -> bool {
        self.data.is_null()
    }

    /// The `N` strides of a field that takes them, or None for its default layout
    /// (`num_strides` 0); another count is refused, naming `<arg>.num_strides`.
    pub(crate) fn strides<const N: usize>(&self, arg: &str) -> R<Option<[usize; N]>> {
        match self.num_strides as usize {
            0 => Ok(None),
            n if n == N => {
                let mut s = [0; N];
                s.copy_from_slice(&self.strides[..N]);
                Ok(Some(s))
            }
            n => Err(bad_arg(
                &format!("{arg}.num_strides"),
                if N == 0 {
                    format!("{n}: this tensor takes no strides (pass 0)")
                } else {
                    format!("{n}: this tensor takes {N} strides, or 0 for its default layout")
                },
            )),
        }
    }

    /// The descriptor with its strides taken (by `strided!`).
    pub(crate) fn unstrided(self) -> Self {
        DcpMlaTensor { num_strides: 0, ..self }
    }

    /// Checks the dtype code against `allowed`, the pointer for null and element alignment;
    /// returns the element size.
    fn check(&self, arg: &str, allowed: &[i32]) -> R<usize> {
        self.strides::<0>(arg)?;
        let Some((size, name)) = dtype_info(self.dtype) else {
            return Err(fail(DcpMlaStatus::BadDtype, format!("`{arg}`: unknown dtype code {}", self.dtype)));
        };
        if self.data.is_null() {
            return Err(fail(DcpMlaStatus::NullPointer, format!("`{arg}` is a null device pointer")));
        }
        if !allowed.is_empty() && !allowed.contains(&self.dtype) {
            let want: Vec<_> = allowed.iter().filter_map(|&c| dtype_info(c)).map(|(_, n)| n).collect();
            return Err(fail(
                DcpMlaStatus::BadDtype,
                format!("`{arg}`: dtype {name} is not accepted here (want {})", want.join(" or ")),
            ));
        }
        if (self.data as usize) % size != 0 {
            return Err(fail(
                DcpMlaStatus::Misaligned,
                format!("`{arg}`: pointer {:p} is not aligned to its {size}-byte {name} elements", self.data),
            ));
        }
        if self.numel.checked_mul(size).is_none() {
            return Err(bad_arg(arg, format!("{} elements overflow the address space", self.numel)));
        }
        Ok(size)
    }

    /// A typed view of a required buffer.
    pub(crate) fn typed<T: Elem>(&self, arg: &str) -> R<DeviceSlice<T>> {
        self.check(arg, &[T::DTYPE])?;
        // SAFETY: the caller of the entry point promises `numel` valid elements at `data`.
        Ok(unsafe { DeviceSlice::from_raw(self.data as u64, self.numel) })
    }

    /// A typed view of an optional buffer: None when `data` is null.
    pub(crate) fn typed_opt<T: Elem>(&self, arg: &str) -> R<Option<DeviceSlice<T>>> {
        if self.is_absent() {
            self.strides::<0>(arg)?;
            return Ok(None);
        }
        self.typed(arg).map(Some)
    }

    /// A byte view of a required buffer of any dtype.
    pub(crate) fn bytes(&self, arg: &str) -> R<DeviceSlice<u8>> {
        let size = self.check(arg, &[])?;
        // SAFETY: as in `typed`; numel·size was checked not to overflow.
        Ok(unsafe { DeviceSlice::from_raw(self.data as u64, self.numel * size) })
    }

    /// The dtype code, for buffers that take bf16 or f32; checked like `typed`.
    pub(crate) fn bf16_or_f32(&self, arg: &str) -> R<dcp_mla::ops::Rows> {
        self.check(arg, &[DCP_MLA_DTYPE_BF16, DCP_MLA_DTYPE_F32])?;
        // SAFETY: as in `typed`.
        Ok(unsafe {
            if self.dtype == DCP_MLA_DTYPE_BF16 {
                dcp_mla::ops::Rows::Bf16(DeviceSlice::from_raw(self.data as u64, self.numel))
            } else {
                dcp_mla::ops::Rows::F32(DeviceSlice::from_raw(self.data as u64, self.numel))
            }
        })
    }
}

/// A C field as the launchers take it, the one home of their conversions: a tensor as a typed
/// view (`DeviceSlice<T>`), a byte view (`DeviceSlice<u8>`, any dtype), an optional typed view
/// (null data: `None`) or bf16/f32 rows; a code as its enum. Errors name `arg`.
pub(crate) trait Arg<T> {
    fn arg(self, arg: &str) -> R<T>;
}
impl<T: Elem> Arg<DeviceSlice<T>> for DcpMlaTensor {
    fn arg(self, arg: &str) -> R<DeviceSlice<T>> {
        self.typed(arg)
    }
}
impl Arg<DeviceSlice<u8>> for DcpMlaTensor {
    fn arg(self, arg: &str) -> R<DeviceSlice<u8>> {
        self.bytes(arg)
    }
}
impl<T: Elem> Arg<Option<DeviceSlice<T>>> for DcpMlaTensor {
    fn arg(self, arg: &str) -> R<Option<DeviceSlice<T>>> {
        self.typed_opt(arg)
    }
}
impl Arg<dcp_mla::ops::Rows> for DcpMlaTensor {
    fn arg(self, arg: &str) -> R<dcp_mla::ops::Rows> {
        self.bf16_or_f32(arg)
    }
}
impl Arg<dcp_mla::KvFormat> for i32 {
    fn arg(self, arg: &str) -> R<dcp_mla::KvFormat> {
        kv_format(arg, self)
    }
}
impl Arg<dcp_mla::LseBase> for i32 {
    fn arg(self, arg: &str) -> R<dcp_mla::LseBase> {
        lse_base(arg, self)
    }
}
impl Arg<dcp_mla::ops::decode::DecodeSchedule> for i32 {
    fn arg(self, arg: &str) -> R<dcp_mla::ops::decode::DecodeSchedule> {
        decode_schedule(arg, self)
    }
}

/// The device behind a handle, or NullPointer.
///
/// # Safety
/// `h` must be null or a handle from [`dcp_mla_device_open`] that was not closed.
pub(crate) unsafe fn device<'a>(h: *const DcpMlaDevice) -> R<&'a Device> {
    h.as_ref()
        .map(|d| &d.dev)
        .ok_or_else(|| fail(DcpMlaStatus::NullPointer, "`device` is null (open one with dcp_mla_device_open)"))
}

/// The caller's stream.
///
/// # Safety
/// `s` must be null or a live stream of the device's (primary) context.
pub(crate) unsafe fn stream(s: *mut c_void) -> Stream {
    Stream::from_raw(s)
}

pub(crate) fn kv_format(arg: &str, code: i32) -> R<dcp_mla::KvFormat> {
    match code {
        DCP_MLA_KV_BF16 => Ok(dcp_mla::KvFormat::Bf16),
        DCP_MLA_KV_FP8_656 => Ok(dcp_mla::KvFormat::Fp8_656),
        _ => Err(fail(
            DcpMlaStatus::BadDtype,
            format!("`{arg}`: unknown KV format code {code} (DCP_MLA_KV_BF16 = 1, DCP_MLA_KV_FP8_656 = 2)"),
        )),
    }
}

pub(crate) fn lens_rule(
    arg: &str,
    code: i32,
    dcp_size: usize,
    interleave: usize,
    rank: usize,
) -> R<dcp_mla::ops::decode::LensRule> {
    use dcp_mla::ops::decode::LensRule;
    let dcp = dcp_mla::DcpLayout { size: dcp_size, interleave };
    match code {
        DCP_MLA_LENS_LOCAL => Ok(LensRule::Local),
        DCP_MLA_LENS_GLOBAL => Ok(LensRule::Global { dcp, rank, causal: false }),
        DCP_MLA_LENS_GLOBAL_CAUSAL => Ok(LensRule::Global { dcp, rank, causal: true }),
        _ => Err(fail(
            DcpMlaStatus::InvalidArgument,
            format!(
                "`{arg}`: unknown lengths code {code} (DCP_MLA_LENS_LOCAL = 0, DCP_MLA_LENS_GLOBAL = 1, \
                 DCP_MLA_LENS_GLOBAL_CAUSAL = 2)"
            ),
        )),
    }
}

pub(crate) fn decode_schedule(arg: &str, code: i32) -> R<dcp_mla::ops::decode::DecodeSchedule> {
    use dcp_mla::ops::decode::DecodeSchedule;
    match code {
        DCP_MLA_SCHEDULE_COMPUTE => Ok(DecodeSchedule::Compute),
        DCP_MLA_SCHEDULE_REUSE => Ok(DecodeSchedule::Reuse),
        _ => Err(fail(
            DcpMlaStatus::InvalidArgument,
            format!("`{arg}`: unknown schedule code {code} (DCP_MLA_SCHEDULE_COMPUTE = 0, DCP_MLA_SCHEDULE_REUSE = 1)"),
        )),
    }
}

pub(crate) fn lse_base(arg: &str, code: i32) -> R<dcp_mla::LseBase> {
    match code {
        DCP_MLA_LSE_BASE_E => Ok(dcp_mla::LseBase::E),
        DCP_MLA_LSE_BASE_2 => Ok(dcp_mla::LseBase::Two),
        _ => Err(fail(
            DcpMlaStatus::BadDtype,
            format!("`{arg}`: unknown lse base code {code} (DCP_MLA_LSE_BASE_E = 1, DCP_MLA_LSE_BASE_2 = 2)"),
        )),
    }
}

fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> FfiError {
    move |source| dcp_mla::Error::Driver { call, source }.into()
}

// ---------------------------------------------------------------------------------------------
// Errors, version and capabilities
// ---------------------------------------------------------------------------------------------

/// The message of the last failed call on this thread ("" after a successful call): names the
/// argument and the reason. The pointer stays valid until the next dcp_mla call on this thread.
#[no_mangle]
pub extern "C" fn dcp_mla_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The name of a status code, e.g. "DCP_MLA_STATUS_NO_DEVICE" (a static string), or
/// "DCP_MLA_STATUS_UNKNOWN" for an integer that is no status. Takes the code as a plain int:
/// a C caller may pass any value, and an out-of-range value of a Rust enum is undefined behaviour.
#[no_mangle]
pub extern "C" fn dcp_mla_status_name(status: i32) -> *const c_char {
    use DcpMlaStatus::*;
    let known = [
        Success,
        InvalidArgument,
        NullPointer,
        Misaligned,
        BadDtype,
        InvalidConfig,
        Unsupported,
        NoDevice,
        CudaError,
        Internal,
    ];
    let s: &'static str = match known.into_iter().find(|&k| k as i32 == status) {
        Some(Success) => "DCP_MLA_STATUS_SUCCESS\0",
        Some(InvalidArgument) => "DCP_MLA_STATUS_INVALID_ARGUMENT\0",
        Some(NullPointer) => "DCP_MLA_STATUS_NULL_POINTER\0",
        Some(Misaligned) => "DCP_MLA_STATUS_MISALIGNED\0",
        Some(BadDtype) => "DCP_MLA_STATUS_BAD_DTYPE\0",
        Some(InvalidConfig) => "DCP_MLA_STATUS_INVALID_CONFIG\0",
        Some(Unsupported) => "DCP_MLA_STATUS_UNSUPPORTED\0",
        Some(NoDevice) => "DCP_MLA_STATUS_NO_DEVICE\0",
        Some(CudaError) => "DCP_MLA_STATUS_CUDA_ERROR\0",
        Some(Internal) => "DCP_MLA_STATUS_INTERNAL\0",
        None => "DCP_MLA_STATUS_UNKNOWN\0",
    };
    s.as_ptr().cast()
}

/// The library version as a NUL-terminated string, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn dcp_mla_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The ABI revision this library implements (compare with DCP_MLA_ABI_VERSION of the header).
#[no_mangle]
pub extern "C" fn dcp_mla_abi_version() -> u32 {
    DCP_MLA_ABI_VERSION
}

fn variant_names() -> &'static [CString] {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    NAMES.get_or_init(|| KERNELS.iter().map(|k| CString::new(k.symbol).unwrap_or_default()).collect())
}

/// The number of kernel variants compiled into this build.
#[no_mangle]
pub extern "C" fn dcp_mla_variant_count() -> usize {
    KERNELS.len()
}

/// The entry-point symbol of compiled variant `index` (its family and axis values, e.g.
/// "dcp_topk_merge__d_4__k_2048"), a static string; null when `index` is out of range.
#[no_mangle]
pub extern "C" fn dcp_mla_variant_name(index: usize) -> *const c_char {
    variant_names().get(index).map_or(std::ptr::null(), |c| c.as_ptr())
}

/// Opt-in shared memory per block (bytes) of the compute capabilities this build knows.
fn max_shared_per_block(major: i32, minor: i32) -> Option<usize> {
    let kib = match (major, minor) {
        (8, 0) | (8, 7) => 163,
        (8, 6) | (8, 9) => 99,
        (9, 0) | (10, _) | (11, 0) => 227,
        (12, _) => 99,
        _ => return None,
    };
    Some(kib * 1024)
}

/// Whether the embedded code runs on `major.minor`: machine code for it (an arch-specific
/// `sm_XYa` only on X.Y exactly, a plain `sm_XY` on X.y with y ≥ Y) or PTX to JIT (`compute_XY`
/// on ≥ X.Y).
fn has_code(major: i32, minor: i32) -> bool {
    let cc = |s: &str| -> Option<(i32, i32, bool)> {
        let digits = s.trim_start_matches(|c: char| !c.is_ascii_digit());
        let specific = digits.ends_with('a');
        let n: i32 = digits.trim_end_matches('a').parse().ok()?;
        Some((n / 10, n % 10, specific))
    };
    use dcp_mla::runtime::registry::{PTX_TARGET, SASS_TARGETS};
    let sass = SASS_TARGETS.iter().copied().filter_map(cc).any(|(ma, mi, specific)| {
        if specific {
            (ma, mi) == (major, minor)
        } else {
            ma == major && minor >= mi
        }
    });
    let ptx = cc(PTX_TARGET).is_some_and(|(ma, mi, _)| (major, minor) >= (ma, mi));
    sass || ptx
}

pub(crate) fn compute_capability_supported(major: i32, minor: i32) -> bool {
    let smem = dcp_mla::ops::decode::fallback_shared_bytes();
    has_code(major, minor) && max_shared_per_block(major, minor).is_some_and(|m| m >= smem)
}

/// Whether every kernel of this build can run on a GPU of compute capability `major.minor`:
/// the library embeds machine code or PTX for it, and the GPU has the shared memory the decode
/// kernels need. Writes 1 or 0 to `supported`.
///
/// # Safety
/// `supported` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_compute_capability_supported(
    major: i32,
    minor: i32,
    supported: *mut i32,
) -> DcpMlaStatus {
    guard(|| put("supported", supported, compute_capability_supported(major, minor) as i32))
}

// ---------------------------------------------------------------------------------------------
// Device handle
// ---------------------------------------------------------------------------------------------

/// Opens CUDA device `ordinal` (its primary context, which becomes current on this thread) and
/// loads every kernel. On a machine without a driver or without that device it returns
/// DCP_MLA_STATUS_NO_DEVICE and leaves `*device` null.
///
/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_device_open(ordinal: i32, device: *mut *mut DcpMlaDevice) -> DcpMlaStatus {
    guard(|| {
        put("device", device, std::ptr::null_mut())?;
        let ordinal = usize::try_from(ordinal).map_err(|_| bad_arg("ordinal", format!("{ordinal} is negative")))?;
        let dev = Device::open(ordinal)?;
        let h = Box::into_raw(Box::new(DcpMlaDevice { dev }));
        device.write(h);
        Ok(())
    })
}

/// Closes a handle from dcp_mla_device_open (null is accepted and ignored). Work queued on the
/// caller's streams must be finished first.
///
/// # Safety
/// `device` must be null or an open handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_device_close(device: *mut DcpMlaDevice) -> DcpMlaStatus {
    guard(|| {
        if !device.is_null() {
            drop(Box::from_raw(device));
        }
        Ok(())
    })
}

/// The device's compute capability and number of SMs (for dcp_mla_decode_num_splits).
///
/// # Safety
/// `device` must be an open handle; the out-pointers must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_device_info(
    device: *const DcpMlaDevice,
    major: *mut i32,
    minor: *mut i32,
    num_sms: *mut i32,
) -> DcpMlaStatus {
    guard(|| {
        let dev = self::device(device)?;
        let (ma, mi) = dev.compute_capability();
        let sms = dev
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute"))?;
        put("major", major, ma)?;
        put("minor", minor, mi)?;
        put("num_sms", num_sms, sms)
    })
}

/// Split-KV parts to pass to a decode launch that leaves the kernel to the library: the tuned
/// decode table's count where its row for the launch's class is what the launch runs (the table
/// embedded for this card, or DCP_MLA_TUNE_TABLE's; not when DCP_MLA_DECODE_PATH names a
/// kernel), else dcp_mla_decode_num_splits's for this device's SMs; never more parts than
/// the batch has 64-token tiles at `context` tokens a sequence (1 when a sequence fits one
/// tile). `sparse` 0: dense over the bf16 cache (`kv_format` DCP_MLA_KV_BF16), `context`
/// the most tokens a request may hold (max_pages · block_size), `causal` 1 with
/// DCP_MLA_LENS_GLOBAL_CAUSAL; `sparse` 1: index lists over `kv_format`, `context` the
/// top-k, `causal` 0.
///
/// # Safety
/// `device` must be an open handle; `out` must be valid for a write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dcp_mla_decode_num_splits_on(
    device: *const DcpMlaDevice,
    sparse: i32,
    kv_format: i32,
    batch: usize,
    num_q: usize,
    heads: usize,
    context: usize,
    causal: i32,
    out: *mut usize,
) -> DcpMlaStatus {
    guard(|| {
        let dev = self::device(device)?;
        let format = self::kv_format("kv_format", kv_format)?;
        let sparse = sparse != 0;
        if !sparse && format != dcp_mla::KvFormat::Bf16 {
            return Err(bad_arg("kv_format", "dense decode reads the bf16 cache (DCP_MLA_KV_BF16)"));
        }
        if sparse && causal != 0 {
            return Err(bad_arg("causal", "sparse decode has no causal rule (pass 0)"));
        }
        for (name, v) in [("batch", batch), ("num_q", num_q), ("heads", heads), ("context", context)] {
            if v == 0 {
                return Err(bad_arg(name, "must be at least 1"));
            }
        }
        let shape = dcp_mla::planner::choice::DecodeShape {
            sparse,
            format,
            batch,
            nq: num_q,
            heads,
            context,
            causal: causal != 0,
        };
        put("out", out, dcp_mla::ops::decode::decode_num_splits_on(dev, &shape)?)
    })
}

// ---------------------------------------------------------------------------------------------
// Memory helpers for programs without the CUDA toolkit (examples, tests). Synchronous; the
// launchers never call them.
// ---------------------------------------------------------------------------------------------

fn bind(dev: &Device) -> R<()> {
    dev.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))
}

/// Allocates `bytes` of device memory (cuMemAlloc, 256-byte aligned) into `*ptr`.
///
/// # Safety
/// `device` must be an open handle; `ptr` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_malloc(
    device: *const DcpMlaDevice,
    bytes: usize,
    ptr: *mut *mut c_void,
) -> DcpMlaStatus {
    guard(|| {
        put("ptr", ptr, std::ptr::null_mut())?;
        bind(self::device(device)?)?;
        let p = cudarc::driver::result::malloc_sync(bytes.max(1)).map_err(driver("cuMemAlloc"))?;
        ptr.write(p as *mut c_void);
        Ok(())
    })
}

/// Frees memory from dcp_mla_malloc (null is ignored).
///
/// # Safety
/// `ptr` must be null or from dcp_mla_malloc on this device, with no work still using it.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_free(device: *const DcpMlaDevice, ptr: *mut c_void) -> DcpMlaStatus {
    guard(|| {
        bind(self::device(device)?)?;
        if !ptr.is_null() {
            cudarc::driver::result::free_sync(ptr as u64).map_err(driver("cuMemFree"))?;
        }
        Ok(())
    })
}

/// Copies `bytes` from host `src` to device `dst` (synchronous).
///
/// # Safety
/// `src` must hold `bytes` readable host bytes, `dst` `bytes` writable device bytes.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_memcpy_htod(
    device: *const DcpMlaDevice,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> DcpMlaStatus {
    copy_call(device, dst, src, bytes, "cuMemcpyHtoD", || {
        cudarc::driver::result::memcpy_htod_sync(dst as u64, std::slice::from_raw_parts(src as *const u8, bytes))
    })
}

/// Copies `bytes` from device `src` to host `dst` (synchronous; waits for the legacy default
/// stream's work).
///
/// # Safety
/// `dst` must hold `bytes` writable host bytes, `src` `bytes` readable device bytes.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_memcpy_dtoh(
    device: *const DcpMlaDevice,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> DcpMlaStatus {
    copy_call(device, dst, src, bytes, "cuMemcpyDtoH", || {
        cudarc::driver::result::memcpy_dtoh_sync(std::slice::from_raw_parts_mut(dst as *mut u8, bytes), src as u64)
    })
}

/// Sets `bytes` device bytes at `ptr` to `value` (synchronous).
///
/// # Safety
/// `ptr` must hold `bytes` writable device bytes.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_memset(
    device: *const DcpMlaDevice,
    ptr: *mut c_void,
    value: u8,
    bytes: usize,
) -> DcpMlaStatus {
    guard(|| {
        if !memory_call(device, bytes, &[("ptr", ptr)])? {
            return Ok(());
        }
        cudarc::driver::result::memset_d8_sync(ptr as u64, value, bytes).map_err(driver("cuMemsetD8"))
    })
}

/// Waits for all work on the device's context.
///
/// # Safety
/// `device` must be an open handle.
#[no_mangle]
pub unsafe extern "C" fn dcp_mla_synchronize(device: *const DcpMlaDevice) -> DcpMlaStatus {
    guard(|| {
        let dev = self::device(device)?;
        dev.context().synchronize().map_err(driver("cuCtxSynchronize"))
    })
}

/// What the synchronous memory calls check first: the device (its context bound to this
/// thread), then whether there is anything to do (`bytes` > 0), and then that each of `ptrs`
/// (named) is not null.
///
/// # Safety
/// `device` must be null or an open handle.
unsafe fn memory_call(device: *const DcpMlaDevice, bytes: usize, ptrs: &[(&str, *const c_void)]) -> R<bool> {
    bind(self::device(device)?)?;
    if bytes == 0 {
        return Ok(false);
    }
    for &(arg, p) in ptrs {
        nonnull(arg, p)?;
    }
    Ok(true)
}

/// The body of both synchronous copies: [`memory_call`]'s checks of `dst` and `src`, nothing for 0
/// bytes, then `copy`, whose driver error names `call`.
///
/// # Safety
/// As for the copies: `copy` may read `bytes` at `src` and write `bytes` at `dst`.
unsafe fn copy_call(
    device: *const DcpMlaDevice,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    call: &'static str,
    copy: impl FnOnce() -> Result<(), cudarc::driver::DriverError>,
) -> DcpMlaStatus {
    guard(|| {
        if !memory_call(device, bytes, &[("dst", dst), ("src", src)])? {
            return Ok(());
        }
        copy().map_err(driver(call))
    })
}

fn nonnull<T>(arg: &str, p: *const T) -> R<()> {
    if p.is_null() {
        return Err(fail(DcpMlaStatus::NullPointer, format!("`{arg}` is a null pointer")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: the pointer is valid until the next call on this thread.
        unsafe { CStr::from_ptr(dcp_mla_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let s = guard(|| panic!("boom {}", 7));
        assert_eq!(s, DcpMlaStatus::Internal);
        assert!(last().contains("boom 7"), "{}", last());
        assert_eq!(guard(|| Ok(())), DcpMlaStatus::Success);
        assert_eq!(last(), "");
    }

    /// A struct as revision 5 defines it, and as a later revision that appends a field.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct V5 {
        struct_size: usize,
        device: *const DcpMlaDevice,
        stream: *mut c_void,
        rows: usize,
    }
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct V6 {
        v5: V5,
        added: usize,
    }
    // SAFETY: repr(C), struct_size first, all-zero valid.
    unsafe impl ArgsStruct for V6 {
        const NAME: &'static str = "DcpMlaTestArgs";
        const FIRST_SIZE: usize = std::mem::size_of::<V5>();
        fn device(&self) -> *const DcpMlaDevice {
            self.v5.device
        }
        fn stream(&self) -> *mut c_void {
            self.v5.stream
        }
    }
    // SAFETY: as above (the library as revision 5 built it).
    unsafe impl ArgsStruct for V5 {
        const NAME: &'static str = "DcpMlaTestArgs";
        const FIRST_SIZE: usize = std::mem::size_of::<V5>();
        fn device(&self) -> *const DcpMlaDevice {
            self.device
        }
        fn stream(&self) -> *mut c_void {
            self.stream
        }
    }

    fn v5(size: usize) -> V5 {
        V5 { struct_size: size, device: std::ptr::null(), stream: std::ptr::null_mut(), rows: 7 }
    }

    #[test]
    fn an_older_struct_is_read_with_the_new_fields_at_their_defaults() {
        // a caller built against revision 5 calls a library whose struct has grown
        let old = v5(std::mem::size_of::<V5>());
        // SAFETY: `old` holds struct_size bytes.
        let got = unsafe { read_args::<V6>((&old as *const V5).cast()) }.unwrap();
        assert_eq!((got.v5.rows, got.added), (7, 0));
        // and the same size is what it reads in full
        let full = V6 { v5: v5(std::mem::size_of::<V6>()), added: 3 };
        // SAFETY: as above.
        let got = unsafe { read_args::<V6>(&full) }.unwrap();
        assert_eq!((got.v5.rows, got.added), (7, 3));
    }

    #[test]
    fn a_newer_struct_is_read_when_its_extra_fields_are_zero_and_refused_by_name_otherwise() {
        // a caller built against a later revision calls a revision-5 library
        let mut newer = V6 { v5: v5(std::mem::size_of::<V6>()), added: 0 };
        // SAFETY: `newer` holds struct_size bytes.
        let got = unsafe { read_args::<V5>((&newer as *const V6).cast()) }.unwrap();
        assert_eq!(got.rows, 7);
        newer.added = 1;
        // SAFETY: as above.
        let e = unsafe { read_args::<V5>((&newer as *const V6).cast()) }.unwrap_err();
        assert_eq!(e.status, DcpMlaStatus::InvalidArgument);
        assert!(
            e.message.contains("`DcpMlaTestArgs.struct_size`") && e.message.contains("newer ABI revision"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_struct_smaller_than_its_first_revision_a_wild_size_and_null_are_refused_by_name() {
        for size in [0, 8, std::mem::size_of::<V5>() - 8] {
            let s = v5(size);
            // SAFETY: refused after reading struct_size only.
            let e = unsafe { read_args::<V5>(&s) }.unwrap_err();
            assert!(
                e.message.contains("`DcpMlaTestArgs.struct_size`") && e.message.contains("smaller"),
                "{}",
                e.message
            );
        }
        let s = v5(usize::MAX);
        // SAFETY: refused before anything past struct_size is read.
        let e = unsafe { read_args::<V5>(&s) }.unwrap_err();
        assert!(e.message.contains("no size of DcpMlaTestArgs"), "{}", e.message);
        // SAFETY: null is refused.
        let e = unsafe { read_args::<V5>(std::ptr::null()) }.unwrap_err();
        assert_eq!(e.status, DcpMlaStatus::NullPointer);
        assert!(e.message.contains("`args`"), "{}", e.message);
    }

    #[test]
    fn launcher_argument_names_become_the_c_fields() {
        assert_eq!(c_field("q_strides"), "q.strides");
        assert_eq!(c_field("block_table_stride"), "block_table.strides");
        assert_eq!(c_field("page_stride"), "cache.strides");
        assert_eq!(c_field("extra_page_stride"), "extra_cache.strides");
        assert_eq!(c_field("extra_indices_strides"), "extra_indices.strides");
        assert_eq!(c_field("extra_topk_len_strides"), "extra_topk_len.strides");
        assert_eq!(c_field("row_stride"), "scores.strides");
        assert_eq!(c_field("num_q"), "num_q");
        assert_eq!(c_field("nq"), "num_q");
    }

    #[test]
    fn library_errors_map_to_statuses() {
        use dcp_mla::Error as E;
        let map = |e: E| FfiError::from(e).status;
        assert_eq!(
            map(E::Misaligned { arg: "q", reason: "pointer 0x2 is not 16-byte aligned".into() }),
            DcpMlaStatus::Misaligned
        );
        assert_eq!(
            map(E::InvalidArgument { arg: "q", reason: "holds 3 elements".into() }),
            DcpMlaStatus::InvalidArgument
        );
        // the status follows the error's kind, not its wording
        assert_eq!(
            map(E::InvalidArgument { arg: "q", reason: "not aligned with the plan".into() }),
            DcpMlaStatus::InvalidArgument
        );
        assert_eq!(map(E::InvalidConfig("D·K".into())), DcpMlaStatus::InvalidConfig);
        assert_eq!(map(E::Unsupported("x".into())), DcpMlaStatus::Unsupported);
        assert_eq!(map(E::NoDriver), DcpMlaStatus::NoDevice);
        let cuda = E::Driver {
            call: "cuLaunchKernel",
            source: cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // (Its message asks libcuda for the error string: only formatted where a driver exists.)
        assert_eq!(status_of(&cuda), DcpMlaStatus::CudaError);
    }

    #[test]
    fn capability_follows_the_compiled_targets_and_shared_memory() {
        assert!(compute_capability_supported(9, 0));
        assert!(compute_capability_supported(8, 0));
        // sm_86 has the code (sm_80 SASS) but only 99 KiB of shared memory per block.
        assert!(has_code(8, 6) && !compute_capability_supported(8, 6));
        assert!(has_code(10, 0) && compute_capability_supported(10, 0));
        assert!(!has_code(7, 5) && !compute_capability_supported(7, 5));
    }

    #[test]
    fn every_status_has_a_name() {
        let name = |s: i32| {
            // SAFETY: static NUL-terminated strings.
            unsafe { CStr::from_ptr(dcp_mla_status_name(s)) }.to_str().unwrap()
        };
        assert_eq!(name(DcpMlaStatus::Success as i32), "DCP_MLA_STATUS_SUCCESS");
        assert_eq!(name(DcpMlaStatus::NoDevice as i32), "DCP_MLA_STATUS_NO_DEVICE");
        assert_eq!(name(DcpMlaStatus::Internal as i32), "DCP_MLA_STATUS_INTERNAL");
        // integers that are no status: a name, not undefined behaviour
        for bad in [-1, 10, 77, i32::MIN, i32::MAX] {
            assert_eq!(name(bad), "DCP_MLA_STATUS_UNKNOWN", "{bad}");
        }
    }
}
