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

/// A small deterministic generator (xorshift64*), so failures can be replayed from the seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// A seed that differs per run unless DCP_MLA_TEST_SEED fixes it; printed so a failure can be replayed.
pub fn seed() -> u64 {
    let s = std::env::var("DCP_MLA_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed = {s} (set DCP_MLA_TEST_SEED={s} to replay)");
    s
}
