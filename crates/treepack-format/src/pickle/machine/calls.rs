//! Calls, as data: an allowed global applied to its arguments builds a typed node (`apply`),
//! `BUILD` sets state on one, a persistent id names a storage — each argument checked, nothing
//! run.

use super::{Machine, R};
use crate::model::Int;
use crate::pickle::globals::{self, DcpClass, Global};
use crate::pickle::{Id, NumpyArray, NumpyObj, Obj, PickleError, Record, StorageRef, TensorObj};

/// The most parts a `pathlib` path is rebuilt from, and the most bytes of its text.
const MAX_PATH_PARTS: usize = 256;
const MAX_PATH_BYTES: usize = 4096;
/// The most fields a record's state may set.
const MAX_RECORD_FIELDS: usize = 64;

/// The arguments of a call: popped from the stack as they are (`OBJ`), or one tuple.
pub(super) enum Args {
    Listed(Vec<Id>),
    Tuple(Id),
}

impl Machine<'_> {
    pub(super) fn global(&self, module: &str, name: &str) -> R<Global> {
        globals::lookup(module, name, self.allow).ok_or_else(|| PickleError::Refused {
            global: format!("{}.{}", truncate(module), truncate(name)),
            path: self.path(),
            reads: self.allow.reads(),
        })
    }

    /// A global met by `GLOBAL`, `STACK_GLOBAL` or `INST`: the allowed one, or — when
    /// placeholders are asked for — an [`Obj::Refused`] naming one outside the list.
    pub(super) fn global_obj(&self, module: &str, name: &str) -> R<Obj> {
        match self.global(module, name) {
            Ok(g) => Ok(Obj::Global(g)),
            Err(PickleError::Refused { global, .. }) if self.placeholders => Ok(Obj::Refused(global)),
            Err(e) => Err(e),
        }
    }

    /// What calling `f` makes when `f` is a refused global's placeholder (or an object made
    /// from one): that placeholder again, its arguments never looked at.
    pub(super) fn refused(&self, f: Id) -> Option<Obj> {
        match self.obj(f) {
            Obj::Refused(name) => Some(Obj::Refused(name.clone())),
            _ => None,
        }
    }

    /// A call as data (`OBJ`, `REDUCE`, `NEWOBJ`, `NEWOBJ_EX`): a refused callable stays a
    /// placeholder, its arguments unread; an allowed global is applied to `args` (keyword
    /// arguments, where the opcode has them, must be none).
    pub(super) fn call(&mut self, f: Id, args: Args, kwargs: Option<Id>) -> R<Obj> {
        if let Some(r) = self.refused(f) {
            return Ok(r);
        }
        let g = self.callable(f)?;
        if let Some(kw) = kwargs {
            if !matches!(self.obj(kw), Obj::Dict { items, .. } if items.is_empty()) {
                return Err(self.bad_call(&g, "keyword arguments are not read"));
            }
        }
        let args = match args {
            Args::Listed(v) => v,
            Args::Tuple(t) => match self.obj(t) {
                Obj::Tuple(v) => v.clone(),
                _ => return Err(self.bad_call(&g, "arguments are not a tuple")),
            },
        };
        self.apply(&g, &args)
    }

    pub(super) fn callable(&self, f: Id) -> R<Global> {
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
    pub(super) fn apply(&mut self, g: &Global, args: &[Id]) -> R<Obj> {
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
                Obj::Dict { items, ordered: true, attrs: None }
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
            Global::Dcp(_) => {
                // `copyreg.__newobj__(cls)`: an empty instance, its fields set by `BUILD`.
                if !args.is_empty() {
                    return Err(self.bad_call(
                        g,
                        "is read as a record made empty and filled by its state (BUILD), not called with arguments",
                    ));
                }
                Obj::Record(Record { class: g.clone(), fields: vec![], built: false })
            }
            Global::DcpMemFormat => {
                self.arity(g, args, 1..=1)?;
                let v = self.int_arg(g, args[0], "the member's value")?;
                if v > 2 {
                    return Err(self.bad_call(g, format!("has no member {v} (0, 1 and 2 are its members)")));
                }
                Obj::Record(Record { class: g.clone(), fields: vec![("value".into(), args[0])], built: true })
            }
            Global::TorchLayout => {
                self.arity(g, args, 1..=1)?;
                let name = self.str_arg(g, args[0], "the layout's name")?;
                if name.len() > 64 {
                    return Err(self.bad_call(g, "layout name longer than 64 bytes"));
                }
                Obj::Record(Record { class: g.clone(), fields: vec![("name".into(), args[0])], built: true })
            }
            Global::Path { windows } => {
                // `PurePosixPath(*parts)`, joined as pathlib joins them: a part that is rooted
                // (`/x`; on Windows `\\x`, `C:...`) starts over.
                if args.len() > MAX_PATH_PARTS {
                    return Err(self.bad_call(g, format!("made of {} parts (at most {MAX_PATH_PARTS})", args.len())));
                }
                let sep = if *windows { '\\' } else { '/' };
                let mut text = String::new();
                for &a in args {
                    let part = self.str_arg(g, a, "a part of the path")?;
                    let rooted = part.starts_with(sep) || (*windows && (part.starts_with('/') || part.contains(':')));
                    if rooted {
                        text.clear();
                    } else if !text.is_empty() && !text.ends_with(sep) {
                        text.push(sep);
                    }
                    text.push_str(&part);
                    if text.len() > MAX_PATH_BYTES {
                        return Err(self.bad_call(g, format!("a path longer than {MAX_PATH_BYTES} bytes")));
                    }
                }
                Obj::Str(text)
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

    /// `BUILD`: set the state of what is on the stack. Only numpy arrays, dtypes, an
    /// `OrderedDict`'s attributes (a state_dict's `_metadata`, kept) and records (DCP's
    /// metadata, under its allow-list only) are read.
    pub(super) fn build(&mut self, target: Id, state: Id) -> R<()> {
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
            Obj::Dict { ordered: true, attrs: None, .. } => match self.obj(state) {
                Obj::None => Ok(()),
                Obj::Dict { items, .. } if items.is_empty() => Ok(()),
                Obj::Dict { items, .. } => {
                    if !items.iter().all(|&(k, _)| matches!(self.obj(k), Obj::Str(_))) {
                        return Err(self.build_err("OrderedDict", "its attributes are not named by strings"));
                    }
                    if let Obj::Dict { attrs, .. } = &mut self.objects[target as usize] {
                        *attrs = Some(state);
                    }
                    Ok(())
                }
                _ => Err(self.build_err("OrderedDict", "state is not a dict of attributes")),
            },
            Obj::Record(r) => self.build_record(target, r, state),
            // A refused class's instance (placeholders only): its state is dropped, unread.
            Obj::Refused(_) => Ok(()),
            o => Err(self.build_err(o.type_name(), "BUILD (__setstate__) is only read for numpy arrays and dtypes")),
        }
    }

    /// `BUILD` on a record: its `__dict__` (a dict of field names), a slots state
    /// `(dict or None, dict)`, or — for `TensorProperties` — the tuple its `__getstate__` makes.
    fn build_record(&mut self, target: Id, r: Record, state: Id) -> R<()> {
        let what = r.class.name();
        if r.built {
            return Err(self.build_err(&what, "its state is set twice (BUILD of a record already built)"));
        }
        let Global::Dcp(class) = r.class else {
            return Err(self.build_err(&what, "has no state to set"));
        };
        let mut fields = vec![];
        match self.obj(state).clone() {
            Obj::Dict { items, ordered: false, attrs: None } => self.named_fields(&what, &items, &mut fields)?,
            Obj::Tuple(t) if class == DcpClass::TensorProperties && matches!(t.len(), 5 | 6) => {
                const NAMES: [&str; 6] = ["dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides"];
                fields.extend(NAMES.iter().zip(&t).map(|(n, &v)| (n.to_string(), v)));
            }
            Obj::Tuple(t) if t.len() == 2 => {
                // `(__dict__ or None, slots)`, as `copyreg` pickles a class with `__slots__`.
                for &part in &t {
                    match self.obj(part).clone() {
                        Obj::None => {}
                        Obj::Dict { items, ordered: false, attrs: None } => {
                            self.named_fields(&what, &items, &mut fields)?
                        }
                        o => {
                            return Err(self.build_err(
                                &what,
                                &format!("state (dict, slots) holds a {}, not a dict of fields", o.type_name()),
                            ))
                        }
                    }
                }
            }
            Obj::None => {}
            o => return Err(self.build_err(&what, &format!("state is a {}, not a dict of its fields", o.type_name()))),
        }
        self.objects[target as usize] = Obj::Record(Record { class: r.class, fields, built: true });
        Ok(())
    }

    fn named_fields(&self, what: &str, items: &[(Id, Id)], out: &mut Vec<(String, Id)>) -> R<()> {
        // DCP's dataclasses have at most 6 fields: a bigger state is not theirs (and copying it
        // into every record sharing it would multiply it).
        if out.len() + items.len() > MAX_RECORD_FIELDS {
            return Err(self.build_err(what, &format!("a state of more than {MAX_RECORD_FIELDS} fields")));
        }
        for &(k, v) in items {
            match self.obj(k) {
                Obj::Str(name) if name.len() <= 200 => out.push((name.clone(), v)),
                _ => return Err(self.build_err(what, "its fields are not named by short strings")),
            }
        }
        Ok(())
    }
    fn build_err(&self, what: &str, reason: &str) -> PickleError {
        PickleError::BadCall { global: what.into(), path: self.path(), reason: reason.into() }
    }

    /// `BINPERSID`: torch's `('storage', storage_type, key, location, numel)`.
    pub(super) fn persistent(&mut self, pid: Id) -> R<Obj> {
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
