// Shared device helpers: DCP token ownership (docs/contract.md §2) and the FP8-656 format (docs/contract.md §3).
// The CPU reference in src/planner.rs and src/formats.rs is the executable twin of this file.
#pragma once
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "abi.h"

namespace dcp {

enum class KvFormat { Bf16, Fp8_656 };

constexpr int kDimLatent = 512;   // c_kv, also V
constexpr int kDimRope = 64;      // k_pe
constexpr int kDimQk = kDimLatent + kDimRope;
constexpr int kFp8RowBytes = 656; // [512 e4m3 | 4 fp32 scales | 64 bf16]
constexpr int kFp8ScaleOffset = 512;
constexpr int kFp8RopeOffset = 528;

// owner(t) = (t div I) mod D; local(t) = (t div (D·I))·I + (t mod I). t >= 0.
__device__ __forceinline__ int owner_of(int64_t t, int D, int I) { return (int)((t / I) % D); }
__device__ __forceinline__ int64_t local_of(int64_t t, int D, int I) {
    return (t / ((int64_t)D * I)) * I + (t % I);
}

// scale = smallest power of two >= max(amax / 448, 1e-4), computed from the float's bits so it
// is exact and identical on every machine (no log2).
__device__ __forceinline__ float fp8_group_scale(float amax) {
    float v = fmaxf(__fdiv_rn(amax, 448.0f), 1e-4f);
    uint32_t b = __float_as_uint(v);
    if (b & 0x007fffffu) b = (b & 0x7f800000u) + 0x00800000u;
    return __uint_as_float(b);
}

// e4m3, round to nearest even, saturating to ±448.
__device__ __forceinline__ uint8_t fp8_e4m3_encode(float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// A natural-log lse as a merge sees it: +inf (FlashMLA's empty shard) carries no weight, −inf;
// NaN stays NaN: a NaN reached that shard's inputs, and the merged row must be NaN (docs/contract.md §5, §9).
__device__ __forceinline__ float merge_lse(float l) { return l == INFINITY ? -INFINITY : l; }

// The attention sink's factor on a row (docs/contract.md §4): e^lse / (e^lse + e^sink) for the row's
// natural-log lse, in the form of the reference's sink_factor (src/reference/attention.rs), whose
// exponent is never positive: the denominator lies in [1, 2], where the fast division is within
// 2 ulp (the IEEE one's slow-path call gave the a2a combine a stack frame). An empty row (lse ±inf)
// gets 0 whatever the sink; a NaN lse, or a NaN sink on a row that reads tokens, gives NaN; a sink
// of −inf gives exactly 1 and +inf exactly 0.
__device__ __forceinline__ float sink_factor(float lse, float sink) {
    if (isnan(lse)) return __int_as_float(0x7fffffff);
    if (isinf(lse)) return 0.0f;
    if (isnan(sink)) return __int_as_float(0x7fffffff);
    if (lse > sink) return __fdividef(1.0f, 1.0f + expf(sink - lse));
    const float a = expf(lse - sink);
    return __fdividef(a, a + 1.0f);
}

// The factor of a row of head `head` when `sinks` (fp32 [heads], a device pointer) is set, else 1.
__device__ __forceinline__ float row_sink_factor(uint64_t sinks, int64_t head, float lse) {
    return sinks ? sink_factor(lse, ((const float*)sinks)[head]) : 1.0f;
}

// Programmatic dependent launch (sm_90+): a kernel launched as a dependent of the previous one
// in its stream (Device::launch_dependent) is set up while that one runs and must wait before
// reading what it writes. A no-op on sm_80 and without a dependent launch.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the dependent launch start its CTAs now, before this kernel ends (they still wait for its
// end and its writes in griddep_wait). Only the split schedule kernel does this, for the decode
// grid. An earlier version triggered from the decode kernel as well, and a small split launch ran
// 1.7× slower, likely because the combine's waiting CTAs took SMs the decode's parts still needed
// (NOTES.md at 628d1db, "Programmatic dependent launch and empty shares"); the schedule kernel's trigger
// alone measured −1 to −2 µs (NOTES.md at 628d1db, fourteenth session).
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace dcp
