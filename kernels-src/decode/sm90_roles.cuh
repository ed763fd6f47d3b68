// The roles schedule of the Hopper decode kernel: dense and sparse BF16.
#pragma once
#include "decode/sm90_base.cuh"

namespace dcp {

// The roles schedule (Sm90Schedule::Roles; BF16 tiles of 64 tokens in two buffers).
// Warpgroup 0, per tile i: queue its half of P·V(i − 1) and S(i) back to back; once P·V is done
// (tile i − 1's buffer is then free for warpgroup 1 to refill) and S(i) is, the softmax; then P(i)
// as bf16 (into the tile's rope block, which only S reads), in the K-major swizzled layout of a
// wgmma A operand, plus the rows' rescale factors (sAlpha), for both warpgroups' P·V. Warpgroup 1: the loads (Q with the first tile; dense tiles by TMA when the
// launch passes a tensor map, else cp.async) and the other half of P·V, issued as soon as P(i)
// is handed over, so it runs beside warpgroup 0's S(i + 1). Buffer b's full mbarrier completes
// when its copies have landed (128 asynchronous cp.async arrivals, and the TMA boxes' bytes)
// and its validity flags are written (128 arrivals); its empty mbarrier when the 8 warps have
// finished P·V of it (S finished earlier). P's hand-over has two mbarriers too: p_full (128
// arrivals of warpgroup 0 once P(i) and the factors are written) and p_empty (128 of warpgroup
// 1 once its P·V(i) is done with them). mbarriers rather than named barriers also let
// racecheck see the hand-over (it reports data passed across bar.arrive/bar.sync as races).
template <DecodeKv Kv, int Tile, int Stages>
__device__ __forceinline__ void mla_decode_sm90_roles(const DcpMlaDecodeParams& p) {
    [[maybe_unused]] constexpr bool kSparse = Kv != DecodeKv::DenseBf16;  // (unused off sm_90a)
    constexpr Sm90Schedule Sched = Sm90Schedule::Roles;
    static_assert(Kv != DecodeKv::SparseFp8, "sparse FP8 runs the trio schedule (decode/sm90_trio.cuh)");
    static_assert(Tile == 64 && Stages == 2, "roles schedule: P fills a 64-token rope block; two buffers");
    static_assert(decode_sm90::shared_bytes<Kv, Tile, Stages, Sched>() + decode::kWriteRowsStaticBytes <= 227 * 1024,
                  "fits one H100/H200 CTA (dynamic + write_rows' static flags)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace decode_sm90;
    constexpr int kSRegs = Tile / 2;
    constexpr int kTileBytes = Tile * kDimQk * 2;
    constexpr int kLdPerTok = 128 / Tile;  // warpgroup 1's threads per token of a tile
    unsigned char* smem = aligned_smem<Kv, Tile, Stages, Sched>();
    unsigned char* sQ = smem;
    unsigned char* sKV = smem + kRows * kDimQk * 2;       // 2 × [Tile × 576] bf16
    int* sValid = (int*)(sKV + Stages * kTileBytes);      // [2][Tile]
    float* sAlpha = (float*)(sValid + Stages * Tile);     // [64] rescale factors of P(i)
    float2* sStats = (float2*)(sAlpha + kRows);           // [64] final (l, m) of the rows
    const uint32_t bars = decode::smem_addr(sStats + kRows);  // full[2], empty[2], p_full, p_empty
    auto full = [&](int b) { return bars + 8 * b; };
    auto empty = [&](int b) { return bars + 16 + 8 * b; };
    const uint32_t p_full = bars + 32, p_empty = bars + 40;
    const uint32_t q_addr = decode::smem_addr(sQ), kv_addr = decode::smem_addr(sKV);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wr = warp & 3, t = tid & 127;
    const int g = lane >> 2, t4 = lane & 3;
    if (tid == 0) {
        for (int b = 0; b < 2; ++b) {
            mbar_init(full(b), 256);
            mbar_init(empty(b), 8);
        }
        // one arrival per thread: racecheck does not see a warp's accesses ordered by __syncwarp
        // before lane 0's arrival (one arrival per warp measured no faster, NOTES.md)
        mbar_init(p_full, 128);
        mbar_init(p_empty, 128);
        fence_proxy_async();
    }
    if (!kSparse && p.kv_tma != 0 && tid == 128) tma_prefetch_map(&p.kv_tmap);  // warpgroup 1 issues the boxes
    const int seqs = decode::num_seqs(p, kSparse), seq_rows = decode::rows_per_seq(p, kSparse);
    const CtaRows rows = cta_rows<kSparse>(p, seq_rows);
    const int block_seq = rows.seq, row_base = rows.base, row_limit = rows.limit;
    const int r0 = wr * 16 + g;  // this thread's rows r0 and r0 + 8
    uint32_t uses = 0;           // tiles consumed before this piece: buffer uses & 1, phase uses >> 1

    // One piece of this CTA's work.
    auto piece = [&](const decode::Piece pc) {
        __syncthreads();  // the previous piece is done with shared memory (and the mbarriers are set up)
        const int seq = pc.seq;
        const int64_t seq_row0 = (int64_t)seq * seq_rows;
        int row_len[2];
        const decode::PieceTiles pt =
            decode::piece_tiles<kSparse, Tile>(p, pc, seq_rows, row_base, row_limit, r0, row_len, tid);
        if (pt.skip) return;
        const int n_tokens = pt.tokens, tile_begin = pt.begin, tile_end = pt.end;
        const int n = tile_end - tile_begin;

        // ---- the loader's view of a tile (warpgroup 1) ----
        const int ld_tok = t / kLdPerTok, ld_part = t % kLdPerTok;
        // Dense: a power-of-two block size (the usual case) divides by shifting; the integer
        // division the general case needs costs warpgroup 1 more than its whole refill.
        const int bs = p.block_size, bs_log = 31 - __clz(bs);
        const bool bs_pow2 = (bs & (bs - 1)) == 0;
        auto div_bs = [&](int pos) { return bs_pow2 ? pos >> bs_log : pos / bs; };
        auto mod_bs = [&](int pos) { return bs_pow2 ? pos & (bs - 1) : pos % bs; };
        auto token_page = [&](int tile) -> int {
            const int pos = tile * Tile + ld_tok;
            if (pos >= n_tokens) return -1;
            if constexpr (kSparse) return ((const int32_t*)p.indices)[(int64_t)seq * p.topk + pos];
            return ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + div_bs(pos)];
        };
        // the cache row of tile's token ld_tok, or -1 (past the sequence, or an invalid page)
        auto token_row = [&](int tile, int page) -> int64_t {
            const int pos = tile * Tile + ld_tok;
            if constexpr (kSparse) {
                if (pos < n_tokens && page >= 0 && (int64_t)page < (int64_t)p.num_pages * bs) return page;
            } else {
                if (pos < n_tokens && page >= 0 && page < p.num_pages) return (int64_t)page * bs + mod_bs(pos);
            }
            return -1;
        };
        uint32_t fills = uses;
        // fill f reuses the buffer of use f − 2: wait until its P·V is done
        auto wait_free = [&](uint32_t f) {
            if (f >= 2) mbar_wait(empty(f & 1), ((f >> 1) - 1) & 1);
        };

        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.0f, 0.0f};

        if (wg == 1) {
            // ---- the right half of P·V, and for BF16 the loads ----
            // Dense tiles wholly inside the sequence load by TMA when the launch passed a tensor
            // map: boxes of box_rows tokens (one page's worth, or 64 of one page) × 64 columns,
            // each issued by the thread holding its first token (whose page lookup it is); an
            // invalid page's box points past the cache's last row and fills zeros. Other tiles
            // (the sequence's last, partial one; sparse) go by cp.async with zero fill.
            const bool tma = !kSparse && p.kv_tma != 0;
            const int box_rows = min(Tile, bs);  // as the launcher encoded the map's box
            // tile's token ld_tok into buffer b: its flag, its share of the copies, two arrivals
            // (the cp.async one also covers Q's copies with the first tile)
            auto fill = [&](int tile, int page, int b) {
                const int64_t row = token_row(tile, page);
                if (ld_part == 0) sValid[b * Tile + ld_tok] = row >= 0;
                if (tma && (tile + 1) * Tile <= n_tokens) {
                    if (ld_part == 0 && (ld_tok & (box_rows - 1)) == 0) {
                        const int c1 = row >= 0 ? (int)row : p.num_pages * bs;
                        const uint32_t dst = kv_addr + b * kTileBytes + ld_tok * 128;
                        mbar_expect_tx(full(b), kBlocks * box_rows * 128);
#pragma unroll
                        for (int blk = 0; blk < kBlocks; ++blk)
                            tma_load_2d(dst + blk * (Tile * 128), &p.kv_tmap, blk * 64, c1, full(b));
                    }
                } else {
                    copy_token<Tile, kLdPerTok>(sKV + b * kTileBytes, ld_tok, ld_part, p, row);
                }
                mbar_arrive_cp_async(full(b));
                mbar_arrive(full(b));
            };
            // the next fill's page (the block-table load is issued a fill ahead)
            int page = token_page(tile_begin);
            for (int k = 0; k < 2 && k < n; ++k) {
                wait_free(fills);
                if (k == 0) load_q(p, sQ, seq_row0, row_base, row_limit, t, 128);
                fill(tile_begin + k, page, fills & 1);  // tile 0's arrivals also cover Q
                page = token_page(tile_begin + k + 1);
                ++fills;
            }
            for (int i = 0; i < n; ++i) {
                const uint32_t u = uses + i;
                const int b = u & 1;
                mbar_wait(p_full, u & 1);  // P(u) and its factors are written
                rescale_o(o, sAlpha[r0], sAlpha[r0 + 8]);
                mbar_wait(full(b), (u >> 1) & 1);  // landed long ago: this is the acquire
                fence_proxy_async();
                issue_pv_half<Tile>(o, kv_addr + b * kTileBytes, 1);
                wgmma_wait0();
                fence_regs(o);
                mbar_arrive(p_empty);  // done with sAlpha (P is in the tile, freed by empty(b))
                __syncwarp();
                if (lane == 0) mbar_arrive(empty(b));
                if (i + 2 < n) {
                    wait_free(fills);
                    fill(tile_begin + i + 2, page, fills & 1);
                    page = token_page(tile_begin + i + 3);
                    ++fills;
                }
            }
        } else {
            // ---- S, softmax and the left half of P·V ----
            // Per tile i ≥ 1: P·V(i − 1) and S(i) are queued back to back; the wait for P·V
            // frees tile i − 1's buffer (warpgroup 1 refills it with tile i + 1 while S(i) and the
            // softmax run); then S(i)'s softmax and P(i)'s hand-over. Each iteration waits for
            // all it issued: no wgmma is in flight across the loop's back edge, which ptxas would
            // answer by serialising every wgmma (C7514/C7515).
            const float scale_log2 = p.scale_log2;
            float l_run[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};
            // S(tile i, in buffer b) into s, issued and committed (not waited for)
            auto issue_s = [&](float (&s)[kSRegs], int b) {
                // Q's address through an opaque copy: else the compiler computes Q's 36 descriptors
                // once, outside the tile loop, and spills them.
                uint32_t qa;
                asm volatile("mov.b32 %0, %1;" : "=r"(qa) : "r"(q_addr));
                const uint32_t tile_addr = kv_addr + b * kTileBytes;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < kDimQk / 16; ++ks) {
                    const uint32_t koff = (ks & 3) * 32;
                    const uint64_t da = make_desc(qa + (ks >> 2) * (kRows * 128) + koff, 16, 1024);
                    const uint64_t db = make_desc(tile_addr + (ks >> 2) * (Tile * 128) + koff, 16, 1024);
                    if (ks == 0) wgmma_ss_n64_first(s, da, db);
                    else wgmma_ss_n64(s, da, db, 1);
                }
                wgmma_commit();
                fence_regs(s);
            };
            // O_L ·= alpha (of the P about to be added), then P·V over tile (buffer b)'s left half
            auto issue_pv = [&](int b) {
                rescale_o(o, alpha[0], alpha[1]);
                issue_pv_half<Tile>(o, kv_addr + b * kTileBytes, 0);
                fence_regs(o);
            };
            // S(i) is done: softmax; P(i) (into tile i's rope block) and alpha handed to warpgroup
            // 1. Needs warpgroup 1's P·V(i − 1) done with sAlpha.
            auto softmax_hand_over = [&](float (&s)[kSRegs], int i, int b) {
                float m_use[2];
                softmax_max<kSRegs, Tile, false>(s, sValid + b * Tile, tile_begin + i, row_len, t4, scale_log2, m_run, l_run,
                                          alpha, m_use);
                // warpgroup 1's P·V of the previous tile (maybe of the previous piece) is done with
                // sAlpha
                const uint32_t u = uses + i;
                if (u > 0) mbar_wait(p_empty, (u - 1) & 1);
                unsigned char* p_dst = sKV + b * kTileBytes + (kBlocks - 1) * (Tile * 128);
                // The thread's place in P, from a fresh read of its index: else the compiler hoists
                // all 32 store addresses out of the tile loop and spills them.
                const int tv = decode::thread_index(), gv = (tv & 31) >> 2;
                const uint32_t row_off = (uint32_t)(((tv >> 5) & 3) * 16 + gv) * 128 + 4 * (tv & 3);
#pragma unroll
                for (int e = 0; e < kSRegs; e += 2) {
                    const int k = (e >> 1) & 1;
                    // columns 8(e >> 2) + 2t4, +1 of row r0 + 8k: 16-byte chunk e >> 2, swizzled by
                    // the row mod 8 (= g for both rows)
                    const uint32_t off = row_off + k * 1024 + (((e >> 2) ^ gv) << 4);
                    *(uint32_t*)(p_dst + off) = p_bf16(s[e], s[e + 1], scale_log2, m_use[k], l_run[k]);
                }
                if (t4 == 0) {
                    sAlpha[r0] = alpha[0];
                    sAlpha[r0 + 8] = alpha[1];
                }
                fence_proxy_async();  // these writes, before either warpgroup's wgmma reads them
                mbar_arrive(p_full);
                // all 64 rows written, before this warpgroup's own P·V reads them: p_full counts
                // exactly warpgroup 0's 128 threads (a named barrier of 128 threads here made
                // racecheck lose track of the CTA barriers)
                mbar_wait(p_full, u & 1);
            };
            if (n > 0) {
                {
                    const int b = uses & 1;
                    float s[kSRegs];
                    mbar_wait(full(b), (uses >> 1) & 1);
                    fence_proxy_async();
                    issue_s(s, b);
                    wgmma_wait0();
                    fence_regs(s);
                    softmax_hand_over(s, 0, b);
                }
                for (int i = 1; i < n; ++i) {
                    const uint32_t u = uses + i;
                    const int b = u & 1;
                    float s[kSRegs];
                    issue_pv(b ^ 1);
                    mbar_wait(full(b), (u >> 1) & 1);
                    fence_proxy_async();
                    issue_s(s, b);
                    wgmma_wait1();  // P·V(i − 1) is done: its buffer may be refilled
                    fence_regs(o);
                    __syncwarp();
                    if (lane == 0) mbar_arrive(empty(b ^ 1));
                    wgmma_wait0();
                    fence_regs(s);
                    softmax_hand_over(s, i, b);
                }
                issue_pv((uses + n - 1) & 1);
                wgmma_wait0();
                fence_regs(o);
                __syncwarp();
                if (lane == 0) mbar_arrive(empty((uses + n - 1) & 1));
            }
            // the rows' place in sStats from a fresh read of the thread index: else its address
            // lives from the kernel's start to here (and spilled under a tighter register budget)
            const int rs = decode_sm90::row_of(decode::thread_index());
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                l_row[k] = row_total(l_run[k]);
                if (t4 == 0) sStats[rs + 8 * k] = make_float2(l_row[k], m_run[k]);
            }
        }
        uses += n;

        // ---- write: warpgroup 1 takes the rows' (l, m) from warpgroup 0 ----
        __syncthreads();
        if (wg == 1) {
            const int rs = decode_sm90::row_of(decode::thread_index());
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float2 v = sStats[rs + 8 * k];
                l_row[k] = v.x;
                m_run[k] = v.y;
            }
        }
        decode::write_rows(p, pc.slot, seq_row0, seq_rows, row_base, row_limit, r0, wg * 256 + 2 * t4,
                           wg == 0 && t4 == 0, l_row, m_run, [&](int c, int e) { return o[4 * c + e]; });
    };
    decode::for_each_piece(p, seqs, block_seq, piece);
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_90a only: the launcher never picks this family elsewhere
#endif
}

}  // namespace dcp
