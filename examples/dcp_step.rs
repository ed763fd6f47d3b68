//! One DCP decode step with D = 2 ranks simulated on one GPU: each rank fills its BF16 cache with
//! the tokens it owns and decodes its shard for all H heads; the a2a combine (pack, all-to-all,
//! combine) leaves rank d heads [d·H/D, (d+1)·H/D) merged over both shards. Checked against the
//! CPU reference over the unsharded cache. `cargo run --release --example dcp_step`.

use dcp_mla::formats::{D_LATENT, D_QK, D_ROPE, D_V};
use dcp_mla::ops::combine::{
    a2a_aligned_slot_bytes, a2a_combine, a2a_pack, A2aCombine, A2aPack, CombineGroup, CombineRows,
};
use dcp_mla::ops::decode::{decode_num_splits, decode_workspace_bytes, default_scale, mla_decode_dense};
use dcp_mla::ops::decode::{DecodeCommon, DecodeOut, DenseDecode, LensRule};
use dcp_mla::ops::fill::{kv_fill, KvFill, NewTokens};
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::reference::attention::{decode_oracle, QueryShape, Selection};
use dcp_mla::reference::fill::{fill, FillInput, PagedCache};
use dcp_mla::reference::tolerance::{check_attention, AttentionOracle};
use dcp_mla::runtime::{Device, DeviceSlice, Stream};
use dcp_mla::{rng::Rng, DcpLayout, Error, KvFormat, LseBase};
use half::bf16;

const D: usize = 2; // DCP ranks
const H_L: usize = 8; // heads each rank keeps after the combine; decode runs all H = D·H_L
const H: usize = D * H_L;
const B: usize = 64; // tokens per page
const ROW_BYTES: usize = KvFormat::Bf16.token_bytes();

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = match Device::open(0) {
        Ok(dev) => dev,
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            println!("dcp_step: skipped, no CUDA GPU ({e})");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let (s, dcp) = (dev.context().default_stream(), DcpLayout { size: D, interleave: 1 });
    let st = Stream::from_cudarc(&s);
    // one query row per request; request 0 has one token, so rank 1's shard of it is empty
    let lens: [u64; 3] = [1, 300, 777];
    let t = lens.len();
    let mut rng = Rng::new(7);
    let n = lens.iter().sum::<u64>() as usize;
    let mut rand = |len: usize| (0..len).map(|_| bf16::from_f32(rng.unit())).collect::<Vec<_>>();
    let (ckv, kpe, q) = (rand(n * D_LATENT), rand(n * D_ROPE), rand(t * H * D_QK));
    // the new tokens: every position of every request
    let req: Vec<i32> = (0..t).flat_map(|i| vec![i as i32; lens[i] as usize]).collect();
    let pos: Vec<i32> = lens.iter().flat_map(|&l| 0..l as i32).collect();
    // ceil(L / (B·D)) pages per request on every rank: each rank its own cache, one shared table
    let max_pages = lens.iter().map(|&l| dcp.pages_for(l, B)).max().unwrap_or(1) as usize;
    let (num_pages, table) = (t * max_pages, (0..(t * max_pages) as i32).collect::<Vec<_>>());
    let (d_ckv, d_kpe, d_q, d_table) =
        (s.clone_htod(&ckv)?, s.clone_htod(&kpe)?, s.clone_htod(&q)?, s.clone_htod(&table)?);
    let (d_req, d_pos) = (s.clone_htod(&req)?, s.clone_htod(&pos)?);

    // from the shapes and SM count alone: allocate once, reuse every step (and graph replay);
    // 0 bytes when splits = 1, and the driver refuses empty allocations
    let splits = decode_num_splits(t, 1, H, false, dev.num_sms());
    let ws = s.alloc_zeros::<u8>(decode_workspace_bytes(t, 1, H, false, splits)?.max(1))?;
    let slot = a2a_aligned_slot_bytes(t, H_L)?;

    let mut sends = Vec::new();
    for rank in 0..D {
        let cache = s.alloc_zeros::<u8>(num_pages * B * ROW_BYTES)?;
        let (cache_v, table_v) = (DeviceSlice::of(&cache, &s), DeviceSlice::of(&d_table, &s));
        let fill = KvFill {
            tokens: NewTokens::packed(
                DeviceSlice::of(&d_ckv, &s),
                DeviceSlice::of(&d_kpe, &s),
                DeviceSlice::of(&d_req, &s),
                DeviceSlice::of(&d_pos, &s),
            ),
            block_table: BlockTable::packed(table_v, max_pages),
            batch: t,
            cache: CacheView::packed(cache_v, num_pages, B),
            format: KvFormat::Bf16,
            dcp,
            rank,
        };
        kv_fill(&dev, st, &fill)?;

        let local: Vec<i32> = dcp.local_lens(&lens, rank).iter().map(|&l| l as i32).collect();
        let (d_lens, out, lse) = (s.clone_htod(&local)?, s.alloc_zeros(t * H * D_V)?, s.alloc_zeros(t * H)?);
        let (out_v, lse_v) = (DeviceSlice::of(&out, &s), DeviceSlice::of(&lse, &s));
        let common = DecodeCommon::new(
            DeviceSlice::of(&d_q, &s),
            t,
            1,
            H,
            DecodeOut::Bf16(out_v),
            lse_v,
            splits,
            DeviceSlice::of(&ws, &s),
        );
        let decode = DenseDecode {
            common,
            cache: CacheView::packed(cache_v, num_pages, B),
            block_table: BlockTable::packed(table_v, max_pages),
            lens: DeviceSlice::of(&d_lens, &s),
            lens_strides: None,
            lens_rule: LensRule::Local,
        };
        mla_decode_dense(&dev, st, &decode)?;

        // slot d of `send` carries heads [d·H_L, (d+1)·H_L), for rank d
        let send = s.alloc_zeros::<u8>(D * slot)?;
        let pack = A2aPack {
            out: CombineRows::Bf16(out_v),
            lse: lse_v,
            send: DeviceSlice::of(&send, &s),
            slot_bytes: slot,
            group: CombineGroup { num_tokens: t, local_heads: H_L, dcp_size: D },
        };
        a2a_pack(&dev, st, &pack)?;
        sends.push(send); // the rest is freed in stream order, after the kernels that use it
    }

    let (mut got_out, mut got_lse) = (vec![0f64; t * H * D_V], vec![0f64; t * H]);
    for dst in 0..D {
        // the all-to-all (NCCL across GPUs): slot dst of source src's send goes to slot src of recv
        let mut recv = s.alloc_zeros::<u8>(D * slot)?;
        for (src, send) in sends.iter().enumerate() {
            let (from, to) = (dst * slot..(dst + 1) * slot, src * slot..(src + 1) * slot);
            s.memcpy_dtod(&send.slice(from), &mut recv.slice_mut(to))?;
        }
        let (out, lse) = (s.alloc_zeros::<bf16>(t * H_L * D_V)?, s.alloc_zeros::<f32>(t * H_L)?);
        let combine = A2aCombine {
            recv: DeviceSlice::of(&recv, &s),
            slot_bytes: slot,
            lse_base: LseBase::E,
            out: CombineRows::Bf16(DeviceSlice::of(&out, &s)),
            lse: DeviceSlice::of(&lse, &s),
            group: CombineGroup { num_tokens: t, local_heads: H_L, dcp_size: D },
            sink: None,
        };
        a2a_combine(&dev, st, &combine)?;
        // rank dst's [T, H_L] rows are heads dst·H_L.. of the full [T, H]
        let (out, lse) = (s.clone_dtoh(&out)?, s.clone_dtoh(&lse)?);
        for ti in 0..t {
            let row = ti * H + dst * H_L;
            let rows = out[ti * H_L * D_V..][..H_L * D_V].iter().map(|x| x.to_f64());
            got_out[row * D_V..][..H_L * D_V].iter_mut().zip(rows).for_each(|(g, x)| *g = x);
            got_lse[row..][..H_L].iter_mut().zip(&lse[ti * H_L..][..H_L]).for_each(|(g, &x)| *g = x as f64);
        }
    }

    let oracle = reference(&lens, &ckv, &kpe, &req, &pos, &q);
    let max_err = got_out.iter().zip(&oracle.out).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
    let e = check_attention("dcp_step", got_out, got_lse, &oracle)?;
    println!("dcp_step: D = {D}, {t} requests, H = {H}, {splits} KV splits: max |out - ref| = {max_err:.2e}");
    println!("dcp_step: within docs/semantics.md's tolerance (rel L2 {:.2e}, lse {:.2e})", e.rel_l2, e.worst_lse);
    Ok(())
}

/// The fp64 attention over the unsharded cache (D = 1): what the D shards merged must equal.
fn reference(lens: &[u64], ckv: &[bf16], kpe: &[bf16], req: &[i32], pos: &[i32], q: &[bf16]) -> AttentionOracle {
    let (t, one) = (lens.len(), DcpLayout { size: 1, interleave: 1 });
    let pages = lens.iter().map(|&l| one.pages_for(l, B)).max().unwrap_or(1) as usize;
    let table: Vec<i32> = (0..(t * pages) as i32).collect();
    let cache = PagedCache {
        block_table: &table,
        block_table_stride: pages,
        batch: t,
        max_pages: pages,
        num_pages: t * pages,
        block_size: B,
        format: KvFormat::Bf16,
    };
    let mut bytes = vec![0u8; t * pages * B * ROW_BYTES];
    let input = FillInput { ckv, ckv_stride: D_LATENT, kpe, kpe_stride: D_ROPE, req_idx: req, positions: pos };
    fill(&input, &cache, one, 0, &mut bytes);
    let lens: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let shape = QueryShape { batch: t, rows: 1, heads: H };
    decode_oracle(q, shape, &cache, &bytes, &Selection::Dense { lens: &lens }, default_scale())
}
