//! DCP across real GPUs over NCCL: a whole decode step per rank ([`DecodeStep`]) against the CPU
//! reference full attention (docs/contract.md §9 tolerances), dense BF16 and sparse FP8-656 with
//! distributed top-k, q ∈ {1, 6}, rows where a rank is empty; ag_rs against a2a; a graph-captured
//! step against the eager one; the prefix all-gather.
//!
//! One process per GPU, as engines run: the test spawns itself once per rank
//! (`std::env::current_exe()` with `DCP_MLA_MGPU_RANK` set; rank 0 publishes the NCCL unique id in a
//! temp file). It uses every GPU (D = device count, at most 8) and fails with fewer than 2.

mod common;

use common::{seed, Rng};
use cudarc::driver::sys;
use dcp_mla::dcp::{
    exchange_id_via_file, library_path_with_libnccl, visible_devices, Attention, CombineShape, DcpGroup, DecodeStep,
    StepConfig,
};
use dcp_mla::formats::{KvFormat, D_LATENT, D_QK, D_ROPE};
use dcp_mla::reference::attention::{apply_sink_oracle, decode_oracle, QueryShape, Selection};
use dcp_mla::reference::fill::{fill, FillInput, PagedCache};
use dcp_mla::reference::tolerance::{check_attention, AttentionOracle, OUT_ELEMENT_FACTOR};
use dcp_mla::reference::topk::local_topk;
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use dcp_mla::DcpLayout;
use half::bf16;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RANK: &str = "DCP_MLA_MGPU_RANK";
const SIZE: &str = "DCP_MLA_MGPU_SIZE";
const ID_FILE: &str = "DCP_MLA_MGPU_ID";
const SEED: &str = "DCP_MLA_TEST_SEED";
/// Query heads per rank (H = D·H_l ≤ 64 at D = 8).
const H_L: usize = 8;

/// In a child: opens its GPU, joins the group and runs `work`. In the parent: spawns `d` children
/// (one per GPU) running only `test`, waits for all of them (with a deadline), prints their
/// output and fails if any failed.
fn spawn_or_work(test: &str, d: usize, work: fn(&Device, &DcpGroup, u64)) {
    if let Ok(rank) = std::env::var(RANK) {
        let rank: usize = rank.parse().expect("rank");
        let size: usize = std::env::var(SIZE).expect("size").parse().expect("size");
        let seed: u64 = std::env::var(SEED).expect("seed").parse().expect("seed");
        let dev = Device::open(rank).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let id = exchange_id_via_file(rank, std::path::Path::new(&std::env::var(ID_FILE).expect("id file")))
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let t0 = Instant::now();
        let group = DcpGroup::from_unique_id(&dev, &id, rank, size)
            .unwrap_or_else(|e| panic!("rank {rank}: joining the group: {e}"));
        eprintln!("[rank {rank}/{size}] joined the NCCL group in {:.2?}", t0.elapsed());
        work(&dev, &group, seed);
        eprintln!("[rank {rank}/{size}] all checks passed");
        return;
    }
    let seed = seed();
    let dir = std::env::temp_dir();
    let id_path = dir.join(format!("dcp-mla-nccl-id-{}-{test}", std::process::id()));
    let _ = std::fs::remove_file(&id_path);
    let lib_path = library_path_with_libnccl();
    let exe = std::env::current_exe().expect("own executable");
    let mut children = Vec::new();
    for r in 0..d {
        let log = dir.join(format!("dcp-mla-mgpu-{}-{test}-{r}.log", std::process::id()));
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(&exe);
        cmd.args([test, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
            .env(RANK, r.to_string())
            .env(SIZE, d.to_string())
            .env(ID_FILE, &id_path)
            .env(SEED, seed.to_string())
            .env("NCCL_NVLS_ENABLE", "0")
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file));
        if let Some(p) = &lib_path {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        children.push((cmd.spawn().expect("spawn a rank"), log));
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut status = vec![None; d];
    while status.iter().any(|s| s.is_none()) {
        for (r, (child, _)) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = child.try_wait().expect("wait").map(|s| s.success());
            }
        }
        if Instant::now() > deadline {
            for (r, (child, _)) in children.iter_mut().enumerate() {
                if status[r].is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                    status[r] = Some(false);
                    eprintln!("rank {r} timed out and was killed");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&id_path);
    for (r, (_, log)) in children.iter().enumerate() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| !l.starts_with("running 1 test") && !l.trim().is_empty()) {
            eprintln!("  [rank {r}] {line}");
        }
        let _ = std::fs::remove_file(log);
    }
    let failed: Vec<usize> = (0..d).filter(|&r| status[r] != Some(true)).collect();
    assert!(failed.is_empty(), "ranks {failed:?} of D = {d} failed (seed {seed})");
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn decode_step_across_gpus() {
    let d = visible_devices().min(8);
    assert!(d >= 2, "this test needs 2 or more CUDA GPUs; this machine has {d}");
    spawn_or_work("decode_step_across_gpus", d, |dev, group, seed| {
        prefix_gather(dev, group);
        run_cases(dev, group, seed, &[CombineShape::AgRs, CombineShape::A2a], true);
    });
}

/// The same step logic (and graph capture) in a group of one on one GPU: no NCCL peer, and the
/// a2a combine needs D ≥ 2.
#[test]
#[ignore = "needs a CUDA GPU"]
fn decode_step_group_of_one() {
    assert!(visible_devices() >= 1, "this GPU test needs a CUDA device");
    spawn_or_work("decode_step_group_of_one", 1, |dev, group, seed| {
        run_cases(dev, group, seed, &[CombineShape::AgRs], true);
    });
}

/// Each rank's flattened rows all-gathered in rank order.
fn prefix_gather(dev: &Device, group: &DcpGroup) {
    let (r, d, cap) = (group.rank(), group.size(), 37);
    let s = dev.context().new_stream().unwrap();
    let local: Vec<bf16> = (0..cap * D_QK).map(|i| bf16::from_f32((r * 1000 + i % 997) as f32)).collect();
    let local_dev = s.clone_htod(&local).unwrap();
    let gathered = s.clone_htod(&vec![bf16::NAN; d * cap * D_QK]).unwrap();
    group
        .gather_prefix(Stream::from_cudarc(&s), DeviceSlice::of(&local_dev, &s), DeviceSlice::of(&gathered, &s), cap)
        .expect("prefix gather");
    let got = s.clone_dtoh(&gathered).unwrap();
    for src in 0..d {
        for i in 0..cap * D_QK {
            let want = bf16::from_f32((src * 1000 + i % 997) as f32);
            assert_eq!(got[src * cap * D_QK + i].to_bits(), want.to_bits(), "prefix gather: rank {src} element {i}");
        }
    }
    eprintln!("[rank {r}] prefix all-gather [D = {d}, {cap}, 576]: ok");
}

/// One case: the requests' total lengths (including their q new tokens), q, attention.
struct Case {
    name: &'static str,
    lens: Vec<u64>,
    nq: usize,
    attention: Attention,
    block_size: usize,
}

fn cases(d: usize) -> Vec<Case> {
    let fp8 = Attention::Sparse { k: 512, format: KvFormat::Fp8_656 };
    let bd = 16 * d as u64;
    vec![
        // length 1: every rank but 0 is empty for that request.
        Case {
            name: "dense bf16 q=1",
            lens: vec![1, 16, bd + 1, 301],
            nq: 1,
            attention: Attention::Dense,
            block_size: 16,
        },
        // length 6 with q = 6: its first rows leave ranks empty.
        Case { name: "dense bf16 q=6", lens: vec![6, bd + 5, 211], nq: 6, attention: Attention::Dense, block_size: 16 },
        Case { name: "sparse fp8 q=1", lens: vec![1, 700, 1333], nq: 1, attention: fp8, block_size: 64 },
        Case { name: "sparse fp8 q=6", lens: vec![6, 517, 1100], nq: 6, attention: fp8, block_size: 64 },
    ]
}

/// Inputs of one case, identical on every rank (same seed).
struct Inputs {
    /// Per request, its L token rows of 576 values.
    tokens: Vec<Vec<bf16>>,
    /// bf16 [T, H, 576].
    q: Vec<bf16>,
    /// fp32 [T, max_len] global indexer scores (sparse).
    scores: Vec<f32>,
    max_len: usize,
    table: Vec<i32>,
}

fn inputs(rng: &mut Rng, c: &Case, cfg: &StepConfig) -> Inputs {
    let tokens =
        c.lens.iter().map(|&l| (0..l as usize * D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect()).collect();
    let q = (0..cfg.rows() * cfg.heads() * D_QK).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect();
    let max_len = *c.lens.iter().max().unwrap() as usize;
    let scores = (0..cfg.rows() * max_len).map(|_| rng.unit() * 8.0).collect();
    let mut table: Vec<i32> = (0..cfg.num_pages as i32).collect();
    rng.shuffle(&mut table);
    Inputs { tokens, q, scores, max_len, table }
}

fn nan_cache(format: KvFormat, slots: usize) -> Vec<u8> {
    let row: Vec<u8> = match format {
        KvFormat::Bf16 => (0..D_QK).flat_map(|_| bf16::NAN.to_bits().to_le_bytes()).collect(),
        KvFormat::Fp8_656 => vec![0xff; format.token_bytes()],
    };
    row.repeat(slots)
}

/// Fills `bytes` (NaN elsewhere) with tokens [0, upto(i)) of every request on `rank` of `dcp`.
fn fill_host(inp: &Inputs, cache: &PagedCache, dcp: DcpLayout, rank: usize, upto: &[u64], bytes: &mut [u8]) {
    for (i, rows) in inp.tokens.iter().enumerate() {
        let n = upto[i] as usize;
        if n == 0 {
            continue;
        }
        let positions: Vec<i32> = (0..n as i32).collect();
        let req = vec![i as i32; n];
        let input = FillInput {
            ckv: &rows[..n * D_QK],
            ckv_stride: D_QK,
            kpe: &rows[D_LATENT..n * D_QK],
            kpe_stride: D_QK,
            req_idx: &req,
            positions: &positions,
        };
        fill(&input, cache, dcp, rank, bytes);
    }
}

/// The reference: full attention of this rank's heads over all tokens on one (D = 1) cache.
fn reference(inp: &Inputs, c: &Case, cfg: &StepConfig, rank: usize) -> AttentionOracle {
    let (b, nq, t) = (cfg.batch, cfg.nq, cfg.rows());
    let one = DcpLayout { size: 1, interleave: 1 };
    let bs = c.block_size;
    let max_pages = inp.max_len.div_ceil(bs);
    let table: Vec<i32> = (0..(b * max_pages) as i32).collect();
    let format = c.attention.format();
    let paged = PagedCache {
        block_table: &table,
        block_table_stride: max_pages,
        batch: b,
        max_pages,
        num_pages: b * max_pages,
        block_size: bs,
        format,
    };
    let mut bytes = nan_cache(format, b * max_pages * bs);
    fill_host(inp, &paged, one, 0, &c.lens, &mut bytes);
    let h = cfg.heads();
    let q: Vec<bf16> = (0..t)
        .flat_map(|row| inp.q[(row * h + rank * H_L) * D_QK..(row * h + (rank + 1) * H_L) * D_QK].iter().copied())
        .collect();
    let causal: Vec<i32> =
        c.lens.iter().flat_map(|&l| (0..nq as u64).map(move |j| (l - nq as u64 + 1 + j) as i32)).collect();
    let shape = QueryShape { batch: b, rows: nq, heads: H_L };
    let scale = cfg.scale;
    match c.attention {
        Attention::Dense => decode_oracle(&q, shape, &paged, &bytes, &Selection::Dense { lens: &causal }, scale),
        Attention::Sparse { k, .. } => {
            let ids = local_topk(&inp.scores, t, inp.max_len, inp.max_len, &causal, k);
            let slots: Vec<i32> = ids
                .iter()
                .enumerate()
                .map(|(n, &id)| if id < 0 { -1 } else { ((n / k / nq) * max_pages * bs) as i32 + id })
                .collect();
            decode_oracle(&q, shape, &paged, &bytes, &Selection::Sparse { indices: &slots, k, topk_len: None }, scale)
        }
    }
}

/// docs/contract.md §9 against the fp64 oracle (reference::tolerance; its 2^-6·A_c covers the a2a shape's
/// bf16 partials too). Returns the relative L2 error.
fn check(what: &str, out: &[bf16], lse: &[f32], want: &AttentionOracle) -> f64 {
    match check_attention(what, out.iter().map(|x| x.to_f64()), lse.iter().map(|&x| x as f64), want) {
        Ok(e) => e.rel_l2,
        Err(e) => panic!("{e}"),
    }
}

/// One bf16 ulp of a value of magnitude v (and of the smallest normal, for values near 0).
fn one_ulp(_: usize, v: f64) -> f64 {
    (v * 2f64.powi(-7)).max(1e-38)
}

fn bits_equal(what: &str, a: &(Vec<bf16>, Vec<f32>), b: &(Vec<bf16>, Vec<f32>)) {
    let first = a.0.iter().zip(&b.0).position(|(x, y)| x.to_bits() != y.to_bits());
    assert!(first.is_none(), "{what}: out differs first at {first:?}");
    let first = a.1.iter().zip(&b.1).position(|(x, y)| x.to_bits() != y.to_bits());
    assert!(first.is_none(), "{what}: lse differs first at {first:?}");
}

/// Two results of one step within `tol(k, value)` of each other elementwise (lse within 1e-5).
/// ag_rs (fp32 partials) against a2a (bf16 partials): each is within 2^-6·A_c of the oracle, so
/// they differ by at most twice that; a graph replay against the eager run: the reduce-scatter
/// may sum in another order when D > 2, which moves a bf16 output by at most one ulp.
fn close(what: &str, a: &(Vec<bf16>, Vec<f32>), b: &(Vec<bf16>, Vec<f32>), tol: impl Fn(usize, f64) -> f64) {
    for (k, (x, y)) in a.0.iter().zip(&b.0).enumerate() {
        let (x, y) = (x.to_f64(), y.to_f64());
        let d = (x - y).abs();
        assert!(!x.is_nan() && !y.is_nan(), "{what}: NaN at out[{k}]");
        assert!(d <= tol(k, x.abs().max(y.abs())), "{what}: out[{k}] = {x} vs {y}");
    }
    for (k, (&x, &y)) in a.1.iter().zip(&b.1).enumerate() {
        assert!(x == y || (x - y).abs() <= 1e-5, "{what}: lse[{k}] = {x} vs {y}");
    }
}

fn run_cases(dev: &Device, group: &DcpGroup, seed: u64, shapes: &[CombineShape], graphs: bool) {
    let (rank, d) = (group.rank(), group.size());
    let dcp = DcpLayout { size: d, interleave: 1 };
    for (n, c) in cases(d).into_iter().enumerate() {
        let mut rng = Rng::new(seed ^ ((n as u64 + 1) * 0x9e37));
        let max_len = *c.lens.iter().max().unwrap();
        let cfg = StepConfig::for_context(c.lens.len(), c.nq, H_L, dcp, c.block_size, max_len, c.attention);
        let inp = inputs(&mut rng, &c, &cfg);
        let stream = dev.context().new_stream().unwrap();
        let mut step = DecodeStep::new(dev, group, stream.clone(), cfg).expect("step");
        let what = |s: &str| format!("[rank {rank}/{d}] {} {s}", c.name);

        // The context before the step: every token but the q new ones, on this rank's pages.
        let format = c.attention.format();
        let paged = PagedCache {
            block_table: &inp.table,
            block_table_stride: cfg.max_pages,
            batch: cfg.batch,
            max_pages: cfg.max_pages,
            num_pages: cfg.num_pages,
            block_size: c.block_size,
            format,
        };
        let before: Vec<u64> = c.lens.iter().map(|&l| l - c.nq as u64).collect();
        let mut bytes = nan_cache(format, cfg.num_pages * c.block_size);
        fill_host(&inp, &paged, dcp, rank, &before, &mut bytes);
        let mut after = bytes.clone();
        fill_host(&inp, &paged, dcp, rank, &c.lens, &mut after);
        step.set_cache(&bytes).unwrap();
        step.set_block_table(&inp.table).unwrap();
        step.set_lengths(&c.lens).unwrap();
        let (mut ckv, mut kpe) = (Vec::new(), Vec::new());
        for (i, &l) in c.lens.iter().enumerate() {
            for pos in l as usize - c.nq..l as usize {
                let row = &inp.tokens[i][pos * D_QK..(pos + 1) * D_QK];
                ckv.extend_from_slice(&row[..D_LATENT]);
                kpe.extend_from_slice(&row[D_LATENT..D_LATENT + D_ROPE]);
            }
        }
        step.set_new_kv(&ckv, &kpe).unwrap();
        let h = cfg.heads();
        let q_local = |q: &[bf16]| -> Vec<bf16> {
            (0..cfg.rows())
                .flat_map(|row| q[(row * h + rank * H_L) * D_QK..(row * h + (rank + 1) * H_L) * D_QK].to_vec())
                .collect()
        };
        step.set_queries(&q_local(&inp.q)).unwrap();
        if let Attention::Sparse { .. } = c.attention {
            let cols = cfg.local_capacity();
            let mut local = vec![f32::NAN; cfg.rows() * cols];
            for row in 0..cfg.rows() {
                for l in 0..cols {
                    let g = dcp.global(l as u64, rank) as usize;
                    if g < inp.max_len {
                        local[row * cols + l] = inp.scores[row * inp.max_len + g];
                    }
                }
            }
            step.set_scores(&local).unwrap();
        }
        let want = reference(&inp, &c, &cfg, rank);

        let eager = |step: &mut DecodeStep, shape: CombineShape| {
            step.fill_outputs(bf16::NAN, f32::NAN).unwrap();
            step.run(shape).unwrap_or_else(|e| panic!("{}: {e}", what("run")));
            step.output().unwrap()
        };
        let mut results = Vec::new();
        for &shape in shapes {
            let got = eager(&mut step, shape);
            let rel = check(&what(&format!("{shape:?} vs reference")), &got.0, &got.1, &want);
            eprintln!(
                "{}: ok (relative L2 {rel:.2e}, {} splits)",
                what(&format!("{shape:?} vs reference")),
                step.num_splits()
            );
            results.push((shape, got));
        }
        assert!(
            step.cache().unwrap() == after,
            "{}: the cache after the fill differs from the reference fill",
            what("")
        );
        eprintln!("{}: cache after the fill bit-exact", what(""));
        if let [(_, a), (_, b)] = &results[..] {
            close(&what("ag_rs vs a2a"), a, b, |k, _| 2.0 * OUT_ELEMENT_FACTOR * want.mean_abs_v[k]);
            eprintln!("{}: ok", what("ag_rs == a2a"));
        }
        // Attention sinks under DCP: the combine's last step applies this rank's H_l sinks once,
        // so the group equals one rank over all tokens with the sinks (docs/contract.md §4).
        let sinks: Vec<f32> = (0..H_L)
            .map(|j| match (rank * H_L + j) % 4 {
                0 => f32::NEG_INFINITY,
                1 => 1.5,
                2 => -2.0,
                _ => 6.0,
            })
            .collect();
        let mut want_sink = want.clone();
        apply_sink_oracle(&mut want_sink, &sinks);
        step.set_sinks(Some(&sinks)).unwrap();
        for &shape in shapes {
            let got = eager(&mut step, shape);
            check(&what(&format!("{shape:?} with sinks vs reference")), &got.0, &got.1, &want_sink);
            eprintln!("{}: ok", what(&format!("{shape:?} with sinks vs reference")));
        }
        step.set_sinks(None).unwrap();
        if !graphs {
            continue;
        }
        for (shape, eager_out) in &results {
            let s = step.stream().clone();
            s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
            let captured = step.run(*shape);
            let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
            captured.unwrap_or_else(|e| panic!("{}: {e}", what("capture")));
            let graph = graph.expect("end capture").expect("a graph");
            step.fill_outputs(bf16::NAN, f32::NAN).unwrap();
            graph.launch().unwrap();
            let replay = step.output().unwrap();
            if d <= 2 || *shape == CombineShape::A2a {
                bits_equal(&what(&format!("{shape:?} graph vs eager")), &replay, eager_out);
            } else {
                close(&what(&format!("{shape:?} graph vs eager")), &replay, eager_out, one_ulp);
            }
            // New queries in place: the replay must read them.
            let q2: Vec<bf16> = inp.q.iter().map(|x| bf16::from_f32(-x.to_f32() * 0.5)).collect();
            step.set_queries(&q_local(&q2)).unwrap();
            step.fill_outputs(bf16::NAN, f32::NAN).unwrap();
            graph.launch().unwrap();
            let replay2 = step.output().unwrap();
            let eager2 = eager(&mut step, *shape);
            assert!(replay2.1 != replay.1, "{}: the replay did not see the new queries", what("graph"));
            if d <= 2 || *shape == CombineShape::A2a {
                bits_equal(&what(&format!("{shape:?} graph vs eager, new q")), &replay2, &eager2);
            } else {
                close(&what(&format!("{shape:?} graph vs eager, new q")), &replay2, &eager2, one_ulp);
            }
            step.set_queries(&q_local(&inp.q)).unwrap();
            eprintln!("{}: ok", what(&format!("{shape:?} graph replay == eager (twice, new q in place)")));
        }
    }
}
