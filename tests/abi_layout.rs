//! The Rust mirrors of kernels-src/abi.h must lay out every struct exactly as the C compiler
//! does: size, alignment and the offset of every field.

#[test]
fn rust_mirrors_match_c_layout() {
    let rust = dcp_mla::abi::rust_layouts();
    let c = dcp_mla::abi::c_layouts();
    assert!(!rust.is_empty(), "abi.h defines no structs");
    assert_eq!(rust.len(), c.len());
    for ((rn, rl), (cn, cl)) in rust.iter().zip(&c) {
        assert_eq!(rn, cn);
        assert_eq!(rl.len(), cl.len(), "{rn}: field count");
        assert_eq!(rl[0], cl[0], "{rn}: size");
        assert_eq!(rl[1], cl[1], "{rn}: alignment");
        for (i, (r, c)) in rl[2..].iter().zip(&cl[2..]).enumerate() {
            assert_eq!(r, c, "{rn}: offset of field {i}");
        }
    }
}

#[test]
fn every_kernel_params_struct_is_mirrored() {
    let names: Vec<&str> = dcp_mla::abi::rust_layouts().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"DcpKvFillParams"));
}
