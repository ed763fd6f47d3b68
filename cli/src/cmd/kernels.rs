//! `dcp-mla kernels`: every compiled variant with its ptxas report and the dynamic shared memory
//! a launch passes (ptxas reports only the static part).

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
                    "dynamic_shared_bytes": k.dynamic_shared_bytes,
                    "hot": k.hot,
                    "axes": k.axes.iter().map(|(a, v)| format!("{a}={v}")).collect::<Vec<_>>(),
                    "ptxas": k.ptxas.iter().map(|p| serde_json::json!({
                        "arch": p.arch,
                        "registers": p.registers,
                        "shared_bytes": p.shared_bytes,
                        "total_shared_bytes": p.shared_bytes as u64 + k.dynamic_shared_bytes as u64,
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
        "{:<22} {:<22} {:>5} {:<7} {:>5} {:>7} {:>7} {:>6} {:>7}",
        "family", "axes", "block", "arch", "regs", "static", "dynamic", "stack", "spills"
    );
    for k in KERNELS {
        let axes = if k.axes.is_empty() {
            "-".to_string()
        } else {
            k.axes.iter().map(|(a, v)| format!("{a}={v}")).collect::<Vec<_>>().join(",")
        };
        if k.ptxas.is_empty() {
            println!(
                "{:<22} {:<22} {:>5} (no ptxas report; {} B dynamic shared memory)",
                k.family, axes, k.block, k.dynamic_shared_bytes
            );
        }
        for p in k.ptxas {
            println!(
                "{:<22} {:<22} {:>5} {:<7} {:>5} {:>7} {:>7} {:>6} {:>7}",
                k.family,
                axes,
                k.block,
                p.arch,
                p.registers,
                p.shared_bytes,
                k.dynamic_shared_bytes,
                p.stack_bytes,
                p.spill_store_bytes + p.spill_load_bytes
            );
        }
    }
    println!(
        "{} entry points; shared memory in bytes a block: static (ptxas) and dynamic (what a launch passes)",
        KERNELS.len()
    );
}
