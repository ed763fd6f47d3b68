//! The MODEL1 FP8 cache (docs/contract.md §3, "MODEL1"): FlashMLA's page-wise layout for its
//! `d_qk = 512` sparse path, with the exact quantisation the fill implements.
//!
//! A token is 512 values: 448 "nope" values, quantised to e4m3 in 7 tiles of 64 with one
//! power-of-two scale a tile, then 64 rope values kept in bf16. A page of B tokens is laid out
//! page-wise, not token-wise:
//!
//! ```text
//! [0, 576·B)            token s at 576·s: 448 e4m3 bytes, then 64 bf16 rope values (128 bytes)
//! [576·B, 584·B)        token s at 576·B + 8·s: 7 ue8m0 scale bytes (tile 0..6), then 1 pad byte
//! [584·B, page_bytes)   padding up to the next multiple of 576 bytes
//! ```
//!
//! A scale byte is the power-of-two scale's fp32 exponent field: byte b stands for 2^(b − 127),
//! and 0xff (the exponent field of +inf) is ue8m0's NaN.

use super::{e4m3_decode, e4m3_encode, fp8_group_scale, D_ROPE};
use half::bf16;

/// Values in a MODEL1 query or cache row: 448 nope + 64 rope.
pub const MODEL1_D_QK: usize = MODEL1_D_NOPE + D_ROPE;
/// Value head dimension: the whole 512-value row.
pub const MODEL1_D_V: usize = MODEL1_D_QK;
/// Quantised ("nope") values per token.
pub const MODEL1_D_NOPE: usize = 448;
/// Nope values that share one scale.
pub const MODEL1_TILE: usize = 64;
/// Scales per token: 448 / 64.
pub const MODEL1_TILES: usize = MODEL1_D_NOPE / MODEL1_TILE;
/// Bytes of a token's value row: 448 e4m3 + 64 bf16.
pub const MODEL1_ROW_BYTES: usize = MODEL1_D_NOPE + 2 * D_ROPE;
/// Bytes of a token's scale slot: 7 ue8m0 + 1 pad.
pub const MODEL1_SCALE_BYTES: usize = MODEL1_TILES + 1;
/// Bytes a token occupies in a page, before the page's padding: 584.
pub const MODEL1_TOKEN_BYTES: usize = MODEL1_ROW_BYTES + MODEL1_SCALE_BYTES;
/// A page's size is a multiple of this many bytes.
pub const MODEL1_PAGE_ALIGN: usize = 576;

/// Bytes of one MODEL1 page of `block_size` tokens: 584·B rounded up to a multiple of 576.
pub const fn model1_page_bytes(block_size: usize) -> usize {
    (block_size * MODEL1_TOKEN_BYTES).div_ceil(MODEL1_PAGE_ALIGN) * MODEL1_PAGE_ALIGN
}

/// The geometry of a MODEL1 cache tensor: `num_pages` pages of `block_size` tokens, page p at
/// byte p·page_stride. A cache FlashMLA allocates has page_stride = [`model1_page_bytes`]; a view
/// into a larger buffer may have a larger one (whole 576-byte units, so every page stays aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model1Pages {
    pub num_pages: usize,
    pub block_size: usize,
    pub page_stride: usize,
}

impl Model1Pages {
    /// Densely packed pages: page_stride = [`model1_page_bytes`]`(block_size)`.
    pub const fn new(num_pages: usize, block_size: usize) -> Self {
        Model1Pages { num_pages, block_size, page_stride: model1_page_bytes(block_size) }
    }

    /// Addressable token slots, num_pages·B; a slot index is page·B + slot-in-page.
    pub const fn slots(&self) -> usize {
        self.num_pages * self.block_size
    }

    /// Bytes the tensor must hold: every page's stride but the last page's padding.
    pub const fn cache_bytes(&self) -> usize {
        if self.num_pages == 0 {
            0
        } else {
            (self.num_pages - 1) * self.page_stride + model1_page_bytes(self.block_size)
        }
    }

    /// Byte offset of token `slot`'s value row (448 e4m3, then 64 bf16).
    pub const fn row_offset(&self, slot: usize) -> usize {
        let (page, s) = (slot / self.block_size, slot % self.block_size);
        page * self.page_stride + s * MODEL1_ROW_BYTES
    }

    /// Byte offset of token `slot`'s 8-byte scale slot.
    pub const fn scale_offset(&self, slot: usize) -> usize {
        let (page, s) = (slot / self.block_size, slot % self.block_size);
        page * self.page_stride + self.block_size * MODEL1_ROW_BYTES + s * MODEL1_SCALE_BYTES
    }
}

/// A power-of-two scale (or +inf) as its ue8m0 byte: the fp32 exponent field. The quantiser's
/// scales from bf16 input are 2^-13..=2^120 (bytes 114..=247) and +inf (0xff, ue8m0's NaN) for a
/// tile holding an infinity.
pub fn ue8m0_encode(scale: f32) -> u8 {
    debug_assert!(scale.to_bits() & 0x807f_ffff == 0, "a ue8m0 scale is a positive power of two or +inf: {scale}");
    (scale.to_bits() >> 23) as u8
}

/// ue8m0 → f32, exact: 2^(b − 127) (byte 0 is 2^-127, an fp32 subnormal); 0xff is NaN.
pub fn ue8m0_decode(b: u8) -> f32 {
    match b {
        0xff => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits((b as u32) << 23),
    }
}

/// Quantises one token (`row` \[512\] bf16: 448 nope, then 64 rope) into slot `slot` of a MODEL1
/// cache: its value row and its 8-byte scale slot (the pad byte written 0). Nothing else of the
/// cache changes, the page's padding included.
///
/// Tile t's scale is [`fp8_group_scale`] of the tile's largest |x| (NaN ignored), the same rule
/// as FP8-656 over 64 values instead of 128; value = e4m3(x / scale), nearest even, saturating.
pub fn encode_model1_token(row: &[bf16], pages: &Model1Pages, slot: usize, cache: &mut [u8]) {
    assert_eq!(row.len(), MODEL1_D_QK, "a MODEL1 row is 512 values");
    assert!(slot < pages.slots(), "slot {slot} beyond the cache's {} slots", pages.slots());
    let (ro, so) = (pages.row_offset(slot), pages.scale_offset(slot));
    let mut scales = [0u8; MODEL1_SCALE_BYTES];
    for (t, tile) in row[..MODEL1_D_NOPE].chunks_exact(MODEL1_TILE).enumerate() {
        // f32::max drops a NaN operand (fmaxf on the GPU)
        let amax = tile.iter().fold(0.0f32, |m, x| m.max(x.to_f32().abs()));
        let scale = fp8_group_scale(amax);
        scales[t] = ue8m0_encode(scale);
        for (i, x) in tile.iter().enumerate() {
            cache[ro + t * MODEL1_TILE + i] = e4m3_encode(x.to_f32() / scale);
        }
    }
    for (i, x) in row[MODEL1_D_NOPE..].iter().enumerate() {
        let o = ro + MODEL1_D_NOPE + 2 * i;
        cache[o..o + 2].copy_from_slice(&x.to_bits().to_le_bytes());
    }
    cache[so..so + MODEL1_SCALE_BYTES].copy_from_slice(&scales);
}

/// Dequantises token `slot` of a MODEL1 cache to the 512 values attention sees, exactly in fp32:
/// float(e4m3)·2^(b − 127) for the nope values (NaN where the code or the tile's scale byte is
/// NaN), the rope values widened from bf16. A product beyond fp32's range reads ±inf: a scale
/// byte above 247 (no fill writes one), or an input |x| ≥ 1.9375·2^127 (the top of bf16's range,
/// which rounds to code 256 under the scale 2^120).
pub fn decode_model1_token(cache: &[u8], pages: &Model1Pages, slot: usize) -> [f32; MODEL1_D_QK] {
    let (ro, so) = (pages.row_offset(slot), pages.scale_offset(slot));
    let mut out = [0.0f32; MODEL1_D_QK];
    for t in 0..MODEL1_TILES {
        let scale = ue8m0_decode(cache[so + t]);
        for i in 0..MODEL1_TILE {
            out[t * MODEL1_TILE + i] = e4m3_decode(cache[ro + t * MODEL1_TILE + i]) * scale;
        }
    }
    for i in 0..D_ROPE {
        let o = ro + MODEL1_D_NOPE + 2 * i;
        out[MODEL1_D_NOPE + i] = bf16::from_bits(u16::from_le_bytes([cache[o], cache[o + 1]])).to_f32();
    }
    out
}

/// [`decode_model1_token`] in bf16 (FlashMLA's `dequantize_k_cache`). The rope values are their
/// stored bits, unchanged (NaN payloads included). A nope value float(e4m3)·2^k has at most 4
/// significant bits, so it is exact in bf16 for every scale byte the quantiser writes (≥ 114, so
/// |value| ≥ 2^-22 or 0); with a scale byte below 2^-124 no fill writes, a value in bf16's
/// subnormal range rounds to nearest even.
pub fn decode_model1_token_bf16(cache: &[u8], pages: &Model1Pages, slot: usize) -> [bf16; MODEL1_D_QK] {
    let f = decode_model1_token(cache, pages, slot);
    let ro = pages.row_offset(slot);
    let mut out = [bf16::ZERO; MODEL1_D_QK];
    for (o, &x) in out[..MODEL1_D_NOPE].iter_mut().zip(&f[..MODEL1_D_NOPE]) {
        *o = bf16::from_f32(x);
    }
    for (i, o) in out[MODEL1_D_NOPE..].iter_mut().enumerate() {
        let b = ro + MODEL1_D_NOPE + 2 * i;
        *o = bf16::from_bits(u16::from_le_bytes([cache[b], cache[b + 1]]));
    }
    out
}

/// Quantises a whole cache: `rows` [num_pages·B, 512] bf16, row page·B + s into slot s of page
/// `page` (FlashMLA's `quantize_k_cache` of a [num_pages, B, 1, 512] tensor). Pad bytes are 0.
pub fn quantize_model1_cache(rows: &[bf16], pages: &Model1Pages) -> Vec<u8> {
    assert_eq!(rows.len(), pages.slots() * MODEL1_D_QK, "rows is [num_pages·B, 512]");
    let mut cache = vec![0u8; pages.cache_bytes()];
    for (slot, row) in rows.chunks_exact(MODEL1_D_QK).enumerate() {
        encode_model1_token(row, pages, slot, &mut cache);
    }
    cache
}

/// Dequantises a whole cache to [num_pages·B, 512] bf16 ([`decode_model1_token_bf16`] per slot).
pub fn dequantize_model1_cache(cache: &[u8], pages: &Model1Pages) -> Vec<bf16> {
    assert!(cache.len() >= pages.cache_bytes(), "cache bytes");
    (0..pages.slots()).flat_map(|s| decode_model1_token_bf16(cache, pages, s)).collect()
}

/// Whether a quantised tile (scale byte and 64 codes) is what the quantiser writes for its own
/// dequantised values, so that quantise(dequantise(tile)) gives the same bytes: no NaN scale, no
/// non-canonical NaN code (only 0x7f), and either the floor scale 2^-13 or a largest |code| above
/// 224 (a tile whose largest |value| rounded down to 224·scale re-quantises with scale / 2: the
/// same values, other bytes).
pub fn model1_tile_is_canonical(scale_byte: u8, codes: &[u8]) -> bool {
    let floor = ue8m0_encode(fp8_group_scale(0.0));
    if scale_byte == 0xff || scale_byte < floor || codes.contains(&0xff) {
        return false;
    }
    let amax = codes.iter().filter(|&&c| c & 0x7f != 0x7f).fold(0.0f32, |m, &c| m.max(e4m3_decode(c).abs()));
    scale_byte == floor || amax > 224.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_geometry() {
        // B = 64: 64·584 = 37,376 → 65 units of 576 = 37,440; B = 1: 584 → 1,152
        assert_eq!(model1_page_bytes(64), 37_440);
        assert_eq!(model1_page_bytes(1), 1_152);
        assert_eq!(model1_page_bytes(72), 72 * 584); // 42,048 = 73·576 exactly
        let p = Model1Pages::new(3, 2);
        assert_eq!(p.page_stride, 1_728);
        assert_eq!(p.row_offset(3), 1_728 + 576);
        assert_eq!(p.scale_offset(3), 1_728 + 2 * 576 + 8);
        assert_eq!(p.cache_bytes(), 3 * 1_728);
        assert_eq!(Model1Pages::new(0, 64).cache_bytes(), 0);
    }

    #[test]
    fn ue8m0_bytes() {
        assert_eq!(ue8m0_encode(1.0), 127);
        assert_eq!(ue8m0_encode(f32::powi(2.0, -13)), 114);
        assert_eq!(ue8m0_encode(f32::powi(2.0, 127)), 254);
        assert_eq!(ue8m0_encode(f32::INFINITY), 255);
        for b in 0..=254u8 {
            let s = ue8m0_decode(b);
            assert_eq!(s, f32::powi(2.0, b as i32 - 127), "byte {b}");
            if b > 0 {
                assert_eq!(ue8m0_encode(s), b);
            }
        }
        assert!(ue8m0_decode(255).is_nan());
    }

    #[test]
    fn token_layout_zero_tile_and_infinite_tile() {
        let p = Model1Pages::new(2, 3);
        let mut cache = vec![0xaau8; p.cache_bytes()];
        let mut row: Vec<bf16> = (0..MODEL1_D_QK).map(|i| bf16::from_f32(i as f32 / 3.0 - 50.0)).collect();
        row[..64].fill(bf16::ZERO); // tile 0 all zero: floor scale, zero codes
        row[64 * 3 + 5] = bf16::INFINITY; // tile 3 holds +inf: its scale is +inf (0xff)
        row[64 * 4 + 1] = bf16::NAN; // a NaN is ignored by the tile's amax and stored as 0x7f
        encode_model1_token(&row, &p, 4, &mut cache);
        let (ro, so) = (p.row_offset(4), p.scale_offset(4));
        assert_eq!((ro, so), (p.page_stride + 576, p.page_stride + 3 * 576 + 8));
        assert!(cache[ro..ro + 64].iter().all(|&b| b == 0));
        assert_eq!(cache[so], 114);
        assert_eq!(cache[so + 3], 0xff);
        assert_eq!(cache[ro + 64 * 4 + 1], 0x7f);
        assert_eq!(cache[so + 7], 0, "pad byte");
        // every other byte untouched
        let touched = |i: usize| (ro..ro + 576).contains(&i) || (so..so + 8).contains(&i);
        assert!(cache.iter().enumerate().all(|(i, &b)| touched(i) || b == 0xaa));
        let dec = decode_model1_token(&cache, &p, 4);
        assert!(dec[64 * 3..64 * 4].iter().all(|x| x.is_nan()), "a tile with an inf reads as NaN");
        assert!(dec[64 * 4 + 1].is_nan());
        for i in MODEL1_D_NOPE..MODEL1_D_QK {
            assert_eq!(dec[i], row[i].to_f32());
        }
        for t in [1usize, 2, 4, 5, 6] {
            let tile = &row[t * 64..(t + 1) * 64];
            let scale = fp8_group_scale(tile.iter().fold(0f32, |m, v| m.max(v.to_f32().abs())));
            for i in 0..64 {
                let (x, d) = (tile[i].to_f32(), dec[t * 64 + i]);
                if x.is_nan() {
                    continue;
                }
                assert!((d - x).abs() <= (x.abs() / 16.0).max(scale * f32::powi(2.0, -10)), "{t}/{i}: {x} vs {d}");
            }
        }
    }
}
