//! `dcp-mla kernels`: every compiled variant with its ptxas report.

use dcp_mla::runtime::registry::KERNELS;

pub fn run(json: bool) {
    if json {
        let v: Vec<serde_json::Value> = KERNELS
            .iter()
            .map(|k| {
                serde_json::json!({
                    "family": k.family,
                    "symbol": k.symbol,
                    "block": k.block,
                    "hot": k.hot,
                    "axes": k.axes.iter().map(|(a, v)| format!("{a}={v}")).collect::<Vec<_>>(),
                    "ptxas": k.ptxas.iter().map(|p| serde_json::json!({
                        "arch": p.arch,
                        "registers": p.registers,
                        "shared_bytes": p.shared_bytes,
                        "stack_bytes": p.stack_bytes,
                        "spill_store_bytes": p.spill_store_bytes,
                        "spill_load_bytes": p.spill_load_bytes,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return;
    }
    println!(
        "{:<22} {:<22} {:>5} {:<7} {:>5} {:>7} {:>6} {:>7}",
        "family", "axes", "block", "arch", "regs", "shared", "stack", "spills"
    );
    for k in KERNELS {
        let axes = if k.axes.is_empty() {
            "-".to_string()
        } else {
            k.axes.iter().map(|(a, v)| format!("{a}={v}")).collect::<Vec<_>>().join(",")
        };
        if k.ptxas.is_empty() {
            println!("{:<22} {:<22} {:>5} (no ptxas report)", k.family, axes, k.block);
        }
        for p in k.ptxas {
            println!(
                "{:<22} {:<22} {:>5} {:<7} {:>5} {:>7} {:>6} {:>7}",
                k.family,
                axes,
                k.block,
                p.arch,
                p.registers,
                p.shared_bytes,
                p.stack_bytes,
                p.spill_store_bytes + p.spill_load_bytes
            );
        }
    }
    println!("{} entry points", KERNELS.len());
}
