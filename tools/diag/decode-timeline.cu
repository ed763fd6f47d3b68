// A decode CTA's timeline (a measurement, not part of the library; NOTES.md at 628d1db, nineteenth, twentieth
// and twenty-seventh sessions): times the lead or trio kernel of decode/sm90_trio.cuh
// standalone with `dcp-mla bench`'s method (events, L2 flushed by a 256 MiB read before each
// launch, median of 30 after 5), then records one flushed launch's per-CTA stamps and wait sums
// (the slots tools/diag/decode-timeline-stamp.py places) and prints each slot's spread over the CTAs.
// Sparse FP8 (default): b = 128 requests of 8,192 tokens (64-token pages, random distinct
// indices). Dense BF16 trio (-DDENSE): b = 128 requests of s_k tokens each, every row of a
// request at length s_k, 64-token pages in order, tiles by TMA, unsplit (a CTA per row block
// and request, as the bench's rows run when P aligns with the batch).
// On the GPU machine, from the repository root (a stamped copy of kernels-src first; without it,
// -I kernels-src gives the unstamped kernel's time alone):
//   python3 tools/diag/decode-timeline-stamp.py kernels-src /tmp/kst
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -I /tmp/kst \
//        -o /tmp/tl tools/diag/decode-timeline.cu          (sparse FP8 on lead)
//   /tmp/tl q K [timeline.txt] [heads]      (heads: 64 a row block; 128 runs two CTAs a row)
//   dense: -DDENSE (trio; -DSCHED=TrioSplit for trio_split), then /tmp/tl q s_k [timeline.txt] [heads]
//   [requests] [parts] (heads: any, e.g. 16, 64, 128; requests 128; parts 1, or P > 1 for a split
//   launch with its schedule kernel, e.g. `/tmp/tl 1 4096 t.txt 16 64 128` as the engine view's
//   b64 H16 4K row runs)
#include <cuda.h>
#include <cuda_bf16.h>
#include <cstring>
#include <string>
#include "timeline.cuh"
#include "decode/sm90_trio.cuh"
using namespace dcp;

#ifdef DENSE
#ifndef SCHED
#define SCHED Trio  // or -DSCHED=TrioSplit: P handed over in two halves
#endif
constexpr DecodeKv KV = DecodeKv::DenseBf16;
#else
#ifndef SCHED
#define SCHED Lead
#endif
constexpr DecodeKv KV = DecodeKv::SparseFp8;
#endif
constexpr bool kDense = KV == DecodeKv::DenseBf16;
// lead: a producer warpgroup and its stamps
constexpr bool kProducer = Sm90Schedule::SCHED == Sm90Schedule::Lead;
constexpr int THREADS = 384;
extern "C" __global__ void __launch_bounds__(THREADS) k_dec(const __grid_constant__ DcpMlaDecodeParams p) {
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        DCP_CTA_SLOT(15) = smid;
        DCP_TL(0);
    }
    mla_decode_sm90_trio<KV, 64, 2, Sm90Schedule::SCHED>(p);
}
// a split launch's schedule (the sequences' unit prefix), as the launcher runs it before the decode
extern "C" __global__ void __launch_bounds__(1024) k_sched(const __grid_constant__ DcpMlaDecodeParams p) {
    mla_decode_schedule(p);
}

// Dense: n bf16 values uniform in [-1, 1) from a hash of the index (the cache is 1.2 GB at
// s_k = 8192: made on the device, not copied from the host)
__global__ void fill_bf16(uint16_t* v, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        v[i] = __bfloat16_as_ushort(__float2bfloat16_rn((float)(x >> 40) / (float)(1u << 23) - 1.0f));
    }
}

// The dense cache's TMA map as the library's launcher encodes it (src/runtime/mod.rs
// tensor_map_bf16_2d): [rows, 576] bf16, boxes of 64 columns × 64 rows, 128B swizzle.
static void encode_kv_map(DcpMlaDecodeParams& p, void* cache, uint64_t rows) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (!fn || q != cudaDriverEntryPointSuccess) {
        fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
        exit(1);
    }
    using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                                const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static_assert(sizeof(CUtensorMap) == sizeof(p.kv_tmap), "a CUtensorMap is the params' 128 bytes");
    CUtensorMap map;
    const cuuint64_t dims[2] = {576, rows}, strides[1] = {576 * 2};
    const cuuint32_t box[2] = {64, 64}, elem[2] = {1, 1};
    const CUresult r = ((Encode)fn)(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, cache, dims, strides, box, elem,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
    memcpy(p.kv_tmap, &map, sizeof(map));
    p.kv_tma = 1;
}

static void launch(dim3 grid, dim3 blk, int smem, DcpMlaDecodeParams& p) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = blk;
    cfg.dynamicSmemBytes = smem;
    CK(cudaLaunchKernelEx(&cfg, k_dec, p));
}

// slots holding a sum of waits (µs) rather than a timestamp
static bool is_sum(int s) {
    return s == 13 || s == 14 || (!kProducer && s == 9) || (kProducer && s >= 21 && s <= 23);
}

int main(int argc, char** argv) {
    // sparse: q K; dense: q s_k (the second argument is the tokens a row attends to either way)
    // argv[5]: requests (128); argv[6]: KV parts P (1, unsplit; P > 1 runs the schedule kernel
    // before each decode launch, as the launcher does with DecodeSchedule::Compute)
    const int b = argc > 5 ? atoi(argv[5]) : 128, splits = argc > 6 ? atoi(argv[6]) : 1;
    const int q = argc > 1 ? atoi(argv[1]) : 2, h = argc > 4 ? atoi(argv[4]) : 64,
              k = argc > 2 ? atoi(argv[2]) : kDense ? 8192 : 2048;
    const char* tlout = argc > 3 ? argv[3] : nullptr;
    const int per_req = kDense ? k : 8192, block = 64;
    const size_t rows = (size_t)b * q * h;
    void *dq, *dc, *dout, *dlse;
    DcpMlaDecodeParams p;
    memset(&p, 0, sizeof(p));
    if constexpr (kDense) {
        const int pages = (per_req + block - 1) / block;
        const size_t cache_rows = (size_t)b * pages * block;
        CK(cudaMalloc(&dq, rows * 576 * 2));
        CK(cudaMalloc(&dc, cache_rows * 576 * 2));
        fill_bf16<<<1024, 256>>>((uint16_t*)dq, rows * 576, 1);
        fill_bf16<<<1024, 256>>>((uint16_t*)dc, cache_rows * 576, 2);
        CK(cudaGetLastError());
        std::vector<int> table((size_t)b * pages), lens((size_t)b * q, per_req);
        for (size_t i = 0; i < table.size(); ++i) table[i] = (int)i;
        void *dt, *dl;
        CK(cudaMalloc(&dt, table.size() * 4));
        CK(cudaMalloc(&dl, lens.size() * 4));
        CK(cudaMemcpy(dt, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dl, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
        p.block_table = (uint64_t)dt;
        p.lens = (uint64_t)dl;
        p.block_table_stride = pages;
        p.max_pages = pages;
        p.num_pages = b * pages;
        encode_kv_map(p, dc, cache_rows);
    } else {
        const size_t cache_bytes = (size_t)b * per_req * 656;
        std::vector<uint16_t> hq(rows * 576);
        for (auto& x : hq) x = 0x3f00 | (next() & 0x7f);  // bf16 in [0.5, 1)
        std::vector<unsigned char> hc(cache_bytes);
        for (size_t r = 0; r < (size_t)b * per_req; ++r) {
            unsigned char* row = hc.data() + r * 656;
            for (int i = 0; i < 512; ++i) row[i] = (unsigned char)(next() & 0x77);  // e4m3, no NaN
            float sc[4] = {0.0625f, 0.125f, 0.0625f, 0.125f};
            memcpy(row + 512, sc, 16);
            for (int i = 0; i < 64; ++i) {
                uint16_t v = 0x3c00 | (next() & 0x7f);
                memcpy(row + 528 + 2 * i, &v, 2);
            }
        }
        std::vector<int> idx((size_t)b * q * k);
        std::vector<int> slots(per_req);
        for (int i = 0; i < per_req; ++i) slots[i] = i;
        for (int i = 0; i < b * q; ++i) {
            for (int j = 0; j < k; ++j) {
                int pick = j + next() % (per_req - j);
                std::swap(slots[j], slots[pick]);
            }
            for (int j = 0; j < k; ++j) idx[(size_t)i * k + j] = slots[j] + (i / q) * per_req;
        }
        void* di;
        CK(cudaMalloc(&dq, hq.size() * 2));
        CK(cudaMalloc(&dc, cache_bytes));
        CK(cudaMalloc(&di, idx.size() * 4));
        CK(cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dc, hc.data(), cache_bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(di, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
        p.indices = (uint64_t)di;
        p.topk_len = 0;
        p.num_pages = b * per_req / block;
        p.topk = k;
    }
    CK(cudaMalloc(&dout, rows * 512 * 2));
    CK(cudaMalloc(&dlse, rows * 4));
    p.q = (uint64_t)dq;
    p.cache = (uint64_t)dc;
    p.out = (uint64_t)dout;
    p.lse = (uint64_t)dlse;
    p.scale_log2 = 0.0416667f * 1.4426950408889634f;
    p.batch = b;
    p.nq = q;
    p.heads = h;
    p.block_size = block;
    // as src/ops/decode.rs fills them for contiguous tensors and local lengths (one rank)
    p.q_stride_h = 576, p.q_stride_s = (int64_t)h * 576, p.q_stride_b = (int64_t)q * h * 576;
    p.out_stride_h = 512, p.out_stride_s = (int64_t)h * 512, p.out_stride_b = (int64_t)q * h * 512;
    p.lse_stride_h = 1, p.lse_stride_s = h, p.lse_stride_b = (int64_t)q * h;
    p.len_stride_s = 1, p.len_stride_b = q;
    p.indices_stride_s = k, p.indices_stride_b = (int64_t)q * k;
    p.page_rows = block;
    p.dcp_cycle = 1, p.dcp_interleave = 1;
    if (h >= 2) {  // high_word_divisor: umulhi(x, magic) >> shift = x / h
        int l = 0;
        while ((1ull << l) < (unsigned long long)h) ++l;
        p.heads_magic = (uint32_t)(((1ull << (31 + l)) + h - 1) / h);
        p.heads_shift = l - 1;
    }
    p.num_splits = splits;
    p.sched_tile = 64;
    if (splits > 1) {
        // the workspace as planner::split lays it out: prefix, stamp, partial out, partial lse
        const size_t seqs = kDense ? b : (size_t)b * q, rows_per_seq = kDense ? (size_t)q * h : h;
        const size_t stamp = ((seqs + 1) * 8 + 15) / 16 * 16, out = (stamp + 16 + 127) / 128 * 128;
        const size_t lse = out + 2 * (size_t)splits * rows_per_seq * 512 * 4;
        void* ws;
        CK(cudaMalloc(&ws, lse + 2 * (size_t)splits * rows_per_seq * 4));
        p.sched = (uint64_t)ws;
        p.sched_stamp = (uint64_t)ws + stamp;
        p.ws_out = (uint64_t)ws + out;
        p.ws_lse = (uint64_t)ws + lse;
    }
    p.out_f32 = 0;
    const int smem = decode_sm90::shared_bytes<KV, 64, 2, Sm90Schedule::SCHED>();
    CK(cudaFuncSetAttribute(k_dec, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // sparse: (query row, head block) pairs along x; dense: the request's row blocks of q·H rows
    // a split launch: parts along z, each over the whole batch's units (the launcher's grid)
    dim3 grid(kDense ? (q * h + 63) / 64 : q * ((h + 63) / 64), splits > 1 ? 1 : b, splits), blk(THREADS);
    auto run = [&] {
        if (splits > 1) k_sched<<<1, 1024>>>(p);
        launch(grid, blk, smem, p);
    };
    FlushedTimer timer;
    float min_us;
    const float med = timer.median(run, &min_us);
    printf("%s q=%d %s=%d H=%d b=%d parts=%d grid=%dx%dx%d smem=%d median %.1f us (min %.1f, schedule included)\n",
           kDense ? "dense" : "sparse", q, kDense ? "s_k" : "K", k, h, b, splits, grid.x, grid.y, grid.z, smem, med, min_us);
    // timeline of one flushed launch; a CTA's
    // slots hold its last piece's stamps where it runs several
    clear_slots();
    timer.once(run);
    const std::vector<unsigned long long> tl = read_slots();
    const int ctas = grid.x * grid.y * grid.z;
    unsigned long long t0 = ~0ull, tend = 0;
    for (int c = 0; c < ctas; ++c) {
        t0 = std::min(t0, tl[c * NSLOT]);
        for (int s = 0; s < NSLOT; ++s)
            if (s != 15 && tl[c * NSLOT + s] && !is_sum(s)) tend = std::max(tend, tl[c * NSLOT + s]);
    }
    printf("timeline: first entry to last stamp %.2f us\n", (tend - t0) / 1000.0);
    // per slot: distribution relative to the CTA's own entry, and of entry relative to t0
    // lead's producer stamp slots 1, 2 and 9; trio uses 9 for a sum
    // slot 15 is the CTA's SM; 16-20 lead's producer's first piece, 21-23 lead's sums of the
    // scorer's tile waits, the producer's buffer waits and its fills (decode-timeline-stamp.py)
    const char* names[24] = {"entry", "scorer Q issued", "prod fill0 arrived",
                             "scorer full0", "scorer P0", "pv1 PV0 done", "scorer loop end", "pv1 loop end", "pv1 end",
                             kProducer ? "prod loop end" : "SUM scorer full",
                             "pv1 first p_full", "pv1 last p_full", "scorer last full", "SUM pv1 p_full", "SUM pv1 full",
                             nullptr, "prod lengths read", "prod idx0 landed", "prod fill0 batch0", "prod fill0 batch2",
                             "prod piece entry", kProducer ? "SUM scorer full" : nullptr,
                             kProducer ? "SUM prod empty" : nullptr, kProducer ? "SUM prod fill" : nullptr};
    for (int s = 0; s < 24; ++s) {
        if (!names[s]) continue;
        std::vector<double> rel, abs_;
        for (int c = 0; c < ctas; ++c) {
            if (!tl[c * NSLOT + s]) continue;
            rel.push_back(is_sum(s) ? tl[c * NSLOT + s] / 1000.0 : (tl[c * NSLOT + s] - tl[c * NSLOT]) / 1000.0);
            abs_.push_back(is_sum(s) ? 0.0 : (tl[c * NSLOT + s] - t0) / 1000.0);
        }
        if (rel.empty()) continue;
        std::sort(rel.begin(), rel.end());
        std::sort(abs_.begin(), abs_.end());
        auto pc = [](std::vector<double>& v, double f) { return v[(size_t)(f * (v.size() - 1))]; };
        printf("%-20s n=%4zu  rel min %7.2f p50 %7.2f p90 %7.2f max %7.2f | abs min %7.2f p50 %7.2f max %7.2f\n", names[s],
               rel.size(), rel[0], pc(rel, 0.5), pc(rel, 0.9), rel.back(), abs_[0], pc(abs_, 0.5), abs_.back());
    }
    if (tlout) {
        FILE* f = fopen(tlout, "w");
        for (int c = 0; c < ctas; ++c) {
            fprintf(f, "%d", c);
            for (int s = 0; s < NSLOT; ++s) fprintf(f, " %lld", s == 15 || is_sum(s) ? (long long)tl[c * NSLOT + s] : tl[c * NSLOT + s] ? (long long)(tl[c * NSLOT + s] - t0) : -1);
            fprintf(f, "\n");
        }
        fclose(f);
    }
    return 0;
}
