//! Opening a device never panics: on a machine without a driver or GPU it is a typed error.

use dcp_mla::runtime::Device;
use dcp_mla::Error;

#[test]
fn open_returns_a_device_or_a_typed_error() {
    match Device::open(0) {
        Ok(dev) => {
            let (major, _) = dev.compute_capability();
            assert!(major >= 8, "the kernels need sm_80 or newer, found {major}");
        }
        Err(Error::NoDriver | Error::NoDevice { .. }) => {}
        Err(e) => panic!("unexpected error opening device 0: {e}"),
    }
    // An ordinal far beyond any machine is always an error, never a panic.
    assert!(matches!(Device::open(4096), Err(Error::NoDriver | Error::NoDevice { .. })));
}
