//! KV-cache formats (docs/contract.md §3): the BF16 row and the FP8 "656" row, with the exact
//! quantisation rules the fill kernel implements in `kernels-src/common.cuh`; [`model1`] holds
//! FlashMLA's page-wise MODEL1 layout (d_qk = 512).

use half::bf16;

pub mod model1;

/// Latent (c_kv, also V) values per token.
pub const D_LATENT: usize = 512;
/// Rotary (k_pe) values per token.
pub const D_ROPE: usize = 64;
/// Query/key head dimension: 576 = 512 + 64.
pub const D_QK: usize = D_LATENT + D_ROPE;
/// Value head dimension.
pub const D_V: usize = D_LATENT;
/// Bytes of one FP8-656 token row.
pub const FP8_ROW_BYTES: usize = 656;
/// Byte offset of the four fp32 group scales in an FP8-656 row.
pub const FP8_SCALE_OFFSET: usize = 512;
/// Byte offset of the 64 bf16 k_pe values in an FP8-656 row.
pub const FP8_ROPE_OFFSET: usize = 528;
/// c_kv channels that share one FP8 scale.
pub const FP8_GROUP: usize = 128;
/// Largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The layout of a paged KV cache. Its name everywhere (the CLI, Python, the C ABI's
/// `DCP_MLA_KV_*` codes and JSON) is [`KvFormat::name`]: `bf16`, `fp8_656`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvFormat {
    /// 576 bf16 per token: `[512 c_kv | 64 k_pe]`.
    Bf16,
    /// 656 bytes per token: 512 e4m3, 4 fp32 scales, 64 bf16 k_pe (FlashMLA's V3.2 layout).
    Fp8_656,
}

impl KvFormat {
    /// The format's name in every interface: `bf16` or `fp8_656`.
    pub const fn name(self) -> &'static str {
        match self {
            KvFormat::Bf16 => "bf16",
            KvFormat::Fp8_656 => "fp8_656",
        }
    }

    /// Bytes one token occupies in the cache.
    pub const fn token_bytes(self) -> usize {
        match self {
            KvFormat::Bf16 => D_QK * 2,
            KvFormat::Fp8_656 => FP8_ROW_BYTES,
        }
    }
}

/// The base of a log-sum-exp. dcp-mla's kernels return natural logs; FlashInfer-style kernels
/// return base 2. Every merge takes its input's base explicitly (docs/contract.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum LseBase {
    /// Natural log: lse = ln Σ exp(s).
    E,
    /// Base 2: lse = log2 Σ 2^s.
    Two,
}

/// The group scale: the smallest power of two ≥ max(amax / 448, 1e-4), with amax / 448 in fp32
/// round-to-nearest. Computed from the float's bits, so it is exact everywhere.
pub fn fp8_group_scale(amax: f32) -> f32 {
    let v = (amax / E4M3_MAX).max(1e-4f32);
    let mut b = v.to_bits();
    if b & 0x007f_ffff != 0 {
        b = (b & 0x7f80_0000) + 0x0080_0000;
    }
    f32::from_bits(b)
}

/// f32 → e4m3 (bias 7, no infinities, 0x7f is NaN), round to nearest even, saturating to ±448.
/// Every NaN, whatever its sign, becomes the canonical 0x7f: what the GPU's conversion
/// (cvt.satfinite.e4m3) writes, so fill stays bit-exact on NaN input too.
pub fn e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Subnormals: value = m · 2^-9, m in 0..=7 (m = 8 rounds up into the smallest normal 0x08).
    if a < f32::from_bits(0x3c80_0000) {
        // 2^-6
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127; // -6..=8
    let mant = a / f32::from_bits(((e + 127) as u32) << 23); // [1, 2), exact
    let q = ((mant - 1.0) * 8.0).round_ties_even() as i32; // 0..=8
    let (e, q) = if q == 8 { (e + 1, 0) } else { (e, q) };
    sign | (((e + 7) as u8) << 3) | q as u8
}

/// e4m3 → f32 (exact).
pub fn e4m3_decode(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f32;
    if b & 0x7f == 0x7f {
        return f32::NAN;
    }
    if e == 0 {
        sign * m * f32::powi(2.0, -9)
    } else {
        sign * (1.0 + m / 8.0) * f32::powi(2.0, e - 7)
    }
}

/// Writes one token's BF16 cache row: `[c_kv | k_pe]`.
pub fn encode_bf16_row(ckv: &[bf16], kpe: &[bf16], row: &mut [bf16]) {
    assert!(ckv.len() >= D_LATENT && kpe.len() >= D_ROPE && row.len() == D_QK);
    row[..D_LATENT].copy_from_slice(&ckv[..D_LATENT]);
    row[D_LATENT..].copy_from_slice(&kpe[..D_ROPE]);
}

/// Quantises one token into its 656-byte FP8 row.
pub fn encode_fp8_row(ckv: &[bf16], kpe: &[bf16], row: &mut [u8]) {
    assert!(ckv.len() >= D_LATENT && kpe.len() >= D_ROPE && row.len() == FP8_ROW_BYTES);
    for g in 0..D_LATENT / FP8_GROUP {
        let group = &ckv[g * FP8_GROUP..(g + 1) * FP8_GROUP];
        let amax = group.iter().fold(0.0f32, |m, x| m.max(x.to_f32().abs()));
        let scale = fp8_group_scale(amax);
        for (i, x) in group.iter().enumerate() {
            row[g * FP8_GROUP + i] = e4m3_encode(x.to_f32() / scale);
        }
        row[FP8_SCALE_OFFSET + 4 * g..FP8_SCALE_OFFSET + 4 * g + 4].copy_from_slice(&scale.to_le_bytes());
    }
    for (i, x) in kpe[..D_ROPE].iter().enumerate() {
        row[FP8_ROPE_OFFSET + 2 * i..FP8_ROPE_OFFSET + 2 * i + 2].copy_from_slice(&x.to_bits().to_le_bytes());
    }
}

/// Dequantises a 656-byte FP8 row to the 576 values attention sees, as f32.
pub fn decode_fp8_row(row: &[u8]) -> [f32; D_QK] {
    assert_eq!(row.len(), FP8_ROW_BYTES);
    let mut out = [0.0f32; D_QK];
    for g in 0..D_LATENT / FP8_GROUP {
        let s = FP8_SCALE_OFFSET + 4 * g;
        let scale = f32::from_le_bytes(row[s..s + 4].try_into().unwrap());
        for i in 0..FP8_GROUP {
            out[g * FP8_GROUP + i] = e4m3_decode(row[g * FP8_GROUP + i]) * scale;
        }
    }
    for i in 0..D_ROPE {
        let o = FP8_ROPE_OFFSET + 2 * i;
        out[D_LATENT + i] = bf16::from_bits(u16::from_le_bytes([row[o], row[o + 1]])).to_f32();
    }
    out
}

/// Dequantises a 656-byte FP8 row to bf16 (docs/contract.md §7's flatten). Every dequantised value
/// float(e4m3)·2^k has at most 4 significant bits, so the bf16 conversion is exact unless the
/// product leaves bf16's range (it cannot: |value| ≤ 448·scale and scale ≤ 2^127 for finite input).
pub fn decode_fp8_row_bf16(row: &[u8]) -> [bf16; D_QK] {
    decode_fp8_row(row).map(bf16::from_f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_roundtrip_every_code() {
        for b in 0u8..=255 {
            if b & 0x7f == 0x7f {
                assert!(e4m3_decode(b).is_nan());
                continue;
            }
            let x = e4m3_decode(b);
            let back = e4m3_encode(x);
            // ±0 both encode to their own sign
            assert_eq!(back, b, "code {b:#x} value {x}");
        }
    }

    #[test]
    fn e4m3_rounding_and_saturation() {
        assert_eq!(e4m3_encode(1000.0), 0x7e);
        assert_eq!(e4m3_encode(-1e30), 0xfe);
        assert_eq!(e4m3_encode(f32::INFINITY), 0x7e);
        assert_eq!(e4m3_encode(f32::NAN), 0x7f);
        assert_eq!(e4m3_encode(-f32::NAN), 0x7f, "a NaN's sign is not kept");
        assert_eq!(e4m3_decode(0x7e), 448.0);
        // 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): ties to even -> 1.0
        assert_eq!(e4m3_encode(1.0625), 0x38);
        // 1.1875 halfway between 1.125 (0x39) and 1.25 (0x3a): ties to even -> 1.25
        assert_eq!(e4m3_encode(1.1875), 0x3a);
        // smallest subnormal 2^-9; half of it ties to 0
        assert_eq!(e4m3_encode(f32::powi(2.0, -9)), 0x01);
        assert_eq!(e4m3_encode(f32::powi(2.0, -10)), 0x00);
        assert_eq!(e4m3_encode(1.5 * f32::powi(2.0, -10)), 0x01);
        // 15/16 · 2^-6 rounds up into the smallest normal
        assert_eq!(e4m3_encode(15.5 * f32::powi(2.0, -10)), 0x08);
    }

    #[test]
    fn group_scale_is_power_of_two_bound() {
        assert_eq!(fp8_group_scale(0.0), f32::powi(2.0, -13)); // 1e-4 -> 2^-13 = 1.22e-4
        assert_eq!(fp8_group_scale(448.0), 1.0);
        assert_eq!(fp8_group_scale(449.0), 2.0);
        assert_eq!(fp8_group_scale(896.0), 2.0);
        assert_eq!(fp8_group_scale(1.0), f32::powi(2.0, -8)); // 1/448 = 0.00223 -> 2^-8 = 0.0039
    }

    #[test]
    fn fp8_row_layout_and_all_zero_group() {
        let ckv: Vec<bf16> =
            (0..D_LATENT).map(|i| bf16::from_f32(if i < 128 { 0.0 } else { i as f32 / 7.0 })).collect();
        let kpe: Vec<bf16> = (0..D_ROPE).map(|i| bf16::from_f32(-(i as f32))).collect();
        let mut row = [0u8; FP8_ROW_BYTES];
        encode_fp8_row(&ckv, &kpe, &mut row);
        assert!(row[..128].iter().all(|&b| b == 0));
        assert_eq!(f32::from_le_bytes(row[512..516].try_into().unwrap()), f32::powi(2.0, -13));
        let dec = decode_fp8_row(&row);
        for i in 0..D_ROPE {
            assert_eq!(dec[D_LATENT + i], kpe[i].to_f32());
        }
        for i in 128..D_LATENT {
            let x = ckv[i].to_f32();
            let scale = fp8_group_scale(
                ckv[(i / 128) * 128..(i / 128 + 1) * 128].iter().fold(0f32, |m, v| m.max(v.to_f32().abs())),
            );
            // e4m3 has 3 mantissa bits: relative error ≤ 2^-4 for normals, absolute ≤ 2^-10·scale below
            assert!((dec[i] - x).abs() <= (x.abs() / 16.0).max(scale * f32::powi(2.0, -10)), "{i}: {x} vs {}", dec[i]);
        }
    }
}
