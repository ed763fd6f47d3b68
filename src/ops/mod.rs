//! Safe launchers. Each one validates its arguments (returning an error that names the
//! offending one), allocates nothing, never synchronises, and launches on the caller's stream.
//! Lengths, tables and indices stay in device memory, so captured CUDA graphs replay correctly.

pub mod combine;
pub mod decode;
pub mod fill;
pub mod prefill;
pub mod topk;

use crate::error::{Error, Result};
use crate::runtime::DeviceSlice;

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
    ensure_arg!((stride * size) % 16 == 0, arg, "row stride of {} bytes is not a multiple of 16", stride * size);
    ensure_arg!(buf.ptr() % 16 == 0 || rows == 0, arg, "pointer {:#x} is not 16-byte aligned", buf.ptr());
    let need = if rows == 0 { 0 } else { (rows - 1) * stride + width };
    ensure_arg!(buf.len() >= need, arg, "holds {} elements but {rows} rows need {need}", buf.len());
    Ok(())
}

/// Converts a host-side count to the kernels' int32, naming the argument when it does not fit.
pub(crate) fn to_i32(arg: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::arg(arg, format!("{v} exceeds the kernels' int32 range")))
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

    /// The argument an `Error::InvalidArgument` names; panics on any other error.
    pub fn arg_of(e: Error) -> &'static str {
        match e {
            Error::InvalidArgument { arg, .. } => arg,
            other => panic!("expected an invalid argument, got {other}"),
        }
    }
}
