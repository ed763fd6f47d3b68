// MLA decode attention on one rank's shard (SPEC.md §4), on tensor cores with mma.sync
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
//          of |v|, inside SPEC §9's 2^-6·A_c; the row sums l stay fp32.
// Then O / l and lse = ln Σ exp(s) go to out/lse, or for a piece of a sequence spread over
// several parts to a slot of the fp32 workspace that `mla_decode_combine` merges (SPEC.md §5).
#pragma once
#include "common.cuh"

namespace dcp {

enum class DecodeKv { DenseBf16, SparseBf16, SparseFp8 };

namespace decode {

constexpr int kThreads = 256;
constexpr int kRows = 64;             // query rows per CTA
constexpr int kTile = 32;             // KV tokens per tile
constexpr int kPitch = kDimQk + 8;    // bf16 per smem row: +16 bytes keeps ldmatrix conflict-free
constexpr int kPPitch = kTile + 8;    // bf16 per row of P
constexpr int kChunks = kDimQk / 8;   // 16-byte chunks of a bf16 row (72)
constexpr int kFp8Chunks = kFp8RowBytes / 16;  // 41
constexpr float kLn2 = 0.6931471805599453f;

constexpr int kQBytes = kRows * kPitch * 2;
constexpr int kKTileBytes = kTile * kPitch * 2;
constexpr int kRawTileBytes = kTile * kFp8RowBytes;
constexpr int kPBytes = kRows * kPPitch * 2;  // P in bf16
constexpr int kMiscBytes = 2 * kRows * 4 /* max */ + 2 * kRows * 4 /* sum */ + 2 * kTile * 4 /* valid */;

// Dynamic shared memory of one CTA (kernels.toml `dynamic_shared` evaluates it for the registry).
template <DecodeKv Kv>
constexpr int shared_bytes() {
    return Kv == DecodeKv::SparseFp8 ? kQBytes + kKTileBytes + 2 * kRawTileBytes + kPBytes + kMiscBytes
                                     : kQBytes + 2 * kKTileBytes + kPBytes + kMiscBytes;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16-byte cp.async; `valid` false zero-fills the destination and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// d += a·b for one m16n8k16 tile, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// 8 e4m3 values × a power-of-two scale → 8 bf16 (exact: ≤ 4 significant bits each).
__device__ __forceinline__ uint4 dequant8(uint2 raw, float scale) {
    uint32_t w[2] = {raw.x, raw.y};
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> (16 * h)), __NV_E4M3);
            float2 f = __half22float2(*reinterpret_cast<__half2*>(&hr));
            out[2 * i + h] = pack_bf16(f.x * scale, f.y * scale);
        }
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

// write_rows' static shared flags, beside a kernel's dynamic shared memory.
constexpr int kWriteRowsStaticBytes = 2 * kRows * 4;

// The epilogue of both decode kernels: a thread's two rows (row0 and row0 + 8 of its 16-row
// group) of O / l and lse = (m + log2 l)·ln 2. Row r of the CTA is row row_base + r of its
// sequence: out row seq_row0 + row_base + r, or with slot >= 0 row row_base + r of workspace
// slot `slot` (rows_per_seq rows each). `o(n, e)` is the accumulator of column col0 + 8n + e
// (e = 0, 1) of row k = e >> 1 pairs: o(n, 2k) and o(n, 2k + 1). A row that saw nothing
// (l = 0) writes 0 and −inf. Every thread of the CTA calls it (it holds two CTA barriers); a
// row's 512 columns are the 4 threads of a quad (t4 = (col0 & 255) / 2) in each of the two
// column halves (col0 < 256 or not).
template <typename Acc>
__device__ __forceinline__ void write_rows(const DcpMlaDecodeParams& p, int slot, int64_t seq_row0, int rows_per_seq,
                                           int row_base, int row_limit, int row0, int col0, bool writes_lse,
                                           const float (&l)[2], const float (&m)[2], Acc o) {
    // SPEC §9: a NaN anywhere in a row's accumulators (a NaN in the v part of a token it read)
    // makes all of its out and its lse NaN, as a NaN score already does through l: else its lse
    // stays finite and the merge across ranks keeps the row. The quad's flags are OR-ed by
    // shuffles, the two halves' through shared memory (one writer per row and half).
    __shared__ int s_row_nan[2][kRows];
    const int half = col0 >= 256 ? 1 : 0;
    bool row_nan[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        bool f = false;
#pragma unroll
        for (int n = 0; n < 32; ++n) f |= isnan(o(n, 2 * k)) || isnan(o(n, 2 * k + 1));
        f |= __shfl_xor_sync(0xffffffffu, (int)f, 1) != 0;
        f |= __shfl_xor_sync(0xffffffffu, (int)f, 2) != 0;
        if ((col0 & 255) == 0) s_row_nan[half][row0 + 8 * k] = f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; ++k) row_nan[k] = (s_row_nan[0][row0 + 8 * k] | s_row_nan[1][row0 + 8 * k]) != 0;
    __syncthreads();  // the flags are read before a later piece's write_rows sets them again (write_rows_barriers)
    const bool to_ws = slot >= 0;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int r = row0 + 8 * k;
        if (r >= row_limit) continue;
        // l = 0: the row saw nothing (0 and −inf); a NaN l (a NaN score from q or a cache row it
        // read) or a NaN accumulator gives NaN out and lse, never the empty row's (SPEC §9)
        const bool empty = l[k] == 0.0f && !row_nan[k];
        const float inv = row_nan[k] ? __int_as_float(0x7fffffff) : empty ? 0.0f : 1.0f / l[k];
        const float lse = row_nan[k] ? __int_as_float(0x7fffffff) : empty ? -INFINITY : (m[k] + log2f(l[k])) * kLn2;
        const int64_t grow = to_ws ? (int64_t)slot * rows_per_seq + row_base + r : seq_row0 + row_base + r;
        if (writes_lse) ((float*)(to_ws ? p.ws_lse : p.lse))[grow] = lse;
        if (to_ws || p.out_f32) {
            float* dst = (float*)(to_ws ? p.ws_out : p.out) + grow * kDimLatent;
#pragma unroll
            for (int n = 0; n < 32; ++n)
                *(float2*)(dst + col0 + 8 * n) = make_float2(o(n, 2 * k) * inv, o(n, 2 * k + 1) * inv);
        } else {
            __nv_bfloat16* dst = (__nv_bfloat16*)p.out + grow * kDimLatent;
#pragma unroll
            for (int n = 0; n < 32; ++n)
                *(uint32_t*)(dst + col0 + 8 * n) = pack_bf16(o(n, 2 * k) * inv, o(n, 2 * k + 1) * inv);
        }
    }
}

// write_rows' CTA barriers, for a warpgroup of the CTA that holds no rows (the FP8 loader):
// exactly as many __syncthreads as write_rows has.
__device__ __forceinline__ void write_rows_barriers() {
    __syncthreads();
    __syncthreads();
}

// ---- split-KV schedule (issue 5; src/planner/schedule.rs is the host mirror and says why) ----
// Sequences: requests (dense: nq·heads rows each) or query rows of requests (sparse: heads rows).
__device__ __forceinline__ int num_seqs(const DcpMlaDecodeParams& p, bool sparse) {
    return sparse ? p.batch * p.nq : p.batch;
}
__device__ __forceinline__ int rows_per_seq(const DcpMlaDecodeParams& p, bool sparse) {
    return sparse ? p.heads : p.nq * p.heads;
}

// Dense: local length of row j (of nq) of request s, clamped to [0, max_pages·B].
__device__ __forceinline__ int dense_row_len(const DcpMlaDecodeParams& p, int s, int j) {
    const int64_t capacity = (int64_t)p.max_pages * p.block_size;
    return (int)min((int64_t)max(((const int32_t*)p.lens)[(int64_t)s * p.nq + j], 0), capacity);
}

// Tokens sequence s attends to at most: dense, the longest of its rows' clamped lengths; sparse,
// its clamped index count.
__device__ __forceinline__ int seq_tokens(const DcpMlaDecodeParams& p, bool sparse, int s) {
    if (sparse) {
        int n = p.topk;
        if (p.topk_len) n = max(0, min(n, ((const int32_t*)p.topk_len)[s]));
        return n;
    }
    int n = 0;
    for (int j = 0; j < p.nq; ++j) n = max(n, dense_row_len(p, s, j));
    return n;
}

// What a CTA's rows row_base.. (row_limit of them) of sequence `seq` attend to: returns the
// tokens of the longest of them (sparse: the sequence's index count) and sets row_len[k] for the
// thread's rows r0 and r0 + 8 (0 for a row past row_limit). Shared by both decode kernels.
template <bool Sparse>
__device__ __forceinline__ int piece_rows(const DcpMlaDecodeParams& p, int seq, int row_base, int row_limit, int r0,
                                          int (&row_len)[2]) {
    if constexpr (Sparse) {
        const int n = seq_tokens(p, true, seq);
#pragma unroll
        for (int k = 0; k < 2; ++k) row_len[k] = r0 + 8 * k < row_limit ? n : 0;
        return n;
    } else {
        const int H = p.heads;
        int n = 0;
        for (int j = row_base / H; j <= (row_base + row_limit - 1) / H; ++j) n = max(n, dense_row_len(p, seq, j));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int r = r0 + 8 * k;
            row_len[k] = r < row_limit ? dense_row_len(p, seq, (row_base + r) / H) : 0;
        }
        return n;
    }
}

// threadIdx.x, read by an instruction the compiler cannot move out of a loop.
__device__ __forceinline__ int thread_index() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}

// One sequence's share of this CTA: tiles [tile_begin, tile_end), written to workspace slot
// `slot`, or directly to out/lse when slot < 0.
struct Piece {
    int seq, tile_begin, tile_end, slot;
};

// A share of a split sequence with no tiles for this row block (a part holding only the
// sequence's fixed-cost unit, or tiles past this row block's rows): its partial has weight 0, so
// only lse = −inf is written (the combine then never reads its out) and Q is not loaded.
__device__ __forceinline__ bool skip_empty_share(const DcpMlaDecodeParams& p, const Piece& pc, int tile_begin,
                                                 int tile_end, int seq_rows, int row_base, int row_limit, int tid) {
    if (pc.slot < 0 || tile_begin < tile_end) return false;
    for (int r = tid; r < row_limit; r += blockDim.x)
        ((float*)p.ws_lse)[(int64_t)pc.slot * seq_rows + row_base + r] = -INFINITY;
    return true;
}

// Calls f(piece) for each piece of this CTA, in order. One part: the whole of `block_seq`. Else
// part blockIdx.z's units [z·W, (z + 1)·W) of the prefix that mla_decode_schedule wrote. Only the
// sequence index lives across f (the rest is re-read from the prefix), so the piece loop costs
// the decode body no registers.
struct PartRange {
    int64_t w, b, e;  // units per part, this part's [b, e)
};
__device__ __forceinline__ PartRange part_range(const DcpMlaDecodeParams& p, const int64_t* u, int seqs) {
    const int64_t total = u[seqs];
    const int64_t w = (total + p.num_splits - 1) / p.num_splits;
    const int64_t b = (int64_t)blockIdx.z * w;
    return PartRange{w, b, min(total, b + w)};
}

template <typename F>
__device__ __forceinline__ void for_each_piece(const DcpMlaDecodeParams& p, int seqs, int block_seq, F&& f) {
    if (p.num_splits <= 1) {
        f(Piece{block_seq, 0, INT_MAX, -1});
        return;
    }
    // launched as a dependent of the schedule kernel: wait for its prefix
    griddep_wait();
    const int64_t* u = (const int64_t*)p.sched;
    int s;
    {
        const PartRange r = part_range(p, u, seqs);
        if (r.b >= r.e) return;
        int lo = 0, hi = seqs;  // u[lo] <= b < u[hi]
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (u[mid] <= r.b) lo = mid;
            else hi = mid;
        }
        s = lo;
    }
    for (; s < seqs; ++s) {
        const PartRange r = part_range(p, u, seqs);
        const int64_t a = u[s], z = u[s + 1];
        if (a >= r.e) break;
        const int64_t first = a + 1;  // unit of tile 0; unit a is the sequence's fixed cost
        const int tb = (int)(max(r.b, first) - first);
        const int te = max(tb, (int)(min(r.e, z) - first));
        const bool split = a / r.w != (z - 1) / r.w;
        f(Piece{s, tb, te, split ? 2 * (int)blockIdx.z + (a > r.b ? 1 : 0) : -1});
    }
}

}  // namespace decode

// The schedule of a split launch: sched[s] = Σ_{s' < s} (1 + ceil(tokens(s') / sched_tile)), one
// CTA; each thread sums a run of consecutive sequences, then a block scan.
template <int Unused = 0>
__device__ __forceinline__ void mla_decode_schedule(const DcpMlaDecodeParams& p) {
    using namespace decode;
    const bool sparse = p.indices != 0;
    const int seqs = num_seqs(p, sparse), tile = p.sched_tile;
    const int per = (seqs + blockDim.x - 1) / blockDim.x;
    const int s0 = min(seqs, (int)threadIdx.x * per), s1 = min(seqs, s0 + per);
    // pass 1: each sequence's units into u[s] (read back by the same thread in pass 2)
    int64_t* u = (int64_t*)p.sched;
    int64_t own = 0;
    for (int s = s0; s < s1; ++s) {
        u[s] = 1 + (seq_tokens(p, sparse, s) + tile - 1) / tile;
        own += u[s];
    }
    // inclusive scan: within each warp, then over the warps' totals
    __shared__ int64_t warp_total[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int64_t incl = own;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int64_t v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
    }
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    int64_t before = 0, total = 0;
    for (int i = 0; i < warps; ++i) {
        if (i < warp) before += warp_total[i];
        total += warp_total[i];
    }
    int64_t acc = before + incl - own;
    for (int s = s0; s < s1; ++s) {  // pass 2: units → exclusive prefix
        const int64_t units = u[s];
        u[s] = acc;
        acc += units;
    }
    if (threadIdx.x == 0) u[seqs] = total;
}

template <DecodeKv Kv>
__device__ __forceinline__ void mla_decode(const DcpMlaDecodeParams& p) {
    using namespace decode;
    constexpr bool kSparse = Kv != DecodeKv::DenseBf16;
    constexpr bool kFp8 = Kv == DecodeKv::SparseFp8;

    {
        uint32_t dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        // less than the kernel needs is a host/kernel mismatch, a bug: fail the launch loudly
        if (dyn < (uint32_t)shared_bytes<Kv>()) __trap();
    }
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
        // (recomputed per piece from blockIdx and p rather than kept live: registers are tight)
        const int seq_rows = rows_per_seq(p, kSparse);
        // This CTA's rows: rows row_base + r (r < row_limit) of its sequence's rows.
        const int row_base = row_block() * kRows;
        const int row_limit = min(kRows, seq_rows - row_base);
        const int seq = pc.seq;
        const int64_t seq_row0 = (int64_t)seq * seq_rows;

        // Token range of the piece (dense: local positions; sparse: positions in the index list).
        int row_len[2];  // this thread's rows g and g+8
        const int n_tokens = piece_rows<kSparse>(p, seq, row_base, row_limit, rg * 16 + g, row_len);
        const int n_tiles = (n_tokens + kTile - 1) / kTile;
        const int tile_end = min(n_tiles, pc.tile_end);
        const int tile_begin = min(tile_end, pc.tile_begin);
        if (decode::skip_empty_share(p, pc, tile_begin, tile_end, seq_rows, row_base, row_limit, tid)) return;

        // ---- load: Q once; then a tile's tokens, 8 threads per token ----
        for (int c = tid; c < kRows * kChunks; c += kThreads) {
            const int r = c / kChunks, part = c % kChunks;
            const bool ok = r < row_limit;
            const __nv_bfloat16* src =
                (const __nv_bfloat16*)p.q + (ok ? (seq_row0 + row_base + r) * kDimQk + part * 8 : 0);
            cp_async16(sQ + r * kPitch + part * 8, src, ok);
        }
        const int ld_tok = tid >> 3, ld_part = tid & 7;
        auto issue_tile = [&](int tile, int stage) {
            const int pos = tile * kTile + ld_tok;
            int64_t row = -1;  // cache row (page·B + slot) of this thread's token, or -1: unread
            if (pos < n_tokens) {
                if constexpr (kSparse) {
                    const int v = ((const int32_t*)p.indices)[(int64_t)seq * p.topk + pos];
                    if (v >= 0 && (int64_t)v < (int64_t)p.num_pages * p.block_size) row = v;
                } else {
                    const int page =
                        ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + pos / p.block_size];
                    if (page >= 0 && page < p.num_pages) row = (int64_t)page * p.block_size + pos % p.block_size;
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
        if (tile_begin < tile_end) issue_tile(tile_begin, 0);
        cp_async_commit();

        const float scale_log2 = p.scale_log2;
        float o[32][4];
#pragma unroll
        for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

        for (int tile = tile_begin; tile < tile_end; ++tile) {
            const int stage = (tile - tile_begin) & 1;
            const bool has_next = tile + 1 < tile_end;
            if (has_next) issue_tile(tile + 1, stage ^ 1);
            cp_async_commit();
            if (has_next) cp_async_wait<1>(); else cp_async_wait<0>();
            __syncthreads();
            const __nv_bfloat16* kv = sK + (kFp8 ? 0 : stage * (kTile * kPitch));
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
            }

            // ---- score: S[16 rows, 16 tokens] = Q·Kᵀ ----
            float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            {
                const __nv_bfloat16* qa = sQ + (rg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kPitch + 8 * (lane >> 4);
                const __nv_bfloat16* kb = kv + (half * 16 + (lane & 7) + 8 * (lane >> 4)) * kPitch + 8 * ((lane >> 3) & 1);
#pragma unroll 4
                for (int k0 = 0; k0 < kDimQk; k0 += 16) {
                    uint32_t a[4], b[4];
                    ldmatrix_x4(a, qa + k0);
                    ldmatrix_x4(b, kb + k0);
                    mma_bf16(s[0], a, b[0], b[1]);
                    mma_bf16(s[1], a, b[2], b[3]);
                }
            }

            // ---- softmax: mask before the max, exchange row maxima with the partner warp ----
            const int* valid = sValid + stage * kTile;
            float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = half * 16 + n * 8 + 2 * t4 + (e & 1);
                    const int pos = tile * kTile + col;
                    const bool ok = valid[col] && pos < row_len[e >> 1];
                    s[n][e] = ok ? s[n][e] * scale_log2 : -INFINITY;  // select: a NaN score never survives
                    tmax[e >> 1] = fmaxf(tmax[e >> 1], s[n][e]);
                }
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 1));
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 2));
                if (t4 == 0) sMax[half * kRows + rg * 16 + g + 8 * k] = tmax[k];
            }
            __syncthreads();
            float alpha[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int r = rg * 16 + g + 8 * k;
                const float m_new = fmaxf(m_run[k], fmaxf(sMax[r], sMax[kRows + r]));
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: p = 0, no NaN
                alpha[k] = exp2f(m_run[k] - m_use);
                m_run[k] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        s[n][2 * k + e] = exp2f(s[n][2 * k + e] - m_use);
                        sum += s[n][2 * k + e];
                    }
                l_run[k] = l_run[k] * alpha[k] + sum;
            }
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int col = half * 16 + n * 8 + 2 * t4;
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    const int off = (rg * 16 + g + 8 * k) * kPPitch + col;
                    *(uint32_t*)(sP + off) = pack_bf16(s[n][2 * k], s[n][2 * k + 1]);
                }
            }
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                o[n][2] *= alpha[1];
                o[n][3] *= alpha[1];
            }
            __syncthreads();

            // ---- accumulate: O[16 rows, 256 cols] += P[16, 32]·V[32, 256] ----
#pragma unroll
            for (int k0 = 0; k0 < kTile; k0 += 16) {
                uint32_t a[4];
                const int p_off = (rg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kPPitch + k0 + 8 * (lane >> 4);
                ldmatrix_x4(a, sP + p_off);
                const __nv_bfloat16* vb =
                    kv + (k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kPitch + half * 256 + 8 * (lane >> 4);
#pragma unroll
                for (int n = 0; n < 16; ++n) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, vb + 16 * n);
                    mma_bf16(o[2 * n], a, b[0], b[1]);
                    mma_bf16(o[2 * n + 1], a, b[2], b[3]);
                }
            }
            __syncthreads();
        }
        cp_async_wait<0>();

        // ---- write: O / l and lse = (m + log2 l)·ln 2; a row that saw nothing: 0 and −inf ----
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], 1);
            l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], 2);
            if (t4 == 0) sSum[half * kRows + rg * 16 + g + 8 * k] = l_run[k];
        }
        __syncthreads();
        float l_row[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int r = rg * 16 + g + 8 * k;
            l_row[k] = sSum[r] + sSum[kRows + r];
        }
        write_rows(p, pc.slot, seq_row0, seq_rows, row_base, row_limit, rg * 16 + g, half * 256 + 2 * t4,
                   half == 0 && t4 == 0, l_row, m_run, [&](int n, int e) { return o[n][e]; });
    });
}

// Sum (or max) of v over the CTA's threads (blockDim.x a multiple of 32, at most 1024).
template <bool Max>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, d);
        v = Max ? fmaxf(v, o) : v + o;
    }
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = Max ? -INFINITY : 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) r = Max ? fmaxf(r, scratch[i]) : r + scratch[i];
    __syncthreads();  // scratch reusable
    return r;
}

// Merges the partials of each row of a sequence spread over several parts (SPEC.md §5 with
// natural-log lse): one CTA of 128 threads per row, 4 output values per thread; the rows of a
// sequence inside one part were written by the decode kernel and are left alone. The slots are
// the parts fp..lp holding the sequence: slot 2q, except 2fp + 1 where the sequence starts
// after part fp's first unit (see decode::for_each_piece). A small batch spreads a sequence over
// up to num_splits parts, so the lse are read and weighted by all threads at once, and the
// partial rows are read four slots at a time (independent loads in flight, not a chain of
// dependent round trips). A partial with weight 0 (lse −inf, NaN or +inf) is never read.
template <int Unused = 0>
__device__ __forceinline__ void mla_decode_combine(const DcpMlaDecodeCombineParams& p) {
    __shared__ float s_weight[1024];  // per slot: lse, then its weight (num_splits <= 1024)
    __shared__ float s_red[32];
    __shared__ int s_nan;  // a piece's lse is NaN: the merged row is NaN (SPEC §5)
    if (threadIdx.x == 0) s_nan = 0;
    __syncthreads();
    griddep_wait();  // launched as a dependent of the decode kernel: its partials and rows
    const int64_t row = blockIdx.x;
    const int seq = (int)(row / p.rows_per_seq), r = (int)(row % p.rows_per_seq);
    if (seq >= p.seqs) return;
    const int64_t* u = (const int64_t*)p.sched;
    const int64_t total = u[p.seqs];
    const int64_t w = (total + p.num_splits - 1) / p.num_splits;
    const int64_t a = u[seq], fp = a / w, lp = (u[seq + 1] - 1) / w;
    if (fp == lp) return;
    auto slot_row = [&](int64_t q) { return (2 * q + (q == fp && a > fp * w ? 1 : 0)) * p.rows_per_seq + r; };
    const int n = (int)(lp - fp + 1);
    const float* lse = (const float*)p.ws_lse;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = merge_lse(lse[slot_row(fp + i)]);
        s_weight[i] = v;
        mx = fmaxf(mx, v);
        if (isnan(v)) atomicOr(&s_nan, 1);
    }
    const float m = block_reduce<true>(mx, s_red);  // its barriers also publish s_weight and s_nan
    if (s_nan) {
        if (threadIdx.x == 0) ((float*)p.lse)[row] = NAN;
        const int d = 4 * threadIdx.x;
        if (p.out_f32) {
            *(float4*)((float*)p.out + row * kDimLatent + d) = make_float4(NAN, NAN, NAN, NAN);
        } else {
            uint2 v = make_uint2(decode::pack_bf16(NAN, NAN), decode::pack_bf16(NAN, NAN));
            *(uint2*)((__nv_bfloat16*)p.out + row * kDimLatent + d) = v;
        }
        return;
    }
    float part = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = m == -INFINITY ? 0.0f : expf(s_weight[i] - m);
        s_weight[i] = e;
        part += e;
    }
    const float sum = block_reduce<false>(part, s_red);
    const int d = 4 * threadIdx.x;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (sum > 0.0f) {
        const float inv = 1.0f / sum;
        for (int i0 = 0; i0 < n; i0 += 4) {
            float4 x[4];
            float wt[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                wt[j] = i0 + j < n ? s_weight[i0 + j] * inv : 0.0f;
                x[j] = wt[j] != 0.0f ? *(const float4*)((const float*)p.ws_out + slot_row(fp + i0 + j) * kDimLatent + d)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc.x += wt[j] * x[j].x;
                acc.y += wt[j] * x[j].y;
                acc.z += wt[j] * x[j].z;
                acc.w += wt[j] * x[j].w;
            }
        }
    }
    if (threadIdx.x == 0) ((float*)p.lse)[row] = sum > 0.0f ? m + logf(sum) : -INFINITY;
    if (p.out_f32) {
        *(float4*)((float*)p.out + row * kDimLatent + d) = acc;
    } else {
        uint2 v = make_uint2(decode::pack_bf16(acc.x, acc.y), decode::pack_bf16(acc.z, acc.w));
        *(uint2*)((__nv_bfloat16*)p.out + row * kDimLatent + d) = v;
    }
}

}  // namespace dcp
