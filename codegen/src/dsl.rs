//! The kernel DSL (`kernels-src/kernels.toml`): its schema, variant expansion and checks.

use crate::expr;
use serde::Deserialize;
use std::collections::BTreeMap;

/// One value of a specialisation axis.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum AxisValue {
    Int(i64),
    Str(String),
}

impl std::fmt::Display for AxisValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AxisValue::Int(i) => write!(f, "{i}"),
            AxisValue::Str(s) => write!(f, "{s}"),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    /// Real architectures to emit machine code for, e.g. `sm_90a`.
    pub sass: Vec<String>,
    /// Virtual architecture whose PTX is embedded, e.g. `compute_90`.
    pub ptx: String,
    #[serde(default)]
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilySpec {
    pub name: String,
    pub header: String,
    pub template: String,
    pub params: String,
    pub block: u32,
    /// CTAs an SM must hold at once (the second `__launch_bounds__` argument: ptxas keeps the
    /// registers within 64K / (block · min_blocks) a thread); absent: no such bound.
    #[serde(default)]
    pub min_blocks: Option<u32>,
    #[serde(default)]
    pub hot: bool,
    /// Axis name -> its values, in the order of the template's parameters.
    #[serde(default)]
    pub axes: toml::value::Table,
    /// Axis name -> string value -> C++ spelling.
    #[serde(default)]
    pub cpp: BTreeMap<String, BTreeMap<String, String>>,
    /// Explicit variants; default: the cartesian product of the axes. A variant may carry
    /// `default = true`: the one a launcher picks when its caller names none (the registry's
    /// `<FAMILY>_VARIANTS` list carries the mark; which axis values share one default is the
    /// launcher's rule, e.g. one per `kv` for the decode families).
    pub variants: Option<Vec<toml::value::Table>>,
    #[serde(default)]
    pub constraints: Vec<String>,
    /// A C++ constant expression of a variant's dynamic shared-memory bytes, from the kernel
    /// source itself (e.g. its constexpr `shared_bytes<...>()`); `{axis}` stands for the
    /// variant's template argument of that axis. Evaluated at build time by a host probe
    /// (`emit::shared_probe`), recorded in the registry; none: the kernel takes no dynamic
    /// shared memory.
    pub dynamic_shared: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelList {
    pub targets: Targets,
    /// String axis -> the Rust enum whose variants are that axis's values (in CamelCase, as the
    /// registry's `axes` enums spell them): the registry implements `From<that type>` for the
    /// axis enum, so the two vocabularies cannot drift apart (a value on one side only is a
    /// compile error).
    #[serde(default)]
    pub rust_types: BTreeMap<String, String>,
    #[serde(rename = "family")]
    pub families: Vec<FamilySpec>,
}

/// One checked specialisation of a family.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// (axis, value) in template-parameter order.
    pub values: Vec<(String, AxisValue)>,
    /// kernels.toml marks it `default = true`.
    pub default: bool,
}

impl Variant {
    /// The `extern "C"` entry point: `dcp_<family>__<axis>_<value>...`.
    pub fn symbol(&self, family: &str) -> String {
        let mut s = format!("dcp_{family}");
        for (k, v) in &self.values {
            s.push_str(&format!("__{}_{}", k, v.to_string().replace('-', "m")));
        }
        s
    }
    pub fn describe(&self, family: &str) -> String {
        let vals: Vec<String> = self.values.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{family}[{}]", vals.join(", "))
    }
}

/// A family with its axes resolved and every variant checked.
#[derive(Debug, Clone)]
pub struct Family {
    pub spec: FamilySpec,
    /// Axis names and their declared values, in order.
    pub axes: Vec<(String, Vec<AxisValue>)>,
    pub variants: Vec<Variant>,
}

pub fn parse(src: &str) -> Result<KernelList, String> {
    toml::from_str(src).map_err(|e| format!("kernel DSL: {e}"))
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fn axis_values(family: &str, axis: &str, v: &toml::Value) -> Result<Vec<AxisValue>, String> {
    let arr = v.as_array().ok_or_else(|| format!("{family}: axis `{axis}` must be a list"))?;
    if arr.is_empty() {
        return Err(format!("{family}: axis `{axis}` has no values"));
    }
    let vals: Vec<AxisValue> = arr.iter().map(|x| one_value(family, axis, x)).collect::<Result<_, _>>()?;
    let ints = vals.iter().filter(|v| matches!(v, AxisValue::Int(_))).count();
    if ints != 0 && ints != vals.len() {
        return Err(format!("{family}: axis `{axis}` mixes integers and strings"));
    }
    Ok(vals)
}

fn one_value(family: &str, axis: &str, x: &toml::Value) -> Result<AxisValue, String> {
    match x {
        toml::Value::Integer(i) => Ok(AxisValue::Int(*i)),
        toml::Value::String(s) if is_ident(s) => Ok(AxisValue::Str(s.clone())),
        _ => Err(format!("{family}: axis `{axis}` value {x} must be an integer or an identifier")),
    }
}

/// Resolves axes, expands variants and checks every constraint. Any violation is an error that
/// names the family, the variant's values and the constraint.
pub fn check(list: &KernelList) -> Result<Vec<Family>, String> {
    let mut out: Vec<Family> = Vec::new();
    for spec in &list.families {
        let f = &spec.name;
        if !is_ident(f) {
            return Err(format!("family name `{f}` is not an identifier"));
        }
        if out.iter().any(|o| &o.spec.name == f) {
            return Err(format!("family `{f}` is declared twice"));
        }
        if spec.block == 0 || spec.block > 1024 || spec.block % 32 != 0 {
            return Err(format!("{f}: block = {} must be a multiple of 32 in 32..=1024", spec.block));
        }
        if let Some(m) = spec.min_blocks {
            if m == 0 || m * spec.block > 2048 {
                return Err(format!("{f}: min_blocks = {m} of {} threads do not fit an SM (2048 threads)", spec.block));
            }
        }
        let mut axes = Vec::new();
        for (name, v) in &spec.axes {
            if !is_ident(name) || name == "default" {
                return Err(format!("{f}: axis name `{name}` is not an identifier (or is the reserved `default`)"));
            }
            let vals = axis_values(f, name, v)?;
            for val in &vals {
                if let AxisValue::Str(s) = val {
                    if spec.cpp.get(name).and_then(|m| m.get(s)).is_none() {
                        return Err(format!("{f}: axis `{name}` value `{s}` has no C++ spelling in `cpp`"));
                    }
                }
            }
            axes.push((name.clone(), vals));
        }
        let variants = match &spec.variants {
            None => cartesian(&axes),
            Some(list) => list.iter().map(|t| explicit_variant(f, &axes, t)).collect::<Result<Vec<_>, _>>()?,
        };
        for (i, v) in variants.iter().enumerate() {
            if variants[..i].iter().any(|w| w.values == v.values) {
                return Err(format!("{}: declared twice", v.describe(f)));
            }
            let ints: BTreeMap<String, i64> = v
                .values
                .iter()
                .filter_map(|(k, x)| match x {
                    AxisValue::Int(i) => Some((k.clone(), *i)),
                    _ => None,
                })
                .collect();
            for c in &spec.constraints {
                let ok = expr::eval(c, &ints).map_err(|e| format!("{f}: {e}"))?;
                if ok == 0 {
                    let named: Vec<String> = expr::names(c)?
                        .into_iter()
                        .filter_map(|n| ints.get(&n).map(|x| format!("{n} = {x}")))
                        .fold(Vec::new(), |mut acc, s| {
                            if !acc.contains(&s) {
                                acc.push(s);
                            }
                            acc
                        });
                    return Err(format!("{} breaks constraint `{c}` ({})", v.describe(f), named.join(", ")));
                }
            }
        }
        out.push(Family { spec: spec.clone(), axes, variants });
    }
    for axis in list.rust_types.keys() {
        let is_string_axis =
            out.iter().any(|f| f.axes.iter().any(|(a, v)| a == axis && matches!(v[0], AxisValue::Str(_))));
        if !is_string_axis {
            return Err(format!("rust_types: `{axis}` is no family's string axis"));
        }
    }
    Ok(out)
}

fn cartesian(axes: &[(String, Vec<AxisValue>)]) -> Vec<Variant> {
    let mut acc = vec![Variant { values: Vec::new(), default: false }];
    for (name, vals) in axes {
        acc = acc
            .into_iter()
            .flat_map(|v| {
                vals.iter().map(move |x| {
                    let mut v = v.clone();
                    v.values.push((name.clone(), x.clone()));
                    v
                })
            })
            .collect();
    }
    acc
}

fn explicit_variant(f: &str, axes: &[(String, Vec<AxisValue>)], t: &toml::value::Table) -> Result<Variant, String> {
    for k in t.keys() {
        if k != "default" && !axes.iter().any(|(a, _)| a == k) {
            return Err(format!("{f}: variant {t:?} names unknown axis `{k}`"));
        }
    }
    let default = match t.get("default") {
        None => false,
        Some(toml::Value::Boolean(b)) => *b,
        Some(x) => return Err(format!("{f}: variant {t}: `default` must be true or false, not {x}")),
    };
    let mut values = Vec::new();
    for (name, allowed) in axes {
        let x = t.get(name).ok_or_else(|| format!("{f}: variant {t} lacks axis `{name}`"))?;
        let x = one_value(f, name, x)?;
        if !allowed.contains(&x) {
            return Err(format!("{f}: variant value {name} = {x} is not among the axis's values"));
        }
        values.push((name.clone(), x));
    }
    Ok(Variant { values, default })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "[targets]\nsass = [\"sm_80\"]\nptx = \"compute_90\"\n";

    fn family(body: &str) -> String {
        format!(
            "{HEAD}[[family]]\nname = \"topk_merge\"\nheader = \"h.cuh\"\ntemplate = \"t\"\nparams = \"P\"\nblock = 128\n{body}"
        )
    }

    #[test]
    fn cartesian_product_in_axis_order() {
        let src = family("axes = { D = [1, 2], K = [512, 2048] }\nconstraints = [\"D*K % 512 == 0\"]\n");
        let fams = check(&parse(&src).unwrap()).unwrap();
        let syms: Vec<String> = fams[0].variants.iter().map(|v| v.symbol("topk_merge")).collect();
        assert_eq!(
            syms,
            [
                "dcp_topk_merge__D_1__K_512",
                "dcp_topk_merge__D_1__K_2048",
                "dcp_topk_merge__D_2__K_512",
                "dcp_topk_merge__D_2__K_2048"
            ]
        );
    }

    #[test]
    fn broken_dk_constraint_names_d_and_k() {
        let src = family("axes = { D = [1, 2], K = [256, 512] }\nconstraints = [\"D*K % 512 == 0\"]\n");
        let err = check(&parse(&src).unwrap()).unwrap_err();
        assert!(err.contains("topk_merge[D=1, K=256]"), "{err}");
        assert!(err.contains("D = 1, K = 256"), "{err}");
        assert!(err.contains("D*K % 512 == 0"), "{err}");
    }

    #[test]
    fn rust_types_name_string_axes() {
        let ok = family("axes = { kv = [\"a\"] }\ncpp = { kv = { a = \"A\" } }\n")
            .replace("[[family]]", "[rust_types]\nkv = \"crate::Kv\"\n\n[[family]]");
        assert!(check(&parse(&ok).unwrap()).is_ok());
        for bad in ["kvv", "D"] {
            let src = family("axes = { kv = [\"a\"], D = [1] }\ncpp = { kv = { a = \"A\" } }\n")
                .replace("[[family]]", &format!("[rust_types]\n{bad} = \"crate::Kv\"\n\n[[family]]"));
            assert!(check(&parse(&src).unwrap()).unwrap_err().contains("no family's string axis"), "{bad}");
        }
    }

    #[test]
    fn explicit_variants_are_checked() {
        let src = family(
            "axes = { D = [1, 2], K = [256, 512] }\nvariants = [{ D = 2, K = 256 }, { D = 1, K = 512 }]\nconstraints = [\"D*K % 512 == 0\"]\n",
        );
        assert_eq!(check(&parse(&src).unwrap()).unwrap()[0].variants.len(), 2);
        // the default mark: a boolean, not an axis, not part of what makes a variant unique
        let marked = family("axes = { D = [1, 2] }\nvariants = [{ D = 2, default = true }, { D = 1 }]\n");
        let fams = check(&parse(&marked).unwrap()).unwrap();
        assert!(fams[0].variants[0].default && !fams[0].variants[1].default);
        assert_eq!(fams[0].variants[0].symbol("f"), "dcp_f__D_2");
        let not_bool = family("axes = { D = [1, 2] }\nvariants = [{ D = 2, default = 1 }]\n");
        assert!(check(&parse(&not_bool).unwrap()).unwrap_err().contains("`default` must be true or false"));
        let twice = family("axes = { D = [1, 2] }\nvariants = [{ D = 2, default = true }, { D = 2 }]\n");
        assert!(check(&parse(&twice).unwrap()).unwrap_err().contains("declared twice"));
        let bad = family("axes = { D = [1, 2] }\nvariants = [{ D = 4 }]\n");
        assert!(check(&parse(&bad).unwrap()).unwrap_err().contains("D = 4"));
    }

    #[test]
    fn string_axes_need_cpp_spelling() {
        let src = family("axes = { format = [\"bf16\"] }\n");
        assert!(check(&parse(&src).unwrap()).unwrap_err().contains("no C++ spelling"));
    }

    #[test]
    fn bad_block_and_unknown_fields_rejected() {
        assert!(parse(&family("block2 = 3\n")).unwrap_err().contains("block2"));
        let src = family("").replace("block = 128", "block = 100");
        assert!(check(&parse(&src).unwrap()).unwrap_err().contains("block = 100"));
        let src = family("min_blocks = 17\n");
        assert!(check(&parse(&src).unwrap()).unwrap_err().contains("min_blocks = 17"));
        assert!(check(&parse(&family("min_blocks = 16\n")).unwrap()).is_ok());
    }
}
