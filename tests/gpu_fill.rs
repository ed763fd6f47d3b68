//! KV-cache fill on the GPU against the CPU reference, bit for bit (docs/contract.md §2-3, §9).

mod common;

use common::*;
use dcp_mla::formats::{KvFormat, D_LATENT, D_ROPE};
use dcp_mla::ops::fill::{kv_fill, KvFill, NewTokens, EARLY_FILL_MAX_TOKENS};
use dcp_mla::ops::{BlockTable, CacheView};
use dcp_mla::reference::fill::{fill, FillInput, PagedCache};
use dcp_mla::DcpLayout;
use half::bf16;

struct Case {
    format: KvFormat,
    dcp: DcpLayout,
    block_size: usize,
    lens: Vec<usize>,
}

/// Fills every rank's cache with the new tokens of `lens` (all positions of each request, in a
/// shuffled order, with padding and bad entries mixed in) and compares every byte.
fn run(case: &Case, rng: &mut Rng) {
    let s = stream();
    let dev = gpu();
    let (d, b) = (case.dcp.size, case.block_size);
    let batch = case.lens.len();
    let max_pages = case.lens.iter().map(|&l| (l as u64).div_ceil((b * d) as u64) as usize).max().unwrap_or(0) + 1;
    let stride = max_pages + 3;
    let num_pages = batch * max_pages + 5;
    // A permuted block table; the last column points past the cache or is -1 to test skipping.
    let mut pages: Vec<i32> = (0..num_pages as i32).collect();
    rng.shuffle(&mut pages);
    let mut table = vec![-7i32; batch * stride];
    for r in 0..batch {
        for c in 0..max_pages {
            table[r * stride + c] = pages[r * max_pages + c];
        }
    }
    if batch > 0 {
        table[max_pages - 1] = num_pages as i32 + 10; // out of range page: must be skipped
    }
    let mut req = Vec::new();
    let mut pos = Vec::new();
    for (r, &l) in case.lens.iter().enumerate() {
        for t in 0..l {
            req.push(r as i32);
            pos.push(t as i32);
        }
    }
    // padding and invalid requests: never written
    req.extend([0, -1, batch as i32]);
    pos.extend([-1, 3, 0]);
    let mut order: Vec<usize> = (0..req.len()).collect();
    rng.shuffle(&mut order);
    let req: Vec<i32> = order.iter().map(|&i| req[i]).collect();
    let pos: Vec<i32> = order.iter().map(|&i| pos[i]).collect();
    let t = req.len();
    let ckv_stride = D_LATENT + 8;
    let kpe_stride = D_ROPE + 16;
    let ckv: Vec<bf16> = (0..t * ckv_stride).map(|_| bf16::from_f32(rng.unit() * 4.0)).collect();
    let mut kpe: Vec<bf16> = (0..t * kpe_stride).map(|_| bf16::from_f32(rng.unit())).collect();
    let mut ckv = ckv;
    // An all-zero c_kv group and a group with a huge value, to hit the scale's clamp and saturation.
    if t > 1 {
        ckv[..128].fill(bf16::ZERO);
        ckv[ckv_stride + 130] = bf16::from_f32(3.0e4);
        kpe[0] = bf16::from_f32(-0.0);
    }
    // Non-finite input (docs/semantics.md's rule, bit-exact): NaN of either sign in a group with
    // finite values (the scale ignores it, the value becomes 0x7f), ±inf (the group's scale is
    // +inf), an all-NaN group, NaN in k_pe (copied bit for bit).
    if t > 4 {
        let neg_nan = bf16::from_bits(0xffc1);
        ckv[2 * ckv_stride + 200] = neg_nan;
        ckv[2 * ckv_stride + 300] = bf16::NAN;
        ckv[3 * ckv_stride + 5] = bf16::INFINITY;
        ckv[3 * ckv_stride + 400] = bf16::NEG_INFINITY;
        ckv[4 * ckv_stride + 128..4 * ckv_stride + 256].fill(neg_nan);
        kpe[4 * kpe_stride + 7] = neg_nan;
    }
    let row = case.format.token_bytes();
    let cache_bytes = num_pages * b * row;
    let poison: Vec<u8> = (0..cache_bytes).map(|i| (i as u8).wrapping_mul(37) ^ 0xa5).collect();

    let d_ckv = upload(&s, &ckv);
    let d_kpe = upload(&s, &kpe);
    let d_req = upload(&s, &req);
    let d_pos = upload(&s, &pos);
    let d_table = upload(&s, &table);
    for rank in 0..d {
        let d_cache = upload(&s, &poison);
        let args = KvFill {
            tokens: NewTokens {
                ckv: view(&s, &d_ckv),
                ckv_stride,
                kpe: view(&s, &d_kpe),
                kpe_stride,
                req_idx: view(&s, &d_req),
                positions: view(&s, &d_pos),
            },
            block_table: BlockTable { table: view(&s, &d_table), stride, max_pages },
            batch,
            cache: CacheView::packed(view(&s, &d_cache), num_pages, b),
            format: case.format,
            dcp: case.dcp,
            rank,
        };
        kv_fill(dev, raw(&s), &args).expect("kv_fill");
        let got = download(&s, &d_cache);
        let mut want = poison.clone();
        let input = FillInput { ckv: &ckv, ckv_stride, kpe: &kpe, kpe_stride, req_idx: &req, positions: &pos };
        let cache = PagedCache {
            block_table: &table,
            block_table_stride: stride,
            batch,
            max_pages,
            num_pages,
            block_size: b,
            format: case.format,
        };
        fill(&input, &cache, case.dcp, rank, &mut want);
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!(
                "{:?} D={} I={} B={} rank {rank}: first differing byte {i} (token slot {}, byte {} of the row): got {:#x}, want {:#x}",
                case.format, d, case.dcp.interleave, b, i / row, i % row, got[i], want[i]
            );
        }
        assert_ne!(got, poison, "nothing was written on rank {rank}");

        // The same pages as a view of a larger page dimension (2 spare rows a page): each page's
        // first B rows as the packed fill wrote them, the spare rows untouched.
        // Each view page starts as the packed buffer's page did (the rows the fill never writes
        // keep that poison, as `want`'s do), its spare rows another poison.
        let page_stride = b + 2;
        let mut big_poison: Vec<u8> =
            (0..num_pages * page_stride * row).map(|i| (i as u8).wrapping_mul(11) ^ 0x5a).collect();
        for p in 0..num_pages {
            big_poison[p * page_stride * row..][..b * row].copy_from_slice(&poison[p * b * row..][..b * row]);
        }
        let d_big = upload(&s, &big_poison);
        kv_fill(
            dev,
            raw(&s),
            &KvFill {
                cache: CacheView { bytes: view(&s, &d_big), page_stride: Some(page_stride), ..args.cache },
                ..args
            },
        )
        .expect("kv_fill into a page view");
        let got_big = download(&s, &d_big);
        for p in 0..num_pages {
            let (view_page, packed_page) = (p * page_stride * row, p * b * row);
            assert!(
                got_big[view_page..view_page + b * row] == want[packed_page..packed_page + b * row],
                "{:?} D={d} B={b} rank {rank}: page {p} of the page view differs from the packed fill",
                case.format
            );
            let spare = view_page + b * row..view_page + page_stride * row;
            assert!(got_big[spare.clone()] == big_poison[spare], "page {p}'s spare rows were written");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fill_matches_reference_bit_for_bit() {
    let mut rng = Rng::new(seed());
    for format in [KvFormat::Bf16, KvFormat::Fp8_656] {
        for d in [1usize, 2, 4, 8] {
            for (i, b) in [(1usize, 64usize), (2, 64), (64, 64), (1, 16)] {
                let lens = vec![0, 1, b - 1, b * d + 1, 3 * b * d - 5, 700 + rng.below(300) as usize];
                run(&Case { format, dcp: DcpLayout { size: d, interleave: i }, block_size: b, lens }, &mut rng);
            }
        }
        // more tokens than EARLY_FILL_MAX_TOKENS: the other kernel (the cases above run the early one)
        let lens = vec![EARLY_FILL_MAX_TOKENS + 1 + rng.below(900) as usize, 3, 130];
        run(&Case { format, dcp: DcpLayout { size: 4, interleave: 2 }, block_size: 64, lens }, &mut rng);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fill_rejects_bad_arguments_without_launching() {
    let s = stream();
    let d_ckv = upload(&s, &vec![bf16::ZERO; 512]);
    let d_kpe = upload(&s, &[bf16::ZERO; 64]);
    let d_i = upload(&s, &[0i32]);
    let d_cache = upload(&s, &vec![0u8; 64 * 1152]);
    let good = KvFill {
        tokens: NewTokens {
            ckv: view(&s, &d_ckv),
            ckv_stride: 512,
            kpe: view(&s, &d_kpe),
            kpe_stride: 64,
            req_idx: view(&s, &d_i),
            positions: view(&s, &d_i),
        },
        block_table: BlockTable::packed(view(&s, &d_i), 1),
        batch: 1,
        cache: CacheView::packed(view(&s, &d_cache), 1, 64),
        format: KvFormat::Bf16,
        dcp: DcpLayout { size: 2, interleave: 1 },
        rank: 0,
    };
    kv_fill(gpu(), raw(&s), &good).expect("valid arguments");
    let cases: Vec<(&str, KvFill)> = vec![
        ("rank", KvFill { rank: 2, ..good }),
        ("interleave", KvFill { dcp: DcpLayout { size: 2, interleave: 3 }, ..good }),
        ("cache", KvFill { cache: CacheView { num_pages: 2, ..good.cache }, ..good }),
        ("ckv", KvFill { tokens: NewTokens { ckv_stride: 500, ..good.tokens }, ..good }),
        ("max_pages", KvFill { block_table: BlockTable { max_pages: 2, ..good.block_table }, ..good }),
        ("cache", KvFill { format: KvFormat::Fp8_656, cache: CacheView { num_pages: 200, ..good.cache }, ..good }),
    ];
    for (arg, a) in cases {
        match kv_fill(gpu(), raw(&s), &a) {
            Err(e) if e.argument().is_some() => assert_eq!(e.argument(), Some(arg), "{e}"),
            other => panic!("expected an error naming `{arg}`, got {other:?}"),
        }
    }
}
