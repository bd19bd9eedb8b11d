//! The opcode interpreter: one loop over the stream, a stack of object ids, a memo, and an
//! arena of [`Obj`]s. Globals resolve through [`globals::lookup`]; applying one builds a typed
//! node from its arguments (`apply`), never calls anything.

use super::globals::{self, Global};
use super::{Id, Limits, NumpyArray, NumpyObj, Obj, Pickle, PickleError, StorageRef, TensorObj};
use crate::model::Int;
use num_bigint::BigInt;
use std::collections::HashMap;

type R<T> = Result<T, PickleError>;

/// Parse a pickle stream into its objects, refusing every global outside the allow-list.
///
/// # Errors
/// A [`PickleError`] for a refused global, an opcode this reader does not interpret, a
/// truncated or malformed stream, or a limit exceeded.
pub fn parse(data: &[u8], limits: &Limits) -> R<Pickle> {
    let mut m =
        Machine { data, pos: 0, op_at: 0, limits, objects: vec![], stack: vec![], marks: vec![], memo: HashMap::new() };
    let root = m.run()?;
    Ok(Pickle { objects: m.objects, root })
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Where the opcode being run starts.
    op_at: usize,
    limits: &'a Limits,
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
                        let pending = matches!(self.obj(self.stack[end - 1]), Obj::Global(_));
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
                b'}' => self.push(Obj::Dict { items: vec![], ordered: false })?,
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
                    self.push(Obj::Dict { items: pairs, ordered: false })?
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
                    let g = self.global(module, name)?;
                    self.push(Obj::Global(g))?
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Obj::Str(module), Obj::Str(name)) = (self.obj(module).clone(), self.obj(name).clone()) else {
                        return Err(self.malformed("STACK_GLOBAL of non-strings"));
                    };
                    let g = self.global(&module, &name)?;
                    self.push(Obj::Global(g))?
                }
                b'i' => {
                    let module = self.line_str("INST module")?;
                    let name = self.line_str("INST name")?;
                    let g = self.global(module, name)?;
                    let args = self.pop_mark()?;
                    let o = self.apply(&g, &args)?;
                    self.push(o)?
                }
                b'o' => {
                    let mut args = self.pop_mark()?;
                    if args.is_empty() {
                        return Err(self.malformed("OBJ without a class"));
                    }
                    let cls = args.remove(0);
                    let g = self.callable(cls)?;
                    let o = self.apply(&g, &args)?;
                    self.push(o)?
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let g = self.callable(f)?;
                    let Obj::Tuple(args) = self.obj(args).clone() else {
                        return Err(self.bad_call(&g, "arguments are not a tuple"));
                    };
                    let o = self.apply(&g, &args)?;
                    self.push(o)?
                }
                0x92 => {
                    let kwargs = self.pop()?;
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let g = self.callable(f)?;
                    match self.obj(kwargs) {
                        Obj::Dict { items, .. } if items.is_empty() => {}
                        _ => return Err(self.bad_call(&g, "keyword arguments are not read")),
                    }
                    let Obj::Tuple(args) = self.obj(args).clone() else {
                        return Err(self.bad_call(&g, "arguments are not a tuple"));
                    };
                    let o = self.apply(&g, &args)?;
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
            _ => Err(self.malformed(format!("SETITEM on a {}, not a dict", self.obj(d).type_name()))),
        }
    }

    fn global(&self, module: &str, name: &str) -> R<Global> {
        globals::lookup(module, name).ok_or_else(|| PickleError::Refused {
            global: format!("{}.{}", truncate(module), truncate(name)),
            path: self.path(),
        })
    }

    fn callable(&self, f: Id) -> R<Global> {
        match self.obj(f) {
            Obj::Global(g) => Ok(g.clone()),
            o => Err(PickleError::BadCall {
                global: o.type_name().into(),
                path: self.path(),
                reason: "only allowed globals are called (as data)".into(),
            }),
        }
    }

    fn int_arg(&self, g: &Global, id: Id, what: &str) -> R<u64> {
        match self.obj(id) {
            Obj::Int(Int::Small(v)) if *v >= 0 => Ok(*v as u64),
            Obj::Bool(b) => Ok(*b as u64),
            o => Err(self.bad_call(g, format!("{what} must be a non-negative integer, not {}", describe(o)))),
        }
    }
    fn ints_arg(&self, g: &Global, id: Id, what: &str) -> R<Vec<u64>> {
        let ids = match self.obj(id) {
            Obj::Tuple(v) | Obj::List(v) => v.clone(),
            Obj::Size(v) => return Ok(v.clone()),
            o => return Err(self.bad_call(g, format!("{what} must be a tuple of integers, not a {}", o.type_name()))),
        };
        if ids.len() > 64 {
            return Err(self.bad_call(g, format!("{what} has {} dimensions (at most 64)", ids.len())));
        }
        ids.iter().map(|&i| self.int_arg(g, i, what)).collect()
    }
    fn bool_arg(&self, g: &Global, id: Id, what: &str) -> R<bool> {
        match self.obj(id) {
            Obj::Bool(b) => Ok(*b),
            Obj::Int(Int::Small(v)) => Ok(*v != 0),
            o => Err(self.bad_call(g, format!("{what} must be a bool, not a {}", o.type_name()))),
        }
    }
    fn str_arg(&self, g: &Global, id: Id, what: &str) -> R<String> {
        match self.obj(id) {
            Obj::Str(s) => Ok(s.clone()),
            o => Err(self.bad_call(g, format!("{what} must be a str, not a {}", o.type_name()))),
        }
    }
    fn float_arg(&self, g: &Global, id: Id) -> R<f64> {
        match self.obj(id) {
            Obj::Float(f) => Ok(*f),
            Obj::Int(Int::Small(v)) => Ok(*v as f64),
            Obj::Bool(b) => Ok(*b as u8 as f64),
            o => Err(self.bad_call(g, format!("takes numbers, not a {}", o.type_name()))),
        }
    }
    fn items_arg(&self, g: &Global, id: Id) -> R<Vec<Id>> {
        match self.obj(id) {
            Obj::List(v) | Obj::Tuple(v) | Obj::Set { items: v, .. } => Ok(v.clone()),
            o => Err(self.bad_call(g, format!("takes a list, tuple or set, not a {}", o.type_name()))),
        }
    }
    fn arity(&self, g: &Global, args: &[Id], allowed: std::ops::RangeInclusive<usize>) -> R<()> {
        if allowed.contains(&args.len()) {
            Ok(())
        } else {
            Err(self.bad_call(
                g,
                format!("called with {} arguments (takes {} to {})", args.len(), allowed.start(), allowed.end()),
            ))
        }
    }
    fn tensor_arg(&self, g: &Global, id: Id) -> R<TensorObj> {
        match self.obj(id) {
            Obj::Tensor(t) => Ok(t.clone()),
            o => Err(self.bad_call(g, format!("takes a tensor, not a {}", o.type_name()))),
        }
    }

    /// What calling the allowed global `g` with `args` makes, as data.
    fn apply(&mut self, g: &Global, args: &[Id]) -> R<Obj> {
        Ok(match g {
            Global::RebuildTensorV2 | Global::RebuildTensor => {
                if *g == Global::RebuildTensorV2 {
                    self.arity(g, args, 6..=7)?;
                } else {
                    self.arity(g, args, 4..=4)?;
                }
                if !matches!(self.obj(args[0]), Obj::Storage(_)) {
                    return Err(self.bad_call(g, format!("takes a storage, not a {}", self.obj(args[0]).type_name())));
                }
                let offset = self.int_arg(g, args[1], "the storage offset")?;
                let shape = self.ints_arg(g, args[2], "the size")?;
                let stride = self.ints_arg(g, args[3], "the stride")?;
                if shape.len() != stride.len() {
                    return Err(self.bad_call(g, format!("size {shape:?} and stride {stride:?} differ in length")));
                }
                let requires_grad = if args.len() > 4 { self.bool_arg(g, args[4], "requires_grad")? } else { false };
                if args.len() > 5 {
                    self.check_hooks(g, args[5])?;
                }
                Obj::Tensor(TensorObj { storage: args[0], offset, shape, stride, requires_grad, parameter: false })
            }
            Global::RebuildParameter | Global::RebuildParameterWithState => {
                if *g == Global::RebuildParameter {
                    self.arity(g, args, 3..=3)?;
                } else {
                    self.arity(g, args, 4..=4)?;
                }
                let mut t = self.tensor_arg(g, args[0])?;
                t.requires_grad = self.bool_arg(g, args[1], "requires_grad")?;
                self.check_hooks(g, args[2])?;
                t.parameter = true;
                Obj::Tensor(t)
            }
            Global::RebuildFromTypeV2 => {
                self.arity(g, args, 4..=4)?;
                let func = self.callable(args[0])?;
                if !matches!(
                    func,
                    Global::RebuildTensorV2
                        | Global::RebuildTensor
                        | Global::RebuildParameter
                        | Global::RebuildParameterWithState
                ) {
                    return Err(
                        self.bad_call(g, format!("rebuilds with {}, not a tensor rebuild function", func.name()))
                    );
                }
                let parameter = match self.obj(args[1]) {
                    Obj::Global(Global::TensorClass { parameter }) => *parameter,
                    o => {
                        return Err(self.bad_call(
                            g,
                            format!("new type must be torch.Tensor or torch.nn.Parameter, not {}", describe(o)),
                        ))
                    }
                };
                let Obj::Tuple(inner) = self.obj(args[2]).clone() else {
                    return Err(self.bad_call(g, "arguments are not a tuple"));
                };
                match self.obj(args[3]) {
                    Obj::None => {}
                    Obj::Dict { items, .. } if items.is_empty() => {}
                    _ => return Err(self.bad_call(g, "a tensor with attributes (state) is not read")),
                }
                let mut o = self.apply(&func, &inner)?;
                if let Obj::Tensor(t) = &mut o {
                    t.parameter |= parameter;
                }
                o
            }
            Global::OrderedDict => {
                self.arity(g, args, 0..=1)?;
                let mut items = vec![];
                if let Some(&a) = args.first() {
                    for p in self.items_arg(g, a)? {
                        match self.obj(p) {
                            Obj::Tuple(kv) | Obj::List(kv) if kv.len() == 2 => items.push((kv[0], kv[1])),
                            _ => return Err(self.bad_call(g, "takes (key, value) pairs")),
                        }
                    }
                }
                Obj::Dict { items, ordered: true }
            }
            Global::Set { frozen } => {
                self.arity(g, args, 0..=1)?;
                let items = match args.first() {
                    Some(&a) => self.items_arg(g, a)?,
                    None => vec![],
                };
                Obj::Set { items, frozen: *frozen }
            }
            Global::Slice => {
                self.arity(g, args, 1..=3)?;
                let none = self.new_obj(Obj::None)?;
                match *args {
                    [stop] => Obj::Slice(none, stop, none),
                    [start, stop] => Obj::Slice(start, stop, none),
                    [start, stop, step] => Obj::Slice(start, stop, step),
                    _ => return Err(self.bad_call(g, "takes 1 to 3 arguments")),
                }
            }
            Global::Complex => {
                self.arity(g, args, 0..=2)?;
                let re = match args.first() {
                    Some(&a) => self.float_arg(g, a)?,
                    None => 0.0,
                };
                let im = match args.get(1) {
                    Some(&a) => self.float_arg(g, a)?,
                    None => 0.0,
                };
                Obj::Complex(re, im)
            }
            Global::ByteArray => {
                self.arity(g, args, 0..=2)?;
                match args {
                    [] => Obj::ByteArray(vec![]),
                    [a] => match self.obj(*a) {
                        Obj::Bytes(b) | Obj::ByteArray(b) => Obj::ByteArray(b.clone()),
                        o => return Err(self.bad_call(g, format!("takes bytes, not a {}", o.type_name()))),
                    },
                    [s, enc] => {
                        let s = self.str_arg(g, *s, "the text")?;
                        let enc = self.str_arg(g, *enc, "the encoding")?;
                        Obj::ByteArray(encode(&s, &enc).ok_or_else(|| self.bad_call(g, format!("encoding {enc:?}")))?)
                    }
                    _ => return Err(self.bad_call(g, "takes at most 2 arguments")),
                }
            }
            Global::CodecsEncode => {
                self.arity(g, args, 2..=2)?;
                let s = self.str_arg(g, args[0], "the text")?;
                let enc = self.str_arg(g, args[1], "the encoding")?;
                Obj::Bytes(
                    encode(&s, &enc)
                        .ok_or_else(|| self.bad_call(g, format!("encoding {enc:?} (latin1 and utf-8 are read)")))?,
                )
            }
            Global::TorchSize => {
                self.arity(g, args, 0..=1)?;
                match args.first() {
                    Some(&a) => Obj::Size(self.ints_arg(g, a, "the size")?),
                    None => Obj::Size(vec![]),
                }
            }
            Global::TorchDevice => {
                self.arity(g, args, 1..=2)?;
                let kind = self.str_arg(g, args[0], "the device type")?;
                if kind.len() > 64 {
                    return Err(self.bad_call(g, "device name longer than 64 bytes"));
                }
                match args.get(1).map(|&a| self.obj(a)) {
                    None | Some(Obj::None) => Obj::Device(kind),
                    Some(Obj::Int(i)) => Obj::Device(format!("{kind}:{i}")),
                    Some(o) => {
                        return Err(self.bad_call(g, format!("device index must be an int, not a {}", o.type_name())))
                    }
                }
            }
            Global::NumpyReconstruct => {
                self.arity(g, args, 3..=3)?;
                if !matches!(self.obj(args[0]), Obj::Global(Global::NumpyNdarray)) {
                    return Err(
                        self.bad_call(g, format!("rebuilds {}, not numpy.ndarray", describe(self.obj(args[0]))))
                    );
                }
                Obj::Numpy(NumpyObj::Array(None))
            }
            Global::NumpyDtype => {
                self.arity(g, args, 1..=3)?;
                let descr = self.str_arg(g, args[0], "the dtype")?;
                if descr.len() > 32 {
                    return Err(self.bad_call(g, "dtype text longer than 32 bytes"));
                }
                Obj::Numpy(NumpyObj::Dtype { descr, order: None })
            }
            Global::NumpyScalar => {
                self.arity(g, args, 2..=2)?;
                if !matches!(self.obj(args[0]), Obj::Numpy(NumpyObj::Dtype { .. })) {
                    return Err(self.bad_call(g, "takes a numpy dtype"));
                }
                let data = match self.obj(args[1]) {
                    Obj::Bytes(b) => b.clone(),
                    o => {
                        return Err(self.bad_call(
                            g,
                            format!("takes the value's bytes, not a {} (object scalars are not read)", o.type_name()),
                        ))
                    }
                };
                Obj::Numpy(NumpyObj::Scalar { dtype: args[0], data })
            }
            Global::TensorClass { .. } | Global::StorageType(_) | Global::TorchDtype(_) | Global::NumpyNdarray => {
                return Err(
                    self.bad_call(g, "is not called by this reader (a class or value, not a constructor it reads)")
                );
            }
        })
    }

    /// Backward hooks must be an empty dict: hooks are code.
    fn check_hooks(&self, g: &Global, id: Id) -> R<()> {
        match self.obj(id) {
            Obj::Dict { items, .. } if items.is_empty() => Ok(()),
            Obj::None => Ok(()),
            _ => Err(self.bad_call(g, "backward hooks are code: a tensor saved with hooks is not read")),
        }
    }

    /// `BUILD`: set the state of what is on the stack. Only numpy arrays and dtypes take a
    /// state; an `OrderedDict`'s attributes (a state_dict's `_metadata`) are dropped.
    fn build(&mut self, target: Id, state: Id) -> R<()> {
        match self.obj(target).clone() {
            Obj::Numpy(NumpyObj::Dtype { descr, order: None }) => {
                let Obj::Tuple(st) = self.obj(state).clone() else {
                    return Err(self.build_err("numpy.dtype", "state is not a tuple"));
                };
                let order = match st.get(1).map(|&i| self.obj(i)) {
                    Some(Obj::Str(s)) if matches!(s.as_str(), "<" | ">" | "|" | "=") => s.chars().next(),
                    _ => return Err(self.build_err("numpy.dtype", "state has no byte order")),
                };
                // Structured dtypes (fields) are not read.
                if let Some(&f) = st.get(3) {
                    if !matches!(self.obj(f), Obj::None) {
                        return Err(self.build_err("numpy.dtype", "structured dtypes are not read"));
                    }
                }
                self.objects[target as usize] = Obj::Numpy(NumpyObj::Dtype { descr, order });
                Ok(())
            }
            Obj::Numpy(NumpyObj::Array(None)) => {
                let Obj::Tuple(st) = self.obj(state).clone() else {
                    return Err(self.build_err("numpy.ndarray", "state is not a tuple"));
                };
                let [_version, shape, dtype, fortran, raw] = st[..] else {
                    return Err(
                        self.build_err("numpy.ndarray", "state is not (version, shape, dtype, is_fortran, data)")
                    );
                };
                let g = Global::NumpyReconstruct;
                let shape = self.ints_arg(&g, shape, "the shape")?;
                if !matches!(self.obj(dtype), Obj::Numpy(NumpyObj::Dtype { .. })) {
                    return Err(self.build_err("numpy.ndarray", "its dtype is not a numpy dtype"));
                }
                let fortran = self.bool_arg(&g, fortran, "is_fortran")?;
                let data = match self.obj(raw) {
                    Obj::Bytes(b) | Obj::ByteArray(b) => b.clone(),
                    o => {
                        return Err(self.build_err(
                            "numpy.ndarray",
                            &format!("data is a {} (object arrays are not read)", o.type_name()),
                        ))
                    }
                };
                self.objects[target as usize] =
                    Obj::Numpy(NumpyObj::Array(Some(NumpyArray { shape, dtype, fortran, data })));
                Ok(())
            }
            Obj::Dict { ordered: true, .. } => match self.obj(state) {
                Obj::Dict { .. } | Obj::None => Ok(()),
                _ => Err(self.build_err("OrderedDict", "state is not a dict of attributes")),
            },
            o => Err(self.build_err(o.type_name(), "BUILD (__setstate__) is only read for numpy arrays and dtypes")),
        }
    }
    fn build_err(&self, what: &str, reason: &str) -> PickleError {
        PickleError::BadCall { global: what.into(), path: self.path(), reason: reason.into() }
    }

    /// `BINPERSID`: torch's `('storage', storage_type, key, location, numel)`.
    fn persistent(&mut self, pid: Id) -> R<Obj> {
        let bad =
            |m: &Self, r: String| PickleError::BadCall { global: "persistent id".into(), path: m.path(), reason: r };
        let Obj::Tuple(t) = self.obj(pid).clone() else {
            return Err(bad(self, format!("a {}, not a torch storage tuple", self.obj(pid).type_name())));
        };
        let [tag, ty, key, location, numel] = t[..] else {
            return Err(bad(
                self,
                format!("a tuple of {} items, not ('storage', type, key, location, numel)", t.len()),
            ));
        };
        if !matches!(self.obj(tag), Obj::Str(s) if s == "storage") {
            return Err(bad(self, "only 'storage' persistent ids are read".into()));
        }
        let dtype = match self.obj(ty) {
            Obj::Global(Global::StorageType(d)) => d.clone(),
            o => return Err(bad(self, format!("storage type is {}, not a torch storage class", describe(o)))),
        };
        let key = match self.obj(key) {
            Obj::Str(s)
                if !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                s.clone()
            }
            _ => return Err(bad(self, "storage key is not a short name of letters, digits and _".into())),
        };
        let location = match self.obj(location) {
            Obj::Str(s) if s.len() <= 64 => s.clone(),
            _ => return Err(bad(self, "storage location is not a short str".into())),
        };
        let numel = match self.obj(numel) {
            Obj::Int(Int::Small(v)) if *v >= 0 => *v as u64,
            _ => return Err(bad(self, "storage length is not a non-negative integer".into())),
        };
        Ok(Obj::Storage(StorageRef { dtype, key, location, numel }))
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

fn describe(o: &Obj) -> String {
    match o {
        Obj::Global(g) => g.name(),
        Obj::Int(i) => format!("int {i}"),
        o => format!("a {}", o.type_name()),
    }
}

/// `str.encode(enc)` for the encodings protocol 2 uses for bytes.
fn encode(s: &str, enc: &str) -> Option<Vec<u8>> {
    match enc.to_ascii_lowercase().replace('_', "-").as_str() {
        "latin1" | "latin-1" | "iso-8859-1" | "iso8859-1" => s.chars().map(|c| u8::try_from(c as u32).ok()).collect(),
        "utf-8" | "utf8" => Some(s.as_bytes().to_vec()),
        "ascii" => s.chars().map(|c| if c.is_ascii() { Some(c as u8) } else { None }).collect(),
        _ => None,
    }
}

/// A Python 2 `str` (BINSTRING, STRING): text when it is UTF-8, else bytes.
fn py2_string(b: &[u8]) -> Obj {
    match std::str::from_utf8(b) {
        Ok(s) => Obj::Str(s.to_string()),
        Err(_) => Obj::Bytes(b.to_vec()),
    }
}

/// The bytes of a `STRING` literal: `'...'` or `"..."` with Python's escapes.
fn string_literal(l: &[u8]) -> Option<Vec<u8>> {
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    if l.len() < 2 || l[0] != l[l.len() - 1] || !matches!(l[0], b'\'' | b'"') {
        return None;
    }
    let body = &l[1..l.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\\' | b'\'' | b'"' => out.push(e),
            b'\n' => {}
            b'x' => {
                let h = body.get(i..i + 2)?;
                out.push(u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                for _ in 0..2 {
                    match body.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + (d - b'0') as u32;
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

/// `raw-unicode-escape`: bytes are Latin-1 characters, except `\uXXXX` and `\UXXXXXXXX`.
fn raw_unicode_escape(l: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(l.len());
    let mut i = 0;
    while i < l.len() {
        let c = l[i];
        if c == b'\\' && matches!(l.get(i + 1), Some(b'u') | Some(b'U')) {
            let n = if l[i + 1] == b'u' { 4 } else { 8 };
            let h = l.get(i + 2..i + 2 + n)?;
            let v = u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
            out.push(char::from_u32(v)?);
            i += 2 + n;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    Some(out)
}
