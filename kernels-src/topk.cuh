// Distributed sparse top-k (docs/contract.md §6): local radix-select top-k, candidate packing, the exact
// global merge of D·K candidates, and compaction for one rank. The CPU twin is
// src/reference/topk.rs; every kernel here is bit-exact against it.
//
// Order key everywhere: score descending, then index (or id) ascending, NaN counting as -inf.
// Scores map to an order-preserving u32 (larger = better), so selection is an exact radix select
// and ties are broken by position with stable block-wide scans: results are deterministic.
#pragma once
#include "common.cuh"
#include "arch/sm90_ptx.cuh"

namespace dcp {

constexpr int kRadixBits = 11;
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kTopkBlock = 1024;   // topk_local's block (the DSL's `block`)
constexpr int kTopkItems = 4;      // elements per thread per tile of a streamed row
constexpr int kTopkBufCap = 4096;  // survivors buffered in shared memory once they fit
constexpr int kTopkClusterBlock = 1024;    // topk_local_cluster's block (the DSL's `block`)
// A cluster CTA's chunk is whatever its dynamic shared memory holds (the launcher's
// TOPK_CLUSTER_CHUNK, 32768, bounds it; the list's 16-bit positions need ≤ 65536).
constexpr int kTopkClusterMax = 8;         // most CTAs a row's cluster has (the portable limit; TOPK_CLUSTER_MAX)
constexpr int kTopkListCap = 8192;         // a cluster CTA's list of elements at or above the first digit
constexpr int kMergeBlock = 512;   // topk_merge's block
constexpr int kCompactBlock = 512; // topk_compact's block
constexpr int kCompactItems = 4;

// Larger key = better score. NaN takes -inf's key; -0 takes +0's, so the two compare equal as
// floats do and tie on index.
__device__ __forceinline__ uint32_t score_key(float f) {
    uint32_t u = __float_as_uint(f);
    if (f != f) u = 0xff800000u;
    if (f == 0.0f) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint32_t lanemask_lt() {
    uint32_t m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

__device__ __forceinline__ uint32_t warp_inclusive_sum(uint32_t x) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// Exclusive prefix sum of one value per thread in thread order; `total` gets the block's sum.
// s_warp holds BLOCK/32 + 1 words; the caller syncs before reusing it.
template <int BLOCK>
__device__ __forceinline__ uint32_t block_exclusive_sum(uint32_t v, uint32_t& total, uint32_t* s_warp) {
    constexpr int W = BLOCK / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t x = warp_inclusive_sum(v);
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const uint32_t w = lane < W ? s_warp[lane] : 0u;
        const uint32_t s = warp_inclusive_sum(w);
        if (lane < W) s_warp[lane] = s - w;
        if (lane == 31) s_warp[W] = s;
    }
    __syncthreads();
    total = s_warp[W];
    return s_warp[warp] + x - v;
}

// Stable block-wide ordering of ITEMS pairs of flags per thread, element order (item, thread):
// before[i] = (flags a before item i) | (flags b before item i) << 16, total likewise for the
// whole tile (both counts stay below 2^16). s_scan holds ITEMS·BLOCK/32 + 1 words; callers
// alternate two buffers between consecutive calls so that no extra barrier is needed.
template <int BLOCK, int ITEMS>
__device__ __forceinline__ void ordered_scan(const bool (&a)[ITEMS], const bool (&b)[ITEMS], uint32_t (&before)[ITEMS],
                                             uint32_t& total, uint32_t* s_scan) {
    constexpr int W = BLOCK / 32, N = ITEMS * W, PER = (N + 31) / 32;
    static_assert(ITEMS * BLOCK < 65536, "packed 16-bit counts");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t ma[ITEMS], mb[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        ma[i] = __ballot_sync(0xffffffffu, a[i]);
        mb[i] = __ballot_sync(0xffffffffu, b[i]);
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) s_scan[i * W + warp] = __popc(ma[i]) | (__popc(mb[i]) << 16);
    }
    __syncthreads();
    if (warp == 0) {
        uint32_t v[PER], s = 0;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int idx = lane * PER + j;
            v[j] = idx < N ? s_scan[idx] : 0u;
            s += v[j];
        }
        const uint32_t incl = warp_inclusive_sum(s);
        uint32_t excl = incl - s;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int idx = lane * PER + j;
            if (idx < N) s_scan[idx] = excl;
            excl += v[j];
        }
        if (lane == 31) s_scan[N] = incl;
    }
    __syncthreads();
    const uint32_t lt = lanemask_lt();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
        before[i] = s_scan[i * W + warp] + __popc(ma[i] & lt) + (__popc(mb[i] & lt) << 16);
    total = s_scan[N];
}

// Radix-select step: finds the digit whose bin holds the `need`-th best element counting from
// the top bin. Thread t holds the counts of bins 2047 − (PER·t + j), j < PER (top bin first), in
// `c`. s_sel = {digit, need left inside that bin, bin count}. Every thread returns after the
// result is visible.
// `local`, when given, holds another count of the same bins; s_sel[3] gets the chosen bin's.
// Returns the block's total count (when it is below `need`, no bin is chosen and s_sel is left).
// PER may exceed 2048 / BLOCK' share only as far as every bin has a thread: threads past the
// last bin hold zero counts.
template <int BLOCK, int PER = kRadixBins / BLOCK>
__device__ __forceinline__ uint32_t select_digit_counts(const uint32_t (&c)[PER], uint32_t need, uint32_t* s_warp,
                                                    uint32_t* s_sel, const uint32_t* local = nullptr) {
    static_assert(PER * BLOCK >= kRadixBins, "bins per thread");
    uint32_t sum = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) sum += c[j];
    uint32_t total;
    uint32_t above = block_exclusive_sum<BLOCK>(sum, total, s_warp);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        if (above < need && need <= above + c[j]) {
            s_sel[0] = kRadixBins - 1 - (threadIdx.x * PER + j);
            s_sel[1] = need - above;
            s_sel[2] = c[j];
            if (local) s_sel[3] = local[j];
        }
        above += c[j];
    }
    __syncthreads();
    return total;
}

// The same over a filled histogram in shared memory.
template <int BLOCK>
__device__ __forceinline__ uint32_t select_digit(const uint32_t* hist, uint32_t need, uint32_t* s_warp, uint32_t* s_sel) {
    constexpr int PER = kRadixBins / BLOCK;
    uint32_t c[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) c[j] = hist[kRadixBins - 1 - (threadIdx.x * PER + j)];
    return select_digit_counts<BLOCK>(c, need, s_warp, s_sel);
}

// ---------------------------------------------------------------------------------------------
// Local top-k: one CTA per row. Radix passes of 11 bits over the u32 keys find the threshold
// prefix; as soon as the elements at or above it fit in shared memory they are buffered (in
// index order) and the remaining passes and the output run there. The output is the selected
// indices in ascending order: all elements strictly above the threshold plus the first `need`
// elements equal to it.
// ---------------------------------------------------------------------------------------------

// Emits, in index order, the selected elements of `count` elements read through `load(e, idx)`
// (returns the key; writes the index). gt: masked key above prefix; eq: equal, first `need` taken.
template <int BLOCK, int ITEMS, typename Key, typename Load>
__device__ __forceinline__ void emit_selected(int count, Key prefix, Key mask, uint32_t need, uint32_t take_gt, Load load,
                                              int32_t* out, uint32_t (*s_scan)[ITEMS * BLOCK / 32 + 1], int& it) {
    uint32_t gt0 = 0, eq0 = 0;
    for (int base = 0; base < count; base += ITEMS * BLOCK, ++it) {
        bool a[ITEMS], b[ITEMS];
        int32_t idx[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int e = base + i * BLOCK + threadIdx.x;
            a[i] = b[i] = false;
            idx[i] = -1;
            if (e < count) {
                const Key k = load(e, idx[i]) & mask;
                a[i] = k > prefix;
                b[i] = k == prefix;
            }
        }
        uint32_t before[ITEMS], total;
        ordered_scan<BLOCK, ITEMS>(a, b, before, total, s_scan[it & 1]);
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const uint32_t gt = gt0 + (before[i] & 0xffffu), eq = eq0 + (before[i] >> 16);
            if (a[i]) out[gt + min(eq, need)] = idx[i];
            else if (b[i] && eq < need) out[gt + eq] = idx[i];
        }
        gt0 += total & 0xffffu;
        eq0 += total >> 16;
        if (gt0 >= take_gt && eq0 >= need) break;  // uniform: every thread sees the same totals
    }
}

template <int K>
__device__ __forceinline__ void topk_local(const DcpTopkParams& p) {
    constexpr int BLOCK = kTopkBlock, ITEMS = kTopkItems, TILE = BLOCK * ITEMS;
    __shared__ uint32_t s_hist[kRadixBins];
    __shared__ uint32_t s_key[kTopkBufCap];
    __shared__ int32_t s_idx[kTopkBufCap];
    __shared__ uint32_t s_scan[2][ITEMS * BLOCK / 32 + 1];
    __shared__ uint32_t s_warp[BLOCK / 32 + 1];
    __shared__ uint32_t s_sel[3];

    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    int32_t* out = (int32_t*)p.out + (int64_t)row * K;
    const int len = max(0, min(((const int32_t*)p.lens)[row], p.cols));
    if (len <= K) {
        for (int j = tid; j < K; j += BLOCK) out[j] = j < len ? j : -1;
        return;
    }
    const float* x = (const float*)p.scores + (int64_t)row * p.row_stride;

    uint32_t prefix = 0, mask = 0, need = K;  // need: still to take among keys matching prefix
    int cached = -1;                          // elements buffered in s_key/s_idx, -1: none
    int it = 0;                               // ordered_scan buffer parity
#pragma unroll 1
    for (int pass = 0; pass < 3; ++pass) {
        // 11-bit digits at bits 21, 10, 0; the last one overlaps bit 10, already fixed.
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
        for (int i = tid; i < kRadixBins; i += BLOCK) s_hist[i] = 0;
        __syncthreads();
        if (cached >= 0) {
            for (int e = tid; e < cached; e += BLOCK) {
                const uint32_t k = s_key[e];
                if ((k & mask) == prefix) atomicAdd(&s_hist[(k >> shift) & (kRadixBins - 1)], 1u);
            }
        } else {
            for (int base = 0; base < len; base += TILE) {
                float v[ITEMS];
#pragma unroll
                for (int i = 0; i < ITEMS; ++i) {
                    const int e = base + i * BLOCK + tid;
                    v[i] = e < len ? __ldg(x + e) : 0.0f;
                }
#pragma unroll
                for (int i = 0; i < ITEMS; ++i) {
                    const uint32_t k = score_key(v[i]);
                    if (base + i * BLOCK + tid < len && (k & mask) == prefix)
                        atomicAdd(&s_hist[(k >> shift) & (kRadixBins - 1)], 1u);
                }
            }
        }
        __syncthreads();
        select_digit<BLOCK>(s_hist, need, s_warp, s_sel);
        const uint32_t digit = s_sel[0], bucket = s_sel[2];
        need = s_sel[1];
        prefix |= digit << shift;
        mask |= (uint32_t)(kRadixBins - 1) << shift;
        __syncthreads();  // s_sel is rewritten by the next pass
        if (bucket == need) break;  // the whole bin is taken: the prefix decides everything
        if (cached < 0 && pass < 2) {
            const uint32_t survivors = (K - need) + bucket;
            if (survivors <= kTopkBufCap) {
                // Buffer every element at or above the prefix, in index order.
                uint32_t done = 0;
                for (int base = 0; base < len && done < survivors; base += TILE, ++it) {
                    bool a[ITEMS], b[ITEMS];
                    uint32_t kk[ITEMS];
#pragma unroll
                    for (int i = 0; i < ITEMS; ++i) {
                        const int e = base + i * BLOCK + tid;
                        kk[i] = e < len ? score_key(__ldg(x + e)) : 0u;
                        a[i] = e < len && (kk[i] & mask) >= prefix;
                        b[i] = false;
                    }
                    uint32_t before[ITEMS], total;
                    ordered_scan<BLOCK, ITEMS>(a, b, before, total, s_scan[it & 1]);
#pragma unroll
                    for (int i = 0; i < ITEMS; ++i) {
                        const uint32_t pos = done + (before[i] & 0xffffu);
                        if (a[i] && pos < kTopkBufCap) {
                            s_key[pos] = kk[i];
                            s_idx[pos] = base + i * BLOCK + tid;
                        }
                    }
                    done += total & 0xffffu;
                }
                cached = (int)min(done, (uint32_t)kTopkBufCap);
                __syncthreads();
            }
        }
    }

    if (cached >= 0) {
        emit_selected<BLOCK, ITEMS>(
            cached, prefix, mask, need, K - need,
            [&](int e, int32_t& idx) {
                idx = s_idx[e];
                return s_key[e];
            },
            out, s_scan, it);
    } else {
        emit_selected<BLOCK, ITEMS>(
            len, prefix, mask, need, K - need,
            [&](int e, int32_t& idx) {
                idx = e;
                return score_key(__ldg(x + e));
            },
            out, s_scan, it);
    }
}

// Emits, in index order, the selected among `count` elements read through `load(i, idx)`
// (returns the key, sets the element's index; elements in ascending index order): gt (masked
// key above `prefix`) all taken, eq (equal) the first `need` taken, each written to
// out[gt_before + min(eq_before, need)] (eq: gt_before + eq_before). Each warp takes one
// contiguous segment: a counting sweep (ballots), a scan of the warps' counts, a writing sweep.
// s_warp2 holds two words a warp.
template <int BLOCK, typename Load>
__device__ __forceinline__ void emit_segments(int count, uint32_t prefix, uint32_t mask, uint32_t need, Load load,
                                              int32_t* out, uint32_t (*s_warp2)[2]) {
    constexpr int W = BLOCK / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int seg = ((count + W - 1) / W + 31) & ~31;
    const int lo = min(count, warp * seg), hi = min(count, lo + seg);
    uint32_t gt = 0, eq = 0;
    for (int i0 = lo; i0 < hi; i0 += 32) {
        const int i = i0 + lane;
        int32_t idx;
        const uint32_t k = i < hi ? load(i, idx) & mask : 0u;
        gt += __popc(__ballot_sync(0xffffffffu, i < hi && k > prefix));
        eq += __popc(__ballot_sync(0xffffffffu, i < hi && k == prefix));
    }
    if (lane == 0) {
        s_warp2[warp][0] = gt;
        s_warp2[warp][1] = eq;
    }
    __syncthreads();
    gt = eq = 0;
    for (int w = 0; w < warp; ++w) {
        gt += s_warp2[w][0];
        eq += s_warp2[w][1];
    }
    const uint32_t lt = lanemask_lt();
    for (int i0 = lo; i0 < hi; i0 += 32) {
        const int i = i0 + lane;
        int32_t idx = 0;
        const uint32_t k = i < hi ? load(i, idx) & mask : 0u;
        const bool a = i < hi && k > prefix, b = i < hi && k == prefix;
        const uint32_t ma = __ballot_sync(0xffffffffu, a), mb = __ballot_sync(0xffffffffu, b);
        const uint32_t g = gt + __popc(ma & lt), q = eq + __popc(mb & lt);
        if (a || (b && q < need)) out[g + (a ? min(q, need) : q)] = idx;
        gt += __popc(ma);
        eq += __popc(mb);
    }
}

// ---------------------------------------------------------------------------------------------
// Local top-k, one thread-block cluster per row (sm_90): the row's CTAs (C = the cluster size,
// 1..8) each read one chunk of ceil(cols / C) elements from global memory once, as keys into
// their dynamic shared memory (chunk·4 bytes; the launch passes at least that), counting the
// first digit on the way. Each pass sums the C histograms over distributed shared memory as a
// reduce-scatter (CTA r sums slice r of the bins over the cluster: 2048 remote reads a CTA, not
// C·2048, all in flight at once), then every CTA reads each bin's sum from the CTA whose slice
// holds it, so all of them pick the same digit (a one-CTA cluster skips the barriers and remote
// reads). After the first digit a CTA whose elements at or above it fit kTopkListCap lists
// their positions in index order (two sweeps of its chunk), and the later passes and the output
// read only that list; otherwise they sweep the whole chunk. At the end each CTA knows how many
// of its elements are above the threshold key and equal to it; an exclusive scan of those over
// the lower ranks places its selected elements in the row's ascending-index output. Same output
// as topk_local, bit for bit. Two cluster barriers a pass: after the counts (A) and after the
// slice sums (B); a buffer another CTA reads between two barriers is rewritten only after the
// next one, which every CTA reaches after its reads (so the slice sums alternate between two
// buffers). Measured: the selection's instructions and each pass's barriers bound it, not the
// row's bytes, so the launcher gives a row the fewest CTAs that hold it (NOTES.md at 628d1db).
// KeyBits = 16: a CTA keeps only each key's top 16 bits (chunk·2 bytes), so it holds twice the
// chunk and a row needs half the CTAs (a 131,072-column row two, not four). The first two
// digits come from those bits (bits 21..31, then 16..20); the elements at or above that 16-bit
// prefix are listed, their full keys recomputed from the scores in global memory (at most
// kTopkListCap reads a CTA), and the last two digits (bits 5..15, 0..4) run over those. A CTA
// whose list would overflow (more than kTopkListCap elements tie on the top 16 bits) reads its
// chunk's scores from global memory again for the rest: slower, the same output.
// ---------------------------------------------------------------------------------------------
template <int K, int KeyBits>
__device__ __forceinline__ void topk_local_cluster(const DcpTopkParams& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace ptx_sm90;
    // The first 512 threads hold one group of 4 bins each (16-byte reads); the rest hold none.
    constexpr int BLOCK = kTopkClusterBlock, PER = 4, GROUPS = kRadixBins / PER, W = BLOCK / 32;
    static_assert(BLOCK >= GROUPS, "a thread for every group of bins");
    static_assert(KeyBits == 32 || KeyBits == 16, "whole keys or their top halves");
    constexpr bool kHalf = KeyBits == 16;
    extern __shared__ uint32_t s_key[];  // this CTA's chunk of keys (kHalf: their top 16 bits, packed)
    [[maybe_unused]] uint16_t* s_key16 = reinterpret_cast<uint16_t*>(s_key);
    // kHalf: the listed elements' full keys, recomputed from their scores
    __shared__ uint32_t s_lkey[kHalf ? kTopkListCap : 1];
    __shared__ __align__(16) uint32_t s_hist[kRadixBins];   // this CTA's counts of the pass
    __shared__ __align__(16) uint32_t s_slice[2][kRadixBins];  // the cluster's sums of this CTA's
                                                               // slice, by pass parity
    __shared__ uint16_t s_list[kTopkListCap];                // positions at or above the first digit
    __shared__ uint32_t s_warp[BLOCK / 32 + 1];
    __shared__ uint32_t s_warp2[W][2];
    __shared__ uint32_t s_sel[4];  // digit, need left in its bin, its cluster count, this CTA's
    __shared__ __align__(8) uint32_t s_count[2];             // (above, at) of this CTA, read by the others
    __shared__ uint32_t s_lower[kTopkClusterMax][2];          // the same of every CTA, copied here

    const uint32_t csize = cluster_size(), crank = cluster_rank();
    const int row = blockIdx.x / csize;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // ceil(cols / C) rounded up to 4 keys (src/ops/topk.rs: topk_cluster_chunk)
    const int chunk = (((p.cols + (int)csize - 1) / (int)csize) + 3) & ~3;
    if ((uint32_t)chunk * (KeyBits / 8) > dynamic_smem_bytes()) __trap();  // a launch that passed too little
    int32_t* out = (int32_t*)p.out + (int64_t)row * K;
    const int len = max(0, min(((const int32_t*)p.lens)[row], p.cols));
    if (len <= K) {  // the same decision in every CTA of the cluster: none touches another's memory
        if (crank == 0)
            for (int j = tid; j < K; j += BLOCK) out[j] = j < len ? j : -1;
        return;
    }
    const int start = (int)crank * chunk;
    const int count = max(0, min(len - start, chunk));
    const float* x = (const float*)p.scores + (int64_t)row * p.row_stride + start;
    // Bins are split into C slices of a multiple of 4 bins; a thread's group of 4 lies in one.
    const int slice = (((kRadixBins + (int)csize - 1) / (int)csize + 3) / 4) * 4;  // C slices cover 2048
    const int group = kRadixBins - PER * (tid + 1);  // this thread's bins: group .. group + 3
    const bool grouped = tid < GROUPS;               // (else group < 0: no bins)
    // Counts go through 32-bit shared addresses (red.shared): a generic atomic in a cluster
    // kernel recomputes the CTA's window address every time.
    const uint32_t hist_addr = (uint32_t)__cvta_generic_to_shared(s_hist);
    const uint32_t slice_addr[2] = {(uint32_t)__cvta_generic_to_shared(s_slice[0]),
                                    (uint32_t)__cvta_generic_to_shared(s_slice[1])};

    uint32_t prefix = 0, mask = 0, need = K;  // need: still to take among keys matching prefix
    uint32_t above_part = 0, at = 0;          // this thread's bins' share of the CTA's elements
                                              // above the prefix; the CTA's elements matching it
    int round = 0;  // passes done: the parity of the slice buffers
    // One pass's cluster step, after this CTA counted its digit (`bits` wide at `shift`) into
    // s_hist: the digit every CTA picks, this CTA's share above and at it. True when the prefix
    // decides everything.
    auto select = [&](int shift, int bits) {
        uint32_t c[PER] = {0, 0, 0, 0}, mine[PER] = {0, 0, 0, 0};  // this thread's bins: the cluster's
                                                                    // counts, this CTA's
        if (csize == 1) {
            __syncthreads();  // the counts are complete
            if (grouped) {
                const uint4 h = *reinterpret_cast<const uint4*>(&s_hist[group]);
                mine[0] = h.w, mine[1] = h.z, mine[2] = h.y, mine[3] = h.x;
                *reinterpret_cast<uint4*>(&s_hist[group]) = make_uint4(0, 0, 0, 0);  // for the next pass
            }
#pragma unroll
            for (int j = 0; j < PER; ++j) c[j] = mine[j];
        } else {
            uint32_t* slice_sums = s_slice[round & 1];
            cluster_sync();  // A: every CTA's counts of this pass are complete and visible
            // Reduce-scatter: this CTA sums its slice of the bins over the cluster, one remote
            // 16-byte read a (group of 4 bins, CTA) pair, all in flight at once.
            const int lo = (int)crank * slice, groups = (min(kRadixBins, lo + slice) - lo) / PER;
            for (int q = tid; q < groups * (int)csize; q += BLOCK) {
                const int b = lo + PER * (q / (int)csize);
                const uint4 h = cluster_ld_v4(cluster_map(&s_hist[b], (uint32_t)(q % (int)csize)));
                const uint32_t addr = slice_addr[round & 1] + 4 * b;
                if (h.x) shared_add(addr, h.x);
                if (h.y) shared_add(addr + 4, h.y);
                if (h.z) shared_add(addr + 8, h.z);
                if (h.w) shared_add(addr + 12, h.w);
            }
            cluster_sync();  // B: every slice is summed, and no CTA reads s_hist any more
            if (grouped) {
                const uint4 h = cluster_ld_v4(cluster_map(&slice_sums[group], (uint32_t)(group / slice)));
                c[0] = h.w, c[1] = h.z, c[2] = h.y, c[3] = h.x;
                const uint4 m = *reinterpret_cast<const uint4*>(&s_hist[group]);
                mine[0] = m.w, mine[1] = m.z, mine[2] = m.y, mine[3] = m.x;
                // A thread's own bins, zeroed by it for the next pass: s_hist, and the other
                // slice buffer, last read remotely before this pass's A.
                *reinterpret_cast<uint4*>(&s_hist[group]) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4*>(&s_slice[(round + 1) & 1][group]) = make_uint4(0, 0, 0, 0);
            }
        }
        // The digit (s_sel, with this CTA's count in its bin), after which every thread sees it.
        select_digit_counts<BLOCK, PER>(c, need, s_warp, s_sel, mine);
        const uint32_t digit = s_sel[0], bucket = s_sel[2];
        need = s_sel[1];
        at = s_sel[3];
#pragma unroll
        for (int j = 0; j < PER; ++j) above_part += (uint32_t)(group + 3 - j) > digit ? mine[j] : 0u;
        prefix |= digit << shift;
        mask |= ((1u << bits) - 1u) << shift;
        ++round;
        return bucket == need;
    };
    auto above_total = [&] {
        uint32_t total;
        block_exclusive_sum<BLOCK>(above_part, total, s_warp);
        return total;
    };

    // The one read of the row: keys into shared memory, first digit (bits 21..31) counted.
    for (int i = tid; i < kRadixBins; i += BLOCK) s_hist[i] = s_slice[0][i] = 0;
    __syncthreads();
    {
        int base = 0;
        if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
            // Scores as float4 (up to four a thread in flight), keys stored as uint4.
            const float4* xv = reinterpret_cast<const float4*>(x);
            uint4* kv = reinterpret_cast<uint4*>(s_key);
            const int vec = count / 4;
            auto convert = [&](int i, float4 v) {
                const uint4 k = make_uint4(score_key(v.x), score_key(v.y), score_key(v.z), score_key(v.w));
                if constexpr (kHalf)
                    reinterpret_cast<uint2*>(s_key)[i] = make_uint2((k.x >> 16) | (k.y & 0xffff0000u), (k.z >> 16) | (k.w & 0xffff0000u));
                else
                    kv[i] = k;
                shared_add(hist_addr + (k.x >> 21) * 4, 1u);
                shared_add(hist_addr + (k.y >> 21) * 4, 1u);
                shared_add(hist_addr + (k.z >> 21) * 4, 1u);
                shared_add(hist_addr + (k.w >> 21) * 4, 1u);
            };
            int i0 = 0;
            for (; i0 + 4 * BLOCK <= vec; i0 += 4 * BLOCK) {
                float4 v[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) v[u] = __ldg(xv + i0 + u * BLOCK + tid);
#pragma unroll
                for (int u = 0; u < 4; ++u) convert(i0 + u * BLOCK + tid, v[u]);
            }
            for (int i = i0 + tid; i < vec; i += BLOCK) convert(i, __ldg(xv + i));
            base = 4 * vec;
        }
        for (int e = base + tid; e < count; e += BLOCK) {
            const uint32_t k = score_key(__ldg(x + e));
            if constexpr (kHalf) s_key16[e] = (uint16_t)(k >> 16);
            else s_key[e] = k;
            shared_add(hist_addr + (k >> 21) * 4, 1u);
        }
    }
    bool done = select(21, 11);
    // kHalf: the second digit (bits 16..20) from the top halves in shared memory, 8 a 16-byte read
    if constexpr (kHalf) {
        if (!done) {
            const uint4* kv = reinterpret_cast<const uint4*>(s_key);
            const uint32_t p16 = prefix >> 16;  // bits 21..31 as a 16-bit key's top 11
            auto count16 = [&](uint32_t h) {
                if ((h >> 5) == (p16 >> 5)) shared_add(hist_addr + (h & 31) * 4, 1u);
            };
            for (int i = tid; i < count / 8; i += BLOCK) {
                const uint4 v = kv[i];
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    count16(w[j] & 0xffffu);
                    count16(w[j] >> 16);
                }
            }
            for (int e = (count / 8) * 8 + tid; e < count; e += BLOCK) count16(s_key16[e]);
            done = select(16, 5);
        }
    }

    // At most kTopkListCap of this CTA's elements at or above the first digit (key ≥ prefix):
    // their positions, in index order, replace the chunk for the rest.
    const uint32_t above0 = above_total();
    const bool listed = !done && above0 + at <= (uint32_t)kTopkListCap;
    if (listed) {
        // Warp segments of whole 128-key steps; lane L of a step reads keys 4L..4L + 3 as one
        // uint4 (the chunk is a multiple of 4 keys: see `chunk`), so key order is (step, lane, j).
        const int seg = ((count + W - 1) / W + 127) & ~127;
        const int lo = min(count, warp * seg), hi = min(count, lo + seg);
        const uint4* kv = reinterpret_cast<const uint4*>(s_key);
        const uint2* kv16 = reinterpret_cast<const uint2*>(s_key);
        auto at_or_above = [&](int e0, bool (&in)[4]) {
            const int e = e0 + 4 * lane;
            uint4 k;
            if constexpr (kHalf) {
                // the prefix covers bits 16..31 here, so a top half compares exactly
                const uint2 h = e < hi ? kv16[e / 4] : make_uint2(0, 0);
                k = make_uint4(h.x << 16, h.x & 0xffff0000u, h.y << 16, h.y & 0xffff0000u);
            } else {
                k = e < hi ? kv[e / 4] : make_uint4(0, 0, 0, 0);
            }
            in[0] = e < hi && k.x >= prefix;
            in[1] = e + 1 < hi && k.y >= prefix;
            in[2] = e + 2 < hi && k.z >= prefix;
            in[3] = e + 3 < hi && k.w >= prefix;
        };
        uint32_t n = 0;
        for (int e0 = lo; e0 < hi; e0 += 128) {
            bool in[4];
            at_or_above(e0, in);
#pragma unroll
            for (int j = 0; j < 4; ++j) n += __popc(__ballot_sync(0xffffffffu, in[j]));
        }
        if (lane == 0) s_warp2[warp][0] = n;
        __syncthreads();
        n = 0;
        for (int w = 0; w < warp; ++w) n += s_warp2[w][0];
        const uint32_t lt = lanemask_lt();
        const uint32_t list_addr = (uint32_t)__cvta_generic_to_shared(s_list);
        for (int e0 = lo; e0 < hi; e0 += 128) {
            bool in[4];
            at_or_above(e0, in);
            uint32_t m[4], before = n;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                m[j] = __ballot_sync(0xffffffffu, in[j]);
                before += __popc(m[j] & lt);
                n += __popc(m[j]);
            }
            // this lane's listed keys go after the lower lanes' (all four slots) and its own
            // lower slots
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                shared_store_u16_if(in[j], list_addr + 2 * before, (uint16_t)(e0 + 4 * lane + j));
                before += in[j];
            }
        }
        __syncthreads();
    }
    const int items = listed ? (int)(above0 + at) : count;
    if constexpr (kHalf) {
        // the listed elements' full keys (the scores were read once already: mostly from L2)
        if (listed) {
            for (int i = tid; i < items; i += BLOCK) s_lkey[i] = score_key(__ldg(x + s_list[i]));
            __syncthreads();
        }
    }
    // item i's full key (kHalf holds only the top halves: an unlisted element's key is
    // recomputed from its score)
    auto key_of = [&](int i) -> uint32_t {
        if constexpr (kHalf) return listed ? s_lkey[i] : score_key(__ldg(x + i));
        else return listed ? s_key[s_list[i]] : s_key[i];
    };
    // the remaining digits: bits 10..20 and 0..10 (bit 10 again: the prefix fixes it), or
    // (kHalf) 5..15 and 0..4
    constexpr int kShift1 = kHalf ? 5 : 10, kBits1 = 11, kBits2 = kHalf ? 5 : 11;
#pragma unroll 1
    for (int pass = 1; pass < 3 && !done; ++pass) {
        const int shift = pass == 1 ? kShift1 : 0, bits = pass == 1 ? kBits1 : kBits2;
        for (int i = tid; i < items; i += BLOCK) {
            const uint32_t k = key_of(i);
            if ((k & mask) == prefix) shared_add(hist_addr + ((k >> shift) & ((1u << bits) - 1u)) * 4, 1u);
        }
        done = select(shift, bits);
    }

    // Where this CTA's selected elements go: after every lower rank's.
    const uint32_t above = above_total();
    uint32_t above_lower = 0, at_lower = 0;
    if (csize > 1) {
        if (tid == 0) {
            s_count[0] = above;
            s_count[1] = at;
        }
        cluster_sync();
        if (tid < (int)csize) {
            const uint2 v = cluster_ld_v2(cluster_map(s_count, (uint32_t)tid));
            s_lower[tid][0] = v.x;
            s_lower[tid][1] = v.y;
        }
        __syncthreads();
        cluster_arrive();  // no remote reads after this: the others may exit once every CTA arrived
        for (uint32_t r = 0; r < crank; ++r) {
            above_lower += s_lower[r][0];
            at_lower += s_lower[r][1];
        }
    }
    const uint32_t my_need = need > at_lower ? min(need - at_lower, at) : 0u;
    int32_t* my_out = out + above_lower + min(at_lower, need);
    emit_segments<BLOCK>(
        items, prefix, mask, my_need,
        [&](int i, int32_t& idx) {
            const int e = listed ? (int)s_list[i] : i;
            idx = start + e;
            if constexpr (kHalf) {
                if (listed) return s_lkey[i];
                // the emission compares masked keys: a top half is enough while the mask is
                return (mask & 0xffffu) == 0 ? (uint32_t)s_key16[e] << 16 : score_key(__ldg(x + e));
            } else {
                return s_key[e];
            }
        },
        my_out, s_warp2);
    if (csize > 1) cluster_wait();
#else
    __trap();  // sm_80 launches topk_local (src/ops/topk.rs)
#endif
}

// ---------------------------------------------------------------------------------------------
// Pack: (score, global id) per local candidate; an unused or out-of-range index gives (-inf, -1).
// ---------------------------------------------------------------------------------------------
// A template only because the generated entry point calls `topk_pack<>(p)`.
template <typename = void>
__device__ __forceinline__ void topk_pack(const DcpTopkPackParams& p) {
    const int64_t n = (int64_t)p.rows * p.k;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = e / p.k;
        const int32_t l = ((const int32_t*)p.local_idx)[e];
        float score = -INFINITY;
        int32_t id = -1;
        if (l >= 0 && l < p.cols) {
            score = __ldg((const float*)p.scores + row * p.row_stride + l);
            const int64_t DI = (int64_t)p.dcp_size * p.interleave;
            id = (int32_t)((l / p.interleave) * DI + (int64_t)p.dcp_rank * p.interleave + l % p.interleave);
        }
        ((float*)p.cand_scores)[e] = score;
        ((int32_t*)p.cand_ids)[e] = id;
    }
}

// ---------------------------------------------------------------------------------------------
// Global merge: one CTA per row holds the row's D·K candidates in registers as 64-bit keys
// (score key, then ~id so that smaller ids rank higher). Valid candidates (id >= 0) have a key
// above zero; invalid ones hold 0 and are never counted. If at most K are valid they are all
// emitted; else a radix select over the 64-bit key finds the exact top K. Output in candidate
// order (rank-major).
// ---------------------------------------------------------------------------------------------
template <int D, int K>
__device__ __forceinline__ void topk_merge(const DcpTopkMergeParams& p) {
    constexpr int BLOCK = kMergeBlock, N = D * K, ITEMS = N / BLOCK, G = ITEMS <= 16 ? ITEMS : 8;
    static_assert(N % BLOCK == 0 && ITEMS % G == 0, "D*K must be a multiple of the merge block");
    static_assert(K < BLOCK || K % BLOCK == 0, "an item lies in one rank's list (the loads' addresses)");
    __shared__ uint32_t s_hist[kRadixBins];
    __shared__ uint32_t s_scan[2][G * BLOCK / 32 + 1];
    __shared__ uint32_t s_warp[BLOCK / 32 + 1];
    __shared__ uint32_t s_sel[3];

    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    int32_t* out = (int32_t*)p.out + (int64_t)row * K;
    const float* cs = (const float*)p.cand_scores;
    const int32_t* ci = (const int32_t*)p.cand_ids;

    // Every id and score of the thread is requested before any is used: one DRAM round trip, not
    // one per item (reading a score only for a valid id made its load wait for the id's).
    // With K ≥ BLOCK an item lies in one rank's list, so its address is one of D row bases plus a
    // constant: a few base registers instead of one 64-bit address per item (whose pressure made
    // ptxas hold some loads back until earlier ones had been used).
    const int64_t rank_stride = (int64_t)p.rows * K;
    const int32_t* ci_row = ci + (int64_t)row * K + tid;
    const float* cs_row = cs + (int64_t)row * K + tid;
    int32_t ids[ITEMS];
    float scores[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        // candidate index c = i·BLOCK + tid, rank-major: rank c / K, position c % K in its list
        int64_t off;
        if constexpr (K >= BLOCK) {
            off = (int64_t)(i / (K / BLOCK)) * rank_stride + (i % (K / BLOCK)) * BLOCK;
        } else {
            const int c = i * BLOCK + tid;
            off = (int64_t)(c / K) * rank_stride + c % K - tid;
        }
        ids[i] = __ldg(ci_row + off);
        scores[i] = __ldg(cs_row + off);
    }
    // The key is computed for every item and then selected (not computed under `ids[i] >= 0`, which
    // lets the compiler move the score's load into that branch, after the id has arrived).
    uint64_t key[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const uint64_t k = ((uint64_t)score_key(scores[i]) << 32) | (uint32_t)~(uint32_t)ids[i];
        key[i] = ids[i] >= 0 ? k : 0ull;
    }
    auto id_of = [](uint64_t k) { return (int32_t)~(uint32_t)k; };

    // Radix passes. If at most K candidates are valid (the first pass's histogram counts all of
    // them), all are emitted: with an empty mask every valid key equals the prefix and the first
    // K "equal" ones are taken. (A separate count of the valid ones cost a block scan: −1.5 to
    // −3% measured without it.)
    uint64_t prefix = 0, mask = 0;
    uint32_t need = K;
    {
#pragma unroll 1
        for (int pass = 0; pass < 6; ++pass) {
            // 11-bit digits at bits 53, 42, 32 (score key), then 21, 10, 0 (id key).
            const int shift = (pass < 3 ? 32 : 0) + (pass % 3 == 0 ? 21 : pass % 3 == 1 ? 10 : 0);
#pragma unroll
            for (int j = 0; j < kRadixBins / BLOCK; ++j) s_hist[j * BLOCK + tid] = 0;  // (launched with BLOCK threads)
            __syncthreads();
            if (pass < 3) {
                // A digit of the score key (shift ≥ 32): the key's high word alone (the mask's low
                // word is still zero, and a valid key's high word is never zero (score_key ≥
                // 0x007fffff), an invalid one's always).
                const uint32_t mhi = (uint32_t)(mask >> 32), phi = (uint32_t)(prefix >> 32);
#pragma unroll
                for (int i = 0; i < ITEMS; ++i) {
                    const uint32_t hi = (uint32_t)(key[i] >> 32);
                    if (hi != 0 && (hi & mhi) == phi)
                        atomicAdd(&s_hist[(hi >> (shift - 32)) & (kRadixBins - 1)], 1u);
                }
            } else {
#pragma unroll
                for (int i = 0; i < ITEMS; ++i)
                    if (key[i] != 0 && (key[i] & mask) == prefix)
                        atomicAdd(&s_hist[(uint32_t)(key[i] >> shift) & (kRadixBins - 1)], 1u);
            }
            __syncthreads();
            const uint32_t counted = select_digit<BLOCK>(s_hist, need, s_warp, s_sel);
            if (pass == 0 && counted <= (uint32_t)K) break;  // no digit was chosen: take every valid one
            const uint32_t digit = s_sel[0], bucket = s_sel[2];
            need = s_sel[1];
            prefix |= (uint64_t)digit << shift;
            mask |= (uint64_t)(kRadixBins - 1) << shift;
            __syncthreads();
            if (bucket == need) break;
        }
    }

    // Selected: valid and key above the prefix, or equal and among the first `need` in candidate
    // order (equal full keys only arise from duplicate (score, id) pairs). Scanned in groups of
    // G items (all of them up to 16: each group is one block scan with two barriers; 32 at once
    // spill, so D·K = 16,384 takes four groups of 8); candidate order is (item, thread), so
    // groups follow it.
    // Two forms of the emission: while the mask's low word is zero (at most three passes: the
    // score decided), the classes come from the key's high word alone.
    uint32_t gt0 = 0, eq0 = 0;
    auto emit = [&](auto score_only) {
        constexpr bool kScoreOnly = decltype(score_only)::value;
#pragma unroll
        for (int g = 0; g < ITEMS / G; ++g) {
            bool a[G], b[G];
#pragma unroll
            for (int j = 0; j < G; ++j) {
                if constexpr (kScoreOnly) {
                    const uint32_t hi = (uint32_t)(key[g * G + j] >> 32), hm = hi & (uint32_t)(mask >> 32),
                                   ph = (uint32_t)(prefix >> 32);
                    a[j] = hm > ph;  // (an invalid key's word is 0, never above the prefix's)
                    b[j] = hi != 0 && hm == ph;
                } else {
                    const uint64_t k = key[g * G + j] & mask;
                    a[j] = key[g * G + j] != 0 && k > prefix;
                    b[j] = key[g * G + j] != 0 && k == prefix;
                }
            }
            uint32_t before[G], tile;
            ordered_scan<BLOCK, G>(a, b, before, tile, s_scan[g & 1]);
#pragma unroll
            for (int j = 0; j < G; ++j) {
                const uint32_t gt = gt0 + (before[j] & 0xffffu), eq = eq0 + (before[j] >> 16);
                // one store, predicated: a branch a class made each item a divergent two-way block
                const uint32_t at = a[j] ? gt + min(eq, need) : gt + eq;
                if (a[j] || (b[j] && eq < need)) out[at] = id_of(key[g * G + j]);
            }
            gt0 += tile & 0xffffu;
            eq0 += tile >> 16;
        }
    };
    if ((uint32_t)mask == 0) emit(std::true_type{});
    else emit(std::false_type{});
    const uint32_t emitted = gt0 + min(eq0, need);
    for (int j = (int)emitted + tid; j < K; j += BLOCK) out[j] = -1;
}

// ---------------------------------------------------------------------------------------------
// Compact for rank r: keep ids owned by r, map to local() (or page·B + slot through the block
// table: a column at or beyond max_pages, a negative page or an int32 overflow gives -1 in
// place), stable-compact to the front, pad with -1, write the per-row count of kept ids.
// ---------------------------------------------------------------------------------------------
template <typename = void>
__device__ __forceinline__ void topk_compact(const DcpTopkCompactParams& p) {
    constexpr int BLOCK = kCompactBlock, ITEMS = kCompactItems;
    __shared__ uint32_t s_scan[2][ITEMS * BLOCK / 32 + 1];
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const int32_t* ids = (const int32_t*)p.ids + (int64_t)row * p.k;
    int32_t* out = (int32_t*)p.out + (int64_t)row * p.k;
    const int req = p.translate ? row / p.rows_per_request : 0;
    const int32_t* bt = (const int32_t*)p.block_table + (int64_t)req * p.block_table_stride;

    uint32_t done = 0;
    int it = 0;
    for (int base = 0; base < p.k; base += ITEMS * BLOCK, ++it) {
        bool a[ITEMS], b[ITEMS];
        int32_t val[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int e = base + i * BLOCK + tid;
            const int32_t id = e < p.k ? ids[e] : -1;
            a[i] = b[i] = false;
            val[i] = -1;
            if (id >= 0 && owner_of(id, p.dcp_size, p.interleave) == p.dcp_rank) {
                // An owned id always keeps its place; a failed translation leaves -1 there.
                a[i] = true;
                const int64_t l = local_of(id, p.dcp_size, p.interleave);
                if (!p.translate) {
                    val[i] = (int32_t)l;
                } else {
                    const int64_t col = l / p.block_size;
                    const int32_t page = col < p.max_pages ? bt[col] : -1;
                    const int64_t slot = (int64_t)page * p.block_size + l % p.block_size;
                    if (page >= 0 && slot <= INT32_MAX) val[i] = (int32_t)slot;
                }
            }
        }
        uint32_t before[ITEMS], total;
        ordered_scan<BLOCK, ITEMS>(a, b, before, total, s_scan[it & 1]);
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
            if (a[i]) out[done + (before[i] & 0xffffu)] = val[i];
        done += total & 0xffffu;
    }
    for (int j = (int)done + tid; j < p.k; j += BLOCK) out[j] = -1;
    if (tid == 0) ((int32_t*)p.counts)[row] = (int32_t)done;
}

}  // namespace dcp
