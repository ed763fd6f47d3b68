// The trio schedule of the Hopper decode kernel (Sm90Schedule::Trio; dense and sparse BF16, tiles
// of 64 tokens in two bf16 buffers): three warpgroups, so that scoring the next tile runs beside
// P·V of this one. Its own kernel family (384 threads). The lead schedule
// (Sm90Schedule::Lead, sparse FP8-656 and MODEL1 (DecodeKv::Model1, the family
// mla_decode_model1_sm90_lead)) has a producer warpgroup fill every tile, described below.
#pragma once
#include <type_traits>
#include "decode/sm90_base.cuh"

namespace dcp {

// Roles of the three warpgroups, each with its own piece loop and register budget:
// warpgroup 0 (the scorer), per tile i: waits for tile i, S(i) = Q·K(i)ᵀ, the softmax, P(i) as bf16
//   into tile i's rope block (only S reads it) in the wgmma A layout, the rows' rescale factors
//   into slot i & 1 of sAlpha; then p_full(b) (128 arrivals). It never holds O, so it goes on to
//   tile i + 1 while P·V(i) runs.
// warpgroup 1: the loads (Q with the first tile; dense tiles by TMA when the launch passes a
//   tensor map, else cp.async; sparse rows by cp.async) and O's right half: per tile, waits for
//   p_full(b), rescales, P·V over V's dims 256..511, arrives on empty(b), and refills buffer b
//   with tile i + 2 once both P·V warpgroups are done with it.
// trio_split (Sm90Schedule::TrioSplit, BF16, where a sequence has two or more row blocks): the
//   scorer hands P over in two halves of 32 tokens, p_full(b, 0) (with the factors) and
//   p_full(b, 1), taking a clean tile's p against the rows' running max (the lazy max, redone
//   exactly when a row's max grew by more than kLazyMaxSlack); each P·V warpgroup multiplies the
//   first half while the scorer computes the second half's exps. Measured on the H200: −7 to −8%
//   on the compute-bound dense rows, +1 to +3% on the memory-bound ones (hence both variants).
// warpgroup 2: O's left half (dims 0..255), as warpgroup 1 without the loads.
// Buffer b's full mbarrier completes when its copies have landed and its flags are written
// (warpgroup 1, or lead's producer: 128 cp.async arrivals and 128 arrivals, plus the TMA boxes'
// bytes); its empty mbarrier when the 256 threads of warpgroups 1 and 2 (lead: 0 and 1) finished
// P·V of it (S finished earlier: the scorer waited for it). sAlpha has a slot per buffer: the
// scorer writes slot b for tile i + 2 only after full(b), which follows empty(b) of tile i, which
// follows every reader of tile i's.
// empty(b) takes one arrival a thread, not one a warp after __syncwarp: racecheck follows that
// chain only through each reader's own arrival (with one a warp it reported the factors as races;
// a separate barrier for them, tried first, measured 1-3% slower: NOTES.md at 628d1db).
// Lead (Sm90Schedule::Lead; sparse FP8 and MODEL1): warpgroup 2, the producer, fills every tile
// (flags, rope block by cp.async, the latent dequantised from registers; the scorer copies Q). The
// scorer also multiplies O's left half by its own P from registers (FlashMLA's split) and arrives
// on empty(b) after it; warpgroup 1 only waits for P and the tile, rescales, multiplies O's right
// half and arrives on empty(b), so no dequantisation sits between two P·V. full(b) takes the
// producer's 128 cp.async arrivals and 128 arrivals. (Quad, the same producer beside trio's two
// P·V warpgroups in 512 threads, and pair, trio's P·V warpgroups dequantising and sharing each
// tile across a two-CTA cluster, were removed once no shape ran them: docs/design.md.)
// MODEL1 (lead over DecodeKv::Model1; decode/model1_format.cuh's cache): Q and a tile are 512
// values a row (8 column blocks: 7 of nope, the rope block last), and V is the whole token, rope
// included, so P(i) goes to a buffer of its own (2 × 8 KB after the tiles, reused under the same
// full/empty chain as the tile's; the epilogue stages rows over tiles and P's buffers). The
// producer fills a tile from one or two sources (the first list's positions, then the second's):
// half 0 of a token's threads its nope blocks 0..3, half 1 blocks 4..6, each block one 64-byte
// batch and its ue8m0 scale byte.
template <int R>
struct RoleTag {
    static constexpr int value = R;
};

// A P·V warpgroup's accumulators as write_rows reads them: column 8c + e of the thread's pairs.
struct OHalf {
    const float (&o)[128];
    __device__ __forceinline__ float operator()(int c, int e) const { return o[4 * c + e]; }
};

template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ void mla_decode_sm90_trio(const DcpMlaDecodeParams& p) {
    [[maybe_unused]] constexpr bool kSparse = Kv != DecodeKv::DenseBf16;  // (unused off sm_90a)
    [[maybe_unused]] constexpr bool kFp8 = Kv == DecodeKv::SparseFp8;
    // MODEL1 (lead only): 512 values a query row and a token, P in buffers of its own (V is the
    // whole token), the producer's fill from the page-wise cache of one or two sources
    [[maybe_unused]] constexpr bool kModel1 = Kv == DecodeKv::Model1;
    constexpr int kDqk = decode_sm90::dim_qk<Kv>();  // 576, MODEL1's 512
    // lead: a producer warpgroup (role 3) fills every tile, the scorer copying Q and multiplying
    // O's left half itself, by its own P from registers (FlashMLA's split), one P·V warpgroup the
    // right half
    [[maybe_unused]] constexpr bool kLead = Sched == Sm90Schedule::Lead;
    // trio_split (BF16): P goes over in two halves of 32 tokens, the first once a lazy max has
    // passed (so P·V starts beside the scorer's second half of exps); the launcher runs it where a
    // sequence has two or more row blocks (compute-bound), trio's single hand-over elsewhere.
    constexpr bool kSplitP = Sched == Sm90Schedule::TrioSplit;
    // BF16 scorers (104 registers) hold Q's last kQRegBlocks column blocks (the rope block) in
    // registers as wgmma A fragments (RS: only K is read from shared memory for them); FP8's (72)
    // none. Measured on the H200: one block −0.7% on compute-bound rows, two no better (NOTES.md at 628d1db).
    constexpr int kQRegBlocks = kFp8 || kModel1 ? 0 : 1;
    static_assert(((Sched == Sm90Schedule::Trio || kSplitP) && !kFp8 && !kModel1 || kLead && (kFp8 || kModel1)) &&
                      Tile == 64 && Stages == 2,
                  "trio schedule: P fills a 64-token rope block; two buffers; trio and trio_split: BF16 only; "
                  "lead: FP8 or MODEL1");
    static_assert(decode_sm90::shared_bytes<Kv, Tile, Stages, Sched>() + decode::kWriteRowsStaticBytes <= 227 * 1024,
                  "fits one H100/H200 CTA (dynamic + write_rows' static flags)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace decode_sm90;
    constexpr int kSRegs = Tile / 2;
    constexpr int kTileBytes = Tile * kDqk * 2;
    constexpr int kQBytes = kRows * kDqk * 2;
    constexpr int kQkBlocks = kDqk / 64;   // column blocks of Q and of a tile
    constexpr int kPBytes = kRows * 64 * 2;  // MODEL1: one of P's own buffers
    constexpr int kLdPerTok = 128 / Tile;  // warpgroup 1's threads per token of a tile
    constexpr int kFp8Batch = 4;           // FP8: 16-byte raw loads in flight a thread
    unsigned char* smem = aligned_smem<Kv, Tile, Stages, Sched>();
    unsigned char* sQ = smem;
    unsigned char* sKV = smem + kQBytes;                  // 2 × [Tile × kDqk] bf16
    // MODEL1: P's two buffers (the others' P is in the tile's rope block), right after the tiles
    [[maybe_unused]] unsigned char* sP = sKV + Stages * kTileBytes;
    int* sValid = (int*)(sP + own_p_bytes<Kv, Stages>());  // [2][Tile]
    float* sAlpha = (float*)(sValid + Stages * Tile);     // [2][64] rescale factors of P(i)
    float2* sStats = (float2*)(sAlpha + 2 * kRows);       // [64] the rows' row_stats (den, lse)
    const uint32_t bars = decode::smem_addr(sStats + kRows);  // full[2], empty[2], p_full[2] (trio_split: p_full[2] of half 1)
    auto full = [&](int b) { return bars + 8 * b; };
    auto empty = [&](int b) { return bars + 16 + 8 * b; };
    // P of buffer b (trio_split: its half h, tokens 32h..32h + 31; half 1's after the rest)
    auto p_full = [&](int b, int h = 0) { return h == 0 ? bars + 32 + 8 * b : bars + 48 + 8 * b; };
    [[maybe_unused]] const uint32_t q_full = bars + 48;  // lead: the scorer's copies of Q, a piece
    const uint32_t q_addr = decode::smem_addr(sQ), kv_addr = decode::smem_addr(sKV);
    [[maybe_unused]] const uint32_t p_addr0 = decode::smem_addr(sP);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, t = tid & 127, t4 = lane & 3;
    if (tid == 0) {
        for (int b = 0; b < 2; ++b) {
            mbar_init(full(b), 256);
            mbar_init(empty(b), 256);
            // one arrival per thread: racecheck does not see a warp's accesses ordered by
            // __syncwarp before lane 0's arrival (NOTES.md at 628d1db, fifth session)
            mbar_init(p_full(b, 0), 128);
            if constexpr (kSplitP) mbar_init(p_full(b, 1), 128);
            if constexpr (kLead) if (b == 0) mbar_init(q_full, 128);
        }
        fence_proxy_async();
    }
    if (!kSparse && p.kv_tma != 0 && tid == 128) tma_prefetch_map(&p.kv_tmap);  // warpgroup 1 issues the boxes
    const int seqs = decode::num_seqs(p, kSparse);
    const int block_seq = cta_rows<kSparse>(p, decode::rows_per_seq(p, kSparse)).seq;
    uint32_t uses = 0;           // tiles consumed before this piece: buffer uses & 1, phase uses >> 1
    [[maybe_unused]] uint32_t q_loads = 0;  // lead's scorer: pieces whose Q it copied (q_full's phase)

    auto piece = [&](const decode::Piece pc, auto role_tag) {
        constexpr int kRole = decltype(role_tag)::value;  // = wg
        __syncthreads();  // the previous piece is done with shared memory (and the mbarriers are set up)
        // this thread's rows r0 and r0 + 8 and the CTA's rows, worked out afresh from the
        // parameters and indices: a value live across setmaxnreg is spilled (the CTA's row count
        // was, once the piece's length rule grew)
        const int seq_rows = decode::rows_per_seq(p, kSparse);
        const CtaRows rows = cta_rows<kSparse>(p, seq_rows);
        const int row_base = rows.base, row_limit = rows.limit;
        const int r0 = decode_sm90::row_of(decode::thread_index());
        const int seq = pc.seq;
        int row_len[2];
        const decode::PieceTiles pt =
            decode::piece_tiles<kSparse, Tile, kModel1>(p, pc, seq_rows, row_base, row_limit, r0, row_len, tid);
        if (pt.skip) return;
        const int n_tokens = pt.tokens, tile_begin = pt.begin, tile_end = pt.end;
        const int n = tile_end - tile_begin;

        // Where a tile's tokens are (warpgroup 1's loads and lead's producer). Dense: a
        // power-of-two block size (the usual case) divides by shifting.
        const int bs = p.block_size, bs_log = 31 - __clz(bs);
        const bool bs_pow2 = (bs & (bs - 1)) == 0;
        auto div_bs = [&](int pos) { return bs_pow2 ? pos >> bs_log : pos / bs; };
        // sparse: the sequence's index list, its view's strides resolved once a piece (a division
        // by nq at every index load cost the sparse kernels ~900 instructions)
        [[maybe_unused]] const int32_t* const idx_list = kSparse ? decode::index_list(p, seq) : nullptr;
        auto mod_bs = [&](int pos) { return bs_pow2 ? pos & (bs - 1) : pos % bs; };
        // the page (dense) or cache row (sparse) of tile's token `tok`, or -1 past the sequence
        auto token_page_of = [&](int tile, int tok) -> int {
            const int pos = tile * Tile + tok;
            if (pos >= n_tokens) return -1;
            if constexpr (kSparse) return idx_list[pos];
            return ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + div_bs(pos)];
        };
        // the cache row of tile's token `tok`, or -1 (past the sequence, or an invalid page)
        auto token_row_of = [&](int tile, int tok, int page) -> int64_t {
            const int pos = tile * Tile + tok;
            if constexpr (kSparse) {
                if (pos < n_tokens && page >= 0 && (int64_t)page < (int64_t)p.num_pages * bs)
                    return decode::sparse_cache_row(p, page);
            } else {
                if (pos < n_tokens && page >= 0 && page < p.num_pages) return (int64_t)page * p.page_rows + mod_bs(pos);
            }
            return -1;
        };
        // lead's producers' loop (FP8-656's and MODEL1's): per fill f, the wait for its buffer,
        // `fill(b, u)` (the flags, the rope block's copies and the dequantised stores into buffer
        // b, use u), the fill published on full(b), then `next(f)` (fill f + 1's loads); at the
        // piece's end, the CTA barriers of a warpgroup that holds no rows
        [[maybe_unused]] auto produce = [&](auto&& fill, auto&& next) {
            for (int f = 0; f < n; ++f) {
                const uint32_t u = uses + f;
                const int b = u & 1;
                if (u >= 2) mbar_wait_sleep(empty(b), ((u >> 1) - 1) & 1);  // P·V of use u − 2 is done
                // fill f − 2's copies into this buffer have landed (full, then its P·V, came
                // before empty): seen by this thread too, for racecheck (one group a fill)
                decode::cp_async_wait<1>();
                fill(b, u);
                fence_proxy_async();            // these generic writes, before wgmma reads them
                mbar_arrive_cp_async(full(b));  // the rope's copies (Q is the scorer's own)
                decode::cp_async_commit();
                mbar_arrive(full(b));
                if (f + 1 < n) next(f);
            }
            uses += n;
            __syncthreads();                // the scorer's sStats
            decode::write_rows_staged_barriers();  // the producer holds no columns of O
        };
        // lead's producers: a 16-byte raw batch entry (16 e4m3 values) dequantised by s into token
        // tok's 16-byte chunks col and col + 1 of the tile in buffer b
        [[maybe_unused]] auto put_dequant16 = [&](int b, int tok, int col, uint4 raw, float s) {
            unsigned char* dst = sKV + b * kTileBytes;
            *(uint4*)(dst + swizzled(Tile, tok, col)) = decode::dequant8(make_uint2(raw.x, raw.y), s);
            *(uint4*)(dst + swizzled(Tile, tok, col + 1)) = decode::dequant8(make_uint2(raw.z, raw.w), s);
        };
        if constexpr (kRole == 0) {
            // ---- the scorer: S, the softmax, P and the rescale factors ----
            const float scale_log2 = p.scale_log2;
            float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
            // Q's last kQRegBlocks blocks as A fragments, [block][k-step][4], loaded once Q has landed
            [[maybe_unused]] uint32_t qr[kQRegBlocks > 0 ? kQRegBlocks : 1][4][4];
            // lead: O's left half (dims 0..255) and P(i) as the A fragments of its Tile / 16 k-steps
            [[maybe_unused]] float o[128];
            [[maybe_unused]] uint32_t pf[Tile / 16][4];
            if constexpr (kLead) {
#pragma unroll
                for (int j = 0; j < 128; ++j) o[j] = 0.0f;
            }
            // lead: the scorer copies Q itself while it waits for the first tile, so that the
            // producer's first index and row loads do not queue behind Q's 4,608 copies (quad's
            // timeline had tile 0's index land 2 µs after Q's issue, its rows 3.9 µs after that)
            if constexpr (kLead) {
                if (n > 0) {
                    // (its own copies of the previous piece have landed: seen by this thread too, for racecheck)
                    decode::cp_async_wait<0>();
                    load_q<kSparse, kDqk / 8>(p, sQ, seq, row_base, row_limit, t, 128);
                    mbar_arrive_cp_async(q_full);  // one arrival a thread, once its copies land
                }
            }
            for (int i = 0; i < n; ++i) {
                const uint32_t u = uses + i;
                const int b = u & 1;
                float s[kSRegs];
                mbar_wait_sleep(full(b), (u >> 1) & 1);
                if constexpr (kLead) {
                    if (i == 0) mbar_wait_sleep(q_full, q_loads++ & 1);  // the warpgroup's copies of Q
                }
                fence_proxy_async();
                if constexpr (kQRegBlocks > 0) {
                    // the first tile's fill covered Q's copies: its blocks into registers, once a piece
                    if (i == 0) {
                        // the thread's rows from a fresh read of its index (else the compiler hoists
                        // these addresses above the roles' branch and the P·V warpgroups spill)
                        const int tv = decode::thread_index(), w = (tv >> 5) & 3, g = (tv & 31) >> 2, tq = tv & 3;
#pragma unroll
                        for (int j = 0; j < kQRegBlocks; ++j)
#pragma unroll
                            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                                for (int f = 0; f < 4; ++f) {
                                    const int row = 16 * w + g + 8 * (f & 1), chunk = 8 * (kQkBlocks - kQRegBlocks + j) + 2 * kk + (f >> 1);
                                    qr[j][kk][f] = *(const uint32_t*)(sQ + swizzled(kRows, row, chunk) + 4 * tq);
                                }
                    }
                }
                {
                    // Q's address through an opaque copy: else the compiler computes Q's 36
                    // descriptors once, outside the tile loop, and spills them.
                    // Each k-step's descriptors are the first ones' low words plus a constant (one
                    // add each; make_desc per step cost ~10 uniform instructions, a third of the
                    // scorer's issue slots).
                    uint32_t qa;
                    asm volatile("mov.b32 %0, %1;" : "=r"(qa) : "r"(q_addr));
                    const uint32_t qlo = desc_lo(qa, 16), klo = desc_lo(kv_addr + b * kTileBytes, 16);
                    wgmma_fence();
#pragma unroll
                    for (int ks = 0; ks < kDqk / 16; ++ks) {
                        const uint32_t koff = (ks & 3) * 32;
                        const uint64_t da = desc_words(qlo + (((ks >> 2) * (kRows * 128) + koff) >> 4), 1024);
                        const uint64_t db = desc_words(klo + (((ks >> 2) * (Tile * 128) + koff) >> 4), 1024);
                        if (ks == 0) wgmma_ss_n64_first(s, da, db);
                        else if (kQRegBlocks > 0 && (ks >> 2) >= kQkBlocks - kQRegBlocks)
                            wgmma_rs_n64(s, qr[(ks >> 2) - (kQkBlocks - kQRegBlocks)][ks & 3], db);
                        else wgmma_ss_n64(s, da, db, 1);
                    }
                    wgmma_commit();
                    fence_regs(s);
                }
                // BF16: the tile's flags read while S runs, and a tree max (−1.7 to −2.3% on the
                // compute-bound dense rows; FP8's scorers measured 1-4% slower with both: NOTES.md at 628d1db)
                constexpr bool kEarlyFlags = !kFp8 && !kModel1;
                bool clean = false;
                if constexpr (kEarlyFlags) clean = tile_clean<kSRegs, Tile>(sValid + b * Tile, tile_begin + i, row_len, t4);
                wgmma_wait0();
                fence_regs(s);
                if constexpr (!kEarlyFlags) clean = tile_clean<kSRegs, Tile>(sValid + b * Tile, tile_begin + i, row_len, t4);
                unsigned char* p_dst =
                    kModel1 ? sP + b * kPBytes : sKV + b * kTileBytes + (kQkBlocks - 1) * (Tile * 128);
                // The thread's place in P, from a fresh read of its index: else the compiler hoists
                // all 32 store addresses out of the tile loop.
                const int tv = decode::thread_index(), gv = (tv & 31) >> 2;
                const uint32_t row_off = (uint32_t)(((tv >> 5) & 3) * 16 + gv) * 128 + 4 * (tv & 3);
                // P(i) as bf16 against the rows' maxima m_use, each row's p summed into l: tokens
                // 32h.. + 31 for half h of H halves (the thread's scores s[h·kSRegs/H ..])
                auto store_p = [&](const float (&m_use)[2], float (&l)[2], int h, int halves) {
#pragma unroll
                    for (int e = 0; e < kSRegs / halves; e += 2) {
                        const int ee = h * (kSRegs / halves) + e;
                        const int k = (ee >> 1) & 1;
                        // columns 8(ee >> 2) + 2t4, +1 of row r0 + 8k: 16-byte chunk ee >> 2,
                        // swizzled by the row mod 8 (= g for both rows)
                        const uint32_t off = row_off + k * 1024 + (((ee >> 2) ^ gv) << 4);
                        const uint32_t v = p_bf16(s[ee], s[ee + 1], scale_log2, m_use[k], l[k]);
                        *(uint32_t*)(p_dst + off) = v;
                        // lead: the pair is also fragment (ee >> 1) & 3 of k-step ee >> 3 (rows r0 /
                        // r0 + 8, tokens 8(ee >> 2) + 2t4: the wgmma A layout of wgmma_rs_n64)
                        if constexpr (kLead) pf[ee >> 3][(ee >> 1) & 3] = v;
                    }
                };
                auto store_alpha = [&](const float (&alpha)[2]) {
                    if (t4 == 0) {
                        sAlpha[b * kRows + r0] = alpha[0];
                        sAlpha[b * kRows + r0 + 8] = alpha[1];
                    }
                };
                if constexpr (kSplitP) {
                    // P(i) goes over in two halves of 32 tokens (p_full(b, 0) with the factors,
                    // then p_full(b, 1)), so P·V of the first half runs while the scorer takes the
                    // second half's exps, where the tensor pipe was idle.
                    // Lazy max: on a clean tile whose rows have a running max, p against that max
                    // at once, the tile's max beside the first half's exps (off the chain from S
                    // to P); kept unless a row's max grew by more than kLazyMaxSlack, else the tile
                    // is redone exactly (the first half's stores rewritten before any hand-over).
                    // alpha is then 1, so the P·V warpgroups skip their rescale.
                    float alpha[2] = {1.0f, 1.0f}, m_use[2] = {m_run[0], m_run[1]}, l_tile[2] = {0.0f, 0.0f};
                    bool lazy = clean && __all_sync(0xffffffffu, m_run[0] != -INFINITY && m_run[1] != -INFINITY);
                    if (lazy) {
                        store_p(m_use, l_tile, 0, 2);
                        lazy = lazy_max_holds<kSRegs>(s, scale_log2, m_run);
                    }
                    if (!lazy) {
                        l_tile[0] = l_tile[1] = 0.0f;
                        softmax_max_known<kSRegs, Tile, kEarlyFlags>(s, clean, sValid + b * Tile, tile_begin + i, row_len,
                                                                     t4, scale_log2, m_run, l_run, alpha, m_use);
                        store_p(m_use, l_tile, 0, 2);
                    }
                    store_alpha(alpha);
                    fence_proxy_async();  // P's first half and the factors, before P·V's wgmma read them
                    mbar_arrive(p_full(b, 0));
                    store_p(m_use, l_tile, 1, 2);
                    l_run[0] += l_tile[0];
                    l_run[1] += l_tile[1];
                    fence_proxy_async();  // P's second half, before P·V's wgmma read it
                    mbar_arrive(p_full(b, 1));
                } else {
                    float alpha[2], m_use[2];
                    softmax_max_known<kSRegs, Tile, kEarlyFlags>(s, clean, sValid + b * Tile, tile_begin + i, row_len, t4,
                                                                 scale_log2, m_run, l_run, alpha, m_use);
                    store_p(m_use, l_run, 0, 1);
                    store_alpha(alpha);
                    fence_proxy_async();  // these writes, before the P·V warpgroups' wgmma read them
                    mbar_arrive(p_full(b));
                    if constexpr (kLead) {
                        // P(i)·V(i) of O's left half (the tile's dims 0..255), P from registers;
                        // then the buffer is free of this warpgroup's reads
                        rescale_o(o, alpha[0], alpha[1]);
                        fence_regs(o);
                        wgmma_fence();
#pragma unroll
                        for (int kk = 0; kk < Tile / 16; ++kk)
                            wgmma_rs_n256(o, pf[kk], make_desc(kv_addr + b * kTileBytes + kk * 16 * 128, Tile * 128, 1024));
                        wgmma_commit();
                        wgmma_wait0();
                        fence_regs(o);
                        mbar_arrive(empty(b));
                    }
                }
            }
            // the rows' row_stats (den, lse), for the P·V warpgroups' epilogue: computed here, where
            // registers are to spare (the P·V warpgroups spilled computing the sink's term)
            const int rs = decode_sm90::row_of(decode::thread_index());
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float l_row = row_total(l_run[k]);
                if (t4 == 0) sStats[rs + 8 * k] = decode::row_stats(p, pc.slot >= 0, row_base + rs + 8 * k, l_row, m_run[k]);
            }
            uses += n;
            __syncthreads();                // sStats written, before the P·V warpgroups read it
            if constexpr (kLead) {
                // O's left half out, as P·V warpgroup 2 writes it in the other schedules
                float2 stats[2];
#pragma unroll
                for (int k = 0; k < 2; ++k) stats[k] = sStats[rs + 8 * k];
                decode::write_rows_staged<Stages * kTileBytes + own_p_bytes<Kv, Stages>(), kSparse>(
                    p, pc.slot, seq, seq_rows, row_base, row_limit, r0, 2 * t4, t4 == 0, stats, OHalf{o}, sKV, 128 + t,
                    256);
            } else {
                decode::write_rows_staged_barriers();  // the scorer holds no columns of O
            }
            return;
        } else if constexpr (kRole == 3 && !kModel1) {
            // ---- the producer, FP8-656: per tile the flags, the rope block and the latent ----
            // Four threads a token: lane l of warp w fills tokens 8w + l % 8 (slot 0) and 32 more
            // (slot 1), chunk c = l / 8 of every 64-byte block of each (16 latent bytes, two
            // bf16 chunks) and rope chunks 2c, 2c + 1. A warp's load reads 64 contiguous bytes of
            // 8 rows, where two threads a token made it touch 32 (FlashMLA's producer's mapping).
            // Batch h: slot h >> 1, blocks 4 (h & 1)..: fill f's batches 0 and 1 and both slots'
            // scales are loaded before the wait for its buffer, 2 and 3 after (rows prefetched
            // into L2 a fill before, their indices read a fill before that).
            const int c = (t & 31) >> 3;
            const int tok0 = 8 * (t >> 5) + (t & 7);
            auto tok_of = [&](int k) { return tok0 + 32 * k; };
            const unsigned char* cache = (const unsigned char*)p.cache;
            auto src_of = [&](int64_t row) { return cache + (row >= 0 ? row : 0) * kFp8RowBytes; };
            auto load_batch = [&](uint4 (&raw)[kFp8Batch], int64_t row, int h) {
                const unsigned char* src = src_of(row) + 256 * (h & 1) + 16 * c;
#pragma unroll
                for (int j = 0; j < kFp8Batch; ++j)
                    raw[j] = row >= 0 ? __ldg((const uint4*)(src + 64 * j)) : make_uint4(0, 0, 0, 0);
            };
            auto load_scales = [&](int64_t row) -> float4 {
                return row >= 0 ? __ldg((const float4*)(src_of(row) + kFp8ScaleOffset)) : make_float4(0.f, 0.f, 0.f, 0.f);
            };
            // a row's 656 bytes touch at most 7 lines of 128 bytes: lane c prefetches two of them
            auto prefetch_row = [&](int64_t row) {
                if (row < 0) return;
                const unsigned char* a = src_of(row);
                asm volatile("prefetch.global.L2 [%0];" ::"l"(a + 128 * c));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(a + min(512 + 128 * c, kFp8RowBytes - 1)));
            };
            auto store_batch = [&](const uint4 (&raw)[kFp8Batch], int b, int h, const float4& sc) {
                const int tok = tok_of(h >> 1);
#pragma unroll
                for (int j = 0; j < kFp8Batch; ++j) {
                    const int d = 4 * (h & 1) + j, g = d >> 1;  // block d, scale group d / 2
                    const float s = g == 0 ? sc.x : g == 1 ? sc.y : g == 2 ? sc.z : sc.w;
                    put_dequant16(b, tok, 8 * d + 2 * c, raw[j], s);
                }
            };
            decode::cp_async_wait<0>();  // the previous piece's copies, seen here (MODEL1's producer below says why)
            int pg1[2], pg2[2];
            int64_t row[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                pg1[k] = n > 1 ? token_page_of(tile_begin + 1, tok_of(k)) : -1;
                pg2[k] = n > 2 ? token_page_of(tile_begin + 2, tok_of(k)) : -1;
                row[k] = token_row_of(tile_begin, tok_of(k), token_page_of(tile_begin, tok_of(k)));
                prefetch_row(row[k]);
            }
            uint4 ra[kFp8Batch], rb[kFp8Batch];
            float4 sc[2];
            auto load_fill = [&]() {
                load_batch(ra, row[0], 0);
                load_batch(rb, row[0], 1);
                sc[0] = load_scales(row[0]);
                sc[1] = load_scales(row[1]);
            };
            auto next_fill = [&](int f) {
#pragma unroll
                for (int k = 0; k < 2; ++k) row[k] = token_row_of(tile_begin + f + 1, tok_of(k), pg1[k]);
                load_fill();
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    prefetch_row(token_row_of(tile_begin + f + 2, tok_of(k), pg2[k]));
                    pg1[k] = pg2[k];
                    pg2[k] = f + 3 < n ? token_page_of(tile_begin + f + 3, tok_of(k)) : -1;
                }
            };
            load_fill();
#pragma unroll
            for (int k = 0; k < 2; ++k) prefetch_row(token_row_of(tile_begin + 1, tok_of(k), pg1[k]));
            produce(
                [&](int b, [[maybe_unused]] uint32_t u) {
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        if (c == 0) sValid[b * Tile + tok_of(k)] = row[k] >= 0;
                        const unsigned char* src = src_of(row[k]) + kFp8RopeOffset + 32 * c;
#pragma unroll
                        for (int j = 0; j < 2; ++j)
                            decode::cp_async16(
                                sKV + b * kTileBytes + swizzled(Tile, tok_of(k), 8 * (kQkBlocks - 1) + 2 * c + j),
                                src + 16 * j, row[k] >= 0);
                    }
                    store_batch(ra, b, 0, sc[0]);
                    load_batch(ra, row[1], 2);
                    store_batch(rb, b, 1, sc[0]);
                    load_batch(rb, row[1], 3);
                    store_batch(ra, b, 2, sc[1]);
                    store_batch(rb, b, 3, sc[1]);
                },
                next_fill);
            return;
        } else if constexpr (kRole == 3) {
            // ---- the producer, MODEL1: per tile the flags, the rope block and the nope blocks ----
            // Two threads a token (four, FP8-656's mapping above, measured 3-6% slower here):
            // thread t fills token t / 2's nope blocks 4·half.. (half = t & 1: blocks 0..3 or
            // 4..6), each a 64-byte batch with its ue8m0 scale byte (decode/model1_format.cuh),
            // and half of its rope block by cp.async; the token's entry is its first list's
            // (positions 0..n1 − 1) or its second's, in that list's cache.
            // A fill's first two batches and its scales are loaded before the wait
            // for its buffer (their latency hides behind that wait), the rest after, from L2:
            // each row is prefetched a fill before its raw loads, and its index loaded a fill
            // before that.
            const int tok = t >> 1, half = t & 1;
            // the thread's first column block (from t where used: one value fewer to hold)
            auto blk0 = [&]() { return 4 * (t & 1); };
            const unsigned char* cache = (const unsigned char*)p.cache;
            // the first list's valid entries and both lists
            const int n1 = decode::seq_tokens(p, true, seq);
            const int32_t* const list2 = p.extra_indices ? decode_model1::extra_index_list(p, seq) : idx_list;
            // where a token is: its value row and its scale slot (row null: past the lists, or
            // out of the cache: reads zeros)
            struct Where {
                const unsigned char* row;
                const unsigned char* scales;
            };
            // the entry of tile's token: its page (its list's value), or -1 past the lists
            auto page_of = [&](int tile) -> int {
                const int pos = tile * Tile + tok;
                if (pos >= n_tokens) return -1;
                return pos < n1 ? idx_list[pos] : list2[pos - n1];
            };
            auto row_of = [&](int tile, int page) -> Where {
                const int pos = tile * Tile + tok;
                const bool first = pos < n1;
                const int bs1 = first ? p.block_size : p.extra_block_size;
                const int pages = first ? p.num_pages : p.extra_num_pages;
                if (pos >= n_tokens || page < 0 || (int64_t)page >= (int64_t)pages * bs1) return Where{nullptr, nullptr};
                int64_t row, scales;
                if (first) decode_model1::token_offsets(page, bs1, p.page_rows, p.page_div_magic, p.page_div_shift, row, scales);
                else
                    decode_model1::token_offsets(page, bs1, p.extra_page_rows, p.extra_page_div_magic,
                                                 p.extra_page_div_shift, row, scales);
                const unsigned char* c = (const unsigned char*)(first ? p.cache : p.extra_cache);
                return Where{c + row, c + scales};
            };
            auto valid = [](Where w) -> bool { return w.row != nullptr; };
            // the token's value row (an unread one's: the cache's first, never read)
            auto src_of = [&](Where w) -> const unsigned char* { return w.row ? w.row : cache; };
            // the thread's batch h: nope block blk0 + h
            auto load_batch = [&](uint4 (&raw)[kFp8Batch], Where w, int h) {
                const unsigned char* src = src_of(w) + 64 * (blk0() + h);
#pragma unroll
                for (int j = 0; j < kFp8Batch; ++j)
                    raw[j] = valid(w) ? __ldg((const uint4*)(src + 16 * j)) : make_uint4(0, 0, 0, 0);
            };
            // the token's scales: the bytes of the thread's four blocks from the lowest
            auto load_scales = [&](Where w) -> uint32_t {
                return valid(w) ? __ldg((const uint32_t*)(w.scales + 4 * half)) : 0u;
            };
            // a value row's 576 bytes touch at most 6 lines of 128 bytes, 3 from each thread, and
            // its scale slot one more
            auto prefetch_row = [&](Where w) {
                if (!valid(w)) return;
                const unsigned char* a = src_of(w);
#pragma unroll
                for (int k = 0; k < 3; ++k) {
                    const int off = half == 0 ? 128 * k : min(384 + 128 * k, decode_model1::kRowBytes - 1);
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(a + off));
                }
                if (half == 1) asm volatile("prefetch.global.L2 [%0];" ::"l"(w.scales));
            };
            // batch h dequantised into buffer b: its scale is byte h, 2^(byte − 127)
            auto store_batch = [&](const uint4 (&raw)[kFp8Batch], int b, int h, uint32_t sc) {
                const int c0 = 8 * (blk0() + h);
                const float s = decode_model1::ue8m0((sc >> (8 * h)) & 0xffu);
#pragma unroll
                for (int j = 0; j < kFp8Batch; ++j) put_dequant16(b, tok, c0 + 2 * j, raw[j], s);
            };
            // the rope block: the tile's last column block, 448 bytes into the row
            constexpr int kRopeAt = decode_model1::kNope;
            // 7 nope blocks: half 1 has no fourth batch
            const bool batch3 = half == 0;
            // Every copy of the previous piece has landed (its readers finished before this
            // piece's barrier): waited for here too, so that this thread itself has seen them
            // complete before it copies into the same bytes (racecheck cannot follow the
            // mbarrier chain from another thread's wait). A piece without tiles loads no Q: no
            // fill's arrival would cover its copies, which could then land over the next piece's.
            decode::cp_async_wait<0>();
            int pg1 = n > 1 ? page_of(tile_begin + 1) : -1;  // the next fill's index
            int pg2 = n > 2 ? page_of(tile_begin + 2) : -1;  // the one after
            Where row = row_of(tile_begin, page_of(tile_begin));
            prefetch_row(row);
            uint4 ra[kFp8Batch], rb[kFp8Batch];
            uint32_t sc;
            // a fill's loads made before the wait for its buffer: its first two batches, its scales
            auto load_fill = [&](Where w) {
                load_batch(ra, w, 0);
                load_batch(rb, w, 1);
                sc = load_scales(w);
            };
            // after fill f: fill f + 1's loads, fill f + 2's row prefetched, fill f + 3's index
            auto next_fill = [&](int f) {
                row = row_of(tile_begin + f + 1, pg1);
                load_fill(row);
                prefetch_row(row_of(tile_begin + f + 2, pg2));
                pg1 = pg2;
                pg2 = f + 3 < n ? page_of(tile_begin + f + 3) : -1;
            };
            load_fill(row);
            prefetch_row(row_of(tile_begin + 1, pg1));
            produce(
                [&](int b, [[maybe_unused]] uint32_t u) {
                    if (half == 0) sValid[b * Tile + tok] = valid(row);
                    const unsigned char* src = src_of(row) + kRopeAt + 64 * half;
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        decode::cp_async16(sKV + b * kTileBytes + swizzled(Tile, tok, 8 * (kQkBlocks - 1) + 4 * half + j),
                                           src + 16 * j, valid(row));
                    store_batch(ra, b, 0, sc);
                    load_batch(ra, row, 2);
                    store_batch(rb, b, 1, sc);
                    if (batch3) load_batch(rb, row, 3);
                    store_batch(ra, b, 2, sc);
                    if (batch3) store_batch(rb, b, 3, sc);
                },
                next_fill);
            return;
        } else {
            // ---- P·V of O's right half (warpgroup 1, which also loads) or left half (2) ----
            constexpr int kHalf = kRole == 1 ? 1 : 0;
            const int ld_tok = t / kLdPerTok, ld_part = t % kLdPerTok;
            auto token_page = [&](int tile) { return token_page_of(tile, ld_tok); };
            auto token_row = [&](int tile, int page) { return token_row_of(tile, ld_tok, page); };
            // Dense tiles wholly inside the sequence load by TMA when the launch passed a tensor
            // map (boxes of box_rows tokens × 64 columns, each issued by the thread holding its
            // first token; an invalid page's box points past the cache's last row and fills
            // zeros); other tiles by cp.async with zero fill.
            const bool tma = !kSparse && p.kv_tma != 0;
            const int box_rows = min(Tile, bs);  // as the launcher encoded the map's box
            auto fill = [&](int tile, int page, int b) {
                const int64_t row = token_row(tile, page);
                if (ld_part == 0) sValid[b * Tile + ld_tok] = row >= 0;
                if (tma && (tile + 1) * Tile <= n_tokens) {
                    if (ld_part == 0 && (ld_tok & (box_rows - 1)) == 0) {
                        const int c1 = row >= 0 ? (int)row : p.num_pages * p.page_rows;
                        const uint32_t dst = kv_addr + b * kTileBytes + ld_tok * 128;
                        const uint64_t policy = l2_evict_first_policy();  // each row is read once
                        mbar_expect_tx(full(b), kBlocks * box_rows * 128);
#pragma unroll
                        for (int blk = 0; blk < kBlocks; ++blk)
                            tma_load_2d_hint(dst + blk * (Tile * 128), &p.kv_tmap, blk * 64, c1, full(b), policy);
                    }
                } else {
                    copy_token<Tile, kLdPerTok>(sKV + b * kTileBytes, ld_tok, ld_part, p, row);
                }
                mbar_arrive_cp_async(full(b));  // with the first tile, also covers Q's copies
                mbar_arrive(full(b));
            };
            uint32_t fills = uses;
            // fill f reuses the buffer of use f − 2: wait until both P·V warpgroups are done with it
            auto wait_free = [&](uint32_t f) {
                if (f >= 2) mbar_wait_sleep(empty(f & 1), ((f >> 1) - 1) & 1);
            };
            // One fill of tile `tile` into buffer b by warpgroup 1 (trio and trio_split)
            [[maybe_unused]] int page = -1;  // the next fill's page (the block-table load is issued a fill ahead)
            auto fill_mine = [&](int tile, int page, uint32_t f, bool first) {
                const int b = f & 1;
                wait_free(f);
                if (first) load_q<kSparse>(p, sQ, seq, row_base, row_limit, t, 128);
                fill(tile, page, b);
            };
            auto next_pages = [&](int tile) { page = token_page(tile); };
            if (!kLead && kRole == 1) {
                next_pages(tile_begin);
                for (int k = 0; k < 2 && k < n; ++k) {
                    fill_mine(tile_begin + k, page, fills, k == 0);
                    next_pages(tile_begin + k + 1);
                    ++fills;
                }
            }
            float o[128];
#pragma unroll
            for (int i = 0; i < 128; ++i) o[i] = 0.0f;
            for (int i = 0; i < n; ++i) {
                const uint32_t u = uses + i;
                const int b = u & 1;
                mbar_wait_sleep(p_full(b, 0), (u >> 1) & 1);  // P(u) (trio_split: its first half) and its factors are written
                rescale_o(o, sAlpha[b * kRows + r0], sAlpha[b * kRows + r0 + 8]);
                // landed before S(u): this is the acquire
                mbar_wait(full(b), (u >> 1) & 1);
                fence_proxy_async();
                if constexpr (kSplitP) {
                    // tokens 0..31 while the scorer writes the second half, then 32..63
                    issue_pv_half<Tile, 0, Tile / 32>(o, kv_addr + b * kTileBytes, kHalf);
                    mbar_wait(p_full(b, 1), (u >> 1) & 1);
                    fence_proxy_async();
                    issue_pv_half<Tile, Tile / 32, Tile / 16>(o, kv_addr + b * kTileBytes, kHalf);
                } else if constexpr (kLead) {
                    // P: the tile's rope block, or MODEL1's own buffer b
                    const uint32_t tile_addr = kv_addr + b * kTileBytes;
                    const uint32_t pa = kModel1 ? p_addr0 + b * kPBytes : tile_addr + (kQkBlocks - 1) * (Tile * 128);
                    issue_pv_half_at<Tile>(o, tile_addr, kHalf, pa);
                } else {
                    issue_pv_half<Tile>(o, kv_addr + b * kTileBytes, kHalf);
                }
                wgmma_wait0();
                fence_regs(o);
                mbar_arrive(empty(b));  // every thread: it read sAlpha, and its P·V is done
                if (!kLead && kRole == 1) {
                    if (i + 2 < n) {
                        fill_mine(tile_begin + i + 2, page, fills, false);
                        next_pages(tile_begin + i + 3);
                        ++fills;
                    }
                }
            }
            uses += n;
            __syncthreads();  // the scorer's sStats
            float2 stats[2];
            const int rs = decode_sm90::row_of(decode::thread_index());
#pragma unroll
            for (int k = 0; k < 2; ++k) stats[k] = sStats[rs + 8 * k];
            // one accessor type for both halves: write_rows' static NaN flags are per instantiation,
            // and the two halves must OR theirs in the same array. The rows go out through shared
            // memory that every reader is done with (the barrier above): the tile buffers (MODEL1:
            // P's buffers follow the tiles, so fp32 rows fit the stage too).
            decode::write_rows_staged<Stages * kTileBytes + own_p_bytes<Kv, Stages>(), kSparse>(
                p, pc.slot, seq, seq_rows, row_base, row_limit, r0, kHalf * 256 + 2 * t4, kHalf == 0 && t4 == 0,
                stats, OHalf{o}, sKV, tid - 128, 256);
        }
    };
    // 384 threads start at 168 registers each (64K / 384, in steps of 8), and the CTA's pool is
    // exactly that: the scorer gives back what the P·V warpgroups (O's 128 accumulators each)
    // take. BF16: 104 / 200 / 200 (at 136 / 184 the P·V warpgroups spilled 12-16 bytes in the staged
    // epilogue; with Q's rope block in the scorer's registers, 120 / 192 spilled 8 bytes in a P·V
    // warpgroup's piece set-up, and the scorer fits in 104). Each role runs its own piece loop, so
    // no code is shared between budgets.
    // Lead: the scorer holds O's left half beside S and P's fragments (216), the one P·V warpgroup
    // O's right half (176), the producer two raw batches of the next fill (the rest, 112).
    constexpr int kLaunchRegs = 65536 / 384 / 8 * 8;
    constexpr int kScorerRegs = kLead ? 216 : 104;
    constexpr int kPvRegs = kLead ? 176 : 200;
    constexpr int kPvGroups = kLead ? 1 : 2;
    constexpr int kProducerRegs = kLead ? 3 * kLaunchRegs - kScorerRegs - kPvGroups * kPvRegs : 0;
    static_assert(kScorerRegs + kPvGroups * kPvRegs + kProducerRegs <= 3 * kLaunchRegs,
                  "setmaxnreg must stay inside the CTA's pool");
    if (wg == 0) {
        if constexpr (kScorerRegs > kLaunchRegs) setmaxnreg_inc<kScorerRegs>();
        else setmaxnreg_dec<kScorerRegs>();
        decode::for_each_piece<kLead>(p, seqs, block_seq, [&](const decode::Piece pc) { piece(pc, RoleTag<0>{}); });
        return;
    }
    if constexpr (kLead) {
        if (wg == 2) {
            setmaxnreg_dec<kProducerRegs>();
            decode::for_each_piece<kLead>(p, seqs, block_seq, [&](const decode::Piece pc) { piece(pc, RoleTag<3>{}); });
            return;
        }
    }
    setmaxnreg_inc<kPvRegs>();
    if (kLead || wg == 1) {  // (lead's one P·V warpgroup: O's right half)
        decode::for_each_piece<kLead>(p, seqs, block_seq, [&](const decode::Piece pc) { piece(pc, RoleTag<1>{}); });
    } else {
        decode::for_each_piece<kLead>(p, seqs, block_seq, [&](const decode::Piece pc) { piece(pc, RoleTag<2>{}); });
    }
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_90a only: the launcher never picks this family elsewhere
#endif
}

// MODEL1's wgmma decode (kernels.toml's mla_decode_model1_sm90_lead; docs/contract.md §4 "MODEL1"):
// the lead schedule over DecodeKv::Model1. Dqk, Tile, Stages, Sched: the family's axes, which the
// launcher (src/ops/model1.rs) reads.
template <int Dqk, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ void mla_decode_model1_sm90(const DcpMlaDecodeParams& p) {
    static_assert(Dqk == decode_model1::kDim && Sched == Sm90Schedule::Lead, "MODEL1 runs lead at d_qk 512");
    mla_decode_sm90_trio<DecodeKv::Model1, Tile, Stages, Sched>(p);
}

}  // namespace dcp
