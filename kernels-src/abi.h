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

/* MLA decode attention on one rank's shard (SPEC.md §4): dense over the BF16 paged cache, or
 * sparse over index lists into the BF16 or FP8-656 cache. With num_splits > 1 each CTA writes a
 * split's partial result to the workspace and mla_decode_combine merges them. */
typedef struct DcpMlaDecodeParams {
    uint64_t q;              /* bf16 [batch, nq, heads, 576], contiguous */
    uint64_t cache;          /* bf16 [num_pages, block_size, 576] or bytes [num_pages, block_size, 656] */
    uint64_t block_table;    /* dense: int32 [batch, block_table_stride] */
    uint64_t lens;           /* dense: int32 [batch, nq] local lengths */
    uint64_t indices;        /* sparse: int32 [batch, nq, topk] of page·B + slot; -1 unused */
    uint64_t topk_len;       /* sparse: int32 [batch, nq] valid entries per row, or 0: all topk */
    uint64_t out;            /* bf16 or fp32 [batch, nq, heads, 512] */
    uint64_t lse;            /* fp32 [batch, nq, heads], natural log */
    uint64_t ws_out;         /* num_splits > 1: fp32 [num_splits, batch·nq·heads, 512] */
    uint64_t ws_lse;         /* num_splits > 1: fp32 [num_splits, batch·nq·heads] */
    int64_t block_table_stride;
    float scale_log2;        /* softmax scale σ · log2(e) */
    int32_t batch;
    int32_t nq;              /* query rows per request (MTP) */
    int32_t heads;
    int32_t num_pages;
    int32_t block_size;
    int32_t max_pages;       /* dense: valid block-table columns; lengths are clamped to max_pages·B */
    int32_t topk;            /* sparse: K, entries per index row */
    int32_t num_splits;
    int32_t out_f32;         /* 1: out is fp32, 0: bf16 */
} DcpMlaDecodeParams;

/* Merge of a split decode's partial results (SPEC.md §5, natural-log lse). */
typedef struct DcpMlaDecodeCombineParams {
    uint64_t ws_out;         /* fp32 [num_splits, rows, 512] */
    uint64_t ws_lse;         /* fp32 [num_splits, rows] */
    uint64_t out;            /* bf16 or fp32 [rows, 512] */
    uint64_t lse;            /* fp32 [rows] */
    int64_t rows;
    int32_t num_splits;
    int32_t out_f32;
} DcpMlaDecodeCombineParams;
