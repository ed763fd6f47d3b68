//! The positional entry points of ABI revisions 1-4 (`dcp_mla_decode_dense(device, stream, q,
//! ...)` and the other launchers), kept as exported symbols that refuse by name: a program built
//! against an older header and linked dynamically against this library gets
//! DCP_MLA_STATUS_UNSUPPORTED and a message naming the revision-5 replacement, never a call that
//! reads its arguments as something else. Each takes no parameters: the C calling conventions
//! leave the caller's arguments to the caller, so reading none of them is safe whatever it
//! passed. Not in the header (cbindgen does not expand macros).

use crate::{fail, guard, DcpMlaStatus, DCP_MLA_ABI_VERSION};

macro_rules! removed {
    ($($old:ident => $new:literal, $args:literal;)*) => {$(
        /// A revision 1-4 entry point: refuses by name (see the module docs).
        #[no_mangle]
        pub extern "C" fn $old() -> DcpMlaStatus {
            refuse(stringify!($old), $new, $args)
        }
    )*};
}

fn refuse(old: &str, new: &str, args: &str) -> DcpMlaStatus {
    guard(|| {
        Err(fail(
            DcpMlaStatus::Unsupported,
            format!(
                "`{old}` is the positional entry point of C ABI revisions 1-4, removed in revision 5; this \
                 library implements revision {DCP_MLA_ABI_VERSION}: rebuild against its dcp_mla.h and call \
                 {new}(const {args} *) (CHANGELOG.md maps every old argument to its field)"
            ),
        ))
    })
}

removed! {
    dcp_mla_kv_fill => "dcp_mla_launch_kv_fill", "DcpMlaKvFillArgs";
    dcp_mla_decode_dense => "dcp_mla_launch_decode_dense", "DcpMlaDecodeDenseArgs";
    dcp_mla_decode_sparse => "dcp_mla_launch_decode_sparse", "DcpMlaDecodeSparseArgs";
    dcp_mla_ag_rs_correct => "dcp_mla_launch_ag_rs_correct", "DcpMlaAgRsCorrectArgs";
    dcp_mla_ag_rs_finish => "dcp_mla_launch_ag_rs_finish", "DcpMlaAgRsFinishArgs";
    dcp_mla_a2a_pack => "dcp_mla_launch_a2a_pack", "DcpMlaA2aPackArgs";
    dcp_mla_a2a_combine => "dcp_mla_launch_a2a_combine", "DcpMlaA2aCombineArgs";
    dcp_mla_merge_two => "dcp_mla_launch_merge_two", "DcpMlaMergeTwoArgs";
    dcp_mla_topk_local => "dcp_mla_launch_topk_local", "DcpMlaTopkLocalArgs";
    dcp_mla_topk_pack => "dcp_mla_launch_topk_pack", "DcpMlaTopkPackArgs";
    dcp_mla_topk_merge => "dcp_mla_launch_topk_merge", "DcpMlaTopkMergeArgs";
    dcp_mla_topk_compact => "dcp_mla_launch_topk_compact", "DcpMlaTopkCompactArgs";
    dcp_mla_prefill_flatten => "dcp_mla_launch_prefill_flatten", "DcpMlaPrefillFlattenArgs";
    dcp_mla_prefill_reorder => "dcp_mla_launch_prefill_reorder", "DcpMlaPrefillReorderArgs";
}
