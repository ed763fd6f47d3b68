//! Tuned decode choices (issue 53 item 2): a table that `dcp-mla tune` measures on one card,
//! giving for each shape class the decode variant and split count that ran fastest there, and
//! the lookup the decode launcher's `Auto` choice asks before its heuristic.
//!
//! # The table
//!
//! JSON, `tuning/<card>.json` in the repository (docs/performance.md, "Tuned decode table"):
//!
//! ```json
//! { "format_version": 1,
//!   "card": { "name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619 },
//!   "commit": "c6b295d", "date": "2026-12-05", "method": "…",
//!   "rows": [ { "class": { "path": "dense", "kv": "bf16", "b": 128, "q": 1, "h": 64, "ctx": 8192,
//!                          "causal": false, "ragged": false },
//!               "variant": "wgmma-trio-64x2", "num_splits": 128, "us": 421.0, "heuristic_us": 425.3 } ] }
//! ```
//!
//! A row's class is a [`DecodeClass`]: the path (dense block table or sparse index lists), the
//! cache format, the batch and context buckets (powers of two, rounded up), q, H, and whether
//! the rows are causal and the lengths ragged. `ctx` is a request's tokens for a dense launch and
//! the top-k for a sparse one. `variant` is spelled as `DCP_MLA_DECODE_PATH` spells a kernel
//! (`mma`, `wgmma-<schedule>-<tile>x<stages>`); `us` and `heuristic_us` are what the winner and
//! the launcher's heuristic measured (for the reader; the lookup ignores them).
//!
//! # Lookup
//!
//! [`TuneTable::lookup`]: the row of the shape's own class; else the nearest row of the same path,
//! format and row blocks a sequence (the kernels' unit of work, which also decides which variants
//! apply), by [`class_distance`], if it is within [`MAX_NEAREST_DISTANCE`]; else `None`, and the
//! launcher keeps its heuristic.
//!
//! # Which table
//!
//! [`tuned_decode`] reads, in this order: the table given by [`set_tune_table`]; the file named
//! by `DCP_MLA_TUNE_TABLE` (`off`: none); the table embedded in this build for the running card (same name
//! and SM count), if any. A table that is malformed, has another format version, names a variant
//! this build does not ship, or was made for another card is refused with an error naming what is
//! wrong (every later call repeats it): it is never used silently, and never silently dropped.

use crate::catalogue::{decode_variants, DecodePath};
use crate::error::{Error, Result};
use crate::formats::KvFormat;
use crate::planner::choice::DecodeShape;
use crate::planner::split::MAX_SPLITS;
use crate::runtime::Device;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The table format this build reads and writes.
pub const TUNE_FORMAT_VERSION: u64 = 1;

/// The environment variable naming a tuned table file (read when a device first asks), or
/// [`TUNE_TABLE_OFF`].
pub const TUNE_TABLE_ENV: &str = "DCP_MLA_TUNE_TABLE";

/// `DCP_MLA_TUNE_TABLE=off`: no table, the launcher's heuristic everywhere (the embedded table
/// too is left out), to compare against the table from any interface.
pub const TUNE_TABLE_OFF: &str = "off";

/// The farthest class [`TuneTable::lookup`] takes as "nearest" (see [`class_distance`]): e.g. the
/// batch 4× away and the context 2× away, or the batch 8× away alone.
pub const MAX_NEAREST_DISTANCE: f64 = 3.0;

/// Tables embedded in this build, (file name, contents): the committed `tuning/*.json` (add a
/// line when one is committed); the table for the running card (name and SM count) is the default.
const EMBEDDED_TABLES: &[(&str, &str)] = &[
    ("nvidia-h100-80gb-hbm3.json", include_str!("../../tuning/nvidia-h100-80gb-hbm3.json")),
    ("nvidia-h200.json", include_str!("../../tuning/nvidia-h200.json")),
];

/// The shape class of a decode launch: what a tuned row is keyed by. Build it with
/// [`DecodeClass::new`] (or [`DecodeShape::class`]), which rounds the batch and the context up to
/// their buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeClass {
    /// The launch's shape, its batch and context rounded up to powers of two (dense: a request's
    /// tokens, the longest; sparse: the top-k).
    pub shape: DecodeShape,
    /// Lengths differ between requests (the caller's knowledge; the launcher may not know).
    pub ragged: bool,
}

impl DecodeClass {
    /// The class of a launch of `shape`: its batch and context rounded up to powers of two (0
    /// counts as 1).
    pub fn new(shape: DecodeShape, ragged: bool) -> Self {
        let bucket = |n: usize| n.max(1).next_power_of_two();
        DecodeClass {
            shape: DecodeShape { batch: bucket(shape.batch), context: bucket(shape.context), ..shape },
            ragged,
        }
    }

    /// Row blocks (64 query rows) a sequence: one CTA row of the grid.
    pub fn row_blocks(&self) -> usize {
        self.shape.row_blocks()
    }

    /// `dense bf16 b=128 q=1 H=64 ctx=8192` (+ ` causal`, ` ragged`).
    pub fn label(&self) -> String {
        let s = &self.shape;
        let path = if s.sparse { "sparse" } else { "dense" };
        let ctx = if s.sparse { "K" } else { "ctx" };
        format!(
            "{path} {} b={} q={} H={} {ctx}={}{}{}",
            kv_name(s.format),
            s.batch,
            s.nq,
            s.heads,
            s.context,
            if s.causal { " causal" } else { "" },
            if self.ragged { " ragged" } else { "" }
        )
    }

    /// The class as a table's row spells it: `{"path", "kv", "b", "q", "h", "ctx", "causal",
    /// "ragged"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(ClassJson::from(self)).expect("a class serialises")
    }
}

/// How far apart two classes of the same path, format and row blocks are: the sum of
/// |log2(a / b)| over the batch, the context, q and H, plus 1 for a different `causal` and 1 for
/// a different `ragged`. `None` when the path, the format or the row blocks differ (the kernels
/// then do different work, and a variant of one may not run the other).
pub fn class_distance(x: &DecodeClass, y: &DecodeClass) -> Option<f64> {
    let (a, b) = (&x.shape, &y.shape);
    if a.sparse != b.sparse || a.format != b.format || a.row_blocks() != b.row_blocks() {
        return None;
    }
    // |log2(x / y)|: exact for powers of two (the bucketed batch and context, most q and H)
    let log = |x: usize, y: usize| {
        let (x, y) = (x.max(1), y.max(1));
        if x.is_power_of_two() && y.is_power_of_two() {
            (x.trailing_zeros() as f64 - y.trailing_zeros() as f64).abs()
        } else {
            ((x as f64).log2() - (y as f64).log2()).abs()
        }
    };
    let flag = |x: bool, y: bool| if x == y { 0.0 } else { 1.0 };
    Some(
        log(a.batch, b.batch)
            + log(a.context, b.context)
            + log(a.nq, b.nq)
            + log(a.heads, b.heads)
            + flag(a.causal, b.causal)
            + flag(x.ragged, y.ragged),
    )
}

/// What the table says a launch should run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunedChoice {
    /// The kernel: never [`DecodePath::Auto`].
    pub path: DecodePath,
    /// Split-KV parts a row block (1: unsplit), in 1..=[`MAX_SPLITS`].
    pub num_splits: usize,
    /// [`class_distance`] from the shape's class to the row's: 0 for its own class.
    pub distance: f64,
}

/// The card a table was measured on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuneCard {
    /// As the driver names it (`cuDeviceGetName`), e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub sm_count: u32,
    /// The driver's maximum SM and memory clocks when measured (for the reader; not checked).
    pub sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
}

/// A running device's identity, what a table's card must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardId {
    pub name: String,
    pub sm_count: u32,
}

impl CardId {
    /// The identity of `dev`.
    pub fn of(dev: &Device) -> Result<CardId> {
        let name = dev.context().name().map_err(|source| Error::Driver { call: "cuDeviceGetName", source })?;
        Ok(CardId { name, sm_count: dev.num_sms() as u32 })
    }
}

/// One tuned row, as the file holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneRow {
    pub class: DecodeClass,
    /// `mma` or `wgmma-<schedule>-<tile>x<stages>` ([`crate::catalogue::variant_name`]).
    pub variant: String,
    pub path: DecodePath,
    pub num_splits: usize,
    /// µs the winner measured, and the launcher's heuristic (variant and splits) on the same
    /// inputs; for the reader.
    pub us: Option<f64>,
    pub heuristic_us: Option<f64>,
    /// The same on ragged lengths (dense rows; `dcp-mla tune` measures both).
    pub ragged_us: Option<f64>,
    pub heuristic_ragged_us: Option<f64>,
}

/// A tuned table: the card and commit it was measured on, and its rows.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneTable {
    pub card: TuneCard,
    pub commit: String,
    /// `YYYY-MM-DD`, UTC.
    pub date: String,
    /// How the rows were measured (free text).
    pub method: String,
    pub rows: Vec<TuneRow>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    format_version: u64,
    card: TuneCard,
    commit: String,
    date: String,
    #[serde(default)]
    method: String,
    rows: Vec<RowJson>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RowJson {
    class: ClassJson,
    variant: String,
    num_splits: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    heuristic_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ragged_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    heuristic_ragged_us: Option<f64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassJson {
    path: String,
    kv: String,
    b: usize,
    q: usize,
    h: usize,
    ctx: usize,
    causal: bool,
    ragged: bool,
}

impl From<&DecodeClass> for ClassJson {
    fn from(c: &DecodeClass) -> Self {
        let s = &c.shape;
        ClassJson {
            path: if s.sparse { "sparse" } else { "dense" }.into(),
            kv: kv_name(s.format).into(),
            b: s.batch,
            q: s.nq,
            h: s.heads,
            ctx: s.context,
            causal: s.causal,
            ragged: c.ragged,
        }
    }
}

/// The cache format as a table spells it.
pub fn kv_name(format: KvFormat) -> &'static str {
    match format {
        KvFormat::Bf16 => "bf16",
        KvFormat::Fp8_656 => "fp8_656",
    }
}

impl TuneTable {
    /// Reads a table; `source` names it in errors (a path, or `embedded <file>`). Refused, with
    /// the reason: text that is not JSON or not this format (a missing, unknown or mistyped
    /// field), a `format_version` other than [`TUNE_FORMAT_VERSION`], a class that is not a bucket
    /// or is out of the kernels' range, a variant this build does not ship for the row's kind, a
    /// split count outside 1..=[`MAX_SPLITS`], or two rows of one class.
    pub fn parse(text: &str, source: &str) -> Result<TuneTable> {
        Self::parse_str(text).map_err(|reason| refused(source, reason))
    }

    fn parse_str(text: &str) -> std::result::Result<TuneTable, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("malformed JSON: {e}"))?;
        match value.get("format_version") {
            None => return Err("malformed: no `format_version`".into()),
            Some(v) if v.as_u64() == Some(TUNE_FORMAT_VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "format_version {v} is not one this build reads (it reads {TUNE_FORMAT_VERSION}; re-run `dcp-mla tune`)"
                ))
            }
        }
        let file: FileJson = serde_json::from_value(value).map_err(|e| format!("malformed: {e}"))?;
        let mut rows: Vec<TuneRow> = Vec::with_capacity(file.rows.len());
        for (i, r) in file.rows.into_iter().enumerate() {
            let row = parse_row(r).map_err(|e| format!("row {i}: {e}"))?;
            if let Some(j) = rows.iter().position(|x| x.class == row.class) {
                return Err(format!("row {i}: the class {} is already row {j}", row.class.label()));
            }
            rows.push(row);
        }
        Ok(TuneTable { card: file.card, commit: file.commit, date: file.date, method: file.method, rows })
    }

    /// The table as JSON, the format [`TuneTable::parse`] reads.
    pub fn to_json(&self) -> String {
        let file = FileJson {
            format_version: TUNE_FORMAT_VERSION,
            card: self.card.clone(),
            commit: self.commit.clone(),
            date: self.date.clone(),
            method: self.method.clone(),
            rows: self
                .rows
                .iter()
                .map(|r| RowJson {
                    class: ClassJson::from(&r.class),
                    variant: r.variant.clone(),
                    num_splits: r.num_splits,
                    us: r.us,
                    heuristic_us: r.heuristic_us,
                    ragged_us: r.ragged_us,
                    heuristic_ragged_us: r.heuristic_ragged_us,
                })
                .collect(),
        };
        let mut s = serde_json::to_string_pretty(&file).expect("a table serialises");
        s.push('\n');
        s
    }

    /// Refuses a table made for another card than `card` (name or SM count), naming both.
    pub fn check_card(&self, card: &CardId, source: &str) -> Result<()> {
        if self.card.name != card.name || self.card.sm_count != card.sm_count {
            return Err(refused(
                source,
                format!(
                    "made for {:?} with {} SMs, but this device is {:?} with {} SMs (re-run `dcp-mla tune` on it)",
                    self.card.name, self.card.sm_count, card.name, card.sm_count
                ),
            ));
        }
        Ok(())
    }

    /// The row for `class` (bucketed by [`DecodeClass::new`]): its own class, else the nearest
    /// within [`MAX_NEAREST_DISTANCE`] (ties: the row listed first), else `None`.
    pub fn lookup(&self, class: &DecodeClass) -> Option<TunedChoice> {
        // a launch's hot path: its own class by equality first, the distances only on a miss
        if let Some(row) = self.rows.iter().find(|r| r.class == *class) {
            return Some(TunedChoice { path: row.path, num_splits: row.num_splits, distance: 0.0 });
        }
        let mut best: Option<(f64, &TuneRow)> = None;
        for row in &self.rows {
            let Some(d) = class_distance(class, &row.class) else { continue };
            if d <= MAX_NEAREST_DISTANCE && best.is_none_or(|(bd, _)| d < bd) {
                best = Some((d, row));
            }
        }
        best.map(|(distance, row)| TunedChoice { path: row.path, num_splits: row.num_splits, distance })
    }
}

fn refused(source: &str, reason: impl std::fmt::Display) -> Error {
    Error::InvalidConfig(format!("tuned decode table {source} refused: {reason}"))
}

fn parse_row(r: RowJson) -> std::result::Result<TuneRow, String> {
    let c = r.class;
    let sparse = match c.path.as_str() {
        "dense" => false,
        "sparse" => true,
        p => return Err(format!("path {p:?} is neither \"dense\" nor \"sparse\"")),
    };
    let format = match c.kv.as_str() {
        "bf16" => KvFormat::Bf16,
        "fp8_656" => KvFormat::Fp8_656,
        k => return Err(format!("kv {k:?} is neither \"bf16\" nor \"fp8_656\"")),
    };
    if !sparse && format != KvFormat::Bf16 {
        return Err("a dense row reads the bf16 cache only".into());
    }
    for (name, v) in [("b", c.b), ("ctx", c.ctx)] {
        if v == 0 || !v.is_power_of_two() {
            return Err(format!("{name} = {v} is not a bucket (a power of two)"));
        }
    }
    if !(1..=super::MAX_Q_ROWS).contains(&c.q) {
        return Err(format!("q = {} is not in 1..={}", c.q, super::MAX_Q_ROWS));
    }
    if !(1..=super::MAX_HEADS).contains(&c.h) {
        return Err(format!("h = {} is not in 1..={}", c.h, super::MAX_HEADS));
    }
    let shape = DecodeShape { sparse, format, batch: c.b, nq: c.q, heads: c.h, context: c.ctx, causal: c.causal };
    let class = DecodeClass::new(shape, c.ragged);
    let variants = decode_variants(format, sparse);
    let Some(&(_, path)) = variants.iter().find(|(name, _)| *name == r.variant) else {
        let names: Vec<&str> = variants.iter().map(|(n, _)| n.as_str()).collect();
        return Err(format!(
            "variant {:?} is not a {} {} decode kernel of this build (it ships: {})",
            r.variant,
            c.path,
            c.kv,
            names.join(", ")
        ));
    };
    if !(1..=MAX_SPLITS).contains(&r.num_splits) {
        return Err(format!("num_splits = {} is not in 1..={MAX_SPLITS}", r.num_splits));
    }
    Ok(TuneRow {
        class,
        variant: r.variant,
        path,
        num_splits: r.num_splits,
        us: r.us,
        heuristic_us: r.heuristic_us,
        ragged_us: r.ragged_us,
        heuristic_ragged_us: r.heuristic_ragged_us,
    })
}

/// Where the active table comes from, in [`tuned_decode`]'s order.
#[derive(Debug, Clone)]
enum Source<'a> {
    /// [`set_tune_table`]'s (`None`: no table, the heuristic everywhere).
    Given(Option<Arc<TuneTable>>),
    /// `DCP_MLA_TUNE_TABLE`'s file.
    File(&'a Path),
    /// The tables embedded in the build, (file name, contents).
    Embedded(&'a [(&'a str, &'a str)]),
}

/// The table `source` gives for `card`, checked; `None` where it gives none.
fn resolve(source: Source, card: &CardId) -> Result<Option<Arc<TuneTable>>> {
    match source {
        Source::Given(None) => Ok(None),
        Source::Given(Some(t)) => {
            t.check_card(card, "given to set_tune_table")?;
            Ok(Some(t))
        }
        Source::File(path) => {
            let name = format!("{} (from {TUNE_TABLE_ENV})", path.display());
            let text = std::fs::read_to_string(path).map_err(|e| refused(&name, format!("cannot be read: {e}")))?;
            let t = TuneTable::parse(&text, &name)?;
            t.check_card(card, &name)?;
            Ok(Some(Arc::new(t)))
        }
        Source::Embedded(tables) => {
            for (file, text) in tables {
                let t = TuneTable::parse(text, &format!("embedded {file}"))?;
                if t.card.name == card.name && t.card.sm_count == card.sm_count {
                    return Ok(Some(Arc::new(t)));
                }
            }
            Ok(None)
        }
    }
}

/// [`set_tune_table`]'s table, once called (`Some(None)`: no table).
static GIVEN: Mutex<Option<Option<Arc<TuneTable>>>> = Mutex::new(None);
/// A device's table, or why it was refused.
type Resolved = std::result::Result<Option<Arc<TuneTable>>, String>;

/// What one device resolved: its table (or why it was refused) and the lookups made in it so
/// far, by class: a launch's lookup is a hash probe, not a distance to every row on a miss.
struct DeviceTable {
    ordinal: usize,
    table: Resolved,
    lookups: std::collections::HashMap<DecodeClass, Option<TunedChoice>>,
}

/// Each device's table (by ordinal), resolved on its first ask.
static RESOLVED: Mutex<Vec<DeviceTable>> = Mutex::new(Vec::new());

/// Makes `table` the one [`tuned_decode`] reads in this process, in place of
/// `DCP_MLA_TUNE_TABLE` and the embedded table (`None`: no table, the launcher's heuristic
/// everywhere). Checked against each device's card when that device next asks.
pub fn set_tune_table(table: Option<TuneTable>) {
    *GIVEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(table.map(Arc::new));
    RESOLVED.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// `f` on `dev`'s entry, resolving its table first if this is the device's first ask (under the
/// one lock, so a lookup never outlives the table it was made in).
fn with_device<T>(dev: &Device, f: impl FnOnce(&mut DeviceTable) -> T) -> Result<T> {
    let ordinal = dev.context().ordinal();
    let mut resolved = RESOLVED.lock().unwrap_or_else(|e| e.into_inner());
    let at = match resolved.iter().position(|d| d.ordinal == ordinal) {
        Some(at) => at,
        None => {
            let table = resolve_for(dev).map_err(|e| match e {
                Error::InvalidConfig(s) => s,
                e => e.to_string(),
            });
            resolved.push(DeviceTable { ordinal, table, lookups: Default::default() });
            resolved.len() - 1
        }
    };
    Ok(f(&mut resolved[at]))
}

/// The table the sources give for `dev`'s card, in the module's order ("Which table").
fn resolve_for(dev: &Device) -> Result<Option<Arc<TuneTable>>> {
    let card = CardId::of(dev)?;
    let given = GIVEN.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let env = std::env::var_os(TUNE_TABLE_ENV).filter(|v| !v.is_empty());
    let source = match (&given, &env) {
        (Some(t), _) => Source::Given(t.clone()),
        (None, Some(v)) if v == TUNE_TABLE_OFF => Source::Given(None),
        (None, Some(path)) => Source::File(Path::new(path)),
        (None, None) => Source::Embedded(EMBEDDED_TABLES),
    };
    resolve(source, &card)
}

/// The table in force for `dev` (see the module's "Which table"), resolved on the device's
/// first call and kept; a refusal is kept too, and returned by every call.
pub fn active_table(dev: &Device) -> Result<Option<Arc<TuneTable>>> {
    with_device(dev, |d| d.table.clone())?.map_err(Error::InvalidConfig)
}

/// What the decode launcher's `Auto` choice runs for a launch of `class` on `dev`, by the
/// tuned table in force ([`active_table`]): `Ok(None)` when there is no table or no row near
/// enough (keep the heuristic), an error when the table was refused. Each class is looked up
/// once a device.
pub fn tuned_decode(dev: &Device, class: &DecodeClass) -> Result<Option<TunedChoice>> {
    with_device(dev, |d| match &d.table {
        Err(why) => Err(Error::InvalidConfig(why.clone())),
        Ok(None) => Ok(None),
        Ok(Some(t)) => Ok(*d.lookups.entry(*class).or_insert_with(|| t.lookup(class))),
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dense class of `b` requests of `q` rows, `h` heads and `ctx` tokens (equal lengths).
    fn dense(b: usize, q: usize, h: usize, ctx: usize) -> DecodeClass {
        let shape = DecodeShape {
            sparse: false,
            format: KvFormat::Bf16,
            batch: b,
            nq: q,
            heads: h,
            context: ctx,
            causal: false,
        };
        shape.class()
    }

    /// A sparse class over `format` with the top-k `k`.
    fn sparse(format: KvFormat, b: usize, q: usize, h: usize, k: usize) -> DecodeClass {
        DecodeClass { shape: DecodeShape { sparse: true, format, ..dense(b, q, h, k).shape }, ragged: false }
    }

    fn card() -> CardId {
        CardId { name: "NVIDIA H100 80GB HBM3".into(), sm_count: 132 }
    }

    fn table_json(version: &str, rows: &str) -> String {
        format!(
            r#"{{"format_version": {version},
                "card": {{"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619}},
                "commit": "c6b295d", "date": "2026-12-05", "method": "test",
                "rows": [{rows}]}}"#
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
        path: &str,
        kv: &str,
        b: usize,
        q: usize,
        h: usize,
        ctx: usize,
        causal: bool,
        variant: &str,
        p: usize,
    ) -> String {
        format!(
            r#"{{"class": {{"path": "{path}", "kv": "{kv}", "b": {b}, "q": {q}, "h": {h}, "ctx": {ctx},
                 "causal": {causal}, "ragged": false}}, "variant": "{variant}", "num_splits": {p}}}"#
        )
    }

    fn sample() -> String {
        let rows = [
            row("dense", "bf16", 128, 1, 64, 8192, false, "wgmma-trio-64x2", 128),
            row("dense", "bf16", 128, 2, 64, 8192, true, "wgmma-trio_split-64x2", 64),
            row("dense", "bf16", 16, 6, 64, 32768, true, "mma", 7),
            row("sparse", "fp8_656", 128, 2, 128, 2048, false, "wgmma-lead-64x2", 1),
            row("sparse", "fp8_656", 8, 1, 64, 512, false, "mma", 132),
        ];
        table_json("1", &rows.join(","))
    }

    fn err(text: &str) -> String {
        TuneTable::parse(text, "t.json").unwrap_err().to_string()
    }

    #[test]
    fn classes_bucket_the_batch_and_context() {
        let c = DecodeClass { ragged: true, ..dense(100, 1, 64, 5000) };
        assert_eq!((c.shape.batch, c.shape.context), (128, 8192));
        assert_eq!(c.label(), "dense bf16 b=128 q=1 H=64 ctx=8192 ragged");
        assert_eq!(sparse(KvFormat::Fp8_656, 0, 2, 128, 2048).shape.batch, 1);
        assert_eq!(sparse(KvFormat::Fp8_656, 1, 2, 128, 2048).row_blocks(), 2);
    }

    #[test]
    fn lookup_takes_the_own_class_then_the_nearest() {
        let t = TuneTable::parse(&sample(), "t.json").unwrap();
        assert_eq!(t.rows.len(), 5);
        // its own class
        let c = dense(128, 1, 64, 8192);
        let got = t.lookup(&c).unwrap();
        assert_eq!(got.path, t.rows[0].path);
        assert_eq!((got.num_splits, got.distance), (128, 0.0));
        // b = 96 buckets to 128: the same row, exactly
        let c = dense(96, 1, 64, 8000);
        assert_eq!(t.lookup(&c).unwrap().distance, 0.0);
        // b = 64, 16K: one step in batch and one in context from row 0
        let c = dense(64, 1, 64, 16384);
        let got = t.lookup(&c).unwrap();
        assert_eq!((got.num_splits, got.distance), (128, 2.0));
        // ragged costs 1: still row 0
        let c = DecodeClass { ragged: true, ..dense(128, 1, 64, 8192) };
        assert_eq!(t.lookup(&c).unwrap().distance, 1.0);
        // q = 1 H = 128 has two row blocks, as q = 2 H = 64: row 1 (causal differs: + 1, q and H
        // one step each: + 2)
        let c = dense(128, 1, 128, 8192);
        let got = t.lookup(&c).unwrap();
        assert_eq!((got.num_splits, got.distance), (64, 3.0));
        // too far: b = 8 from 128 alone is 4
        let c = dense(8, 1, 64, 8192);
        assert_eq!(t.lookup(&c), None);
        let c = dense(128, 4, 128, 8192);
        assert_eq!(t.lookup(&c), None, "8 row blocks: no row has them");
        // another path or format never matches
        let c = sparse(KvFormat::Bf16, 128, 1, 64, 2048);
        assert_eq!(t.lookup(&c), None);
        let c = sparse(KvFormat::Fp8_656, 128, 2, 128, 2048);
        let got = t.lookup(&c).unwrap();
        assert!(matches!(got.path, DecodePath::Wgmma { schedule: crate::catalogue::Sm90Schedule::Lead, .. }));
    }

    #[test]
    fn ties_go_to_the_row_listed_first() {
        let rows = [
            row("dense", "bf16", 64, 1, 64, 8192, false, "wgmma-trio-64x2", 100),
            row("dense", "bf16", 256, 1, 64, 8192, false, "wgmma-trio-64x2", 200),
        ];
        let t = TuneTable::parse(&table_json("1", &rows.join(",")), "t.json").unwrap();
        let c = dense(128, 1, 64, 8192);
        assert_eq!(t.lookup(&c).unwrap().num_splits, 100);
    }

    #[test]
    fn a_table_round_trips() {
        let t = TuneTable::parse(&sample(), "t.json").unwrap();
        assert_eq!(TuneTable::parse(&t.to_json(), "again").unwrap(), t);
    }

    #[test]
    fn malformed_tables_are_refused_naming_what_is_wrong() {
        assert!(err("{").contains("malformed JSON"), "{}", err("{"));
        assert!(err(r#"{"rows": []}"#).contains("no `format_version`"));
        let e = err(&table_json("2", ""));
        assert!(e.contains("t.json") && e.contains("format_version 2"), "{e}");
        // a missing field, an unknown one
        let e = err(&sample().replace(r#""commit": "c6b295d","#, ""));
        assert!(e.contains("malformed") && e.contains("commit"), "{e}");
        let e = err(&sample().replace(r#""method": "test""#, r#""method": "test", "extra": 1"#));
        assert!(e.contains("extra"), "{e}");
        // a class that is not a bucket, or out of range
        let e = err(&table_json("1", &row("dense", "bf16", 100, 1, 64, 8192, false, "mma", 1)));
        assert!(e.contains("row 0") && e.contains("b = 100"), "{e}");
        let e = err(&table_json("1", &row("dense", "bf16", 128, 9, 64, 8192, false, "mma", 1)));
        assert!(e.contains("q = 9"), "{e}");
        let e = err(&table_json("1", &row("dense", "fp8_656", 128, 1, 64, 8192, false, "mma", 1)));
        assert!(e.contains("bf16 cache only"), "{e}");
        let e = err(&table_json("1", &row("dense", "bf16", 128, 1, 64, 8192, false, "mma", 0)));
        assert!(e.contains("num_splits = 0"), "{e}");
        // two rows of one class
        let r = row("dense", "bf16", 128, 1, 64, 8192, false, "mma", 1);
        let e = err(&table_json("1", &format!("{r},{r}")));
        assert!(e.contains("row 1") && e.contains("already row 0"), "{e}");
    }

    #[test]
    fn unknown_variants_are_refused() {
        // removed, misspelt, or of another kind (lead is sparse FP8's)
        for v in ["wgmma-seesaw-64x2", "wgmma-quad-64x2", "wgmma-trio-128x3", "wgmma-lead-64x2"] {
            let e = err(&table_json("1", &row("dense", "bf16", 128, 1, 64, 8192, false, v, 1)));
            assert!(e.contains(v) && e.contains("not a dense bf16 decode kernel of this build"), "{e}");
            assert!(e.contains("wgmma-trio-64x2"), "the error lists what the build ships: {e}");
        }
    }

    #[test]
    fn tables_for_another_card_are_refused() {
        let t = TuneTable::parse(&sample(), "t.json").unwrap();
        assert!(t.check_card(&card(), "t.json").is_ok());
        let h200 = CardId { name: "NVIDIA H200".into(), sm_count: 132 };
        let e = t.check_card(&h200, "t.json").unwrap_err().to_string();
        assert!(e.contains("t.json") && e.contains("NVIDIA H100 80GB HBM3") && e.contains("NVIDIA H200"), "{e}");
        let fewer = CardId { sm_count: 114, ..card() };
        let e = t.check_card(&fewer, "t.json").unwrap_err().to_string();
        assert!(e.contains("132 SMs") && e.contains("114 SMs"), "{e}");
    }

    #[test]
    fn the_sources_resolve_in_order_and_refuse_loudly() {
        let t = Arc::new(TuneTable::parse(&sample(), "t.json").unwrap());
        // a given table is checked against the card; None means no table
        assert_eq!(resolve(Source::Given(Some(t.clone())), &card()).unwrap(), Some(t.clone()));
        assert_eq!(resolve(Source::Given(None), &card()).unwrap(), None);
        let other = CardId { name: "NVIDIA H200".into(), sm_count: 132 };
        assert!(resolve(Source::Given(Some(t.clone())), &other).is_err());
        // a file: read, parsed, checked; a missing file is an error naming it
        let dir = std::env::temp_dir().join(format!("dcp-mla-tune-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, sample()).unwrap();
        assert_eq!(resolve(Source::File(&good), &card()).unwrap().unwrap().rows, t.rows);
        let e = resolve(Source::File(&good), &other).unwrap_err().to_string();
        assert!(e.contains("good.json") && e.contains(TUNE_TABLE_ENV) && e.contains("NVIDIA H200"), "{e}");
        let e = resolve(Source::File(&dir.join("missing.json")), &card()).unwrap_err().to_string();
        assert!(e.contains("missing.json") && e.contains("cannot be read"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        // embedded: the table of this card, none for another, a broken one refused
        let text = sample();
        let list = [("h100.json", text.as_str())];
        assert_eq!(resolve(Source::Embedded(&list), &card()).unwrap().unwrap().rows, t.rows);
        assert_eq!(resolve(Source::Embedded(&list), &other).unwrap(), None);
        let broken = [("bad.json", "{")];
        let e = resolve(Source::Embedded(&broken), &card()).unwrap_err().to_string();
        assert!(e.contains("embedded bad.json"), "{e}");
        // this build's embedded tables all parse, and each is the one its own card gets (one
        // table a card: a second of the same card would never be read)
        for (file, text) in EMBEDDED_TABLES {
            let t = TuneTable::parse(text, file).unwrap();
            let own = CardId { name: t.card.name.clone(), sm_count: t.card.sm_count };
            let got = resolve(Source::Embedded(EMBEDDED_TABLES), &own).unwrap().unwrap();
            assert_eq!(got.rows, t.rows, "{file}");
        }
    }
}
