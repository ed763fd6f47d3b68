/* The C ABI driven from C with hostile sizes and pointers (issue 16): every planner size query
 * with a product that wraps 64 bits returns DCP_MLA_STATUS_INVALID_ARGUMENT with a message that
 * names the argument, a null out-pointer returns DCP_MLA_STATUS_NULL_POINTER naming it, and a
 * valid call right after each refusal still answers (and clears the last error). The launchers
 * refuse a null device by name. With `--device` (a GPU run) it opens device 0 (failing if it cannot)
 * and drives the launchers (top-k, fill, dense and MODEL1 decode, two-way merge) with wrapped sizes
 * (INVALID_ARGUMENT), null buffers (NULL_POINTER) and misaligned ones (MISALIGNED), each naming
 * the argument and refused before anything is launched, then a valid top-k whose result is
 * checked. (A launcher looks up its device before its sizes, so those checks need one.)
 * Exit status 0 when every check holds; every failing check is printed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_mla.h"

static int failures = 0;

static void expect(const char *what, enum DcpMlaStatus got, enum DcpMlaStatus want, const char *needle) {
  const char *msg = dcp_mla_last_error();
  if (got != want || (needle && !strstr(msg, needle))) {
    fprintf(stderr, "FAIL %s: %s (%s), want %s naming %s\n", what, dcp_mla_status_name(got), msg,
            dcp_mla_status_name(want), needle ? needle : "-");
    failures++;
  }
}

/* A buffer at a fake device address: never dereferenced, every call that gets one is refused first. */
static DcpMlaTensor fake(uintptr_t addr, size_t numel, int32_t dtype) {
  DcpMlaTensor t = {0};
  t.data = (void *)addr;
  t.numel = numel;
  t.dtype = dtype;
  return t;
}

/* q with its 3 strides (NULL: contiguous, no strides). */
static DcpMlaTensor with_strides(DcpMlaTensor t, const size_t *strides, uint32_t n) {
  if (strides) {
    t.num_strides = n;
    for (uint32_t i = 0; i < n; i++) t.strides[i] = strides[i];
  }
  return t;
}

static DcpMlaTopkLocalArgs topk(const DcpMlaDevice *dev, DcpMlaTensor scores, size_t row_stride, size_t cols,
                                DcpMlaTensor lens, size_t rows, size_t k, DcpMlaTensor out) {
  DcpMlaTopkLocalArgs a = {0};
  a.struct_size = sizeof a;
  a.device = dev;
  a.scores = with_strides(scores, &row_stride, 1);
  a.lens = lens;
  a.out = out;
  a.cols = cols;
  a.rows = rows;
  a.k = k;
  return a;
}

static enum DcpMlaStatus topk_local(const DcpMlaDevice *dev, DcpMlaTensor scores, size_t row_stride, size_t cols,
                                    DcpMlaTensor lens, size_t rows, size_t k, DcpMlaTensor out) {
  DcpMlaTopkLocalArgs a = topk(dev, scores, row_stride, cols, lens, rows, k, out);
  return dcp_mla_launch_topk_local(&a);
}

static DcpMlaMergeTwoArgs merge(const DcpMlaDevice *dev, DcpMlaTensor lse_b, size_t rows, int32_t base_b) {
  DcpMlaMergeTwoArgs a = {0};
  a.struct_size = sizeof a;
  a.device = dev;
  a.out_a = fake(0x50000000, 512, DCP_MLA_DTYPE_F32);
  a.lse_a = fake(0x51000000, 1, DCP_MLA_DTYPE_F32);
  a.out_b = fake(0x52000000, 512, DCP_MLA_DTYPE_F32);
  a.lse_b = lse_b;
  a.out = fake(0x54000000, 512, DCP_MLA_DTYPE_F32);
  a.lse = fake(0x55000000, 1, DCP_MLA_DTYPE_F32);
  a.rows = rows;
  a.lse_a_base = DCP_MLA_LSE_BASE_E;
  a.lse_b_base = base_b;
  return a;
}

/* A dense decode of one request of `heads` heads over a 4-page cache, with everything but q, its
   strides, the head count and the page stride fixed (fake buffers, refused before any use). */
static enum DcpMlaStatus dense(const DcpMlaDevice *dev, DcpMlaTensor q, const size_t *q_strides, size_t heads,
                               size_t page_stride) {
  size_t stride = page_stride * 576; /* page_stride rows of 576 bf16 elements */
  DcpMlaDecodeDenseArgs a = {0};
  a.struct_size = sizeof a;
  a.device = dev;
  a.q = with_strides(q, q_strides, 3);
  a.out = fake(0x44000000, 64 * 512, DCP_MLA_DTYPE_BF16);
  a.lse = fake(0x45000000, 64, DCP_MLA_DTYPE_F32);
  a.cache = with_strides(fake(0x40000000, 4 * 64 * 576, DCP_MLA_DTYPE_BF16), page_stride ? &stride : NULL, 1);
  a.block_table = fake(0x41000000, 4, DCP_MLA_DTYPE_I32);
  a.lens = fake(0x42000000, 4, DCP_MLA_DTYPE_I32);
  a.batch = 1;
  a.num_q = 1;
  a.heads = heads;
  a.num_splits = 1;
  a.num_pages = 4;
  a.block_size = 64;
  a.max_pages = 1;
  a.scale = 0.04f;
  return dcp_mla_launch_decode_dense(&a);
}

/* kv_fill whose block table's (batch - 1) * stride + max_pages wraps */
static enum DcpMlaStatus fill_wrapped(const DcpMlaDevice *dev) {
  const size_t wrap = SIZE_MAX - 10;
  DcpMlaKvFillArgs a = {0};
  a.struct_size = sizeof a;
  a.device = dev;
  a.ckv = fake(0x20000000, 4 * 512, DCP_MLA_DTYPE_BF16);
  a.kpe = fake(0x21000000, 4 * 64, DCP_MLA_DTYPE_BF16);
  a.req_idx = fake(0x22000000, 4, DCP_MLA_DTYPE_I32);
  a.positions = fake(0x23000000, 4, DCP_MLA_DTYPE_I32);
  a.block_table = with_strides(fake(0x24000000, 16, DCP_MLA_DTYPE_I32), &wrap, 1);
  a.batch = 2;
  a.max_pages = 8;
  a.cache = fake(0x30000000, 8 * 64 * 1152, DCP_MLA_DTYPE_U8);
  a.num_pages = 8;
  a.block_size = 64;
  a.format = DCP_MLA_KV_BF16;
  a.dcp_size = 1;
  a.interleave = 1;
  return dcp_mla_launch_kv_fill(&a);
}

/* A MODEL1 decode of one request, 64 heads: a first cache of 4 pages of 64 tokens (37,440 bytes
   a page) holding `cache_numel` bytes, a second of 3 pages of 2 tokens `extra_stride` bytes apart
   (fake buffers: every call with them is refused before a launch). */
static enum DcpMlaStatus model1(const DcpMlaDevice *dev, size_t cache_numel, size_t extra_stride) {
  DcpMlaDecodeModel1Args a = {0};
  a.struct_size = sizeof a;
  a.device = dev;
  a.q = fake(0x43000000, 64 * 512, DCP_MLA_DTYPE_BF16);
  a.out = fake(0x44000000, 64 * 512, DCP_MLA_DTYPE_BF16);
  a.lse = fake(0x45000000, 64, DCP_MLA_DTYPE_F32);
  a.cache = fake(0x40000000, cache_numel, DCP_MLA_DTYPE_U8);
  a.indices = fake(0x41000000, 128, DCP_MLA_DTYPE_I32);
  a.extra_cache = with_strides(fake(0x46000000, 3 * 2304, DCP_MLA_DTYPE_U8), &extra_stride, 1);
  a.extra_indices = fake(0x47000000, 64, DCP_MLA_DTYPE_I32);
  a.batch = 1;
  a.num_q = 1;
  a.heads = 64;
  a.num_splits = 1;
  a.num_pages = 4;
  a.block_size = 64;
  a.topk = 128;
  a.extra_num_pages = 3;
  a.extra_block_size = 2;
  a.extra_topk = 64;
  return dcp_mla_launch_decode_model1(&a);
}

static void launcher_checks(const DcpMlaDevice *dev) {
  const size_t wrap = SIZE_MAX - 10;
  DcpMlaTensor lens2 = fake(0x10000000, 2, DCP_MLA_DTYPE_I32), out2 = fake(0x11000000, 2 * 256, DCP_MLA_DTYPE_I32);

  /* top-k: (rows - 1) * row_stride + cols wraps; a null and a misaligned score buffer */
  expect("topk_local, wrapped row_stride",
         topk_local(dev, fake(0x12000000, 1000, DCP_MLA_DTYPE_F32), wrap, 100, lens2, 2, 256, out2),
         DCP_MLA_STATUS_INVALID_ARGUMENT, "`scores`");
  expect("topk_local, null scores",
         topk_local(dev, fake(0, 1000, DCP_MLA_DTYPE_F32), 300, 300, lens2, 2, 256, out2),
         DCP_MLA_STATUS_NULL_POINTER, "`scores`");
  expect("topk_local, misaligned scores",
         topk_local(dev, fake(0x12000002, 1000, DCP_MLA_DTYPE_F32), 300, 300, lens2, 2, 256, out2),
         DCP_MLA_STATUS_MISALIGNED, "`scores`");
  expect("topk_local, rows past the output",
         topk_local(dev, fake(0x12000000, 1000, DCP_MLA_DTYPE_F32), 300, 300, lens2, 3, 256, out2),
         DCP_MLA_STATUS_INVALID_ARGUMENT, "`lens`");

  /* kv_fill: (batch - 1) * block_table_stride + max_pages wraps */
  expect("kv_fill, wrapped block_table_stride",
         fill_wrapped(dev),
         DCP_MLA_STATUS_INVALID_ARGUMENT, "block_table.strides");

  /* dense decode: batch * nq * heads * 576 wraps; a misaligned q; strided q: a head stride that
     is not a multiple of 8 elements, a view that runs past q's numel; a page stride below B */
  size_t odd_strides[3] = {64 * 576, 64 * 576, 580}, wide_strides[3] = {64 * 640, 64 * 640, 640};
  expect("decode_dense, wrapped heads", dense(dev, fake(0x43000000, 64 * 576, DCP_MLA_DTYPE_BF16), NULL, SIZE_MAX / 64, 0),
         DCP_MLA_STATUS_INVALID_ARGUMENT, "heads");
  expect("decode_dense, misaligned q", dense(dev, fake(0x43000002, 64 * 576, DCP_MLA_DTYPE_BF16), NULL, 64, 0),
         DCP_MLA_STATUS_MISALIGNED, "`q`");
  expect("decode_dense, q stride not 16-byte aligned",
         dense(dev, fake(0x43000000, 64 * 580, DCP_MLA_DTYPE_BF16), odd_strides, 64, 0), DCP_MLA_STATUS_MISALIGNED,
         "q.strides");
  expect("decode_dense, q view past its numel",
         dense(dev, fake(0x43000000, 64 * 576, DCP_MLA_DTYPE_BF16), wide_strides, 64, 0),
         DCP_MLA_STATUS_INVALID_ARGUMENT, "`q`");
  expect("decode_dense, page stride below the block size",
         dense(dev, fake(0x43000000, 64 * 576, DCP_MLA_DTYPE_BF16), NULL, 64, 32), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "cache.strides");

  /* MODEL1 decode: a first cache a byte short of its pages, a second whose pages are not a
     multiple of 576 bytes apart, a second whose pages overlap (a stride below a page) */
  expect("decode_model1, cache short", model1(dev, 4 * 37440 - 1, 2304), DCP_MLA_STATUS_INVALID_ARGUMENT, "`cache`");
  expect("decode_model1, extra stride not 576-aligned", model1(dev, 4 * 37440, 2000), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "extra_cache.strides");
  expect("decode_model1, extra pages overlap", model1(dev, 4 * 37440, 576), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "extra_cache.strides");

  /* two-way merge: rows * 512 wraps; a null lse */
  DcpMlaMergeTwoArgs m = merge(dev, fake(0x53000000, 1, DCP_MLA_DTYPE_F32), SIZE_MAX / 256, DCP_MLA_LSE_BASE_2);
  expect("merge_two, wrapped rows", dcp_mla_launch_merge_two(&m), DCP_MLA_STATUS_INVALID_ARGUMENT, "rows");
  m = merge(dev, fake(0, 1, DCP_MLA_DTYPE_F32), 1, DCP_MLA_LSE_BASE_E);
  expect("merge_two, null lse_b", dcp_mla_launch_merge_two(&m), DCP_MLA_STATUS_NULL_POINTER, "`lse_b`");

  /* a valid top-k after the refusals: 2 rows of 300 scores s[i] = i, K = 256 */
  enum { COLS = 300, K = 256 };
  float *scores = malloc(2 * COLS * sizeof(float));
  int32_t lens[2] = {COLS, 100}, out[2 * K];
  for (int i = 0; i < 2 * COLS; i++) scores[i] = (float)(i % COLS);
  void *d_scores = NULL, *d_lens = NULL, *d_out = NULL;
  expect("malloc", dcp_mla_malloc(dev, sizeof(float) * 2 * COLS, &d_scores), DCP_MLA_STATUS_SUCCESS, NULL);
  expect("malloc", dcp_mla_malloc(dev, sizeof lens, &d_lens), DCP_MLA_STATUS_SUCCESS, NULL);
  expect("malloc", dcp_mla_malloc(dev, sizeof out, &d_out), DCP_MLA_STATUS_SUCCESS, NULL);
  expect("htod", dcp_mla_memcpy_htod(dev, d_scores, scores, sizeof(float) * 2 * COLS), DCP_MLA_STATUS_SUCCESS, NULL);
  expect("htod", dcp_mla_memcpy_htod(dev, d_lens, lens, sizeof lens), DCP_MLA_STATUS_SUCCESS, NULL);
  DcpMlaTensor ts = fake((uintptr_t)d_scores, 2 * COLS, DCP_MLA_DTYPE_F32);
  DcpMlaTensor tl = fake((uintptr_t)d_lens, 2, DCP_MLA_DTYPE_I32), to = fake((uintptr_t)d_out, 2 * K, DCP_MLA_DTYPE_I32);
  expect("topk_local, valid", topk_local(dev, ts, COLS, COLS, tl, 2, K, to), DCP_MLA_STATUS_SUCCESS, NULL);
  expect("synchronize", dcp_mla_synchronize(dev), DCP_MLA_STATUS_SUCCESS, NULL);
  expect("dtoh", dcp_mla_memcpy_dtoh(dev, out, d_out, sizeof out), DCP_MLA_STATUS_SUCCESS, NULL);
  /* row 0: the 256 largest of 0..299 are 44..299, ascending; row 1 (length 100 <= K): 0..99, then -1 */
  int bad = 0;
  for (int i = 0; i < K; i++) {
    bad |= out[i] != COLS - K + i;
    bad |= out[K + i] != (i < 100 ? i : -1);
  }
  if (bad) {
    fprintf(stderr, "FAIL topk_local, valid: wrong indices (row 0 starts %d, row 1 ends %d)\n", out[0], out[2 * K - 1]);
    failures++;
  }
  dcp_mla_free(dev, d_scores);
  dcp_mla_free(dev, d_lens);
  dcp_mla_free(dev, d_out);
  free(scores);
}

int main(int argc, char **argv) {
  const int with_device = argc > 1 && strcmp(argv[1], "--device") == 0;
  const size_t big = SIZE_MAX / 2;
  uint64_t n64 = 0;
  size_t n = 0;

  /* wrapped sizes: refused by name, never a tiny "success" */
  expect("ag_rs bytes", dcp_mla_ag_rs_workspace_bytes(8, big, 16, &n64), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "`num_tokens`");
  expect("topk bytes", dcp_mla_topk_workspace_bytes(4, big, 2048, &n64), DCP_MLA_STATUS_INVALID_ARGUMENT, "`rows`");
  expect("topk bytes, D", dcp_mla_topk_workspace_bytes(big, 1, 1, &n64), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "`dcp_size`");
  expect("a2a slot", dcp_mla_a2a_slot_bytes(big, 3, &n), DCP_MLA_STATUS_INVALID_ARGUMENT, "`num_tokens`");
  expect("decode workspace", dcp_mla_decode_workspace_bytes(4, 1, 64, 0, big, &n), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "`num_splits`");
  expect("decode workspace, heads", dcp_mla_decode_workspace_bytes(4, big, 64, 0, 2, &n),
         DCP_MLA_STATUS_INVALID_ARGUMENT, "`heads`");

  /* a valid query right after: answers, and the last error is cleared */
  expect("topk bytes, valid", dcp_mla_topk_workspace_bytes(4, 128, 2048, &n64), DCP_MLA_STATUS_SUCCESS, NULL);
  if (n64 != 128ull * 2048 * (16 + 8 * 4) || dcp_mla_last_error()[0] != '\0') {
    fprintf(stderr, "FAIL topk bytes, valid: %llu, last error \"%s\"\n", (unsigned long long)n64, dcp_mla_last_error());
    failures++;
  }
  expect("a2a slot, valid", dcp_mla_a2a_slot_bytes(128, 16, &n), DCP_MLA_STATUS_SUCCESS, NULL);
  if (n != 128u * 16 * 1028) {
    fprintf(stderr, "FAIL a2a slot, valid: %zu\n", n);
    failures++;
  }

  /* null out-pointers, named */
  expect("null out", dcp_mla_topk_workspace_bytes(4, 128, 2048, NULL), DCP_MLA_STATUS_NULL_POINTER, "`out`");
  expect("null out, local_len", dcp_mla_local_len(4, 1, 0, 10, NULL), DCP_MLA_STATUS_NULL_POINTER, "`out`");
  expect("local_len, valid", dcp_mla_local_len(4, 1, 3, 10, &n64), DCP_MLA_STATUS_SUCCESS, NULL);

  /* the D·K rule, live with K = 256 */
  expect("check_topk D=1 K=256", dcp_mla_check_topk(1, 256), DCP_MLA_STATUS_INVALID_CONFIG, "K = 256");
  expect("check_topk D=2 K=256", dcp_mla_check_topk(2, 256), DCP_MLA_STATUS_SUCCESS, NULL);

  /* causal lengths into too short an output: refused by name, nothing written */
  uint64_t lens[2] = {10, 3};
  uint32_t qs[2] = {2, 2};
  int32_t rows[4] = {-7, -7, -7, -7};
  expect("causal lens, short out", dcp_mla_causal_local_lens(lens, qs, 2, 2, 1, 1, rows, 3),
         DCP_MLA_STATUS_INVALID_ARGUMENT, "out_len");
  if (rows[0] != -7) {
    fprintf(stderr, "FAIL causal lens: a refused call wrote its output\n");
    failures++;
  }
  expect("causal lens, null lens", dcp_mla_causal_local_lens(NULL, qs, 2, 2, 1, 1, rows, 4),
         DCP_MLA_STATUS_NULL_POINTER, "`lens`");
  expect("causal lens, valid", dcp_mla_causal_local_lens(lens, qs, 2, 2, 1, 1, rows, 4), DCP_MLA_STATUS_SUCCESS, NULL);

  /* status names take any int */
  if (strcmp(dcp_mla_status_name(-3), "DCP_MLA_STATUS_UNKNOWN") != 0 ||
      strcmp(dcp_mla_status_name(1000), "DCP_MLA_STATUS_UNKNOWN") != 0) {
    fprintf(stderr, "FAIL status names of unknown integers\n");
    failures++;
  }

  /* a launcher without a device: refused by name before anything else */
  expect("topk_local, null device",
         topk_local(NULL, fake(0x12000000, 600, DCP_MLA_DTYPE_F32), 300, 300,
                            fake(0x10000000, 2, DCP_MLA_DTYPE_I32), 2, 256, fake(0x11000000, 512, DCP_MLA_DTYPE_I32)),
         DCP_MLA_STATUS_NULL_POINTER, "`device`");

  expect("decode_model1, null device", model1(NULL, 4 * 37440, 2304), DCP_MLA_STATUS_NULL_POINTER, "`device`");

  /* the argument structs' compatibility rule, from C: a newer caller's larger struct whose extra
     bytes are zero is served (here as far as the null device), one with a field set there is
     refused by name, and so is a struct_size below revision 5's */
  struct {
    DcpMlaMergeTwoArgs args;
    uint64_t added[2];
  } newer;
  memset(&newer, 0, sizeof newer);
  newer.args = merge(NULL, fake(0x53000000, 1, DCP_MLA_DTYPE_F32), 1, DCP_MLA_LSE_BASE_E);
  newer.args.struct_size = sizeof newer;
  expect("newer struct, zero tail", dcp_mla_launch_merge_two(&newer.args), DCP_MLA_STATUS_NULL_POINTER, "`device`");
  newer.added[0] = 1;
  expect("newer struct, a field set", dcp_mla_launch_merge_two(&newer.args), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "`DcpMlaMergeTwoArgs.struct_size`");
  DcpMlaMergeTwoArgs small = merge(NULL, fake(0x53000000, 1, DCP_MLA_DTYPE_F32), 1, DCP_MLA_LSE_BASE_E);
  small.struct_size = sizeof small - 8;
  expect("struct_size below revision 5's", dcp_mla_launch_merge_two(&small), DCP_MLA_STATUS_INVALID_ARGUMENT,
         "`DcpMlaMergeTwoArgs.struct_size`");
  expect("null args", dcp_mla_launch_merge_two(NULL), DCP_MLA_STATUS_NULL_POINTER, "`args`");

  /* a caller of revision 4: its positional prototype, as its header declared it, is refused by
     name (the symbol remains for old binaries; it reads none of its arguments) */
  {
    typedef enum DcpMlaStatus (*old_topk_local_fn)(const DcpMlaDevice *, void *, DcpMlaTensor, size_t, size_t,
                                                   DcpMlaTensor, size_t, size_t, DcpMlaTensor);
    extern enum DcpMlaStatus dcp_mla_topk_local(void);
    old_topk_local_fn old = (old_topk_local_fn)(void (*)(void))dcp_mla_topk_local;
    expect("revision 4 dcp_mla_topk_local",
           old(NULL, NULL, fake(0x12000000, 600, DCP_MLA_DTYPE_F32), 300, 300, fake(0x10000000, 2, DCP_MLA_DTYPE_I32),
               2, 256, fake(0x11000000, 512, DCP_MLA_DTYPE_I32)),
           DCP_MLA_STATUS_UNSUPPORTED, "dcp_mla_launch_topk_local");
  }

  /* the launchers on device 0 */
  if (with_device) {
    DcpMlaDevice *dev = NULL;
    expect("device_open", dcp_mla_device_open(0, &dev), DCP_MLA_STATUS_SUCCESS, NULL);
    if (dev) {
      launcher_checks(dev);
      expect("device_close", dcp_mla_device_close(dev), DCP_MLA_STATUS_SUCCESS, NULL);
      printf("launcher checks ran on device 0\n");
    }
  }

  printf("abi checks: %s (%d failures)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
