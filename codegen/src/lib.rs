//! The dcp-mla code generator.
//!
//! `build` turns the kernel DSL (`kernels-src/kernels.toml`) and the parameter header
//! (`kernels-src/abi.h`) into, under `out_dir`:
//! - `kernels/<family>.cu`: one instantiation unit per family, and `kernels/<family>.fatbin`;
//! - `registry.rs`: the typed Rust registry of entry points with their ptxas reports and the
//!   dynamic shared memory each takes (evaluated from the kernel sources by `shared_probe`);
//! - `abi.rs` and `abi_probe.c`: the Rust mirrors of the parameter structs and a C layout probe;
//! - `ptxas-report.tsv` and `codegen-report.txt`: the resource report and what the build did.

pub mod abi;
pub mod dsl;
pub mod emit;
pub mod expr;
pub mod nvcc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct BuildConfig {
    /// `kernels-src/`.
    pub kernels_dir: PathBuf,
    pub out_dir: PathBuf,
    /// Content-addressed fatbin cache shared by builds of every profile.
    pub cache_dir: PathBuf,
    pub nvcc: PathBuf,
    /// Concurrent nvcc processes.
    pub jobs: usize,
}

#[derive(Debug)]
pub struct BuildReport {
    pub families: usize,
    pub kernels: usize,
    pub nvcc_runs: usize,
    pub cached: usize,
    /// (entry point, arch) -> report.
    pub ptxas: BTreeMap<String, Vec<nvcc::PtxasEntry>>,
    /// Bytes of each family's fatbin.
    pub fatbin_bytes: BTreeMap<String, u64>,
}

/// Reads and checks the DSL without compiling anything.
pub fn check_dsl(kernels_dir: &Path) -> Result<(dsl::KernelList, Vec<dsl::Family>), String> {
    let path = kernels_dir.join("kernels.toml");
    let src = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let list = dsl::parse(&src)?;
    let fams = dsl::check(&list)?;
    for f in &fams {
        let h = kernels_dir.join(&f.spec.header);
        if !h.is_file() {
            return Err(format!("{}: header {} does not exist", f.spec.name, h.display()));
        }
    }
    Ok((list, fams))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    // Leave an unchanged file alone so its timestamp does not trigger rebuilds.
    if std::fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn build(cfg: &BuildConfig) -> Result<BuildReport, String> {
    let (list, fams) = check_dsl(&cfg.kernels_dir)?;
    let header = cfg.kernels_dir.join("abi.h");
    let structs = abi::parse(&std::fs::read_to_string(&header).map_err(|e| format!("{}: {e}", header.display()))?)?;
    for f in &fams {
        if !structs.iter().any(|s| s.name == f.spec.params) {
            return Err(format!("{}: params struct `{}` is not defined in abi.h", f.spec.name, f.spec.params));
        }
    }
    let kdir = cfg.out_dir.join("kernels");
    std::fs::create_dir_all(&kdir).map_err(|e| format!("{}: {e}", kdir.display()))?;
    write(&cfg.out_dir.join("abi.rs"), &abi::emit_rust(&structs))?;
    write(&cfg.out_dir.join("abi_probe.c"), &abi::emit_c_probe(&structs))?;

    let mut jobs = Vec::new();
    for f in &fams {
        let src = kdir.join(format!("{}.cu", f.spec.name));
        write(&src, &emit::translation_unit(f))?;
        jobs.push(nvcc::Job {
            name: f.spec.name.clone(),
            source: src,
            output: kdir.join(format!("{}.fatbin", f.spec.name)),
        });
    }
    let mut flags = list.targets.flags.clone();
    flags.extend(nvcc::arch_flags(&list.targets.sass, &list.targets.ptx));
    let runs = AtomicUsize::new(0);
    let results = nvcc::compile_all(&cfg.nvcc, &cfg.kernels_dir, &flags, jobs, &cfg.cache_dir, cfg.jobs, &runs)?;

    let mut ptxas: BTreeMap<String, Vec<nvcc::PtxasEntry>> = BTreeMap::new();
    let mut serialized = std::collections::BTreeSet::new();
    for r in &results {
        for (sym, e) in nvcc::parse_ptxas(&r.ptxas_log) {
            ptxas.entry(sym).or_default().push(e);
        }
        serialized.extend(nvcc::wgmma_serialized(&r.ptxas_log));
    }
    // Every variant must have a report per architecture, and hot kernels must neither spill, nor
    // keep a stack frame (a local array left indexed at run time is local-memory traffic as a
    // spill is: one made every decode kernel 17-75% slower), nor have their wgmma instructions
    // serialised by ptxas.
    let mut tsv = String::from("kernel\tarch\tregisters\tshared_bytes\tstack_bytes\tspill_stores\tspill_loads\thot\n");
    let mut violations = Vec::new();
    for f in &fams {
        for v in &f.variants {
            let sym = v.symbol(&f.spec.name);
            let entries = ptxas.get(&sym).cloned().unwrap_or_default();
            for arch in &list.targets.sass {
                if !entries.iter().any(|e| &e.arch == arch) {
                    return Err(format!("no ptxas report for {sym} on {arch}: was the entry point compiled?"));
                }
            }
            if f.spec.hot && serialized.contains(&sym) {
                violations.push(format!("{sym}: ptxas serialised its wgmma instructions (C7514/C7515)"));
            }
            for e in &entries {
                tsv.push_str(&format!(
                    "{sym}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                    e.arch, e.registers, e.shared_bytes, e.stack_bytes, e.spill_stores, e.spill_loads, f.spec.hot
                ));
                if f.spec.hot && e.uses_local_memory() {
                    violations.push(format!(
                        "{sym} on {}: {} bytes spill stores, {} bytes spill loads, {} bytes stack frame",
                        e.arch, e.spill_stores, e.spill_loads, e.stack_bytes
                    ));
                }
            }
        }
    }
    write(&cfg.out_dir.join("ptxas-report.tsv"), &tsv)?;
    if !violations.is_empty() {
        return Err(format!(
            "hot kernels spill registers, use a stack frame or serialise wgmma (see ptxas-report.tsv):\n  {}",
            violations.join("\n  ")
        ));
    }
    // Each variant's dynamic shared memory, evaluated from the kernel sources by a host probe.
    let shared = match emit::shared_probe(&fams) {
        Some(src) => {
            let out = nvcc::run_host_probe(
                &cfg.nvcc,
                &cfg.kernels_dir,
                &list.targets.flags,
                "shared_probe",
                &src,
                &cfg.out_dir,
                &cfg.cache_dir,
                &runs,
            )?;
            emit::parse_shared_probe(&out)?
        }
        None => BTreeMap::new(),
    };
    for f in fams.iter().filter(|f| f.spec.dynamic_shared.is_some()) {
        for v in &f.variants {
            let sym = v.symbol(&f.spec.name);
            if !shared.contains_key(&sym) {
                return Err(format!("the shared-memory probe printed nothing for {sym}"));
            }
        }
    }
    write(&cfg.out_dir.join("registry.rs"), &emit::registry(&list.targets, &list.rust_types, &fams, &ptxas, &shared))?;

    let mut fatbin_bytes = BTreeMap::new();
    for f in &fams {
        let p = kdir.join(format!("{}.fatbin", f.spec.name));
        fatbin_bytes.insert(f.spec.name.clone(), std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0));
    }
    let report = BuildReport {
        families: fams.len(),
        kernels: fams.iter().map(|f| f.variants.len()).sum(),
        nvcc_runs: runs.load(Ordering::SeqCst),
        cached: results.iter().filter(|r| r.from_cache).count(),
        ptxas,
        fatbin_bytes,
    };
    let mut summary = format!(
        "families {}\nkernels {}\nnvcc_runs {}\ncached {}\n",
        report.families, report.kernels, report.nvcc_runs, report.cached
    );
    for (k, v) in &report.fatbin_bytes {
        summary.push_str(&format!("fatbin {k} {v}\n"));
    }
    std::fs::write(cfg.out_dir.join("codegen-report.txt"), summary).map_err(|e| e.to_string())?;
    Ok(report)
}
