/* The C ABI driven from C with hostile sizes and pointers (issue 16): every planner size query
 * with a product that wraps 64 bits returns DCP_MLA_STATUS_INVALID_ARGUMENT with a message that
 * names the argument, a null out-pointer returns DCP_MLA_STATUS_NULL_POINTER naming it, a
 * launcher with a null device is refused before anything is touched, and a valid call right
 * after each refusal still answers (and clears the last error). Needs no GPU.
 * Exit status 0 when every check holds; the first failing check is printed. */
#include <stdint.h>
#include <stdio.h>
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

int main(void) {
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

  printf("abi checks: %s (%d failures)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
