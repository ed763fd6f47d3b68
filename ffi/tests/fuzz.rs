//! The C ABI's host-only entry points (the planner queries, the checks, the capability query)
//! take any integers a C caller can pass: each call returns a status, and never INTERNAL (a
//! caught panic, which would also print a panic message on the host's stderr). The MODEL1
//! launchers' checks (the conversion of their argument structs, then the library's checks that
//! run before a launch) take any sizes, strides and element counts the same way.

use dcp_mla_ffi::*;
use proptest::prelude::*;

#[path = "../../tests/common/edge_ints.rs"]
mod edge_ints;
use edge_ints::{any_u64, any_usize};

fn any_i32() -> impl Strategy<Value = i32> {
    prop_oneof![-3i32..20, Just(i32::MIN), Just(i32::MAX), any::<i32>()]
}

fn ok_or_typed(s: DcpMlaStatus, call: &str) -> Result<(), TestCaseError> {
    prop_assert!(s != DcpMlaStatus::Internal, "{call} panicked: {}", unsafe {
        // SAFETY: valid until the next call on this thread.
        std::ffi::CStr::from_ptr(dcp_mla_last_error()).to_string_lossy()
    });
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn host_queries_return_a_status_for_any_integers(
        a in any_usize(), b in any_usize(), c in any_usize(), d in any_usize(), e in any_usize(),
        x in any_u64(), y in any_u64(), i in any_i32(), j in any_i32(),
        lens in proptest::collection::vec(any_u64(), 0..4), qs in proptest::collection::vec(any::<u32>(), 0..4),
    ) {
        let (mut o64, mut o64b, mut oz, mut oz2, mut oz3, mut oz4, mut oi) = (0u64, 0u64, 0usize, 0usize, 0usize, 0usize, 0i32);
        // SAFETY: every pointer is a live local, and every array holds the count passed with it.
        unsafe {
            ok_or_typed(dcp_mla_compute_capability_supported(i, j, &mut oi), "compute_capability_supported")?;
            ok_or_typed(dcp_mla_check_config(a, b, c, d), "check_config")?;
            ok_or_typed(dcp_mla_check_topk(a, b), "check_topk")?;
            ok_or_typed(dcp_mla_check_decode(a, b, c, d, x), "check_decode")?;
            ok_or_typed(dcp_mla_local_len(a, b, c, x, &mut o64), "local_len")?;
            ok_or_typed(dcp_mla_token_address(a, b, c, x, &mut oz, &mut o64, &mut o64b), "token_address")?;
            ok_or_typed(dcp_mla_pages_for(a, b, x, &mut o64), "pages_for")?;
            ok_or_typed(dcp_mla_capacity(x, i, a, b, &mut o64, &mut o64b), "capacity")?;
            ok_or_typed(dcp_mla_decode_num_splits(a, b, c, i, d, &mut oz), "decode_num_splits")?;
            ok_or_typed(dcp_mla_decode_workspace_bytes(a, b, c, i, d, &mut oz), "decode_workspace_bytes")?;
            ok_or_typed(dcp_mla_a2a_slot_bytes(a, b, &mut oz), "a2a_slot_bytes")?;
            ok_or_typed(dcp_mla_ag_rs_workspace_bytes(a, b, c, &mut o64), "ag_rs_workspace_bytes")?;
            ok_or_typed(dcp_mla_topk_workspace_bytes(a, b, c, &mut o64), "topk_workspace_bytes")?;
            let n = lens.len().min(qs.len());
            let mut rows = vec![0i32; 64];
            ok_or_typed(
                dcp_mla_causal_local_lens(lens.as_ptr(), qs.as_ptr(), n, a % 10, b, c % 10, rows.as_mut_ptr(), rows.len()),
                "causal_local_lens",
            )?;
            ok_or_typed(
                dcp_mla_prefill_plan(lens.as_ptr(), lens.len(), a % 10, b, c, y, &mut oz, &mut oz2, &mut oz3, &mut oz4),
                "prefill_plan",
            )?;
            let mut table = vec![0i32; 8 * 16];
            ok_or_typed(
                dcp_mla_prefill_piece_table(lens.as_ptr(), lens.len(), a % 10, b, c, y, e % 4, table.as_mut_ptr(), 16),
                "prefill_piece_table",
            )?;
        }
    }
}

fn fake<T>(addr: u64, len: usize) -> dcp_mla::runtime::DeviceSlice<T> {
    // SAFETY: the checks below read the pointer and the length only; nothing is launched.
    unsafe { dcp_mla::runtime::DeviceSlice::from_raw(addr, len) }
}

fn tensor(addr: usize, numel: usize, dtype: i32, strides: &[usize]) -> DcpMlaTensor {
    let mut t = DcpMlaTensor { data: addr as *mut std::ffi::c_void, numel, dtype, ..Default::default() };
    t.num_strides = strides.len() as u32;
    t.strides[..strides.len()].copy_from_slice(strides);
    t
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any sizes, element counts and strides through the MODEL1 entry points (no device: the
    /// conversion's checks) and through the library's own checks on the same values: a status or
    /// an error, never a panic (an overflow in a size computation would be one).
    #[test]
    fn model1_checks_take_any_sizes(
        sizes in proptest::collection::vec(any_usize(), 10),
        numels in proptest::collection::vec(any_usize(), 6),
        strides in proptest::collection::vec(any_usize(), 4),
        extra in any::<bool>(),
        strided in any::<bool>(),
        scale in prop_oneof![Just(0.0f32), Just(-1.0f32), Just(f32::NAN), Just(0.05f32)],
    ) {
        let [batch, num_q, heads, num_splits, num_pages, block_size, topk, extra_pages, extra_block, extra_topk] =
            sizes[..] else { unreachable!() };
        let s = |i: usize| if strided { vec![strides[i]] } else { vec![] };
        let a = DcpMlaDecodeModel1Args {
            q: tensor(0x1000_0000, numels[0], DCP_MLA_DTYPE_BF16, &[]),
            out: tensor(0x2000_0000, numels[1], DCP_MLA_DTYPE_F32, &[]),
            lse: tensor(0x3000_0000, numels[2], DCP_MLA_DTYPE_F32, &[]),
            cache: tensor(0x4000_0000, numels[3], DCP_MLA_DTYPE_U8, &s(0)),
            indices: tensor(0x5000_0000, numels[4], DCP_MLA_DTYPE_I32, &[]),
            extra_cache: if extra { tensor(0x6000_0000, numels[5], DCP_MLA_DTYPE_I32, &s(1)) } else { DcpMlaTensor::default() },
            extra_indices: if extra { tensor(0x7000_0000, numels[4], DCP_MLA_DTYPE_I32, &[]) } else { DcpMlaTensor::default() },
            batch, num_q, heads, num_splits, num_pages, block_size, topk,
            extra_num_pages: if extra { extra_pages } else { 0 },
            extra_block_size: if extra { extra_block } else { 0 },
            extra_topk: if extra { extra_topk } else { 0 },
            scale,
            ..Default::default()
        };
        // SAFETY: fake buffers and no device: nothing is dereferenced or launched.
        ok_or_typed(unsafe { dcp_mla_launch_decode_model1(&a) }, "launch_decode_model1")?;
        let f = DcpMlaKvFillModel1Args {
            ckv: tensor(0x1000_0000, numels[0], DCP_MLA_DTYPE_BF16, &s(2)),
            kpe: tensor(0x2000_0000, numels[1], DCP_MLA_DTYPE_BF16, &s(3)),
            req_idx: tensor(0x3000_0000, numels[2], DCP_MLA_DTYPE_I32, &[]),
            positions: tensor(0x3100_0000, numels[2], DCP_MLA_DTYPE_I32, &[]),
            block_table: tensor(0x3200_0000, numels[4], DCP_MLA_DTYPE_I32, &s(1)),
            cache: tensor(0x4000_0000, numels[3], DCP_MLA_DTYPE_U8, &s(0)),
            batch, max_pages: topk, num_pages, block_size, dcp_size: heads % 10, interleave: num_q, rank: num_splits,
            ..Default::default()
        };
        // SAFETY: as above.
        ok_or_typed(unsafe { dcp_mla_launch_kv_fill_model1(&f) }, "launch_kv_fill_model1")?;

        // the library's checks on the same values (what runs once a device is given)
        use dcp_mla::formats::model1::Model1Pages;
        use dcp_mla::ops::decode::IndexLists;
        use dcp_mla::ops::fill::NewTokens;
        use dcp_mla::ops::model1::{decode_checks, fill_checks, Model1Decode, Model1Fill, Model1Source};
        let source = |cache_len, pages: Model1Pages, k| Model1Source {
            cache: fake(0x4000_0000, cache_len),
            pages,
            lists: IndexLists {
                indices: fake(0x5000_0000, numels[4]), indices_strides: strided.then_some([strides[0], strides[1]]),
                topk: k,
                topk_len: Some(fake(0x5100_0000, numels[2])), topk_len_strides: strided.then_some([strides[2], strides[3]]),
            },
        };
        let mut d = Model1Decode::new(
            dcp_mla::ops::decode::DecodeCommon::new(
                fake(0x1000_0000, numels[0]), batch, num_q, heads,
                dcp_mla::ops::Rows::F32(fake(0x2000_0000, numels[1])), fake(0x3000_0000, numels[2]),
                num_splits, fake(0x3100_0000, numels[5]),
            ),
            source(numels[3], Model1Pages { num_pages, block_size, page_stride: strides[0] }, topk),
        );
        if extra {
            d.extra = Some(source(numels[5], Model1Pages {
                num_pages: extra_pages, block_size: extra_block, page_stride: strides[1]
            }, extra_topk));
        }
        d.common.q_strides = strided.then_some([strides[0], strides[1], strides[2]]);
        let _ = decode_checks(&d);
        let fill = Model1Fill {
            tokens: NewTokens {
                ckv: fake(0x1000_0000, numels[0]), ckv_stride: strides[2],
                kpe: fake(0x2000_0000, numels[1]), kpe_stride: strides[3],
                req_idx: fake(0x3000_0000, numels[2]), positions: fake(0x3100_0000, numels[2]),
            },
            block_table: dcp_mla::ops::BlockTable {
                table: fake(0x3200_0000, numels[4]), stride: strides[1], max_pages: topk,
            },
            batch,
            cache: fake(0x4000_0000, numels[3]),
            pages: Model1Pages { num_pages, block_size, page_stride: strides[0] },
            dcp: dcp_mla::DcpLayout { size: heads % 10, interleave: num_q },
            rank: num_splits,
        };
        let _ = fill_checks(&fill);
    }
}
