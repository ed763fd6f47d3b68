//! The decode kernel catalogue: which decode kernels this build ships for each kind of launch,
//! how they are named (`DCP_MLA_DECODE_PATH`, the tuned table, `dcp-mla tune`), and the
//! launcher's heuristic among them. Below both the planner (the tuned table, the choice) and the
//! launchers (`ops::decode`), which read it; it reads only the generated registry.
//!
//! The choice itself, with its precedence, is [`crate::planner::choice::choose_decode`]; how to
//! add a schedule is in docs/design.md, "Choosing a kernel".

use crate::formats::KvFormat;
use crate::runtime::registry::{self, axes};

/// Which decode kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePath {
    /// The launcher's choice ([`crate::planner::choice::choose_decode`]): `DCP_MLA_DECODE_PATH`
    /// (read once: `mma`, `wgmma` (the dense default) or `wgmma-<schedule>-<tile>x<stages>`),
    /// else the tuned table's row for the launch's class, else the heuristic ([`heuristic_path`]:
    /// the wgmma default of kernels.toml on compute capability 9.0 when built, else mma.sync).
    Auto,
    /// The mma.sync kernel (sm_80+), `kernels-src/decode/sm80.cuh`.
    Mma,
    /// The wgmma kernel (sm_90a only), `kernels-src/decode/sm90_trio.cuh`: `tile` KV tokens per
    /// S = Q·Kᵀ step, a ring of `stages` buffers and a schedule; one of [`sm90_variants`] for the
    /// launch's kind.
    Wgmma { tile: u32, stages: u32, schedule: Sm90Schedule },
}

/// How the wgmma kernel's warpgroups share a tile: the `schedule` axis of kernels.toml itself
/// (`Sm90Schedule` in decode/sm90_base.cuh describes each). `Trio`: three warpgroups, one
/// computing S, the softmax and P, two holding O's halves and doing P·V (one also loads), so the
/// next tile is scored while this one is multiplied (dense and sparse BF16). `TrioSplit`: trio
/// handing P over in two halves (sequences of two or more row blocks). `Lead`: sparse FP8's and
/// MODEL1's schedule: a producer warpgroup dequantises every tile, the scorer also multiplies O's
/// left half by its own P from registers, one P·V warpgroup the right half (FlashMLA's split).
pub type Sm90Schedule = axes::Schedule;

/// A wgmma decode variant: its tile (KV tokens per S step), stages (buffers) and schedule, as
/// kernels.toml's axes name it.
pub type Sm90Variant = (u32, u32, Sm90Schedule);

/// The DSL's `kv` axis of a launch over `format` (`sparse`: index lists, else the dense block
/// table, always BF16).
pub fn kv_axis(format: KvFormat, sparse: bool) -> axes::Kv {
    match (sparse, format) {
        (false, _) => axes::Kv::DenseBf16,
        (true, KvFormat::Bf16) => axes::Kv::SparseBf16,
        (true, KvFormat::Fp8_656) => axes::Kv::SparseFp8,
    }
}

/// Every wgmma decode variant kernels.toml ships for a launch over `format` (`sparse`: index
/// lists, else the dense block table), in kernels.toml's Hopper decode family: the one it marks
/// `default` first, then the rest in its order. BF16 runs trio (trio_split from two row blocks),
/// FP8 lead (its producer warpgroup dequantises the tiles).
pub fn sm90_variants(format: KvFormat, sparse: bool) -> Vec<Sm90Variant> {
    let kv = kv_axis(format, sparse);
    let mut v: Vec<(Sm90Variant, bool)> = registry::MLA_DECODE_SM90_TRIO_VARIANTS
        .iter()
        .filter(|((k, ..), _)| *k == kv)
        .map(|&((_, tile, stages, schedule), default)| ((tile, stages, schedule), default))
        .collect();
    v.sort_by_key(|&(_, default)| !default); // stable: kernels.toml's order otherwise
    v.into_iter().map(|(x, _)| x).collect()
}

/// Every shipped wgmma variant of any kind, MODEL1's included, each once (what
/// `DCP_MLA_DECODE_PATH` may name).
pub fn all_sm90_variants() -> Vec<Sm90Variant> {
    let mut all: Vec<Sm90Variant> = Vec::new();
    let kinds = KINDS.iter().flat_map(|&(format, sparse)| sm90_variants(format, sparse));
    for v in kinds.chain(model1_sm90_variants()) {
        if !all.contains(&v) {
            all.push(v);
        }
    }
    all
}

/// MODEL1's wgmma variants (`kernels-src/decode/sm90_trio.cuh` over `DecodeKv::Model1`, d_qk =
/// 512): kernels.toml's `mla_decode_model1_sm90_lead` (lead).
pub fn model1_sm90_variants() -> Vec<Sm90Variant> {
    registry::MLA_DECODE_MODEL1_SM90_LEAD_VARIANTS
        .iter()
        .map(|&((_, tile, stages, schedule), _)| (tile, stages, schedule))
        .collect()
}

/// Whether kernels.toml builds MODEL1's mma.sync kernel (`mla_decode_model1`, sm_80 and sm_90).
pub fn model1_mma_built() -> bool {
    !registry::MLA_DECODE_MODEL1_VARIANTS.is_empty()
}

/// Every MODEL1 decode kernel this build ships, named by [`variant_name`]: the mma.sync kernel
/// (`mma`), then the wgmma variants ([`model1_sm90_variants`]).
pub fn model1_variants() -> Vec<(String, DecodePath)> {
    let mma = model1_mma_built().then_some(DecodePath::Mma);
    let wgmma =
        model1_sm90_variants().into_iter().map(|(tile, stages, schedule)| DecodePath::Wgmma { tile, stages, schedule });
    mma.into_iter().chain(wgmma).map(|path| (variant_name(path), path)).collect()
}

/// The MODEL1 launcher's heuristic: its first wgmma variant on a device that runs wgmma (`sm90`:
/// compute capability 9.0), whatever the heads (each CTA holds a row block of 64 of a query row's
/// heads), else the mma.sync kernel; `None` when nothing is built. (On an H100, 2026-12-06, quad
/// over MODEL1's cache took 0.54-0.63 of the mma.sync kernel's time at FlashMLA's three MODEL1
/// shapes; lead, 2026-12-07, 0.96-0.97 of quad's, and quad was removed.)
pub fn model1_heuristic_path(sm90: bool) -> Option<DecodePath> {
    let wgmma =
        model1_sm90_variants().first().map(|&(tile, stages, schedule)| DecodePath::Wgmma { tile, stages, schedule });
    wgmma.filter(|_| sm90).or(model1_mma_built().then_some(DecodePath::Mma))
}

/// Whether `path` names a MODEL1 kernel this build ships (`Auto` names none).
pub fn model1_ships(path: DecodePath) -> bool {
    model1_variants().iter().any(|&(_, p)| p == path)
}

/// The three kinds of decode launch: dense BF16, sparse BF16, sparse FP8-656.
pub const KINDS: [(KvFormat, bool); 3] = [(KvFormat::Bf16, false), (KvFormat::Bf16, true), (KvFormat::Fp8_656, true)];

/// Whether kernels.toml builds the mma.sync decode kernel for the kind.
pub fn mma_built(format: KvFormat, sparse: bool) -> bool {
    let kv = kv_axis(format, sparse);
    registry::MLA_DECODE_VARIANTS.iter().any(|((k, _), _)| *k == kv)
}

/// Whether `path` names a kernel this build ships for the kind (`Auto` names none).
pub fn ships(path: DecodePath, format: KvFormat, sparse: bool) -> bool {
    match path {
        DecodePath::Auto => false,
        DecodePath::Mma => mma_built(format, sparse),
        DecodePath::Wgmma { tile, stages, schedule } => {
            sm90_variants(format, sparse).contains(&(tile, stages, schedule))
        }
    }
}

/// `DCP_MLA_DECODE_PATH`'s spelling of a kernel: `mma`, or `wgmma-<schedule>-<tile>x<stages>`;
/// `auto` for [`DecodePath::Auto`].
pub fn variant_name(path: DecodePath) -> String {
    match path {
        DecodePath::Auto => "auto".into(),
        DecodePath::Mma => "mma".into(),
        DecodePath::Wgmma { tile, stages, schedule } => format!("wgmma-{}-{tile}x{stages}", schedule.name()),
    }
}

/// Every decode kernel this build ships for a launch over `format` (`sparse`: index lists, else
/// the dense block table), named by [`variant_name`]: the mma.sync kernel when kernels.toml
/// builds one for the kind, then the wgmma variants, default first ([`sm90_variants`]).
pub fn decode_variants(format: KvFormat, sparse: bool) -> Vec<(String, DecodePath)> {
    let mut v = Vec::new();
    if mma_built(format, sparse) {
        v.push(("mma".to_string(), DecodePath::Mma));
    }
    for (tile, stages, schedule) in sm90_variants(format, sparse) {
        let path = DecodePath::Wgmma { tile, stages, schedule };
        v.push((variant_name(path), path));
    }
    v
}

/// The kind's default wgmma variant (kernels.toml's `default`), its schedule as the heuristic
/// adjusts it for sequences of `row_blocks` blocks ([`auto_schedule`]); `None` when none is built.
pub fn default_wgmma(format: KvFormat, sparse: bool, row_blocks: usize) -> Option<DecodePath> {
    let &(tile, stages, schedule) = sm90_variants(format, sparse).first()?;
    Some(DecodePath::Wgmma { tile, stages, schedule: auto_schedule(schedule, row_blocks) })
}

/// The launcher's heuristic for a launch over `format` whose sequences have `row_blocks` row
/// blocks, on a device that runs wgmma (`sm90`: compute capability 9.0) or not: the kind's
/// default wgmma variant ([`default_wgmma`]); mma.sync without wgmma; `None` when nothing is
/// built.
pub fn heuristic_path(format: KvFormat, sparse: bool, row_blocks: usize, sm90: bool) -> Option<DecodePath> {
    sm90.then(|| default_wgmma(format, sparse, row_blocks))
        .flatten()
        .or(mma_built(format, sparse).then_some(DecodePath::Mma))
}

/// The schedule the heuristic runs for a kind whose default is `default`, on sequences of
/// `row_blocks` blocks of 64 rows: trio_split in place of trio from two blocks on, where the
/// scorer's chain bounds the tile and handing P over in halves overlaps it with P·V (H200: −7 to
/// −8%); a sequence of one block is bound by its KV stream, where the second hand-over costs
/// 1-3%, so trio stays.
pub fn auto_schedule(default: Sm90Schedule, row_blocks: usize) -> Sm90Schedule {
    if default == Sm90Schedule::Trio && row_blocks >= 2 {
        Sm90Schedule::TrioSplit
    } else {
        default
    }
}

/// `DCP_MLA_DECODE_PATH` (read once): unset or empty is `None`; a value that names no shipped
/// kernel is an error naming it and listing the valid ones, so a misspelling is never silently
/// ignored.
pub fn env_path() -> crate::error::Result<Option<DecodePath>> {
    static PATH: std::sync::OnceLock<std::result::Result<Option<DecodePath>, String>> = std::sync::OnceLock::new();
    PATH.get_or_init(|| parse_env_path(std::env::var("DCP_MLA_DECODE_PATH").ok().as_deref()))
        .clone()
        .map_err(|reason| crate::error::Error::arg("DCP_MLA_DECODE_PATH", reason))
}

/// A `DCP_MLA_DECODE_PATH` value: see [`env_path`].
pub fn parse_env_path(v: Option<&str>) -> std::result::Result<Option<DecodePath>, String> {
    match v {
        None | Some("") => Ok(None),
        Some("mma") => Ok(Some(DecodePath::Mma)),
        Some(s) => parse_wgmma_path(s).map(Some).ok_or_else(|| {
            let mut valid = vec!["mma".to_string(), "wgmma".to_string()];
            valid.extend(all_sm90_variants().iter().map(|(t, st, sc)| format!("wgmma-{}-{t}x{st}", sc.name())));
            let removed = REMOVED_SCHEDULES
                .iter()
                .find(|r| {
                    s.strip_prefix("wgmma-").and_then(|x| x.strip_prefix(**r)).is_some_and(|x| x.starts_with('-'))
                })
                .map(|r| format!(" (the {r} schedule was removed: CHANGELOG.md)"))
                .unwrap_or_default();
            format!("{s:?} names no decode kernel{removed}; valid: {}", valid.join(", "))
        }),
    }
}

/// The wgmma schedules earlier releases shipped (issue 48 removed the first three, issue 61 the
/// rest: no shape ran them by default, no tuned row picked them): `DCP_MLA_DECODE_PATH` naming one
/// is refused saying so.
pub const REMOVED_SCHEDULES: [&str; 6] = ["plain", "roles", "seesaw", "quad_pair", "quad", "pair"];

/// `wgmma` (the dense default) or `wgmma-<schedule>-<tile>x<stages>` naming a shipped variant of
/// some kind (each launch checks its own list, [`sm90_variants`]).
pub fn parse_wgmma_path(s: &str) -> Option<DecodePath> {
    if s == "wgmma" {
        let (tile, stages, schedule) = *sm90_variants(KvFormat::Bf16, false).first()?;
        return Some(DecodePath::Wgmma { tile, stages, schedule });
    }
    let rest = s.strip_prefix("wgmma-")?;
    let (name, shape) = rest.split_once('-')?;
    let schedule = Sm90Schedule::ALL.iter().copied().find(|x| x.name() == name)?;
    let (tile, stages) = shape.split_once('x')?;
    let v = (tile.parse().ok()?, stages.parse().ok()?, schedule);
    all_sm90_variants().contains(&v).then_some(DecodePath::Wgmma { tile: v.0, stages: v.1, schedule })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::planner::split::row_blocks_per_seq;

    #[test]
    fn decode_path_values_are_parsed_or_refused_by_name() {
        assert_eq!(parse_env_path(None), Ok(None));
        assert_eq!(parse_env_path(Some("")), Ok(None));
        assert_eq!(parse_env_path(Some("mma")), Ok(Some(DecodePath::Mma)));
        let (tile, stages, schedule) = sm90_variants(KvFormat::Bf16, false)[0];
        assert_eq!(parse_env_path(Some("wgmma")), Ok(Some(DecodePath::Wgmma { tile, stages, schedule })));
        assert_eq!(
            parse_env_path(Some("wgmma-lead-64x2")),
            Ok(Some(DecodePath::Wgmma { tile: 64, stages: 2, schedule: Sm90Schedule::Lead }))
        );
        for bad in ["wgmma-trio-64x3", "wgmma-rolesx-64x2", "MMA", "wgmma-quad", "wgmma-pairs-64x2", "fast"] {
            let e = parse_env_path(Some(bad)).unwrap_err();
            assert!(e.contains(bad) && e.contains("wgmma-trio-64x2") && e.contains("mma"), "{e}");
            assert!(!e.contains("removed"), "{e}");
        }
    }

    #[test]
    fn removed_schedules_are_refused_by_name() {
        // issues 48 and 61: the plain, roles, seesaw, quad_pair, quad and pair schedules are gone;
        // naming one is an error that names the path, says the schedule was removed and lists
        // what is shipped
        for (path, schedule) in [
            ("wgmma-plain-64x2", "plain"),
            ("wgmma-plain-32x4", "plain"),
            ("wgmma-roles-64x2", "roles"),
            ("wgmma-seesaw-64x2", "seesaw"),
            ("wgmma-quad_pair-64x2", "quad_pair"),
            ("wgmma-quad-64x2", "quad"),
            ("wgmma-pair-64x2", "pair"),
        ] {
            let e = parse_env_path(Some(path)).unwrap_err();
            assert!(e.contains(&format!("{path:?}")), "{e}");
            assert!(e.contains(&format!("the {schedule} schedule was removed")), "{e}");
            assert!(e.contains("wgmma-trio-64x2") && e.contains("wgmma-lead-64x2"), "{e}");
            // as the launchers report it
            let Error::InvalidArgument { arg, .. } = Error::arg("DCP_MLA_DECODE_PATH", e) else { unreachable!() };
            assert_eq!(arg, "DCP_MLA_DECODE_PATH");
        }
    }

    #[test]
    fn wgmma_path_names_parse() {
        let w = |tile, stages, schedule| Some(DecodePath::Wgmma { tile, stages, schedule });
        assert_eq!(parse_wgmma_path("wgmma"), w(64, 2, Sm90Schedule::Trio), "the dense default");
        assert_eq!(parse_wgmma_path("wgmma-trio-64x2"), w(64, 2, Sm90Schedule::Trio));
        assert_eq!(parse_wgmma_path("wgmma-trio-64x3"), None, "not shipped");
        assert_eq!(parse_wgmma_path("wgmma-lead-64x2"), w(64, 2, Sm90Schedule::Lead));
        assert_eq!(parse_wgmma_path("wgmma-quad-64x2"), None, "removed (issue 61)");
        assert_eq!(parse_wgmma_path("wgmma-pair-64x2"), None, "removed (issue 61)");
        assert_eq!(parse_wgmma_path("wgmma-plain-32x4"), None, "removed (issue 48)");
        assert_eq!(parse_wgmma_path("wgmma-roles-64x2"), None, "removed (issue 48)");
        assert_eq!(parse_wgmma_path("wgmma-seesaw-64x2"), None, "removed (issue 48)");
        assert_eq!(parse_wgmma_path("wgmma-64x2"), None, "no schedule");
        assert_eq!(parse_wgmma_path("wgmma-trio-64"), None);
        assert_eq!(parse_wgmma_path("mma"), None);
    }

    #[test]
    fn variants_are_named_as_the_env_var_names_them() {
        let dense: Vec<String> = decode_variants(KvFormat::Bf16, false).into_iter().map(|(n, _)| n).collect();
        assert_eq!(dense, ["mma", "wgmma-trio-64x2", "wgmma-trio_split-64x2"]);
        let fp8: Vec<String> = decode_variants(KvFormat::Fp8_656, true).into_iter().map(|(n, _)| n).collect();
        assert_eq!(fp8, ["mma", "wgmma-lead-64x2"]);
        assert_eq!(variant_name(DecodePath::Auto), "auto");
        // every name parses back to its path
        for (format, sparse) in KINDS {
            for (name, path) in decode_variants(format, sparse) {
                assert_eq!(parse_env_path(Some(&name)), Ok(Some(path)), "{name}");
                assert!(ships(path, format, sparse), "{name}");
            }
        }
    }

    #[test]
    fn model1_ships_mma_and_lead_and_runs_lead_on_sm90() {
        let names: Vec<String> = model1_variants().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["mma", "wgmma-lead-64x2"]);
        let lead = DecodePath::Wgmma { tile: 64, stages: 2, schedule: Sm90Schedule::Lead };
        assert_eq!(model1_heuristic_path(true), Some(lead));
        assert_eq!(model1_heuristic_path(false), Some(DecodePath::Mma));
        assert!(model1_ships(lead) && model1_ships(DecodePath::Mma));
        assert!(!model1_ships(DecodePath::Wgmma { tile: 64, stages: 2, schedule: Sm90Schedule::Trio }));
        assert!(!model1_ships(DecodePath::Auto));
        // DCP_MLA_DECODE_PATH names MODEL1's variants as every other kind's
        for (name, path) in model1_variants() {
            assert_eq!(parse_env_path(Some(&name)), Ok(Some(path)), "{name}");
        }
    }

    #[test]
    fn trio_split_runs_where_a_sequence_has_two_or_more_row_blocks() {
        // dense: a request's rows are nq·H; sparse: a query row's H
        for (nq, h, sparse) in [(1, 128, false), (2, 64, false), (6, 64, false), (2, 128, true)] {
            assert_eq!(auto_schedule(Sm90Schedule::Trio, row_blocks_per_seq(nq, h, sparse)), Sm90Schedule::TrioSplit);
        }
        for (nq, h, sparse) in [(1, 64, false), (1, 16, false), (2, 64, true)] {
            assert_eq!(
                auto_schedule(Sm90Schedule::Trio, row_blocks_per_seq(nq, h, sparse)),
                Sm90Schedule::Trio,
                "one block"
            );
        }
        // FP8's default (lead) is kept whatever the shape
        assert_eq!(auto_schedule(Sm90Schedule::Lead, 2), Sm90Schedule::Lead);
        // and both BF16 kinds ship it
        for sparse in [false, true] {
            assert!(sm90_variants(KvFormat::Bf16, sparse).contains(&(64, 2, Sm90Schedule::TrioSplit)));
        }
    }

    #[test]
    fn the_heuristic_runs_each_kinds_default_and_mma_without_wgmma() {
        let w = |schedule| Some(DecodePath::Wgmma { tile: 64, stages: 2, schedule });
        assert_eq!(heuristic_path(KvFormat::Bf16, false, 1, true), w(Sm90Schedule::Trio));
        assert_eq!(heuristic_path(KvFormat::Bf16, false, 2, true), w(Sm90Schedule::TrioSplit));
        assert_eq!(heuristic_path(KvFormat::Bf16, false, 6, true), w(Sm90Schedule::TrioSplit));
        // sparse FP8: lead at any number of row blocks
        for rb in [1, 2, 4] {
            assert_eq!(heuristic_path(KvFormat::Fp8_656, true, rb, true), w(Sm90Schedule::Lead), "{rb} blocks");
        }
        assert_eq!(heuristic_path(KvFormat::Bf16, true, 2, true), w(Sm90Schedule::TrioSplit));
        for (format, sparse) in KINDS {
            assert_eq!(heuristic_path(format, sparse, 1, false), Some(DecodePath::Mma), "{format:?} {sparse}");
        }
    }
}
