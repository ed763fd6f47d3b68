// The split-KV schedule on the device (issue 5; src/planner/schedule.rs is the host mirror and
// says why): the sequences of a launch, the unit prefix kernel (mla_decode_schedule) and the
// piece loop every decode kernel runs (for_each_piece).
#pragma once
#include "decode/base.cuh"

namespace dcp {
namespace decode {

// ---- split-KV schedule (issue 5; src/planner/schedule.rs is the host mirror and says why) ----
// Sequences: requests (dense: nq·heads rows each) or query rows of requests (sparse: heads rows).
__device__ __forceinline__ int num_seqs(const DcpMlaDecodeParams& p, bool sparse) {
    return sparse ? p.batch * p.nq : p.batch;
}
__device__ __forceinline__ int rows_per_seq(const DcpMlaDecodeParams& p, bool sparse) {
    return sparse ? p.heads : p.nq * p.heads;
}

// The tokens t < g of the global sequence that this rank holds: t with
// (t / I) % D == r (docs/contract.md §2), g ≥ 0; the planner's local_len on the host. The
// division by D·I ≥ 2 is the high half of a 32-bit multiply by the launcher's magic number and a
// shift (a hardware divide here, or a 64-bit product, spilled trio).
__device__ __forceinline__ int rank_tokens(const DcpMlaDecodeParams& p, int g) {
    const int full =
        p.dcp_cycle == 1 ? g : (int)(__umulhi((uint32_t)g, p.dcp_cycle_magic) >> p.dcp_cycle_shift);
    const int rest = g - full * p.dcp_cycle;
    return full * p.dcp_interleave + min(max(rest - p.dcp_rank_start, 0), p.dcp_interleave);
}

// x / heads for 0 ≤ x < 2^31 without a divide (the launcher's magic number).
__device__ __forceinline__ int div_heads(const DcpMlaDecodeParams& p, int x) {
    return p.heads == 1 ? x : (int)(__umulhi((uint32_t)x, p.heads_magic) >> p.heads_shift);
}

// Dense: local length of row j (of nq) of request s, clamped to [0, max_pages·B]. lens holds the
// rows' local lengths, or (lens_rule 1, 2) the requests' global lengths, from which each row's
// share on this rank follows (2: causal MTP rows, row j ends nq − 1 − j tokens before the last).
// Worked out where a piece starts and in the schedule, never in a tile loop.
// Split in two so that a maximum over rows costs one rank_tokens: row_global_len is monotone
// in what rank_tokens takes, so the longest row is the rule applied to the largest of them.
__device__ __forceinline__ int row_global_len(const DcpMlaDecodeParams& p, int s, int j) {
    const int32_t len = ((const int32_t*)p.lens)[s * p.len_stride_b + j * p.len_stride_s];
    // branch-free: local lengths take the identity (no causal shift, D·I = 1, rank start 0)
    return max(len - p.causal_shift * (p.nq - 1 - j), 0);
}
__device__ __forceinline__ int local_of_global(const DcpMlaDecodeParams& p, int g) {
    const int64_t capacity = (int64_t)p.max_pages * p.block_size;
    return (int)min((int64_t)rank_tokens(p, g), capacity);
}
__device__ __forceinline__ int dense_row_len(const DcpMlaDecodeParams& p, int s, int j) {
    return local_of_global(p, row_global_len(p, s, j));
}

// Tokens sequence s attends to at most: dense, the longest of its rows' clamped lengths; sparse,
// its clamped index count.
__device__ __forceinline__ int seq_tokens(const DcpMlaDecodeParams& p, bool sparse, int s) {
    if (sparse) {
        int n = p.topk;
        if (p.topk_len) {
            const int b = s / p.nq;  // sequence s is query row s mod nq of request b
            n = max(0, min(n, ((const int32_t*)p.topk_len)[b * p.len_stride_b + (s - b * p.nq) * p.len_stride_s]));
        }
        return n;
    }
    int g = 0;
    for (int j = 0; j < p.nq; ++j) g = max(g, row_global_len(p, s, j));
    return local_of_global(p, g);
}

// MODEL1's second source (p.extra_indices, decode/model1.cuh): the entries sequence s reads
// from it, its clamped count; 0 without one. Its tokens follow the first list's.
__device__ __forceinline__ int extra_seq_tokens(const DcpMlaDecodeParams& p, int s) {
    if (!p.extra_indices) return 0;
    int n = p.extra_topk;
    if (p.extra_topk_len) {
        const int b = s / p.nq;
        n = max(0, min(n, ((const int32_t*)p.extra_topk_len)[b * p.extra_len_stride_b +
                                                             (s - b * p.nq) * p.extra_len_stride_s]));
    }
    return n;
}

// What a CTA's rows row_base.. (row_limit of them) of sequence `seq` attend to: returns the
// tokens of the longest of them (sparse: the sequence's index count) and sets row_len[k] for the
// thread's rows r0 and r0 + 8 (0 for a row past row_limit). Shared by both decode kernels.
// Extra: MODEL1, whose sequences also read their second source's entries (extra_seq_tokens).
template <bool Sparse, bool Extra = false>
__device__ __forceinline__ int piece_rows(const DcpMlaDecodeParams& p, int seq, int row_base, int row_limit, int r0,
                                          int (&row_len)[2]) {
    if constexpr (Sparse) {
        const int n = seq_tokens(p, true, seq) + (Extra ? extra_seq_tokens(p, seq) : 0);
#pragma unroll
        for (int k = 0; k < 2; ++k) row_len[k] = r0 + 8 * k < row_limit ? n : 0;
        return n;
    } else {
        int g = 0;
        for (int j = div_heads(p, row_base); j <= div_heads(p, row_base + row_limit - 1); ++j)
            g = max(g, row_global_len(p, seq, j));
        const int n = local_of_global(p, g);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int r = r0 + 8 * k;
            row_len[k] = r < row_limit ? dense_row_len(p, seq, div_heads(p, row_base + r)) : 0;
        }
        return n;
    }
}


// One sequence's share of this CTA: tiles [tile_begin, tile_end), written to workspace slot
// `slot`, or directly to out/lse when slot < 0.
struct Piece {
    int seq, tile_begin, tile_end, slot;
};

// A share of a split sequence with no tiles for this row block (a part holding only the
// sequence's fixed-cost units, or tiles past this row block's rows): its partial has weight 0, so
// only lse = −inf is written (the combine then never reads its out) and Q is not loaded.
__device__ __forceinline__ bool skip_empty_share(const DcpMlaDecodeParams& p, const Piece& pc, int tile_begin,
                                                 int tile_end, int seq_rows, int row_base, int row_limit, int tid) {
    if (pc.slot < 0 || tile_begin < tile_end) return false;
    for (int r = tid; r < row_limit; r += blockDim.x)
        ((float*)p.ws_lse)[(int64_t)pc.slot * seq_rows + row_base + r] = -INFINITY;
    return true;
}

// A piece's tiles for this CTA's rows: the tokens they attend to (piece_rows, which also sets the
// thread's row_len), and the tiles [begin, end) of the piece among the sequence's tiles of Tile
// tokens. `skip`: a split share with no tiles here, whose lse skip_empty_share has written; the
// piece body returns at once. Every decode kernel's piece starts with it.
struct PieceTiles {
    int tokens, begin, end;
    bool skip;
};
template <bool Sparse, int Tile, bool Extra = false>
__device__ __forceinline__ PieceTiles piece_tiles(const DcpMlaDecodeParams& p, const Piece& pc, int seq_rows,
                                                  int row_base, int row_limit, int r0, int (&row_len)[2], int tid) {
    const int n_tokens = piece_rows<Sparse, Extra>(p, pc.seq, row_base, row_limit, r0, row_len);
    const int n_tiles = (n_tokens + Tile - 1) / Tile;
    const int tile_end = min(n_tiles, pc.tile_end);
    const int tile_begin = min(tile_end, pc.tile_begin);
    const bool skip = skip_empty_share(p, pc, tile_begin, tile_end, seq_rows, row_base, row_limit, tid);
    return PieceTiles{n_tokens, tile_begin, tile_end, skip};
}

// What a split launch's prefix was made for, written beside it by mla_decode_schedule: a launch
// that reuses it (DecodeSchedule::Reuse) must have the same tile, sequences and parts, or the
// pieces would not cover its work. A mismatch (or a workspace no schedule ever wrote) is a
// caller's error the launcher cannot see, since the stamp lives on the device: trap, loudly.
constexpr int kSchedStampMagic = 0x64637053;  // planner::split::SCHED_STAMP_MAGIC
__device__ __forceinline__ void check_sched_stamp(const DcpMlaDecodeParams& p, int seqs) {
    const int4 st = *(const int4*)p.sched_stamp;
    if (st.x != kSchedStampMagic || st.y != p.sched_tile || st.z != seqs || st.w != p.num_splits) __trap();
}

// A sequence's fixed cost in units (tiles) of the split schedule: planner::schedule::SEQ_FIXED_UNITS,
// whose comment says why 8 (a piece's restart costs ~4 tiles of a memory-bound stream at each end).
constexpr int kSeqFixedUnits = 8;

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

// for_each_piece with one call site of f (the same pieces in the same order).
template <typename F>
__device__ __forceinline__ void for_each_piece_one_site(const DcpMlaDecodeParams& p, int seqs, int block_seq, F&& f) {
    const int64_t* u = (const int64_t*)p.sched;
    int s = block_seq;
    if (p.num_splits > 1) {
        // launched as a dependent of the schedule kernel: wait for its prefix (a launch that reuses
        // an earlier one's prefix is not a dependent, and passes at once)
        griddep_wait();
        const PartRange r = part_range(p, u, seqs);
        // before anything the prefix decides (an empty part returns below), after the prefix's
        // first load is issued, so the stamp's load overlaps it
        check_sched_stamp(p, seqs);
        if (r.b >= r.e) return;
        int lo = 0, hi = seqs;  // u[lo] <= b < u[hi]
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (u[mid] <= r.b) lo = mid;
            else hi = mid;
        }
        s = lo;
    }
    // one part: block_seq alone; split: from s on, while the sequences start inside the part
    for (; s < (p.num_splits > 1 ? seqs : block_seq + 1); ++s) {
        Piece pc{s, 0, INT_MAX, -1};
        if (p.num_splits > 1) {
            const PartRange r = part_range(p, u, seqs);
            const int64_t a = u[s], z = u[s + 1];
            if (a >= r.e) break;
            const int64_t first = a + kSeqFixedUnits;  // unit of tile 0; units a.. are the sequence's fixed cost
            pc.tile_begin = (int)(max(r.b, first) - first);
            // (as in for_each_piece below)
            pc.tile_end = z <= r.e ? INT_MAX : max(pc.tile_begin, (int)(min(r.e, z) - first));
            const bool split = a / r.w != (z - 1) / r.w;
            pc.slot = split ? 2 * (int)blockIdx.z + (a > r.b ? 1 : 0) : -1;
        }
        f(pc);
    }
}

// The piece loop (the comment above PartRange). Each call site of f inlines the kernel's whole piece
// (every role's loop and epilogue): kOneSite calls it from one site for the unsplit piece and the
// split loop alike (for_each_piece_one_site), else from two, the unsplit piece apart. One site
// halves a kernel's SASS; measured on the H100 (2026-12-08), lead's kernels 0-7.5% faster with
// it, trio's and trio_split's 1-7.5% slower on the compute-bound dense rows (so they keep two);
// the mma.sync kernels not measured with it. The two forms are kept apart, each as measured:
// sharing their sequence arithmetic through helpers changed trio's SASS.
template <bool kOneSite = false, typename F>
__device__ __forceinline__ void for_each_piece(const DcpMlaDecodeParams& p, int seqs, int block_seq, F&& f) {
    if constexpr (kOneSite) {
        for_each_piece_one_site(p, seqs, block_seq, static_cast<F&&>(f));
        return;
    }
    if (p.num_splits <= 1) {
        f(Piece{block_seq, 0, INT_MAX, -1});
        return;
    }
    // launched as a dependent of the schedule kernel: wait for its prefix (a launch that reuses
    // an earlier one's prefix is not a dependent, and passes at once)
    griddep_wait();
    const int64_t* u = (const int64_t*)p.sched;
    int s;
    {
        const PartRange r = part_range(p, u, seqs);
        // before anything the prefix decides (an empty part returns below), after the prefix's
        // first load is issued, so the stamp's load overlaps it
        check_sched_stamp(p, seqs);
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
        const int64_t first = a + kSeqFixedUnits;  // unit of tile 0; units a.. are the sequence's fixed cost
        const int tb = (int)(max(r.b, first) - first);
        // the sequence's last piece runs to its last tile, whatever the prefix counted: a reused
        // prefix made for shorter lengths then costs balance, never tokens (piece_tiles clamps
        // the end to the tiles the lengths have now; with the prefix's own lengths it is z − first)
        const int te = z <= r.e ? INT_MAX : max(tb, (int)(min(r.e, z) - first));
        const bool split = a / r.w != (z - 1) / r.w;
        f(Piece{s, tb, te, split ? 2 * (int)blockIdx.z + (a > r.b ? 1 : 0) : -1});
    }
}

}  // namespace decode

// The schedule of a split launch: sched[s] = Σ_{s' < s} (kSeqFixedUnits + ceil(tokens(s') / sched_tile)), and
// the combine's part table 16 bytes after the stamp (planner::split::SplitPlan::owner_offset); one
// CTA; each thread sums a run of consecutive sequences, then a block scan.
template <int Unused = 0>
__device__ __forceinline__ void mla_decode_schedule(const DcpMlaDecodeParams& p) {
    using namespace decode;
    // the decode grid's CTAs start and set up while this runs (they wait for the prefix)
    griddep_launch_dependents();
    const bool sparse = p.indices != 0;
    const int seqs = num_seqs(p, sparse), tile = p.sched_tile;
    const int per = (seqs + blockDim.x - 1) / blockDim.x;
    const int s0 = min(seqs, (int)threadIdx.x * per), s1 = min(seqs, s0 + per);
    // pass 1: each sequence's units into u[s] (read back by the same thread in pass 2)
    int64_t* u = (int64_t*)p.sched;
    int64_t own = 0;
    for (int s = s0; s < s1; ++s) {
        // (a MODEL1 launch's second source adds its entries; no other launch has one)
        u[s] = kSeqFixedUnits + (seq_tokens(p, sparse, s) + extra_seq_tokens(p, s) + tile - 1) / tile;
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
    for (int part = threadIdx.x; part < p.num_splits; part += blockDim.x)
        ((int4*)(p.sched_stamp + 16))[part] = make_int4(-1, 0, 0, 0);
    __syncthreads();
    int64_t before = 0, total = 0;
    for (int i = 0; i < warps; ++i) {
        if (i < warp) before += warp_total[i];
        total += warp_total[i];
    }
    int64_t acc = before + incl - own;
    // the combine's part table (its grid by part): part fp holds {s, parts of s, whether s starts
    // after fp's first unit} for the split sequence s that starts in fp, else seq −1; written
    // whole before the barrier above, owners after it (a part has at most one: a sequence that
    // runs past its first part is that part's last)
    int4* const owner = (int4*)(p.sched_stamp + 16);
    const int64_t w = (total + p.num_splits - 1) / p.num_splits;
    for (int s = s0; s < s1; ++s) {  // pass 2: units → exclusive prefix
        const int64_t units = u[s];
        u[s] = acc;
        const int64_t fp = acc / w, lp = (acc + units - 1) / w;
        if (fp != lp) owner[fp] = make_int4(s, (int)(lp - fp + 1), acc > fp * w ? 1 : 0, 0);
        acc += units;
    }
    if (threadIdx.x == 0) {
        u[seqs] = total;
        *(int4*)p.sched_stamp = make_int4(kSchedStampMagic, tile, seqs, p.num_splits);
    }
}

}  // namespace dcp
