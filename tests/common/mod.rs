//! Helpers shared by the integration tests.
//!
//! GPU tests are marked `#[ignore = "needs a CUDA GPU"]`, so a machine without one reports them
//! as ignored, never as passed. The device run (`scripts/gpu-run.sh`) runs them with
//! `--include-ignored`; there a missing GPU makes [`gpu`] panic: a failure, not a skip.
#![allow(dead_code)]

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use std::sync::{Arc, OnceLock};

/// The shared test device. Panics with the reason when no GPU can be opened.
pub fn gpu() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| match Device::open(0) {
        Ok(d) => d,
        Err(e) => panic!("this GPU test needs a CUDA device: {e}"),
    })
}

pub fn stream() -> Arc<CudaStream> {
    gpu().context().default_stream()
}

pub fn upload<T: DeviceRepr>(s: &Arc<CudaStream>, host: &[T]) -> CudaSlice<T> {
    s.clone_htod(host).expect("upload")
}

pub fn download<T: DeviceRepr + ValidAsZeroBits + Clone + Default>(s: &Arc<CudaStream>, dev: &CudaSlice<T>) -> Vec<T> {
    s.clone_dtoh(dev).expect("download")
}

pub fn view<T: DeviceRepr>(s: &Arc<CudaStream>, dev: &CudaSlice<T>) -> DeviceSlice<T> {
    DeviceSlice::of(dev, s)
}

pub fn raw(s: &Arc<CudaStream>) -> Stream {
    Stream::from_cudarc(s)
}

pub use dcp_mla::rng::Rng;

/// A seed that differs per run unless DCP_MLA_TEST_SEED fixes it; printed so a failure can be replayed.
pub fn seed() -> u64 {
    let s = std::env::var("DCP_MLA_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed = {s} (set DCP_MLA_TEST_SEED={s} to replay)");
    s
}
