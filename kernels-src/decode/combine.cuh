// The split-KV combine of the decode kernels' partial rows (docs/contract.md §5, natural-log lse).
#pragma once
#include "decode/base.cuh"

namespace dcp {

// Sum (or max) of v over the CTA's threads (blockDim.x a multiple of 32, at most 1024).
template <bool Max>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, d);
        v = Max ? fmaxf(v, o) : v + o;
    }
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = Max ? -INFINITY : 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) r = Max ? fmaxf(r, scratch[i]) : r + scratch[i];
    __syncthreads();  // scratch reusable
    return r;
}

// Merges the partials of each row of a sequence spread over several parts (docs/contract.md §5 with
// natural-log lse): one CTA of 128 threads per row, 4 output values per thread; the rows of a
// sequence inside one part were written by the decode kernel and are left alone. The slots are
// the parts fp..lp holding the sequence: slot 2q, except 2fp + 1 where the sequence starts
// after part fp's first unit (see decode::for_each_piece). A small batch spreads a sequence over
// up to num_splits parts, so the lse are read and weighted by all threads at once, and the
// partial rows are read four slots at a time (independent loads in flight, not a chain of
// dependent round trips). A partial with weight 0 (lse −inf, NaN or +inf) is never read.
template <int Unused = 0>
__device__ __forceinline__ void mla_decode_combine(const DcpMlaDecodeCombineParams& p) {
    __shared__ float s_weight[1024];  // per slot: lse, then its weight (num_splits <= 1024)
    __shared__ float s_red[32];
    __shared__ int s_nan;  // a piece's lse is NaN: the merged row is NaN (docs/contract.md §5)
    if (threadIdx.x == 0) s_nan = 0;
    __syncthreads();
    griddep_wait();  // launched as a dependent of the decode kernel: its partials and rows
    const int64_t row = blockIdx.x;
    const int seq = (int)(row / p.rows_per_seq), r = (int)(row % p.rows_per_seq);
    if (seq >= p.seqs) return;
    const int64_t* u = (const int64_t*)p.sched;
    const int64_t total = u[p.seqs];
    const int64_t w = (total + p.num_splits - 1) / p.num_splits;
    const int64_t a = u[seq], fp = a / w, lp = (u[seq + 1] - 1) / w;
    if (fp == lp) return;
    auto slot_row = [&](int64_t q) { return (2 * q + (q == fp && a > fp * w ? 1 : 0)) * p.rows_per_seq + r; };
    const int n = (int)(lp - fp + 1);
    const float* lse = (const float*)p.ws_lse;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = merge_lse(lse[slot_row(fp + i)]);
        s_weight[i] = v;
        mx = fmaxf(mx, v);
        if (isnan(v)) atomicOr(&s_nan, 1);
    }
    const float m = block_reduce<true>(mx, s_red);  // its barriers also publish s_weight and s_nan
    if (s_nan) {
        if (threadIdx.x == 0) ((float*)p.lse)[row] = NAN;
        const int d = 4 * threadIdx.x;
        if (p.out_f32) {
            *(float4*)((float*)p.out + row * kDimLatent + d) = make_float4(NAN, NAN, NAN, NAN);
        } else {
            uint2 v = make_uint2(decode::pack_bf16(NAN, NAN), decode::pack_bf16(NAN, NAN));
            *(uint2*)((__nv_bfloat16*)p.out + row * kDimLatent + d) = v;
        }
        return;
    }
    float part = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = m == -INFINITY ? 0.0f : expf(s_weight[i] - m);
        s_weight[i] = e;
        part += e;
    }
    const float sum = block_reduce<false>(part, s_red);
    const int d = 4 * threadIdx.x;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (sum > 0.0f) {
        const float inv = 1.0f / sum;
        for (int i0 = 0; i0 < n; i0 += 4) {
            float4 x[4];
            float wt[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                wt[j] = i0 + j < n ? s_weight[i0 + j] * inv : 0.0f;
                x[j] = wt[j] != 0.0f ? *(const float4*)((const float*)p.ws_out + slot_row(fp + i0 + j) * kDimLatent + d)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc.x += wt[j] * x[j].x;
                acc.y += wt[j] * x[j].y;
                acc.z += wt[j] * x[j].z;
                acc.w += wt[j] * x[j].w;
            }
        }
    }
    if (threadIdx.x == 0) ((float*)p.lse)[row] = sum > 0.0f ? m + logf(sum) : -INFINITY;
    if (p.out_f32) {
        *(float4*)((float*)p.out + row * kDimLatent + d) = acc;
    } else {
        uint2 v = make_uint2(decode::pack_bf16(acc.x, acc.y), decode::pack_bf16(acc.z, acc.w));
        *(uint2*)((__nv_bfloat16*)p.out + row * kDimLatent + d) = v;
    }
}

}  // namespace dcp
