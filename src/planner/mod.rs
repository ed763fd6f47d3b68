//! The planner (docs/contract.md §2, §7, §8): token ownership, local and causal lengths, pages and
//! block-table addressing, capacity, the prefill chunk plan and workspace sizes. Pure host
//! arithmetic, shared by the CPU reference, the launchers and the C ABI. Bad configurations are
//! [`PlanError`]s, converted into [`crate::Error::InvalidConfig`].

pub mod choice;
mod chunks;
pub mod schedule;
mod size;
pub mod split;
pub mod tune;
pub mod workspace;

pub use chunks::{plan_prefill_chunks, prefill_chunk_bytes, Chunk, ChunkPlan, Piece};

use crate::error::{Error, Result};
use crate::formats::KvFormat;

/// DCP sizes D the kernels are built for (the a2a combine and the global top-k merge are compiled
/// per D): every interface refuses any other D through [`DcpConfig::new`] or [`check_dcp_size`].
pub const DCP_SIZES: [usize; 4] = [1, 2, 4, 8];
/// Top-k sizes the sparse kernels support: DeepSeek-V3.2's 2048 and 512, and 256 and 1024 for
/// smaller indexers (with D·K a multiple of 512: K = 256 needs D ≥ 2).
pub const TOPK_SIZES: [usize; 4] = [256, 512, 1024, 2048];
/// Largest gathered head count H = D·H_l the attention and merge kernels support.
pub const MAX_HEADS: usize = 128;
/// Largest query rows per request (1 + MTP draft tokens).
pub const MAX_Q_ROWS: usize = 8;
/// Lengths, ids and slot addresses are int32 on the device.
pub const MAX_TOKENS: u64 = i32::MAX as u64;

/// What is wrong with a configuration, naming the values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("DCP size D = {d} must be at least 1")]
    ZeroDcp { d: usize },
    #[error("DCP size D = {d} is not supported: the kernels are built for D in 1, 2, 4, 8")]
    DcpSize { d: usize },
    #[error("tp = {tp} is not divisible by the DCP size D = {d}")]
    TpNotDivisible { tp: usize, d: usize },
    #[error("interleave I = {interleave} must be at least 1 and divide the block size B = {block_size}")]
    BadInterleave { interleave: usize, block_size: usize },
    #[error("block size B must be at least 1")]
    ZeroBlockSize,
    #[error("top-k K = {k} is not one of the supported sizes 256, 512, 1024, 2048 (D = {d})")]
    TopkSize { d: usize, k: usize },
    #[error("D·K = {d}·{k} is not a multiple of 512 (D = {d}, K = {k})")]
    TopkMultiple { d: usize, k: usize },
    #[error("H = D·H_l = {d}·{h_l} heads: must be between 1 and {max}")]
    Heads { d: usize, h_l: usize, max: usize },
    #[error("q = {q} query rows per request: must be between 1 and {max}")]
    QueryRows { q: usize, max: usize },
    #[error("batch = {batch} requests: must be at least 1")]
    Batch { batch: usize },
    #[error("context = {context} tokens is shorter than the q = {q} new tokens of a request")]
    ContextShorterThanQ { context: u64, q: usize },
    #[error("request {request}: length {len} is shorter than its {q} new tokens")]
    ShorterThanQ { request: usize, len: u64, q: usize },
    #[error("{what} = {value} overflows the kernels' int32 range")]
    Overflow { what: &'static str, value: u128 },
    #[error("prefill byte budget {budget} is below one logical block of B·D = {unit} tokens ({need} bytes)")]
    BudgetTooSmall { budget: u64, unit: u64, need: u64 },
}

impl From<PlanError> for Error {
    fn from(e: PlanError) -> Self {
        Error::InvalidConfig(e.to_string())
    }
}

/// The DCP layout of one group: D ranks, runs of I consecutive tokens per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DcpLayout {
    /// D: ranks that split the KV by token.
    pub size: usize,
    /// I: interleave, consecutive tokens that go to one rank.
    pub interleave: usize,
}

impl DcpLayout {
    /// owner(t) = (t div I) mod D.
    pub fn owner(&self, t: u64) -> usize {
        ((t / self.interleave as u64) % self.size as u64) as usize
    }

    /// local(t) = (t div (D·I))·I + (t mod I).
    pub fn local(&self, t: u64) -> u64 {
        let (d, i) = (self.size as u64, self.interleave as u64);
        (t / (d * i)) * i + t % i
    }

    /// global(l, r) = (l div I)·D·I + r·I + (l mod I): the inverse of (owner, local).
    pub fn global(&self, l: u64, r: usize) -> u64 {
        let (d, i) = (self.size as u64, self.interleave as u64);
        (l / i) * d * i + r as u64 * i + l % i
    }

    /// n_r(L): tokens rank r holds of a sequence of L tokens.
    pub fn local_len(&self, len: u64, r: usize) -> u64 {
        let (d, i) = (self.size as u64, self.interleave as u64);
        let full = len / (d * i);
        let rest = len - full * i * d;
        full * i + rest.saturating_sub(r as u64 * i).min(i)
    }

    /// n_r(L) for every request of a batch: the dense decode's per-request local lengths.
    pub fn local_lens(&self, lens: &[u64], r: usize) -> Vec<u64> {
        lens.iter().map(|&l| self.local_len(l, r)).collect()
    }

    /// Pages one sequence of L tokens needs on every rank: ceil(L / (B·D)) (docs/contract.md §2), which
    /// is ceil(max_r n_r(L) / B) because I divides B.
    pub fn pages_for(&self, len: u64, block_size: usize) -> u64 {
        // saturating is exact: a product beyond u64 exceeds any len, which then needs one page
        len.div_ceil((block_size as u64).saturating_mul(self.size as u64))
    }

    /// Where global token t lives: (rank, block-table column, slot within the page).
    pub fn address(&self, t: u64, block_size: usize) -> (usize, u64, u64) {
        let l = self.local(t);
        (self.owner(t), l / block_size as u64, l % block_size as u64)
    }
}

/// A validated DCP configuration: tp divisible by D, I dividing B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DcpConfig {
    pub tp: usize,
    pub dcp: DcpLayout,
    /// B: tokens per physical page.
    pub block_size: usize,
}

impl DcpConfig {
    /// Checks docs/contract.md §1's constraints: D ≥ 1 dividing tp, B ≥ 1, I ≥ 1 dividing B.
    pub fn new(tp: usize, d: usize, interleave: usize, block_size: usize) -> Result<Self> {
        check_layout(tp, DcpLayout { size: d, interleave }, block_size)?;
        Ok(DcpConfig { tp, dcp: DcpLayout { size: d, interleave }, block_size })
    }

    /// The scheduler's unit, one logical block: B·D global tokens.
    pub fn logical_block(&self) -> u64 {
        self.block_size as u64 * self.dcp.size as u64
    }
}

fn check_layout(tp: usize, dcp: DcpLayout, block_size: usize) -> Result<(), PlanError> {
    if dcp.size == 0 {
        return Err(PlanError::ZeroDcp { d: 0 });
    }
    if tp % dcp.size != 0 {
        return Err(PlanError::TpNotDivisible { tp, d: dcp.size });
    }
    check_dcp_size(dcp.size)?;
    if block_size == 0 {
        return Err(PlanError::ZeroBlockSize);
    }
    if dcp.interleave == 0 || block_size % dcp.interleave != 0 {
        return Err(PlanError::BadInterleave { interleave: dcp.interleave, block_size });
    }
    // a logical block's slots are int32 on the device; this also bounds every D·I and B·D
    // product of the layout arithmetic
    let logical = block_size as u128 * dcp.size as u128;
    if logical > MAX_TOKENS as u128 {
        return Err(PlanError::Overflow { what: "B·D (tokens of a logical block)", value: logical });
    }
    Ok(())
}

/// D must be one of [`DCP_SIZES`] (D = 0 has its own message).
pub fn check_dcp_size(d: usize) -> Result<(), PlanError> {
    match d {
        0 => Err(PlanError::ZeroDcp { d }),
        d if DCP_SIZES.contains(&d) => Ok(()),
        d => Err(PlanError::DcpSize { d }),
    }
}

/// The sizes of a decode step, checked alike by every interface (the CLI's `plan` and `demo`,
/// the C ABI's `dcp_mla_check_decode`, Python's `plan()`): D in [`DCP_SIZES`], 1 ≤ H = D·H_l ≤
/// [`MAX_HEADS`], 1 ≤ q ≤ [`MAX_Q_ROWS`], batch ≥ 1, q ≤ context ≤ [`MAX_TOKENS`] and b·q rows
/// within int32. Returns H.
pub fn check_decode_shape(
    dcp_size: usize,
    local_heads: usize,
    num_q: usize,
    batch: usize,
    context: u64,
) -> Result<usize> {
    check_dcp_size(dcp_size)?;
    let heads = check_heads(dcp_size, local_heads)?;
    if num_q == 0 || num_q > MAX_Q_ROWS {
        return Err(PlanError::QueryRows { q: num_q, max: MAX_Q_ROWS }.into());
    }
    if batch == 0 {
        return Err(PlanError::Batch { batch }.into());
    }
    if context < num_q as u64 {
        return Err(PlanError::ContextShorterThanQ { context, q: num_q }.into());
    }
    check_i32("context", context as u128)?;
    check_i32("batch·q rows", batch as u128 * num_q as u128)?;
    Ok(heads)
}

/// The sparse top-k constraint (docs/contract.md §6): K ∈ {256, 512, 1024, 2048} and D·K a multiple of 512; the
/// error names D and K.
pub fn check_topk(d: usize, k: usize) -> Result<()> {
    if d == 0 {
        return Err(PlanError::ZeroDcp { d }.into());
    }
    if !TOPK_SIZES.contains(&k) {
        return Err(PlanError::TopkSize { d, k }.into());
    }
    if d.checked_mul(k).is_none_or(|dk| dk % 512 != 0) {
        return Err(PlanError::TopkMultiple { d, k }.into());
    }
    check_dcp_size(d)?;
    Ok(())
}

/// The head constraint: 1 ≤ H = D·H_l ≤ 128. Returns H.
pub fn check_heads(d: usize, h_l: usize) -> Result<usize> {
    match d.checked_mul(h_l) {
        Some(h) if (1..=MAX_HEADS).contains(&h) => Ok(h),
        _ => Err(PlanError::Heads { d, h_l, max: MAX_HEADS }.into()),
    }
}

/// A value the device holds as int32, or an overflow error naming it.
pub fn check_i32(what: &'static str, value: u128) -> Result<i32> {
    i32::try_from(value).map_err(|_| PlanError::Overflow { what, value }.into())
}

/// Causal local lengths of MTP rows (docs/contract.md §2): for each request i of total length lens\[i\]
/// (including its qs\[i\] new tokens), row j sees global length c_j = L − q + 1 + j, i.e.
/// n_r(c_j) local tokens on rank r. Returns the rows of every request, concatenated (a uniform q
/// gives the kernels' [b, q] layout).
pub fn causal_local_lens(lens: &[u64], qs: &[usize], dcp: DcpLayout, r: usize) -> Result<Vec<i32>> {
    assert_eq!(lens.len(), qs.len(), "one q per request");
    // no capacity from qs before they are checked: a huge q would abort in the allocator
    let mut rows = Vec::new();
    for (request, (&len, &q)) in lens.iter().zip(qs).enumerate() {
        if q == 0 || q > MAX_Q_ROWS {
            return Err(PlanError::QueryRows { q, max: MAX_Q_ROWS }.into());
        }
        if len < q as u64 {
            return Err(PlanError::ShorterThanQ { request, len, q }.into());
        }
        check_i32("request length", len as u128)?;
        rows.extend((0..q as u64).map(|j| dcp.local_len(len - q as u64 + 1 + j, r) as i32));
    }
    Ok(rows)
}

/// Block-table addressing of local position l of one request: page·B + slot through its table
/// row, or None when the column lies beyond the row or the page is negative or ≥ num_pages.
pub fn local_slot(table_row: &[i32], block_size: usize, num_pages: usize, l: u64) -> Option<u64> {
    let col = usize::try_from(l / block_size as u64).ok()?;
    let page = *table_row.get(col)?;
    if page < 0 || page as usize >= num_pages {
        return None;
    }
    Some(page as u64 * block_size as u64 + l % block_size as u64)
}

/// Global tokens a DCP group can hold when every rank has `bytes_per_rank` of cache in `format`:
/// whole pages per rank times B·D (capacity grows D-fold).
pub fn capacity_tokens(bytes_per_rank: u64, format: KvFormat, block_size: usize, d: usize) -> u64 {
    pages_per_rank(bytes_per_rank, format, block_size).saturating_mul(block_size as u64).saturating_mul(d as u64)
}

/// Pages per rank that hold `bytes_per_rank` of cache in `format`.
pub fn pages_per_rank(bytes_per_rank: u64, format: KvFormat, block_size: usize) -> u64 {
    // saturating is exact: a page beyond u64 bytes holds more than any budget, so 0 pages
    bytes_per_rank / (block_size as u64).saturating_mul(format.token_bytes() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_values() {
        let e = check_topk(1, 256).unwrap_err().to_string();
        assert!(e.contains("K = 256") && e.contains("D = 1"), "{e}");
        let e = check_topk(3, 768).unwrap_err().to_string();
        assert!(e.contains("K = 768") && e.contains("D = 3"), "{e}");
        assert!(check_topk(8, 2048).is_ok());
        let e = DcpConfig::new(8, 3, 1, 64).unwrap_err().to_string();
        assert!(e.contains("tp = 8") && e.contains("D = 3"), "{e}");
        assert!(DcpConfig::new(8, 4, 3, 64).is_err());
        assert!(DcpConfig::new(8, 4, 16, 64).is_ok());
        assert!(check_heads(8, 17).is_err());
        assert_eq!(check_heads(4, 16).unwrap(), 64);
    }
}
