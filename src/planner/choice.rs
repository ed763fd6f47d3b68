//! Choosing a decode launch's kernel and split count: one function, one precedence
//! ([`choose`]), what every launcher, `decode_num_splits_on`, the C ABI and Python ask.
//!
//! The precedence, first that answers wins:
//! 1. the caller's path (a launch naming a kernel, `mla_decode_*_on`);
//! 2. `DCP_MLA_DECODE_PATH`;
//! 3. the tuned table's row for the launch's class ([`crate::planner::tune`]: its own class or
//!    the nearest), which gives the split count too;
//! 4. the heuristic ([`heuristic_path`]: the DSL's default variant of the kind, trio_split for
//!    sequences of two or more row blocks, mma.sync without wgmma) with [`decode_num_splits`]'s
//!    split count.
//!
//! The split count a launch runs is always the caller's (it sized the workspace);
//! [`DecodeChoice::num_splits`] is what the caller should pass.

use crate::catalogue::{default_wgmma, env_path, heuristic_path, ships, DecodePath};
use crate::error::{Error, Result};
use crate::formats::KvFormat;
use crate::planner::schedule::seq_shape;
use crate::planner::split::{decode_num_splits, row_blocks_per_seq};
use crate::planner::tune::{tuned_decode, DecodeClass, TunedChoice};
use crate::runtime::Device;

/// A decode launch's shape as the choice sees it (before [`DecodeClass`]'s buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeShape {
    /// Index lists (sparse), else the dense block table (BF16).
    pub sparse: bool,
    pub format: KvFormat,
    pub batch: usize,
    /// Query rows a request.
    pub nq: usize,
    pub heads: usize,
    /// Dense: the most tokens a request may hold (the block table's capacity). Sparse: the top-k.
    pub context: usize,
    /// Causal MTP rows (row j sees L − q + 1 + j tokens).
    pub causal: bool,
}

impl DecodeShape {
    /// The tuned table's class (lengths counted as equal: the launcher cannot know).
    pub fn class(&self) -> DecodeClass {
        DecodeClass::new(*self, false)
    }

    /// Row blocks (64 query rows) a sequence.
    pub fn row_blocks(&self) -> usize {
        row_blocks_per_seq(self.nq, self.heads, self.sparse)
    }

    /// The heuristic's split count on `num_sms` SMs: one where [`Self::short_unsplit`], else
    /// [`decode_num_splits`]'s.
    pub fn heuristic_splits(&self, num_sms: usize) -> usize {
        if self.short_unsplit(num_sms) {
            1
        } else {
            decode_num_splits(self.batch, self.nq, self.heads, self.sparse, num_sms)
        }
    }

    /// The heuristic's kernel ([`heuristic_path`]) on a device that runs wgmma (`sm90`) or not;
    /// `None` when no kernel of the kind is built.
    pub fn heuristic_path(&self, sm90: bool) -> Option<DecodePath> {
        heuristic_path(self.format, self.sparse, self.row_blocks(), sm90)
    }

    /// Whether the sequences are so few tiles long (at most `context` tokens) and so many that
    /// one part each beats any split, whatever [`decode_num_splits`]'s wave rule says: a split's
    /// fixed costs (the schedule, each part's start, the combine) outweigh the tail it trims.
    /// The bounds are where the tuned tables (H100 and H200, 2026-12) run unsplit: dense
    /// sequences of at most 16 tiles from half a wave of CTAs on (b64 at 1K: 1.12-1.29x faster
    /// unsplit in both), sparse top-k of at most 8 tiles from a quarter of a wave (b32 H64 K512
    /// 1.32x, b64 K256 1.54x). 32 dense or 16 sparse tiles at b64 q1 keep the split; b64 q6 H64
    /// at 2K (32 tiles, three waves) ran unsplit in one H100 tune only (1.14x equal, 1.02x
    /// ragged), so it is left to the table. `context` 0 (unknown) is never short.
    pub fn short_unsplit(&self, num_sms: usize) -> bool {
        if self.context == 0 {
            return false;
        }
        let tiles = self.context.div_ceil(SPLIT_CAP_TILE);
        let ctas = seq_shape(self.batch, self.nq, self.heads, self.sparse).0.saturating_mul(self.row_blocks());
        // at least num/den of a wave, less 5% (b64 on 132 SMs is half a wave)
        let at_least = |num: usize, den: usize| ctas.saturating_mul(den * 100) >= num_sms.saturating_mul(num * 95);
        if self.sparse {
            tiles <= 8 && at_least(1, 4)
        } else {
            tiles <= 16 && at_least(1, 2)
        }
    }

    /// The most parts worth planning for at most `context` tokens a sequence (a shape-only
    /// count, as a captured graph needs): one when a sequence fits one tile of
    /// [`SPLIT_CAP_TILE`] tokens (a split would only add the schedule and the combine: H100,
    /// b 8 H 16 at 64 tokens, 21.7 µs of GPU time a call at the heuristic's 128 parts against
    /// 9.9 unsplit), else one part a tile of the batch. `context` 0 (unknown) caps nothing.
    pub fn max_useful_splits(&self) -> usize {
        if self.context == 0 {
            return usize::MAX;
        }
        let tiles = self.context.div_ceil(SPLIT_CAP_TILE);
        if tiles <= 1 {
            1
        } else {
            seq_shape(self.batch, self.nq, self.heads, self.sparse).0.saturating_mul(tiles)
        }
    }
}

/// The KV tile, in tokens, that [`DecodeShape::max_useful_splits`] counts a context in: the
/// largest any decode kernel runs (the wgmma schedules'), so the cap never leaves a kernel with
/// smaller tiles fewer parts than it has tiles.
pub const SPLIT_CAP_TILE: usize = 64;

/// Which rule of the precedence made a choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ChoiceSource {
    Caller,
    Env,
    /// The tuned table; `distance` from the launch's class to the row's (0: its own class).
    Tuned {
        distance: f64,
    },
    Heuristic,
}

/// What runs: the kernel (never [`DecodePath::Auto`]) and, from the tuned table, the split count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeChoice {
    pub path: DecodePath,
    pub source: ChoiceSource,
    /// The tuned row's split count; `None`: the heuristic's.
    pub tuned_splits: Option<usize>,
}

impl DecodeChoice {
    /// The split count a caller should pass for `shape` on `num_sms` SMs: the tuned row's, else
    /// the heuristic's, capped by [`DecodeShape::max_useful_splits`].
    pub fn num_splits(&self, shape: &DecodeShape, num_sms: usize) -> usize {
        let p = self.tuned_splits.unwrap_or_else(|| shape.heuristic_splits(num_sms));
        p.min(shape.max_useful_splits()).max(1)
    }
}

/// [`choose`] on `dev`: its compute capability, `DCP_MLA_DECODE_PATH` and the tuned table in
/// force for it. Errors: a malformed `DCP_MLA_DECODE_PATH`, a refused table, or no kernel built.
pub fn choose_decode(dev: &Device, shape: &DecodeShape, caller: DecodePath) -> Result<DecodeChoice> {
    let sm90 = dev.compute_capability() == (9, 0);
    choose(shape, caller, env_path()?, sm90, |c| tuned_decode(dev, c))
}

/// The split count a caller should pass for a launch of `shape` on `dev` that lets the launcher
/// choose its kernel ([`DecodePath::Auto`]): the tuned table's where its row is the choice, else
/// [`decode_num_splits`]'s.
pub fn decode_num_splits_on(dev: &Device, shape: &DecodeShape) -> Result<usize> {
    let choice = choose_decode(dev, shape, DecodePath::Auto)?;
    Ok(choice.num_splits(shape, dev.num_sms()))
}

/// The precedence (the module's list) with its inputs given: `env` is `DCP_MLA_DECODE_PATH`,
/// `sm90` whether the device runs wgmma, `tuned` the table's lookup
/// (asked only when the caller and the environment leave the choice to it).
pub fn choose(
    shape: &DecodeShape,
    caller: DecodePath,
    env: Option<DecodePath>,
    sm90: bool,
    tuned: impl FnOnce(&DecodeClass) -> Result<Option<TunedChoice>>,
) -> Result<DecodeChoice> {
    let (format, sparse, rb) = (shape.format, shape.sparse, shape.row_blocks());
    let made = |path, source| DecodeChoice { path, source, tuned_splits: None };
    if caller != DecodePath::Auto {
        return Ok(made(caller, ChoiceSource::Caller));
    }
    if let Some(env) = env {
        let path = match env {
            DecodePath::Wgmma { .. } if sm90 && ships(env, format, sparse) => env,
            // another kind's variant, or no wgmma here: the kind's default (mma.sync without wgmma)
            DecodePath::Wgmma { .. } => {
                sm90.then(|| default_wgmma(format, sparse, rb)).flatten().unwrap_or(DecodePath::Mma)
            }
            p => p,
        };
        return Ok(made(path, ChoiceSource::Env));
    }
    if let Some(t) = tuned(&shape.class())? {
        return Ok(DecodeChoice {
            path: t.path,
            source: ChoiceSource::Tuned { distance: t.distance },
            tuned_splits: Some(t.num_splits),
        });
    }
    let kind = if sparse { "sparse" } else { "dense" };
    let path = shape
        .heuristic_path(sm90)
        .ok_or_else(|| Error::Unsupported(format!("mla_decode {kind} {format:?}: no decode kernel built")))?;
    Ok(made(path, ChoiceSource::Heuristic))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::Sm90Schedule;

    fn shape(sparse: bool, format: KvFormat, batch: usize, nq: usize, heads: usize, context: usize) -> DecodeShape {
        DecodeShape { sparse, format, batch, nq, heads, context, causal: false }
    }

    #[test]
    fn a_context_of_one_tile_is_never_split() {
        let c = choose(&shape(false, KvFormat::Bf16, 8, 1, 16, 64), DecodePath::Auto, None, true, no_table).unwrap();
        assert_eq!(c.num_splits(&shape(false, KvFormat::Bf16, 8, 1, 16, 64), 132), 1);
        assert_eq!(c.num_splits(&shape(false, KvFormat::Bf16, 8, 1, 16, 1), 132), 1);
        // two tiles a request: at most one part a tile of the batch (8 · 2), not the wave's 128
        assert!(decode_num_splits(8, 1, 16, false, 132) > 16);
        assert_eq!(c.num_splits(&shape(false, KvFormat::Bf16, 8, 1, 16, 128), 132), 16);
        // a tuned row is capped alike; long contexts keep what the heuristic or the row says
        let t = choose(
            &shape(false, KvFormat::Bf16, 8, 1, 16, 64),
            DecodePath::Auto,
            None,
            true,
            table(w(Sm90Schedule::Trio), 64),
        )
        .unwrap();
        assert_eq!(t.num_splits(&shape(false, KvFormat::Bf16, 8, 1, 16, 64), 132), 1);
        let long = shape(false, KvFormat::Bf16, 8, 1, 16, 32768);
        assert_eq!(c.num_splits(&long, 132), decode_num_splits(8, 1, 16, false, 132));
        // sparse: a sequence is a query row, the context its top-k
        let sp = shape(true, KvFormat::Fp8_656, 2, 1, 64, 64);
        assert_eq!(c.num_splits(&sp, 132), 1);
        assert_eq!(shape(true, KvFormat::Fp8_656, 2, 2, 64, 512).max_useful_splits(), 32);
        assert_eq!(shape(false, KvFormat::Bf16, 8, 1, 16, 0).max_useful_splits(), usize::MAX);
    }

    fn w(schedule: Sm90Schedule) -> DecodePath {
        DecodePath::Wgmma { tile: 64, stages: 2, schedule }
    }

    fn no_table(_: &DecodeClass) -> Result<Option<TunedChoice>> {
        Ok(None)
    }

    fn table(path: DecodePath, num_splits: usize) -> impl FnOnce(&DecodeClass) -> Result<Option<TunedChoice>> {
        move |_| Ok(Some(TunedChoice { path, num_splits, distance: 0.0 }))
    }

    fn never(_: &DecodeClass) -> Result<Option<TunedChoice>> {
        panic!("the table is not asked when the caller or the environment chose")
    }

    #[test]
    fn the_caller_then_the_environment_then_the_table_then_the_heuristic() {
        let fp8 = shape(true, KvFormat::Fp8_656, 64, 1, 128, 512);
        let lead = w(Sm90Schedule::Lead);
        // the caller's path wins, and the table is not asked
        let c = choose(&fp8, lead, Some(DecodePath::Mma), true, never).unwrap();
        assert_eq!((c.path, c.source, c.tuned_splits), (lead, ChoiceSource::Caller, None));
        // then DCP_MLA_DECODE_PATH
        let c = choose(&fp8, DecodePath::Auto, Some(DecodePath::Mma), true, never).unwrap();
        assert_eq!((c.path, c.source), (DecodePath::Mma, ChoiceSource::Env));
        // then the table, with its split count
        let c = choose(&fp8, DecodePath::Auto, None, true, table(DecodePath::Mma, 1)).unwrap();
        assert_eq!(
            (c.path, c.source, c.tuned_splits),
            (DecodePath::Mma, ChoiceSource::Tuned { distance: 0.0 }, Some(1))
        );
        assert_eq!(c.num_splits(&fp8, 132), 1);
        // then the heuristic: the default (lead) for two row blocks of a long top-k, the
        // heuristic's split count
        let long = shape(true, KvFormat::Fp8_656, 64, 1, 128, 2048);
        let c = choose(&long, DecodePath::Auto, None, true, no_table).unwrap();
        assert_eq!((c.path, c.source), (lead, ChoiceSource::Heuristic));
        assert_eq!(c.num_splits(&long, 132), decode_num_splits(64, 1, 128, true, 132));
        // and unsplit for a short one (K = 512: eight tiles)
        let c = choose(&fp8, DecodePath::Auto, None, true, no_table).unwrap();
        assert_eq!((c.path, c.source), (lead, ChoiceSource::Heuristic));
        assert_eq!(c.num_splits(&fp8, 132), 1);
        // a refused table is the launch's error
        let refused = |_: &DecodeClass| Err(Error::InvalidConfig("tuned decode table t.json refused: x".into()));
        assert!(choose(&fp8, DecodePath::Auto, None, true, refused).is_err());
    }

    #[test]
    fn short_numerous_sequences_run_unsplit_as_both_tuned_tables_pick() {
        let dense = |b, q, h, ctx| shape(false, KvFormat::Bf16, b, q, h, ctx);
        let sparse = |b, q, h, k| shape(true, KvFormat::Fp8_656, b, q, h, k);
        // (shape, unsplit in the H100 table; the b64 classes in the H200's too)
        let classes = [
            (dense(64, 1, 64, 1024), true),
            (dense(128, 1, 64, 1024), true),
            (dense(64, 1, 128, 1024), true),
            (dense(64, 6, 128, 1024), true),
            (dense(64, 6, 64, 2048), false),
            (dense(32, 1, 64, 1024), false),
            (dense(16, 1, 64, 1024), false),
            (dense(64, 1, 64, 2048), false),
            (dense(64, 6, 32, 2048), false),
            (dense(64, 6, 16, 4096), false),
            (sparse(32, 1, 64, 512), true),
            (sparse(16, 1, 128, 512), true),
            (sparse(64, 1, 64, 256), true),
            (sparse(128, 1, 128, 512), true),
            (sparse(16, 1, 64, 512), false),
            (sparse(8, 1, 128, 512), false),
            (sparse(64, 1, 16, 1024), false),
            (sparse(64, 1, 8, 2048), false),
        ];
        for (s, unsplit) in classes {
            assert_eq!(s.short_unsplit(132), unsplit, "{s:?}");
            assert_eq!(
                s.heuristic_splits(132) == 1,
                unsplit || decode_num_splits(s.batch, s.nq, s.heads, s.sparse, 132) == 1,
                "{s:?}"
            );
        }
        // an unknown context is never short
        assert!(!dense(128, 1, 64, 0).short_unsplit(132));
    }

    #[test]
    fn the_environment_naming_another_kinds_variant_or_wgmma_without_it_falls_back() {
        let dense = shape(false, KvFormat::Bf16, 128, 2, 64, 8192);
        // lead is sparse FP8's: dense runs its own default, adjusted for two row blocks
        let c = choose(&dense, DecodePath::Auto, Some(w(Sm90Schedule::Lead)), true, never).unwrap();
        assert_eq!(c.path, w(Sm90Schedule::TrioSplit));
        // no wgmma on the device: mma.sync
        let c = choose(&dense, DecodePath::Auto, Some(w(Sm90Schedule::Trio)), false, never).unwrap();
        assert_eq!(c.path, DecodePath::Mma);
        // the heuristic without wgmma: mma.sync
        let c = choose(&dense, DecodePath::Auto, None, false, no_table).unwrap();
        assert_eq!(c.path, DecodePath::Mma);
    }

    #[test]
    fn the_class_buckets_the_shape() {
        let s = DecodeShape { causal: true, ..shape(false, KvFormat::Bf16, 100, 2, 64, 5000) };
        let c = s.class();
        assert_eq!((c.shape.batch, c.shape.context, c.shape.causal, c.ragged), (128, 8192, true, false));
        assert_eq!(s.row_blocks(), 2);
    }
}
