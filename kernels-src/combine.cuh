// The DCP combine (docs/contract.md §5) in its three shapes: the ag_rs correction and final cast, the a2a
// pack and unpack-combine, and the two-way merge of chunked prefill. The CPU reference is
// src/reference/merge.rs; the launchers are src/ops/combine.rs.
//
// Every kernel is memory-bound: one warp per (token, head) row of 512 values, each lane moving
// 16 values with 16-byte vector accesses, no shared memory, no atomics. The merge weights of a
// row are computed redundantly by every lane from a handful of broadcast lse loads. A row's
// values are loaded before its weights are known, so the lse and value loads overlap (one memory
// round trip, not two, which matters at small T); a shard whose coefficient is 0 may so be read,
// but its values are never used (an empty shard's NaN never leaks).
#pragma once
#include "common.cuh"

namespace dcp {

enum class CombineDtype { Bf16, F32 };

template <CombineDtype T> struct CombineElem;
template <> struct CombineElem<CombineDtype::Bf16> { using type = __nv_bfloat16; };
template <> struct CombineElem<CombineDtype::F32> { using type = float; };

constexpr int kCombineRow = kDimLatent;  // values per (token, head) row
constexpr int kCombineMaxRanks = 8;      // ag_rs takes D at run time, up to this
constexpr int kCombinePerLane = kCombineRow / 32;
constexpr float kCombineLn2 = 0.693147180559945309417f;

// Values one lane moves per access group: 8 when both tensors are bf16 (one 16-byte vector),
// else 4 (one 16-byte fp32 vector; the bf16 side of a mixed pair moves 8 bytes a lane), so that
// every warp instruction on either side covers one contiguous run (256 or 512 bytes). With 8
// values a lane in a mixed pair, each fp32 instruction covered half of every 32-byte sector it
// touched (16 bytes a lane at a 32-byte stride), which held the fp32 rows at 52-80% of copy.
template <CombineDtype A, CombineDtype B>
constexpr int combine_group() {
    return (A == CombineDtype::Bf16 && B == CombineDtype::Bf16) ? 8 : 4;
}

// The register type of one group as loaded: 8 or 16 bytes.
template <int Bytes>
struct CombineRaw;
template <>
struct CombineRaw<8> {
    using type = uint2;
};
template <>
struct CombineRaw<16> {
    using type = uint4;
};

// Group g of this lane covers values [(g·32 + lane)·E, (g·32 + lane)·E + E) of the row.
template <int E>
__device__ __forceinline__ int combine_offset(int g, int lane) {
    return (g * 32 + lane) * E;
}

template <int E>
__device__ __forceinline__ void combine_load(const float* p, float (&v)[E]) {
    static_assert(E % 4 == 0, "fp32 groups are whole 16-byte vectors");
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
        const float4 x = reinterpret_cast<const float4*>(p)[i];
        v[4 * i] = x.x;
        v[4 * i + 1] = x.y;
        v[4 * i + 2] = x.z;
        v[4 * i + 3] = x.w;
    }
}

template <int E>
__device__ __forceinline__ void combine_load(const __nv_bfloat16* p, float (&v)[E]) {
    static_assert(E == 4 || E % 8 == 0, "bf16 groups are one 8-byte or whole 16-byte vectors");
    if constexpr (E == 4) {
        const uint2 x = *reinterpret_cast<const uint2*>(p);
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.y));
        v[0] = a.x;
        v[1] = a.y;
        v[2] = b.x;
        v[3] = b.y;
        return;
    }
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
        const uint4 x = reinterpret_cast<const uint4*>(p)[i];
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __bfloat1622float2(h[j]);
            v[8 * i + 2 * j] = f.x;
            v[8 * i + 2 * j + 1] = f.y;
        }
    }
}

template <int E>
__device__ __forceinline__ void combine_store(float* p, const float (&v)[E]) {
#pragma unroll
    for (int i = 0; i < E / 4; ++i)
        reinterpret_cast<float4*>(p)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

// Rounds to nearest even, like the reference's final cast.
template <int E>
__device__ __forceinline__ void combine_store(__nv_bfloat16* p, const float (&v)[E]) {
    static_assert(E == 4 || E % 8 == 0, "bf16 groups are one 8-byte or whole 16-byte vectors");
    if constexpr (E == 4) {
        const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
        *reinterpret_cast<uint2*>(p) = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
        return;
    }
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
        uint4 x;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&x);
#pragma unroll
        for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(v[8 * i + 2 * j], v[8 * i + 2 * j + 1]);
        reinterpret_cast<uint4*>(p)[i] = x;
    }
}

// Writes zeros to this lane's share of a row.
template <typename T>
__device__ __forceinline__ void combine_zero_row(T* row, int lane) {
    constexpr int per_vec = 16 / sizeof(T);
    constexpr int vecs = kCombineRow / per_vec / 32;
#pragma unroll
    for (int i = 0; i < vecs; ++i)
        reinterpret_cast<uint4*>(row)[i * 32 + lane] = make_uint4(0, 0, 0, 0);
}

// λ of docs/contract.md §5: the lse in natural log (a base-2 lse is multiplied by ln 2 in fp32 first),
// with +inf (an empty shard) mapped to −inf; NaN stays NaN.
__device__ __forceinline__ float combine_lambda(float lse, int base2) {
    return merge_lse(base2 ? lse * kCombineLn2 : lse);
}

// The maximum M of λ over the first n ≤ N ranks and S = Σ_r exp(λ_r − M) in rank order; S is
// left 0 when every shard is empty (M = −inf).
template <int N>
__device__ __forceinline__ void combine_max_sum(const float (&lse)[N], int n, int base2, float& m, float& s) {
    float lam[N];
    m = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int r = 0; r < N; ++r) {
        lam[r] = r < n ? combine_lambda(lse[r], base2) : -INFINITY;
        m = fmaxf(m, lam[r]);
        nan |= isnan(lam[r]);
    }
    s = 0.0f;
    if (nan) {
        // a NaN lse makes the merged row NaN (docs/contract.md §5): M = S = NaN, so every coefficient and the
        // merged lse are NaN too
        m = s = NAN;
        return;
    }
    if (m == -INFINITY) return;
#pragma unroll
    for (int r = 0; r < N; ++r) s += expf(lam[r] - m);  // exp(−inf) = 0: empty shards, ranks ≥ n
}

// The coefficient w_r / S of a shard with lse `lse` given M and S (0 when every shard is empty).
__device__ __forceinline__ float combine_coef(float lse, int base2, float m, float s) {
    return m == -INFINITY ? 0.0f : __fdiv_rn(expf(combine_lambda(lse, base2) - m), s);
}

// The merge coefficients of one row over the first n ≤ N ranks: coef[r] = w_r / S (0 for the
// ranks ≥ n, and for every rank when all are empty); returns the merged natural-log lse M + ln S,
// or −inf when every shard is empty. Same operation order as the reference's merge_weights.
template <int N>
__device__ __forceinline__ float combine_weights(const float (&lse)[N], int n, int base2, float (&coef)[N]) {
    float m, s;
    combine_max_sum<N>(lse, n, base2, m, s);
#pragma unroll
    for (int r = 0; r < N; ++r) coef[r] = r < n ? combine_coef(lse[r], base2, m, s) : 0.0f;
    return m == -INFINITY ? -INFINITY : m + logf(s);
}

// The global row index of this warp (one warp per row).
__device__ __forceinline__ int64_t combine_row_index() {
    return ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
}

// ag_rs step 1 (docs/contract.md §5.1) on rank p.dcp_rank: contrib[h, t, :] = coef_rank · out[t, h, :],
// head-major, from the all-gathered lse [D, T, H]; computed in fp32 and stored in C (bf16: rounded
// to nearest even); exactly 0 where coef_rank = 0.
template <CombineDtype In, CombineDtype C>
__device__ __forceinline__ void combine_ag_rs_correct(const DcpAgRsCorrectParams& p) {
    using T = typename CombineElem<In>::type;
    using TC = typename CombineElem<C>::type;
    constexpr int E = combine_group<In, C>();
    const int lane = threadIdx.x & 31;
    const int64_t rows = (int64_t)p.num_tokens * p.num_heads;
    const int64_t job = combine_row_index();  // h·T + t: warps in the head-major output's order
    if (job >= rows) return;
    const int64_t h = job / p.num_tokens;
    const int64_t t = job - h * p.num_tokens;
    const int64_t row = t * p.num_heads + h;

    // The row is held as loaded (8- or 16-byte vectors) and widened to fp32 only when scaled: a bf16
    // row then takes 8 registers, not 16, which keeps 8 blocks of 256 resident per SM.
    constexpr int G = kCombinePerLane / E;
    // a group is one 16-byte vector, or one 8-byte vector (bf16 in, fp32 contribution)
    using Raw = CombineRaw<E * (int)sizeof(T)>;
    const typename Raw::type* src = (const typename Raw::type*)((const T*)p.out + row * kCombineRow);
    typename Raw::type raw[G];
#pragma unroll
    for (int g = 0; g < G; ++g) raw[g] = src[g * 32 + lane];

    const float* lse_all = (const float*)p.lse_all;
    float lse[kCombineMaxRanks], m, s;
#pragma unroll
    for (int r = 0; r < kCombineMaxRanks; ++r) lse[r] = r < p.dcp_size ? lse_all[r * rows + row] : 0.0f;
    combine_max_sum<kCombineMaxRanks>(lse, p.dcp_size, p.lse_base2, m, s);
    // Reloaded rather than picked out of lse[] by a run-time index, which would go to local memory.
    const float c = combine_coef(lse_all[(int64_t)p.dcp_rank * rows + row], p.lse_base2, m, s);

    TC* dst = (TC*)p.contrib + (h * p.num_tokens + t) * kCombineRow;
    if (c == 0.0f) {
        combine_zero_row(dst, lane);
        return;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float v[E];
        combine_load<E>((const T*)&raw[g], v);
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] *= c;
        combine_store<E>(dst + combine_offset<E>(g, lane), v);
    }
}

// ag_rs step 2: rank p.dcp_rank's reduce-scattered sum [H_l, T, 512] (heads [rank·H_l,
// (rank+1)·H_l)) is cast to out [T, H_l, 512] with the merged lse [T, H_l]. A row whose shards
// are all empty gets out = 0 and lse = −inf.
template <CombineDtype Summed, CombineDtype Out>
__device__ __forceinline__ void combine_ag_rs_finish(const DcpAgRsFinishParams& p) {
    using TS = typename CombineElem<Summed>::type;
    using T = typename CombineElem<Out>::type;
    constexpr int E = combine_group<Summed, Out>();
    const int lane = threadIdx.x & 31;
    const int64_t row = combine_row_index();  // t·H_l + hl
    const int64_t rows = (int64_t)p.num_tokens * p.local_heads;
    if (row >= rows) return;
    const int64_t t = row / p.local_heads;
    const int64_t hl = row - t * p.local_heads;
    const int64_t heads = (int64_t)p.dcp_size * p.local_heads;
    const int64_t rank_stride = p.num_tokens * heads;

    const TS* src = (const TS*)p.summed + (hl * p.num_tokens + t) * kCombineRow;
    float v[kCombinePerLane / E][E];
#pragma unroll
    for (int g = 0; g < kCombinePerLane / E; ++g) combine_load<E>(src + combine_offset<E>(g, lane), v[g]);

    const float* lse_all = (const float*)p.lse_all + t * heads + (int64_t)p.dcp_rank * p.local_heads + hl;
    float lse[kCombineMaxRanks], m, s;
#pragma unroll
    for (int r = 0; r < kCombineMaxRanks; ++r) lse[r] = r < p.dcp_size ? lse_all[r * rank_stride] : 0.0f;
    combine_max_sum<kCombineMaxRanks>(lse, p.dcp_size, p.lse_base2, m, s);
    const float merged = m == -INFINITY ? -INFINITY : m + logf(s);
    if (lane == 0) ((float*)p.lse_out)[row] = merged;

    T* dst = (T*)p.out + row * kCombineRow;
    if (merged == -INFINITY) {
        combine_zero_row(dst, lane);
        return;
    }
    if (p.sink) {  // once, on the merged fp32 row before the cast (docs/contract.md §5)
        const float f = row_sink_factor(p.sink, hl, merged);
#pragma unroll
        for (int g = 0; g < kCombinePerLane / E; ++g)
#pragma unroll
            for (int i = 0; i < E; ++i) v[g][i] *= f;
    }
#pragma unroll
    for (int g = 0; g < kCombinePerLane / E; ++g) combine_store<E>(dst + combine_offset<E>(g, lane), v[g]);
}

// a2a send side: row (t, h) of out [T, H, 512] and lse [T, H] go to destination d = h div H_l,
// slot row t·H_l + (h mod H_l): out bytes at d·slot + row·1024, lse at d·slot + T·H_l·1024 + row·4.
// An fp32 out is rounded to bf16 (nearest even) on the way.
template <CombineDtype In>
__device__ __forceinline__ void combine_a2a_pack(const DcpA2aPackParams& p) {
    using T = typename CombineElem<In>::type;
    constexpr int E = 8;
    const int lane = threadIdx.x & 31;
    const int64_t row = combine_row_index();  // t·H + h
    const int64_t heads = (int64_t)p.dcp_size * p.local_heads;
    const int64_t rows = (int64_t)p.num_tokens * heads;
    if (row >= rows) return;
    const int64_t t = row / heads;
    const int64_t h = row - t * heads;
    const int64_t d = h / p.local_heads;
    const int64_t slot_row = t * p.local_heads + (h - d * p.local_heads);

    uint8_t* slot = (uint8_t*)p.send + d * p.slot_bytes;
    __nv_bfloat16* dst = (__nv_bfloat16*)slot + slot_row * kCombineRow;
    const T* src = (const T*)p.out + row * kCombineRow;
    if constexpr (In == CombineDtype::Bf16) {
        // A bit-exact copy: no round trip through fp32.
        const uint4 a = reinterpret_cast<const uint4*>(src)[lane];
        const uint4 b = reinterpret_cast<const uint4*>(src)[lane + 32];
        reinterpret_cast<uint4*>(dst)[lane] = a;
        reinterpret_cast<uint4*>(dst)[lane + 32] = b;
    } else {
        float v[kCombinePerLane / E][E];
#pragma unroll
        for (int g = 0; g < kCombinePerLane / E; ++g) combine_load<E>(src + combine_offset<E>(g, lane), v[g]);
#pragma unroll
        for (int g = 0; g < kCombinePerLane / E; ++g) combine_store<E>(dst + combine_offset<E>(g, lane), v[g]);
    }
    if (lane == 0) {
        const int64_t lse_offset = (int64_t)p.num_tokens * p.local_heads * kCombineRow * 2;
        ((float*)(slot + lse_offset))[slot_row] = ((const float*)p.lse)[row];
    }
}

// a2a receive side: recv [D sources, slot_bytes], each slot [T·H_l rows of 512 bf16][T·H_l fp32
// lse]; the full merge over the D sources, accumulated in fp32 in rank order, skipping sources
// whose coefficient is 0.
template <int D, CombineDtype Out>
__device__ __forceinline__ void combine_a2a_combine(const DcpA2aCombineParams& p) {
    using T = typename CombineElem<Out>::type;
    constexpr int E = 8;
    constexpr int G = kCombinePerLane / E;
    const int lane = threadIdx.x & 31;
    const int64_t row = combine_row_index();  // t·H_l + hl
    const int64_t rows = (int64_t)p.num_tokens * p.local_heads;
    if (row >= rows) return;

    const uint8_t* recv = (const uint8_t*)p.recv;
    // Every source's values and lse are loaded before the first use: D·G 16-byte loads in flight.
    uint4 raw[D][G];
#pragma unroll
    for (int r = 0; r < D; ++r) {
        const uint4* src = (const uint4*)(recv + r * p.slot_bytes + row * (kCombineRow * 2));
#pragma unroll
        for (int g = 0; g < G; ++g) raw[r][g] = src[g * 32 + lane];
    }
    const int64_t lse_offset = rows * kCombineRow * 2;
    float lse[D], coef[D];
#pragma unroll
    for (int r = 0; r < D; ++r) lse[r] = ((const float*)(recv + r * p.slot_bytes + lse_offset))[row];
    const float merged = combine_weights<D>(lse, D, p.lse_base2, coef);
    if (lane == 0) ((float*)p.lse_out)[row] = merged;

    float acc[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < E; ++i) acc[g][i] = 0.0f;
#pragma unroll
    for (int r = 0; r < D; ++r) {
        if (coef[r] == 0.0f) continue;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float v[E];
            combine_load<E>((const __nv_bfloat16*)&raw[r][g], v);
#pragma unroll
            for (int i = 0; i < E; ++i) acc[g][i] += coef[r] * v[i];
        }
    }
    if (p.sink) {  // once, on the merged fp32 row (an empty row's acc is 0, and stays 0)
        const float f = row_sink_factor(p.sink, (uint32_t)row % (uint32_t)p.local_heads, merged);  // rows < 2^32 (launcher)
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int i = 0; i < E; ++i) acc[g][i] *= f;
    }
    T* dst = (T*)p.out + row * kCombineRow;
#pragma unroll
    for (int g = 0; g < G; ++g) combine_store<E>(dst + combine_offset<E>(g, lane), acc[g]);
}

// Two-way merge of chunked prefill (docs/contract.md §5.3): (out_a, lse_a) + (out_b, lse_b) → out
// and lse, the two inputs in `In` (bf16 or fp32, widened exactly to fp32), the output in `Out`.
// `out` may be exactly `out_a` or `out_b` when In = Out (and `lse_out` exactly `lse_a` or
// `lse_b`): each warp reads its whole row before writing it.
template <CombineDtype In, CombineDtype Out>
__device__ __forceinline__ void combine_merge_two(const DcpMergeTwoParams& p) {
    using TI = typename CombineElem<In>::type;
    using T = typename CombineElem<Out>::type;
    constexpr int E = combine_group<In, Out>();
    constexpr int G = kCombinePerLane / E;
    const int lane = threadIdx.x & 31;
    const int64_t row = combine_row_index();
    if (row >= p.rows) return;

    const TI* a = (const TI*)p.out_a + row * kCombineRow;
    const TI* b = (const TI*)p.out_b + row * kCombineRow;
    float va[G][E], vb[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        combine_load<E>(a + combine_offset<E>(g, lane), va[g]);
        combine_load<E>(b + combine_offset<E>(g, lane), vb[g]);
    }
    // each input in its own base (docs/contract.md §5.3): both to λ first (natural log; +inf as empty, NaN
    // kept), then weighted as natural logs (base2 = 0), as the reference does
    float lse[2] = {combine_lambda(((const float*)p.lse_a)[row], p.lse_a_base2),
                    combine_lambda(((const float*)p.lse_b)[row], p.lse_b_base2)};
    float coef[2];
    const float merged = combine_weights<2>(lse, 2, 0, coef);
    // Every lane has read its share of the row (and lse) before any lane of the warp writes.
    __syncwarp();
    if (lane == 0) ((float*)p.lse_out)[row] = merged;
    // the sink's factor (1 without one) multiplies the merged fp32 value, as the reference applies it
    const float f = p.sink ? row_sink_factor(p.sink, (uint32_t)row % (uint32_t)p.sink_heads, merged) : 1.0f;  // rows < 2^32
    T* dst = (T*)p.out + row * kCombineRow;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float acc[E];
#pragma unroll
        for (int i = 0; i < E; ++i) {
            acc[i] = 0.0f;
            if (coef[0] != 0.0f) acc[i] += coef[0] * va[g][i];
            if (coef[1] != 0.0f) acc[i] += coef[1] * vb[g][i];
            if (p.sink) acc[i] *= f;
        }
        combine_store<E>(dst + combine_offset<E>(g, lane), acc);
    }
}

}  // namespace dcp
