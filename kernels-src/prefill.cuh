// Prefill over a cached prefix (docs/contract.md §7): flatten one rank's local rows of a chunk into its
// uniform [cap_rows, 576] bf16 buffer (FP8-656 dequantised), and reorder the all-gathered
// [D, cap_rows, 576] buffer into global order. The CPU twin is src/reference/prefill.rs.
//
// A chunk is described by a device-side piece table (int32 [max_pieces, 8], see abi.h), so a
// captured graph replays correctly when the plan changes. One warp per 576-value row, 16-byte
// vector loads and stores; every row of the flatten buffer is written (zero where no token is).
#pragma once
#include "common.cuh"

namespace dcp {

// Fields of one piece-table entry (kPieceFields int32 each).
constexpr int kPieceFields = 8;
enum PieceField { kPieceRequest = 0, kPieceLocalStart, kPieceRowOffset, kPieceRows, kPieceGlobalLen, kPieceOutOffset };

// n_r(L): tokens rank r holds of a piece of L global tokens (docs/contract.md §2).
__device__ __forceinline__ int64_t local_len_of(int64_t len, int D, int I, int r) {
    const int64_t DI = (int64_t)D * I;
    const int64_t full = len / DI;
    const int64_t rest = len - full * DI - (int64_t)r * I;
    return full * I + min((int64_t)I, max((int64_t)0, rest));
}

// The warp finds the piece whose [start(field), start + extent(field)) holds `x`; returns its
// index or -1. Lanes scan entries lane, lane + 32, ...; an empty entry (extent 0) holds nothing.
__device__ __forceinline__ int find_piece(const int32_t* pieces, int max_pieces, int start_field, int extent_field,
                                          int64_t x) {
    const int lane = threadIdx.x & 31;
    for (int base = 0; base < max_pieces; base += 32) {
        const int p = base + lane;
        bool hit = false;
        if (p < max_pieces) {
            const int64_t s = pieces[p * kPieceFields + start_field];
            const int64_t n = pieces[p * kPieceFields + extent_field];
            hit = s <= x && x < s + n;
        }
        const uint32_t m = __ballot_sync(0xffffffffu, hit);
        if (m) return base + __ffs(m) - 1;
    }
    return -1;
}

template <KvFormat Format>
__device__ __forceinline__ void prefill_flatten(const DcpPrefillFlattenParams& p) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= p.cap_rows) return;
    const int32_t* pieces = (const int32_t*)p.pieces;
    uint4* dst = (uint4*)((__nv_bfloat16*)p.out + row * kDimQk);

    // Resolve the row to a cache slot; -1: the row is zero.
    int64_t slot = -1;
    const int pc = find_piece(pieces, p.max_pieces, kPieceRowOffset, kPieceRows, row);
    if (pc >= 0) {
        const int32_t* e = pieces + pc * kPieceFields;
        const int64_t j = row - e[kPieceRowOffset];
        const int64_t n = local_len_of(e[kPieceGlobalLen], p.dcp_size, p.interleave, p.dcp_rank);
        const int req = e[kPieceRequest];
        if (j < n && req >= 0 && req < p.batch) {
            const int64_t l = (int64_t)e[kPieceLocalStart] + j;
            const int64_t col = l / p.block_size;
            if (l >= 0 && col < p.max_pages) {
                const int page = ((const int32_t*)p.block_table)[req * p.block_table_stride + col];
                if (page >= 0 && page < p.num_pages) slot = (int64_t)page * p.page_rows + l % p.block_size;
            }
        }
    }

    // Row = 72 uint4 of bf16: lanes take vectors lane, lane + 32, and lanes 0..7 lane + 64.
    if (slot < 0) {
        const uint4 z = make_uint4(0, 0, 0, 0);
        dst[lane] = z;
        dst[lane + 32] = z;
        if (lane < 8) dst[lane + 64] = z;
        return;
    }
    if constexpr (Format == KvFormat::Bf16) {
        const uint4* src = (const uint4*)((const __nv_bfloat16*)p.cache + slot * kDimQk);
        const uint4 a = __ldg(src + lane), b = __ldg(src + lane + 32);
        const uint4 c = lane < 8 ? __ldg(src + lane + 64) : make_uint4(0, 0, 0, 0);
        dst[lane] = a;
        dst[lane + 32] = b;
        if (lane < 8) dst[lane + 64] = c;
    } else {
        // Lane owns c_kv channels [16·lane, 16·lane + 16): group lane / 8. Lanes 0..7 also copy
        // one 16-byte vector of k_pe each.
        const uint8_t* src = (const uint8_t*)p.cache + slot * kFp8RowBytes;
        const uint4 q = __ldg((const uint4*)src + lane);
        const float scale = __ldg((const float*)(src + kFp8ScaleOffset) + (lane >> 3));
        const uint4 r = lane < 8 ? __ldg((const uint4*)(src + kFp8RopeOffset) + lane) : make_uint4(0, 0, 0, 0);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // e4m3 -> half is exact; half -> float exact; one fp32 product (exact: scale is a
                // power of two) and one round to bf16, as formats::decode_fp8_row_bf16 does.
                const __half2_raw pair =
                    __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> (16 * h)), __NV_E4M3);
                const float lo = __half2float(__half(__half_raw{pair.x})) * scale;
                const float hi = __half2float(__half(__half_raw{pair.y})) * scale;
                const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
                o[2 * i + h] = *(const uint32_t*)&v;
            }
        }
        dst[2 * lane] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[2 * lane + 1] = make_uint4(o[4], o[5], o[6], o[7]);
        if (lane < 8) dst[kDimLatent / 8 + lane] = r;
    }
}

// Reorder: output row o of a piece (out_offset <= o < out_offset + global_len) is its token
// g = o - out_offset, read from rank owner(g), row row_offset + local(g). A row no piece covers is
// left untouched; a source row at or beyond cap_rows gives zeros (never read).
template <typename = void>
__device__ __forceinline__ void prefill_reorder(const DcpPrefillReorderParams& p) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= p.out_rows) return;
    const int32_t* pieces = (const int32_t*)p.pieces;
    const int pc = find_piece(pieces, p.max_pieces, kPieceOutOffset, kPieceGlobalLen, row);
    if (pc < 0) return;
    const int32_t* e = pieces + pc * kPieceFields;
    const int64_t g = row - e[kPieceOutOffset];
    const int r = owner_of(g, p.dcp_size, p.interleave);
    const int64_t src_row = (int64_t)e[kPieceRowOffset] + local_of(g, p.dcp_size, p.interleave);
    uint4* dst = (uint4*)((__nv_bfloat16*)p.out + row * kDimQk);
    uint4 a = make_uint4(0, 0, 0, 0), b = a, c = a;
    if (src_row >= 0 && src_row < p.cap_rows) {
        const uint4* src = (const uint4*)((const __nv_bfloat16*)p.gathered + ((int64_t)r * p.cap_rows + src_row) * kDimQk);
        a = __ldg(src + lane);
        b = __ldg(src + lane + 32);
        if (lane < 8) c = __ldg(src + lane + 64);
    }
    dst[lane] = a;
    dst[lane + 32] = b;
    if (lane < 8) dst[lane + 64] = c;
}

}  // namespace dcp
