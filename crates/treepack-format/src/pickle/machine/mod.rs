//! The opcode interpreter: one loop over the stream, a stack of object ids, a memo, and an
//! arena of [`Obj`]s. Globals resolve through [`super::globals::lookup`]; applying one builds a
//! typed node from its arguments (`apply`, in calls.rs), never calls anything. The text inside
//! opcodes is decoded in literals.rs.

use super::globals::{AllowList, Global};
use super::{Id, Limits, Obj, Pickle, PickleError};
use crate::model::Int;
use num_bigint::BigInt;
use std::collections::HashMap;

mod calls;
use calls::Args;
mod literals;

use literals::{py2_string, raw_unicode_escape, string_literal};

type R<T> = Result<T, PickleError>;

/// Parse a `torch.save` pickle stream into its objects, refusing every global outside
/// [`AllowList::TorchSave`].
///
/// # Errors
/// A [`PickleError`] for a refused global, an opcode this reader does not interpret, a
/// truncated or malformed stream, or a limit exceeded.
pub fn parse(data: &[u8], limits: &Limits) -> R<Pickle> {
    parse_with(data, limits, AllowList::TorchSave)
}

/// Parse a pickle stream into its objects, refusing every global outside `allow` (the
/// caller's choice: what the file is expected to be decides, never the file).
///
/// # Errors
/// As [`parse`].
pub fn parse_with(data: &[u8], limits: &Limits, allow: AllowList) -> R<Pickle> {
    run(data, limits, allow, false)
}

/// Parse a `torch.save` pickle as [`parse`] does, except that a global outside
/// [`AllowList::TorchSave`] is not an error: it becomes an [`Obj::Refused`] naming it, and
/// whatever the stream makes by calling it (`REDUCE`, `NEWOBJ`, `OBJ`, `INST`) or setting its
/// state (`BUILD`), appending or setting items on it, is that placeholder again, its arguments
/// dropped and never interpreted. Nothing is imported or run either way; every other check and
/// limit holds as in [`parse`]. For loads that ask for placeholders (Python's
/// `on_missing="placeholder"`); the default stays [`parse`].
///
/// # Errors
/// As [`parse`], less [`PickleError::Refused`].
pub fn parse_placeholders(data: &[u8], limits: &Limits) -> R<Pickle> {
    run(data, limits, AllowList::TorchSave, true)
}

fn run(data: &[u8], limits: &Limits, allow: AllowList, placeholders: bool) -> R<Pickle> {
    let mut m = Machine {
        data,
        pos: 0,
        op_at: 0,
        limits,
        allow,
        placeholders,
        objects: vec![],
        stack: vec![],
        marks: vec![],
        memo: HashMap::new(),
    };
    let root = m.run()?;
    Ok(Pickle { objects: m.objects, root })
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Where the opcode being run starts.
    op_at: usize,
    limits: &'a Limits,
    /// The globals this parse may resolve.
    allow: AllowList,
    /// Refused globals become [`Obj::Refused`] placeholders instead of errors.
    placeholders: bool,
    objects: Vec<Obj>,
    stack: Vec<Id>,
    /// Stack lengths at each open `MARK`.
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

fn op_name(code: u8) -> &'static str {
    match code {
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x97 => "NEXT_BUFFER",
        b'P' => "PERSID",
        _ => "unknown",
    }
}

impl<'a> Machine<'a> {
    fn malformed(&self, reason: impl Into<String>) -> PickleError {
        PickleError::Malformed { offset: self.op_at, reason: reason.into() }
    }

    fn take(&mut self, n: u64, what: &'static str) -> R<&'a [u8]> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return Err(PickleError::Truncated { what, offset: self.op_at, needed: n, left });
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> R<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> R<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> R<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> R<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A text line (protocol 0), without its `\n`.
    fn line(&mut self, what: &'static str) -> R<&'a [u8]> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.pos += i + 1;
                Ok(&rest[..i])
            }
            None => Err(PickleError::Truncated {
                what,
                offset: self.op_at,
                needed: rest.len() as u64 + 1,
                left: rest.len() as u64,
            }),
        }
    }
    fn line_str(&mut self, what: &'static str) -> R<&'a str> {
        let l = self.line(what)?;
        std::str::from_utf8(l).map_err(|_| self.malformed(format!("{what} is not UTF-8")))
    }

    fn new_obj(&mut self, o: Obj) -> R<Id> {
        if self.objects.len() >= self.limits.max_objects {
            return Err(PickleError::Limit {
                what: "objects",
                limit: self.limits.max_objects as u64,
                detail: format!("at byte {}", self.op_at),
            });
        }
        self.objects.push(o);
        Ok((self.objects.len() - 1) as Id)
    }
    fn push(&mut self, o: Obj) -> R<()> {
        let id = self.new_obj(o)?;
        self.stack.push(id);
        Ok(())
    }
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }
    fn pop(&mut self) -> R<Id> {
        if self.stack.len() <= self.floor() {
            return Err(self.malformed("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.malformed("stack underflow"))
    }
    fn top(&self) -> R<Id> {
        if self.stack.len() <= self.floor() {
            return Err(self.malformed("stack underflow"));
        }
        self.stack.last().copied().ok_or_else(|| self.malformed("stack underflow"))
    }
    /// The items pushed since the last `MARK`, which is closed.
    fn pop_mark(&mut self) -> R<Vec<Id>> {
        let m = self.marks.pop().ok_or_else(|| self.malformed("no MARK to close"))?;
        if m > self.stack.len() {
            return Err(self.malformed("MARK above the stack"));
        }
        Ok(self.stack.split_off(m))
    }
    fn obj(&self, id: Id) -> &Obj {
        self.objects.get(id as usize).unwrap_or(&Obj::None)
    }
    fn memo_put(&mut self, idx: u64, id: Id) -> R<()> {
        if idx >= self.limits.max_memo
            || (self.memo.len() as u64 >= self.limits.max_memo && !self.memo.contains_key(&idx))
        {
            return Err(PickleError::Limit {
                what: "memo index",
                limit: self.limits.max_memo,
                detail: format!("index {idx} at byte {}", self.op_at),
            });
        }
        self.memo.insert(idx, id);
        Ok(())
    }
    fn memo_get(&mut self, idx: u64) -> R<()> {
        let id = *self.memo.get(&idx).ok_or_else(|| self.malformed(format!("memo index {idx} was never stored")))?;
        self.stack.push(id);
        Ok(())
    }

    /// The key path of the place being built: the dict keys and list indexes of the
    /// containers open on the stack.
    fn path(&self) -> String {
        let mut steps: Vec<String> = vec![];
        // Marks are stack lengths pushed in order, so they are sorted.
        let is_mark = |i: usize| self.marks.binary_search(&i).is_ok();
        let mut i = 0;
        while i < self.stack.len() {
            let o = self.obj(self.stack[i]);
            let dict = matches!(o, Obj::Dict { .. });
            let list = matches!(o, Obj::List(_));
            if dict || list {
                let start = i + 1;
                let with_mark = is_mark(start);
                let end = if with_mark {
                    let j = self.marks.partition_point(|&m| m <= start);
                    self.marks.get(j).copied().unwrap_or(self.stack.len())
                } else {
                    self.stack.len()
                };
                let count = end.saturating_sub(start);
                if count > 0 {
                    if dict {
                        let at = if with_mark { start + ((count - 1) & !1) } else { start };
                        steps.push(self.key_text(self.stack[at]));
                    } else if with_mark {
                        let before = match o {
                            Obj::List(v) => v.len(),
                            _ => 0,
                        };
                        // The items since the MARK are finished elements, but for a callable
                        // whose arguments are being built: that one is the element being made.
                        let pending = matches!(self.obj(self.stack[end - 1]), Obj::Global(_) | Obj::Refused(_));
                        steps.push((before + count - usize::from(pending)).to_string());
                    } else if let Obj::List(v) = o {
                        steps.push(v.len().to_string());
                    }
                }
            }
            i += 1;
        }
        if steps.is_empty() {
            "/".into()
        } else {
            steps.join("/")
        }
    }
    fn key_text(&self, id: Id) -> String {
        match self.obj(id) {
            Obj::Str(s) => s.chars().take(200).collect(),
            Obj::Int(i) => i.to_string(),
            Obj::Bool(b) => b.to_string(),
            Obj::None => "None".into(),
            o => format!("<{}>", o.type_name()),
        }
    }

    fn bad_call(&self, g: &Global, reason: impl Into<String>) -> PickleError {
        PickleError::BadCall { global: g.name(), path: self.path(), reason: reason.into() }
    }

    fn int_from_le(&mut self, b: &[u8]) -> R<Obj> {
        if b.len() > self.limits.max_int_bytes {
            return Err(PickleError::Limit {
                what: "integer size",
                limit: self.limits.max_int_bytes as u64,
                detail: format!("{} bytes at byte {}", b.len(), self.op_at),
            });
        }
        Ok(Obj::Int(Int::from_big(BigInt::from_signed_bytes_le(b))))
    }
    fn int_text(&self, s: &str) -> R<Obj> {
        let s = s.trim();
        let s = s.strip_suffix('L').unwrap_or(s);
        if s.len() > self.limits.max_int_bytes {
            return Err(PickleError::Limit {
                what: "integer size",
                limit: self.limits.max_int_bytes as u64,
                detail: format!("{} digits", s.len()),
            });
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        Int::parse(s).map(Obj::Int).ok_or_else(|| self.malformed(format!("bad integer literal {s:?}")))
    }

    fn run(&mut self) -> R<Id> {
        loop {
            self.op_at = self.pos;
            let code = self.u8("opcode")?;
            match code {
                b'.' => return self.pop(),
                0x80 => {
                    let v = self.u8("PROTO")?;
                    if v > 5 {
                        return Err(self.malformed(format!("pickle protocol {v} (this reader knows 0 to 5)")));
                    }
                }
                0x95 => {
                    let n = self.u64("FRAME")?;
                    let left = (self.data.len() - self.pos) as u64;
                    if n > left {
                        return Err(PickleError::Truncated { what: "FRAME", offset: self.op_at, needed: n, left });
                    }
                }
                b'(' => {
                    if self.marks.len() >= self.limits.max_depth {
                        return Err(PickleError::Limit {
                            what: "depth",
                            limit: self.limits.max_depth as u64,
                            detail: format!("nested MARKs at byte {}", self.op_at),
                        });
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    if self.stack.len() > self.floor() {
                        self.stack.pop();
                    } else {
                        self.pop_mark()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let t = self.top()?;
                    self.stack.push(t);
                }
                // Scalars.
                b'N' => self.push(Obj::None)?,
                0x88 => self.push(Obj::Bool(true))?,
                0x89 => self.push(Obj::Bool(false))?,
                b'J' => {
                    let v = self.u32("BININT")? as i32;
                    self.push(Obj::Int(Int::Small(v as i64)))?
                }
                b'K' => {
                    let v = self.u8("BININT1")?;
                    self.push(Obj::Int(Int::Small(v as i64)))?
                }
                b'M' => {
                    let v = self.u16("BININT2")?;
                    self.push(Obj::Int(Int::Small(v as i64)))?
                }
                0x8a => {
                    let n = self.u8("LONG1")? as u64;
                    let b = self.take(n, "LONG1")?;
                    let o = self.int_from_le(b)?;
                    self.push(o)?
                }
                0x8b => {
                    let n = self.u32("LONG4")? as i32;
                    if n < 0 {
                        return Err(self.malformed("LONG4 with a negative length"));
                    }
                    if n as usize > self.limits.max_int_bytes {
                        return Err(PickleError::Limit {
                            what: "integer size",
                            limit: self.limits.max_int_bytes as u64,
                            detail: format!("LONG4 of {n} bytes at byte {}", self.op_at),
                        });
                    }
                    let b = self.take(n as u64, "LONG4")?;
                    let o = self.int_from_le(b)?;
                    self.push(o)?
                }
                b'I' => {
                    let l = self.line_str("INT")?;
                    let o = match l {
                        "00" => Obj::Bool(false),
                        "01" => Obj::Bool(true),
                        s => self.int_text(s)?,
                    };
                    self.push(o)?
                }
                b'L' => {
                    let l = self.line_str("LONG")?;
                    let o = self.int_text(l)?;
                    self.push(o)?
                }
                b'G' => {
                    let b = self.take(8, "BINFLOAT")?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Obj::Float(f64::from_be_bytes(a)))?
                }
                b'F' => {
                    let l = self.line_str("FLOAT")?.trim();
                    let v: f64 = l
                        .parse()
                        .map_err(|_| self.malformed(format!("bad float literal {:?}", &l[..l.len().min(40)])))?;
                    self.push(Obj::Float(v))?
                }
                // Strings and bytes.
                b'X' => {
                    let n = self.u32("BINUNICODE")? as u64;
                    self.unicode(n, "BINUNICODE")?
                }
                0x8c => {
                    let n = self.u8("SHORT_BINUNICODE")? as u64;
                    self.unicode(n, "SHORT_BINUNICODE")?
                }
                0x8d => {
                    let n = self.u64("BINUNICODE8")?;
                    self.unicode(n, "BINUNICODE8")?
                }
                b'V' => {
                    let l = self.line("UNICODE")?;
                    let s = raw_unicode_escape(l).ok_or_else(|| self.malformed("bad raw-unicode-escape text"))?;
                    self.push(Obj::Str(s))?
                }
                b'B' => {
                    let n = self.u32("BINBYTES")? as u64;
                    let b = self.take(n, "BINBYTES")?.to_vec();
                    self.push(Obj::Bytes(b))?
                }
                b'C' => {
                    let n = self.u8("SHORT_BINBYTES")? as u64;
                    let b = self.take(n, "SHORT_BINBYTES")?.to_vec();
                    self.push(Obj::Bytes(b))?
                }
                0x8e => {
                    let n = self.u64("BINBYTES8")?;
                    let b = self.take(n, "BINBYTES8")?.to_vec();
                    self.push(Obj::Bytes(b))?
                }
                0x96 => {
                    let n = self.u64("BYTEARRAY8")?;
                    let b = self.take(n, "BYTEARRAY8")?.to_vec();
                    self.push(Obj::ByteArray(b))?
                }
                b'T' => {
                    let n = self.u32("BINSTRING")? as i32;
                    if n < 0 {
                        return Err(self.malformed("BINSTRING with a negative length"));
                    }
                    let b = self.take(n as u64, "BINSTRING")?;
                    self.push(py2_string(b))?
                }
                b'U' => {
                    let n = self.u8("SHORT_BINSTRING")? as u64;
                    let b = self.take(n, "SHORT_BINSTRING")?;
                    self.push(py2_string(b))?
                }
                b'S' => {
                    let l = self.line("STRING")?;
                    let b = string_literal(l).ok_or_else(|| self.malformed("bad STRING literal"))?;
                    self.push(py2_string(&b))?
                }
                0x98 => {
                    self.top()?;
                }
                // Containers.
                b')' => self.push(Obj::Tuple(vec![]))?,
                b']' => self.push(Obj::List(vec![]))?,
                b'}' => self.push(Obj::Dict { items: vec![], ordered: false, attrs: None })?,
                0x8f => self.push(Obj::Set { items: vec![], frozen: false })?,
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Obj::Tuple(items))?
                }
                0x85..=0x87 => {
                    let n = (code - 0x84) as usize;
                    let mut items = vec![0; n];
                    for slot in items.iter_mut().rev() {
                        *slot = self.pop()?;
                    }
                    self.push(Obj::Tuple(items))?
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Obj::List(items))?
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(&items)?;
                    self.push(Obj::Dict { items: pairs, ordered: false, attrs: None })?
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Obj::Set { items, frozen: true })?
                }
                b'a' => {
                    let v = self.pop()?;
                    let l = self.top()?;
                    self.extend(l, &[v])?
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    let l = self.top()?;
                    self.extend(l, &items)?
                }
                0x90 => {
                    let items = self.pop_mark()?;
                    let s = self.top()?;
                    match self.objects.get_mut(s as usize) {
                        Some(Obj::Set { items: v, frozen: false }) => v.extend(items),
                        _ => return Err(self.malformed(format!("ADDITEMS on a {}", self.obj(s).type_name()))),
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let d = self.top()?;
                    self.set_items(d, &[(k, v)])?
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(&items)?;
                    let d = self.top()?;
                    self.set_items(d, &pairs)?
                }
                // Memo.
                b'p' => {
                    let l = self.line_str("PUT")?;
                    let i: u64 = l.trim().parse().map_err(|_| self.malformed("bad PUT index"))?;
                    let t = self.top()?;
                    self.memo_put(i, t)?
                }
                b'q' => {
                    let i = self.u8("BINPUT")? as u64;
                    let t = self.top()?;
                    self.memo_put(i, t)?
                }
                b'r' => {
                    let i = self.u32("LONG_BINPUT")? as u64;
                    let t = self.top()?;
                    self.memo_put(i, t)?
                }
                0x94 => {
                    let i = self.memo.len() as u64;
                    let t = self.top()?;
                    self.memo_put(i, t)?
                }
                b'g' => {
                    let l = self.line_str("GET")?;
                    let i: u64 = l.trim().parse().map_err(|_| self.malformed("bad GET index"))?;
                    self.memo_get(i)?
                }
                b'h' => {
                    let i = self.u8("BINGET")? as u64;
                    self.memo_get(i)?
                }
                b'j' => {
                    let i = self.u32("LONG_BINGET")? as u64;
                    self.memo_get(i)?
                }
                // Globals and calls: resolved through the allow-list, applied as data.
                b'c' => {
                    let module = self.line_str("GLOBAL module")?;
                    let name = self.line_str("GLOBAL name")?;
                    let o = self.global_obj(module, name)?;
                    self.push(o)?
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Obj::Str(module), Obj::Str(name)) = (self.obj(module).clone(), self.obj(name).clone()) else {
                        return Err(self.malformed("STACK_GLOBAL of non-strings"));
                    };
                    let o = self.global_obj(&module, &name)?;
                    self.push(o)?
                }
                b'i' => {
                    let module = self.line_str("INST module")?;
                    let name = self.line_str("INST name")?;
                    let o = match self.global_obj(module, name)? {
                        Obj::Global(g) => {
                            let args = self.pop_mark()?;
                            self.apply(&g, &args)?
                        }
                        refused => {
                            self.pop_mark()?;
                            refused
                        }
                    };
                    self.push(o)?
                }
                b'o' => {
                    let mut args = self.pop_mark()?;
                    if args.is_empty() {
                        return Err(self.malformed("OBJ without a class"));
                    }
                    let cls = args.remove(0);
                    let o = self.call(cls, Args::Listed(args), None)?;
                    self.push(o)?
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let o = self.call(f, Args::Tuple(args), None)?;
                    self.push(o)?
                }
                0x92 => {
                    let kwargs = self.pop()?;
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let o = self.call(f, Args::Tuple(args), Some(kwargs))?;
                    self.push(o)?
                }
                b'b' => {
                    let state = self.pop()?;
                    let target = self.top()?;
                    self.build(target, state)?
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let o = self.persistent(pid)?;
                    self.push(o)?
                }
                b'P' | 0x82 | 0x83 | 0x84 | 0x97 => {
                    let reason = match code {
                        b'P' => "text persistent ids are not torch storages",
                        0x97 => "out-of-band buffers are not available to a file reader",
                        _ => "the extension registry (copyreg) names arbitrary globals",
                    };
                    return Err(PickleError::Opcode {
                        code,
                        name: op_name(code),
                        offset: self.op_at,
                        reason: reason.into(),
                    });
                }
                _ => {
                    return Err(PickleError::Opcode {
                        code,
                        name: "unknown",
                        offset: self.op_at,
                        reason: "not a pickle opcode of protocols 0 to 5".into(),
                    })
                }
            }
        }
    }

    fn unicode(&mut self, n: u64, what: &'static str) -> R<()> {
        let b = self.take(n, what)?;
        // Python writes surrogates with `surrogatepass`; a lone one is not text treepack can hold.
        let s = std::str::from_utf8(b).map_err(|_| self.malformed(format!("{what} is not valid UTF-8")))?.to_string();
        self.push(Obj::Str(s))
    }

    fn pairs(&self, items: &[Id]) -> R<Vec<(Id, Id)>> {
        if !items.len().is_multiple_of(2) {
            return Err(self.malformed("odd number of items for a dict"));
        }
        Ok(items.chunks_exact(2).map(|p| (p[0], p[1])).collect())
    }

    fn extend(&mut self, l: Id, items: &[Id]) -> R<()> {
        match self.objects.get_mut(l as usize) {
            Some(Obj::List(v)) => {
                v.extend_from_slice(items);
                Ok(())
            }
            // A placeholder's items (a list subclass of a refused class): dropped.
            Some(Obj::Refused(_)) => Ok(()),
            _ => Err(self.malformed(format!("APPEND to a {}, not a list", self.obj(l).type_name()))),
        }
    }

    fn set_items(&mut self, d: Id, pairs: &[(Id, Id)]) -> R<()> {
        // Repeated keys are settled when the tree is built (the later value replaces the
        // earlier one in its place, as in Python), through a hash map: no scan per item here.
        match self.objects.get_mut(d as usize) {
            Some(Obj::Dict { items, .. }) => {
                items.extend_from_slice(pairs);
                Ok(())
            }
            // A placeholder's items (a dict subclass of a refused class): dropped.
            Some(Obj::Refused(_)) => Ok(()),
            _ => Err(self.malformed(format!("SETITEM on a {}, not a dict", self.obj(d).type_name()))),
        }
    }
}
