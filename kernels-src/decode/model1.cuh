// MODEL1 sparse decode (docs/contract.md §4, "MODEL1"; FlashMLA's d_qk = 512 path) on tensor
// cores with mma.sync m16n8k16 bf16 (sm_80+), in the shape of decode/sm80.cuh: one CTA = 64 heads
// of one query row × one split-KV part, 256 threads, KV tiles of 32 tokens. Compute capability
// 9.0 runs decode/sm90_trio.cuh's lead schedule over the same cache instead (this kernel stays
// its fallback, DCP_MLA_DECODE_PATH=mma).
//
// The cache is decode/model1_format.cuh's (src/formats/model1.rs). A query row reads two sources
// in one softmax: the entries of its first index list (p.cache, p.indices, p.topk_len), then
// those of its second (p.extra_*), when there is one; a sequence's token positions 0..n1 − 1 are
// the first list's valid entries and n1..n1 + n2 − 1 the second's, so a tile may straddle both
// and the split schedule (which counts n1 + n2: split_schedule.cuh's extra_seq_tokens) cuts the
// concatenation like any other list.
//
// Per tile: load   cp.async of each token's 576-byte row and its 8 scale bytes into a raw stage
//                  (double buffered), unread tokens zero-filled (so no NaN of an unused slot);
//           dequant the raw stage into one bf16 tile [32, 512]: float(e4m3)·2^(b − 127), exact
//                  in bf16 for every scale a fill writes; the rope values copied;
//           score  S = Q·Kᵀ over the 512 values (warp (rg, c): rows 16rg.., tokens 16c..);
//           softmax online in the log2 domain, masked before the max (sm80.cuh's);
//           accum  O += P·V with V the whole 512-value row, P rounded once to bf16.
// Then decode::write_rows: O / l and the natural-log lse (sinks, empty rows and NaN rows as every
// decode), to out/lse or a split's workspace slot.
#pragma once
#include "arch/sm80_ptx.cuh"
#include "decode/base.cuh"
#include "decode/model1_format.cuh"
#include "decode/sm80_tile.cuh"
#include "decode/split_schedule.cuh"

namespace dcp {
namespace decode_model1 {
using namespace decode;

constexpr int kPitch1 = kDim + 8;           // bf16 per smem row: +16 bytes keeps ldmatrix conflict-free
constexpr int kRowChunks = kRowBytes / 16;  // 16-byte chunks of a raw row (36)
constexpr int kRawPitch = kRowBytes + 16;   // a token's raw stage: its row, then its 8 scale bytes
constexpr int kQBytes1 = kRows * kPitch1 * 2;
constexpr int kKTileBytes1 = kTile * kPitch1 * 2;
constexpr int kRawTileBytes1 = kTile * kRawPitch;

// Dynamic shared memory of one CTA: Q, the bf16 tile, two raw stages, P, the row exchanges.
template <int Dqk, int Tile>
constexpr int shared_bytes() {
    return kQBytes1 + kKTileBytes1 + 2 * kRawTileBytes1 + kPBytes + kMiscBytes;
}

// 8-byte cp.async (a token's scale slot is 8-byte aligned); `valid` false zero-fills.
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 8 : 0));
}

}  // namespace decode_model1

// Dqk, Tile: kernels.toml's axes (d_qk 512, tile 32), which the launcher reads.
template <int Dqk, int Tile>
__device__ __forceinline__ void mla_decode_model1(const DcpMlaDecodeParams& p) {
    using namespace decode_model1;
    static_assert(Dqk == kDim, "kernels.toml's d_qk axis names the 512 values this kernel is written for");
    static_assert(Tile == kTile, "kernels.toml's tile axis names decode::kTile");

    require_dynamic_smem(shared_bytes<Dqk, Tile>());
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16* sQ = (__nv_bfloat16*)smem;
    __nv_bfloat16* sK = (__nv_bfloat16*)(smem + kQBytes1);
    unsigned char* sRaw = smem + kQBytes1 + kKTileBytes1;  // 2 raw stages
    unsigned char* after_kv = sRaw + 2 * kRawTileBytes1;
    __nv_bfloat16* sP = (__nv_bfloat16*)after_kv;
    float* sMax = (float*)(after_kv + kPBytes);  // [2][kRows]
    float* sSum = sMax + 2 * kRows;              // [2][kRows]
    int* sValid = (int*)(sSum + 2 * kRows);      // [2][kTile]

    const int hblocks = (p.heads + kRows - 1) / kRows;
    const int block_seq = blockIdx.y * p.nq + blockIdx.x / hblocks;

    for_each_piece(p, num_seqs(p, true), block_seq, [&](const Piece pc) {
        __syncthreads();  // the previous piece is done with shared memory
        const int tid = thread_index(), lane = tid & 31, warp = tid >> 5;
        const int rg = warp & 3, half = warp >> 2;
        const int g = lane >> 2, t4 = lane & 3;
        const Sm80Warp w{lane, rg, half, g, t4};
        const int seq_rows = p.heads;
        const int row_base = (p.num_splits <= 1 ? (int)blockIdx.x % hblocks : (int)blockIdx.x) * kRows;
        const int row_limit = min(kRows, seq_rows - row_base);
        const int seq = pc.seq;

        // the sequence's tokens: n1 of the first list, then the second's
        const int n1 = seq_tokens(p, true, seq);
        const int n_tokens = n1 + extra_seq_tokens(p, seq);
        int row_len[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) row_len[k] = rg * 16 + g + 8 * k < row_limit ? n_tokens : 0;
        const int tile_end = min((n_tokens + kTile - 1) / kTile, pc.tile_end);
        const int tile_begin = min(tile_end, pc.tile_begin);
        if (skip_empty_share(p, pc, tile_begin, tile_end, seq_rows, row_base, row_limit, tid)) return;

        // ---- load: Q once; then a tile's tokens, 8 threads per token ----
        load_q<true, kPitch1, kDim>(sQ, p, seq, row_base, row_limit, tid);
        const int ld_tok = tid >> 3, ld_part = tid & 7;
        const int32_t* const list1 = index_list(p, seq);
        const int32_t* const list2 = p.extra_indices ? extra_index_list(p, seq) : list1;
        auto issue_tile = [&](int tile, int stage) {
            const int pos = tile * kTile + ld_tok;
            bool ok = false;
            const unsigned char* src = (const unsigned char*)p.cache;  // read nothing when !ok
            int64_t row = 0, scales = 0;
            if (pos < n_tokens) {
                if (pos < n1) {
                    const int v = list1[pos];
                    ok = v >= 0 && (int64_t)v < (int64_t)p.num_pages * p.block_size;
                    if (ok) token_offsets(v, p.block_size, p.page_rows, p.page_div_magic, p.page_div_shift, row, scales);
                } else {
                    const int v = list2[pos - n1];
                    ok = v >= 0 && (int64_t)v < (int64_t)p.extra_num_pages * p.extra_block_size;
                    src = (const unsigned char*)p.extra_cache;
                    if (ok)
                        token_offsets(v, p.extra_block_size, p.extra_page_rows, p.extra_page_div_magic,
                                      p.extra_page_div_shift, row, scales);
                }
            }
            if (ld_part == 0) sValid[stage * kTile + ld_tok] = ok;
            unsigned char* dst = sRaw + stage * kRawTileBytes1 + ld_tok * kRawPitch;
#pragma unroll
            for (int k = 0; k < (kRowChunks + 7) / 8; ++k) {
                const int c = ld_part + 8 * k;
                if (c < kRowChunks) cp_async16(dst + 16 * c, src + row + 16 * c, ok);
            }
            if (ld_part == kRowChunks % 8) cp_async8(dst + kRowBytes, src + scales, ok);
        };
        auto stage_tile = [&](int stage) -> const __nv_bfloat16* {
            // dequantise the raw stage into the bf16 tile: chunk c = ld_part + 8k of 8 values,
            // k < 7 the nope tile k (its scale byte 576 + k), k = 7 the rope values
            const unsigned char* raw = sRaw + stage * kRawTileBytes1 + ld_tok * kRawPitch;
            __nv_bfloat16* dst = sK + ld_tok * kPitch1;
            const uint2 sb = *(const uint2*)(raw + kRowBytes);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int c = ld_part + 8 * k;
                uint4 v;
                if (k < 7) {
                    const uint32_t b = ((k < 4 ? sb.x : sb.y) >> (8 * (k & 3))) & 0xffu;
                    v = dequant8(*(const uint2*)(raw + 8 * c), ue8m0(b));
                } else {
                    v = *(const uint4*)(raw + kNope + 16 * ld_part);
                }
                *(uint4*)(dst + 8 * c) = v;
            }
            __syncthreads();
            return sK;
        };
        float o[32][4], m_run[2], l_run[2];
        tile_loop<kPitch1, kDim>(tile_begin, tile_end, issue_tile, stage_tile, sQ, sValid, row_len, p.scale_log2, sMax, sP,
                               o, m_run, l_run, w);

        finish_rows<true>(p, pc, seq, seq_rows, row_base, row_limit, o, m_run, l_run, sSum, w);
    });
}

}  // namespace dcp
