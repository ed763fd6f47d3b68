/* The only definition of every struct passed to a dcp-mla kernel.
 *
 * Each struct is passed by value as a kernel's single argument. The code generator parses this
 * file and emits the Rust mirrors (`dcp_mla::abi`), plus a C probe that the layout test compiles
 * with the host compiler to check size, alignment and every field offset on both sides.
 *
 * Keep to the subset the generator reads: `typedef struct Name { <type> <field>; ... } Name;`
 * with fields of fixed-width integer or float types only (device pointers are uint64_t), one
 * field per line, comments allowed anywhere. A field may be an array (`type name[N];`), and the
 * first field of a struct may be over-aligned (`DCP_ALIGN(n) type name...;`), which aligns the
 * struct (Rust can only align whole structs).
 */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
#define DCP_ALIGN(n) alignas(n)
#else
#define DCP_ALIGN(n) _Alignas(n)
#endif

/* KV-cache fill (docs/contract.md §2-3): writes each new token's [512 c_kv | 64 k_pe] row into the paged
 * cache of this rank, only if this rank owns the token. */
typedef struct DcpKvFillParams {
    uint64_t ckv;            /* bf16 [num_tokens, ckv_stride], first 512 values used */
    uint64_t kpe;            /* bf16 [num_tokens, kpe_stride], first 64 values used */
    uint64_t req_idx;        /* int32 [num_tokens]: request (block-table row) of each token */
    uint64_t positions;      /* int32 [num_tokens]: global position; < 0 skips the token */
    uint64_t block_table;    /* int32 [batch, block_table_stride] */
    uint64_t cache;          /* bf16 [num_pages, page_rows, 576] or bytes [num_pages, page_rows, 656]: rows */
                             /* [0, block_size) of each page are its tokens */
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
    int32_t page_rows;       /* cache rows from one page's start to the next's, ≥ block_size */
    int32_t reserved;
} DcpKvFillParams;

/* MLA decode attention on one rank's shard (docs/contract.md §4): dense over the BF16 paged cache, or
 * sparse over index lists into the BF16 or FP8-656 cache. A sequence is a request (dense, its
 * nq·heads rows) or one query row of a request (sparse, its heads rows). With num_splits = P > 1
 * mla_decode_schedule first writes sched, the sequences' unit prefix (src/planner/schedule.rs);
 * part z of the decode grid takes units [z·W, (z + 1)·W), W = ceil(sched[seqs] / P), across
 * sequences; a sequence spread over several parts leaves fp32 partials in workspace slots
 * that mla_decode_combine merges. */
typedef struct DcpMlaDecodeParams {
    /* kv_tma = 1: a CUtensorMap (cuTensorMapEncodeTiled, 128-byte aligned as CUDA 13 declares */
    /* it) of the dense BF16 cache as [num_pages·block_size rows, 576], 128B swizzle, boxes of */
    /* 64 columns × min(64, block_size) rows: the trio schedule loads whole tiles with it */
    DCP_ALIGN(128) uint64_t kv_tmap[16];
    uint64_t q;              /* bf16 [batch, nq, heads, 576], strides q_stride_* (rows 16-byte aligned) */
    uint64_t cache;          /* bf16 [num_pages, page_rows, 576] or bytes [num_pages, page_rows, 656]: rows */
                             /* [0, block_size) of each page are its tokens */
    uint64_t block_table;    /* dense: int32 [batch, block_table_stride] */
    uint64_t lens;           /* dense: int32 [batch, nq] local lengths, strides len_stride_* */
    uint64_t indices;        /* sparse: int32 [batch, nq, topk] of page·B + slot, strides indices_stride_*; -1 unused */
    uint64_t topk_len;       /* sparse: int32 [batch, nq] valid entries per row (strides len_stride_*), or 0: all topk */
    uint64_t out;            /* bf16 or fp32 [batch, nq, heads, 512], strides out_stride_* (rows 16-byte aligned) */
    uint64_t lse;            /* fp32 [batch, nq, heads], natural log, strides lse_stride_* */
    uint64_t sched;          /* num_splits > 1: int64 [seqs + 1] unit prefix (written by the schedule) */
    uint64_t sched_stamp;    /* num_splits > 1: int32 [4], what the prefix was made for (magic, sched_tile, */
                             /* sequences, num_splits): written with it, checked by every decode launch */
    uint64_t ws_out;         /* num_splits > 1: fp32 [2·num_splits, rows per sequence, 512] */
    uint64_t ws_lse;         /* num_splits > 1: fp32 [2·num_splits, rows per sequence] */
    uint64_t sink;           /* fp32 [heads] attention sinks (docs/contract.md §4), applied to the rows */
                             /* written to out (a split row's in mla_decode_combine), or 0: none */
    int64_t block_table_stride;
    int64_t q_stride_b;      /* elements between q's requests, */
    int64_t q_stride_s;      /* query rows */
    int64_t q_stride_h;      /* and heads (multiples of 8: rows stay 16-byte aligned) */
    int64_t indices_stride_b; /* sparse: elements between the index lists' requests */
    int64_t indices_stride_s; /* and query rows */
    int64_t len_stride_b;    /* elements between requests of lens (dense) or topk_len (sparse), */
    int64_t len_stride_s;    /* and query rows (any, 0 included: a broadcast per-request value) */
    int64_t out_stride_b;    /* elements between out's requests, query rows and heads */
    int64_t out_stride_s;
    int64_t out_stride_h;
    int64_t lse_stride_b;    /* elements between lse's requests, query rows and heads (any) */
    int64_t lse_stride_s;
    int64_t lse_stride_h;
    float scale_log2;        /* softmax scale σ · log2(e) */
    int32_t batch;
    int32_t nq;              /* query rows per request (MTP) */
    int32_t heads;
    int32_t num_pages;
    int32_t block_size;
    int32_t max_pages;       /* dense: valid block-table columns; lengths are clamped to max_pages·B */
    int32_t topk;            /* sparse: K, entries per index row */
    int32_t num_splits;      /* P: parts (CTAs per row block) sharing the batch's KV tiles; 1: a CTA per sequence */
    int32_t sched_tile;      /* KV tokens per tile of the decode kernel the schedule is for */
    int32_t out_f32;         /* 1: out is fp32, 0: bf16 */
    int32_t kv_tma;          /* 1: kv_tmap is valid (dense; block_size a power of two ≥ 8) */
    int32_t page_rows;       /* cache rows from one page's start to the next's, ≥ block_size */
    int32_t empty_lse_inf;   /* 1: a row that sees no token gets lse +inf (FlashMLA's), 0: −inf */
    /* sparse, pages a stride apart (page_rows > block_size): index v's page is */
    /* (v · page_div_magic) >> page_div_shift, exact for 0 ≤ v < 2^31 (any block size, no divide) */
    uint32_t page_div_magic;
    int32_t page_div_shift;
    /* dense: what lens holds. 0: each row's local length (as given). 1: each request's global */
    /* length L (its nq new tokens included), every row seeing n_r(L) tokens of this rank. 2: the */
    /* same, causal: row j sees n_r(max(L − nq + 1 + j, 0)). n_r(g) counts the t < g with */
    /* (t / I) % D == r (docs/contract.md §2) */
    /* (lens_rule 1, 2 with D·I ≥ 2: g / (D·I) is umulhi(g, dcp_cycle_magic) >> dcp_cycle_shift) */
    int32_t lens_rule;       /* the launcher's record only: the kernels read the fields below */
    int32_t causal_shift;    /* 1 with lens_rule 2, else 0: row j's global length is L − (nq − 1 − j)·this */
    int32_t dcp_cycle;       /* D·I (1 with lens_rule 0: the rule is then the identity) */
    uint32_t dcp_cycle_magic;
    int32_t dcp_cycle_shift;
    int32_t dcp_interleave;  /* I */
    int32_t dcp_rank_start;  /* r·I: the first token of a cycle this rank holds */
    /* a row's query index x / heads (x < 2^31) is umulhi(x, heads_magic) >> heads_shift, or x */
    /* itself when heads = 1 */
    uint32_t heads_magic;
    int32_t heads_shift;
    /* MODEL1 (mla_decode_model1, docs/contract.md §4 "MODEL1"): `cache` is FlashMLA's page-wise */
    /* FP8 layout, page p at byte p·page_rows·576 (page_rows counts 576-byte units there), and a */
    /* second source may follow the first in the same softmax: its own page-wise cache, index lists */
    /* int32 [batch, nq, extra_topk] (strides extra_indices_stride_*) and optional valid counts */
    /* extra_topk_len [batch, nq] (strides extra_len_stride_*, 0 broadcasts). A sequence's tokens */
    /* are the first list's valid entries, then the second's. extra_indices = 0: no second source */
    /* (every other decode kernel reads none of these fields) */
    uint64_t extra_cache;
    uint64_t extra_indices;
    uint64_t extra_topk_len;
    int64_t extra_indices_stride_b;
    int64_t extra_indices_stride_s;
    int64_t extra_len_stride_b;
    int64_t extra_len_stride_s;
    int32_t extra_topk;
    int32_t extra_num_pages;
    int32_t extra_block_size;
    int32_t extra_page_rows;  /* 576-byte units from one page's start to the next's */
    uint32_t extra_page_div_magic;  /* index v's page is (v · magic) >> shift, as page_div_* */
    int32_t extra_page_div_shift;
} DcpMlaDecodeParams;

/* Merge of a split decode's partial results (docs/contract.md §5, natural-log lse): the rows of every
 * sequence spread over several parts; the others were written by the decode kernel. */
typedef struct DcpMlaDecodeCombineParams {
    uint64_t sched;          /* int64 [seqs + 1] unit prefix */
    uint64_t ws_out;         /* fp32 [2·num_splits, rows_per_seq, 512] */
    uint64_t ws_lse;         /* fp32 [2·num_splits, rows_per_seq] */
    uint64_t out;            /* bf16 or fp32 [batch, nq, heads, 512] as the decode's (the same strides) */
    uint64_t lse;            /* fp32 [batch, nq, heads] as the decode's */
    uint64_t sink;           /* fp32 [heads] attention sinks of the rows (head = row mod heads), or 0 */
    int64_t out_stride_b;    /* the decode's out and lse strides */
    int64_t out_stride_s;
    int64_t out_stride_h;
    int64_t lse_stride_b;
    int64_t lse_stride_s;
    int64_t lse_stride_h;
    int32_t seqs;
    int32_t rows_per_seq;    /* a multiple of heads */
    int32_t num_splits;
    int32_t out_f32;
    int32_t heads;
    int32_t nq;              /* query rows per request */
    int32_t sparse;          /* 1: a sequence is one query row (rows_per_seq = heads), 0: a request */
    int32_t empty_lse_inf;   /* the decode's */
} DcpMlaDecodeCombineParams;

/* DCP combine, ag_rs step 1 (docs/contract.md §5.1): this rank's head-major contribution
 * contrib[h, t, :] = (w_rank / S) · out[t, h, :], from the all-gathered lse. */
typedef struct DcpAgRsCorrectParams {
    uint64_t out;            /* bf16 or f32 [T, H, 512]: this rank's partial attention output */
    uint64_t lse_all;        /* f32 [D, T, H]: every rank's lse, in base e or 2 */
    uint64_t contrib;        /* f32 or bf16 [H, T, 512] (the variant's contrib dtype): written */
    int32_t num_tokens;      /* T */
    int32_t num_heads;       /* H = D · H_l */
    int32_t dcp_size;        /* D, 1..8 */
    int32_t dcp_rank;        /* r */
    int32_t lse_base2;       /* 1: lse_all is base 2; 0: natural log */
    int32_t reserved;
} DcpAgRsCorrectParams;

/* DCP combine, ag_rs step 2: casts this rank's reduce-scattered heads to the output dtype and
 * writes their merged lse. */
typedef struct DcpAgRsFinishParams {
    uint64_t summed;         /* f32 or bf16 [H_l, T, 512]: heads [rank·H_l, (rank+1)·H_l) summed over ranks */
    uint64_t lse_all;        /* f32 [D, T, D·H_l] */
    uint64_t out;            /* bf16 or f32 [T, H_l, 512]: written */
    uint64_t lse_out;        /* f32 [T, H_l]: written, natural log */
    uint64_t sink;           /* f32 [H_l]: the attention sinks of this rank's heads, or 0 (docs/contract.md §5) */
    int32_t num_tokens;      /* T */
    int32_t local_heads;     /* H_l */
    int32_t dcp_size;        /* D, 1..8 */
    int32_t dcp_rank;        /* r */
    int32_t lse_base2;
    int32_t reserved;
} DcpAgRsFinishParams;

/* DCP combine, a2a send side: packs out and lse into one slot per destination rank. */
typedef struct DcpA2aPackParams {
    uint64_t out;            /* bf16 or f32 [T, D·H_l, 512] */
    uint64_t lse;            /* f32 [T, D·H_l], copied bit for bit */
    uint64_t send;           /* bytes [D, slot_bytes]: slot d = [T·H_l·512 bf16][T·H_l f32] */
    int64_t slot_bytes;      /* multiple of 16, at least T·H_l·1028 */
    int32_t num_tokens;      /* T */
    int32_t local_heads;     /* H_l */
    int32_t dcp_size;        /* D */
    int32_t reserved;
} DcpA2aPackParams;

/* DCP combine, a2a receive side: the full merge of the D received slots. */
typedef struct DcpA2aCombineParams {
    uint64_t recv;           /* bytes [D, slot_bytes]: slot r as source rank r packed it */
    uint64_t out;            /* bf16 or f32 [T, H_l, 512]: written */
    uint64_t lse_out;        /* f32 [T, H_l]: written, natural log */
    uint64_t sink;           /* f32 [H_l]: the attention sinks of this rank's heads, or 0 */
    int64_t slot_bytes;      /* multiple of 16, at least T·H_l·1028 */
    int32_t num_tokens;      /* T */
    int32_t local_heads;     /* H_l */
    int32_t lse_base2;
    int32_t reserved;
} DcpA2aCombineParams;

/* DCP combine, two-way merge of chunked prefill (docs/contract.md §5.3). */
typedef struct DcpMergeTwoParams {
    uint64_t out_a;          /* bf16 or f32 [rows, 512] (the variant's input dtype) */
    uint64_t lse_a;          /* f32 [rows] */
    uint64_t out_b;          /* as out_a */
    uint64_t lse_b;          /* f32 [rows] */
    uint64_t out;            /* bf16 or f32 [rows, 512]: written; may be exactly out_a or out_b when of their dtype */
    uint64_t lse_out;        /* f32 [rows]: written, natural log; may be exactly lse_a or lse_b */
    uint64_t sink;           /* f32 [sink_heads] attention sinks applied to the result (head = row mod */
                             /* sink_heads; the last merge of a chain only), or 0 */
    int64_t rows;            /* T · H */
    int32_t lse_a_base2;     /* 1: lse_a is base 2; 0: natural log (docs/contract.md §5.3: each input its own) */
    int32_t lse_b_base2;     /* the same for lse_b */
    int32_t sink_heads;      /* H: rows are [T, H]; ≥ 1 when sink is set */
    int32_t reserved;
} DcpMergeTwoParams;

/* Local top-k (docs/contract.md §6): per row, the K best of the first len[row] scores by (score desc,
 * index asc; NaN = -inf), as indices in ascending order, -1 padded. */
typedef struct DcpTopkParams {
    uint64_t scores;         /* fp32 [rows, row_stride] */
    uint64_t lens;           /* int32 [rows]: valid length, clamped to [0, cols] */
    uint64_t out;            /* int32 [rows, K] */
    int64_t row_stride;      /* elements between rows of scores (64-bit: > 2^31 elements work) */
    int32_t rows;
    int32_t cols;            /* N: the columns a row may use */
} DcpTopkParams;

/* Candidate packing (docs/contract.md §6): (score, global id) of each local top-k index; an index outside
 * [0, cols) gives (-inf, -1). */
typedef struct DcpTopkPackParams {
    uint64_t local_idx;      /* int32 [rows, k] */
    uint64_t scores;         /* fp32 [rows, row_stride] */
    uint64_t cand_scores;    /* fp32 [rows, k] */
    uint64_t cand_ids;       /* int32 [rows, k] */
    int64_t row_stride;
    int32_t rows;
    int32_t k;
    int32_t cols;
    int32_t dcp_size;        /* D */
    int32_t dcp_rank;        /* r */
    int32_t interleave;      /* I */
} DcpTopkPackParams;

/* Global merge (docs/contract.md §6): exact top K of the D ranks' candidates by (score desc, id asc),
 * emitted in candidate order (rank-major), -1 padded. */
typedef struct DcpTopkMergeParams {
    uint64_t cand_scores;    /* fp32 [D, rows, K] */
    uint64_t cand_ids;       /* int32 [D, rows, K]; id < 0 marks an unused candidate */
    uint64_t out;            /* int32 [rows, K] */
    int32_t rows;
    int32_t reserved;
} DcpTopkMergeParams;

/* Compaction for rank r (docs/contract.md §6): ids owned by r mapped to local() or, when translate != 0,
 * to page·B + slot through the block table; stable-compacted, -1 padded, counted per row. */
typedef struct DcpTopkCompactParams {
    uint64_t ids;            /* int32 [rows, k] global ids, -1 unused */
    uint64_t out;            /* int32 [rows, k] */
    uint64_t counts;         /* int32 [rows] */
    uint64_t block_table;    /* int32 [batch, block_table_stride]; read only when translate != 0 */
    int64_t block_table_stride;
    int32_t rows;
    int32_t k;
    int32_t dcp_size;
    int32_t dcp_rank;
    int32_t interleave;
    int32_t translate;       /* 0: local positions; else page·B + slot (-1 when unmapped) */
    int32_t block_size;      /* B */
    int32_t rows_per_request; /* query rows per block-table row */
    int32_t max_pages;       /* valid columns of the block table */
    int32_t reserved;
} DcpTopkCompactParams;

/* Prefill chunk pieces (docs/contract.md §7), shared by flatten and reorder: int32 [max_pieces, 8] with
 * fields {request, local_start, row_offset, rows, global_len, out_offset, 0, 0} per piece (the
 * planner's Piece); an entry with rows = global_len = 0 is empty. */

/* Prefix flatten: row i of this rank's [cap_rows, 576] bf16 buffer is the piece's local token
 * local_start + (i - row_offset) if that is below the piece's n_r(global_len), else zero. */
typedef struct DcpPrefillFlattenParams {
    uint64_t cache;          /* bytes [num_pages, page_rows, 1152 (bf16) or 656 (fp8)], the first block_size rows */
                             /* of each page its tokens */
    uint64_t block_table;    /* int32 [batch, block_table_stride] */
    uint64_t pieces;         /* int32 [max_pieces, 8] */
    uint64_t out;            /* bf16 [cap_rows, 576] */
    int64_t block_table_stride;
    int32_t batch;
    int32_t max_pages;       /* valid columns of the block table; a column beyond gives zeros */
    int32_t num_pages;
    int32_t block_size;      /* B */
    int32_t cap_rows;
    int32_t max_pieces;
    int32_t dcp_size;        /* D */
    int32_t dcp_rank;        /* r */
    int32_t interleave;      /* I */
    int32_t page_rows;       /* cache rows from one page's start to the next's, ≥ block_size */
} DcpPrefillFlattenParams;

/* Prefix reorder: the all-gathered [D, cap_rows, 576] buffer into [out_rows, 576] global order. */
typedef struct DcpPrefillReorderParams {
    uint64_t gathered;       /* bf16 [D, cap_rows, 576] */
    uint64_t pieces;         /* int32 [max_pieces, 8] */
    uint64_t out;            /* bf16 [out_rows, 576] */
    int32_t cap_rows;
    int32_t out_rows;
    int32_t max_pieces;
    int32_t dcp_size;
    int32_t interleave;
    int32_t reserved;
} DcpPrefillReorderParams;

/* Benchmark L2 eviction: a read of `bytes` bytes of `buf` that stores nothing (see bench.cuh). */
typedef struct DcpL2EvictParams {
    uint64_t buf;            /* bytes [bytes], 16-byte aligned */
    uint64_t sink;           /* uint32 [1]: written only if the xor of the buffer equals `never` */
    int64_t bytes;           /* a multiple of 64 */
    uint32_t never;
    uint32_t reserved;
} DcpL2EvictParams;

/* Benchmark copy: `bytes` bytes from `src` to `dst`, the ceiling a data-path kernel that moves
   2·bytes (read and written) is compared with (see bench.cuh). */
typedef struct DcpBenchCopyParams {
    uint64_t src;            /* bytes [bytes], 16-byte aligned */
    uint64_t dst;            /* bytes [bytes], 16-byte aligned, not overlapping src */
    int64_t bytes;           /* a multiple of 16 */
} DcpBenchCopyParams;
