//! Split-KV planning of a decode launch, in one place: how many parts share each sequence's KV
//! ([`decode_num_splits`]), and the workspace the parts need with every offset in it
//! ([`SplitPlan`]). The launcher validates a caller's workspace against a plan and passes its
//! offsets to the kernels; the C ABI's and Python's size queries are `SplitPlan::bytes`.

use super::schedule::seq_shape;
use super::size::checked;
use crate::error::{Error, Result};
use crate::formats::D_V;

/// Query rows (flattened [q, H] rows of one request) per decode CTA.
pub const ROWS_PER_CTA: usize = 64;
/// Most split-KV parts a launch may use (the combine keeps a weight per part in shared memory).
pub const MAX_SPLITS: usize = 1024;

/// CTAs (row blocks of [`ROWS_PER_CTA`] rows) per sequence.
pub fn row_blocks_per_seq(nq: usize, heads: usize, sparse: bool) -> usize {
    seq_shape(1, nq, heads, sparse).1.div_ceil(ROWS_PER_CTA)
}

/// The split-KV part count for a launch on `num_sms` SMs, a host-side function of the shapes
/// only (so a captured graph stays valid for any lengths), at most [`MAX_SPLITS`].
///
/// Dense: about one wave, P0 = num_sms / (row blocks per request), whose parts share the batch's
/// KV tiles evenly whatever the lengths. Uneven lengths are the common case under DCP, and there
/// balancing pays (H200, b = 128, lengths ramping to 32K: 1,145 µs vs 2,168 µs unsplit). Within
/// that wave P is aligned with the sequences (requests; sparse: query rows) when that keeps at
/// least 95% of P0 (so uneven lengths lose at most 5% of the wave): a multiple of their count
/// (when it is ≤ P0) or a divisor of it, so that with equal lengths every part holds whole
/// sequences (or equal slices of one) and none is split across parts, whose partials cost the
/// combine (H200, b = 128, H = 64, 8K: P = 132 334 µs, P = 128 317, unsplit 304; the ramp the
/// same at both P).
/// Sparse: a sequence attends to at most K tokens, so lengths cannot be far apart; P = 1 when
/// one CTA per (query row, head block) fills at least 80% of its last wave, else balanced parts.
pub fn decode_num_splits(batch: usize, nq: usize, heads: usize, sparse: bool, num_sms: usize) -> usize {
    if batch == 0 || num_sms == 0 {
        return 1;
    }
    // (no rows at all: one block, so that a query of empty shapes answers 1 instead of dividing by 0)
    let rb = row_blocks_per_seq(nq, heads, sparse).max(1);
    if sparse {
        let ctas = batch.saturating_mul(nq).saturating_mul(rb);
        let waves = ctas.div_ceil(num_sms);
        if ctas.saturating_mul(5) >= waves.saturating_mul(num_sms).saturating_mul(4) {
            return 1;
        }
    }
    let wave = (num_sms / rb).clamp(1, MAX_SPLITS);
    let seqs = seq_shape(batch, nq, heads, sparse).0;
    let aligned = if seqs <= wave { wave / seqs * seqs } else { (1..=wave).rev().find(|p| seqs % p == 0).unwrap_or(1) };
    if aligned * 20 >= wave * 19 {
        aligned
    } else {
        wave
    }
}

/// The first word of the stamp the schedule kernel writes beside the unit prefix
/// (`kernels-src/decode/split_schedule.cuh`, `kSchedStampMagic`): see [`sched_stamp`].
pub const SCHED_STAMP_MAGIC: i32 = 0x6463_7053;

/// The four int32 the schedule kernel writes at [`SplitPlan::stamp_offset`] with the prefix: what
/// it was made for (the decode kernel's KV tile, the sequences and the parts). Every split decode
/// launch checks them before anything the prefix decides, so a reused prefix (`DecodeSchedule::Reuse`)
/// made for another shape or kernel, or a workspace no schedule wrote, traps instead of
/// computing from a foreign prefix.
pub fn sched_stamp(tile: usize, seqs: usize, num_splits: usize) -> [i32; 4] {
    [SCHED_STAMP_MAGIC, tile as i32, seqs as i32, num_splits as i32]
}

/// The split-KV workspace of one decode launch: the int64 unit prefix of the sequences at
/// offset 0, its 16-byte stamp ([`sched_stamp`]) at `stamp_offset` (16-byte aligned), the
/// combine's part table (int32 [parts, 4]: the split sequence starting in each part, or −1, its
/// part count and whether it starts after the part's first unit) at `owner_offset`
/// (`stamp_offset` + 16), then fp32
/// partial out [2·parts, rows per sequence, 512] at `out_offset` (128-byte aligned) and lse
/// [2·parts, rows per sequence] at `lse_offset`; `bytes` in all, 0 for one part. A sequence is a
/// request (dense: q·H rows) or one query row of a request (sparse: H rows). Every product is
/// checked: the shapes come from callers on trust.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    pub num_splits: usize,
    /// Sequences of the launch, and query rows per sequence.
    pub seqs: usize,
    pub rows_per_seq: usize,
    pub stamp_offset: u64,
    pub owner_offset: u64,
    pub out_offset: u64,
    pub lse_offset: u64,
    pub bytes: u64,
}

impl SplitPlan {
    /// The plan of `batch` requests of `nq` query rows of `heads` heads in `num_splits` parts
    /// (`sparse`: a sequence is one query row); an error names the argument whose size overflows.
    pub fn new(batch: usize, nq: usize, heads: usize, sparse: bool, num_splits: usize) -> Result<SplitPlan> {
        let (b, q, h) = (batch as u64, nq as u64, heads as u64);
        let (seqs, rows_per_seq) = if sparse {
            (checked("nq", "batch·nq", &[b, q], 0)?, h)
        } else {
            (b, checked("heads", "nq·heads", &[q, h], 0)?)
        };
        let (seqs, rows_per_seq) = (seqs as usize, rows_per_seq as usize);
        if num_splits <= 1 {
            return Ok(SplitPlan {
                num_splits,
                seqs,
                rows_per_seq,
                stamp_offset: 0,
                owner_offset: 0,
                out_offset: 0,
                lse_offset: 0,
                bytes: 0,
            });
        }
        // the prefix: (seqs + 1) int64 entries, rounded up to 16 bytes, then its 16-byte stamp and
        // the part table (16 bytes a part); the partials start at the next 128 bytes (whole cache
        // lines a row)
        let stamp = checked("batch", "the unit prefix", &[(seqs as u64).saturating_add(1), 8], 15)? & !15;
        let (parts, rows) = (num_splits as u64, rows_per_seq as u64);
        let owner = checked("batch", "the unit prefix", &[stamp], 16)?;
        let table_end = checked("num_splits", "the part table", &[parts, 16], owner)?;
        let partials = checked("num_splits", "the part table", &[table_end], 127)? & !127;
        let out = checked("num_splits", "the partial out 2·parts·rows·2048", &[2, parts, rows, D_V as u64 * 4], 0)?;
        let lse = checked("num_splits", "the partial lse 2·parts·rows·4", &[2, parts, rows, 4], 0)?;
        let lse_offset = checked("num_splits", "the workspace", &[out], partials)?;
        let bytes = checked("num_splits", "the workspace", &[lse], lse_offset)?;
        Ok(SplitPlan {
            num_splits,
            seqs,
            rows_per_seq,
            stamp_offset: stamp,
            owner_offset: owner,
            out_offset: partials,
            lse_offset,
            bytes,
        })
    }

    /// [`SplitPlan::bytes`] as a host size, or an error when it exceeds the address range.
    pub fn host_bytes(&self) -> Result<usize> {
        usize::try_from(self.bytes).map_err(|_| {
            Error::arg("num_splits", format!("a workspace of {} bytes exceeds the address range", self.bytes))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_the_layout() {
        // dense b = 2, q = 3, H = 16: 2 sequences of 48 rows; prefix 3·8 → 32 bytes, stamp 16,
        // part table 5·16 (48..128), partials from 128
        let p = SplitPlan::new(2, 3, 16, false, 5).unwrap();
        assert_eq!((p.seqs, p.rows_per_seq, p.stamp_offset, p.owner_offset, p.out_offset), (2, 48, 32, 48, 128));
        assert_eq!(p.lse_offset, 128 + 10 * 48 * 512 * 4);
        assert_eq!(p.bytes, 128 + 10 * 48 * 513 * 4);
        // sparse: 6 sequences of 16 rows; prefix 7·8 → 64, stamp 16, table 80..160 → 256;
        // b = 128 over 128 parts: prefix 1,032 → 1,040, stamp, table 1,056..3,104 → 3,200
        let s = SplitPlan::new(2, 3, 16, true, 5).unwrap();
        assert_eq!((s.seqs, s.rows_per_seq, s.stamp_offset, s.owner_offset, s.out_offset), (6, 16, 64, 80, 256));
        assert_eq!(s.bytes, 256 + 10 * 16 * 513 * 4);
        assert_eq!(SplitPlan::new(128, 1, 64, false, 128).unwrap().out_offset, 3200);
        assert_eq!(SplitPlan::new(2, 3, 16, false, 1).unwrap().bytes, 0);
    }

    #[test]
    fn sizes_that_overflow_name_the_argument() {
        let arg = |e: Error| e.argument().unwrap();
        assert_eq!(arg(SplitPlan::new(4, 1, 64, false, usize::MAX / 2).unwrap_err()), "num_splits");
        assert_eq!(arg(SplitPlan::new(4, usize::MAX / 2, 64, false, 2).unwrap_err()), "heads");
        assert_eq!(arg(SplitPlan::new(usize::MAX / 2, 4, 64, true, 2).unwrap_err()), "nq");
    }

    #[test]
    fn parts_make_one_wave() {
        // H = 64, q = 1: one row block per sequence, so 132 parts of it fill 132 SMs
        assert_eq!(decode_num_splits(1, 1, 64, false, 132), 132);
        // equal lengths split no request: P a multiple or a divisor of the batch within 95% of a wave
        assert_eq!(decode_num_splits(128, 1, 64, false, 132), 128);
        assert_eq!(decode_num_splits(128, 1, 128, false, 132), 64);
        assert_eq!(decode_num_splits(64, 1, 64, false, 132), 128);
        assert_eq!(decode_num_splits(2, 1, 64, false, 132), 132);
        assert_eq!(decode_num_splits(100, 1, 64, false, 132), 132, "100 of 132 is below 95%");
        assert_eq!(decode_num_splits(120, 1, 64, false, 132), 132, "120 of 132 is below 95%");
        // dense q = 6, H = 64: 6 row blocks per request
        assert_eq!(decode_num_splits(128, 6, 64, false, 132), 22);
        // sparse sequences are one query row: q = 2, H = 128 -> 2 row blocks per sequence;
        // 16 CTAs are 12% of a wave: split, in 64 parts (8 sequences × 8)
        assert_eq!(decode_num_splits(4, 2, 128, true, 132), 64);
        // 128 query rows × 1 head block = 97% of a wave, 768 = 97% of 6 waves: no split
        assert_eq!(decode_num_splits(128, 1, 64, true, 132), 1);
        assert_eq!(decode_num_splits(128, 6, 64, true, 132), 1);
        // 140 CTAs would leave the second wave 6% full: split
        assert_eq!(decode_num_splits(140, 1, 64, true, 132), 132);
        // more row blocks than SMs: no split
        assert_eq!(decode_num_splits(1, 8, 128, false, 8), 1);
        assert_eq!(decode_num_splits(0, 1, 16, false, 132), 1);
        assert_eq!(decode_num_splits(1, 1, 16, false, 100_000), MAX_SPLITS);
    }
}
