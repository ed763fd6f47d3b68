// MODEL1's page-wise FP8 cache as both MODEL1 decode kernels read it (decode/model1.cuh, mma.sync;
// decode/sm90_trio.cuh's lead schedule over DecodeKv::Model1, wgmma): src/formats/model1.rs's
// layout. A token's value row (448 e4m3, then 64 bf16 rope values, 576 bytes) sits at
// page·stride + 576·s, its 8 scale bytes (7 ue8m0 scales of 64-value blocks and a pad byte) at
// page·stride + 576·B + 8·s. A query row reads two sources in one softmax: its first index list's
// valid entries (p.cache, p.indices, p.topk_len), then its second's (p.extra_*), as one token
// sequence (split_schedule.cuh's extra_seq_tokens counts the second).
#pragma once
#include "decode/base.cuh"

namespace dcp {
namespace decode_model1 {

constexpr int kDim = 512;                   // d_qk = d_v
constexpr int kNope = 448;                  // e4m3 values a token
constexpr int kRowBytes = 576;              // a token's value row; also the unit of a page's stride

// ue8m0 → f32, exact: 2^(b − 127) (byte 0 is 2^-127, an fp32 subnormal); 0xff is NaN
// (formats::model1::ue8m0_decode).
__device__ __forceinline__ float ue8m0(uint32_t b) {
    return b == 0xffu ? __int_as_float(0x7fffffff) : b == 0 ? __int_as_float(0x00400000) : __int_as_float(b << 23);
}

// Sequence `seq`'s second index list (query row seq mod nq of request seq div nq).
__device__ __forceinline__ const int32_t* extra_index_list(const DcpMlaDecodeParams& p, int seq) {
    const int b = seq / p.nq;
    return (const int32_t*)p.extra_indices + b * p.extra_indices_stride_b + (seq - b * p.nq) * p.extra_indices_stride_s;
}

// Where entry v (already checked to lie in [0, pages·B)) of a source lives: its value row's and
// its scale slot's byte offsets in the source's cache. The page is v / B by the launcher's magic
// number (no divide).
__device__ __forceinline__ void token_offsets(int v, int block_size, int page_units, uint32_t magic, int shift,
                                              int64_t& row, int64_t& scales) {
    const int page = (int)(((uint64_t)(uint32_t)v * magic) >> shift);
    const int s = v - page * block_size;
    const int64_t base = (int64_t)page * page_units * kRowBytes;
    row = base + (int64_t)s * kRowBytes;
    scales = base + (int64_t)block_size * kRowBytes + 8 * s;
}

}  // namespace decode_model1
}  // namespace dcp
