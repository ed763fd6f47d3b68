//! Prefill over a cached prefix (docs/contract.md §7): [`flatten`] one rank's rows of a chunk into its
//! uniform bf16 buffer (dequantising FP8-656), and [`reorder`] the all-gathered buffer into
//! global order. Reference: [`crate::reference::prefill`]; kernels: `kernels-src/prefill.cuh`.
//!
//! Both kernels read the chunk's layout from a device-side piece table (see [`piece_table`]),
//! so a captured CUDA graph replays correctly when the plan of the next chunk differs: the
//! caller uploads the new table into the same buffer.

use super::{check_layout, check_len, compiled, launch_warp_rows, to_i32, BlockTable, CacheView};
use crate::abi::{DcpPrefillFlattenParams, DcpPrefillReorderParams};
use crate::error::Result;
use crate::formats::{KvFormat, D_QK};
use crate::planner::{Chunk, DcpLayout};
use crate::runtime::registry;
use crate::runtime::{Device, DeviceSlice, Stream};
use half::bf16;

/// int32 fields per piece-table entry: request, local_start, row_offset, rows, global_len,
/// out_offset, then two zeros.
pub const PIECE_FIELDS: usize = 8;

/// Encodes a planned chunk's pieces as the kernels' int32 [max_pieces, 8] table, padding with
/// empty entries (all zero: they cover no row) so that one buffer serves every chunk.
pub fn piece_table(chunk: &Chunk, max_pieces: usize) -> Result<Vec<i32>> {
    ensure_arg!(
        chunk.pieces.len() <= max_pieces,
        "max_pieces",
        "the chunk has {} pieces but the table holds {max_pieces}",
        chunk.pieces.len()
    );
    let mut t = vec![0i32; max_pieces * PIECE_FIELDS];
    for (e, p) in t.chunks_mut(PIECE_FIELDS).zip(&chunk.pieces) {
        e[0] = to_i32("piece.request", p.request)?;
        e[1] = to_i32("piece.local_start", p.local_start)?;
        e[2] = to_i32("piece.row_offset", p.row_offset)?;
        e[3] = to_i32("piece.rows", p.rows)?;
        e[4] = to_i32("piece.global_len", p.global_len)?;
        e[5] = to_i32("piece.out_offset", p.out_offset)?;
    }
    Ok(t)
}

/// Arguments of [`flatten`].
#[derive(Debug, Clone, Copy)]
pub struct Flatten {
    /// This rank's cache, its rows `format.token_bytes()` bytes.
    pub cache: CacheView,
    pub format: KvFormat,
    /// `batch` rows; a page column at or beyond its `max_pages` gives zeros.
    pub block_table: BlockTable,
    pub batch: usize,
    /// int32 [max_pieces, PIECE_FIELDS] from [`piece_table`].
    pub pieces: DeviceSlice<i32>,
    pub max_pieces: usize,
    /// bf16 [cap_rows, 576]: every row is written.
    pub out: DeviceSlice<bf16>,
    pub cap_rows: usize,
    pub dcp: DcpLayout,
    pub rank: usize,
}

/// Writes this rank's rows of the chunk: row `row_offset + j` of a piece is its local token
/// `local_start + j` for j < n_rank(global_len), as 576 bf16 (FP8 dequantised exactly as
/// [`crate::formats::decode_fp8_row_bf16`]); every other row, and a row whose request, page
/// column or page is out of range, is zero. Bit-identical to
/// [`crate::reference::prefill::flatten_chunk`].
pub fn flatten(dev: &Device, stream: Stream, a: &Flatten) -> Result<()> {
    let params = flatten_params(a)?;
    let id = compiled(registry::prefill_flatten(a.format.into()), || format!("prefill_flatten for {:?}", a.format))?;
    // SAFETY: flatten_params checked every buffer the kernel addresses.
    unsafe { launch_warp_rows(dev, stream, id, a.cap_rows, "rows", &params) }
}

fn flatten_params(a: &Flatten) -> Result<DcpPrefillFlattenParams> {
    let [dcp_size, dcp_rank, interleave] = check_layout(a.dcp, a.rank)?;
    let page_rows = a.cache.check(a.format)?;
    a.block_table.check(a.batch)?;
    check_pieces(&a.pieces, a.max_pieces)?;
    check_rows_out("out", &a.out, a.cap_rows)?;
    Ok(DcpPrefillFlattenParams {
        cache: a.cache.bytes.ptr(),
        block_table: a.block_table.table.ptr(),
        pieces: a.pieces.ptr(),
        out: a.out.ptr(),
        block_table_stride: a.block_table.stride as i64,
        batch: to_i32("batch", a.batch)?,
        max_pages: to_i32("max_pages", a.block_table.max_pages)?,
        num_pages: to_i32("num_pages", a.cache.num_pages)?,
        block_size: to_i32("block_size", a.cache.block_size)?,
        cap_rows: to_i32("cap_rows", a.cap_rows)?,
        max_pieces: to_i32("max_pieces", a.max_pieces)?,
        dcp_size,
        dcp_rank,
        interleave,
        page_rows,
    })
}

/// Arguments of [`reorder`].
#[derive(Debug, Clone, Copy)]
pub struct Reorder {
    /// bf16 \[D, cap_rows, 576\]: rank r's flatten buffer at \[r\].
    pub gathered: DeviceSlice<bf16>,
    pub cap_rows: usize,
    /// int32 [max_pieces, PIECE_FIELDS] from [`piece_table`].
    pub pieces: DeviceSlice<i32>,
    pub max_pieces: usize,
    /// bf16 [out_rows, 576]: rows [out_offset, out_offset + global_len) of each piece are written,
    /// other rows are left as they are.
    pub out: DeviceSlice<bf16>,
    pub out_rows: usize,
    pub dcp: DcpLayout,
}

/// Writes every token of every piece to its global row: token g of a piece comes from rank
/// owner(g), row row_offset + local(g) of the gathered buffer (zeros if that row is beyond
/// cap_rows). Bit-identical to [`crate::reference::prefill::reorder_chunk`].
pub fn reorder(dev: &Device, stream: Stream, a: &Reorder) -> Result<()> {
    let params = reorder_params(a)?;
    let id = compiled(registry::prefill_reorder(), || "prefill_reorder".into())?;
    // SAFETY: reorder_params checked every buffer the kernel addresses.
    unsafe { launch_warp_rows(dev, stream, id, a.out_rows, "rows", &params) }
}

fn reorder_params(a: &Reorder) -> Result<DcpPrefillReorderParams> {
    let [dcp_size, _, interleave] = check_layout(a.dcp, 0)?;
    let rows = super::product("cap_rows", &[a.dcp.size, a.cap_rows])?;
    check_rows_out("gathered", &a.gathered, rows)?;
    check_pieces(&a.pieces, a.max_pieces)?;
    check_rows_out("out", &a.out, a.out_rows)?;
    Ok(DcpPrefillReorderParams {
        gathered: a.gathered.ptr(),
        pieces: a.pieces.ptr(),
        out: a.out.ptr(),
        cap_rows: to_i32("cap_rows", a.cap_rows)?,
        out_rows: to_i32("out_rows", a.out_rows)?,
        max_pieces: to_i32("max_pieces", a.max_pieces)?,
        dcp_size,
        interleave,
        reserved: 0,
    })
}

/// A piece table of `max_pieces` entries ([`piece_table`]): [max_pieces, PIECE_FIELDS] int32.
fn check_pieces(pieces: &DeviceSlice<i32>, max_pieces: usize) -> Result<()> {
    check_len("pieces", pieces, super::product("max_pieces", &[max_pieces, PIECE_FIELDS])?)
}

/// `rows` dense rows of 576 bf16, 16-byte aligned (the kernels move 16-byte vectors).
fn check_rows_out(arg: &'static str, buf: &DeviceSlice<bf16>, rows: usize) -> Result<()> {
    super::check_rows(arg, buf, rows, D_QK, D_QK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::plan_prefill_chunks;

    use crate::ops::test_util::{arg_of, fake};

    #[test]
    fn piece_table_encodes_the_plan() {
        let dcp = DcpLayout { size: 2, interleave: 1 };
        let plan = plan_prefill_chunks(&[100, 0, 300], dcp, 4, 1 << 30).unwrap();
        let c = &plan.chunks[0];
        let t = piece_table(c, c.pieces.len() + 2).unwrap();
        assert_eq!(t.len(), (c.pieces.len() + 2) * PIECE_FIELDS);
        for (e, p) in t.chunks(PIECE_FIELDS).zip(&c.pieces) {
            let want = [p.request, p.local_start, p.row_offset, p.rows, p.global_len, p.out_offset, 0, 0];
            assert_eq!(e, want.map(|x| x as i32));
        }
        assert!(t[c.pieces.len() * PIECE_FIELDS..].iter().all(|&x| x == 0));
        assert_eq!(arg_of(piece_table(c, c.pieces.len() - 1).unwrap_err()), "max_pieces");
    }

    #[test]
    fn flatten_and_reorder_validate() {
        let f = Flatten {
            cache: CacheView::packed(fake(10 * 64 * 656), 10, 64),
            format: KvFormat::Fp8_656,
            block_table: BlockTable::packed(fake(2 * 5), 5),
            batch: 2,
            pieces: fake(4 * PIECE_FIELDS),
            max_pieces: 4,
            out: fake(128 * D_QK),
            cap_rows: 128,
            dcp: DcpLayout { size: 4, interleave: 1 },
            rank: 3,
        };
        assert!(flatten_params(&f).is_ok());
        assert_eq!(arg_of(flatten_params(&Flatten { format: KvFormat::Bf16, ..f }).unwrap_err()), "cache");
        assert_eq!(arg_of(flatten_params(&Flatten { batch: 3, ..f }).unwrap_err()), "block_table");
        assert_eq!(
            arg_of(
                flatten_params(&Flatten { block_table: BlockTable { max_pages: 6, ..f.block_table }, ..f })
                    .unwrap_err()
            ),
            "max_pages"
        );
        assert_eq!(arg_of(flatten_params(&Flatten { max_pieces: 5, ..f }).unwrap_err()), "pieces");
        assert_eq!(arg_of(flatten_params(&Flatten { cap_rows: 129, ..f }).unwrap_err()), "out");
        assert_eq!(arg_of(flatten_params(&Flatten { rank: 4, ..f }).unwrap_err()), "rank");
        assert_eq!(
            arg_of(flatten_params(&Flatten { cache: CacheView { block_size: 0, ..f.cache }, ..f }).unwrap_err()),
            "block_size"
        );

        let r = Reorder {
            gathered: fake(4 * 128 * D_QK),
            cap_rows: 128,
            pieces: fake(4 * PIECE_FIELDS),
            max_pieces: 4,
            out: fake(512 * D_QK),
            out_rows: 512,
            dcp: DcpLayout { size: 4, interleave: 1 },
        };
        assert!(reorder_params(&r).is_ok());
        assert_eq!(arg_of(reorder_params(&Reorder { cap_rows: 129, ..r }).unwrap_err()), "gathered");
        assert_eq!(arg_of(reorder_params(&Reorder { out_rows: 513, ..r }).unwrap_err()), "out");
    }
}
