//! Every status code through the exported functions. Argument checks run before the device
//! handle is looked at, so most need no GPU; the GPU ones are #[ignore]d.

use dcp_mla_ffi::*;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

fn last() -> String {
    // SAFETY: valid until the next call on this thread.
    unsafe { CStr::from_ptr(dcp_mla_last_error()) }.to_string_lossy().into_owned()
}

/// A tensor at a fake device address: never dereferenced, because every case fails before a
/// launch (or passes no device).
fn t(addr: usize, numel: usize, dtype: i32) -> DcpMlaTensor {
    DcpMlaTensor { data: addr as *mut c_void, numel, dtype, ..Default::default() }
}

const BF16: i32 = DCP_MLA_DTYPE_BF16;
const I32: i32 = DCP_MLA_DTYPE_I32;
const F32: i32 = DCP_MLA_DTYPE_F32;
const U8: i32 = DCP_MLA_DTYPE_U8;

/// kv_fill of 4 tokens with one tensor replaced and the format code given.
fn fill_args(dev: *const DcpMlaDevice, ckv: DcpMlaTensor, format: i32) -> DcpMlaKvFillArgs {
    DcpMlaKvFillArgs {
        device: dev,
        ckv,
        kpe: t(0x2000_0000, 4 * 64, BF16),
        req_idx: t(0x3000_0000, 4, I32),
        positions: t(0x3100_0000, 4, I32),
        block_table: t(0x3200_0000, 8, I32),
        batch: 1,
        max_pages: 8,
        cache: t(0x4000_0000, 8 * 64 * 1152, U8),
        num_pages: 8,
        block_size: 64,
        format,
        dcp_size: 2,
        interleave: 1,
        rank: 0,
        ..Default::default()
    }
}

unsafe fn fill(dev: *const DcpMlaDevice, ckv: DcpMlaTensor, format: i32) -> DcpMlaStatus {
    dcp_mla_launch_kv_fill(&fill_args(dev, ckv, format))
}

/// A two-way merge of `rows` f32 rows at fake addresses (or `out`/`lse` given).
fn merge_args(rows: usize) -> DcpMlaMergeTwoArgs {
    DcpMlaMergeTwoArgs {
        out_a: t(0x1000_0000, rows * 512, F32),
        lse_a: t(0x2000_0000, rows, F32),
        out_b: t(0x3000_0000, rows * 512, F32),
        lse_b: t(0x4000_0000, rows, F32),
        lse_a_base: DCP_MLA_LSE_BASE_E,
        lse_b_base: DCP_MLA_LSE_BASE_E,
        out: t(0x5000_0000, rows * 512, F32),
        lse: t(0x6000_0000, rows, F32),
        rows,
        ..Default::default()
    }
}

fn assert_status(got: DcpMlaStatus, want: DcpMlaStatus, needle: &str) {
    let msg = last();
    assert_eq!(got, want, "message: {msg}");
    assert!(msg.contains(needle), "{want:?}: {msg:?} should mention {needle:?}");
}

#[test]
fn success_clears_the_last_error_and_planner_queries_answer() {
    let mut n = 0u64;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(dcp_mla_local_len(4, 1, 3, 10, null_mut()), DcpMlaStatus::NullPointer);
        assert_eq!(dcp_mla_local_len(4, 1, 3, 10, &mut n), DcpMlaStatus::Success);
    }
    assert_eq!(last(), "");
    assert_eq!(n, dcp_mla::DcpLayout { size: 4, interleave: 1 }.local_len(10, 3));
    let (mut tokens, mut pages) = (0u64, 0u64);
    // SAFETY: valid out-pointers.
    let s = unsafe { dcp_mla_capacity(1 << 30, DCP_MLA_KV_FP8_656, 64, 4, &mut tokens, &mut pages) };
    assert_eq!(s, DcpMlaStatus::Success);
    assert_eq!(pages, (1u64 << 30) / (64 * 656));
    assert_eq!(tokens, pages * 64 * 4);
    let lens = [10u64, 3];
    let qs = [2u32, 2];
    let mut rows = [0i32; 4];
    // SAFETY: two requests, four output rows.
    let s = unsafe { dcp_mla_causal_local_lens(lens.as_ptr(), qs.as_ptr(), 2, 2, 1, 1, rows.as_mut_ptr(), 4) };
    assert_eq!(s, DcpMlaStatus::Success);
    let want = dcp_mla::planner::causal_local_lens(&lens, &[2, 2], dcp_mla::DcpLayout { size: 2, interleave: 1 }, 1);
    assert_eq!(rows.to_vec(), want.unwrap());
    // SAFETY: too short an output is refused before anything is written.
    let s = unsafe { dcp_mla_causal_local_lens(lens.as_ptr(), qs.as_ptr(), 2, 2, 1, 1, rows.as_mut_ptr(), 3) };
    assert_status(s, DcpMlaStatus::InvalidArgument, "out_len");
}

#[test]
fn workspace_queries_that_overflow_are_invalid_arguments_then_valid_ones_still_answer() {
    let big = usize::MAX / 2;
    let (mut n, mut u) = (0u64, 0usize);
    // SAFETY: valid out-pointers throughout.
    unsafe {
        assert_status(dcp_mla_ag_rs_workspace_bytes(8, big, 16, &mut n), DcpMlaStatus::InvalidArgument, "`num_tokens`");
        assert_status(dcp_mla_topk_workspace_bytes(4, big, 2048, &mut n), DcpMlaStatus::InvalidArgument, "`rows`");
        assert_status(dcp_mla_a2a_slot_bytes(big, 3, &mut u), DcpMlaStatus::InvalidArgument, "`num_tokens`");
        let s = dcp_mla_decode_workspace_bytes(4, 1, 64, 0, big, &mut u);
        assert_status(s, DcpMlaStatus::InvalidArgument, "`num_splits`");
        // and a valid query right after answers, with the last error cleared
        assert_eq!(dcp_mla_topk_workspace_bytes(4, 128, 2048, &mut n), DcpMlaStatus::Success);
        assert_eq!(n, dcp_mla::planner::workspace::topk_bytes(4, 128, 2048).unwrap());
        assert_eq!(last(), "");
    }
}

#[test]
fn status_names_cover_unknown_integers() {
    // SAFETY: static strings.
    let name = |s: i32| unsafe { CStr::from_ptr(dcp_mla_status_name(s)) }.to_str().unwrap().to_string();
    assert_eq!(name(DcpMlaStatus::InvalidArgument as i32), "DCP_MLA_STATUS_INVALID_ARGUMENT");
    assert_eq!(name(-7), "DCP_MLA_STATUS_UNKNOWN");
    assert_eq!(name(1000), "DCP_MLA_STATUS_UNKNOWN");
}

#[test]
fn invalid_argument_names_the_argument() {
    let mut n = 0u64;
    // SAFETY: valid out-pointer.
    let s = unsafe { dcp_mla_local_len(4, 1, 4, 10, &mut n) };
    assert_status(s, DcpMlaStatus::InvalidArgument, "`rank`");
    // SAFETY: valid out-pointer.
    let s = unsafe { dcp_mla_device_open(-1, &mut null_mut()) };
    assert_status(s, DcpMlaStatus::InvalidArgument, "`ordinal`");
}

#[test]
fn null_pointers_are_refused_before_the_device() {
    // SAFETY: nothing is dereferenced: the null ckv is refused first.
    let s = unsafe { fill(null(), t(0, 4 * 512, BF16), DCP_MLA_KV_BF16) };
    assert_status(s, DcpMlaStatus::NullPointer, "`ckv`");
    // With every argument well formed, the null handle is what is refused.
    // SAFETY: as above; no device means no launch.
    let s = unsafe { fill(null(), t(0x1000_0000, 4 * 512, BF16), DCP_MLA_KV_BF16) };
    assert_status(s, DcpMlaStatus::NullPointer, "`device`");
    // SAFETY: null out-pointer.
    let s = unsafe { dcp_mla_device_open(0, null_mut()) };
    assert_status(s, DcpMlaStatus::NullPointer, "`device`");
}

#[test]
fn misaligned_pointers_are_refused() {
    // SAFETY: refused before any use.
    let s = unsafe { fill(null(), t(0x1000_0001, 4 * 512, BF16), DCP_MLA_KV_BF16) };
    assert_status(s, DcpMlaStatus::Misaligned, "`ckv`");
}

#[test]
fn bad_dtype_and_format_codes_are_refused() {
    // SAFETY: refused before any use.
    unsafe {
        assert_status(fill(null(), t(0x1000_0000, 4 * 512, F32), DCP_MLA_KV_BF16), DcpMlaStatus::BadDtype, "`ckv`");
        assert_status(fill(null(), t(0x1000_0000, 4 * 512, 99), DCP_MLA_KV_BF16), DcpMlaStatus::BadDtype, "99");
        assert_status(fill(null(), t(0x1000_0000, 4 * 512, BF16), 7), DcpMlaStatus::BadDtype, "`format`");
        // each input's base code is checked, and named, on its own; the combines' row tensors
        // take bf16 or f32 (merge_two's inputs, the ag_rs contribution and sum), nothing else
        let merge = |base_a: i32, base_b: i32, dtype_b: i32| {
            let a = DcpMlaMergeTwoArgs {
                out_b: t(0x3000_0000, 512, dtype_b),
                lse_a_base: base_a,
                lse_b_base: base_b,
                ..merge_args(1)
            };
            dcp_mla_launch_merge_two(&a)
        };
        assert_status(merge(0, DCP_MLA_LSE_BASE_E, F32), DcpMlaStatus::BadDtype, "`lse_a_base`");
        assert_status(merge(DCP_MLA_LSE_BASE_2, 9, F32), DcpMlaStatus::BadDtype, "`lse_b_base`");
        assert_status(merge(DCP_MLA_LSE_BASE_E, DCP_MLA_LSE_BASE_E, I32), DcpMlaStatus::BadDtype, "`out_b`");
        let correct = dcp_mla_launch_ag_rs_correct(&DcpMlaAgRsCorrectArgs {
            out: t(0x1000_0000, 512, BF16),
            lse_all: t(0x2000_0000, 1, F32),
            lse_base: DCP_MLA_LSE_BASE_E,
            contrib: t(0x3000_0000, 512, U8),
            num_tokens: 1,
            local_heads: 1,
            dcp_size: 1,
            ..Default::default()
        });
        assert_status(correct, DcpMlaStatus::BadDtype, "`contrib`");
        let finish = dcp_mla_launch_ag_rs_finish(&DcpMlaAgRsFinishArgs {
            summed: t(0x1000_0000, 512, I32),
            lse_all: t(0x2000_0000, 1, F32),
            lse_base: DCP_MLA_LSE_BASE_E,
            out: t(0x3000_0000, 512, BF16),
            lse: t(0x4000_0000, 1, F32),
            num_tokens: 1,
            local_heads: 1,
            dcp_size: 1,
            ..Default::default()
        });
        assert_status(finish, DcpMlaStatus::BadDtype, "`summed`");
    }
}

/// A MODEL1 decode of 2 requests, 64 heads over 8 pages of 64 tokens, with (or without) a
/// second source of 3 pages of 2 tokens: fake buffers, refused before any use.
fn model1_args(extra: bool) -> DcpMlaDecodeModel1Args {
    let rows = 2 * 64;
    let mut a = DcpMlaDecodeModel1Args {
        q: t(0x1000_0000, rows * 512, BF16),
        out: t(0x2000_0000, rows * 512, BF16),
        lse: t(0x3000_0000, rows, F32),
        cache: t(0x4000_0000, 8 * 37_440, U8),
        indices: t(0x5000_0000, 2 * 128, I32),
        batch: 2,
        num_q: 1,
        heads: 64,
        num_splits: 1,
        num_pages: 8,
        block_size: 64,
        topk: 128,
        ..Default::default()
    };
    if extra {
        a.extra_cache = t(0x6000_0000, 3 * 1_728, U8);
        a.extra_indices = t(0x7000_0000, 2 * 64, I32);
        a.extra_num_pages = 3;
        a.extra_block_size = 2;
        a.extra_topk = 64;
    }
    a
}

fn model1_fill_args() -> DcpMlaKvFillModel1Args {
    DcpMlaKvFillModel1Args {
        ckv: t(0x1000_0000, 4 * 448, BF16),
        kpe: t(0x2000_0000, 4 * 64, BF16),
        req_idx: t(0x3000_0000, 4, I32),
        positions: t(0x3100_0000, 4, I32),
        block_table: t(0x3200_0000, 8, I32),
        cache: t(0x4000_0000, 8 * 37_440, U8),
        batch: 1,
        max_pages: 8,
        num_pages: 8,
        block_size: 64,
        dcp_size: 1,
        interleave: 1,
        rank: 0,
        ..Default::default()
    }
}

#[test]
fn model1_launchers_refuse_by_field_before_the_device() {
    let decode = |edit: &dyn Fn(&mut DcpMlaDecodeModel1Args), extra: bool| {
        let mut a = model1_args(extra);
        edit(&mut a);
        // SAFETY: fake buffers, refused before any use (no device).
        unsafe { dcp_mla_launch_decode_model1(&a) }
    };
    // well formed, one source or two: as far as the null device
    assert_status(decode(&|_| {}, false), DcpMlaStatus::NullPointer, "`device`");
    assert_status(decode(&|_| {}, true), DcpMlaStatus::NullPointer, "`device`");
    // the tensors' own checks, each naming its field
    assert_status(decode(&|a| a.q.data = null_mut(), true), DcpMlaStatus::NullPointer, "`q`");
    assert_status(decode(&|a| a.q.dtype = F32, true), DcpMlaStatus::BadDtype, "`q`");
    assert_status(decode(&|a| a.out.dtype = I32, true), DcpMlaStatus::BadDtype, "`out`");
    assert_status(decode(&|a| a.indices.dtype = F32, true), DcpMlaStatus::BadDtype, "`indices`");
    assert_status(decode(&|a| a.extra_indices.data = null_mut(), true), DcpMlaStatus::NullPointer, "`extra_indices`");
    assert_status(decode(&|a| a.extra_indices.dtype = BF16, true), DcpMlaStatus::BadDtype, "`extra_indices`");
    let misaligned = |a: &mut DcpMlaDecodeModel1Args| a.extra_topk_len = t(0x7100_0002, 2, I32);
    assert_status(decode(&misaligned, true), DcpMlaStatus::Misaligned, "`extra_topk_len`");
    assert_status(decode(&|a| a.extra_cache.dtype = 99, true), DcpMlaStatus::BadDtype, "`extra_cache`");
    assert_status(
        decode(&|a| a.extra_cache.num_strides = 2, true),
        DcpMlaStatus::InvalidArgument,
        "`extra_cache.num_strides`",
    );
    assert_status(decode(&|a| a.topk_len = t(0x5100_0000, 2, I32), false), DcpMlaStatus::NullPointer, "`device`");
    assert_status(decode(&|a| a.schedule = 9, false), DcpMlaStatus::InvalidArgument, "`schedule`");
    assert_status(decode(&|a| a._reserved = 1, false), DcpMlaStatus::InvalidArgument, "`_reserved`");
    // a second source's field without its cache is refused, not ignored
    type Edit = Box<dyn Fn(&mut DcpMlaDecodeModel1Args)>;
    let unused: Vec<(&str, Edit)> = vec![
        ("`extra_indices`", Box::new(|a| a.extra_indices = t(0x7000_0000, 128, I32))),
        ("`extra_topk_len`", Box::new(|a| a.extra_topk_len = t(0x7100_0000, 2, I32))),
        ("`extra_num_pages`", Box::new(|a| a.extra_num_pages = 1)),
        ("`extra_block_size`", Box::new(|a| a.extra_block_size = 64)),
        ("`extra_topk`", Box::new(|a| a.extra_topk = 1)),
    ];
    for (field, edit) in unused {
        assert_status(decode(&*edit, false), DcpMlaStatus::InvalidArgument, field);
        assert!(last().contains("extra_cache is absent"), "{}", last());
    }
    // the struct itself
    let a = DcpMlaDecodeModel1Args { struct_size: 64, ..model1_args(false) };
    // SAFETY: refused after reading struct_size.
    let s = unsafe { dcp_mla_launch_decode_model1(&a) };
    assert_status(s, DcpMlaStatus::InvalidArgument, "`DcpMlaDecodeModel1Args.struct_size`");
    // SAFETY: a null struct is refused.
    assert_status(unsafe { dcp_mla_launch_decode_model1(null()) }, DcpMlaStatus::NullPointer, "`args`");

    let fill = |edit: &dyn Fn(&mut DcpMlaKvFillModel1Args)| {
        let mut a = model1_fill_args();
        edit(&mut a);
        // SAFETY: as above.
        unsafe { dcp_mla_launch_kv_fill_model1(&a) }
    };
    assert_status(fill(&|_| {}), DcpMlaStatus::NullPointer, "`device`");
    assert_status(fill(&|a| a.ckv.data = null_mut()), DcpMlaStatus::NullPointer, "`ckv`");
    assert_status(fill(&|a| a.ckv.data = 0x1000_0001 as *mut c_void), DcpMlaStatus::Misaligned, "`ckv`");
    assert_status(fill(&|a| a.kpe.dtype = F32), DcpMlaStatus::BadDtype, "`kpe`");
    assert_status(fill(&|a| a.req_idx.dtype = BF16), DcpMlaStatus::BadDtype, "`req_idx`");
    assert_status(fill(&|a| a.cache.num_strides = 3), DcpMlaStatus::InvalidArgument, "`cache.num_strides`");
    assert_status(fill(&|a| a.block_table.num_strides = 2), DcpMlaStatus::InvalidArgument, "`block_table.num_strides`");
    let a = DcpMlaKvFillModel1Args { struct_size: 8, ..model1_fill_args() };
    // SAFETY: refused after reading struct_size.
    let s = unsafe { dcp_mla_launch_kv_fill_model1(&a) };
    assert_status(s, DcpMlaStatus::InvalidArgument, "`DcpMlaKvFillModel1Args.struct_size`");
}

#[test]
fn topk_constraints_are_invalid_config_naming_d_and_k() {
    // D·K % 512 is live with K = 256: D = 1 is refused, naming both
    assert_status(dcp_mla_check_topk(1, 256), DcpMlaStatus::InvalidConfig, "D = 1");
    assert!(last().contains("K = 256"), "{}", last());
    assert_status(dcp_mla_check_topk(4, 768), DcpMlaStatus::InvalidConfig, "K = 768");
    assert_eq!(dcp_mla_check_topk(2, 256), DcpMlaStatus::Success);
    assert_eq!(dcp_mla_check_topk(4, 2048), DcpMlaStatus::Success);
    // The merge checks D·K before it needs a device.
    let merge = |d: usize, k: usize| unsafe {
        // SAFETY: refused before any use.
        dcp_mla_launch_topk_merge(&DcpMlaTopkMergeArgs {
            cand_scores: t(0x1000_0000, d * 2 * k, F32),
            cand_ids: t(0x2000_0000, d * 2 * k, I32),
            dcp_size: d,
            rows: 2,
            k,
            out: t(0x3000_0000, 2 * k, I32),
            ..Default::default()
        })
    };
    assert_status(merge(1, 256), DcpMlaStatus::InvalidConfig, "D = 1");
    // D = 16 passes D·K % 512 but is no built DCP size: the planner refuses it, as it does D = 3
    assert_status(merge(16, 512), DcpMlaStatus::InvalidConfig, "D = 16");
    assert_status(merge(4, 512), DcpMlaStatus::NullPointer, "`device`");
    assert_status(dcp_mla_check_config(8, 3, 1, 64), DcpMlaStatus::InvalidConfig, "D = 3");
}

#[test]
fn uncompiled_variants_are_unsupported() {
    // SAFETY: refused before any use.
    let s = unsafe {
        dcp_mla_launch_a2a_combine(&DcpMlaA2aCombineArgs {
            recv: t(0x1000_0000, 3 * 4096, U8),
            slot_bytes: 4096,
            lse_base: DCP_MLA_LSE_BASE_E,
            out: t(0x2000_0000, 512, BF16),
            lse: t(0x3000_0000, 1, F32),
            num_tokens: 1,
            local_heads: 1,
            dcp_size: 3,
            ..Default::default()
        })
    };
    assert_status(s, DcpMlaStatus::Unsupported, "D = 3");
    let mut supported = 1;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { dcp_mla_compute_capability_supported(7, 5, &mut supported) }, DcpMlaStatus::Success);
    assert_eq!(supported, 0);
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { dcp_mla_compute_capability_supported(9, 0, &mut supported) }, DcpMlaStatus::Success);
    assert_eq!(supported, 1);
}

#[test]
fn a_missing_device_is_no_device() {
    let mut h = null_mut();
    // SAFETY: valid out-pointer; no machine has device 9999.
    let s = unsafe { dcp_mla_device_open(9999, &mut h) };
    assert_eq!(s, DcpMlaStatus::NoDevice, "{}", last());
    assert!(h.is_null() && !last().is_empty());
}

#[test]
fn variants_are_listed() {
    let n = dcp_mla_variant_count();
    assert_eq!(n, dcp_mla::runtime::registry::KERNELS.len());
    let names: Vec<String> = (0..n)
        // SAFETY: static strings for in-range indices.
        .map(|i| unsafe { CStr::from_ptr(dcp_mla_variant_name(i)) }.to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|s| s.starts_with("dcp_kv_fill")), "{names:?}");
    assert!(dcp_mla_variant_name(n).is_null());
}

/// A device for the GPU tests below.
fn open() -> *mut DcpMlaDevice {
    let mut h = null_mut();
    // SAFETY: valid out-pointer.
    let s = unsafe { dcp_mla_device_open(0, &mut h) };
    assert_eq!(s, DcpMlaStatus::Success, "this GPU test needs a CUDA device: {}", last());
    h
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_failing_driver_call_is_cuda_error() {
    let dev = open();
    let mut p = null_mut();
    // SAFETY: an open handle and a valid out-pointer; 2^50 bytes cannot be allocated.
    let s = unsafe { dcp_mla_malloc(dev, 1 << 50, &mut p) };
    assert_status(s, DcpMlaStatus::CudaError, "cuMemAlloc");
    assert!(p.is_null());
    // SAFETY: closed once.
    assert_eq!(unsafe { dcp_mla_device_close(dev) }, DcpMlaStatus::Success);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_rejected_launch_writes_nothing() {
    let dev = open();
    let poison = vec![0xA5u8; 4 * 512 * 4];
    let mut out = null_mut();
    // SAFETY: buffers from dcp_mla_malloc on the open device, sized as passed.
    unsafe {
        assert_eq!(dcp_mla_malloc(dev, poison.len(), &mut out), DcpMlaStatus::Success);
        assert_eq!(dcp_mla_memcpy_htod(dev, out, poison.as_ptr().cast(), poison.len()), DcpMlaStatus::Success);
        let mut inputs = null_mut();
        assert_eq!(dcp_mla_malloc(dev, 4 * 513 * 4 * 2, &mut inputs), DcpMlaStatus::Success);
        let base = inputs as usize;
        let (out_a, out_b) = (base, base + 4 * 512 * 4);
        let (lse_a, lse_b) = (base + 8 * 512 * 4, base + 8 * 512 * 4 + 16);
        let mut lse = null_mut();
        assert_eq!(dcp_mla_malloc(dev, 16, &mut lse), DcpMlaStatus::Success);
        let merge = |lse_b_numel: usize, out_addr: usize, rows: usize| {
            dcp_mla_launch_merge_two(&DcpMlaMergeTwoArgs {
                device: dev,
                out_a: t(out_a, 4 * 512, F32),
                lse_a: t(lse_a, 4, F32),
                out_b: t(out_b, 4 * 512, F32),
                lse_b: t(lse_b, lse_b_numel, F32),
                lse_a_base: DCP_MLA_LSE_BASE_E,
                lse_b_base: DCP_MLA_LSE_BASE_2,
                out: t(out_addr, rows * 512, F32),
                lse: t(lse as usize, rows, F32),
                rows,
                ..Default::default()
            })
        };
        // lse_b holds 3 of the 4 rows' values: refused, nothing launched.
        assert_status(merge(3, out as usize, 4), DcpMlaStatus::InvalidArgument, "`lse_b`");
        // A misaligned output row (4-byte aligned, not 16): the library's own check.
        let s = merge(4, out as usize + 4, 3);
        assert_status(s, DcpMlaStatus::Misaligned, "`out`");
        assert_eq!(dcp_mla_synchronize(dev), DcpMlaStatus::Success);
        let mut back = vec![0u8; poison.len()];
        assert_eq!(dcp_mla_memcpy_dtoh(dev, back.as_mut_ptr().cast(), out, back.len()), DcpMlaStatus::Success);
        assert!(back == poison, "a refused launch wrote to its output");
        for p in [out, inputs, lse] {
            assert_eq!(dcp_mla_free(dev, p), DcpMlaStatus::Success);
        }
        assert_eq!(dcp_mla_device_close(dev), DcpMlaStatus::Success);
    }
}

/// bf16 merge inputs through the C ABI (a dtype code the Rust API takes as a type): the merged
/// rows match the reference on the widened inputs, for a bf16 and an fp32 output, and a row
/// whose lse is +inf (an empty shard) takes the other input whole.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_merge_inputs_through_the_c_abi_match_the_reference() {
    use dcp_mla::reference::merge::merge_two as ref_merge_two;
    use half::bf16;
    const N: usize = 6;
    const W: usize = 512;
    // deterministic inputs of mixed sign and size (a multiplicative hash, no RNG dependency)
    let val = |i: usize, salt: u32| {
        let h = (i as u32 ^ salt).wrapping_mul(2_654_435_761) >> 8;
        (h % 4001) as f32 / 1000.0 - 2.0
    };
    let a: Vec<bf16> = (0..N * W).map(|i| bf16::from_f32(val(i, 0x51))).collect();
    let b: Vec<bf16> = (0..N * W).map(|i| bf16::from_f32(val(i, 0xA7))).collect();
    let lse_a: Vec<f32> = vec![1.5, -0.25, 3.0, 0.0, f32::INFINITY, 7.0];
    let lse_b: Vec<f32> = vec![0.75, 2.0, 3.0, -4.0, 1.0, f32::INFINITY];
    let wide = |x: &[bf16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let (want_out, want_lse) =
        ref_merge_two(&wide(&a), &lse_a, dcp_mla::LseBase::E, &wide(&b), &lse_b, dcp_mla::LseBase::Two, None);
    let dev = open();
    // SAFETY: buffers from dcp_mla_malloc on the open device, sized as passed; copies of host
    // vectors of those sizes.
    unsafe {
        let up = |bytes: &[u8]| {
            let mut p = null_mut();
            assert_eq!(dcp_mla_malloc(dev, bytes.len(), &mut p), DcpMlaStatus::Success);
            assert_eq!(dcp_mla_memcpy_htod(dev, p, bytes.as_ptr().cast(), bytes.len()), DcpMlaStatus::Success);
            p
        };
        let down = |p: *mut c_void, len: usize| {
            let mut raw = vec![0u8; len];
            assert_eq!(dcp_mla_memcpy_dtoh(dev, raw.as_mut_ptr().cast(), p, len), DcpMlaStatus::Success);
            raw
        };
        let f32s =
            |raw: &[u8]| raw.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>();
        let bytes_of = |x: &[bf16]| x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect::<Vec<u8>>();
        let f32_bytes = |x: &[f32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        let (d_a, d_b) = (up(&bytes_of(&a)), up(&bytes_of(&b)));
        let (d_la, d_lb) = (up(&f32_bytes(&lse_a)), up(&f32_bytes(&lse_b)));
        for out_dtype in [BF16, F32] {
            let elem = if out_dtype == BF16 { 2 } else { 4 };
            let d_out = up(&vec![0xFFu8; N * W * elem]);
            let d_lse = up(&[0xFFu8; N * 4]);
            let s = dcp_mla_launch_merge_two(&DcpMlaMergeTwoArgs {
                device: dev,
                out_a: t(d_a as usize, N * W, BF16),
                lse_a: t(d_la as usize, N, F32),
                out_b: t(d_b as usize, N * W, BF16),
                lse_b: t(d_lb as usize, N, F32),
                lse_a_base: DCP_MLA_LSE_BASE_E,
                lse_b_base: DCP_MLA_LSE_BASE_2,
                out: t(d_out as usize, N * W, out_dtype),
                lse: t(d_lse as usize, N, F32),
                rows: N,
                ..Default::default()
            });
            assert_status(s, DcpMlaStatus::Success, "");
            assert_eq!(dcp_mla_synchronize(dev), DcpMlaStatus::Success);
            let raw = down(d_out, N * W * elem);
            let got: Vec<f32> = if out_dtype == BF16 {
                raw.chunks(2).map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
            } else {
                f32s(&raw)
            };
            let got_lse = f32s(&down(d_lse, N * 4));
            for r in 0..N {
                let l = (got_lse[r], want_lse[r]);
                assert!(
                    (l.0 - l.1).abs() <= 1e-5 * l.1.abs().max(1.0),
                    "dtype {out_dtype} row {r}: lse {} vs {}",
                    l.0,
                    l.1
                );
                // a merged value is a convex combination: bound by the row's largest input
                // (one bf16 rounding of the output, 2^-8 of it, plus fp32 and exp differences)
                let mag =
                    (0..W).map(|j| a[r * W + j].to_f32().abs().max(b[r * W + j].to_f32().abs())).fold(0.0f32, f32::max);
                for j in 0..W {
                    let (g, w) = (got[r * W + j], want_out[r * W + j]);
                    assert!((g - w).abs() <= mag / 256.0 + 1e-5, "dtype {out_dtype} [{r}, {j}]: {g} vs {w}");
                }
            }
            // the empty-shard rows take the other input exactly (coefficient 1 and 0)
            for (r, src) in [(4, &b), (5, &a)] {
                for j in 0..W {
                    assert_eq!(got[r * W + j], src[r * W + j].to_f32(), "dtype {out_dtype} row {r} is the other input");
                }
            }
            for p in [d_out, d_lse] {
                assert_eq!(dcp_mla_free(dev, p), DcpMlaStatus::Success);
            }
        }
        for p in [d_a, d_b, d_la, d_lb] {
            assert_eq!(dcp_mla_free(dev, p), DcpMlaStatus::Success);
        }
        assert_eq!(dcp_mla_device_close(dev), DcpMlaStatus::Success);
    }
}

#[test]
fn the_tuned_split_query_refuses_a_null_device() {
    let mut out = 0usize;
    // SAFETY: a null handle is refused before anything is read.
    let s = unsafe { dcp_mla_decode_num_splits_on(null(), 0, DCP_MLA_KV_BF16, 8, 1, 64, 4096, 0, &mut out) };
    assert_status(s, DcpMlaStatus::NullPointer, "`device`");
    assert_eq!(out, 0, "nothing written");
}

/// The compatibility rule of the argument structs (the header's comment), through a real entry
/// point: each case is either refused by name or gets as far as the null device.
#[test]
fn argument_structs_follow_the_compatibility_rule() {
    let size = std::mem::size_of::<DcpMlaMergeTwoArgs>();
    // A caller built against a later revision: a larger struct whose extra bytes are zero is
    // served (here: to the null device), one with a field set there is refused by name.
    #[repr(C)]
    struct Newer {
        args: DcpMlaMergeTwoArgs,
        added: [u64; 2],
    }
    let mut newer = Newer { args: merge_args(1), added: [0; 2] };
    newer.args.struct_size = std::mem::size_of::<Newer>();
    // SAFETY: `newer` holds struct_size bytes; no device, so nothing launches.
    let s = unsafe { dcp_mla_launch_merge_two(&newer.args) };
    assert_status(s, DcpMlaStatus::NullPointer, "`device`");
    newer.added[1] = 5;
    // SAFETY: as above.
    let s = unsafe { dcp_mla_launch_merge_two(&newer.args) };
    assert_status(s, DcpMlaStatus::InvalidArgument, "`DcpMlaMergeTwoArgs.struct_size`");
    assert!(last().contains(&format!("byte {}", size + 8)), "{}", last());
    // A size below revision 5's (an uninitialised or wrong struct_size), a wild one, none.
    for bad in [0, 8, size - 8, 1 << 40] {
        let a = DcpMlaMergeTwoArgs { struct_size: bad, ..merge_args(1) };
        // SAFETY: refused after reading struct_size.
        let s = unsafe { dcp_mla_launch_merge_two(&a) };
        assert_status(s, DcpMlaStatus::InvalidArgument, "`DcpMlaMergeTwoArgs.struct_size`");
    }
    // SAFETY: a null struct is refused.
    let s = unsafe { dcp_mla_launch_merge_two(null()) };
    assert_status(s, DcpMlaStatus::NullPointer, "`args`");
    // Padding must be zero; a stride count a field does not take is refused by name.
    let mut a = DcpMlaAgRsCorrectArgs {
        out: t(0x1000_0000, 512, BF16),
        lse_all: t(0x2000_0000, 1, F32),
        lse_base: DCP_MLA_LSE_BASE_E,
        contrib: t(0x3000_0000, 512, F32),
        num_tokens: 1,
        local_heads: 1,
        dcp_size: 1,
        _reserved: 1,
        ..Default::default()
    };
    // SAFETY: refused before any use.
    assert_status(unsafe { dcp_mla_launch_ag_rs_correct(&a) }, DcpMlaStatus::InvalidArgument, "`_reserved`");
    a._reserved = 0;
    a.lse_all.num_strides = 1;
    // SAFETY: as above.
    let s = unsafe { dcp_mla_launch_ag_rs_correct(&a) };
    assert_status(s, DcpMlaStatus::InvalidArgument, "`lse_all.num_strides`");
    let mut f = fill_args(null(), t(0x1000_0000, 4 * 512, BF16), DCP_MLA_KV_BF16);
    f.ckv.num_strides = 3;
    // SAFETY: as above.
    assert_status(unsafe { dcp_mla_launch_kv_fill(&f) }, DcpMlaStatus::InvalidArgument, "`ckv.num_strides`");
    // A page stride that is no whole number of rows is refused by its C name.
    let mut f = fill_args(null(), t(0x1000_0000, 4 * 512, BF16), DCP_MLA_KV_BF16);
    f.cache.num_strides = 1;
    f.cache.strides[0] = 64 * 1152 + 3;
    // SAFETY: as above.
    assert_status(unsafe { dcp_mla_launch_kv_fill(&f) }, DcpMlaStatus::InvalidArgument, "`cache.strides`");
}

/// A program built against revisions 1-4 that calls a positional entry point gets a refusal
/// naming the replacement, whatever it passes (here: the old kv_fill's first arguments).
#[test]
fn a_revision_4_caller_is_refused_by_name() {
    extern "C" {
        #[link_name = "dcp_mla_decode_dense"]
        fn old_decode_dense(
            device: *const c_void,
            stream: *mut c_void,
            q: DcpMlaTensor,
            q_strides: *const usize,
        ) -> DcpMlaStatus;
    }
    // SAFETY: the exported stub reads none of its arguments.
    let s = unsafe { old_decode_dense(null(), null_mut(), t(0x1000, 1, BF16), null()) };
    assert_status(s, DcpMlaStatus::Unsupported, "dcp_mla_launch_decode_dense");
    assert!(last().contains("`dcp_mla_decode_dense`") && last().contains("revision 5"), "{}", last());
}
