//! Host time of a dense decode launch and its pieces (µs a call, best of 7 rounds of 2,000
//! back-to-back calls on a tiny problem: b 8, q 1, H 16, 64 tokens), to find where a launch's
//! host time goes (docs/performance.md, "Python launch overhead"). Prints JSON; without a GPU, a
//! message and exit code 2. The kernels queue behind each other on the stream; the stream is
//! synchronised between rounds only.

use cudarc::driver::{CudaSlice, CudaStream};
use dcp_mla::ops::decode::{
    decode_num_splits, decode_workspace_bytes, host_pieces, mla_decode_dense, mla_decode_dense_on, DecodeCommon,
    DecodeOut, DecodePath, DecodeSchedule, DenseDecode, LensRule,
};
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::runtime::{DeviceSlice, Stream};
use dcp_mla_cli::bench::gpu_or_exit;
use half::bf16;
use std::sync::Arc;
use std::time::Instant;

fn buf<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(s: &Arc<CudaStream>, n: usize) -> CudaSlice<T> {
    s.alloc_zeros::<T>(n.max(1)).expect("alloc")
}

fn best_us(s: &Arc<CudaStream>, mut f: impl FnMut()) -> f64 {
    let n = 2000;
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        s.synchronize().expect("sync");
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    s.synchronize().expect("sync");
    best
}

fn main() {
    let dev = gpu_or_exit("host_time needs");
    let s = dev.context().default_stream();
    let raw = Stream::from_cudarc(&s);
    let (b, nq, h, tokens, block) = (8usize, 1usize, 16usize, 64usize, 64usize);
    let rows = b * nq * h;
    let q = buf::<bf16>(&s, rows * 576);
    let out = buf::<bf16>(&s, rows * 512);
    let lse = buf::<f32>(&s, rows);
    let pages = b * tokens.div_ceil(block);
    let cache = buf::<u8>(&s, pages * block * 1152);
    let table = s.clone_htod(&(0..pages as i32).collect::<Vec<_>>()).expect("table");
    let lens = s.clone_htod(&vec![tokens as i32; b * nq]).expect("lens");
    let splits = decode_num_splits(b, nq, h, false, dev.num_sms());
    let ws = buf::<u8>(&s, decode_workspace_bytes(b, nq, h, false, splits).expect("ws"));
    let v = |x| DeviceSlice::of(x, &s);
    let args = |splits: usize| DenseDecode {
        common: DecodeCommon::new(
            DeviceSlice::of(&q, &s),
            b,
            nq,
            h,
            DecodeOut::Bf16(DeviceSlice::of(&out, &s)),
            DeviceSlice::of(&lse, &s),
            splits,
            DeviceSlice::of(&ws, &s),
        ),
        cache: CacheView::packed(v(&cache), pages, block),
        block_table: BlockTable::packed(DeviceSlice::of(&table, &s), tokens.div_ceil(block)),
        lens: DeviceSlice::of(&lens, &s),
        lens_strides: None,
        lens_rule: LensRule::Local,
    };
    let one = args(1);
    let split = args(splits);
    let reuse = DenseDecode { common: DecodeCommon { schedule: DecodeSchedule::Reuse, ..split.common }, ..split };
    mla_decode_dense(&dev, raw, &split).expect("a first split launch (computes the schedule)");
    let mut r = serde_json::Map::new();
    let mut put = |k: &str, us: f64| {
        eprintln!("{k:48} {us:7.2} µs");
        r.insert(k.into(), serde_json::json!((us * 100.0).round() / 100.0));
    };
    put("launch, 1 split (Auto)", best_us(&s, || mla_decode_dense(&dev, raw, &one).expect("launch")));
    put(
        "launch, 1 split, mma (no tensor map)",
        best_us(&s, || mla_decode_dense_on(&dev, raw, &one, DecodePath::Mma).expect("launch")),
    );
    put(
        &format!("launch, {splits} splits, schedule computed"),
        best_us(&s, || mla_decode_dense(&dev, raw, &split).expect("launch")),
    );
    put(
        &format!("launch, {splits} splits, schedule reused"),
        best_us(&s, || mla_decode_dense(&dev, raw, &reuse).expect("launch")),
    );
    put("piece: argument checks and parameters", best_us(&s, || host_pieces::checks(&one).expect("checks")));
    put("piece: kernel choice (table and registry)", best_us(&s, || host_pieces::choice(&dev, &one).expect("choice")));
    put("piece: tensor map encode", best_us(&s, || host_pieces::tensor_map(&dev, &one).expect("map")));
    put("piece: cuCtxSetCurrent (bind_to_thread)", best_us(&s, || dev.context().bind_to_thread().expect("bind")));
    println!("{}", serde_json::Value::Object(r));
}
