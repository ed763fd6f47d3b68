// The tandem schedule of the Hopper dense decode kernel (Sm90Schedule::Tandem; dense BF16 with a
// tensor map, family mla_decode_sm90_tandem, 256 threads): two warpgroups in step, each scoring
// its own tile of every pair and each holding half of O, FlashMLA's SM90 dense skeleton rebuilt on
// this project's primitives (NOTES.md: why our earlier two-warpgroup `seesaw` ran slower).
//
// Tiles alternate between the two buffers: tile 2k of a piece lives in buffer 0 and is scored by
// warpgroup 0, tile 2k + 1 in buffer 1 and is scored by warpgroup 1. Warpgroup w holds O's columns
// 256w..256w + 255 for every tile. Per pair (a = 2k, b = 2k + 1), with S(a) in warpgroup 0's
// registers and S(b) in warpgroup 1's ([X]: named barriers of both warpgroups, a producer
// arrives, a consumer syncs):
//   WG0: the max of S(a) against the rows' max so far (sM) → sM, and the factor the earlier sums
//        shrink by (sScale0) → [SCALE0] → O, l rescaled; P(a) = 2^(S − m0) as bf16 fragments in
//        registers and into buffer 0's rope block (S(a) has read it) → [P0] → O += P(a)·V(a)[left]
//        from registers → [SCALE1: WG1's max] → refill buffer 0's left blocks with tile a + 2 → O,
//        l rescaled to WG1's max → [P1] → O += P(b)·V(b)[left] from buffer 1's rope block → S(a + 2)
//        block by block as each lands (buffer 1's left blocks and rope block refilled with tile
//        b + 2 once P(b)·V(b)[left] is done).
//   WG1: the max of S(b) → [SCALE0] → its max from WG0's (the max chains WG0 → WG1, never back) →
//        sM, sScale1 → [SCALE1] → O rescaled to WG0's max; P(b) into registers and buffer 1's rope
//        block → [P0] → O += P(a)·V(a)[right] from buffer 0's rope block → [P1] → refill buffer 0's
//        right blocks and rope block (tile a + 2) → O, l rescaled to its own max → O +=
//        P(b)·V(b)[right] from registers → refill buffer 1's right blocks (tile b + 2) → S(b + 2).
// So each P is rounded to bf16 once, against the max of its own tile's warpgroup, and each half of
// O is rescaled between its two products, never a P (FlashMLA rescales P(a) to WG1's max and
// rounds it twice: once for each half). The tensor pipe holds one warpgroup's wgmma while the
// other runs its softmax, with no third warpgroup. A buffer's column block has an mbarrier of its
// own, so S starts on the blocks that have landed. A tile's P goes into its own rope block once S
// has read it (only S reads that block), so the block is refilled by the warpgroup that multiplies
// that P from shared memory. (FlashMLA keeps Q's rope block in registers and P(b) there instead:
// here those 16 registers spilled.) The last pair of a piece (one or two tiles left) runs a
// variant without refills, templated, so no wgmma sits under a runtime branch. A partial last
// tile's rows past the sequence (a page's rows beyond its length, never written for this sequence:
// possibly NaN) have their V zeroed before P·V, since P = 0 times NaN is NaN; S's are masked by
// select. Tokens of invalid pages load as zeros (the box points past the cache) and are masked by
// the tile's token mask.
#pragma once
#include "decode/sm90_base.cuh"

namespace dcp {
namespace decode_tandem {
constexpr int kTile = 64;
constexpr int kTileBytes = kTile * kDimQk * 2;        // 73,728: a tile of 9 column blocks
constexpr int kQBytes = decode_sm90::kRows * kDimQk * 2;  // 73,728
constexpr int kBlockBytes = kTile * 128;              // one column block of a tile (64 rows × 128 B)
// After Q and the two tiles: sM, sScale0, sScale1 (64 floats each; the row sums' reduction
// reuses the two scale arrays after the loop), each buffer's token mask (u64) and its nine
// column blocks' mbarriers.
constexpr int kSmallBytes = 3 * decode_sm90::kRows * 4 + 2 * 8 + 2 * 9 * 8;
// Dynamic shared memory (kernels.toml's dynamic_shared): 1,024 bytes to align the buffers to the
// swizzle period.
constexpr int shared_bytes() { return 1024 + kQBytes + 2 * kTileBytes + kSmallBytes; }
// named barriers (0 is __syncthreads')
constexpr int kBarScale0 = 1, kBarScale1 = 2, kBarP0 = 3, kBarP1 = 4, kBarWg = 5;  // kBarWg + wg: one warpgroup
}  // namespace decode_tandem

template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ void mla_decode_sm90_tandem(const DcpMlaDecodeParams& p) {
    static_assert(Kv == DecodeKv::DenseBf16 && Tile == 64 && Stages == 2 && Sched == Sm90Schedule::Tandem,
                  "tandem: dense BF16, 64-token tiles, two buffers");
    static_assert(decode_tandem::shared_bytes() + decode::kWriteRowsStaticBytes <= 227 * 1024,
                  "fits one H100/H200 CTA (dynamic + write_rows' static flags)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace decode_sm90;
    using namespace decode_tandem;
    // the launcher runs tandem only with a tensor map (src/ops/decode.rs); without one, a bug
    if (p.kv_tma == 0) __trap();
    decode::require_dynamic_smem(shared_bytes());
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw_addr = decode::smem_addr(smem_raw);
    unsigned char* smem = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
    unsigned char* sQ = smem;
    unsigned char* sKV = smem + kQBytes;  // buffer b at sKV + b · kTileBytes
    float* sM = (float*)(sKV + 2 * kTileBytes);  // the rows' max so far (log2 units; −inf: nothing seen)
    float* sScale0 = sM + kRows;          // WG0's factor on the earlier sums (its tile's new max)
    float* sScale1 = sScale0 + kRows;     // WG1's factor on WG0's max (its tile's new max)
    float* sRed = sScale0;                // after the loop: [2][64] each warpgroup's row sums
    unsigned long long* sMask = (unsigned long long*)(sScale1 + kRows);  // [2] a buffer's token mask
    const uint32_t bars = decode::smem_addr(sMask + 2);                   // [2][9] a column block's arrival
    auto bar = [&](int b, int blk) { return bars + 8 * (9 * b + blk); };
    const uint32_t q_addr = decode::smem_addr(sQ), kv_addr = decode::smem_addr(sKV);
    // P of buffer b's tile: its rope block
    auto p_addr = [&](int b) { return kv_addr + b * kTileBytes + 8 * kBlockBytes; };

    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, t = tid & 127, t4 = lane & 3;
    if (tid == 0) {
        for (int i = 0; i < 18; ++i) mbar_init(bars + 8 * i, 1);
        fence_proxy_async();
        tma_prefetch_map(&p.kv_tmap);
    }
    const int seqs = decode::num_seqs(p, false);
    const int block_seq = cta_rows<false>(p, decode::rows_per_seq(p, false)).seq;
    // tiles each buffer has held before this piece (its mbarriers' phases)
    uint32_t used0 = 0, used1 = 0;

    decode::for_each_piece(p, seqs, block_seq, [&](const decode::Piece pc) {
        fence_proxy_async();  // this thread's generic writes of the last piece (staged rows), before TMA rewrites
        __syncthreads();      // the previous piece is done with shared memory (and the mbarriers are set up)
        const int seq_rows = decode::rows_per_seq(p, false);
        const CtaRows rows = cta_rows<false>(p, seq_rows);
        const int row_base = rows.base, row_limit = rows.limit;
        const int r0 = row_of(decode::thread_index());
        const int seq = pc.seq;
        int row_len[2];
        const decode::PieceTiles pt =
            decode::piece_tiles<false, kTile, false>(p, pc, seq_rows, row_base, row_limit, r0, row_len, tid);
        if (pt.skip) return;
        const int n_tokens = pt.tokens, tile_begin = pt.begin, n = pt.end - pt.begin;
        const int min_len = min(row_len[0], row_len[1]);
        const float scale_log2 = p.scale_log2;

        // ---- the loads: tile `tile` (absolute) into buffer b, the column blocks of bit set `blks`, by one thread ----
        // (the pages' size, a power of two ≥ 8 by the tensor map's condition, and the block table
        // are read from the parameters here, not held in registers through the tile loop)
        auto issue_tile = [&](int tile, int b, uint32_t blks) {
            const int bs = p.block_size, bs_log = 31 - __clz(bs), box_rows = min(kTile, bs);
            const int32_t* table = (const int32_t*)p.block_table + (int64_t)seq * p.block_table_stride;
            const uint64_t policy = l2_evict_first_policy();  // each row is read once
            // the boxes' rows: a page's, or past the cache (zeros) for an invalid page or one past
            // the sequence; the token mask (with the first column blocks: the consumers read it
            // after block 0's mbarrier)
            // each block's bytes are expected first and its arrival comes last (after the mask), so
            // no phase completes early and the mask is released with block 0's arrival
            for (int blk = 0; blk < 9; ++blk)
                if ((blks >> blk) & 1) mbar_expect_tx(bar(b, blk), kBlockBytes);
            unsigned long long mask = 0;
            for (int box = 0; box < kTile / box_rows; ++box) {
                const int pos = tile * kTile + box * box_rows;
                const int page = pos < n_tokens ? table[pos >> bs_log] : -1;
                const bool ok = page >= 0 && page < p.num_pages;
                const int c1 = ok ? page * p.page_rows + (pos & (bs - 1)) : p.num_pages * p.page_rows;
                if (ok) {
                    const int valid = min(box_rows, n_tokens - pos);
                    const unsigned long long bits = valid >= 64 ? ~0ull : ((1ull << valid) - 1);
                    mask |= bits << (box * box_rows);
                }
                for (int blk = 0; blk < 9; ++blk)
                    if ((blks >> blk) & 1)
                        tma_load_2d_hint(kv_addr + b * kTileBytes + blk * kBlockBytes + box * box_rows * 128, &p.kv_tmap,
                                     blk * 64, c1, bar(b, blk), policy);
            }
            if (blks & 1) sMask[b] = mask;
            for (int blk = 0; blk < 9; ++blk)
                if ((blks >> blk) & 1) mbar_arrive(bar(b, blk));
        };
        // relative tile i's buffer is i & 1; the parity its mbarriers complete with
        auto parity = [&](int i) -> uint32_t { return ((i & 1 ? used1 : used0) + (i >> 1)) & 1; };

        if (tid == 0 && n > 0) {
            issue_tile(tile_begin, 0, 0x1ff);
            if (n > 1) issue_tile(tile_begin + 1, 1, 0x1ff);
        }
        load_q<false>(p, sQ, seq, row_base, row_limit, tid, 256);
        decode::cp_async_commit();
        if (tid < kRows) sM[tid] = -INFINITY;
        decode::cp_async_wait<0>();
        fence_proxy_async();  // Q's copies, before wgmma reads them
        __syncthreads();
        auto opaque = [](uint32_t v) {
            uint32_t r;
            asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
            return r;
        };
        // S = Q·K(tile in buffer b)ᵀ over column blocks [B0, B1), each after its mbarrier; one
        // commit a block (so a wait can leave the later blocks in flight). kFirst: the first
        // k-step overwrites s.
        auto issue_s = [&](float (&s)[32], int b, uint32_t par, auto b0_tag, auto b1_tag, auto first_tag) {
            constexpr int B0 = decltype(b0_tag)::value, B1 = decltype(b1_tag)::value;
            constexpr bool kFirst = decltype(first_tag)::value != 0;
#pragma unroll
            for (int blk = B0; blk < B1; ++blk) {
                mbar_wait(bar(b, blk), par);
                // the buffers' addresses through opaque copies after the wait: else the compiler
                // computes every block's descriptors at once, ahead of the waits, and spills them
                const uint32_t qlo = desc_lo(opaque(q_addr), 16), klo = desc_lo(opaque(kv_addr) + b * kTileBytes, 16);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    const uint32_t off = (blk * (kRows * 128) + kk * 32) >> 4;
                    const uint64_t db = desc_words(klo + off, 1024);
                    if (kFirst && blk == B0 && kk == 0) wgmma_ss_n64_first(s, desc_words(qlo + off, 1024), db);
                    else wgmma_ss_n64(s, desc_words(qlo + off, 1024), db, 1);
                }
                wgmma_commit();
            }
        };
        // P·V over the 64 tokens of buffer b, V's columns 256·wg.. (this warpgroup's half of O):
        // P from registers (the packed fragments) or from shared memory at p_addr
        auto issue_pv_regs = [&](float (&o)[128], const uint32_t (&pa)[4][4], int b) {
            fence_regs(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wgmma_rs_n256(o, pa[kk], make_desc(opaque(kv_addr) + b * kTileBytes + 4 * wg * kBlockBytes + kk * 16 * 128,
                                                   kBlockBytes, 1024));
            wgmma_commit();
        };
        auto issue_pv_smem = [&](float (&o)[128], int b) {
            fence_regs(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wgmma_ss_n256(o, p_desc(p_addr(b), kk),
                              make_desc(opaque(kv_addr) + b * kTileBytes + 4 * wg * kBlockBytes + kk * 16 * 128, kBlockBytes, 1024));
            wgmma_commit();
        };
        // The softmax of this warpgroup's tile (relative tile i in buffer b): masks it unless it is
        // clean (every token of the mask and inside both rows of every lane of the warp), and
        // returns the rows' max of the raw scores, scaled (log2 units; −inf: nothing).
        auto tile_max = [&](float (&s)[32], int i, int b, float (&tmax)[2]) {
            const unsigned long long mask = sMask[b];
            const int base = (tile_begin + i) * kTile;
            const bool clean = __all_sync(0xffffffffu, mask == ~0ull && base + kTile <= min_len);
            if (!clean) {
#pragma unroll
                for (int e = 0; e < 32; ++e) {
                    const int col = 8 * (e >> 2) + 2 * t4 + (e & 1);
                    const bool ok = ((mask >> col) & 1) != 0 && base + col < row_len[(e >> 1) & 1];
                    s[e] = ok ? s[e] : -INFINITY;
                }
            }
            tmax[0] = row_max_tree<32, 0, 0, 16>(s);
            tmax[1] = row_max_tree<32, 1, 0, 16>(s);
#pragma unroll
            for (int k = 0; k < 2; ++k) tmax[k] = row_max4(tmax[k]) * scale_log2;
        };
        // p = 2^(s·σ' − m_use) in place, the rows' sums of p returned
        auto exp_tile = [&](float (&s)[32], const float (&m_use)[2], float (&sum)[2]) {
            sum[0] = sum[1] = 0.0f;
#pragma unroll
            for (int e = 0; e < 32; ++e) {
                s[e] = decode::exp2_sfu(fmaf(s[e], scale_log2, -m_use[(e >> 1) & 1]));
                sum[(e >> 1) & 1] += s[e];
            }
        };
        // P as bf16 A fragments (kk: tokens 16kk..; the S accumulator's pairs in order)
        auto pack_p = [&](const float (&s)[32], uint32_t (&pa)[4][4], const float (&f)[2]) {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    pa[kk][j] = decode::pack_bf16(s[8 * kk + 2 * j] * f[j & 1], s[8 * kk + 2 * j + 1] * f[j & 1]);
        };
        // pack_p's fragments into [64 × 64] bf16 at dst, the K-major swizzled A layout, by stmatrix:
        // pa[kk] are the warp's four 8 × 8 matrices of tokens 16kk.. (rows +0 / +8, columns +0 / +8),
        // lane l addressing row l % 8 of matrix l / 8 (fewer stores and addresses than one a pair)
        auto store_p = [&](const uint32_t (&pa)[4][4], unsigned char* dst) {
            const int tv = decode::thread_index(), l = tv & 31, m = l >> 3;
            const int row = ((tv >> 5) & 3) * 16 + (l & 7) + 8 * (m & 1);
            const uint32_t base = decode::smem_addr(dst) + row * 128;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                stmatrix_x4(base + (((2 * kk + (m >> 1)) ^ (row & 7)) << 4), pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
        };
        // A partial last tile: V's rows (this warpgroup's half) of tokens outside the mask set to
        // zero, after the tile's blocks landed (waited here: the other warpgroup scored it) and
        // before this warpgroup's P·V reads them.
        auto zero_tail = [&](int i, int b) {
#pragma unroll
            for (int blk = 0; blk < 4; ++blk) mbar_wait(bar(b, 4 * wg + blk), parity(i));
            const unsigned long long mask = sMask[b];
            for (int c = t; c < kTile * 32; c += 128) {
                const int tok = c >> 5, chunk = 8 * (4 * wg) + (c & 31);
                if (((mask >> tok) & 1) == 0) *(uint4*)(sKV + b * kTileBytes + swizzled(kTile, tok, chunk)) = make_uint4(0, 0, 0, 0);
            }
            fence_proxy_async();  // these writes, before wgmma reads the tile
            if (wg == 0) named_bar_sync<kBarWg, 128>();
            else named_bar_sync<kBarWg + 1, 128>();
        };
        const bool partial = (tile_begin + n) * kTile > n_tokens;  // the piece's last tile runs past the sequence

        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float l[2] = {0.0f, 0.0f};  // this warpgroup's share of the rows' sums, against the rows' max
        float s[32];
        const int rA = r0, rB = r0 + 8;

        if (wg == 0) {
            // ---- warpgroup 0: tiles 0, 2, 4, .. of the piece (buffer 0), O's left half ----
            if (n > 0) {
                issue_s(s, 0, parity(0), RoleTag<0>{}, RoleTag<9>{}, RoleTag<1>{});
                wgmma_wait0();
                fence_regs(s);
            }
            // one pair: a = tile 2k (relative), b = a + 1; kLast0: a is the piece's last tile,
            // kLast1: b is
            auto pair = [&](int a, auto last0_tag, auto last1_tag) {
                constexpr bool kLast0 = decltype(last0_tag)::value != 0, kLast1 = decltype(last1_tag)::value != 0;
                float tmax[2], m_use[2], sc0[2], sum[2];
                tile_max(s, a, 0, tmax);
                const float m_old[2] = {sM[rA], sM[rB]};
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    const float m_new = fmaxf(m_old[k], tmax[k]);
                    m_use[k] = m_new == -INFINITY ? 0.0f : m_new;
                    sc0[k] = decode::exp2_sfu(m_old[k] - m_use[k]);
                }
                __syncwarp();  // the warp's reads of sM, before its writes (a row is one warp's)
                if (t4 == 0) {
                    sM[rA] = fmaxf(m_old[0], tmax[0]);
                    sM[rB] = fmaxf(m_old[1], tmax[1]);
                    sScale0[rA] = sc0[0];
                    sScale0[rB] = sc0[1];
                }
                named_bar_arrive<kBarScale0, 256>();
                rescale_o(o, sc0[0], sc0[1]);
                {
                    // P(a) unscaled for this warpgroup's own half, from shared memory (holding its
                    // fragments in registers beside the fp32 P spilled); the fp32 p kept in s
                    uint32_t pa[4][4];
                    sum[0] = sum[1] = 0.0f;
#pragma unroll
                    for (int e = 0; e < 32; e += 2) {
                        const int k = (e >> 1) & 1;
                        s[e] = decode::exp2_sfu(fmaf(s[e], scale_log2, -m_use[k]));
                        s[e + 1] = decode::exp2_sfu(fmaf(s[e + 1], scale_log2, -m_use[k]));
                        sum[k] += s[e] + s[e + 1];
                        pa[e >> 3][(e >> 1) & 3] = decode::pack_bf16(s[e], s[e + 1]);
                    }
#pragma unroll
                    for (int k = 0; k < 2; ++k) l[k] = l[k] * sc0[k] + sum[k];
                    store_p(pa, sKV + 8 * kBlockBytes);
                    fence_proxy_async();
                    if constexpr (kLast0) {
                        if (partial) zero_tail(a, 0);
                        else named_bar_sync<kBarWg, 128>();
                    } else {
                        named_bar_sync<kBarWg, 128>();  // the warpgroup's P is written
                    }
                    issue_pv_smem(o, 0);
                    wgmma_wait0();
                    fence_regs(o);
                }
                named_bar_sync<kBarScale1, 256>();  // WG1's max: sScale1
                if constexpr (!kLast0 && !kLast1) {
                    if (t == 0) issue_tile(tile_begin + a + 2, 0, 0x00f);  // S(a) and V(a)[left] are done
                }
                const float sc1[2] = {sScale1[rA], sScale1[rB]};
                {
                    // P(a) against WG1's max, for WG1's half (one rounding from the fp32 p)
                    uint32_t pa[4][4];
                    pack_p(s, pa, sc1);
                    store_p(pa, sKV + 8 * kBlockBytes);  // buffer 0's rope block (S(a) is done)
                    fence_proxy_async();                // before WG1's wgmma reads it
                    named_bar_arrive<kBarP0, 256>();
                }
                rescale_o(o, sc1[0], sc1[1]);
#pragma unroll
                for (int k = 0; k < 2; ++k) l[k] *= sc1[k];
                if constexpr (!kLast0) {
                    if constexpr (kLast1) {
                        if (partial) zero_tail(a + 1, 1);
                    }
                    named_bar_sync<kBarP1, 256>();  // P(b) is written
                    issue_pv_smem(o, 1);
                    if constexpr (!kLast1) {
                        issue_s(s, 0, parity(a + 2), RoleTag<0>{}, RoleTag<4>{}, RoleTag<1>{});
                        wgmma_wait<4>();  // P(b)·V(b)[left] is done: buffer 1's left blocks and P(b) are free
                        if (t == 0 && a + 3 < n) issue_tile(tile_begin + a + 3, 1, 0x10f);
                        issue_s(s, 0, parity(a + 2), RoleTag<4>{}, RoleTag<9>{}, RoleTag<0>{});
                    }
                    wgmma_wait0();
                    fence_regs(o);
                    fence_regs(s);
                }
            };
            int a = 0;
            for (; a < n - 2; a += 2) pair(a, RoleTag<0>{}, RoleTag<0>{});
            if (a + 1 < n) pair(a, RoleTag<0>{}, RoleTag<1>{});
            else if (a < n) pair(a, RoleTag<1>{}, RoleTag<0>{});
        } else {
            // ---- warpgroup 1: tiles 1, 3, 5, .. of the piece (buffer 1), O's right half ----
            if (n > 1) {
                issue_s(s, 1, parity(1), RoleTag<0>{}, RoleTag<9>{}, RoleTag<1>{});
                wgmma_wait0();
                fence_regs(s);
            }
            // kLast0: a is the last tile (WG1 has none), kLast1: b is, kLast2: a + 2 is (no b + 2)
            auto pair = [&](int a, auto last0_tag, auto last1_tag, auto last2_tag) {
                constexpr bool kLast0 = decltype(last0_tag)::value != 0, kLast1 = decltype(last1_tag)::value != 0;
                constexpr bool kLast2 = decltype(last2_tag)::value != 0;
                float tmax[2] = {-INFINITY, -INFINITY}, m_use[2], sc1[2], sum[2] = {0.0f, 0.0f};
                if constexpr (!kLast0) tile_max(s, a + 1, 1, tmax);
                named_bar_sync<kBarScale0, 256>();  // WG0's max and factors
                const float m_old[2] = {sM[rA], sM[rB]};
                const float sc0[2] = {sScale0[rA], sScale0[rB]};
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    const float m_new = fmaxf(m_old[k], tmax[k]);
                    m_use[k] = m_new == -INFINITY ? 0.0f : m_new;
                    sc1[k] = decode::exp2_sfu(m_old[k] - m_use[k]);
                }
                __syncwarp();
                if (t4 == 0) {
                    sM[rA] = fmaxf(m_old[0], tmax[0]);
                    sM[rB] = fmaxf(m_old[1], tmax[1]);
                    sScale1[rA] = sc1[0];
                    sScale1[rB] = sc1[1];
                }
                named_bar_arrive<kBarScale1, 256>();
                // O and l were against the max before WG0's tile: to WG1's max (WG0 rescales P(a) to it)
                const float f[2] = {sc0[0] * sc1[0], sc0[1] * sc1[1]};
                rescale_o(o, f[0], f[1]);
                [[maybe_unused]] uint32_t pa[4][4];
                if constexpr (!kLast0) {
                    // p and its bf16 fragments together (the fp32 p is not needed after)
#pragma unroll
                    for (int e = 0; e < 32; e += 2) {
                        const int k = (e >> 1) & 1;
                        const float p0 = decode::exp2_sfu(fmaf(s[e], scale_log2, -m_use[k]));
                        const float p1 = decode::exp2_sfu(fmaf(s[e + 1], scale_log2, -m_use[k]));
                        sum[k] += p0 + p1;
                        pa[e >> 3][(e >> 1) & 3] = decode::pack_bf16(p0, p1);
                    }
                    store_p(pa, sKV + kTileBytes + 8 * kBlockBytes);  // P(b) into buffer 1's rope block
                    fence_proxy_async();                              // before WG0's wgmma reads it
                    if constexpr (kLast1) {
                        if (partial) zero_tail(a + 1, 1);
                    }
                    issue_pv_regs(o, pa, 1);
                }
#pragma unroll
                for (int k = 0; k < 2; ++k) l[k] = l[k] * f[k] + sum[k];
                named_bar_sync<kBarP0, 256>();  // P(a) is written
                if constexpr (kLast0) {
                    if (partial) zero_tail(a, 0);
                }
                issue_pv_smem(o, 0);
                if constexpr (!kLast0) named_bar_arrive<kBarP1, 256>();
                if constexpr (!kLast0 && !kLast1) {
                    if constexpr (!kLast2) {
                        wgmma_wait<1>();  // P(b)·V(b)[right] is done: buffer 1's right blocks are free
                        if (t == 0) issue_tile(tile_begin + a + 3, 1, 0x0f0);
                    }
                    wgmma_wait0();  // P(a)·V(a)[right] too: buffer 0's right blocks and P(a)
                    if (t == 0) issue_tile(tile_begin + a + 2, 0, 0x1f0);
                    if constexpr (!kLast2) {
                        issue_s(s, 1, parity(a + 3), RoleTag<4>{}, RoleTag<8>{}, RoleTag<1>{});
                        issue_s(s, 1, parity(a + 3), RoleTag<0>{}, RoleTag<4>{}, RoleTag<0>{});
                        issue_s(s, 1, parity(a + 3), RoleTag<8>{}, RoleTag<9>{}, RoleTag<0>{});
                    }
                }
                wgmma_wait0();
                fence_regs(o);
                fence_regs(s);
            };
            int a = 0;
            for (; a < n - 3; a += 2) pair(a, RoleTag<0>{}, RoleTag<0>{}, RoleTag<0>{});
            if (a + 2 < n) {
                pair(a, RoleTag<0>{}, RoleTag<0>{}, RoleTag<1>{});
                pair(a + 2, RoleTag<1>{}, RoleTag<0>{}, RoleTag<0>{});
            } else if (a + 1 < n) {
                pair(a, RoleTag<0>{}, RoleTag<1>{}, RoleTag<0>{});
            } else if (a < n) {
                pair(a, RoleTag<1>{}, RoleTag<0>{}, RoleTag<0>{});
            }
        }
        used0 += (n + 1) >> 1;
        used1 += n >> 1;

        // ---- the epilogue: the rows' sums of both warpgroups, then O / den and lse ----
        __syncthreads();  // every read of sScale0/1 is done (sRed reuses them)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const float lt = row_total(l[k]);
            if (t4 == 0) sRed[wg * kRows + r0 + 8 * k] = lt;
        }
        __syncthreads();
        float2 stats[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int r = r0 + 8 * k;
            const float m = sM[r];
            stats[k] = decode::row_stats(p, pc.slot >= 0, row_base + r, sRed[r] + sRed[kRows + r], m);
        }
        decode::write_rows_staged<2 * kTileBytes, false>(p, pc.slot, seq, seq_rows, row_base, row_limit, r0,
                                                         wg * 256 + 2 * t4, wg == 0 && t4 == 0, stats, OHalf{o}, sKV,
                                                         tid, 256);
    });
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_90a only: the launcher never picks this family elsewhere
#endif
}

}  // namespace dcp
