//! `dcp-mla plan`: KV capacity with and without DCP, per-rank workspaces and the smallest D that
//! fits a context, all from the planner's functions.

use dcp_mla::formats::{D_LATENT, D_QK, D_ROPE, D_V};
use dcp_mla::ops::decode::{decode_num_splits, decode_workspace_bytes};
use dcp_mla::planner::{self, workspace, DcpConfig, DcpLayout, DCP_SIZES};
use dcp_mla::KvFormat;
use serde_json::{json, Value};

/// The KV-cache formats on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// 576 bf16 per token (1152 bytes).
    Bf16,
    /// FlashMLA's FP8 "656" layout: 656 bytes per token (`fp8_656`, as in Python, C and the JSON).
    #[value(name = "fp8_656")]
    Fp8,
}

impl From<FormatArg> for KvFormat {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Bf16 => KvFormat::Bf16,
            FormatArg::Fp8 => KvFormat::Fp8_656,
        }
    }
}

/// A count option that must be at least 1 (clap names the option in its error). With
/// `allow_negative_numbers` on the option, `-1` is read as its value and refused by name instead
/// of being taken for an unknown flag.
pub fn count() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

/// [`count`] for 64-bit counts (tokens, layers, requests).
pub fn count64() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::<u64>::new().range(1..)
}

/// The most launches `--warmup` or `--reps` may ask for (`bench`, `tune`): a bound that keeps
/// every count and time computed from them far inside 64 bits.
pub const MAX_LAUNCHES: u64 = 1_000_000;

/// A launch count option (`--warmup`, `--reps`) in `min..=`[`MAX_LAUNCHES`], refused by name
/// otherwise (as [`count`]).
pub fn launches(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(min..=MAX_LAUNCHES)
}

#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// GPU memory per rank: bytes, or a number with a unit (KB, MB, GB, TB, KiB, MiB, GiB, TiB).
    #[arg(long, default_value = "141GB", value_parser = parse_bytes)]
    pub gpu_mem: u64,
    /// Fraction of the GPU memory given to the KV cache (what is left after weights and activations).
    #[arg(long, default_value_t = 0.5)]
    pub cache_fraction: f64,
    /// MLA latent dim (c_kv, also V); the kernels are built for 512.
    #[arg(long, default_value_t = D_LATENT)]
    pub kv_lora_rank: usize,
    /// MLA rope dim (k_pe); the kernels are built for 64.
    #[arg(long, default_value_t = D_ROPE)]
    pub rope_dim: usize,
    /// Attention layers whose KV the cache holds (DeepSeek-V3: 61).
    #[arg(long, value_parser = count64(), allow_negative_numbers = true, default_value_t = 61)]
    pub layers: u64,
    /// Tensor-parallel size.
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 8)]
    pub tp: usize,
    /// DCP size D: 1, 2, 4 or 8 (the kernels are built for these), dividing tp.
    #[arg(long = "dcp-size", value_parser = count(), allow_negative_numbers = true, short = 'd', default_value_t = 4)]
    pub dcp: usize,
    /// Interleave I: runs of I consecutive tokens per rank (must divide the block size).
    #[arg(long, value_parser = count(), allow_negative_numbers = true, short = 'i', default_value_t = 1)]
    pub interleave: usize,
    /// KV-cache format.
    #[arg(long, value_enum, default_value = "fp8_656")]
    pub kv_format: FormatArg,
    /// Tokens per physical page (B).
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 64)]
    pub block_size: usize,
    /// Largest decode batch (requests), for the workspace sizes.
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 64)]
    pub batch: usize,
    /// Query rows per request (1 + MTP draft tokens, at most 8).
    #[arg(long = "num-q", value_parser = count(), allow_negative_numbers = true, default_value_t = 1)]
    pub q: usize,
    /// Query heads per TP rank (H_l); attention sees H = D·H_l.
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 16)]
    pub local_heads: usize,
    /// Sparse top-k K (256, 512, 1024 or 2048), for the top-k workspace.
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 2048)]
    pub topk: usize,
    /// SMs of the GPU (H200: 132): sizes the decode's split-KV workspace.
    #[arg(long, value_parser = count(), allow_negative_numbers = true, default_value_t = 132)]
    pub sms: usize,
    /// Context length (tokens per request) to find the smallest D for.
    #[arg(long, value_parser = count64(), allow_negative_numbers = true, default_value_t = 131072)]
    pub context: u64,
    /// Requests of `--context` tokens that must fit at once.
    #[arg(long, value_parser = count64(), allow_negative_numbers = true, default_value_t = 1)]
    pub context_requests: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Parses `141GB`, `140GiB`, `80000MiB`, `1.5TB` or a plain byte count.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| format!("`{s}` is not a size (e.g. 141GB, 140GiB, 80000MiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        u => return Err(format!("unknown unit `{u}` in `{s}` (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")),
    };
    let bytes = x * mult;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is not a usable memory size"));
    }
    Ok(bytes as u64)
}

/// The plan as JSON (the human table is printed from the same value), or a message naming the
/// offending input.
pub fn plan(a: &PlanArgs) -> Result<Value, String> {
    if a.kv_lora_rank != D_LATENT || a.rope_dim != D_ROPE {
        return Err(format!(
            "MLA dims {} + {} are not supported: the kernels are built for kv_lora_rank {D_LATENT} + rope {D_ROPE} \
             (d_qk {D_QK}, d_v {D_V})",
            a.kv_lora_rank, a.rope_dim
        ));
    }
    if !(a.cache_fraction > 0.0 && a.cache_fraction <= 1.0) {
        return Err(format!("--cache-fraction {} must be in (0, 1]", a.cache_fraction));
    }
    if a.layers == 0 {
        return Err("--layers must be at least 1".into());
    }
    if a.sms == 0 {
        return Err("--sms must be at least 1".into());
    }
    // the planner's checks, the same the C ABI and Python run: D, tp, I and B, then the decode's
    // heads, query rows, batch and context (int32 on the device), then K
    let cfg = DcpConfig::new(a.tp, a.dcp, a.interleave, a.block_size).map_err(|e| e.to_string())?;
    let heads =
        planner::check_decode_shape(a.dcp, a.local_heads, a.q, a.batch, a.context).map_err(|e| e.to_string())?;
    planner::check_topk(a.dcp, a.topk).map_err(|e| e.to_string())?;
    let format = KvFormat::from(a.kv_format);
    let cache_bytes = (a.gpu_mem as f64 * a.cache_fraction) as u64;
    let per_layer = cache_bytes / a.layers;
    let pages = planner::pages_per_rank(per_layer, format, a.block_size);
    if pages == 0 {
        let block = (a.block_size as u64).saturating_mul(format.token_bytes() as u64);
        return Err(format!(
            "the cache budget is too small: {cache_bytes} bytes over {} layers leave {per_layer} bytes per layer, \
             below one block of {} {} tokens ({block} bytes)",
            a.layers,
            a.block_size,
            format.name()
        ));
    }
    let without = planner::capacity_tokens(per_layer, format, a.block_size, 1);
    let with = planner::capacity_tokens(per_layer, format, a.block_size, a.dcp);

    let (b, q, h_l, d) = (a.batch, a.q, a.local_heads, a.dcp);
    let t = b * q;
    let dense_splits = decode_num_splits(b, q, heads, false, a.sms);
    let sparse_splits = decode_num_splits(b, q, heads, true, a.sms);
    let e = |e: dcp_mla::Error| e.to_string();
    let split_ws = decode_workspace_bytes(b, q, heads, false, dense_splits)
        .map_err(e)?
        .max(decode_workspace_bytes(b, q, heads, true, sparse_splits).map_err(e)?) as u64;
    let partial_out = workspace::decode_out_f32_bytes(b, q, heads).map_err(e)?;
    let ag_rs = workspace::merge_ag_rs_bytes(d, t, h_l).map_err(e)?;
    let a2a = workspace::merge_a2a_bytes(d, t, h_l).map_err(e)?;
    let topk = workspace::topk_bytes(d, t, a.topk).map_err(e)?;
    let total = [split_ws, ag_rs.max(a2a), topk]
        .into_iter()
        .try_fold(partial_out, |acc, x| acc.checked_add(x))
        .ok_or("the workspaces together overflow 64 bits")?;

    // the smallest D the kernels support (DCP_SIZES) dividing tp for which the requests fit in
    // the pages of one rank
    let min_d = DCP_SIZES.into_iter().filter(|d| a.tp % d == 0).find(|&d| {
        let layout = DcpLayout { size: d, interleave: a.interleave };
        layout.pages_for(a.context, a.block_size).saturating_mul(a.context_requests) <= pages
    });
    Ok(json!({
        "gpu_mem_bytes": a.gpu_mem,
        "cache_fraction": a.cache_fraction,
        "layers": a.layers,
        "tp": cfg.tp,
        "dcp_size": cfg.dcp.size,
        "interleave": cfg.dcp.interleave,
        "block_size": cfg.block_size,
        "kv_format": format.name(),
        "token_bytes": format.token_bytes(),
        "cache_bytes_per_rank": cache_bytes,
        "cache_bytes_per_layer": per_layer,
        "pages_per_rank": pages,
        "tokens_without_dcp": without,
        "tokens_with_dcp": with,
        "capacity_gain": with as f64 / without as f64,
        "workspace": {
            "batch": b,
            "num_q": q,
            "heads": heads,
            "local_heads": h_l,
            "topk": a.topk,
            "partial_out": partial_out,
            "decode_splits_dense": dense_splits,
            "decode_splits_sparse": sparse_splits,
            "decode_split": split_ws,
            "merge_ag_rs": ag_rs,
            "merge_a2a": a2a,
            "topk_bytes": topk,
            "total": total,
        },
        "context": a.context,
        "context_requests": a.context_requests,
        "min_dcp_for_context": min_d,
    }))
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Prints the plan as a table.
pub fn print(p: &Value) {
    let u = |k: &str| p[k].as_u64().unwrap_or(0);
    let w = &p["workspace"];
    let wu = |k: &str| w[k].as_u64().unwrap_or(0);
    println!(
        "KV cache per rank: {} ({} × {} of GPU memory)",
        gib(u("cache_bytes_per_rank")),
        gib(u("gpu_mem_bytes")),
        p["cache_fraction"]
    );
    println!(
        "  {} layers → {} per layer = {} pages of {} {} tokens ({} bytes each)",
        u("layers"),
        mib(u("cache_bytes_per_layer")),
        u("pages_per_rank"),
        u("block_size"),
        p["kv_format"].as_str().unwrap_or(""),
        u("token_bytes")
    );
    println!("token slots per TP group:");
    println!("  without DCP (D = 1):  {:>14}", u("tokens_without_dcp"));
    println!(
        "  with DCP    (D = {}):  {:>14}   ×{:.0}",
        u("dcp_size"),
        u("tokens_with_dcp"),
        p["capacity_gain"].as_f64().unwrap_or(0.0)
    );
    println!(
        "per-rank workspace at batch {} × num_q {} (H = {} gathered heads, K = {}):",
        wu("batch"),
        wu("num_q"),
        wu("heads"),
        wu("topk")
    );
    println!("  partial attention out     {:>12}", mib(wu("partial_out")));
    println!(
        "  split-KV decode           {:>12}   ({} dense / {} sparse splits)",
        mib(wu("decode_split")),
        wu("decode_splits_dense"),
        wu("decode_splits_sparse")
    );
    println!("  merge, ag_rs              {:>12}", mib(wu("merge_ag_rs")));
    println!("  merge, a2a                {:>12}", mib(wu("merge_a2a")));
    println!("  distributed top-k         {:>12}", mib(wu("topk_bytes")));
    println!("  total (larger merge)      {:>12}", mib(wu("total")));
    match p["min_dcp_for_context"].as_u64() {
        Some(d) => println!(
            "smallest D (1, 2, 4 or 8, dividing tp = {}) that fits {} request(s) of {} tokens: D = {d}",
            u("tp"),
            u("context_requests"),
            u("context")
        ),
        None => println!(
            "no D (1, 2, 4 or 8) dividing tp = {} fits {} request(s) of {} tokens",
            u("tp"),
            u("context_requests"),
            u("context")
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{parse_bytes, plan, PlanArgs};
    use clap::{Args, FromArgMatches};
    use proptest::prelude::*;

    /// `dcp-mla COMMAND ARGS` as the binary parses it (deprecated spellings modernised first):
    /// the command's arguments, or clap's message when the command line does not parse.
    pub(crate) fn parse_like_the_binary<A: Args + FromArgMatches>(
        command: &'static str,
        args: &[String],
    ) -> Result<A, String> {
        let argv = std::iter::once(command.to_string()).chain(args.iter().cloned());
        let (argv, _) = crate::modernize_args(argv.collect());
        let m = A::augment_args(clap::Command::new(command)).try_get_matches_from(argv).map_err(|e| e.to_string())?;
        A::from_arg_matches(&m).map_err(|e| e.to_string())
    }

    /// `dcp-mla plan ARGS` as the binary parses it: Ok(the plan or its error message), or Err
    /// (clap's message) when the command line does not parse.
    fn run(args: &[String]) -> Result<Result<serde_json::Value, String>, String> {
        let a: PlanArgs = parse_like_the_binary("plan", args)?;
        Ok(plan(&a))
    }

    /// Decimal integers of every sign and size, beyond 64 bits too.
    pub(crate) fn any_number() -> impl Strategy<Value = String> {
        prop_oneof![
            (-20i128..20).prop_map(|x| x.to_string()),
            any::<i64>().prop_map(|x| x.to_string()),
            any::<u64>().prop_map(|x| x.to_string()),
            any::<i128>().prop_map(|x| x.to_string()),
            Just(u64::MAX.to_string()),
            Just("340282366920938463463374607431768211457".to_string()),
            Just((1u64 << 31).to_string()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Every numeric option of `plan` (in its current and deprecated spellings) with any
        /// integer: clap refuses it, or the planner returns a plan or a message. No panic.
        #[test]
        fn plan_takes_any_integer_without_a_panic(
            values in proptest::collection::vec(any_number(), 14),
            pick in proptest::collection::vec(any::<bool>(), 14),
        ) {
            let options = [
                "--layers", "--tp", "--dcp-size", "--interleave", "--block-size", "--batch", "--num-q",
                "--local-heads", "--topk", "--sms", "--context", "--context-requests", "--dcp", "--max-batch",
            ];
            let mut args = Vec::new();
            for ((o, v), &on) in options.iter().zip(&values).zip(&pick) {
                // the two deprecated spellings stand in for their new ones, never beside them
                let dup = (*o == "--dcp" && pick[2]) || (*o == "--max-batch" && pick[5]);
                if on && !dup {
                    args.push(format!("{o}={v}"));
                }
            }
            if let Ok(Ok(v)) = run(&args) {
                // what plans is within the planner's bounds
                let d = v["dcp_size"].as_u64().unwrap();
                prop_assert!([1, 2, 4, 8].contains(&d));
                if let Some(m) = v["min_dcp_for_context"].as_u64() {
                    prop_assert!([1, 2, 4, 8].contains(&m));
                }
            }
        }
    }

    #[test]
    fn plan_refuses_what_the_planner_refuses() {
        let s = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        for (args, needle) in [
            (s(&["--tp", "6", "--dcp-size", "3"]), "D = 3"),
            (s(&["--tp", "6", "--dcp", "3"]), "D = 3"),
            (s(&["--num-q", "9"]), "q = 9"),
            (s(&["--local-heads", "64"]), "heads"),
            (s(&["--context", "1099511627776"]), "context"),
        ] {
            let e = run(&args).unwrap().unwrap_err();
            assert!(e.contains(needle), "{args:?}: `{needle}` in {e}");
        }
        // tp = 6: D = 3 and 6 divide it but are not built; the smallest D is among 1 and 2
        let v = run(&s(&["--tp", "6", "--dcp-size", "2", "--context", "2000000000", "--context-requests", "64"]))
            .unwrap()
            .unwrap();
        assert!(v["min_dcp_for_context"].is_null() || [1, 2].contains(&v["min_dcp_for_context"].as_u64().unwrap()));
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("141GB"), Ok(141_000_000_000));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5 kib"), Ok(1536));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12XB").is_err());
        assert!(parse_bytes("GB").is_err());
        assert!(parse_bytes("0").is_err());
    }
}
