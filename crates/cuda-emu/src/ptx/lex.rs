//! Stage one: PTX text to tokens, each with its source line.

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Id(String),
    Num(String),
    Str,
    P(char),
}

pub(super) struct Lexed {
    pub(super) toks: Vec<Tok>,
    pub(super) lines: Vec<u32>,
}

pub(super) fn lex(src: &str) -> Result<Lexed, String> {
    let b = src.as_bytes();
    let mut i = 0;
    let mut line = 1u32;
    let mut toks = Vec::new();
    let mut lines = Vec::new();
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 2;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += 1;
            }
            i += 1;
            toks.push(Tok::Str);
            lines.push(line);
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
            toks.push(Tok::Num(src[s..i].to_string()));
            lines.push(line);
        } else if c.is_ascii_alphabetic() || matches!(c, b'_' | b'%' | b'$' | b'.') {
            let s = i;
            i += 1;
            // `::` inside an opcode is part of it (`.shared::cta`); a label's
            // single colon is not.
            while i < b.len()
                && (b[i].is_ascii_alphanumeric()
                    || matches!(b[i], b'_' | b'$' | b'.')
                    || (b[i] == b':'
                        && b.get(i + 1) == Some(&b':')
                        && b.get(i + 2).is_some_and(|c| c.is_ascii_alphabetic())))
            {
                i += if b[i] == b':' { 2 } else { 1 };
            }
            toks.push(Tok::Id(src[s..i].to_string()));
            lines.push(line);
        } else if b",;:[](){}+-|!@<>=".contains(&c) {
            toks.push(Tok::P(c as char));
            lines.push(line);
            i += 1;
        } else {
            return Err(format!("line {line}: unexpected character {:?}", c as char));
        }
    }
    Ok(Lexed { toks, lines })
}

/// Parses an integer literal (decimal, hex, octal) or a PTX float literal
/// (`0fXXXXXXXX`, `0dXXXXXXXXXXXXXXXX`) to its bits.
pub(super) fn parse_num(s: &str) -> Option<u64> {
    let s = s.strip_suffix('U').unwrap_or(s);
    if let Some(h) = s.strip_prefix("0f").or_else(|| s.strip_prefix("0F")) {
        return u32::from_str_radix(h, 16).ok().map(u64::from);
    }
    if let Some(h) = s.strip_prefix("0d").or_else(|| s.strip_prefix("0D")) {
        return u64::from_str_radix(h, 16).ok();
    }
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    if s.contains('.') || s.contains('e') {
        return s.parse::<f64>().ok().map(f64::to_bits);
    }
    if s.len() > 1 && s.starts_with('0') {
        return u64::from_str_radix(&s[1..], 8).ok();
    }
    s.parse::<u64>().ok()
}
