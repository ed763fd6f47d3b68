// What every decode kernel shares (docs/contract.md §4, §9): the KV kinds, the CTA shape's constants,
// bf16 packing and FP8 dequantisation, and the epilogue that writes a CTA's rows (O / l and the
// natural-log lse, with docs/contract.md §9's NaN rule) to the output or to a split-KV workspace slot.
#pragma once
#include "arch/sm80_ptx.cuh"
#include "common.cuh"

namespace dcp {

// Model1: MODEL1's sparse page-wise FP8 cache (decode/model1_format.cuh), d_qk = d_v = 512; only the
// lead schedule runs it (kernels.toml's mla_decode_model1_sm90_lead; the mma.sync path has its own family).
enum class DecodeKv { DenseBf16, SparseBf16, SparseFp8, Model1 };

namespace decode {
using namespace ptx_sm80;  // the PTX wrappers (arch/sm80_ptx.cuh) as decode::...

constexpr int kThreads = 256;
constexpr int kRows = 64;             // query rows per CTA
constexpr int kTile = 32;             // KV tokens per tile
constexpr int kPitch = kDimQk + 8;    // bf16 per smem row: +16 bytes keeps ldmatrix conflict-free
constexpr int kPPitch = kTile + 8;    // bf16 per row of P
constexpr int kChunks = kDimQk / 8;   // 16-byte chunks of a bf16 row (72)
constexpr int kFp8Chunks = kFp8RowBytes / 16;  // 41
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

constexpr int kQBytes = kRows * kPitch * 2;
constexpr int kKTileBytes = kTile * kPitch * 2;
constexpr int kRawTileBytes = kTile * kFp8RowBytes;
constexpr int kPBytes = kRows * kPPitch * 2;  // P in bf16
constexpr int kMiscBytes = 2 * kRows * 4 /* max */ + 2 * kRows * 4 /* sum */ + 2 * kTile * 4 /* valid */;

// threadIdx.x, read by an instruction the compiler cannot move out of a loop.
DCP_SPECIAL_REGISTER(thread_index, int, "tid.x")
// blockIdx.x as a fresh read, for the same reason: a row block worked out from it at a piece's
// start is not hoisted out of the piece loop (and across setmaxnreg) by the compiler.
DCP_SPECIAL_REGISTER(block_index_x, int, "ctaid.x")

// The max and the sum of a row's value over the 4 lanes (t4) of an mma / wgmma fragment that hold
// its columns.
__device__ __forceinline__ float row_max4(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float row_total(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// Traps unless the launch gave at least `need` bytes of dynamic shared memory: less is a
// host/kernel mismatch, a bug, and the launch fails loudly instead of leaving outputs unwritten.
__device__ __forceinline__ void require_dynamic_smem(uint32_t need) {
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < need) __trap();
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// 2^x by the SFU alone (ex2.approx.ftz): exp2f adds a guard around it that keeps results below
// 2^-126, which a softmax weight never needs (P is bf16 and the row sums fp32: a weight at 2^-126
// of the row's max changes neither). 2^-inf = 0, 2^NaN = NaN.
__device__ __forceinline__ float exp2_sfu(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
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

// The NaN flags of a thread's two rows (write_rows' first CTA barrier): docs/contract.md §9: a NaN
// anywhere in a row's accumulators (a NaN in the v part of a token it read) makes all of its out
// and its lse NaN, as a NaN score already does through l: else its lse stays finite and the merge
// across ranks keeps the row. The quad's flags are OR-ed by shuffles, the two halves' through
// shared memory (one writer per row and half).
template <typename Acc>
__device__ __forceinline__ void rows_nan(int row0, int col0, Acc o, bool (&row_nan)[2]) {
    __shared__ int s_row_nan[2][kRows];
    const int half = col0 >= 256 ? 1 : 0;
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
}

// Views of [batch, nq, heads, ..] (docs/contract.md §4: q, out and lse may be views with any
// strides sb, ss, sh in elements, rows contiguous): where sequence `seq`'s rows start. A dense
// sequence is request seq, its rows [nq, heads]; a sparse one is query row seq mod nq of request
// seq div nq, its rows its heads. Computed once a piece where it can be (the division by nq),
// then view_row_offset per row.
__device__ __forceinline__ int64_t view_seq_offset(bool sparse, int nq, int seq, int64_t sb, int64_t ss) {
    if (!sparse) return seq * sb;
    const int b = seq / nq;
    return b * sb + (seq - b * nq) * ss;
}

// Row `row_in_seq` of a sequence, from the sequence's start: a head, or for dense MTP rows a
// (query row, head) pair (one division; none with one query row).
__device__ __forceinline__ int64_t view_row_offset(bool sparse, int nq, int heads, int row_in_seq, int64_t ss,
                                                   int64_t sh) {
    if (sparse || nq == 1) return row_in_seq * sh;
    const int s = row_in_seq / heads;
    return s * ss + (row_in_seq - s * heads) * sh;
}

template <bool Sparse>
__device__ __forceinline__ int64_t q_seq_offset(const DcpMlaDecodeParams& p, int seq) {
    return view_seq_offset(Sparse, p.nq, seq, p.q_stride_b, p.q_stride_s);
}
template <bool Sparse>
__device__ __forceinline__ int64_t q_row_offset(const DcpMlaDecodeParams& p, int row_in_seq) {
    return view_row_offset(Sparse, p.nq, p.heads, row_in_seq, p.q_stride_s, p.q_stride_h);
}

// Q's 64 rows (rows row_base.. of sequence `seq`, row_limit of them; the rest zero-filled) by
// cp.async, thread t of `threads`: 16-byte chunk `part` (of Chunks a row) of row r goes to
// dst(r, part). The caller commits.
template <bool Sparse, int Chunks, typename Dst>
__device__ __forceinline__ void load_q_rows(const DcpMlaDecodeParams& p, int seq, int row_base, int row_limit, int t,
                                            int threads, Dst&& dst) {
    const __nv_bfloat16* q = (const __nv_bfloat16*)p.q + q_seq_offset<Sparse>(p, seq);
    for (int c = t; c < kRows * Chunks; c += threads) {
        const int r = c / Chunks, part = c % Chunks;
        const bool ok = r < row_limit;
        const __nv_bfloat16* src = ok ? q + q_row_offset<Sparse>(p, row_base + r) + part * 8 : (const __nv_bfloat16*)p.q;
        cp_async16(dst(r, part), src, ok);
    }
}

// Where row `row_in_seq` of sequence `seq` is in out and in lse (elements).
template <bool Sparse>
__device__ __forceinline__ int64_t out_row_offset(const DcpMlaDecodeParams& p, int seq, int row_in_seq) {
    return view_seq_offset(Sparse, p.nq, seq, p.out_stride_b, p.out_stride_s) +
           view_row_offset(Sparse, p.nq, p.heads, row_in_seq, p.out_stride_s, p.out_stride_h);
}
template <bool Sparse>
__device__ __forceinline__ int64_t lse_row_offset(const DcpMlaDecodeParams& p, int seq, int row_in_seq) {
    return view_seq_offset(Sparse, p.nq, seq, p.lse_stride_b, p.lse_stride_s) +
           view_row_offset(Sparse, p.nq, p.heads, row_in_seq, p.lse_stride_s, p.lse_stride_h);
}

// The index list of sparse sequence `seq` (query row seq mod nq of request seq div nq).
__device__ __forceinline__ const int32_t* index_list(const DcpMlaDecodeParams& p, int seq) {
    const int b = seq / p.nq;
    return (const int32_t*)p.indices + b * p.indices_stride_b + (seq - b * p.nq) * p.indices_stride_s;
}

// The cache row of sparse index `v` (page·B + slot, already checked to lie in [0, num_pages·B)):
// page·page_rows + slot, which is v itself when the pages are packed (page_rows = B). Pages a
// stride apart split v by a division by the invariant B: a 32×32→64-bit multiply by the magic
// number the launcher computed and a shift (exact for v < 2^31, any B), no hardware divide.
__device__ __forceinline__ int64_t sparse_cache_row(const DcpMlaDecodeParams& p, int v) {
    if (p.page_rows == p.block_size) return v;
    const int page = (int)(((uint64_t)(uint32_t)v * p.page_div_magic) >> p.page_div_shift);
    return (int64_t)page * p.page_rows + (v - page * p.block_size);
}

// A finished row's denominator and lse, as write_rows takes them: den = l + the attention sink's
// term, lse = the tokens' natural-log lse (the sink leaves it unchanged, docs/contract.md §4). With
// the sink, out = e^lse / (e^lse + e^sink) · O / l = O / (l + e^sink · 2^−m), m the row's max in
// log2 units: one exp2 and one add. A row that saw nothing (l = 0) keeps den = 0 and lse = −inf
// whatever the sink (out 0); a sink of −inf adds 0 (out exactly as without), +inf makes den inf
// (out 0), NaN makes out NaN; a NaN l gives NaN den and lse. A workspace row (to_ws) gets no sink:
// a split row's sink is applied once, to its merge, by mla_decode_combine. An empty row's lse is
// +inf instead with p.empty_lse_inf (FlashMLA's convention), never in a workspace slot. Computed
// by whichever thread holds the row's (l, m) with registers to spare (trio's scorer; the P·V
// warpgroups, with O's 128 accumulators, spilled when they computed the sink's term themselves).
__device__ __forceinline__ float2 row_stats(const DcpMlaDecodeParams& p, bool to_ws, int row_in_seq, float l, float m) {
    const float empty = p.empty_lse_inf && !to_ws ? INFINITY : -INFINITY;
    const float lse = l == 0.0f ? empty : (m + log2f(l)) * kLn2;
    float den = l;
    if (p.sink && !to_ws && l != 0.0f) den += exp2f(fmaf(((const float*)p.sink)[row_in_seq % p.heads], kLog2e, -m));
    return make_float2(den, lse);
}

// A row's 1 / den and lse from row_stats: den = 0, the row saw nothing (0 and −inf); a NaN
// accumulator (`nan`, from rows_nan) or a NaN den (a NaN score from q or a cache row it read)
// gives NaN out and lse, never the empty row's (docs/contract.md §9).
__device__ __forceinline__ void row_scale(float2 st, bool nan, float& inv, float& lse) {
    const bool empty = st.x == 0.0f && !nan;
    inv = nan ? __int_as_float(0x7fffffff) : empty ? 0.0f : 1.0f / st.x;
    lse = nan ? __int_as_float(0x7fffffff) : st.y;
}

// A thread's column pairs col0 + 8n (+1) of row k (of its two) of O·inv, into the row at `row`
// (global or shared memory) as fp32 or packed bf16.
template <typename Acc>
__device__ __forceinline__ void put_row(unsigned char* row, bool f32, int col0, int k, float inv, Acc o) {
    if (f32) {
#pragma unroll
        for (int n = 0; n < 32; ++n)
            *(float2*)(row + 4 * (col0 + 8 * n)) = make_float2(o(n, 2 * k) * inv, o(n, 2 * k + 1) * inv);
    } else {
#pragma unroll
        for (int n = 0; n < 32; ++n)
            *(uint32_t*)(row + 2 * (col0 + 8 * n)) = pack_bf16(o(n, 2 * k) * inv, o(n, 2 * k + 1) * inv);
    }
}

// A thread's part of row k (of its two) of O·inv, stored straight to out (bf16 or fp32) or the
// workspace (fp32), the row starting `at` elements in: each warp store writes 8 or 4 bytes into
// each of 8 rows.
template <typename Acc>
__device__ __forceinline__ void store_row(const DcpMlaDecodeParams& p, bool to_ws, int64_t at, int col0, int k,
                                          float inv, Acc o) {
    if (to_ws || p.out_f32) {
        float* dst = (float*)(to_ws ? p.ws_out : p.out) + at;
        put_row((unsigned char*)dst, true, col0, k, inv, o);
    } else {
        __nv_bfloat16* dst = (__nv_bfloat16*)p.out + at;
        put_row((unsigned char*)dst, false, col0, k, inv, o);
    }
}

// The epilogue of both decode kernels: a thread's two rows (row0 and row0 + 8 of its 16-row
// group) of O / den and lse, `stats` being each row's row_stats (den = l with no sink, lse =
// (m + log2 l)·ln 2). Row r of the CTA is row row_base + r of sequence `seq`: that row of out
// and lse (views, out_row_offset), or with slot >= 0 row row_base + r of workspace slot `slot`
// (rows_per_seq rows each, contiguous). `o(n, e)` is the accumulator of column col0 + 8n + e
// (e = 0, 1) of row k = e >> 1 pairs: o(n, 2k) and o(n, 2k + 1). A row that saw nothing
// (den = 0) writes 0 and −inf. Every thread of the CTA calls it (it holds two CTA barriers); a
// row's 512 columns are the 4 threads of a quad (t4 = (col0 & 255) / 2) in each of the two
// column halves (col0 < 256 or not).
template <bool Sparse, typename Acc>
__device__ __forceinline__ void write_rows(const DcpMlaDecodeParams& p, int slot, int seq, int rows_per_seq,
                                           int row_base, int row_limit, int row0, int col0, bool writes_lse,
                                           const float2 (&stats)[2], Acc o) {
    bool row_nan[2];
    rows_nan(row0, col0, o, row_nan);
    __syncthreads();  // the flags are read before a later piece's write_rows sets them again
    const bool to_ws = slot >= 0;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int r = row0 + 8 * k;
        if (r >= row_limit) continue;
        float inv, lse;
        row_scale(stats[k], row_nan[k], inv, lse);
        if (to_ws) {
            const int64_t grow = (int64_t)slot * rows_per_seq + row_base + r;
            if (writes_lse) ((float*)p.ws_lse)[grow] = lse;
            store_row(p, true, grow * kDimLatent, col0, k, inv, o);
        } else {
            if (writes_lse) ((float*)p.lse)[lse_row_offset<Sparse>(p, seq, row_base + r)] = lse;
            store_row(p, false, out_row_offset<Sparse>(p, seq, row_base + r), col0, k, inv, o);
        }
    }
}

// write_rows with the rows going out through `stage`: StageBytes of shared memory that no
// thread reads or writes between the call's first CTA barrier and its last (the caller's other
// roles call write_rows_staged_barriers). Each thread writes its values into the staged rows (64 ×
// (row bytes + 16)); after the second barrier the `writers` threads that hold O (this one is
// `writer` among them) copy them out in 16-byte pieces, so a warp's store covers 512 contiguous
// bytes instead of 16 bytes in each of 8 rows (NOTES.md at 628d1db, nineteenth and twentieth sessions: the
// direct stores took ~5 µs of a sparse CTA). The 16-byte pad puts the 8 rows a warp writes at once
// on distinct banks. Rows that do not fit the stage (fp32 in a small one) are stored directly.
// Three CTA barriers: write_rows' two, and one after the copy-out, before a later piece's fills
// (or Q) overwrite the stage.
template <int StageBytes, bool Sparse, typename Acc>
__device__ __forceinline__ void write_rows_staged(const DcpMlaDecodeParams& p, int slot, int seq, int rows_per_seq,
                                                  int row_base, int row_limit, int row0, int col0, bool writes_lse,
                                                  const float2 (&stats)[2], Acc o, unsigned char* stage, int writer,
                                                  int writers) {
    bool row_nan[2];
    rows_nan(row0, col0, o, row_nan);
    const bool to_ws = slot >= 0;
    const bool f32 = to_ws || p.out_f32;
    const int row_bytes = f32 ? kDimLatent * 4 : kDimLatent * 2, pitch = row_bytes + 16;
    // the same in every thread of the CTA; known at compile time where fp32 rows fit
    const bool staged = StageBytes >= kRows * (kDimLatent * 4 + 16) || kRows * pitch <= StageBytes;
    if (!staged) __syncthreads();  // as write_rows' second
    const int64_t ws0 = (int64_t)slot * rows_per_seq + row_base;  // workspace row 0's (to_ws)
    float lse_v[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int r = row0 + 8 * k;
        if (r >= row_limit) continue;
        float inv;
        row_scale(stats[k], row_nan[k], inv, lse_v[k]);
        if (!staged) {
            store_row(p, to_ws, to_ws ? (ws0 + r) * kDimLatent : out_row_offset<Sparse>(p, seq, row_base + r), col0, k,
                      inv, o);
            continue;
        }
        put_row(stage + r * pitch, f32, col0, k, inv, o);
    }
    // the lse once O is out of the registers (a view's row address takes a few more)
    if (writes_lse) {
        const int64_t lse_seq = view_seq_offset(Sparse, p.nq, seq, p.lse_stride_b, p.lse_stride_s);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int r = row0 + 8 * k;
            if (r >= row_limit) continue;
            if (to_ws) ((float*)p.ws_lse)[ws0 + r] = lse_v[k];
            else
                ((float*)p.lse)[lse_seq + view_row_offset(Sparse, p.nq, p.heads, row_base + r, p.lse_stride_s,
                                                          p.lse_stride_h)] = lse_v[k];
        }
    }
    if (staged) {
        __syncthreads();  // the staged rows are written, and the flags read (as write_rows' second)
        const int chunk_log = f32 ? 7 : 6;  // 16-byte pieces a row: 128 or 64
        // the rows' base: the workspace slot's (contiguous), or the sequence's in the out view (its
        // division by nq once, not once a piece of 16 bytes)
        unsigned char* base = to_ws ? (unsigned char*)p.ws_out + ws0 * row_bytes
                                    : (unsigned char*)p.out +
                                          view_seq_offset(Sparse, p.nq, seq, p.out_stride_b, p.out_stride_s) * (f32 ? 4 : 2);
        for (int c = writer; c < (row_limit << chunk_log); c += writers) {
            const int r = c >> chunk_log, j = c & ((1 << chunk_log) - 1);
            const int64_t at = to_ws ? (int64_t)r * row_bytes
                                     : view_row_offset(Sparse, p.nq, p.heads, row_base + r, p.out_stride_s,
                                                       p.out_stride_h) * (f32 ? 4 : 2);
            *(uint4*)(base + at + 16 * j) = *(const uint4*)(stage + r * pitch + 16 * j);
        }
    }
    __syncthreads();  // the stage is read out before anyone writes it again
}

// write_rows_staged's CTA barriers, for a warpgroup of the CTA that holds no rows (a scorer, a
// loader): exactly as many __syncthreads as the rows' writers have.
__device__ __forceinline__ void write_rows_staged_barriers() {
    __syncthreads();
    __syncthreads();
    __syncthreads();
}

}  // namespace decode
}  // namespace dcp
