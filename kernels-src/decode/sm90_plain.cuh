// The plain (lockstep) schedule of the Hopper decode kernel: dense and sparse BF16.
#pragma once
#include "decode/sm90_base.cuh"

namespace dcp {

// The plain (lockstep) schedule: both warpgroups meet at one CTA barrier per tile; see the
// file's head comment.
template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ void mla_decode_sm90_lockstep(const DcpMlaDecodeParams& p) {
    [[maybe_unused]] constexpr bool kSparse = Kv != DecodeKv::DenseBf16;  // (unused off sm_90a)
    static_assert(Kv != DecodeKv::SparseFp8, "sparse FP8 runs the trio schedule (decode/sm90_trio.cuh)");
    static_assert(Tile == 32 || Tile == 64, "S tile is one wgmma m64nTile");
    static_assert(Stages >= 2, "a ring of at least two buffers");
    static_assert(decode_sm90::shared_bytes<Kv, Tile, Stages, Sched>() + decode::kWriteRowsStaticBytes <= 227 * 1024,
                  "fits one H100/H200 CTA (dynamic + write_rows' static flags)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace decode_sm90;
    constexpr int kTilePerThread = kThreads / Tile;  // threads loading one token row
    static_assert(32 % kTilePerThread == 0, "a token's loading threads are lanes of one warp");
    constexpr int kSRegs = Tile / 2;
    unsigned char* smem = aligned_smem<Kv, Tile, Stages, Sched>();
    unsigned char* sQ = smem;
    unsigned char* sKV = smem + kRows * kDimQk * 2;  // Stages × [Tile × 576] bf16
    int* sValid = (int*)(sKV + Stages * Tile * kDimQk * 2);  // [Stages][Tile]
    float4* sSx = (float4*)(sValid + Stages * Tile);         // the S hand-over beyond the rope block
    const uint32_t q_addr = decode::smem_addr(sQ), kv_addr = decode::smem_addr(sKV);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wr = warp & 3;  // warpgroup (V half), warp in the warpgroup (16 rows)
    const int g = lane >> 2, t4 = lane & 3;
    const int seqs = decode::num_seqs(p, kSparse), seq_rows = decode::rows_per_seq(p, kSparse);
    const CtaRows rows = cta_rows<kSparse>(p, seq_rows);
    const int block_seq = rows.seq, row_base = rows.base, row_limit = rows.limit;

    decode::for_each_piece(p, seqs, block_seq, [&](const decode::Piece pc) {
        __syncthreads();  // the previous piece is done with shared memory
        const int seq = pc.seq;
        const int64_t seq_row0 = (int64_t)seq * seq_rows;
        int row_len[2];  // this thread's rows g and g+8 of its warp's 16
        const decode::PieceTiles pt =
            decode::piece_tiles<kSparse, Tile>(p, pc, seq_rows, row_base, row_limit, wr * 16 + g, row_len, tid);
        if (pt.skip) return;
        const int n_tokens = pt.tokens, tile_begin = pt.begin, tile_end = pt.end;

        // ---- loads: Q once (in the first group), tiles Stages − 1 ahead ----
        load_q(p, sQ, seq_row0, row_base, row_limit, tid, kThreads);
        const int ld_tok = tid / kTilePerThread, ld_part = tid % kTilePerThread;
        // The block-table entry of token `tok` of `tile` (-1: past the sequence), and from it the
        // cache row (page·B + slot) or -1: unread. Split in two so the plain schedule can read the
        // entry one iteration before it issues the tile's copies: the table load's latency then
        // hides behind a tile of math instead of stalling every thread before the barrier.
        // Sparse: the "entry" is the index (page·B + slot) itself.
        auto token_page = [&](int tile, int tok) -> int {
            const int pos = tile * Tile + tok;
            if (pos >= n_tokens) return -1;
            if constexpr (kSparse) return ((const int32_t*)p.indices)[(int64_t)seq * p.topk + pos];
            return ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + pos / p.block_size];
        };
        auto page_row = [&](int tile, int tok, int page) -> int64_t {
            const int pos = tile * Tile + tok;
            if constexpr (kSparse)
                return pos < n_tokens && page >= 0 && (int64_t)page < (int64_t)p.num_pages * p.block_size
                           ? (int64_t)page
                           : (int64_t)-1;
            return pos < n_tokens && page >= 0 && page < p.num_pages
                       ? (int64_t)page * p.block_size + pos % p.block_size
                       : (int64_t)-1;
        };
        auto token_row = [&](int tile, int tok) { return page_row(tile, tok, token_page(tile, tok)); };
        auto issue_tile_row = [&](int64_t row, int stage) {
            if (ld_part == 0) sValid[stage * Tile + ld_tok] = row >= 0;
            copy_token<Tile, kTilePerThread>(sKV + stage * (Tile * kDimQk * 2), ld_tok, ld_part, p, row);
        };
        auto issue_tile = [&](int tile, int stage) { issue_tile_row(token_row(tile, ld_tok), stage); };
#pragma unroll
        for (int s = 0; s < Stages - 1; ++s) {
            if (tile_begin + s < tile_end) issue_tile(tile_begin + s, s);
            decode::cp_async_commit();
        }

        const float scale_log2 = p.scale_log2;
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

        // plain schedule: the table entry of the next tile to issue, read an iteration ahead
        int next_page = token_page(tile_begin + Stages - 1, ld_tok);
        for (int tile = tile_begin; tile < tile_end; ++tile) {
            const int i = tile - tile_begin, stage = i % Stages;
            // tile i's group is the oldest of the Stages − 1 in flight
            decode::cp_async_wait<Stages - 2>();
            fence_proxy_async();  // this thread's cp.async writes, before wgmma reads them
            __syncthreads();
            // Every warp is past iteration i − 1 (the barrier above), so the buffer it read,
            // (i − 1) mod Stages, is free: refill it here, and the plain schedule needs no
            // second barrier at the end of the tile.
            if (tile + Stages - 1 < tile_end)
                issue_tile_row(page_row(tile + Stages - 1, ld_tok, next_page), (i + Stages - 1) % Stages);
            next_page = token_page(tile + Stages, ld_tok);  // used next iteration
            decode::cp_async_commit();
            const uint32_t tile_addr = kv_addr + stage * (Tile * kDimQk * 2);

            // ---- score: S[64 × Tile] = Q·Kᵀ, both operands K-major ----
            // Plain schedule: warpgroup 0 alone computes S (the tensor cores' shared-memory reads
            // of Q and K are then not doubled) and hands its fragments to warpgroup 1, whose
            // threads own the same rows and columns: thread t's 16-byte group q goes to float4
            // q·128 + t of the rope block (free once S is done) or of sSx, conflict-free.
            float s[kSRegs];
#pragma unroll
            for (int e = 0; e < kSRegs; ++e) s[e] = 0.0f;
            if (wg == 0) {
                fence_regs(s);
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < kDimQk / 16; ++ks) {
                    const uint32_t koff = (ks & 3) * 32;
                    const uint64_t da = make_desc(q_addr + (ks >> 2) * (kRows * 128) + koff, 16, 1024);
                    const uint64_t db = make_desc(tile_addr + (ks >> 2) * (Tile * 128) + koff, 16, 1024);
                    wgmma_ss<Tile>(s, da, db);
                }
                wgmma_commit();
            }
            wgmma_wait0();
            fence_regs(s);
            {
                float4* rope = (float4*)(sKV + stage * (Tile * kDimQk * 2) + (kBlocks - 1) * (Tile * 128));
                const int t = tid & 127;
                auto slot = [&](int q) { return q < kSRegs / 8 ? rope + q * 128 + t : sSx + (q - kSRegs / 8) * 128 + t; };
                if (wg == 0) {
#pragma unroll
                    for (int q = 0; q < kSRegs / 4; ++q) *slot(q) = make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]);
                }
                __syncthreads();
                if (wg == 1) {
#pragma unroll
                    for (int q = 0; q < kSRegs / 4; ++q) {
                        const float4 v = *slot(q);
                        s[4 * q] = v.x;
                        s[4 * q + 1] = v.y;
                        s[4 * q + 2] = v.z;
                        s[4 * q + 3] = v.w;
                    }
                }
            }

            // ---- softmax: each thread holds rows g, g+8 of its warp's 16 rows, columns 8j + 2t4 (+1) ----
            float alpha[2], m_use[2];
            softmax_max<kSRegs, Tile>(s, sValid + stage * Tile, tile, row_len, t4, scale_log2, m_run, l_run, alpha, m_use);
            // P as A fragments of m64k16 (the accumulator layout of S, two n8 blocks per k16 block)
            uint32_t p_frag[Tile / 16][4];
#pragma unroll
            for (int e = 0; e < kSRegs; e += 2) {
                const int k = (e >> 1) & 1;
                // e = 8kk + 4h + 2k: k16 block kk, n8 half h, row half k → register 2h + k
                const int kk = e >> 3, reg = 2 * ((e >> 2) & 1) + k;
                p_frag[kk][reg] = p_bf16(s[e], s[e + 1], scale_log2, m_use[k], l_run[k]);
            }
            rescale_o(o, alpha[0], alpha[1]);

            // ---- accumulate: O[64 × 256] += P·V, V = dims 256wg.. of the tile, MN-major ----
            fence_regs(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < Tile / 16; ++kk) {
                // 4 blocks of 64 dims (leading byte offset: one block), 2 groups of 8 tokens (stride 1024)
                const uint64_t dv = make_desc(tile_addr + (4 * wg) * (Tile * 128) + kk * 16 * 128, Tile * 128, 1024);
                wgmma_rs_n256(o, p_frag[kk], dv);
            }
            wgmma_commit();
            wgmma_wait0();
            fence_regs(o);
        }
        decode::cp_async_wait<0>();

        // ---- write: O / l and lse = (m + log2 l)·ln 2; a row that saw nothing: 0 and −inf ----
        const float l_row[2] = {row_total(l_run[0]), row_total(l_run[1])};
        decode::write_rows(p, pc.slot, seq_row0, seq_rows, row_base, row_limit, wr * 16 + g, wg * 256 + 2 * t4,
                           wg == 0 && t4 == 0, l_row, m_run, [&](int n, int e) { return o[4 * n + e]; });
    });
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_90a only: the launcher never picks this family elsewhere
#endif
}

}  // namespace dcp
