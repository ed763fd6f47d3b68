//! DCP across GPUs: the group over NCCL ([`DcpGroup`], one process or thread per GPU, built from
//! a unique id or wrapping an engine's communicator) and a whole decode step of one layer on
//! one rank ([`DecodeStep`]), which owns its buffers so that it can be captured in a CUDA graph.
//!
//! NCCL is loaded with dlopen like the driver: without libnccl, constructors return
//! [`crate::Error::NoNccl`]. Set `NCCL_NVLS_ENABLE=0` on shared machines (NVLink multicast off).

pub mod group;
pub mod step;

pub use group::{nccl_present, DcpGroup, UniqueId};

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
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

/// Where a `libnccl.so.2` is on this machine, for launchers that must make it visible to cudarc,
/// which dlopens `libnccl.so` (not the `.so.2` soname that the pip wheels and `libnccl2` ship):
/// `$DCP_MLA_NCCL_LIB` if set, else the first `libnccl.so.2` in `$LD_LIBRARY_PATH`, the system
/// library directories, or a Python `nvidia/nccl/lib` directory.
pub fn find_libnccl() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DCP_MLA_NCCL_LIB") {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/lib",
            "/usr/local/cuda/lib64",
            "/usr/lib/aarch64-linux-gnu",
        ]
        .map(PathBuf::from),
    );
    for root in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        let Ok(entries) = std::fs::read_dir(root) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("python3") {
                for sub in ["site-packages", "dist-packages"] {
                    dirs.push(e.path().join(sub).join("nvidia/nccl/lib"));
                }
            }
        }
    }
    dirs.into_iter().map(|d| d.join("libnccl.so.2")).find(|p| p.exists())
}

/// For single-machine launchers (tests, benchmarks): rank 0 creates the NCCL unique id and
/// publishes it atomically at `path`; every other rank waits (up to 2 minutes) and reads it.
pub fn exchange_id_via_file(rank: usize, path: &Path) -> Result<UniqueId> {
    if rank == 0 {
        let id = UniqueId::new()?;
        let tmp = path.with_extension("tmp");
        let io = |e: std::io::Error| Error::arg("path", format!("{}: {e}", path.display()));
        std::fs::write(&tmp, id.0).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        return Ok(id);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(b) = std::fs::read(path) {
            return UniqueId::from_bytes(&b);
        }
        if Instant::now() > deadline {
            return Err(Error::arg("path", format!("no NCCL id from rank 0 at {} after 2 minutes", path.display())));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// For launchers of child processes: `None` when cudarc can load NCCL here; otherwise an
/// `LD_LIBRARY_PATH` for the children that starts with a temp directory holding a `libnccl.so`
/// link to [`find_libnccl`]'s library (`None` too when there is none).
pub fn library_path_with_libnccl() -> Option<std::ffi::OsString> {
    if nccl_present() {
        return None;
    }
    let lib = find_libnccl()?;
    let dir = std::env::temp_dir().join(format!("dcp-mla-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).ok()?;
    let mut paths = vec![dir];
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&v));
    }
    std::env::join_paths(paths).ok()
}
