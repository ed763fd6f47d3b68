// Where a global-merge CTA's time goes (a measurement, not part of the library; NOTES.md at 628d1db,
// twenty-second session): times topk_merge<4, 2048> standalone with `dcp-mla bench`'s method
// (events, L2 flushed by a 256 MiB read before each launch, median of 30 after 5) on the bench's
// candidates (128 rows; scores uniform in [-1, 1), distinct ids), then records one flushed
// launch's per-CTA stamps (tools/diag/topk-merge-stamp.py places them) and prints each slot's spread.
// On the GPU machine, from the repository root:
//   python3 tools/diag/topk-merge-stamp.py kernels-src /tmp/kst
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -I /tmp/kst \
//        -o /tmp/tm tools/diag/topk-merge-timeline.cu && /tmp/tm
// (-I kernels-src instead gives the unstamped kernel's time alone.)
#define TL_MAX_CTAS 1024
#include "timeline.cuh"
#include "abi.h"
#include "topk.cuh"

constexpr int D = 4, K = 2048, ROWS = 128;
extern "C" __global__ void __launch_bounds__(dcp::kMergeBlock) k_merge(const __grid_constant__ DcpTopkMergeParams p) {
    if (threadIdx.x == 0) DCP_TL(0);
    dcp::topk_merge<D, K>(p);
    if (threadIdx.x == 0) DCP_TL(4);
}
// A launch that only enters and leaves: the method's floor.
extern "C" __global__ void k_empty() {}

int main() {
    const size_t n = (size_t)D * ROWS * K;
    std::vector<float> cs(n);
    std::vector<int> ci(n);
    for (int r = 0; r < D; ++r)
        for (int row = 0; row < ROWS; ++row)
            for (int j = 0; j < K; ++j) {
                const size_t e = ((size_t)r * ROWS + row) * K + j;
                cs[e] = (float)(next() >> 40) / (float)(1u << 23) - 1.0f;
                ci[e] = j * 4 * D + r;
            }
    void *dcs, *dci, *dout;
    CK(cudaMalloc(&dcs, n * 4));
    CK(cudaMalloc(&dci, n * 4));
    CK(cudaMalloc(&dout, (size_t)ROWS * K * 4));
    CK(cudaMemcpy(dcs, cs.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dci, ci.data(), n * 4, cudaMemcpyHostToDevice));
    DcpTopkMergeParams p{};
    p.cand_scores = (uint64_t)dcs;
    p.cand_ids = (uint64_t)dci;
    p.out = (uint64_t)dout;
    p.rows = ROWS;
    FlushedTimer timer;
    auto timed = [&](auto launch, const char* what) {
        float min_us;
        const float med = timer.median(launch, &min_us);
        printf("%-28s median %.2f us (min %.2f)\n", what, med, min_us);
    };
    timed([&] { k_empty<<<ROWS, dcp::kMergeBlock>>>(); }, "empty kernel, same grid");
    timed([&] { k_merge<<<ROWS, dcp::kMergeBlock>>>(p); }, "topk_merge D=4 K=2048");

    // The output's checksum: two builds of the kernel (a change and HEAD) must print the same.
    {
        std::vector<int> got((size_t)ROWS * K);
        CK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
        unsigned long long h = 1469598103934665603ull;
        for (int v : got) h = (h ^ (unsigned)v) * 1099511628211ull;
        printf("output checksum %016llx\n", h);
    }
    // One flushed launch's stamps.
    clear_slots();
    const float us = timer.once([&] { k_merge<<<ROWS, dcp::kMergeBlock>>>(p); });
    const std::vector<unsigned long long> tl = read_slots();
    unsigned long long first = ~0ull, last = 0;
    for (int b = 0; b < ROWS; ++b) {
        first = std::min(first, tl[b * NSLOT + 0]);
        last = std::max(last, tl[b * NSLOT + 4]);
    }
    printf("stamped launch %.2f us by events; first entry to last exit %.2f us\n", us, (last - first) / 1e3);
    const char* names[] = {"entry (from the first CTA's)", "valid count (loads landed)", "radix passes done",
                           "emission done", "exit"};
    for (int s = 0; s <= 4; ++s) {
        std::vector<double> rel, abs_;
        for (int b = 0; b < ROWS; ++b) {
            rel.push_back((tl[b * NSLOT + s] - tl[b * NSLOT + (s ? s - 1 : 0)]) / 1e3);
            abs_.push_back((tl[b * NSLOT + s] - first) / 1e3);
        }
        std::sort(rel.begin(), rel.end());
        std::sort(abs_.begin(), abs_.end());
        printf("slot %d %-30s since previous slot: min %.2f med %.2f max %.2f | since first entry: min %.2f med %.2f max %.2f\n",
               s, names[s], rel[0], rel[ROWS / 2], rel[ROWS - 1], abs_[0], abs_[ROWS / 2], abs_[ROWS - 1]);
    }
    std::vector<unsigned long long> passes;
    for (int b = 0; b < ROWS; ++b) passes.push_back(tl[b * NSLOT + 8]);
    std::sort(passes.begin(), passes.end());
    printf("radix passes a CTA: min %llu med %llu max %llu\n", passes[0], passes[ROWS / 2], passes[ROWS - 1]);
    return 0;
}
