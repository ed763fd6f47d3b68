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
