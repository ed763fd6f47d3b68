//! The constraint language of the kernel DSL: integer expressions over a variant's axes.
//!
//! Grammar (C precedence): `||`, `&&`, comparisons (`== != < <= > >=`), `+ -`, `* / %`,
//! unary `! -`, integers, axis names and parentheses. Booleans are integers (0 is false).

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(i64),
    Ident(String),
    Op(&'static str),
    LParen,
    RParen,
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    const OPS: [&str; 16] = ["||", "&&", "==", "!=", "<=", ">=", "<", ">", "+", "-", "*", "/", "%", "!", "(", ")"];
    let b = src.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    'outer: while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && (b[i] as char).is_ascii_digit() {
                i += 1;
            }
            let n = src[s..i].parse::<i64>().map_err(|e| format!("bad integer in `{src}`: {e}"))?;
            out.push(Tok::Num(n));
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let s = i;
            while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(src[s..i].to_string()));
            continue;
        }
        for op in OPS {
            if src[i..].starts_with(op) {
                i += op.len();
                out.push(match op {
                    "(" => Tok::LParen,
                    ")" => Tok::RParen,
                    _ => Tok::Op(op),
                });
                continue 'outer;
            }
        }
        return Err(format!("unexpected character `{c}` in constraint `{src}`"));
    }
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<Tok>,
    pos: usize,
    vars: &'a BTreeMap<String, i64>,
    src: &'a str,
}

impl Parser<'_> {
    fn peek_op(&self) -> Option<&'static str> {
        match self.toks.get(self.pos) {
            Some(Tok::Op(o)) => Some(o),
            _ => None,
        }
    }
    fn binary(&mut self, level: usize) -> Result<i64, String> {
        const LEVELS: [&[&str]; 5] =
            [&["||"], &["&&"], &["==", "!=", "<", "<=", ">", ">="], &["+", "-"], &["*", "/", "%"]];
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut lhs = self.binary(level + 1)?;
        while let Some(op) = self.peek_op().filter(|o| LEVELS[level].contains(o)) {
            self.pos += 1;
            let rhs = self.binary(level + 1)?;
            lhs = match op {
                "||" => ((lhs != 0) || (rhs != 0)) as i64,
                "&&" => ((lhs != 0) && (rhs != 0)) as i64,
                "==" => (lhs == rhs) as i64,
                "!=" => (lhs != rhs) as i64,
                "<" => (lhs < rhs) as i64,
                "<=" => (lhs <= rhs) as i64,
                ">" => (lhs > rhs) as i64,
                ">=" => (lhs >= rhs) as i64,
                "+" => lhs.checked_add(rhs).ok_or("overflow")?,
                "-" => lhs.checked_sub(rhs).ok_or("overflow")?,
                "*" => lhs.checked_mul(rhs).ok_or("overflow")?,
                "/" | "%" if rhs == 0 => return Err(format!("division by zero in `{}`", self.src)),
                "/" => lhs / rhs,
                _ => lhs % rhs,
            };
        }
        Ok(lhs)
    }
    fn unary(&mut self) -> Result<i64, String> {
        match self.toks.get(self.pos).cloned() {
            Some(Tok::Op("!")) => {
                self.pos += 1;
                Ok((self.unary()? == 0) as i64)
            }
            Some(Tok::Op("-")) => {
                self.pos += 1;
                Ok(-self.unary()?)
            }
            Some(Tok::Num(n)) => {
                self.pos += 1;
                Ok(n)
            }
            Some(Tok::Ident(name)) => {
                self.pos += 1;
                self.vars
                    .get(&name)
                    .copied()
                    .ok_or_else(|| format!("constraint `{}` names `{name}`, which is not an integer axis", self.src))
            }
            Some(Tok::LParen) => {
                self.pos += 1;
                let v = self.binary(0)?;
                if self.toks.get(self.pos) != Some(&Tok::RParen) {
                    return Err(format!("missing `)` in constraint `{}`", self.src));
                }
                self.pos += 1;
                Ok(v)
            }
            _ => Err(format!("malformed constraint `{}`", self.src)),
        }
    }
}

/// Evaluates `src` with the given integer variables; non-zero is true.
pub fn eval(src: &str, vars: &BTreeMap<String, i64>) -> Result<i64, String> {
    let mut p = Parser { toks: lex(src)?, pos: 0, vars, src };
    let v = p.binary(0)?;
    if p.pos != p.toks.len() {
        return Err(format!("trailing input in constraint `{src}`"));
    }
    Ok(v)
}

/// The axis names an expression mentions, in order of appearance.
pub fn names(src: &str) -> Result<Vec<String>, String> {
    Ok(lex(src)?
        .into_iter()
        .filter_map(|t| match t {
            Tok::Ident(n) => Some(n),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn precedence_and_logic() {
        let v = vars(&[("D", 4), ("K", 512)]);
        assert_eq!(eval("D*K % 512 == 0", &v), Ok(1));
        assert_eq!(eval("1 + 2 * 3", &v), Ok(7));
        assert_eq!(eval("(1 + 2) * 3", &v), Ok(9));
        assert_eq!(eval("D == 4 && K == 2048 || !0", &v), Ok(1));
        assert_eq!(eval("-D + 5", &v), Ok(1));
        assert_eq!(eval("D <= 3", &v), Ok(0));
    }

    #[test]
    fn errors_are_named() {
        let v = vars(&[("D", 1)]);
        assert!(eval("Q > 1", &v).unwrap_err().contains("`Q`"));
        assert!(eval("D % 0", &v).unwrap_err().contains("division by zero"));
        assert!(eval("(D", &v).is_err());
        assert!(eval("D D", &v).is_err());
        assert!(eval("D $ 1", &v).is_err());
    }
}
