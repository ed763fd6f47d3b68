//! The argument structs of the C ABI in its three homes agree field by field: the header
//! (generated from ffi/src by cbindgen), the Rust structs (`offset_of!`, `size_of`) and the
//! Python client's ctypes structures (python/dcp_mla/_lib.py's `ARGS` and `Tensor`, loaded by
//! path in `python3`, no torch and no build needed): the same fields in the same order, with the
//! same C types, offsets and sizes, and the same struct sizes. A field added, moved or retyped
//! in one home and not the others fails here by name.

use dcp_mla_ffi::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// One field: (name, C type as the header spells it, canonical: "size_t", "pointer", ...).
type Fields = Vec<(String, String)>;
/// Struct name -> (size, [(field, offset, size)]).
type RustLayouts = BTreeMap<String, (usize, Vec<(String, usize, usize)>)>;
/// Struct name -> (size, [(field, C type, offset, size)]).
type PythonLayouts = BTreeMap<String, (usize, Vec<(String, String, usize, usize)>)>;

fn repo() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    if built.join("ffi/cbindgen.toml").exists() {
        built
    } else {
        PathBuf::from(".")
    }
}

/// A C type as the comparison names it: every pointer is "pointer", an array "T[n]".
fn canonical(c_type: &str, name: &str) -> (String, String) {
    let t = c_type.replace("const ", "").replace("struct ", "");
    let t = t.trim();
    if let Some((field, len)) = name.split_once('[') {
        return (field.to_string(), format!("{t}[{}", len));
    }
    let ty = if t.ends_with('*') { "pointer".to_string() } else { t.to_string() };
    (name.to_string(), ty)
}

/// Every `typedef struct Name { ... } Name;` of the header with its fields, comments dropped.
fn header_structs() -> BTreeMap<String, Fields> {
    let text = std::fs::read_to_string(repo().join("ffi/include/dcp_mla.h")).expect("reading the header");
    let mut out = BTreeMap::new();
    for chunk in text.split("typedef struct ").skip(1) {
        let Some((name, rest)) = chunk.split_once(" {") else { continue };
        let body = rest.split("\n}").next().unwrap_or_default();
        let fields = body
            .lines()
            .map(|l| l.split("//").next().unwrap_or_default().trim())
            .filter(|l| !l.is_empty())
            .map(|l| {
                let decl = l.trim_end_matches(';');
                let (ty, name) = decl.rsplit_once([' ', '*']).expect("a field declaration");
                let ty = if decl[ty.len()..].starts_with('*') { format!("{ty}*") } else { ty.to_string() };
                canonical(&ty, name.trim())
            })
            .collect();
        out.insert(name.trim().to_string(), fields);
    }
    out
}

/// (struct size, [(field, offset, size)]) of a Rust struct, its fields named in order.
macro_rules! rust_layout {
    ($($t:ident { $($f:ident),* $(,)? })*) => {{
        let mut m: RustLayouts = BTreeMap::new();
        $(
            let v = <$t>::default();
            m.insert(
                stringify!($t).to_string(),
                (
                    std::mem::size_of::<$t>(),
                    vec![$((stringify!($f).to_string(), std::mem::offset_of!($t, $f), std::mem::size_of_val(&v.$f))),*],
                ),
            );
        )*
        m
    }};
}

fn rust_structs() -> RustLayouts {
    rust_layout! {
        DcpMlaTensor { data, numel, dtype, num_strides, strides }
        DcpMlaKvFillArgs { struct_size, device, stream, ckv, kpe, req_idx, positions, block_table, cache, batch,
            max_pages, num_pages, block_size, dcp_size, interleave, rank, format, _reserved }
        DcpMlaDecodeDenseArgs { struct_size, device, stream, q, out, lse, workspace, cache, block_table, lens, sink,
            batch, num_q, heads, num_splits, num_pages, block_size, max_pages, dcp_size, interleave, rank, scale,
            schedule, lens_rule, empty_lse_inf }
        DcpMlaDecodeSparseArgs { struct_size, device, stream, q, out, lse, workspace, cache, indices, topk_len, sink,
            batch, num_q, heads, num_splits, num_pages, block_size, topk, scale, schedule, format, empty_lse_inf }
        DcpMlaDecodeModel1Args { struct_size, device, stream, q, out, lse, workspace, cache, indices, topk_len,
            extra_cache, extra_indices, extra_topk_len, sink, batch, num_q, heads, num_splits, num_pages, block_size,
            topk, extra_num_pages, extra_block_size, extra_topk, scale, schedule, empty_lse_inf, _reserved }
        DcpMlaKvFillModel1Args { struct_size, device, stream, ckv, kpe, req_idx, positions, block_table, cache,
            batch, max_pages, num_pages, block_size, dcp_size, interleave, rank }
        DcpMlaAgRsCorrectArgs { struct_size, device, stream, out, lse_all, contrib, num_tokens, local_heads,
            dcp_size, rank, lse_base, _reserved }
        DcpMlaAgRsFinishArgs { struct_size, device, stream, summed, lse_all, out, lse, sink, num_tokens,
            local_heads, dcp_size, rank, lse_base, _reserved }
        DcpMlaA2aPackArgs { struct_size, device, stream, out, lse, send, slot_bytes, num_tokens, local_heads,
            dcp_size }
        DcpMlaA2aCombineArgs { struct_size, device, stream, recv, out, lse, sink, slot_bytes, num_tokens,
            local_heads, dcp_size, lse_base, _reserved }
        DcpMlaMergeTwoArgs { struct_size, device, stream, out_a, lse_a, out_b, lse_b, out, lse, sink, rows,
            lse_a_base, lse_b_base }
        DcpMlaTopkLocalArgs { struct_size, device, stream, scores, lens, out, cols, rows, k }
        DcpMlaTopkPackArgs { struct_size, device, stream, local_idx, scores, cand_scores, cand_ids, cols, rows, k,
            dcp_size, interleave, rank }
        DcpMlaTopkMergeArgs { struct_size, device, stream, cand_scores, cand_ids, out, dcp_size, rows, k }
        DcpMlaTopkCompactArgs { struct_size, device, stream, ids, block_table, out, counts, rows, k, dcp_size,
            interleave, rank, block_size, rows_per_request }
        DcpMlaPrefillFlattenArgs { struct_size, device, stream, cache, block_table, pieces, out, num_pages,
            block_size, batch, max_pages, max_pieces, cap_rows, dcp_size, interleave, rank, format, _reserved }
        DcpMlaPrefillReorderArgs { struct_size, device, stream, gathered, pieces, out, cap_rows, max_pieces,
            out_rows, dcp_size, interleave }
    }
}

/// Python's ctypes structures: struct name -> (size, [(field, canonical type, offset, size)]).
fn python_structs() -> PythonLayouts {
    let script = r#"
import ctypes, importlib.util, sys
spec = importlib.util.spec_from_file_location("dcp_mla_lib", sys.argv[1])
lib = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lib)
names = {ctypes.c_size_t: "size_t", ctypes.c_void_p: "pointer", ctypes.c_int32: "int32_t",
         ctypes.c_uint32: "uint32_t", ctypes.c_float: "float", lib.Tensor: "DcpMlaTensor"}
def ctype(t):
    if issubclass(t, ctypes.Array):
        return f"{names[t._type_]}[{t._length_}]"
    return names[t]
for cls in [lib.Tensor, *lib.ARGS.values()]:
    name = "DcpMlaTensor" if cls is lib.Tensor else cls.__name__
    print("S", name, ctypes.sizeof(cls))
    for f, t in cls._fields_:
        print("F", name, f, ctype(t), getattr(cls, f).offset, getattr(cls, f).size)
"#;
    let lib_py = repo().join("python/dcp_mla/_lib.py");
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&lib_py)
        .output()
        .expect("running python3 (the layout check needs it, as scripts/test-python.sh does)");
    assert!(out.status.success(), "python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut m: PythonLayouts = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["S", name, size] => {
                m.entry(name.to_string()).or_default().0 = size.parse().unwrap();
            }
            ["F", name, f, t, off, size] => m.entry(name.to_string()).or_default().1.push((
                f.to_string(),
                t.to_string(),
                off.parse().unwrap(),
                size.parse().unwrap(),
            )),
            _ => panic!("unexpected line from python3: {line}"),
        }
    }
    m
}

#[test]
fn header_rust_and_python_structs_agree_field_by_field() {
    let header = header_structs();
    let rust = rust_structs();
    let python = python_structs();
    // every struct of the header is checked, and no home has one the header lacks
    let names: Vec<&String> = header.keys().collect();
    assert_eq!(names, rust.keys().collect::<Vec<_>>(), "the header's structs vs the Rust ones this test lists");
    assert_eq!(names, python.keys().collect::<Vec<_>>(), "the header's structs vs python/dcp_mla/_lib.py's");
    for (name, fields) in &header {
        let (rsize, rfields) = &rust[name];
        let (psize, pfields) = &python[name];
        assert_eq!(rsize, psize, "{name}: size {rsize} in Rust, {psize} in Python");
        let hnames: Vec<&str> = fields.iter().map(|(f, _)| f.as_str()).collect();
        let rnames: Vec<&str> = rfields.iter().map(|(f, _, _)| f.as_str()).collect();
        let pnames: Vec<&str> = pfields.iter().map(|(f, _, _, _)| f.as_str()).collect();
        assert_eq!(hnames, rnames, "{name}: the header's fields vs the Rust struct's");
        assert_eq!(hnames, pnames, "{name}: the header's fields vs Python's _fields_");
        for (((f, ctype), (_, roff, rsz)), (_, ptype, poff, psz)) in fields.iter().zip(rfields).zip(pfields) {
            assert_eq!(ctype, ptype, "{name}.{f}: C type {ctype} in the header, {ptype} in Python");
            assert_eq!((roff, rsz), (poff, psz), "{name}.{f}: (offset, size) in Rust vs Python");
        }
        // no implicit padding: each field starts where the one before ended, the struct where the last ends
        let mut end = 0;
        for (f, off, size) in rfields {
            assert_eq!(*off, end, "{name}.{f}: implicit padding before it (make it an explicit `_reserved`)");
            end = off + size;
        }
        assert_eq!(end, *rsize, "{name}: implicit padding at its end");
    }
}
