// What the Hopper decode schedules share: the schedule names, the CTA's constants and shared
// memory layout (shared_bytes, which the registry records), the swizzled tile addressing, Q's
// and a token's loads, the online softmax's halves, the O rescale and the P·V halves.
// The kernels (decode/sm90_trio.cuh; sm_90a wgmma) keep decode/sm80.cuh's contract, CTA shape and
// split-KV pieces, so the launcher only swaps the kernel, shared size and tile. Layout: Q (64 ×
// 576) and each KV tile (Tile tokens × 576) sit in shared memory as 9 column blocks of 64 dims
// (MODEL1: 512 values, 8 blocks, and P's own buffers after the tiles: own_p_bytes); in
// a block a token's 64 dims are one 128-byte row whose 16-byte chunks are XOR-swizzled by (row
// mod 8), the 128B-swizzle atom of wgmma. The same tile is K-major for S = Q·Kᵀ and MN-major
// (transposed B) for O += P·V, so V is never copied again.
#pragma once
#include "arch/sm80_ptx.cuh"
#include "arch/sm90_ptx.cuh"
#include "decode/base.cuh"
#include "decode/model1_format.cuh"
#include "decode/split_schedule.cuh"

namespace dcp {

// Schedules of the wgmma kernel (the `schedule` axis of kernels.toml; the plain, roles and
// seesaw schedules of two warpgroups measured slower and were removed, CHANGELOG.md):
// Trio: three warpgroups (its own family, 384 threads): one scores (S, softmax, P), two hold O's
//   halves and do P·V, so scoring tile i + 1 runs beside P·V of tile i (decode/sm90_trio.cuh).
// TrioSplit: trio handing P over in two halves of tokens (BF16 rows of two or more row blocks).
// Lead: a producer warpgroup that fills every tile (sparse FP8 and MODEL1; FlashMLA's split): the
//   scorer also multiplies O's left half by its own P from registers, one P·V warpgroup the right
//   half from P in shared memory (384 threads, in trio's family). (Pair, sparse FP8 trio sharing
//   each tile's dequantisation across a two-CTA cluster, quad, the producer beside trio's two P·V
//   warpgroups, and quad_pair were removed once no shape ran them: docs/design.md.)
// (A fourth, P·V left in flight across the next tile's barrier, was never faster: ptxas serialised
// its wgmma, C7514. codegen now rejects a hot kernel whose wgmma ptxas serialises.)
enum class Sm90Schedule { Trio, TrioSplit, Lead };

namespace decode_sm90 {
using namespace ptx_sm90;  // the PTX wrappers (arch/sm90_ptx.cuh) as decode_sm90::...
using decode::row_max4;
using decode::row_total;

constexpr int kRows = 64;
constexpr int kBlocks = kDimQk / 64;  // 9 column blocks of 64 dims
constexpr int kChunks = kDimQk / 8;   // 72 16-byte chunks per row

// Dynamic shared memory (kernels.toml `dynamic_shared` evaluates it for the registry). The extra
// 1024 bytes let the kernel align its buffers to the 1024-byte swizzle period; a token's validity
// flag has a slot per ring buffer.
// Beside Q and the tiles (P itself goes to the tile's rope block): a slot of the rows' rescale
// factors per buffer, their final (l, m), and the mbarriers: full and empty per buffer and P's
// hand-over per buffer (6); trio_split: a second P hand-over per buffer (P goes over in two halves
// of tokens); lead: one for Q (the scorer's own copies).
template <Sm90Schedule Sched>
constexpr int sync_extra_bytes() {
    constexpr int bars = 6 + (Sched == Sm90Schedule::TrioSplit ? 2 : 0) + (Sched == Sm90Schedule::Lead ? 1 : 0);
    return 2 * kRows * 4 + kRows * 8 + bars * 8;
}

// A query row's and a tile token's values: 576 (latent and rope), MODEL1's 512 (nope and rope).
template <DecodeKv Kv>
constexpr int dim_qk() {
    return Kv == DecodeKv::Model1 ? decode_model1::kDim : kDimQk;
}

// P's own buffers, [64 rows × 64 tokens] bf16 a ring buffer (one column block of Q's layout):
// MODEL1's V is the whole token, rope included, so P cannot sit in the tile's rope block.
template <DecodeKv Kv, int Stages>
constexpr int own_p_bytes() {
    return Kv == DecodeKv::Model1 ? Stages * kRows * 64 * 2 : 0;
}

template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
constexpr int shared_bytes() {
    return 1024 + kRows * dim_qk<Kv>() * 2 + Stages * Tile * dim_qk<Kv>() * 2 + own_p_bytes<Kv, Stages>() +
           Stages * Tile * 4 + sync_extra_bytes<Sched>();
}

// Byte offset of 16-byte chunk c (0..71) of row r in a [rows × 576] bf16 buffer of 9 blocks.
__device__ __forceinline__ uint32_t swizzled(int rows, int r, int c) {
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The CTA's dynamic shared memory, aligned to the 1024-byte swizzle period. A launch with less
// than the variant needs (shared_bytes) is a host/kernel mismatch, a bug: trap, so the launch
// fails loudly instead of leaving the outputs unwritten.
template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ unsigned char* aligned_smem() {
    decode::require_dynamic_smem(shared_bytes<Kv, Tile, Stages, Sched>());
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw_addr = decode::smem_addr(smem_raw);
    return smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
}

// A thread's first row in a warpgroup's 64-row accumulator (wgmma layout: warp w of the group
// holds rows 16w.., lane l rows l / 4 and l / 4 + 8).
__device__ __forceinline__ int row_of(int tid) { return ((tid >> 5) & 3) * 16 + ((tid & 31) >> 2); }

// The online softmax's second half for two adjacent raw scores of a row: p = 2^(s·σ' − m_use)
// (σ' = σ·log2 e; one FFMA and the SFU's exp2), added in fp32 to the row's running sum l, and
// returned as the packed bf16 pair P·V multiplies (one rounding: docs/contract.md §9's
// 2^-8·A_c). A masked score is −inf and gives p = 0.
__device__ __forceinline__ uint32_t p_bf16(float s0, float s1, float scale_log2, float m_use, float& l) {
    const float p0 = decode::exp2_sfu(fmaf(s0, scale_log2, -m_use)), p1 = decode::exp2_sfu(fmaf(s1, scale_log2, -m_use));
    l += p0 + p1;
    return decode::pack_bf16(p0, p1);
}

// P(i) as the K-major 128B-swizzled A operand of P·V, [64 rows × 64 tokens] bf16 at base (the
// layout of one column block of Q): k16 block kk.
__device__ __forceinline__ uint64_t p_desc(uint32_t base, int kk) { return make_desc(base + kk * 32, 16, 1024); }

// O[64 × 256] += P·V over the 64-token tile at tile_addr, V = its dims 256·half.. (MN-major), P
// from shared memory at p_addr (the tile's rope block, which only S reads, or MODEL1's own buffer);
// issued and committed, not waited for.
// K0..K1: only k16 blocks [K0, K1) of the tile's tokens (trio hands P over in two halves).
template <int Tile, int K0 = 0, int K1 = Tile / 16>
__device__ __forceinline__ void issue_pv_half_at(float (&o)[128], uint32_t tile_addr, int half, uint32_t p_addr) {
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = K0; kk < K1; ++kk) {
        const uint64_t dv = make_desc(tile_addr + 4 * half * (Tile * 128) + kk * 16 * 128, Tile * 128, 1024);
        wgmma_ss_n256(o, p_desc(p_addr, kk), dv);
    }
    wgmma_commit();
}

// issue_pv_half_at with P in the tile's rope block (the 576 path's trio and trio_split).
template <int Tile, int K0 = 0, int K1 = Tile / 16>
__device__ __forceinline__ void issue_pv_half(float (&o)[128], uint32_t tile_addr, int half) {
    issue_pv_half_at<Tile, K0, K1>(o, tile_addr, half, tile_addr + (kBlocks - 1) * (Tile * 128));
}

// Whether a tile is clean for the warp: every token flagged and inside both rows of every lane
// (softmax_max_known's fast path). Reads only the tile's flags, so a schedule may ask while S runs.
template <int kSRegs, int Tile>
__device__ __forceinline__ bool tile_clean(const int* valid, int tile, const int (&row_len)[2], int t4) {
    bool clean = (tile + 1) * Tile <= min(row_len[0], row_len[1]);
#pragma unroll
    for (int j = 0; j < kSRegs / 4; ++j) {
        const int2 f = *(const int2*)(valid + 8 * j + 2 * t4);
        clean = clean && f.x != 0 && f.y != 0;
    }
    return __all_sync(0xffffffffu, clean);
}

// The max of N of a thread's scores of row K (0: r0, 1: r0 + 8), from the row's J-th on (its
// scores are s[4j + 2K], s[4j + 2K + 1]), as a tree of fmaxf: log2 N dependent steps. Recursion,
// not an array: an array indexed in unrolled loops was left in local memory.
template <int kSRegs, int K, int J, int N>
__device__ __forceinline__ float row_max_tree(const float (&s)[kSRegs]) {
    if constexpr (N == 1) return s[4 * (J >> 1) + 2 * K + (J & 1)];
    else return fmaxf(row_max_tree<kSRegs, K, J, N / 2>(s), row_max_tree<kSRegs, K, J + N / 2, N / 2>(s));
}

// The online softmax's first half (the scorer's of every schedule): masks a tile's
// raw scores (a token counts when its flag is set and it lies inside the row; a select, so a
// masked token's NaN score never survives, while a counted one's makes its row NaN) and moves the
// thread's two rows' running max m_run (log2 units): alpha is the factor the rows' earlier sums
// shrink by, m_use the max this tile's p are taken against (0
// while a row has seen nothing, so p = 0 and no NaN). The scores stay unscaled: the max is taken
// on them and scaled once (σ > 0 keeps the order, and rounding is monotonic, so this is the max
// of the scaled scores exactly); p_bf16 scales each in its FFMA. A tile whose every token is
// flagged and inside both rows of every lane of the warp (all but a row's last tile, when no page
// is invalid) skips the per-score select: the caller passes the tile's cleanness (tile_clean, or
// false to mask every score). Rows r0, r0 + 8 of the warp's 16, columns 8j + 2t4 (+1). kTreeMax:
// each row's max as a tree over the thread's scores (4 dependent steps, not 16; BF16 trio only:
// FP8's trio family measured 1-4% slower with it and the early flags, NOTES.md at 628d1db), else a chain.
template <int kSRegs, int Tile, bool kTreeMax>
__device__ __forceinline__ void softmax_max_known(float (&s)[kSRegs], bool clean, const int* valid, int tile,
                                                  const int (&row_len)[2], int t4, float scale_log2, float (&m_run)[2],
                                                  float (&l_run)[2], float (&alpha)[2], float (&m_use)[2]) {
    if (!clean) {
#pragma unroll
        for (int e = 0; e < kSRegs; ++e) {
            const int col = 8 * (e >> 2) + 2 * t4 + (e & 1);
            const int k = (e >> 1) & 1;
            const bool ok = valid[col] && tile * Tile + col < row_len[k];
            s[e] = ok ? s[e] : -INFINITY;
        }
    }
    float tmax[2];
    if constexpr (!kTreeMax) {
        tmax[0] = tmax[1] = -INFINITY;
#pragma unroll
        for (int e = 0; e < kSRegs; ++e) tmax[(e >> 1) & 1] = fmaxf(tmax[(e >> 1) & 1], s[e]);
    } else {
        tmax[0] = row_max_tree<kSRegs, 0, 0, kSRegs / 2>(s);
        tmax[1] = row_max_tree<kSRegs, 1, 0, kSRegs / 2>(s);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        tmax[k] = row_max4(tmax[k]);
        const float m_new = fmaxf(m_run[k], tmax[k] * scale_log2);
        m_use[k] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[k] = decode::exp2_sfu(m_run[k] - m_use[k]);
        m_run[k] = m_new;
        l_run[k] *= alpha[k];
    }
}

// Lazy max (trio's scorer): how far (log2 units) a clean tile's row max may pass the row's running
// max and the tile still take its p against the running max: p ≤ 2^8, far inside bf16 and fp32.
constexpr float kLazyMaxSlack = 8.0f;

// Whether every row of the warp may keep the p it took against its running max m_run on this
// clean tile: the tile's max (raw scores, scaled once: σ > 0) passes no row's m_run by more than
// kLazyMaxSlack. It reads only s, so the scorer issues its exps first and this max runs beside
// them instead of before them. A row of NaN scores fails the test (and takes the exact path,
// which keeps the NaN).
template <int kSRegs>
__device__ __forceinline__ bool lazy_max_holds(const float (&s)[kSRegs], float scale_log2, const float (&m_run)[2]) {
    float tmax[2] = {row_max_tree<kSRegs, 0, 0, kSRegs / 2>(s), row_max_tree<kSRegs, 1, 0, kSRegs / 2>(s)};
    bool ok = true;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        tmax[k] = row_max4(tmax[k]);
        ok = ok && tmax[k] * scale_log2 <= m_run[k] + kLazyMaxSlack;
    }
    return __all_sync(0xffffffffu, ok);
}

// O ·= alpha per row (rows r0 and r0 + 8 of the thread's 128 accumulators). Once a row's running
// max settles (most tiles of a long row), alpha = 1: a warp whose 16 rows all keep their max
// skips the 128 multiplications.
__device__ __forceinline__ void rescale_o(float (&o)[128], float alpha0, float alpha1) {
    if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            o[4 * n + 0] *= alpha0;
            o[4 * n + 1] *= alpha0;
            o[4 * n + 2] *= alpha1;
            o[4 * n + 3] *= alpha1;
        }
    }
}

// Q's 64 rows (rows row_base.. of sequence `seq`, row_limit of them; the rest zero-filled) into
// sQ, swizzled, by `threads` threads of which this is number `t`.
// Chunks: 16-byte chunks a row (72; MODEL1's 64).
template <bool Sparse, int Chunks = kChunks>
__device__ __forceinline__ void load_q(const DcpMlaDecodeParams& p, unsigned char* sQ, int seq, int row_base,
                                       int row_limit, int t, int threads) {
    decode::load_q_rows<Sparse, Chunks>(p, seq, row_base, row_limit, t, threads,
                                        [&](int r, int part) { return sQ + swizzled(kRows, r, part); });
}

// Part `part` (of Parts) of cache row `row` (-1: zero-filled) as token `tok` of a swizzled
// [Tile × 576] tile: chunks part, part + Parts, ...
template <int Tile, int Parts>
__device__ __forceinline__ void copy_token(unsigned char* tile, int tok, int part, const DcpMlaDecodeParams& p,
                                           int64_t row) {
    const __nv_bfloat16* src = (const __nv_bfloat16*)p.cache + (row >= 0 ? row * kDimQk : 0);
#pragma unroll
    for (int k = 0; k < kChunks / Parts; ++k) {
        const int c = part + Parts * k;
        decode::cp_async16(tile + swizzled(Tile, tok, c), src + 8 * c, row >= 0);
    }
}

// This CTA's rows: rows base.. (limit of them) of sequence `seq` when the launch has one part
// (with several, for_each_piece picks the sequences). Sparse CTAs of one part hold a (query
// row, head block) pair in blockIdx.x, as in decode/sm80.cuh.
struct CtaRows {
    int seq, base, limit;
};
template <bool Sparse>
__device__ __forceinline__ CtaRows cta_rows(const DcpMlaDecodeParams& p, int seq_rows) {
    const int H = p.heads, nq = p.nq;
    const int hblocks = (H + kRows - 1) / kRows;
    const int bx = decode::block_index_x();
    const int rb = Sparse && p.num_splits <= 1 ? bx % hblocks : bx;
    const int seq = Sparse ? blockIdx.y * nq + bx / hblocks : blockIdx.y;
    return CtaRows{seq, rb * kRows, min(kRows, seq_rows - rb * kRows)};
}
#endif

}  // namespace decode_sm90
}  // namespace dcp
