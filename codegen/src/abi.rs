//! Reads `kernels-src/abi.h`, the single definition of every kernel parameter struct, and emits
//! the Rust mirrors plus a C probe of the C compiler's layout of the same structs.

/// One field of a parameter struct.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub c_type: String,
    pub name: String,
    /// `name[len]`: an array of `len` elements.
    pub len: Option<usize>,
    /// `DCP_ALIGN(n)` before the type: the field (and so the struct) is aligned to `n` bytes.
    pub align: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Struct {
    pub name: String,
    /// The comment lines right before the typedef, used as the Rust doc comment.
    pub doc: Vec<String>,
    pub fields: Vec<(Field, Option<String>)>,
}

fn rust_type(c: &str) -> Option<&'static str> {
    Some(match c {
        "uint64_t" => "u64",
        "int64_t" => "i64",
        "uint32_t" => "u32",
        "int32_t" => "i32",
        "uint16_t" => "u16",
        "int16_t" => "i16",
        "uint8_t" => "u8",
        "int8_t" => "i8",
        "float" => "f32",
        "double" => "f64",
        _ => return None,
    })
}

fn strip_comment(line: &str) -> (&str, Option<String>) {
    for pat in ["/*", "//"] {
        if let Some(i) = line.find(pat) {
            let c = line[i + 2..].trim().trim_end_matches("*/").trim().to_string();
            return (&line[..i], if c.is_empty() { None } else { Some(c) });
        }
    }
    (line, None)
}

/// Parses the restricted header subset described at the top of abi.h.
pub fn parse(src: &str) -> Result<Vec<Struct>, String> {
    let mut out = Vec::new();
    let mut cur: Option<Struct> = None;
    let mut doc: Vec<String> = Vec::new();
    let mut in_block_comment = false;
    for (no, raw) in src.lines().enumerate() {
        let line_no = no + 1;
        let t = raw.trim();
        // Free-standing block comments: gather their text as the next struct's doc.
        if in_block_comment {
            let text = t.trim_start_matches('*').trim_end_matches("*/").trim();
            if !text.is_empty() {
                doc.push(text.to_string());
            }
            if t.contains("*/") {
                in_block_comment = false;
            }
            continue;
        }
        if cur.is_none() && t.starts_with("/*") {
            doc.clear();
            let text = t.trim_start_matches("/*").trim_end_matches("*/").trim();
            if !text.is_empty() {
                doc.push(text.to_string());
            }
            in_block_comment = !t.contains("*/");
            continue;
        }
        let (code, comment) = strip_comment(t);
        let code = code.trim();
        if code.is_empty() || code.starts_with('#') {
            continue;
        }
        if let Some(rest) = code.strip_prefix("typedef struct") {
            if cur.is_some() {
                return Err(format!("abi.h:{line_no}: nested struct"));
            }
            let name = rest.trim().trim_end_matches('{').trim().to_string();
            cur = Some(Struct { name, doc: std::mem::take(&mut doc), fields: Vec::new() });
            continue;
        }
        let Some(s) = cur.as_mut() else {
            return Err(format!("abi.h:{line_no}: unexpected `{code}` outside a struct"));
        };
        if let Some(rest) = code.strip_prefix('}') {
            let alias = rest.trim().trim_end_matches(';').trim();
            if alias != s.name {
                return Err(format!("abi.h:{line_no}: typedef name `{alias}` differs from `{}`", s.name));
            }
            if s.fields.is_empty() {
                return Err(format!("abi.h:{line_no}: struct `{}` has no fields", s.name));
            }
            out.push(cur.take().unwrap());
            continue;
        }
        let decl =
            code.strip_suffix(';').ok_or_else(|| format!("abi.h:{line_no}: expected `type name;`, got `{code}`"))?;
        let (align, decl) = match decl.strip_prefix("DCP_ALIGN(") {
            Some(rest) => {
                let (n, rest) = rest.split_once(')').ok_or_else(|| format!("abi.h:{line_no}: unclosed DCP_ALIGN("))?;
                let n: usize = n.trim().parse().map_err(|_| format!("abi.h:{line_no}: DCP_ALIGN(`{n}`)"))?;
                if !n.is_power_of_two() {
                    return Err(format!("abi.h:{line_no}: DCP_ALIGN({n}) is not a power of two"));
                }
                // Rust can align only the struct: the aligned field must sit at offset 0
                if !s.fields.is_empty() {
                    return Err(format!("abi.h:{line_no}: a DCP_ALIGN field must be the struct's first"));
                }
                (Some(n), rest)
            }
            None => (None, decl),
        };
        let parts: Vec<&str> = decl.split_whitespace().collect();
        if parts.len() != 2 || rust_type(parts[0]).is_none() {
            return Err(format!(
                "abi.h:{line_no}: `{code}`: fields must be one fixed-width integer or float type and one name"
            ));
        }
        let (name, len) = match parts[1].split_once('[') {
            Some((name, n)) => {
                let n = n.strip_suffix(']').and_then(|n| n.parse::<usize>().ok()).filter(|&n| n > 0);
                let n = n.ok_or_else(|| format!("abi.h:{line_no}: `{}`: expected name[N], N > 0", parts[1]))?;
                (name, Some(n))
            }
            None => (parts[1], None),
        };
        s.fields.push((Field { c_type: parts[0].into(), name: name.into(), len, align }, comment));
    }
    if let Some(s) = cur {
        return Err(format!("abi.h: struct `{}` is not closed", s.name));
    }
    Ok(out)
}

/// A line of abi.h's comments as a rustdoc line: its brackets (shapes such as `[rows, 512]`,
/// ranges such as `[0, n)`) escaped outside code spans, so rustdoc takes none for a link.
fn rustdoc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut code = false;
    for c in text.chars() {
        match c {
            '`' => code = !code,
            '[' | ']' if !code => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}

/// Rust mirrors with `#[repr(C)]`, and the Rust-side layout table.
pub fn emit_rust(structs: &[Struct]) -> String {
    let mut s = String::from("// @generated by dcp-mla-codegen from kernels-src/abi.h. Do not edit.\n\n");
    for st in structs {
        for d in &st.doc {
            s.push_str(&format!("/// {}\n", rustdoc(d)));
        }
        match st.fields.iter().find_map(|(f, _)| f.align) {
            Some(n) => s.push_str(&format!("#[repr(C, align({n}))]\n")),
            None => s.push_str("#[repr(C)]\n"),
        }
        s.push_str("#[derive(Debug, Clone, Copy, Default, PartialEq)]\n");
        s.push_str(&format!("pub struct {} {{\n", st.name));
        for (f, c) in &st.fields {
            if let Some(c) = c {
                s.push_str(&format!("    /// {}\n", rustdoc(c)));
            }
            let ty = rust_type(&f.c_type).unwrap();
            match f.len {
                Some(n) => s.push_str(&format!("    pub {}: [{ty}; {n}],\n", f.name)),
                None => s.push_str(&format!("    pub {}: {ty},\n", f.name)),
            }
        }
        s.push_str("}\n\n");
    }
    s.push_str("/// Layout of every struct as Rust lays it out: (name, [size, align, offset of each field]).\n");
    s.push_str("pub fn rust_layouts() -> Vec<(&'static str, Vec<u64>)> {\n    vec![\n");
    for st in structs {
        let mut v = vec![
            format!("core::mem::size_of::<{}>() as u64", st.name),
            format!("core::mem::align_of::<{}>() as u64", st.name),
        ];
        for (f, _) in &st.fields {
            v.push(format!("core::mem::offset_of!({}, {}) as u64", st.name, f.name));
        }
        s.push_str(&format!("        (\"{}\", vec![{}]),\n", st.name, v.join(", ")));
    }
    s.push_str("    ]\n}\n\n");
    s.push_str("/// Layout of every struct as the C compiler lays it out (from the compiled C probe).\n");
    s.push_str("pub fn c_layouts() -> Vec<(&'static str, Vec<u64>)> {\n");
    s.push_str("    extern \"C\" {\n");
    for st in structs {
        s.push_str(&format!("        static dcp_abi_layout_{}: [u64; {}];\n", st.name, st.fields.len() + 2));
    }
    s.push_str("    }\n    // SAFETY: plain constant arrays defined by the C probe.\n    unsafe {\n        vec![\n");
    for st in structs {
        s.push_str(&format!("            (\"{0}\", dcp_abi_layout_{0}.to_vec()),\n", st.name));
    }
    s.push_str("        ]\n    }\n}\n");
    s
}

/// A C translation unit that records sizeof, _Alignof and each offsetof.
pub fn emit_c_probe(structs: &[Struct]) -> String {
    let mut s = String::from(
        "/* @generated by dcp-mla-codegen. */\n#include <stddef.h>\n#include <stdint.h>\n#include \"abi.h\"\n\n",
    );
    for st in structs {
        let mut v = vec![format!("sizeof({})", st.name), format!("_Alignof({})", st.name)];
        for (f, _) in &st.fields {
            v.push(format!("offsetof({}, {})", st.name, f.name));
        }
        s.push_str(&format!("const uint64_t dcp_abi_layout_{}[{}] = {{ {} }};\n", st.name, v.len(), v.join(", ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_subset() {
        let src = "#pragma once\n/* A thing. */\ntypedef struct P {\n    uint64_t a; /* ptr */\n    int32_t n;\n} P;\n";
        let v = parse(src).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].doc, vec!["A thing."]);
        assert_eq!(v[0].fields.len(), 2);
        assert_eq!(v[0].fields[0].1.as_deref(), Some("ptr"));
        let rs = emit_rust(&v);
        assert!(rs.contains("pub a: u64,") && rs.contains("pub n: i32,"));
        assert!(emit_c_probe(&v).contains("offsetof(P, n)"));
    }

    #[test]
    fn comments_become_rustdoc_without_links() {
        let src = "/* Rows [0, n) of `x[i]`. */\ntypedef struct P {\n    uint64_t a; /* int32 [rows] */\n} P;\n";
        let rs = emit_rust(&parse(src).unwrap());
        assert!(rs.contains("/// Rows \\[0, n) of `x[i]`.\n"), "{rs}");
        assert!(rs.contains("    /// int32 \\[rows\\]\n"), "{rs}");
    }

    #[test]
    fn rejects_what_it_cannot_mirror() {
        assert!(parse("typedef struct P {\n  void* a;\n} P;\n").unwrap_err().contains("fixed-width"));
        assert!(parse("typedef struct P {\n  int32_t a;\n} Q;\n").unwrap_err().contains("differs"));
        assert!(parse("typedef struct P {\n  int32_t a;\n").unwrap_err().contains("not closed"));
        let late_align = "typedef struct P {\n  int32_t a;\n  DCP_ALIGN(64) uint64_t m[16];\n} P;\n";
        assert!(parse(late_align).unwrap_err().contains("first"));
        assert!(parse("typedef struct P {\n  int32_t a[];\n} P;\n").unwrap_err().contains("name[N]"));
    }

    #[test]
    fn aligned_arrays() {
        let v = parse("typedef struct P {\n  DCP_ALIGN(128) uint64_t m[16];\n  int32_t n;\n} P;\n").unwrap();
        assert_eq!(v[0].fields[0].0.len, Some(16));
        assert_eq!(v[0].fields[0].0.align, Some(128));
        let rs = emit_rust(&v);
        assert!(rs.contains("#[repr(C, align(128))]") && rs.contains("pub m: [u64; 16],"));
    }
}
