// Benchmark helper: evicts the L2 cache before a timed launch by reading a buffer larger than it.
// A read leaves clean lines, which the timed kernel drops without a write-back; a memset would
// leave the whole L2 dirty and bill the timed kernel for writing it back.
#pragma once
#include "common.cuh"

namespace dcp {

template <typename = void>
__device__ __forceinline__ void bench_l2_evict(const DcpL2EvictParams& p) {
    const uint4* src = (const uint4*)p.buf;
    const int64_t quads = p.bytes / 64;  // 4 vectors per step: four loads in flight per thread
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < quads; i += stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = src[k * quads + i];
#pragma unroll
        for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    // Keeps the loads alive; the buffer is all zeros, so this never stores in practice.
    if (acc == p.never) atomicOr((uint32_t*)p.sink, 1u);
}

// Benchmark helper: a device copy of `bytes` bytes, the same-bytes ceiling of a data-path row
// (dcp-mla bench's `copy_same_bytes_us`, beside cudaMemcpyAsync: the faster counts). 16-byte
// vectors, four loads in flight per thread before their stores, grid-stride.
template <typename = void>
__device__ __forceinline__ void bench_copy(const DcpBenchCopyParams& p) {
    const uint4* src = (const uint4*)p.src;
    uint4* dst = (uint4*)p.dst;
    const int64_t vecs = p.bytes / 16;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < vecs; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = __ldcs(src + i + k * stride);
#pragma unroll
        for (int k = 0; k < 4; ++k) __stcs(dst + i + k * stride, v[k]);
    }
    for (; i < vecs; i += stride) __stcs(dst + i, __ldcs(src + i));
}

}  // namespace dcp
