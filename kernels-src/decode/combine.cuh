// The split-KV combine of the decode kernels' partial rows (docs/contract.md §5, natural-log lse).
#pragma once
#include "decode/base.cuh"

namespace dcp {

// How the combine's grid covers the split rows (the `grid` axis of kernels.toml):
// ByPart: a CTA per (part, group of 8 rows), a warp a row. A split sequence holds the last unit of
//   its first part fp (it runs past it), and each part's last unit belongs to one sequence: so
//   part fp merges the split sequence starting in it, if any (every split sequence once: the
//   host mirror planner::schedule::combine_part_owner and its property test). The schedule
//   kernel writes that owner into a part table, so a CTA decides with one load (a search of the
//   prefix here took ~7 µs a launch even with nothing to merge: 1,024 CTAs at b = 128 H = 64,
//   four dependent loads each). For many sequences
//   (few partials each): the first version, a CTA per row of every sequence, took 31 µs at
//   b = 128, H = 64 under ncu, 8,192 CTAs mostly finding their row unsplit; this one 8.5 µs.
// ByRow: a CTA per row of every sequence, its 8 warps splitting the row's partials (slots
//   w, w + 8, ...) and adding their sums in warp order through shared memory. For few sequences
//   over many parts (each split row has ~parts / seqs partials): ByPart would leave those on a
//   few CTAs with one warp each.
enum class CombineGrid { ByPart, ByRow };

namespace decode {
constexpr int kCombineWarps = 8;  // kernels.toml block = 256

// Byte offset of the schedule's part table in the workspace: after the (seqs + 1) int64 prefix,
// rounded up to 16 bytes, and its 16-byte stamp (planner::split::SplitPlan::owner_offset).
__device__ __forceinline__ int64_t part_table_offset(int seqs) { return (((int64_t)seqs + 1) * 8 + 15) / 16 * 16 + 16; }

// A split row's merge: its partials are the parts fp..lp holding the sequence, slot 2q except
// 2fp + 1 where the sequence starts after part fp's first unit (see decode::for_each_piece).
struct SplitRow {
    int64_t fp, n, first_slot_extra, rows_per_seq, r;
    __device__ __forceinline__ int64_t slot_row(int i) const {
        return (2 * (fp + i) + (i == 0 ? first_slot_extra : 0)) * rows_per_seq + r;
    }
};

// The row's max lse m, the sum of exp(lse − m) and whether a lse is NaN, over all its slots (the
// warp's lanes take slots lane, lane + 32, ...; every lane gets the results).
__device__ __forceinline__ void split_row_weights(const float* lse, const SplitRow& sr, int lane, float& m, float& sum,
                                                  bool& nan) {
    m = -INFINITY;
    nan = false;
    for (int i = lane; i < sr.n; i += 32) {
        const float v = merge_lse(lse[sr.slot_row(i)]);
        nan |= isnan(v);
        m = fmaxf(m, v);
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    nan = __any_sync(0xffffffffu, nan);
    sum = 0.0f;
    for (int i = lane; i < sr.n; i += 32) sum += m == -INFINITY ? 0.0f : expf(merge_lse(lse[sr.slot_row(i)]) - m);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
}

// acc (lane: columns 4·lane + 128k) += Σ weight·partial over slots first, first + stride, ... in
// that order, two slots' partials in flight; a slot with weight 0 (lse −inf, or +inf, which
// merge_lse makes −inf) is never read.
__device__ __forceinline__ void add_partials(const DcpMlaDecodeCombineParams& p, const SplitRow& sr, float m, float inv,
                                             int first, int stride, int lane, float4 (&acc)[4]) {
    const float* lse = (const float*)p.ws_lse;
    const float* ws = (const float*)p.ws_out + 4 * lane;
    for (int i = first; i < sr.n; i += 2 * stride) {
        float wt[2];
        float4 x[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int j = i + h * stride;
            wt[h] = j < sr.n ? expf(merge_lse(lse[sr.slot_row(j)]) - m) * inv : 0.0f;
#pragma unroll
            for (int k = 0; k < 4; ++k) x[h][k] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (wt[h] != 0.0f) {
                const float* src = ws + sr.slot_row(j) * kDimLatent;
#pragma unroll
                for (int k = 0; k < 4; ++k) x[h][k] = *(const float4*)(src + 128 * k);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                acc[k].x += wt[h] * x[h][k].x;
                acc[k].y += wt[h] * x[h][k].y;
                acc[k].z += wt[h] * x[h][k].z;
                acc[k].w += wt[h] * x[h][k].w;
            }
    }
}

// Four output values at column d of the merged row, which starts `at` elements into out.
__device__ __forceinline__ void store_merged(const DcpMlaDecodeCombineParams& p, int64_t at, int d, float4 v) {
    if (p.out_f32) {
        *(float4*)((float*)p.out + at + d) = v;
    } else {
        *(uint2*)((__nv_bfloat16*)p.out + at + d) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
}
}  // namespace decode

// Merges the partials of each row of a sequence spread over several parts (docs/contract.md §5
// with natural-log lse); the rows of a sequence inside one part were written by the decode kernel
// and are left alone. A NaN lse makes the row NaN; a row whose partials are all empty is 0, −inf.
template <CombineGrid Grid>
__device__ __forceinline__ void mla_decode_combine(const DcpMlaDecodeCombineParams& p) {
    using namespace decode;
    // kernels.toml's block, which the launcher's ByPart row groups and ByRow's s_acc assume
    if (blockDim.x != 32 * kCombineWarps) __trap();
    griddep_wait();  // launched as a dependent of the decode kernel: its partials and rows
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int seq, r;
    SplitRow sr;
    if constexpr (Grid == CombineGrid::ByPart) {
        // the part's entry of the schedule's part table: the split sequence that starts in this
        // part, or −1 (one load decides; most CTAs of a launch leave here)
        const int4 own = ((const int4*)((const unsigned char*)p.sched + part_table_offset(p.seqs)))[blockIdx.x];
        if (own.x < 0) return;
        seq = own.x;
        r = blockIdx.y * kCombineWarps + warp;
        if (r >= p.rows_per_seq) return;
        sr = SplitRow{(int64_t)blockIdx.x, own.y, own.z, p.rows_per_seq, r};
    } else {
        const int64_t* u = (const int64_t*)p.sched;
        const int64_t total = u[p.seqs];
        const int64_t w = (total + p.num_splits - 1) / p.num_splits;
        seq = (int)(blockIdx.x / p.rows_per_seq);
        r = (int)(blockIdx.x % p.rows_per_seq);
        if (seq >= p.seqs) return;
        const int64_t a = u[seq], fp = a / w, lp = (u[seq + 1] - 1) / w;
        if (fp == lp) return;  // not split (uniform over the CTA)
        sr = SplitRow{fp, lp - fp + 1, a > fp * w ? 1 : 0, p.rows_per_seq, r};
    }
    float m, sum;
    bool nan;
    split_row_weights((const float*)p.ws_lse, sr, lane, m, sum, nan);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    float4 acc[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (Grid == CombineGrid::ByPart) {
        if (!nan && sum > 0.0f) add_partials(p, sr, m, inv, 0, 1, lane, acc);
    } else {
        // warp w adds slots w, w + 8, ...; the warps' sums are added in warp order
        __shared__ float4 s_acc[kCombineWarps][kDimLatent / 4];
        if (!nan && sum > 0.0f) add_partials(p, sr, m, inv, warp, kCombineWarps, lane, acc);
#pragma unroll
        for (int k = 0; k < 4; ++k) s_acc[warp][lane + 32 * k] = acc[k];
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            acc[k] = s_acc[0][lane + 32 * k];
#pragma unroll
            for (int v = 1; v < kCombineWarps; ++v) {
                const float4 y = s_acc[v][lane + 32 * k];
                acc[k].x += y.x;
                acc[k].y += y.y;
                acc[k].z += y.z;
                acc[k].w += y.w;
            }
        }
    }
    const float nanf_ = __int_as_float(0x7fffffff);
    const float row_lse = nan ? nanf_ : sum > 0.0f ? m + logf(sum) : p.empty_lse_inf ? INFINITY : -INFINITY;
    // row r of sequence seq in the decode's out and lse views
    const bool sparse = p.sparse != 0;
    if (lane == 0)
        ((float*)p.lse)[view_seq_offset(sparse, p.nq, seq, p.lse_stride_b, p.lse_stride_s) +
                        view_row_offset(sparse, p.nq, p.heads, r, p.lse_stride_s, p.lse_stride_h)] = row_lse;
    const int64_t at = view_seq_offset(sparse, p.nq, seq, p.out_stride_b, p.out_stride_s) +
                       view_row_offset(sparse, p.nq, p.heads, r, p.out_stride_s, p.out_stride_h);
    if (p.sink) {  // the merged row's sink (the parts' partials carry none); an empty row stays 0
        const float f = row_sink_factor(p.sink, r % p.heads, row_lse);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            acc[k].x *= f;
            acc[k].y *= f;
            acc[k].z *= f;
            acc[k].w *= f;
        }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
        store_merged(p, at, 4 * lane + 128 * k, nan ? make_float4(nanf_, nanf_, nanf_, nanf_) : acc[k]);
}

}  // namespace dcp
