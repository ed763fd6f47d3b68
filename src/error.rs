//! The library's error type: every fallible call returns one, naming what is wrong.

/// What went wrong, with the offending argument named where there is one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument failed validation before anything was launched or written.
    #[error("invalid argument `{arg}`: {reason}")]
    InvalidArgument { arg: &'static str, reason: String },
    /// A pointer or stride is not aligned as the kernel needs (its 16-byte vector accesses, or an
    /// element's size); refused before anything was launched or written.
    #[error("misaligned argument `{arg}`: {reason}")]
    Misaligned { arg: &'static str, reason: String },
    /// A configuration the planner rejects (docs/contract.md §1-§2 constraints).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The requested kernel variant was not compiled into this build.
    #[error("unsupported variant: {0}")]
    Unsupported(String),
    /// No CUDA driver library could be loaded on this machine.
    #[error("no CUDA driver found (libcuda could not be loaded): this machine has no usable NVIDIA GPU driver")]
    NoDriver,
    /// The driver loaded but reports no device with this ordinal.
    #[error("no CUDA device {ordinal}: {reason}")]
    NoDevice { ordinal: usize, reason: String },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {call}: {source}")]
    Driver { call: &'static str, source: cudarc::driver::DriverError },
    /// No NCCL library could be loaded: multi-GPU DCP groups need libnccl (2.x) at run time.
    #[error("no NCCL library found: cudarc dlopens `libnccl.so`; link it to a libnccl.so.2 in a directory on LD_LIBRARY_PATH (see dcp::find_libnccl)")]
    NoNccl,
    /// An NCCL call failed.
    #[error("NCCL error in {call}: {code}")]
    Nccl { call: &'static str, code: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn arg(arg: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { arg, reason: reason.into() }
    }

    /// The argument an invalid or misaligned argument error names.
    pub fn argument(&self) -> Option<&'static str> {
        match self {
            Error::InvalidArgument { arg, .. } | Error::Misaligned { arg, .. } => Some(arg),
            _ => None,
        }
    }
}

/// `ensure_kind!(Variant, cond, "arg", "reason {}", x)`: returns `Error::Variant { arg, reason }`
/// when `cond` fails (the body of `ensure_arg!` and `ensure_aligned!`).
#[macro_export]
#[doc(hidden)]
macro_rules! ensure_kind {
    ($kind:ident, $cond:expr, $arg:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::error::Error::$kind { arg: $arg, reason: format!($($fmt)+) });
        }
    };
}

/// `ensure_arg!(cond, "arg", "reason {}", x)`: returns `Error::InvalidArgument` when `cond` fails.
#[macro_export]
#[doc(hidden)]
macro_rules! ensure_arg {
    ($($t:tt)+) => { $crate::ensure_kind!(InvalidArgument, $($t)+) };
}

/// `ensure_aligned!(cond, "arg", "reason {}", x)`: returns `Error::Misaligned` when `cond` fails.
#[macro_export]
#[doc(hidden)]
macro_rules! ensure_aligned {
    ($($t:tt)+) => { $crate::ensure_kind!(Misaligned, $($t)+) };
}
