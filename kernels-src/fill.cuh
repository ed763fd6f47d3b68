// KV-cache fill (docs/contract.md §2-3): one warp per new token. The warp resolves the token's owner,
// page and slot; on any other rank, or for a padded/out-of-range token, it writes nothing.
#pragma once
#include "common.cuh"

namespace dcp {

// The warp's token and where it goes on this rank: valid = false for a warp past the tokens, a
// padded token (position < 0), a request outside the batch, a token another rank owns, or a page
// beyond max_pages (the callers then write nothing). Shared by both formats' fills.
struct FillToken {
    int64_t token, local, page_col;
    int req;
    bool valid;
};
__device__ __forceinline__ FillToken fill_token(const DcpKvFillParams& p) {
    FillToken f{((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, 0, 0, 0, false};
    if (f.token >= p.num_tokens) return f;
    f.req = ((const int32_t*)p.req_idx)[f.token];
    const int pos = ((const int32_t*)p.positions)[f.token];
    if (pos < 0 || f.req < 0 || f.req >= p.batch) return f;
    if (owner_of(pos, p.dcp_size, p.interleave) != p.dcp_rank) return f;
    f.local = local_of(pos, p.dcp_size, p.interleave);
    f.page_col = f.local / p.block_size;
    f.valid = f.page_col < p.max_pages;
    return f;
}

struct alignas(16) Bf16x8 { __nv_bfloat162 v[4]; };

// The largest |x| of a lane's 16 bf16 values, two 16-byte vectors (fmaxf drops a NaN operand, as
// the reference's f32::max). Both formats' fills reduce it across a group's lanes.
__device__ __forceinline__ float lane_amax16(const uint4& c0, const uint4& c1) {
    const __nv_bfloat16* h0 = (const __nv_bfloat16*)&c0;
    const __nv_bfloat16* h1 = (const __nv_bfloat16*)&c1;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        amax = fmaxf(amax, fmaxf(fabsf(__bfloat162float(h0[i])), fabsf(__bfloat162float(h1[i]))));
    return amax;
}

// A lane's 16 bf16 values quantised to e4m3 under its group's `scale`, as one 16-byte vector.
// The scale is a power of two (or +inf), so 1/scale is exact and x · (1/scale) is the correctly
// rounded x / scale: the same bits as the division, without its slow path.
__device__ __forceinline__ uint4 quantise16(const uint4& c0, const uint4& c1, float scale) {
    const __nv_bfloat16* h0 = (const __nv_bfloat16*)&c0;
    const __nv_bfloat16* h1 = (const __nv_bfloat16*)&c1;
    const float inv_scale = __frcp_rn(scale);
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __nv_bfloat16* h = i < 2 ? h0 : h1;
        uint32_t w = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            w |= (uint32_t)fp8_e4m3_encode(__fmul_rn(__bfloat162float(h[4 * (i & 1) + j]), inv_scale)) << (8 * j);
        packed[i] = w;
    }
    return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// Early (kv_fill_early, the launcher's choice up to ops::fill::EARLY_FILL_MAX_TOKENS tokens): the token's
// c_kv and k_pe are loaded before its request and position, so its bytes are in flight while the
// owner and page are worked out (a token another rank owns, or a padded one, is read for
// nothing). Its 12 more live registers cost a CTA an SM (two waves at 8,192 tokens: +22% there,
// −8 to −9% at 128 tokens, H100), hence two kernels chosen by the token count.
template <KvFormat Format, bool Early>
__device__ __forceinline__ void kv_fill_impl(const DcpKvFillParams& p) {
    const int lane = threadIdx.x & 31;
    // c_kv: lane owns values [16·lane, 16·lane + 16) as two 16-byte vectors; k_pe: lanes 0..7
    // own one 16-byte vector each.
    uint4 c0, c1, r;
    if constexpr (Early) {
        const int64_t token = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
        if (token >= p.num_tokens) return;
        const uint4* ckv = (const uint4*)((const __nv_bfloat16*)p.ckv + token * p.ckv_stride);
        const uint4* kpe = (const uint4*)((const __nv_bfloat16*)p.kpe + token * p.kpe_stride);
        c0 = ckv[2 * lane];
        c1 = ckv[2 * lane + 1];
        r = lane < 8 ? kpe[lane] : make_uint4(0, 0, 0, 0);
    }
    const FillToken ft = fill_token(p);
    if (!ft.valid) return;
    const int64_t local = ft.local, page_col = ft.page_col;
    const int req = ft.req;
    if constexpr (!Early) {
        const int64_t token = ft.token;
        // Loaded before the block-table entry is known, so the two loads overlap (two dependent
        // memory round trips per token, not three); a token whose page turns out invalid has
        // been read for nothing, which only a bad table causes.
        const uint4* ckv = (const uint4*)((const __nv_bfloat16*)p.ckv + token * p.ckv_stride);
        const uint4* kpe = (const uint4*)((const __nv_bfloat16*)p.kpe + token * p.kpe_stride);
        c0 = ckv[2 * lane];
        c1 = ckv[2 * lane + 1];
        r = lane < 8 ? kpe[lane] : make_uint4(0, 0, 0, 0);
    }

    const int page = ((const int32_t*)p.block_table)[req * p.block_table_stride + page_col];
    if (page < 0 || page >= p.num_pages) return;
    const int64_t slot = (int64_t)page * p.page_rows + local % p.block_size;  // the cache row

    if constexpr (Format == KvFormat::Bf16) {
        uint4* row = (uint4*)((__nv_bfloat16*)p.cache + slot * kDimQk);
        row[2 * lane] = c0;
        row[2 * lane + 1] = c1;
        if (lane < 8) row[kDimLatent / 8 + lane] = r;
    } else {
        uint8_t* row = (uint8_t*)p.cache + slot * kFp8RowBytes;
        // k_pe first: its registers are free before the quantisation needs its own.
        if (lane < 8) ((uint4*)(row + kFp8RopeOffset))[lane] = r;
        // The 16 values are widened from c0/c1 where used rather than kept as 16 floats; even so
        // this format needs kernels.toml's min_blocks = 8 to fit 32 registers (8 blocks of 256 an
        // SM, one wave for 8,192 tokens; uncapped it took 38 and two waves, 8% slower there).
        float amax = lane_amax16(c0, c1);
        // group g = channels [128g, 128g + 128) = lanes [8g, 8g + 8)
#pragma unroll
        for (int m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        const float scale = fp8_group_scale(amax);
        ((uint4*)row)[lane] = quantise16(c0, c1, scale);
        if ((lane & 7) == 0) ((float*)(row + kFp8ScaleOffset))[lane >> 3] = scale;
    }
}

template <KvFormat Format>
__device__ __forceinline__ void kv_fill(const DcpKvFillParams& p) {
    kv_fill_impl<Format, false>(p);
}

template <KvFormat Format>
__device__ __forceinline__ void kv_fill_early(const DcpKvFillParams& p) {
    kv_fill_impl<Format, true>(p);
}

// MODEL1 fill (docs/contract.md §3, "MODEL1"; src/formats/model1.rs): one warp per new token, the
// same ownership, page and skip rules as kv_fill. The cache is page-wise: page p at byte
// p·page_rows·576 (page_rows counts 576-byte units), token s's value row at 576·s (448 e4m3, then
// 64 bf16 rope values), its scale slot at 576·B + 8·s (7 ue8m0 bytes, then a pad byte written 0).
// Lanes 0..27 quantise 16 of the 448 values each (tile t is lanes 4t..4t + 3, their amax shared by
// two shuffles), lanes 28..31 copy 16 rope values each; lane 0 gathers the 7 scale bytes and
// writes the slot. Nothing else of the page is written, its padding included.
template <int Unused = 0>
__device__ __forceinline__ void kv_fill_model1(const DcpKvFillParams& p) {
    constexpr int kRowBytes = 576, kNope = 448, kRopeLane = kNope / 16;  // 28
    const int lane = threadIdx.x & 31;
    const FillToken ft = fill_token(p);
    if (!ft.valid) return;
    const int64_t token = ft.token, local = ft.local, page_col = ft.page_col;
    const int req = ft.req;

    // lane < 28: nope values [16·lane, 16·lane + 16); else rope values [16·(lane − 28), +16)
    const bool rope = lane >= kRopeLane;
    const uint4* src = rope ? (const uint4*)((const __nv_bfloat16*)p.kpe + token * p.kpe_stride + 16 * (lane - kRopeLane))
                            : (const uint4*)((const __nv_bfloat16*)p.ckv + token * p.ckv_stride + 16 * lane);
    const uint4 c0 = src[0], c1 = src[1];

    const int page = ((const int32_t*)p.block_table)[req * p.block_table_stride + page_col];
    if (page < 0 || page >= p.num_pages) return;
    const int64_t base = (int64_t)page * p.page_rows * kRowBytes;
    const int s = (int)(local % p.block_size);
    uint8_t* row = (uint8_t*)p.cache + base + (int64_t)s * kRowBytes;

    float amax = lane_amax16(c0, c1);
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float scale = fp8_group_scale(amax);  // (the rope lanes' is unused)
    if (rope) {
        uint4* dst = (uint4*)(row + kNope + 32 * (lane - kRopeLane));
        dst[0] = c0;
        dst[1] = c1;
    } else {
        *(uint4*)(row + 16 * lane) = quantise16(c0, c1, scale);
    }
    // the scale's ue8m0 byte is its fp32 exponent field; tile t's is lane 4t's
    const uint32_t byte = __float_as_uint(scale) >> 23;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int t = 0; t < 7; ++t) {
        const uint32_t b = __shfl_sync(0xffffffffu, byte, 4 * t) & 0xffu;
        if (t < 4) lo |= b << (8 * t);
        else hi |= b << (8 * (t - 4));
    }
    if (lane == 0) *(uint2*)(row + ((int64_t)(p.block_size - s) * kRowBytes + 8 * s)) = make_uint2(lo, hi);
}

}  // namespace dcp
