// The seesaw schedule of the Hopper decode kernel (Sm90Schedule::Seesaw): dense BF16, tiles of 64
// tokens loaded whole by TMA into two buffers, K0 and K1, which hold the two tiles of a pair.
// Its helpers, layout and contract: decode/sm90_base.cuh; its entry: decode/sm90.cuh.
//
// Why: in the roles schedule warpgroup 0 computes S of every tile and its softmax while
// warpgroup 1 only adds half of P·V, so per tile warpgroup 0's S (64·64·576), its half of P·V
// (64·64·256) and the softmax run one after another. Here the warpgroups split a pair of tiles
// evenly (the idea of FlashMLA's Hopper kernel, written anew for this layout): warpgroup 0 computes
// S of K0, warpgroup 1 S of K1; each adds to its own half of O (warpgroup w owns O's columns
// 256w..) the P·V of both tiles, one with its own P from registers and one with the other's P
// from shared memory. Per pair each warpgroup does 64·64·(576 + 512) of tensor work, and the two
// softmaxes run side by side.
//
// Per pair, with m the rows' running max (log2 units, kept in registers: the same in both):
//   both: the masked, scaled maxima of its own tile's rows to sTmax0 / sTmax1 (tmax0_ready /
//        tmax1_ready), then the other's; m' = max(m, both maxima), O and l ·= 2^(m − m'), P against
//        m' (so P0 and P1 share one max and O needs no rescale between the pair's two P·V).
//   WG0: writes bf16(P0) into K0's rope block (only S read it) for WG1 (p0_ready); O_L +=
//        P0·V0_L from registers and, with WG1's P1 (p1_ready), O_L += P1·V1_L from shared memory,
//        queued back to back; refills K0's blocks 0..3 (V0_L) once the first is done and K1's
//        blocks 0..3 and 8 once the second is (S of the next K1 waits for them), then computes S
//        of the next K0.
//   WG1: writes bf16(P1) into K1's rope block (p1_ready); O_R += P1·V1_R from registers, then
//        (p0_ready) O_R += P0·V0_R from shared memory; refills K1's blocks 4..7 and K0's 4..8 as
//        each is done; computes S of the next K1 over blocks 4..8 first (its own refill) and 0..3
//        last (WG0's, which lands later).
// (FlashMLA's dense kernel shares one max a pair the same way; the earlier chained softmax —
// WG1's max after WG0's, P0 rescaled for it — measured 2-4% slower, NOTES.md twelfth session.)
// Each warpgroup's row sums l cover its own P; the two are added at the end. Every column block
// of a buffer has its own full mbarrier (TMA bytes), so S starts on block 0 while the rest land.
// The sequence's last, partial tile: pages are TMA'd whole, so the tokens past the sequence hold
// whatever the page holds there; each warpgroup zeroes its V half of them before P·V (P is 0
// there, but 0·NaN is NaN). Invalid pages point their boxes past the cache (TMA zero fill) and
// are masked by a per-buffer token mask.
#pragma once
#include "decode/sm90_base.cuh"

namespace dcp {

namespace decode_sm90 {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// x through an instruction the compiler cannot see through: an address computed from it is then
// recomputed where it is used instead of once outside the tile loop (and spilled: the loop has
// no register to spare).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
    uint32_t y;
    asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
#endif
}  // namespace decode_sm90

template <DecodeKv Kv, int Tile, int Stages>
__device__ __forceinline__ void mla_decode_sm90_seesaw(const DcpMlaDecodeParams& p) {
    constexpr Sm90Schedule Sched = Sm90Schedule::Seesaw;
    static_assert(Kv == DecodeKv::DenseBf16, "seesaw schedule: dense BF16 tiles by TMA");
    static_assert(Tile == 64 && Stages == 2, "seesaw schedule: P fills a 64-token rope block; a pair of buffers");
    static_assert(decode_sm90::shared_bytes<Kv, Tile, Stages, Sched>() + decode::kWriteRowsStaticBytes <= 227 * 1024,
                  "fits one H100/H200 CTA (dynamic + write_rows' static flags)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace decode_sm90;
    constexpr int kSRegs = Tile / 2;
    constexpr int kTileBytes = Tile * kDimQk * 2;
    constexpr int kBlockBytes = Tile * 128;  // one column block (64 dims) of a tile
    if (p.kv_tma == 0) __trap();             // the launcher picks this schedule only with a tensor map
    unsigned char* smem = aligned_smem<Kv, Tile, Stages, Sched>();
    unsigned char* sQ = smem;
    unsigned char* sKV = smem + kRows * kDimQk * 2;  // K0, K1: [Tile × 576] bf16 each
    float* sTmax0 = (float*)(sKV + 2 * kTileBytes);  // [64] WG0's tile maxima of the pair
    float* sTmax1 = sTmax0 + kRows;                  // [64] WG1's
    float* sL = sTmax1 + kRows;                     // [2][64] each warpgroup's row sums, at the end
    uint64_t* sMask = (uint64_t*)(sL + 2 * kRows);   // [2] valid tokens of the tile in K0, K1
    const uint32_t bars = decode::smem_addr(sMask + 2);
    auto full = [&](int b, int blk) { return bars + 8 * (b * kBlocks + blk); };
    const uint32_t tmax0_ready = bars + 8 * (2 * kBlocks), tmax1_ready = tmax0_ready + 8;
    const uint32_t p0_ready = tmax0_ready + 16, p1_ready = tmax0_ready + 24;
    const uint32_t q_addr = decode::smem_addr(sQ), kv_addr = decode::smem_addr(sKV);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wr = warp & 3, t = tid & 127;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t tail_bar = tmax0_ready + 32 + 8 * wg;
    if (tid == 0) {
        for (int b = 0; b < 2 * kBlocks; ++b) mbar_init(bars + 8 * b, 1);
        // hand-overs and tail barriers: one arrival per thread of the warpgroup (each releasing its
        // own writes; one per warp after __syncwarp measured no faster, and racecheck does not see
        // it order the other lanes' accesses)
        for (int b = 0; b < 6; ++b) mbar_init(tmax0_ready + 8 * b, 128);
        fence_proxy_async();
        tma_prefetch_map(&p.kv_tmap);
    }
    const int seqs = decode::num_seqs(p, false), seq_rows = decode::rows_per_seq(p, false);
    const CtaRows rows = cta_rows<false>(p, seq_rows);
    const int block_seq = rows.seq, row_base = rows.base, row_limit = rows.limit;
    const int r0 = wr * 16 + g;  // this thread's rows r0 and r0 + 8 (the same in both warpgroups)
    // Phases, counted over this CTA's pieces: pairs (each loads K0 once and hands over both
    // tile maxima and P0 once), pairs with a K1 tile (each loads K1 once and hands over P1 once), and
    // this warpgroup's tail zeroings.
    uint32_t pairs_done = 0, loads1 = 0, tails = 0;

    decode::for_each_piece(p, seqs, block_seq, [&](const decode::Piece pc) {
        __syncthreads();  // the previous piece is done with shared memory (and the mbarriers are set up)
        const int seq = pc.seq;
        const int64_t seq_row0 = (int64_t)seq * seq_rows;
        int row_len[2];
        const decode::PieceTiles pt =
            decode::piece_tiles<false, Tile>(p, pc, seq_rows, row_base, row_limit, r0, row_len, tid);
        if (pt.skip) return;
        const int n_tokens = pt.tokens, tile_begin = pt.begin, tile_end = pt.end;
        const int n = tile_end - tile_begin;
        // pages are a power of two ≥ 8 tokens (the launcher checks): a box is min(Tile, B) tokens
        const int bs = p.block_size, bs_log = 31 - __clz(bs);
        const int box_rows = min(Tile, bs), boxes = Tile / box_rows;
        // the sequence's last tile, when partial (tiles past the sequence are never loaded)
        auto is_tail = [&](int tile) { return (tile + 1) * Tile > n_tokens; };

        // Box `k` of `tile`: its first cache row, or -1 for an invalid page or one past the sequence
        // (its box then points past the cache: TMA zero fill). Lanes k < boxes of the issuing warp
        // each hold one box.
        auto box_row = [&](int tile, int k) -> int {
            const int pos = tile * Tile + k * box_rows;
            int page = -1;
            if (pos < n_tokens)
                page = ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + (pos >> bs_log)];
            return page >= 0 && page < p.num_pages ? page * bs + (pos & (bs - 1)) : -1;
        };
        // Column blocks [lo, hi) (and the rope block 8 when `rope`) of a tile into buffer b by TMA,
        // issued by warp 0 of the calling warpgroup (lane k: box k, at `row`); `mask`: also
        // publishes the tile's token mask (before the arrival on block lo's barrier releases it).
        auto load_blocks = [&](int b, int row, int lo, int hi, bool rope, bool mask) {
            if (wr != 0) return;
            if (mask) {
                const unsigned bits = __ballot_sync(0xffffffffu, lane < boxes && row >= 0);
                if (lane == 0) {
                    uint64_t m = 0;
                    for (int k = 0; k < boxes; ++k)
                        if ((bits >> k) & 1) m |= (box_rows == 64 ? ~0ull : ((1ull << box_rows) - 1)) << (k * box_rows);
                    sMask[b] = m;
                }
            }
            const uint32_t bar0 = opaque(full(b, 0));
            uint32_t dst = opaque(kv_addr + b * kTileBytes);
            if (lane == 0) {
                for (int blk = lo; blk < hi; ++blk) mbar_arrive_expect_tx(bar0 + 8 * blk, kBlockBytes);
                if (rope) mbar_arrive_expect_tx(bar0 + 8 * (kBlocks - 1), kBlockBytes);
            }
            __syncwarp();
            if (row < 0) row = p.num_pages * bs;
            if (lane < boxes) {
                dst += lane * box_rows * 128;
                for (int blk = lo; blk < hi; ++blk) tma_load_2d(dst + blk * kBlockBytes, &p.kv_tmap, blk * 64, row, bar0 + 8 * blk);
                if (rope)
                    tma_load_2d(dst + (kBlocks - 1) * kBlockBytes, &p.kv_tmap, (kBlocks - 1) * 64, row,
                                bar0 + 8 * (kBlocks - 1));
            }
        };
        // S = Q·Kᵀ of buffer b (load number `load` of it) into s, a commit group per column block,
        // blocks [lo, hi), each issued once its bytes have landed; not waited for. `first`: the
        // call's first product overwrites s (S starts here).
        auto issue_s = [&](float (&s)[kSRegs], int b, uint32_t load, int lo, int hi, bool first) {
            const uint32_t qa = opaque(q_addr), tile_addr = opaque(kv_addr + b * kTileBytes);
#pragma unroll
            for (int blk = lo; blk < hi; ++blk) {
                mbar_wait(full(b, blk), load & 1);
                wgmma_fence();
#pragma unroll
                for (int kq = 0; kq < 4; ++kq) {
                    const uint64_t da = make_desc(qa + blk * (kRows * 128) + kq * 32, 16, 1024);
                    const uint64_t db = make_desc(tile_addr + blk * kBlockBytes + kq * 32, 16, 1024);
                    if (first && blk == lo && kq == 0) wgmma_ss_n64_first(s, da, db);
                    else wgmma_ss_n64(s, da, db, 1);
                }
                wgmma_commit();
            }
            fence_regs(s);
        };
        // The thread's two rows' masked, log2-scaled scores of `tile` (none when !has) and their maxima.
        auto tile_max = [&](float (&s)[kSRegs], int tile, uint64_t mask, bool has, float (&tmax)[2]) {
            tmax[0] = tmax[1] = -INFINITY;
            // column 8(e >> 2) + 2·t4 + (e & 1): the thread's offset 2·t4 taken out once, so the
            // per-register tests use constant shifts (else 32 shift amounts stay live in the loop)
            const uint64_t mt = has ? mask >> (2 * t4) : 0;
            const int lim[2] = {row_len[0] - tile * Tile - 2 * t4, row_len[1] - tile * Tile - 2 * t4};
#pragma unroll
            for (int e = 0; e < kSRegs; ++e) {
                const int c = 8 * (e >> 2) + (e & 1);
                const int k = (e >> 1) & 1;
                const bool ok = ((mt >> c) & 1) && c < lim[k];
                s[e] = ok ? s[e] * p.scale_log2 : -INFINITY;
                tmax[k] = fmaxf(tmax[k], s[e]);
            }
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 1));
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 2));
            }
        };
        // The P·V of this warpgroup's V half of buffer b with P in registers (A fragments).
        auto issue_pv_local = [&](float (&o)[128], const uint32_t (&pf)[Tile / 16][4], int b) {
            const uint32_t tile_addr = opaque(kv_addr + b * kTileBytes);
#pragma unroll
            for (int kk = 0; kk < Tile / 16; ++kk) {
                const uint64_t dv = make_desc(tile_addr + 4 * wg * kBlockBytes + kk * 16 * 128, Tile * 128, 1024);
                wgmma_rs_n256(o, pf[kk], dv);
            }
            wgmma_commit();
        };
        // The P·V of this warpgroup's V half of buffer b with the other warpgroup's P, which it
        // wrote into the buffer's rope block.
        auto issue_pv_remote = [&](float (&o)[128], int b) {
            const uint32_t tile_addr = opaque(kv_addr + b * kTileBytes);
            const uint32_t p_addr = tile_addr + (kBlocks - 1) * kBlockBytes;
#pragma unroll
            for (int kk = 0; kk < Tile / 16; ++kk) {
                const uint64_t dv = make_desc(tile_addr + 4 * wg * kBlockBytes + kk * 16 * 128, Tile * 128, 1024);
                wgmma_ss_n256(o, p_desc(p_addr, kk), dv);
            }
            wgmma_commit();
        };
        // The sequence's last tile in buffer b (load number `load`): zero this warpgroup's V half of
        // its tokens past the sequence, once the bytes have landed, before P·V reads them.
        auto zero_tail = [&](int b, int tile, uint32_t load) {
            const int tail_valid = n_tokens - tile * Tile;
#pragma unroll
            for (int blk = 0; blk < 4; ++blk) mbar_wait(full(b, 4 * wg + blk), load & 1);
            unsigned char* base = sKV + b * kTileBytes + 4 * wg * kBlockBytes;
            const int chunks = (Tile - tail_valid) * 4 * 8;  // 16-byte chunks: rows × blocks × 8
            for (int c = t; c < chunks; c += 128) {
                const int r = tail_valid + (c >> 5), blk = (c >> 3) & 3, ch = c & 7;
                *(uint4*)(base + blk * kBlockBytes + r * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
            }
            fence_proxy_async();
            mbar_arrive(tail_bar);
            mbar_wait(tail_bar, tails & 1);
            ++tails;
        };
        // P (fp32 in s) as bf16 into buffer b's rope block, in the K-major swizzled layout of a
        // wgmma A operand (the layout of one column block of Q).
        auto store_p = [&](const float (&s)[kSRegs], int b) {
            unsigned char* dst = sKV + b * kTileBytes + (kBlocks - 1) * kBlockBytes;
            // the thread's place in P from a fresh read of its index (else the compiler hoists all
            // 32 store addresses out of the loop and spills them)
            const int tv = decode::thread_index(), gv = (tv & 31) >> 2;
            const uint32_t row_off = (uint32_t)(((tv >> 5) & 3) * 16 + gv) * 128 + 4 * (tv & 3);
#pragma unroll
            for (int e = 0; e < kSRegs; e += 2) {
                const int k = (e >> 1) & 1;
                const uint32_t off = row_off + k * 1024 + (((e >> 2) ^ gv) << 4);
                *(uint32_t*)(dst + off) = decode::pack_bf16(s[e], s[e + 1]);
            }
        };

        // The softmax of this warpgroup's tile (`has`: the pair has one for it), the same in both:
        // its rows' tile maxima go to `own` (own_ready), the other warpgroup's are read from
        // `other` once other_ready completes, and both take m' = max(m, both maxima), so P0 and
        // P1 share one max and neither O half is rescaled between the pair's two P·V. O and l ·=
        // 2^(m − m'); P goes to s in fp32 and to pf as bf16 A fragments.
        auto softmax = [&](float (&s)[kSRegs], uint32_t (&pf)[Tile / 16][4], float (&o)[128], float (&l)[2],
                           float (&m_run)[2], int tile, int b, bool has, float* own, const float* other,
                           uint32_t own_ready, uint32_t other_ready, uint32_t par) {
            float tmax[2], m_use[2], scale[2];
            tile_max(s, tile, sMask[b], has, tmax);
            if (t4 == 0) {
                own[r0] = tmax[0];
                own[r0 + 8] = tmax[1];
            }
            mbar_arrive(own_ready);
            mbar_wait(other_ready, par);
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float m_new = fmaxf(m_run[k], fmaxf(tmax[k], other[r0 + 8 * k]));
                m_use[k] = m_new == -INFINITY ? 0.0f : m_new;  // a row that saw nothing: p = 0, no NaN
                scale[k] = decode::exp2_sfu(m_run[k] - m_use[k]);
                m_run[k] = m_new;
            }
            rescale_o(o, scale[0], scale[1]);
            float sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int e = 0; e < kSRegs; e += 2) {
                const int k = (e >> 1) & 1;
                s[e] = decode::exp2_sfu(s[e] - m_use[k]);
                s[e + 1] = decode::exp2_sfu(s[e + 1] - m_use[k]);
                sum[k] += s[e] + s[e + 1];
                pf[e >> 3][2 * ((e >> 2) & 1) + k] = decode::pack_bf16(s[e], s[e + 1]);
            }
#pragma unroll
            for (int k = 0; k < 2; ++k) l[k] = l[k] * scale[k] + sum[k];
        };

        // ---- prologue: the first two tiles, Q, and their S ----
        // the boxes of the next pair's tiles (tile_begin + 2j + 2, + 3), read a pair ahead by warp
        // 0 of each warpgroup
        int row_n0 = -1, row_n1 = -1;
        if (wr == 0 && lane < boxes) {
            if (n > 0) row_n0 = box_row(tile_begin, lane);
            if (n > 1) row_n1 = box_row(tile_begin + 1, lane);
        }
        if (wg == 0) {
            if (n > 0) load_blocks(0, row_n0, 0, kBlocks, false, true);
            if (n > 1) load_blocks(1, row_n1, 0, kBlocks, false, true);
        }
        // (the thread index read afresh: else load_q's first addresses live through the tile loop)
        load_q(p, sQ, seq_row0, row_base, row_limit, decode::thread_index(), kThreads);
        decode::cp_async_commit();
        decode::cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // Q

        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float l[2] = {0.0f, 0.0f};
        float m_run[2] = {-INFINITY, -INFINITY};  // the rows' running max, the same in both warpgroups
        float s[kSRegs];
#pragma unroll
        for (int e = 0; e < kSRegs; ++e) s[e] = 0.0f;
        if (n > wg) {
            issue_s(s, wg, wg == 0 ? pairs_done : loads1, 0, kBlocks, true);
            wgmma_wait0();
            fence_regs(s);
        }

        for (int j = 0; 2 * j < n; ++j) {
            const uint32_t par = (pairs_done + j) & 1;
            const bool has1 = 2 * j + 1 < n, next0 = 2 * j + 2 < n, next1 = 2 * j + 3 < n;
            const int t0 = tile_begin + 2 * j, t1 = t0 + 1;
            const uint32_t ld0 = pairs_done + j, ld1 = loads1 + j;  // this pair's load numbers of K0, K1
            if (wr == 0 && lane < boxes) {
                if (next0) row_n0 = box_row(t0 + 2, lane);
                if (next1) row_n1 = box_row(t1 + 2, lane);
            }
            if (wg == 0) {
                // ---- softmax of S0 ----
                uint32_t pf[Tile / 16][4];
                softmax(s, pf, o, l, m_run, t0, 0, true, sTmax0, sTmax1, tmax0_ready, tmax1_ready, par);
                // P0 into K0's rope block for WG1 (only S of K0 read it), then O_L += P0·V0_L
                store_p(s, 0);
                fence_proxy_async();
                mbar_arrive(p0_ready);
                if (is_tail(t0)) zero_tail(0, t0, ld0);
                fence_regs(o);
                wgmma_fence();
                issue_pv_local(o, pf, 0);
                if (has1) {
                    // ---- O_L += P1·V1_L, queued behind it (same max: no rescale between) ----
                    if (is_tail(t1)) zero_tail(1, t1, ld1);
                    mbar_wait(p1_ready, ld1 & 1);
                    wgmma_fence();
                    issue_pv_remote(o, 1);
                    wgmma_wait<1>();
                    if (next0) load_blocks(0, row_n0, 0, 4, false, true);  // V0_L and S of K0 are done
                    wgmma_wait0();
                    fence_regs(o);
                    // K1's refill as soon as P1·V1_L is done: S of the next K1 waits for it
                    if (next1) load_blocks(1, row_n1, 0, 4, true, true);
                } else {
                    wgmma_wait0();
                    fence_regs(o);
                    if (next0) load_blocks(0, row_n0, 0, 4, false, true);
                }
                // ---- S of the next K0 ----
                if (next0) {
                    issue_s(s, 0, ld0 + 1, 0, 4, true);  // refilled by WG0 itself, early
                    issue_s(s, 0, ld0 + 1, 4, kBlocks, false);
                    wgmma_wait0();
                    fence_regs(s);
                }
            } else {
                // ---- softmax of S1 (none when the pair has no K1 tile) ----
                uint32_t pf[Tile / 16][4];
                softmax(s, pf, o, l, m_run, t1, 1, has1, sTmax1, sTmax0, tmax1_ready, tmax0_ready, par);
                // ---- O_R += P1·V1_R (P1 from registers), then O_R += P0·V0_R ----
                fence_regs(o);
                if (has1) {
                    store_p(s, 1);
                    fence_proxy_async();
                    mbar_arrive(p1_ready);
                    if (is_tail(t1)) zero_tail(1, t1, ld1);
                    wgmma_fence();
                    issue_pv_local(o, pf, 1);
                }
                if (is_tail(t0)) zero_tail(0, t0, ld0);
                mbar_wait(p0_ready, par);
                wgmma_fence();
                issue_pv_remote(o, 0);
                // ---- refills as each half is done, then S of the next K1 ----
                if (has1 && next1) {
                    wgmma_wait<1>();
                    load_blocks(1, row_n1, 4, 8, false, false);  // V1_R
                }
                wgmma_wait0();
                fence_regs(o);
                if (next0) load_blocks(0, row_n0, 4, kBlocks, false, false);  // V0_R and P0
                if (next1) {
                    // blocks 4..7 first (WG1 refilled them before its remote P·V), 8 and 0..3
                    // last (WG0 refills them once its P1·V1_L is done): their load hides
                    // behind the first five blocks' products
                    issue_s(s, 1, ld1 + 1, 4, kBlocks, true);
                    issue_s(s, 1, ld1 + 1, 0, 4, false);
                    wgmma_wait0();
                    fence_regs(s);
                }
            }
        }
        const int npairs = (n + 1) / 2;
        pairs_done += npairs;
        loads1 += n / 2;

        // ---- write: l = both warpgroups' sums, m the pair's final max ----
        const float lt[2] = {row_total(l[0]), row_total(l[1])};
        if (t4 == 0) {
            sL[wg * kRows + r0] = lt[0];
            sL[wg * kRows + r0 + 8] = lt[1];
        }
        __syncthreads();
        float l_row[2], m_row[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            l_row[k] = sL[r0 + 8 * k] + sL[kRows + r0 + 8 * k];
            m_row[k] = m_run[k];
        }
        // the CTA's rows read afresh (blockIdx.x is the row block of a dense CTA): else the row
        // count is kept live through the tile loop, which has no register to spare
        int rb;
        asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(rb));
        const int limit = min(kRows, seq_rows - rb * kRows);
        decode::write_rows(p, pc.slot, seq_row0, seq_rows, rb * kRows, limit, r0, wg * 256 + 2 * t4, wg == 0 && t4 == 0,
                           l_row, m_row, [&](int c, int e) { return o[4 * c + e]; });
    });
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_90a only: the launcher never picks this family elsewhere
#endif
}

}  // namespace dcp
