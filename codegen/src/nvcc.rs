//! Finding the pinned nvcc, compiling translation units to fatbins in parallel with a content
//! cache, and reading ptxas's resource report.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Where `scripts/setup-cuda.sh` installs nvcc, relative to the repository root.
pub const LOCAL_NVCC: &str = ".toolchain/cuda/nvidia/cu13/bin/nvcc";

/// nvcc from, in order: `DCP_MLA_NVCC`, the repo-local toolchain, `$CUDA_HOME/bin`, `PATH`.
pub fn find_nvcc(repo_root: &Path) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("DCP_MLA_NVCC") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("DCP_MLA_NVCC is set to {}, which is not a file.", p.display()))
        };
    }
    let local = repo_root.join(LOCAL_NVCC);
    if local.is_file() {
        return Ok(local);
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let p = PathBuf::from(home).join("bin/nvcc");
        if p.is_file() {
            return Ok(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err("no CUDA compiler found: run ./scripts/setup-cuda.sh to install the pinned nvcc 13.0 \
         (or set DCP_MLA_NVCC to an nvcc binary)."
        .to_string())
}

/// `nvcc --version`'s last line, e.g. `Build cuda_13.0.r13.0/compiler.36424714_0`.
pub fn version(nvcc: &Path) -> Result<String, String> {
    let out =
        Command::new(nvcc).arg("--version").output().map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if !out.status.success() {
        return Err(format!("{} --version failed", nvcc.display()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string())
}

/// ptxas's report for one entry point on one architecture.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PtxasEntry {
    pub arch: String,
    pub registers: u32,
    pub shared_bytes: u32,
    /// Per-thread stack frame: the kernel's local memory.
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

impl PtxasEntry {
    /// Whether the kernel touches local memory: a spill, or a stack frame (an array ptxas left
    /// indexed at run time). A hot kernel may do neither.
    pub fn uses_local_memory(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0 || self.stack_bytes > 0
    }
}

fn number_before(s: &str, unit: &str) -> Option<u32> {
    let i = s.find(unit)?;
    s[..i].split(|c: char| !c.is_ascii_digit()).rfind(|t| !t.is_empty())?.parse().ok()
}

/// Parses `nvcc -Xptxas -v` output into (entry point, report) pairs.
pub fn parse_ptxas(text: &str) -> Vec<(String, PtxasEntry)> {
    let mut out: Vec<(String, PtxasEntry)> = Vec::new();
    let mut cur: Option<(String, PtxasEntry)> = None;
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            let mut it = rest.split('\'');
            let name = it.next().unwrap_or("").to_string();
            let arch = rest.split("for '").nth(1).and_then(|a| a.split('\'').next()).unwrap_or("");
            cur = Some((name, PtxasEntry { arch: arch.to_string(), ..Default::default() }));
        } else if let Some((_, e)) = cur.as_mut() {
            if line.contains("bytes stack frame") {
                e.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                e.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                e.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                e.registers = number_before(line, "registers").unwrap_or(0);
                e.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    if let Some(c) = cur {
        out.push(c);
    }
    out
}

/// Entry points whose wgmma instructions ptxas serialised (its C7515-family "Potential
/// Performance Loss: wgmma.mma_async instructions are serialized ... in the function 'x'"): the
/// kernel still runs, but every wgmma waits for the one before it.
pub fn wgmma_serialized(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains("wgmma.mma_async instructions are serialized"))
        .filter_map(|l| l.split_once("in the function '")?.1.split('\'').next())
        .map(str::to_string)
        .collect()
}

/// One nvcc job: a translation unit and where its fatbin goes.
pub struct Job {
    pub name: String,
    pub source: PathBuf,
    pub output: PathBuf,
}

pub struct CompileResult {
    pub name: String,
    pub ptxas_log: String,
    pub from_cache: bool,
}

/// The nvcc command line, minus the input and output.
pub fn arch_flags(sass: &[String], ptx: &str) -> Vec<String> {
    let mut v = Vec::new();
    for a in sass {
        let virt = a.replacen("sm_", "compute_", 1);
        v.push("-gencode".to_string());
        v.push(format!("arch={virt},code={a}"));
    }
    v.push("-gencode".to_string());
    v.push(format!("arch={ptx},code={ptx}"));
    v
}

/// Compiles the jobs with up to `jobs` nvcc processes at once. A job whose key (its source,
/// every header in `include_dir`, the flags and nvcc's version) is in `cache_dir` is copied
/// from there and runs no nvcc. `nvcc_runs` counts the nvcc invocations.
pub fn compile_all(
    nvcc: &Path,
    include_dir: &Path,
    flags: &[String],
    work: Vec<Job>,
    cache_dir: &Path,
    jobs: usize,
    nvcc_runs: &AtomicUsize,
) -> Result<Vec<CompileResult>, String> {
    std::fs::create_dir_all(cache_dir).map_err(|e| format!("{}: {e}", cache_dir.display()))?;
    let nvcc_version = version(nvcc)?;
    let headers = header_digest(include_dir)?;
    let queue = Mutex::new(work.into_iter().collect::<Vec<_>>());
    let results = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let Some(job) = queue.lock().unwrap().pop() else { break };
                match compile_one(nvcc, &nvcc_version, &headers, include_dir, flags, &job, cache_dir, nvcc_runs) {
                    Ok(r) => results.lock().unwrap().push(r),
                    Err(e) => errors.lock().unwrap().push(e),
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    let mut r = results.into_inner().unwrap();
    r.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(r)
}

/// Every `.h` / `.cuh` under `dir` (kernels-src and its arch/ and decode/ folders), with its path
/// relative to `dir`, hashed in path order: a kernel's cache key covers every header it may include.
fn header_digest(dir: &Path) -> Result<Vec<u8>, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
        for e in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let p = e.map_err(|e| e.to_string())?.path();
            if p.is_dir() {
                walk(&p, out)?;
            } else if matches!(p.extension().and_then(|e| e.to_str()), Some("h" | "cuh")) {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        h.update(f.strip_prefix(dir).unwrap_or(&f).to_string_lossy().as_bytes());
        h.update(std::fs::read(&f).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    Ok(h.finalize().to_vec())
}

#[allow(clippy::too_many_arguments)]
fn compile_one(
    nvcc: &Path,
    nvcc_version: &str,
    headers: &[u8],
    include_dir: &Path,
    flags: &[String],
    job: &Job,
    cache_dir: &Path,
    nvcc_runs: &AtomicUsize,
) -> Result<CompileResult, String> {
    let src = std::fs::read(&job.source).map_err(|e| format!("{}: {e}", job.source.display()))?;
    let mut h = Sha256::new();
    h.update(&src);
    h.update(headers);
    h.update(flags.join("\u{1f}").as_bytes());
    h.update(nvcc_version.as_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let cached_bin = cache_dir.join(format!("{}-{}.fatbin", job.name, &key[..24]));
    let cached_log = cached_bin.with_extension("ptxas.txt");
    if cached_bin.is_file() && cached_log.is_file() {
        std::fs::copy(&cached_bin, &job.output).map_err(|e| format!("{}: {e}", job.output.display()))?;
        let log = std::fs::read_to_string(&cached_log).map_err(|e| e.to_string())?;
        return Ok(CompileResult { name: job.name.clone(), ptxas_log: log, from_cache: true });
    }
    nvcc_runs.fetch_add(1, Ordering::SeqCst);
    let out = Command::new(nvcc)
        .arg("-fatbin")
        .args(flags)
        .arg("-Xptxas")
        .arg("-v")
        .arg("-I")
        .arg(include_dir)
        .arg("-o")
        .arg(&job.output)
        .arg(&job.source)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(format!("nvcc failed on kernel family `{}`:\n{log}", job.name));
    }
    // Write the cache entry through a temporary name so a concurrent build never reads half a file.
    let tmp = cached_bin.with_extension(format!("tmp{}", std::process::id()));
    std::fs::copy(&job.output, &tmp).map_err(|e| e.to_string())?;
    std::fs::write(&cached_log, &log).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, &cached_bin).map_err(|e| e.to_string())?;
    Ok(CompileResult { name: job.name.clone(), ptxas_log: log, from_cache: false })
}

/// Compiles `source` (a host program over the kernel headers in `include_dir`, written to
/// `work_dir`) with nvcc and runs it on this machine (no GPU needed), returning its stdout.
/// Cached in `cache_dir` under the same kind of key as the fatbins (source, every header, the
/// flags, nvcc's version), so a build whose kernels are all cached runs no nvcc for it either.
#[allow(clippy::too_many_arguments)]
pub fn run_host_probe(
    nvcc: &Path,
    include_dir: &Path,
    flags: &[String],
    name: &str,
    source: &str,
    work_dir: &Path,
    cache_dir: &Path,
    nvcc_runs: &AtomicUsize,
) -> Result<String, String> {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update(header_digest(include_dir)?);
    h.update(flags.join("\u{1f}").as_bytes());
    h.update(version(nvcc)?.as_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::create_dir_all(cache_dir).map_err(|e| format!("{}: {e}", cache_dir.display()))?;
    let cached = cache_dir.join(format!("{name}-{}.txt", &key[..24]));
    if let Ok(text) = std::fs::read_to_string(&cached) {
        return Ok(text);
    }
    let src = work_dir.join(format!("{name}.cu"));
    let exe = work_dir.join(name);
    std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
    nvcc_runs.fetch_add(1, Ordering::SeqCst);
    let out = Command::new(nvcc)
        .args(flags)
        .arg("--cudart=none")
        .arg("-I")
        .arg(include_dir)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if !out.status.success() {
        return Err(format!(
            "nvcc failed on the host probe {name}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe).output().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if !run.status.success() {
        return Err(format!("the host probe {} failed: {}", exe.display(), String::from_utf8_lossy(&run.stderr)));
    }
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    let tmp = cached.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &text).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, &cached).map_err(|e| e.to_string())?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ptxas_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'dcp_a' for 'sm_90a'\n\
ptxas info    : Function properties for dcp_a\n\
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'dcp_a' for 'sm_80'\n\
ptxas info    : Function properties for dcp_a\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 38 registers, used 0 barriers, 360 bytes cmem[0]\n";
        let v = parse_ptxas(log);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].0, "dcp_a");
        assert_eq!(
            v[0].1,
            PtxasEntry {
                arch: "sm_90a".into(),
                registers: 40,
                shared_bytes: 2048,
                stack_bytes: 16,
                spill_stores: 8,
                spill_loads: 4
            }
        );
        assert_eq!(v[1].1.arch, "sm_80");
        assert_eq!(v[1].1.registers, 38);
        assert_eq!(v[1].1.shared_bytes, 0);
        assert!(v[0].1.uses_local_memory());
        assert!(!v[1].1.uses_local_memory());
    }

    #[test]
    fn a_stack_frame_alone_is_local_memory() {
        let log = "ptxas info    : Compiling entry function 'dcp_c' for 'sm_90a'\n\
ptxas info    : Function properties for dcp_c\n\
    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 168 registers, used 1 barriers, 512 bytes smem, 400 bytes cmem[0]\n";
        let v = parse_ptxas(log);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].1.stack_bytes, 64);
        assert!(v[0].1.uses_local_memory());
    }

    #[test]
    fn finds_serialised_wgmma() {
        let log = "ptxas info    : (C7517) warpgroup.wait is injected in around line 6058 by compiler to allow use of registers defined by GMMA in function 'dcp_b'\n\
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function 'dcp_a'\n\
ptxas info    : Compiling entry function 'dcp_a' for 'sm_90a'\n";
        assert_eq!(wgmma_serialized(log), vec!["dcp_a".to_string()]);
        assert!(wgmma_serialized("ptxas info    : Used 40 registers\n").is_empty());
    }

    #[test]
    fn gencode_flags() {
        let f = arch_flags(&["sm_90a".into(), "sm_80".into()], "compute_90");
        assert_eq!(
            f,
            [
                "-gencode",
                "arch=compute_90a,code=sm_90a",
                "-gencode",
                "arch=compute_80,code=sm_80",
                "-gencode",
                "arch=compute_90,code=compute_90"
            ]
        );
    }
}
