//! The planner from Rust, no GPU needed: a DCP group of D = 4 ranks for 64 requests of 128K
//! tokens, where tokens live, what each rank holds and the decode's workspaces.
//! `cargo run --example plan`; `cargo test --example plan` (and `cargo test --workspace`) runs it too.

use dcp_mla::ops::decode::{decode_num_splits, decode_workspace_bytes};
use dcp_mla::planner::{capacity_tokens, causal_local_lens, check_decode_shape, check_topk, DcpConfig};
use dcp_mla::KvFormat;

fn main() -> Result<(), dcp_mla::Error> {
    let (tp, d, interleave, block_size) = (8, 4, 1, 64);
    let (batch, num_q, local_heads, context, topk) = (64, 2, 16, 131_072u64, 2048);
    // the checks every interface runs (the CLI's plan, the C ABI, Python's plan())
    let cfg = DcpConfig::new(tp, d, interleave, block_size)?;
    let heads = check_decode_shape(d, local_heads, num_q, batch, context)?;
    check_topk(d, topk)?;

    let dcp = cfg.dcp;
    let held: Vec<u64> = (0..d).map(|r| dcp.local_len(context, r)).collect();
    println!("H = D·H_l = {heads} heads; the ranks hold {held:?} of {context} tokens");
    for t in [0u64, 1, 5, 1000] {
        let (rank, column, slot) = dcp.address(t, block_size);
        println!("token {t}: rank {rank}, block-table column {column}, slot {slot}");
    }
    // an MTP step: request lengths include their num_q new tokens; each row sees a causal prefix
    let rows = causal_local_lens(&[10, 7], &[num_q, num_q], dcp, 0)?;
    println!("rank 0's per-row lengths: {rows:?}");
    for sparse in [false, true] {
        let splits = decode_num_splits(batch, num_q, heads, sparse, 132);
        let bytes = decode_workspace_bytes(batch, num_q, heads, sparse, splits)?;
        println!(
            "{} decode at 132 SMs: {splits} parts, {bytes} workspace bytes",
            if sparse { "sparse" } else { "dense" }
        );
    }
    let cache_bytes: u64 = 1 << 30; // one layer's KV cache per rank
    let (without, with) = (
        capacity_tokens(cache_bytes, KvFormat::Fp8_656, block_size, 1),
        capacity_tokens(cache_bytes, KvFormat::Fp8_656, block_size, d),
    );
    println!("{} tokens: {without} without DCP, {with} with D = {d}", KvFormat::Fp8_656.name());
    // D must be one of the sizes the kernels are built for
    if let Err(e) = DcpConfig::new(6, 3, 1, 64) {
        println!("refused: {e}");
    }
    Ok(())
}

#[test]
fn example_runs() {
    main().expect("the example's configuration is valid");
}
