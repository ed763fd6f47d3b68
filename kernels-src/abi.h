/* The only definition of every struct passed to a dcp-mla kernel.
 *
 * Each struct is passed by value as a kernel's single argument. The code generator parses this
 * file and emits the Rust mirrors (`dcp_mla::abi`), plus a C probe that the layout test compiles
 * with the host compiler to check size, alignment and every field offset on both sides.
 *
 * Keep to the subset the generator reads: `typedef struct Name { <type> <field>; ... } Name;`
 * with fields of fixed-width integer or float types only (device pointers are uint64_t), one
 * field per line, comments allowed anywhere.
 */
#pragma once
#include <stdint.h>

/* KV-cache fill (SPEC.md §2-3): writes each new token's [512 c_kv | 64 k_pe] row into the paged
 * cache of this rank, only if this rank owns the token. */
typedef struct DcpKvFillParams {
    uint64_t ckv;            /* bf16 [num_tokens, ckv_stride], first 512 values used */
    uint64_t kpe;            /* bf16 [num_tokens, kpe_stride], first 64 values used */
    uint64_t req_idx;        /* int32 [num_tokens]: request (block-table row) of each token */
    uint64_t positions;      /* int32 [num_tokens]: global position; < 0 skips the token */
    uint64_t block_table;    /* int32 [batch, block_table_stride] */
    uint64_t cache;          /* bf16 [num_pages, block_size, 576] or bytes [num_pages, block_size, 656] */
    int64_t ckv_stride;      /* elements between rows of ckv */
    int64_t kpe_stride;      /* elements between rows of kpe */
    int64_t block_table_stride;
    int32_t num_tokens;
    int32_t batch;
    int32_t max_pages;       /* valid columns of the block table */
    int32_t num_pages;       /* pages in the cache tensor */
    int32_t block_size;      /* B: tokens per page */
    int32_t dcp_size;        /* D */
    int32_t dcp_rank;        /* r */
    int32_t interleave;      /* I */
} DcpKvFillParams;
