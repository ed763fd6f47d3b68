// MLA decode attention on one rank's shard (docs/contract.md §4), on tensor cores with mma.sync
// m16n8k16 bf16 (sm_80+). One CTA = one block of 64 rows of a sequence (a request, dense; one
// query row of a request, sparse) × one split-KV part: with one part the CTA does its sequence
// whole; with several it runs the pieces of the schedule (decode::for_each_piece), possibly of
// several sequences, one after the other.
//
// Rows: dense CTAs take 64 consecutive rows of the request's flattened [q, H] rows, so the MTP
// rows of a request share every KV tile read; sparse CTAs take 64 heads of one query row (each
// query row has its own index list). Per KV tile of 32 tokens:
//   load   cp.async into shared memory (double buffered; FP8 rows are staged raw and dequantised
//          into the bf16 tile), unread tokens zero-filled so no NaN of an unused slot is read;
//   score  S = Q·Kᵀ over 576 dims: warp (rg, c) does rows 16rg.. × tokens 16c..;
//   softmax online, in the log2 domain with σ·log2e folded, masked before the max; the two
//          warps of a row group exchange their row maxima through shared memory;
//   accum  O += P·V with V = the first 512 dims of the K tile: warp (rg, c) owns O's rows 16rg..
//          and V columns 256c.. in registers (fp32). P goes to the tensor cores rounded once to
//          bf16 (as FlashMLA does): that errs by at most 2^-8·A_c, A_c the softmax-weighted mean
//          of |v|, inside docs/contract.md §9's 2^-6·A_c; the row sums l stay fp32.
// Then O / l and lse = ln Σ exp(s) go to out/lse, or for a piece of a sequence spread over
// several parts to a slot of the fp32 workspace that `mla_decode_combine` merges (docs/contract.md §5).
#pragma once
#include "arch/sm80_ptx.cuh"
#include "decode/base.cuh"
#include "decode/sm80_tile.cuh"
#include "decode/split_schedule.cuh"

namespace dcp {
namespace decode {

// Dynamic shared memory of one CTA (kernels.toml `dynamic_shared` evaluates it for the registry).
template <DecodeKv Kv>
constexpr int shared_bytes() {
    return Kv == DecodeKv::SparseFp8 ? kQBytes + kKTileBytes + 2 * kRawTileBytes + kPBytes + kMiscBytes
                                     : kQBytes + 2 * kKTileBytes + kPBytes + kMiscBytes;
}

}  // namespace decode

// Tile: kernels.toml's `tile` axis, which the launcher reads (the split schedule counts tiles of
// it); it must be the tile this kernel is written for.
template <DecodeKv Kv, int Tile>
__device__ __forceinline__ void mla_decode(const DcpMlaDecodeParams& p) {
    static_assert(Tile == decode::kTile, "kernels.toml's tile axis names decode::kTile");
    using namespace decode;
    constexpr bool kSparse = Kv != DecodeKv::DenseBf16;
    constexpr bool kFp8 = Kv == DecodeKv::SparseFp8;

    require_dynamic_smem(shared_bytes<Kv>());
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16* sQ = (__nv_bfloat16*)smem;
    __nv_bfloat16* sK = (__nv_bfloat16*)(smem + kQBytes);  // 2 stages (bf16) or 1 (fp8)
    unsigned char* sRaw = smem + kQBytes + kKTileBytes;     // fp8 only: 2 raw stages
    unsigned char* after_kv = smem + kQBytes + (kFp8 ? kKTileBytes + 2 * kRawTileBytes : 2 * kKTileBytes);
    __nv_bfloat16* sP = (__nv_bfloat16*)after_kv;  // P in bf16
    float* sMax = (float*)(after_kv + kPBytes);      // [2][kRows]
    float* sSum = sMax + 2 * kRows;              // [2][kRows]
    int* sValid = (int*)(sSum + 2 * kRows);      // [2][kTile]

    // Row block of the CTA within its sequence's rows and, with one part, its sequence (sparse
    // CTAs of one part hold a (query row, head block) pair in blockIdx.x).
    auto row_block = [&]() -> int {
        const int hblocks = (p.heads + kRows - 1) / kRows;
        return kSparse && p.num_splits <= 1 ? blockIdx.x % hblocks : blockIdx.x;
    };
    const int block_seq = kSparse ? blockIdx.y * p.nq + blockIdx.x / ((p.heads + kRows - 1) / kRows) : blockIdx.y;

    for_each_piece(p, num_seqs(p, kSparse), block_seq, [&](const Piece pc) {
        __syncthreads();  // the previous piece is done with shared memory
        // Sparse: thread indices are read inside the piece so that nothing derived from them
        // (shared memory addresses) is hoisted out of the piece loop and kept live across it;
        // without it the FP8 kernel spills on sm_90a, with it the dense one spills on sm_80.
        const int tid = kSparse ? thread_index() : (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
        const int rg = warp & 3, half = warp >> 2;  // row group, token half (S) / V half (O)
        const int g = lane >> 2, t4 = lane & 3;
        const Sm80Warp w{lane, rg, half, g, t4};
        // (recomputed per piece from blockIdx and p rather than kept live: registers are tight)
        const int seq_rows = rows_per_seq(p, kSparse);
        // This CTA's rows: rows row_base + r (r < row_limit) of its sequence's rows.
        const int row_base = row_block() * kRows;
        const int row_limit = min(kRows, seq_rows - row_base);
        const int seq = pc.seq;

        // Token range of the piece (dense: local positions; sparse: positions in the index list).
        int row_len[2];  // this thread's rows g and g+8
        const decode::PieceTiles pt =
            decode::piece_tiles<kSparse, kTile>(p, pc, seq_rows, row_base, row_limit, rg * 16 + g, row_len, tid);
        if (pt.skip) return;
        const int n_tokens = pt.tokens, tile_begin = pt.begin, tile_end = pt.end;

        // ---- load: Q once; then a tile's tokens, 8 threads per token ----
        load_q<kSparse, kPitch, kDimQk>(sQ, p, seq, row_base, row_limit, tid);
        const int ld_tok = tid >> 3, ld_part = tid & 7;
        [[maybe_unused]] const int32_t* const idx_list = kSparse ? index_list(p, seq) : nullptr;  // once a piece
        auto issue_tile = [&](int tile, int stage) {
            const int pos = tile * kTile + ld_tok;
            int64_t row = -1;  // cache row (page·B + slot) of this thread's token, or -1: unread
            if (pos < n_tokens) {
                if constexpr (kSparse) {
                    const int v = idx_list[pos];
                    if (v >= 0 && (int64_t)v < (int64_t)p.num_pages * p.block_size) row = sparse_cache_row(p, v);
                } else {
                    const int page =
                        ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + pos / p.block_size];
                    if (page >= 0 && page < p.num_pages) row = (int64_t)page * p.page_rows + pos % p.block_size;
                }
            }
            if (ld_part == 0) sValid[stage * kTile + ld_tok] = row >= 0;
            if constexpr (kFp8) {
                const unsigned char* src = (const unsigned char*)p.cache + (row >= 0 ? row * kFp8RowBytes : 0);
                unsigned char* dst = sRaw + stage * kRawTileBytes + ld_tok * kFp8RowBytes;
                for (int c = ld_part; c < kFp8Chunks; c += 8) cp_async16(dst + 16 * c, src + 16 * c, row >= 0);
            } else {
                const __nv_bfloat16* src = (const __nv_bfloat16*)p.cache + (row >= 0 ? row * kDimQk : 0);
                __nv_bfloat16* dst = sK + stage * (kTile * kPitch) + ld_tok * kPitch;
#pragma unroll
                for (int k = 0; k < kChunks / 8; ++k) {
                    const int c = ld_part + 8 * k;
                    cp_async16(dst + 8 * c, src + 8 * c, row >= 0);
                }
            }
        };
        auto stage_tile = [&](int stage) -> const __nv_bfloat16* {
            if constexpr (kFp8) {
                // dequantise the raw stage into the one bf16 tile: 72 chunks of 8 values per token
                const unsigned char* raw = sRaw + stage * kRawTileBytes + ld_tok * kFp8RowBytes;
                __nv_bfloat16* dst = sK + ld_tok * kPitch;
#pragma unroll
                for (int k = 0; k < kChunks / 8; ++k) {
                    const int c = ld_part + 8 * k;
                    uint4 v;
                    if (c < kDimLatent / 8) {
                        const float scale = *(const float*)(raw + kFp8ScaleOffset + 4 * (c / 16));
                        v = dequant8(*(const uint2*)(raw + 8 * c), scale);
                    } else {
                        v = *(const uint4*)(raw + kFp8RopeOffset + 16 * (c - kDimLatent / 8));
                    }
                    *(uint4*)(dst + 8 * c) = v;
                }
                __syncthreads();
                return sK;
            } else {
                return sK + stage * (kTile * kPitch);
            }
        };
        float o[32][4], m_run[2], l_run[2];
        tile_loop<kPitch, kDimQk>(tile_begin, tile_end, issue_tile, stage_tile, sQ, sValid, row_len, p.scale_log2, sMax, sP,
                               o, m_run, l_run, w);

        finish_rows<kSparse>(p, pc, seq, seq_rows, row_base, row_limit, o, m_run, l_run, sSum, w);
    });
}

}  // namespace dcp
