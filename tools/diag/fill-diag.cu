// Where the KV fill's time goes (a measurement, not part of the library; NOTES.md at 628d1db, ninth session):
// the fill kernel of kernels-src/fill.cuh against an empty kernel, a copy kernel of the same
// bytes and cudaMemcpyAsync, timed as `dcp-mla bench` times
// (events, L2 evicted by a 256 MiB read before each launch, median of 30 after 5).
// On the GPU machine, from the repository root:
//   nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -I kernels-src -o /tmp/fill-diag tools/diag/fill-diag.cu && /tmp/fill-diag
#include "fill.cuh"
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
using namespace dcp;
__global__ void empty_k() {}
__global__ void flush_k(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t a = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) { uint4 v = p[i]; a ^= v.x ^ v.w; }
  if (a == 0x12345678u) *sink = a;
}
template <KvFormat F> __global__ void __launch_bounds__(256) fill_k(const __grid_constant__ DcpKvFillParams p) { kv_fill<F>(p); }
// copy of the same bytes, no indirection: warp per 1152-byte row
__global__ void __launch_bounds__(256) rowcopy(const uint4* src, uint4* dst, int rows) {
  const int lane = threadIdx.x & 31; const int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (t >= rows) return;
  const uint4* s = src + t * 72; uint4* d = dst + t * 72;
  uint4 a = s[lane], b = s[lane + 32], c = lane < 8 ? s[lane + 64] : make_uint4(0,0,0,0);
  d[lane] = a; d[lane + 32] = b; if (lane < 8) d[lane + 64] = c;
}
int main() {
  size_t FL = 256u << 20; uint4* fl; cudaMalloc(&fl, FL); cudaMemset(fl, 0, FL); uint32_t* sink; cudaMalloc(&sink, 4);
  cudaStream_t s; cudaStreamCreate(&s); cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto time = [&](const char* name, auto&& f) {
    std::vector<float> v;
    for (int i = 0; i < 35; ++i) {
      flush_k<<<1056, 256, 0, s>>>(fl, FL / 16, sink);
      cudaEventRecord(e0, s); f(); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 5) v.push_back(ms * 1000);
    }
    std::sort(v.begin(), v.end()); printf("%-40s %8.2f us\n", name, v[v.size() / 2]);
  };
  time("empty kernel", [&] { empty_k<<<1, 32, 0, s>>>(); });
  time("two empty kernels", [&] { empty_k<<<1, 32, 0, s>>>(); empty_k<<<1, 32, 0, s>>>(); });
  for (int T : {128, 8192}) {
    int B = 64, pages = (T + B - 1) / B + 7;
    __nv_bfloat16 *ckv, *kpe; cudaMalloc(&ckv, (size_t)T * 512 * 2); cudaMalloc(&kpe, (size_t)T * 64 * 2);
    cudaMemset(ckv, 0x3c, (size_t)T * 1024); cudaMemset(kpe, 0x3c, (size_t)T * 128);
    std::vector<int> req(T, 0), pos(T), bt(pages);
    for (int i = 0; i < T; ++i) pos[i] = i;
    for (int i = 0; i < pages; ++i) bt[i] = (i * 5 + 3) % pages;
    int *dreq, *dpos, *dbt; cudaMalloc(&dreq, T * 4); cudaMalloc(&dpos, T * 4); cudaMalloc(&dbt, pages * 4);
    cudaMemcpy(dreq, req.data(), T * 4, cudaMemcpyHostToDevice); cudaMemcpy(dpos, pos.data(), T * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dbt, bt.data(), pages * 4, cudaMemcpyHostToDevice);
    void* cache; cudaMalloc(&cache, (size_t)pages * B * 1152);
    void* src2; cudaMalloc(&src2, (size_t)T * 1152); cudaMemset(src2, 1, (size_t)T * 1152);
    DcpKvFillParams p{}; p.ckv = (uint64_t)ckv; p.kpe = (uint64_t)kpe; p.req_idx = (uint64_t)dreq; p.positions = (uint64_t)dpos;
    p.block_table = (uint64_t)dbt; p.cache = (uint64_t)cache; p.ckv_stride = 512; p.kpe_stride = 64; p.block_table_stride = pages;
    p.num_tokens = T; p.batch = 1; p.max_pages = pages; p.num_pages = pages; p.block_size = B; p.dcp_size = 1; p.dcp_rank = 0; p.interleave = 1;
    int grid = (T * 32 + 255) / 256;
    char n[64];
    snprintf(n, 64, "fill bf16 T=%d", T); time(n, [&] { fill_k<KvFormat::Bf16><<<grid, 256, 0, s>>>(p); });
    snprintf(n, 64, "fill fp8 T=%d", T); time(n, [&] { fill_k<KvFormat::Fp8_656><<<grid, 256, 0, s>>>(p); });
    snprintf(n, 64, "rowcopy 1152B rows T=%d", T); time(n, [&] { rowcopy<<<grid, 256, 0, s>>>((const uint4*)src2, (uint4*)cache, T); });
    snprintf(n, 64, "cudaMemcpyAsync same bytes T=%d", T); time(n, [&] { cudaMemcpyAsync(cache, src2, (size_t)T * 1152, cudaMemcpyDeviceToDevice, s); });
    printf("   bytes (read+written) bf16 %.1f MB, fp8 %.1f MB\n", T * 2304 / 1e6, T * (1152 + 656) / 1e6);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
