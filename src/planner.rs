//! The planner (SPEC.md §2, §7, §8): token ownership, local and causal lengths, pages,
//! capacity and workspace sizes. Pure host arithmetic, shared by the CPU reference, the
//! launchers and the C ABI.

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
}
