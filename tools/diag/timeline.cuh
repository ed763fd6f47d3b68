// What the standalone timeline harnesses share (tools/diag/decode-timeline.cu,
// tools/diag/topk-merge-timeline.cu; measurements, not part of the library): per-CTA globaltimer slots
// that stamped kernels write, error checks, the inputs' generator, and `dcp-mla bench`'s timing
// method (events around one launch, L2 flushed by a 256 MiB read before it, median of 30 after 5).
// Included before the kernel header, whose stamped copy uses DCP_TL / DCP_NOW / DCP_ACC.
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define NSLOT 24
#ifndef TL_MAX_CTAS
#define TL_MAX_CTAS 16384
#endif
__device__ unsigned long long g_tl[TL_MAX_CTAS * NSLOT];
#define DCP_CTA_SLOT(slot) g_tl[((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * NSLOT + (slot)]
#define DCP_NOW()                                                                           \
    ([] {                                                                                   \
        unsigned long long _t;                                                              \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(_t));                              \
        return _t;                                                                          \
    }())
#define DCP_TL(slot) (DCP_CTA_SLOT(slot) = DCP_NOW())
#define DCP_ACC(slot, v) (DCP_CTA_SLOT(slot) += (v))

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

// xorshift64: the inputs, the same on every run
static uint64_t tl_rng = 0x12345678abcdefull;
static uint64_t next() {
    tl_rng ^= tl_rng << 13;
    tl_rng ^= tl_rng >> 7;
    tl_rng ^= tl_rng << 17;
    return tl_rng;
}

__global__ void flush_k(const float4* p, size_t n, float* sink) {
    float4 a = make_float4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) a.x += p[i].x;
    if (a.x == 12345.0f) *sink = a.x;
}

// The bench's method around `launch()`: L2 flushed, events around the launch alone.
struct FlushedTimer {
    static constexpr size_t kFlushBytes = 256ull << 20;
    void* flush = nullptr;
    float* sink = nullptr;
    cudaEvent_t e0, e1;
    FlushedTimer() {
        CK(cudaMalloc(&flush, kFlushBytes));
        CK(cudaMemset(flush, 0, kFlushBytes));
        CK(cudaMalloc(&sink, 4));
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
    }
    // one flushed launch, µs
    template <typename Launch>
    float once(Launch launch) {
        flush_k<<<264, 512>>>((const float4*)flush, kFlushBytes / 16, sink);
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return ms * 1000.0f;
    }
    // median (and min) of 30 flushed launches after 5 warm-ups, µs
    template <typename Launch>
    float median(Launch launch, float* min_us = nullptr) {
        std::vector<float> ts;
        for (int it = 0; it < 35; ++it) {
            const float us = once(launch);
            if (it >= 5) ts.push_back(us);
        }
        std::sort(ts.begin(), ts.end());
        if (min_us) *min_us = ts[0];
        return ts[ts.size() / 2];
    }
};

// The slots of every CTA after a launch, cleared before it.
static void clear_slots() {
    std::vector<unsigned long long> zero(TL_MAX_CTAS * NSLOT, 0);
    CK(cudaMemcpyToSymbol(g_tl, zero.data(), zero.size() * 8));
}
static std::vector<unsigned long long> read_slots() {
    std::vector<unsigned long long> tl(TL_MAX_CTAS * NSLOT);
    CK(cudaMemcpyFromSymbol(tl.data(), g_tl, tl.size() * 8));
    return tl;
}
