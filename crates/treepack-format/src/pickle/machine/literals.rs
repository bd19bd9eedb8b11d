//! The text inside opcodes: Python 2 strings, `STRING` literals with Python's escapes, and
//! `raw-unicode-escape`.

use crate::pickle::Obj;

/// A Python 2 `str` (BINSTRING, STRING): text when it is UTF-8, else bytes.
pub(super) fn py2_string(b: &[u8]) -> Obj {
    match std::str::from_utf8(b) {
        Ok(s) => Obj::Str(s.to_string()),
        Err(_) => Obj::Bytes(b.to_vec()),
    }
}

/// The bytes of a `STRING` literal: `'...'` or `"..."` with Python's escapes.
pub(super) fn string_literal(l: &[u8]) -> Option<Vec<u8>> {
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
pub(super) fn raw_unicode_escape(l: &[u8]) -> Option<String> {
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
