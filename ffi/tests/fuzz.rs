//! The C ABI's host-only entry points (the planner queries, the checks, the capability query)
//! take any integers a C caller can pass: each call returns a status, and never INTERNAL (a
//! caught panic, which would also print a panic message on the host's stderr).

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
