//! Stage two: tokens to functions of raw statements, names still strings.

use std::collections::HashMap;

use super::lex::{lex, parse_num, Tok};
use super::{Global, Module, Space, Ty};

/// `WARP_SZ`, the one constant PTX names.
const WARP_SZ: &str = "WARP_SZ";

/// A raw operand before symbol resolution.
#[derive(Debug, Clone)]
pub(super) enum Raw {
    Reg(String),
    Num(u64),
    Sym(String),
    Mem(Box<Raw>, i64),
    Vec(Vec<Raw>),
    Pair(String, String),
    Not(Box<Raw>),
}

pub(super) struct RawInst {
    pub(super) guard: Option<(String, bool)>,
    pub(super) op: String,
    pub(super) args: Vec<Raw>,
    pub(super) line: u32,
}

pub(super) enum Stmt {
    Label(String),
    Inst(RawInst),
    /// A `.param` declared in the body (call sites): name, size, align.
    Param(String, u32, u32),
    Local(String, u32, u32),
    Shared(String, u32, u32),
    /// A `.reg` declaration: the width in bytes of the registers named
    /// (a `%rd<12>` range is recorded by its prefix, `%rd`).
    Regs(u32, Vec<String>),
}

pub(super) struct RawFunc {
    pub(super) name: String,
    pub(super) entry: bool,
    pub(super) params: Vec<(String, u32, u32)>,
    pub(super) ret: Option<(String, u32, u32)>,
    pub(super) body: Option<Vec<Stmt>>,
    pub(super) maxntid: Option<u32>,
}

struct Parser {
    toks: Vec<Tok>,
    lines: Vec<u32>,
    i: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i)
    }
    fn line(&self) -> u32 {
        self.lines.get(self.i).or(self.lines.last()).copied().unwrap_or(0)
    }
    fn next(&mut self) -> Result<Tok, String> {
        let t = self.toks.get(self.i).cloned().ok_or("unexpected end of PTX")?;
        self.i += 1;
        Ok(t)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::P(c)) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("line {}: expected {c:?}, found {:?}", self.line(), self.peek()))
        }
    }
    fn id(&mut self) -> Result<String, String> {
        match self.next()? {
            Tok::Id(s) => Ok(s),
            t => Err(format!("line {}: expected a name, found {t:?}", self.line())),
        }
    }
    fn num(&mut self) -> Result<u64, String> {
        let neg = self.eat('-');
        match self.next()? {
            Tok::Num(s) => {
                let v = parse_num(&s).ok_or_else(|| format!("line {}: bad number {s}", self.line()))?;
                Ok(if neg { v.wrapping_neg() } else { v })
            }
            t => Err(format!("line {}: expected a number, found {t:?}", self.line())),
        }
    }
    fn skip_to_semi(&mut self) -> Result<(), String> {
        while !self.eat(';') {
            self.next()?;
        }
        Ok(())
    }

    /// `.align N? .type name ([N])?` after a state space; returns
    /// (name, element type, count or None, align).
    fn var_decl(&mut self) -> Result<(String, Ty, Option<u64>, u32), String> {
        let mut align = 0u32;
        let mut ty = None;
        loop {
            match self.peek() {
                Some(Tok::Id(s)) if s == ".align" => {
                    self.i += 1;
                    align = self.num()? as u32;
                }
                Some(Tok::Id(s)) if s.starts_with('.') => {
                    let s = s.clone();
                    self.i += 1;
                    if let Some(t) = Ty::parse(&s[1..]) {
                        ty = Some(t);
                    } else if s.starts_with(".v") {
                        // Vector variables are not emitted by NVRTC for these kernels.
                        return Err(format!("line {}: vector variables are not supported", self.line()));
                    }
                }
                _ => break,
            }
        }
        let ty = ty.ok_or_else(|| format!("line {}: declaration without a type", self.line()))?;
        let name = self.id()?;
        let count = if self.eat('[') {
            if self.eat(']') {
                Some(0)
            } else {
                let n = self.num()?;
                self.expect(']')?;
                Some(n)
            }
        } else {
            None
        };
        if align == 0 {
            align = ty.size();
        }
        Ok((name, ty, count, align))
    }

    fn param_list(&mut self) -> Result<Vec<(String, u32, u32)>, String> {
        let mut out = Vec::new();
        self.expect('(')?;
        if self.eat(')') {
            return Ok(out);
        }
        loop {
            let sp = self.id()?;
            if sp != ".param" && sp != ".reg" {
                return Err(format!("line {}: expected .param, found {sp}", self.line()));
            }
            let (name, ty, count, align) = self.var_decl()?;
            let size = ty.size() * count.unwrap_or(1).max(1) as u32;
            out.push((name, size, align));
            if self.eat(')') {
                return Ok(out);
            }
            self.expect(',')?;
        }
    }

    fn operand(&mut self) -> Result<Raw, String> {
        if self.eat('[') {
            let base = if matches!(self.peek(), Some(Tok::Num(_)) | Some(Tok::P('-'))) {
                Raw::Num(self.num()?)
            } else {
                let n = self.id()?;
                if n.starts_with('%') {
                    Raw::Reg(n)
                } else {
                    Raw::Sym(n)
                }
            };
            let mut off = 0i64;
            // `[r+8]` or `[r+-4]` (num() reads the sign), or `[r-4]`.
            if self.eat('+') || matches!(self.peek(), Some(Tok::P('-'))) {
                off = self.num()? as i64;
            }
            self.expect(']')?;
            return Ok(Raw::Mem(Box::new(base), off));
        }
        if self.eat('{') {
            let mut v = Vec::new();
            loop {
                v.push(self.operand()?);
                if self.eat('}') {
                    return Ok(Raw::Vec(v));
                }
                self.expect(',')?;
            }
        }
        if self.eat('!') {
            return Ok(Raw::Not(Box::new(self.operand()?)));
        }
        if matches!(self.peek(), Some(Tok::Num(_)) | Some(Tok::P('-'))) {
            return Ok(Raw::Num(self.num()?));
        }
        let n = self.id()?;
        if n.starts_with('%') {
            if self.eat('|') {
                let p = self.id()?;
                return Ok(Raw::Pair(n, p));
            }
            Ok(Raw::Reg(n))
        } else if n == WARP_SZ {
            Ok(Raw::Num(32))
        } else {
            Ok(Raw::Sym(n))
        }
    }

    fn body(&mut self) -> Result<Vec<Stmt>, String> {
        let mut out = Vec::new();
        // Registers declared in a nested `{ }` scope (inline asm declares
        // `%r1` there, shadowing the function's `%r1`) get a name of their own.
        let mut scopes: Vec<HashMap<String, String>> = vec![HashMap::new()];
        let mut nscopes = 0usize;
        let rename = |scopes: &[HashMap<String, String>], mut ri: RawInst| -> RawInst {
            fn walk(r: &mut Raw, scopes: &[HashMap<String, String>]) {
                let look = |n: &mut String| {
                    if let Some(m) = scopes.iter().rev().find_map(|s| s.get(n.as_str())) {
                        *n = m.clone();
                    }
                };
                match r {
                    Raw::Reg(n) => look(n),
                    Raw::Pair(a, b) => {
                        look(a);
                        look(b);
                    }
                    Raw::Mem(b, _) | Raw::Not(b) => walk(b, scopes),
                    Raw::Vec(v) => v.iter_mut().for_each(|x| walk(x, scopes)),
                    Raw::Num(_) | Raw::Sym(_) => {}
                }
            }
            if scopes.len() > 1 {
                for a in &mut ri.args {
                    walk(a, scopes);
                }
                if let Some((p, _)) = &mut ri.guard {
                    if let Some(m) = scopes.iter().rev().find_map(|s| s.get(p.as_str())) {
                        *p = m.clone();
                    }
                }
            }
            ri
        };
        loop {
            let line = self.line();
            match self.next()? {
                Tok::P('{') => {
                    scopes.push(HashMap::new());
                }
                Tok::P('}') => {
                    scopes.pop();
                    if scopes.is_empty() {
                        return Ok(out);
                    }
                }
                Tok::P('@') => {
                    let neg = self.eat('!');
                    let p = self.id()?;
                    let op = self.id()?;
                    let ri = self.inst_rest(Some((p, neg)), op, line)?;
                    out.push(Stmt::Inst(rename(&scopes, ri)));
                }
                Tok::Id(s) if s == ".reg" => {
                    // Register widths matter where PTX extends a value into
                    // a wider register (a signed load sign-extends).
                    let nested = scopes.len() > 1;
                    if nested {
                        nscopes += 1;
                    }
                    let (mut width, mut names) = (4u32, Vec::new());
                    while !self.eat(';') {
                        if let Tok::Id(n) = self.next()? {
                            if let Some(t) = n.strip_prefix('.').and_then(Ty::parse) {
                                width = t.size().max(1);
                            } else if n.starts_with('%') && nested {
                                let unique = format!("{n}#{nscopes}");
                                scopes.last_mut().expect("internal: a scope").insert(n, unique.clone());
                                names.push(unique);
                            } else if n.starts_with('%') {
                                names.push(n);
                            }
                        }
                    }
                    out.push(Stmt::Regs(width, names));
                }
                Tok::Id(s) if s == ".pragma" || s == ".loc" || s == ".file" => self.skip_to_semi()?,
                Tok::Id(s) if s == ".param" => {
                    let (name, ty, count, align) = self.var_decl()?;
                    self.expect(';')?;
                    out.push(Stmt::Param(name, ty.size() * count.unwrap_or(1).max(1) as u32, align));
                }
                Tok::Id(s) if s == ".local" => {
                    let (name, ty, count, align) = self.var_decl()?;
                    self.expect(';')?;
                    out.push(Stmt::Local(name, ty.size() * count.unwrap_or(1).max(1) as u32, align));
                }
                Tok::Id(s) if s == ".shared" => {
                    // A "demoted" variable: a function-scope static __shared__.
                    let (name, ty, count, align) = self.var_decl()?;
                    self.expect(';')?;
                    out.push(Stmt::Shared(name, ty.size() * count.unwrap_or(1).max(1) as u32, align));
                }
                Tok::Id(s) => {
                    if self.eat(':') {
                        out.push(Stmt::Label(s));
                    } else {
                        let ri = self.inst_rest(None, s, line)?;
                        out.push(Stmt::Inst(rename(&scopes, ri)));
                    }
                }
                t => return Err(format!("line {line}: unexpected {t:?} in a function body")),
            }
        }
    }

    fn inst_rest(&mut self, guard: Option<(String, bool)>, op: String, line: u32) -> Result<RawInst, String> {
        let mut args = Vec::new();
        if op.starts_with("call") {
            // call(.uni)? ((ret),)? func, (args)?;
            if self.eat('(') {
                let r = self.id()?;
                self.expect(')')?;
                self.expect(',')?;
                args.push(Raw::Sym(r));
            } else {
                args.push(Raw::Num(u64::MAX));
            }
            let f = self.id()?;
            args.push(Raw::Sym(f));
            if self.eat(',') {
                self.expect('(')?;
                if !self.eat(')') {
                    loop {
                        let a = self.id()?;
                        args.push(Raw::Sym(a));
                        if self.eat(')') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
            }
            self.expect(';')?;
            return Ok(RawInst { guard, op, args, line });
        }
        if !self.eat(';') {
            loop {
                args.push(self.operand()?);
                if self.eat(';') {
                    break;
                }
                self.expect(',')?;
            }
        }
        Ok(RawInst { guard, op, args, line })
    }
}

pub(super) fn parse(src: &str) -> Result<(Vec<RawFunc>, Module), String> {
    let lexed = lex(src)?;
    let mut p = Parser { toks: lexed.toks, lines: lexed.lines, i: 0 };
    let mut funcs = Vec::new();
    let mut m = Module::default();
    while let Some(t) = p.peek().cloned() {
        let Tok::Id(s) = t else {
            return Err(format!("line {}: unexpected {t:?} at module scope", p.line()));
        };
        match s.as_str() {
            ".version" | ".target" | ".address_size" | ".file" | ".section" => {
                p.i += 1;
                // These directives end at the line's end, not at a semicolon.
                let l = p.lines[p.i - 1];
                while p.i < p.toks.len() && p.lines[p.i] == l {
                    p.i += 1;
                }
            }
            ".visible" | ".weak" | ".extern" => {
                p.i += 1;
                if s == ".extern" {
                    if let Some(Tok::Id(n)) = p.peek() {
                        if n == ".shared" {
                            p.i += 1;
                            let (name, _, _, _) = p.var_decl()?;
                            p.expect(';')?;
                            m.dyn_shared = Some(name);
                        }
                    }
                }
            }
            ".entry" | ".func" => {
                p.i += 1;
                let entry = s == ".entry";
                let ret =
                    if !entry && p.peek() == Some(&Tok::P('(')) { p.param_list()?.into_iter().next() } else { None };
                let name = p.id()?;
                let params = if p.peek() == Some(&Tok::P('(')) { p.param_list()? } else { Vec::new() };
                let mut maxntid = None;
                while let Some(Tok::Id(d)) = p.peek().cloned() {
                    p.i += 1;
                    let mut vals = vec![p.num()?];
                    while p.eat(',') {
                        vals.push(p.num()?);
                    }
                    if d == ".maxntid" || d == ".reqntid" {
                        maxntid = Some(vals.iter().product::<u64>() as u32);
                    }
                }
                let body = if p.eat(';') {
                    None
                } else {
                    p.expect('{')?;
                    Some(p.body()?)
                };
                funcs.push(RawFunc { name, entry, params, ret, body, maxntid });
            }
            ".global" | ".const" | ".shared" => {
                p.i += 1;
                let (name, ty, count, align) = p.var_decl()?;
                let n = count.unwrap_or(1) as usize;
                let esz = ty.size() as usize;
                let mut init = vec![0u8; n * esz];
                if p.eat('=') {
                    let mut vals = Vec::new();
                    if p.eat('{') {
                        loop {
                            vals.push(p.num()?);
                            if p.eat('}') {
                                break;
                            }
                            p.expect(',')?;
                        }
                    } else {
                        vals.push(p.num()?);
                    }
                    for (k, v) in vals.iter().enumerate().take(n) {
                        init[k * esz..(k + 1) * esz].copy_from_slice(&v.to_le_bytes()[..esz]);
                    }
                }
                p.expect(';')?;
                if s == ".shared" {
                    let off = m.shared_size.div_ceil(align) * align;
                    m.shared.push((name, off));
                    m.shared_size = off + init.len() as u32;
                } else {
                    let space = if s == ".global" { Space::Global } else { Space::Const };
                    m.globals.push(Global { name, space, align, init });
                }
            }
            _ => return Err(format!("line {}: unexpected {s} at module scope", p.line())),
        }
    }
    Ok((funcs, m))
}
