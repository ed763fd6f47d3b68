//! Builds `examples/demo.c` with the system C compiler (found by the cc crate), links it against
//! the staticlib `libdcp_mla_ffi.a`, and runs it. Without a GPU the demo must report
//! DCP_MLA_STATUS_NO_DEVICE with the library's message; on a GPU it runs fill + dense decode +
//! combine and checks a checksum it computes on the host.
//!
//! On a GPU machine without a compiler or the target folder (a staged run), set `DCP_MLA_DEMO`
//! to a demo built here: the host test leaves it at `target/<profile>/dcp_mla_demo`.

mod common;

use dcp_mla_ffi::{dcp_mla_device_close, dcp_mla_device_open, dcp_mla_last_error, DcpMlaStatus};
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The demo to run: `DCP_MLA_DEMO` if set, otherwise compiled and linked now.
fn demo() -> PathBuf {
    match std::env::var_os("DCP_MLA_DEMO") {
        Some(p) => PathBuf::from(p),
        None => common::build_c("examples/demo.c", "dcp_mla_demo"),
    }
}

fn run(demo: &Path) -> (Output, String) {
    let o = Command::new(demo).output().expect("running the demo");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o, text)
}

/// Opens device 0 through the ABI: Ok(()) with a GPU, Err(message) with NO_DEVICE.
fn device_status() -> Result<(), String> {
    let mut h = std::ptr::null_mut();
    // SAFETY: `h` is a valid out-pointer; the handle is closed at once.
    let s = unsafe { dcp_mla_device_open(0, &mut h) };
    match s {
        DcpMlaStatus::Success => {
            // SAFETY: an open handle, closed once.
            assert_eq!(unsafe { dcp_mla_device_close(h) }, DcpMlaStatus::Success);
            Ok(())
        }
        DcpMlaStatus::NoDevice => {
            assert!(h.is_null(), "a failed open must leave the handle null");
            // SAFETY: the thread's last error, read before any other call.
            Err(unsafe { CStr::from_ptr(dcp_mla_last_error()) }.to_string_lossy().into_owned())
        }
        other => panic!("dcp_mla_device_open returned {other:?}"),
    }
}

#[test]
fn demo_reports_no_device_without_a_gpu() {
    let demo = demo();
    let (o, text) = run(&demo);
    match device_status() {
        Err(message) => {
            assert_eq!(o.status.code(), Some(2), "the demo must exit 2 without a device:\n{text}");
            assert!(text.contains("DCP_MLA_STATUS_NO_DEVICE"), "{text}");
            assert!(!message.is_empty() && text.contains(&message), "the demo must print {message:?}:\n{text}");
            assert!(
                text.contains("DCP_MLA_STATUS_INVALID_CONFIG") && text.contains("D = 1") && text.contains("K = 256"),
                "{text}"
            );
        }
        // With a GPU the same demo must pass its checksum.
        Ok(()) => assert!(o.status.success() && text.contains("checksum ok"), "{text}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn demo_runs_fill_decode_combine_on_a_gpu() {
    if let Err(message) = device_status() {
        panic!("this GPU test needs a CUDA device: {message}");
    }
    let (o, text) = run(&demo());
    assert!(o.status.success(), "the demo failed:\n{text}");
    assert!(text.contains("checksum ok"), "{text}");
}
