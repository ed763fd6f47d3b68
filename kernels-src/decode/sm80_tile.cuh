// One 32-token KV tile of the mma.sync (sm_80+) decode kernels, as decode/sm80.cuh and
// decode/model1.cuh both run it once the tile is in shared memory as bf16: 8 warps, warp (rg, half)
// scores rows 16rg.. against tokens 16half.. and accumulates O's rows 16rg.., V columns 256half...
// Every function is forceinline: the kernels compile to the code they had when each spelled the
// body out (the same SASS, checked when this header was introduced). tile_softmax, tile_loop and
// finish_rows hold __syncthreads: every thread of the CTA calls them.
#pragma once
#include "arch/sm80_ptx.cuh"
#include "decode/base.cuh"
#include "decode/split_schedule.cuh"

namespace dcp {
namespace decode {

// This thread's place in the CTA's 8 warps.
struct Sm80Warp {
    int lane, rg, half, g, t4;  // lane; row group, token half (S) / V half (O); mma row, column pair
};

// Q's rows into sQ, Dqk values a row at Pitch bf16 apart (decode::load_q_rows; the caller commits).
template <bool Sparse, int Pitch, int Dqk>
__device__ __forceinline__ void load_q(__nv_bfloat16* sQ, const DcpMlaDecodeParams& p, int seq, int row_base,
                                       int row_limit, int tid) {
    load_q_rows<Sparse, Dqk / 8>(p, seq, row_base, row_limit, tid, kThreads,
                                 [&](int r, int part) { return sQ + r * Pitch + part * 8; });
}

// S[16 rows, 16 tokens] = Q·Kᵀ over the first Dqk values of rows that are Pitch bf16 apart.
template <int Pitch, int Dqk>
__device__ __forceinline__ void tile_scores(float (&s)[2][4], const __nv_bfloat16* sQ, const __nv_bfloat16* kv,
                                            const Sm80Warp& w) {
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    const int lane = w.lane;
    const __nv_bfloat16* qa = sQ + (w.rg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * Pitch + 8 * (lane >> 4);
    const __nv_bfloat16* kb = kv + (w.half * 16 + (lane & 7) + 8 * (lane >> 4)) * Pitch + 8 * ((lane >> 3) & 1);
#pragma unroll 4
    for (int k0 = 0; k0 < Dqk; k0 += 16) {
        uint32_t a[4], b[4];
        ldmatrix_x4(a, qa + k0);
        ldmatrix_x4(b, kb + k0);
        mma_bf16(s[0], a, b[0], b[1]);
        mma_bf16(s[1], a, b[2], b[3]);
    }
}

// This thread's two row values (rows g and g + 8) reduced over its quad's 4 threads by `reduce`
// (row_max4, row_total), then stored, one a row, to dst[half][kRows].
template <typename Reduce>
__device__ __forceinline__ void quad_reduce_store(float (&v)[2], float* dst, const Sm80Warp& w, Reduce reduce) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        v[k] = reduce(v[k]);
        if (w.t4 == 0) dst[w.half * kRows + w.rg * 16 + w.g + 8 * k] = v[k];
    }
}

// The online softmax of one tile in the log2 domain: masks a score before the max (a token not
// valid[col], or at or past the row's row_len), exchanges row maxima with the partner warp through
// sMax, rescales O and the running sums, and writes P (rounded once to bf16) to sP.
__device__ __forceinline__ void tile_softmax(float (&s)[2][4], float (&o)[32][4], float (&m_run)[2], float (&l_run)[2],
                                             const int* valid, int tile, const int (&row_len)[2], float scale_log2,
                                             float* sMax, __nv_bfloat16* sP, const Sm80Warp& w) {
    const int half = w.half, rg = w.rg, g = w.g, t4 = w.t4;
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = half * 16 + n * 8 + 2 * t4 + (e & 1);
            const int pos = tile * kTile + col;
            const bool ok = valid[col] && pos < row_len[e >> 1];
            s[n][e] = ok ? s[n][e] * scale_log2 : -INFINITY;  // select: a NaN score never survives
            tmax[e >> 1] = fmaxf(tmax[e >> 1], s[n][e]);
        }
    quad_reduce_store(tmax, sMax, w, [](float x) { return row_max4(x); });
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int r = rg * 16 + g + 8 * k;
        const float m_new = fmaxf(m_run[k], fmaxf(sMax[r], sMax[kRows + r]));
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: p = 0, no NaN
        alpha[k] = exp2f(m_run[k] - m_use);
        m_run[k] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                s[n][2 * k + e] = exp2f(s[n][2 * k + e] - m_use);
                sum += s[n][2 * k + e];
            }
        l_run[k] = l_run[k] * alpha[k] + sum;
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        const int col = half * 16 + n * 8 + 2 * t4;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int off = (rg * 16 + g + 8 * k) * kPPitch + col;
            *(uint32_t*)(sP + off) = pack_bf16(s[n][2 * k], s[n][2 * k + 1]);
        }
    }
#pragma unroll
    for (int n = 0; n < 32; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

// O[16 rows, 256 cols] += P[16, 32]·V[32, 256], V the first 512 values of the tile's rows (Pitch
// bf16 apart).
template <int Pitch>
__device__ __forceinline__ void tile_accumulate(float (&o)[32][4], const __nv_bfloat16* sP, const __nv_bfloat16* kv,
                                                const Sm80Warp& w) {
    const int lane = w.lane;
#pragma unroll
    for (int k0 = 0; k0 < kTile; k0 += 16) {
        uint32_t a[4];
        const int p_off = (w.rg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kPPitch + k0 + 8 * (lane >> 4);
        ldmatrix_x4(a, sP + p_off);
        const __nv_bfloat16* vb = kv + (k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * Pitch + w.half * 256 + 8 * (lane >> 4);
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, vb + 16 * n);
            mma_bf16(o[2 * n], a, b[0], b[1]);
            mma_bf16(o[2 * n + 1], a, b[2], b[3]);
        }
    }
}

// The double-buffered loop over tiles [tile_begin, tile_end) that both kernels run, O, m and l
// set up here: issue_tile(tile, stage) starts a tile's copies into a stage (one commit group each),
// stage_tile(stage) makes the landed stage a bf16 tile [kTile, Pitch] and returns it (FP8:
// dequantises it, its own barrier after).
template <int Pitch, int Dqk, typename Issue, typename StageTile>
__device__ __forceinline__ void tile_loop(int tile_begin, int tile_end, Issue&& issue_tile, StageTile&& stage_tile,
                                          const __nv_bfloat16* sQ, const int* sValid, const int (&row_len)[2],
                                          const float& scale, float* sMax, __nv_bfloat16* sP, float (&o)[32][4],
                                          float (&m_run)[2], float (&l_run)[2], const Sm80Warp& w) {
    if (tile_begin < tile_end) issue_tile(tile_begin, 0);
    cp_async_commit();
    const float scale_log2 = scale;  // read after the first copies are issued
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
    for (int tile = tile_begin; tile < tile_end; ++tile) {
        const int stage = (tile - tile_begin) & 1;
        const bool has_next = tile + 1 < tile_end;
        if (has_next) issue_tile(tile + 1, stage ^ 1);
        cp_async_commit();
        if (has_next) cp_async_wait<1>(); else cp_async_wait<0>();
        __syncthreads();
        const __nv_bfloat16* kv = stage_tile(stage);
        float s[2][4];
        tile_scores<Pitch, Dqk>(s, sQ, kv, w);
        tile_softmax(s, o, m_run, l_run, sValid + stage * kTile, tile, row_len, scale_log2, sMax, sP, w);
        __syncthreads();
        tile_accumulate<Pitch>(o, sP, kv, w);
        __syncthreads();
    }
    cp_async_wait<0>();
}

// The piece's end: sums each row's l over its quad and the partner warp (through sSum), then O / l
// and lse = (m + log2 l)·ln 2 (row_stats: with the sink's term; a row that saw nothing: 0 and
// −inf) to out/lse or the piece's workspace slot.
template <bool Sparse>
__device__ __forceinline__ void finish_rows(const DcpMlaDecodeParams& p, const Piece& pc, int seq, int seq_rows,
                                            int row_base, int row_limit, float (&o)[32][4], const float (&m_run)[2],
                                            float (&l_run)[2], float* sSum, const Sm80Warp& w) {
    quad_reduce_store(l_run, sSum, w, [](float x) { return row_total(x); });
    __syncthreads();
    float2 stats[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int r = w.rg * 16 + w.g + 8 * k;
        stats[k] = row_stats(p, pc.slot >= 0, row_base + r, sSum[r] + sSum[kRows + r], m_run[k]);
    }
    write_rows<Sparse>(p, pc.slot, seq, seq_rows, row_base, row_limit, w.rg * 16 + w.g, w.half * 256 + 2 * w.t4,
                       w.half == 0 && w.t4 == 0, stats, [&](int n, int e) { return o[n][e]; });
}

}  // namespace decode
}  // namespace dcp
