//! DCP across GPUs: the group over NCCL ([`DcpGroup`], one process or thread per GPU, built from
//! a unique id or wrapping an engine's communicator) and a whole decode step of one layer on
//! one rank ([`DecodeStep`]), which owns its buffers so that it can be captured in a CUDA graph.
//!
//! NCCL is loaded with dlopen like the driver: without libnccl, constructors return
//! [`crate::Error::NoNccl`]. Set `NCCL_NVLS_ENABLE=0` on shared machines (NVLink multicast off).

pub mod group;
pub mod step;

pub use group::{nccl_present, DcpGroup, UniqueId};
pub use step::{stage_order, Attention, CombineShape, DecodeStep, Stage, StepConfig};

/// CUDA devices visible to this process (0 without a driver); never panics.
pub fn visible_devices() -> usize {
    let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return 0;
    }
    std::panic::catch_unwind(cudarc::driver::CudaContext::device_count)
        .ok()
        .and_then(|r| r.ok())
        .map_or(0, |n| n.max(0) as usize)
}
