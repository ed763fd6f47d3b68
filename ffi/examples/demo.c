/* A C client of dcp-mla: one DCP decode step for D = 2 simulated on one GPU.
 *
 * KV fill on both ranks, dense decode of each rank's shard (f32 out), the two-way merge that
 * combines the shards, then a check against attention over all tokens computed here on the host.
 *
 * Build from the repository root, into target/ (tests/c_demo.rs does the same):
 *   cargo build --release -p dcp-mla-ffi
 *   cc ffi/examples/demo.c -I ffi/include -o target/release/dcp_mla_demo
 *     target/release/libdcp_mla_ffi.a -lpthread -ldl -lm     (one command)
 * Exit status: 0 checked on a GPU, 2 no device (the message is printed), 1 any other failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_mla.h"

#define D_QK 576
#define D_V 512

static DcpMlaDevice *dev = NULL;

static void check(DcpMlaStatus s, const char *what) {
  if (s != DCP_MLA_STATUS_SUCCESS) {
    fprintf(stderr, "%s failed: %s: %s\n", what, dcp_mla_status_name(s), dcp_mla_last_error());
    exit(1);
  }
}
#define CHECK(call) check((call), #call)

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (no NaN here) */
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* [-1, 1) */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return (float)((rng * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1u << 23) - 1.0f;
}

/* A contiguous tensor (no strides: num_strides 0 is each field's default layout). */
static DcpMlaTensor tensor(void *data, size_t numel, int32_t dtype) {
  DcpMlaTensor t = {0};
  t.data = data;
  t.numel = numel;
  t.dtype = dtype;
  return t;
}

static void *upload(const void *host, size_t bytes) {
  void *p = NULL;
  CHECK(dcp_mla_malloc(dev, bytes, &p));
  CHECK(dcp_mla_memcpy_htod(dev, p, host, bytes));
  return p;
}

int main(void) {
  printf("dcp-mla %s (ABI %u), %zu kernel variants\n", dcp_mla_version(), dcp_mla_abi_version(),
         dcp_mla_variant_count());

  /* Argument errors are reported before any device is needed, naming the argument. */
  DcpMlaStatus s = dcp_mla_check_topk(1, 256);
  printf("check_topk(D=1, K=256): %s: %s\n", dcp_mla_status_name(s), dcp_mla_last_error());
  if (s != DCP_MLA_STATUS_INVALID_CONFIG) return 1;

  s = dcp_mla_device_open(0, &dev);
  if (s == DCP_MLA_STATUS_NO_DEVICE) {
    printf("dcp_mla_device_open: %s: %s\n", dcp_mla_status_name(s), dcp_mla_last_error());
    return 2;
  }
  check(s, "dcp_mla_device_open");

  /* D = 2 ranks, interleave 1, pages of 16 tokens, one request of 100 tokens, 16 heads. */
  const size_t D = 2, I = 1, B = 16, L = 100, H = 16;
  uint64_t pages = 0;
  CHECK(dcp_mla_pages_for(D, B, L, &pages));
  const int32_t table[4] = {3, 1, 0, 2}; /* a permuted block table, shared by both ranks */
  if (pages != 4) return 1;

  uint16_t *ckv = malloc(L * D_V * 2), *kpe = malloc(L * 64 * 2), *q = malloc(H * D_QK * 2);
  int32_t *req = malloc(L * 4), *pos = malloc(L * 4);
  for (size_t i = 0; i < L * D_V; i++) ckv[i] = to_bf16(uniform());
  for (size_t i = 0; i < L * 64; i++) kpe[i] = to_bf16(uniform());
  for (size_t i = 0; i < H * D_QK; i++) q[i] = to_bf16(uniform());
  for (size_t t = 0; t < L; t++) {
    req[t] = 0;
    pos[t] = (int32_t)t;
  }
  void *d_ckv = upload(ckv, L * D_V * 2), *d_kpe = upload(kpe, L * 64 * 2), *d_q = upload(q, H * D_QK * 2);
  void *d_req = upload(req, L * 4), *d_pos = upload(pos, L * 4), *d_table = upload(table, sizeof table);
  const float scale = dcp_mla_default_scale();

  void *d_out[2], *d_lse[2];
  for (size_t r = 0; r < D; r++) {
    size_t cache_bytes = pages * B * D_QK * 2;
    void *d_cache = NULL;
    CHECK(dcp_mla_malloc(dev, cache_bytes, &d_cache));
    CHECK(dcp_mla_memset(dev, d_cache, 0, cache_bytes));
    /* One argument struct per operation: zero it, set struct_size, then the fields used (a field
       left zero takes its default: here the contiguous strides, packed pages, the default stream). */
    DcpMlaKvFillArgs fill = {0};
    fill.struct_size = sizeof fill;
    fill.device = dev;
    fill.ckv = tensor(d_ckv, L * D_V, DCP_MLA_DTYPE_BF16);
    fill.kpe = tensor(d_kpe, L * 64, DCP_MLA_DTYPE_BF16);
    fill.req_idx = tensor(d_req, L, DCP_MLA_DTYPE_I32);
    fill.positions = tensor(d_pos, L, DCP_MLA_DTYPE_I32);
    fill.block_table = tensor(d_table, 4, DCP_MLA_DTYPE_I32);
    fill.batch = 1;
    fill.max_pages = 4;
    fill.cache = tensor(d_cache, cache_bytes, DCP_MLA_DTYPE_U8);
    fill.num_pages = pages;
    fill.block_size = B;
    fill.format = DCP_MLA_KV_BF16;
    fill.dcp_size = D;
    fill.interleave = I;
    fill.rank = r;
    CHECK(dcp_mla_launch_kv_fill(&fill));
    uint64_t n = 0;
    CHECK(dcp_mla_local_len(D, I, r, L, &n));
    int32_t len = (int32_t)n;
    void *d_len = upload(&len, 4);
    CHECK(dcp_mla_malloc(dev, H * D_V * 4, &d_out[r]));
    CHECK(dcp_mla_malloc(dev, H * 4, &d_lse[r]));
    DcpMlaDecodeDenseArgs dec = {0};
    dec.struct_size = sizeof dec;
    dec.device = dev;
    dec.q = tensor(d_q, H * D_QK, DCP_MLA_DTYPE_BF16);
    dec.out = tensor(d_out[r], H * D_V, DCP_MLA_DTYPE_F32);
    dec.lse = tensor(d_lse[r], H, DCP_MLA_DTYPE_F32);
    dec.cache = tensor(d_cache, cache_bytes, DCP_MLA_DTYPE_U8);
    dec.block_table = tensor(d_table, 4, DCP_MLA_DTYPE_I32);
    dec.lens = tensor(d_len, 1, DCP_MLA_DTYPE_I32);
    dec.batch = 1;
    dec.num_q = 1;
    dec.heads = H;
    dec.num_splits = 1; /* one split: no workspace */
    dec.num_pages = pages;
    dec.block_size = B;
    dec.max_pages = 4;
    dec.scale = scale;
    dec.lens_rule = DCP_MLA_LENS_LOCAL; /* this rank's own lengths (dcp_size, interleave, rank unread) */
    CHECK(dcp_mla_launch_decode_dense(&dec));
    CHECK(dcp_mla_synchronize(dev));
    CHECK(dcp_mla_free(dev, d_len));
    CHECK(dcp_mla_free(dev, d_cache));
  }

  /* The DCP combine of two shards is the two-way merge. */
  void *d_merged = NULL, *d_mlse = NULL;
  CHECK(dcp_mla_malloc(dev, H * D_V * 4, &d_merged));
  CHECK(dcp_mla_malloc(dev, H * 4, &d_mlse));
  DcpMlaMergeTwoArgs merge = {0};
  merge.struct_size = sizeof merge;
  merge.device = dev;
  merge.out_a = tensor(d_out[0], H * D_V, DCP_MLA_DTYPE_F32);
  merge.lse_a = tensor(d_lse[0], H, DCP_MLA_DTYPE_F32);
  merge.out_b = tensor(d_out[1], H * D_V, DCP_MLA_DTYPE_F32);
  merge.lse_b = tensor(d_lse[1], H, DCP_MLA_DTYPE_F32);
  merge.out = tensor(d_merged, H * D_V, DCP_MLA_DTYPE_F32);
  merge.lse = tensor(d_mlse, H, DCP_MLA_DTYPE_F32);
  merge.rows = H;
  merge.lse_a_base = DCP_MLA_LSE_BASE_E;
  merge.lse_b_base = DCP_MLA_LSE_BASE_E;
  CHECK(dcp_mla_launch_merge_two(&merge));
  CHECK(dcp_mla_synchronize(dev));
  float *out = malloc(H * D_V * 4), lse[16];
  CHECK(dcp_mla_memcpy_dtoh(dev, out, d_merged, H * D_V * 4));
  CHECK(dcp_mla_memcpy_dtoh(dev, lse, d_mlse, H * 4));

  /* Host attention over all L tokens, in double. */
  double sum_dev = 0, sum_host = 0, sum_abs = 0, max_err = 0, max_lse_err = 0;
  int bad = 0;
  double *s_t = malloc(L * sizeof(double));
  for (size_t h = 0; h < H; h++) {
    double m = -INFINITY, S = 0;
    for (size_t t = 0; t < L; t++) {
      double dot = 0;
      for (size_t d = 0; d < D_V; d++) dot += (double)from_bf16(q[h * D_QK + d]) * from_bf16(ckv[t * D_V + d]);
      for (size_t d = 0; d < 64; d++) dot += (double)from_bf16(q[h * D_QK + D_V + d]) * from_bf16(kpe[t * 64 + d]);
      s_t[t] = scale * dot;
      if (s_t[t] > m) m = s_t[t];
    }
    for (size_t t = 0; t < L; t++) S += exp(s_t[t] - m);
    double want_lse = m + log(S), e = fabs(want_lse - lse[h]);
    if (e > max_lse_err) max_lse_err = e;
    if (e > 1e-4) bad = 1;
    for (size_t d = 0; d < D_V; d++) {
      /* o and A = the softmax-weighted mean of |v|: docs/contract.md §9 allows |err| <= 2^-6 * A */
      double o = 0, a = 0;
      for (size_t t = 0; t < L; t++) {
        double v = from_bf16(ckv[t * D_V + d]), p = exp(s_t[t] - m) / S;
        o += p * v;
        a += p * fabs(v);
      }
      double got = out[h * D_V + d], err = fabs(got - o);
      sum_dev += got;
      sum_host += o;
      sum_abs += fabs(o);
      if (err > max_err) max_err = err;
      if (err > a / 64) bad = 1;
    }
  }
  int sum_ok = fabs(sum_dev - sum_host) <= 1e-3 * (sum_abs + 1);
  printf("checksum device=%.6f host=%.6f, max |out err|=%.3g, max |lse err|=%.3g: %s\n", sum_dev, sum_host, max_err,
         max_lse_err, (!bad && sum_ok) ? "checksum ok" : "MISMATCH");

  void *bufs[] = {d_ckv, d_kpe, d_q, d_req, d_pos, d_table, d_out[0], d_out[1], d_lse[0], d_lse[1], d_merged, d_mlse};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CHECK(dcp_mla_free(dev, bufs[i]));
  CHECK(dcp_mla_device_close(dev));
  free(ckv);
  free(kpe);
  free(q);
  free(req);
  free(pos);
  free(out);
  free(s_t);
  return (!bad && sum_ok) ? 0 : 1;
}
