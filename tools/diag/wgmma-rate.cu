// How fast the wgmma shapes of the Hopper decode kernels run, alone and side by side (a
// measurement, not part of the library; NOTES.md at 628d1db, twenty-sixth session). Each warpgroup of a
// 384-thread CTA (one CTA an SM, every SM busy, as in a decode launch) runs one role for ITERS
// iterations with no barrier between the warpgroups, on operands already in shared memory
// (random bf16 in [-1, 1), so the power draw is a real kernel's):
//   S    trio's scorer: 36 m64n64k16 over 576 dims, A (Q) and B (K) from shared memory
//   Srs  the same with A from registers (only K read from shared memory)
//   Str  trio's S as built: the first 32 steps SS, the rope block's 4 RS
//   S128 36 m64n128k16 (S over 128 tokens; B MN-major, same bytes as K-major)
//   PV   one P·V warpgroup: 4 m64n256k16, P (K-major) and V (MN-major) from shared memory
//   S48t 36 m64n48k16 (S over a 48-token tile), the rope block's 4 RS as in Str (an all-SS
//        form spilled under this script's 168-register cap: not kept)
//   PV48 P·V over a 48-token tile: 3 m64n256k16
// and prints, per configuration, each warpgroup's SM cycles an iteration against its ideal
// (m64nNk16 = N / 2 cycles at 2,048 bf16 FMA a cycle an SM) and the CTA's tensor-pipe use: the
// ideal cycles of all the work over the elapsed cycles.
// On the GPU machine, from the repository root:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels-src -o /tmp/wr tools/diag/wgmma-rate.cu
//   /tmp/wr [iters]
#include "timeline.cuh"  // CK
#include "arch/sm90_ptx.cuh"
using namespace dcp::ptx_sm90;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// m64n48k16 (S over 48-token tiles), A and B K-major from shared memory / A from registers
__device__ __forceinline__ void wgmma_ss_n48(float (&d)[24], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "l"(desc_a), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_rs_n48(float (&d)[24], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, 1, 1, 1, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// one S step of the accumulator's shape (n64 or n48: the array's size says which)
__device__ __forceinline__ void s_ss(float (&d)[32], uint64_t da, uint64_t db) { wgmma_ss_n64(d, da, db, 1); }
__device__ __forceinline__ void s_ss(float (&d)[24], uint64_t da, uint64_t db) { wgmma_ss_n48(d, da, db); }
__device__ __forceinline__ void s_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) { wgmma_rs_n64(d, a, db); }
__device__ __forceinline__ void s_rs(float (&d)[24], const uint32_t (&a)[4], uint64_t db) { wgmma_rs_n48(d, a, db); }
#endif

enum Role { Idle = 0, S, Srs, Str, S128, PV, S48t, PV48 };
// Per role: its name, the tokens of its tile, its accumulators, the k-step from which S takes A
// from registers (36: none), and its ideal tensor cycles (m64nNk16 = N / 2 cycles)
struct RoleInfo {
    const char* name;
    int tokens, acc, rs_from;
    double ideal;
};
__host__ __device__ constexpr RoleInfo role_info(int r) {
    switch (r) {
        case S: return {"S", 64, 32, 36, 36 * 32.0};
        case Srs: return {"Srs", 64, 32, 0, 36 * 32.0};
        case Str: return {"Str", 64, 32, 32, 36 * 32.0};
        case S128: return {"S128", 128, 64, 36, 36 * 64.0};
        case PV: return {"PV", 64, 128, 36, 4 * 128.0};
        case S48t: return {"S48t", 48, 24, 32, 36 * 24.0};
        case PV48: return {"PV48", 48, 128, 36, 3 * 128.0};
        default: return {"-", 64, 1, 36, 0.0};
    }
}
constexpr int kSmem = 160 * 1024;  // Q 72 KB | K tile 72 KB | P 8 KB
constexpr uint32_t kQ = 0, kK = 72 * 1024, kP = 144 * 1024;

__device__ __forceinline__ uint32_t smem_base() {
    extern __shared__ __align__(1024) unsigned char smem[];
    return (uint32_t)__cvta_generic_to_shared(smem);
}

// Role R for `iters` iterations by the calling warpgroup, its first and last SM clock into t0, t1.
template <int R>
__device__ __forceinline__ void run_role(int iters, float* sink, unsigned long long* t0, unsigned long long* t1) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr RoleInfo kInfo = role_info(R);
    constexpr int kTok = kInfo.tokens, kBlock = kTok * 128;  // a 64-column block of the tile
    constexpr bool kPv = R == PV || R == PV48;
    const uint32_t base = smem_base();
    float d[kInfo.acc];
    // A fragments for the RS steps: four k-steps' worth (as trio's rope block), reused in turn
    uint32_t qr[4][4];
#pragma unroll
    for (int i = 0; i < 16; ++i) qr[i >> 2][i & 3] = 0x3c003c00u ^ ((uint32_t)(threadIdx.x * 16 + i) * 0x80008001u & 0x80008000u);
    for (int i = 0; i < kInfo.acc; ++i) d[i] = 0.0f;
    __syncwarp();
    const unsigned long long c0 = clock64();
    for (int it = 0; it < iters; ++it) {
        fence_regs(d);
        wgmma_fence();
        if constexpr (kPv) {
            // O half (P·V warpgroup 1 or 2) over the tile's V dims 256·half..
            const int half = (threadIdx.x >> 7) & 1;
#pragma unroll
            for (int kk = 0; kk < kTok / 16; ++kk) {
                const uint64_t dp = make_desc(base + kP + kk * 32, 16, 1024);
                const uint64_t dv = make_desc(base + kK + 4 * half * kBlock + kk * 2048, kBlock, 1024);
                wgmma_ss_n256(d, dp, dv);
            }
        } else if constexpr (R != Idle) {
#pragma unroll
            for (int ks = 0; ks < 36; ++ks) {
                const uint32_t koff = (ks & 3) * 32;
                const uint64_t da = make_desc(base + kQ + (ks >> 2) * 8192 + koff, 16, 1024);
                if constexpr (R == S128) {
                    // 128 columns (two 64-column blocks) of 16 rows: MN-major, the bytes K-major would read
                    wgmma_ss_n128(d, da, make_desc(base + kK + ((ks >> 2) & 3) * 16384 + (ks & 3) * 2048, 8192, 1024));
                } else {
                    const uint64_t db = make_desc(base + kK + (ks >> 2) * kBlock + koff, 16, 1024);
                    if (ks >= kInfo.rs_from) s_rs(d, qr[ks & 3], db);
                    else s_ss(d, da, db);
                }
            }
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs(d);
    }
    const unsigned long long c1 = clock64();
    float acc = 0.0f;
    for (int i = 0; i < kInfo.acc; ++i) acc += d[i];
    if ((threadIdx.x & 127) == 0) {
        *t0 = c0;
        *t1 = c1;
    }
    if (acc == 12345.0f) sink[threadIdx.x] = acc;  // keeps the work; never true for these inputs
#endif
}

template <int R0, int R1, int R2>
__global__ void __launch_bounds__(384, 1) k_rate(int iters, float* sink, unsigned long long* times) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem[];
    // random bf16 in [-1, 1): a hash of the byte offset
    for (int i = threadIdx.x; i < kSmem / 4; i += blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)blockIdx.x * 40503u;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        const uint32_t lo = 0x3f00u | (h & 0x007fu) | ((h >> 8) & 0x8000u);   // ±[0.5, 1)
        const uint32_t hi = 0x3e80u | ((h >> 16) & 0x007fu) | (h & 0x8000u);  // ±[0.25, 0.5)
        ((uint32_t*)smem)[i] = lo | (hi << 16);
    }
    fence_proxy_async();
    __syncthreads();
    const int wg = threadIdx.x >> 7;
    unsigned long long* t = times + ((size_t)blockIdx.x * 3 + wg) * 2;
    if (wg == 0) run_role<R0>(R0 == Idle ? 0 : iters, sink, t, t + 1);
    else if (wg == 1) run_role<R1>(R1 == Idle ? 0 : iters, sink, t, t + 1);
    else run_role<R2>(R2 == Idle ? 0 : iters, sink, t, t + 1);
#endif
}

template <int R0, int R1, int R2>
static void run(int sms, int iters, float* sink, unsigned long long* times) {
    auto k = k_rate<R0, R1, R2>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    k<<<sms, 384, kSmem>>>(iters / 10, sink, times);  // warm-up (clocks up)
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    k<<<sms, 384, kSmem>>>(iters, sink, times);
    CK(cudaEventRecord(b));
    CK(cudaDeviceSynchronize());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    static unsigned long long h[4096 * 6];
    CK(cudaMemcpy(h, times, sizeof(unsigned long long) * sms * 6, cudaMemcpyDeviceToHost));
    const int roles[3] = {R0, R1, R2};
    double per_wg[3] = {0, 0, 0}, elapsed = 0;
    for (int c = 0; c < sms; ++c) {
        unsigned long long lo = ~0ull, hi = 0;
        for (int w = 0; w < 3; ++w) {
            if (roles[w] == Idle) continue;
            const unsigned long long s0 = h[(c * 3 + w) * 2], s1 = h[(c * 3 + w) * 2 + 1];
            per_wg[w] += (double)(s1 - s0) / iters;
            lo = s0 < lo ? s0 : lo;
            hi = s1 > hi ? s1 : hi;
        }
        elapsed += (double)(hi - lo);
    }
    elapsed /= sms;
    double work = 0;
    printf("%-4s %-4s %-4s |", role_info(R0).name, role_info(R1).name, role_info(R2).name);
    for (int w = 0; w < 3; ++w) {
        if (roles[w] == Idle) {
            printf("        -       ");
            continue;
        }
        per_wg[w] /= sms;
        work += role_info(roles[w]).ideal * iters;
        printf(" %7.0f (%4.0f%%)", per_wg[w], 100.0 * role_info(roles[w]).ideal / per_wg[w]);
    }
    printf(" | tensor use %5.1f%% | %.3f ms, SM clock %.2f GHz\n", 100.0 * work / elapsed, ms, elapsed / (ms * 1e6));
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 2000;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float* sink;
    unsigned long long* times;
    CK(cudaMalloc(&sink, 384 * sizeof(float)));
    CK(cudaMalloc(&times, sizeof(unsigned long long) * sms * 6));
    printf("%d CTAs (one an SM), 384 threads, %d iterations; per warpgroup: SM cycles an iteration (ideal / that)\n", sms, iters);
    printf("wg0  wg1  wg2  |   wg0             wg1             wg2\n");
    run<S, Idle, Idle>(sms, iters, sink, times);
    run<Srs, Idle, Idle>(sms, iters, sink, times);
    run<Str, Idle, Idle>(sms, iters, sink, times);
    run<S128, Idle, Idle>(sms, iters, sink, times);
    run<Idle, PV, Idle>(sms, iters, sink, times);
    run<Idle, PV, PV>(sms, iters, sink, times);
    run<S, PV, PV>(sms, iters, sink, times);
    run<Str, PV, PV>(sms, iters, sink, times);
    run<Srs, PV, PV>(sms, iters, sink, times);
    run<S128, PV, PV>(sms, iters, sink, times);
    run<S, S, Idle>(sms, iters, sink, times);
    run<Srs, Srs, Idle>(sms, iters, sink, times);
    run<S, S, PV>(sms, iters, sink, times);
    run<S, S, S>(sms, iters, sink, times);
    run<S48t, Idle, Idle>(sms, iters, sink, times);
    run<Idle, PV48, PV48>(sms, iters, sink, times);
    run<S48t, PV48, PV48>(sms, iters, sink, times);
    return 0;
}
