//! Key paths name a node in a tree: `params/dense/kernel`, `layers/0`.
//!
//! Syntax (see docs/format.md, "Key paths"):
//! - Segments are joined by `/`. The root is the empty path.
//! - List and tuple items are decimal indices; record fields, custom children and string dict
//!   keys are their text, with `~` written `~0`, `/` written `~1`, `*` written `~2`, and the
//!   empty string written `~e`.
//! - Other dict keys are typed: `~i42` (int), `~f1.5` / `~fnan` (float), `~true`, `~false`,
//!   `~none`, and tuples `~t(a,~i1)` whose string items also escape `,` `(` `)` as `~3` `~4` `~5`.
//! - Globs: `*` matches any text within one segment, `**` matches any number of segments.
//!   A selection pattern also selects everything below the node it matches.

use crate::error::{Error, Result};
use crate::model::{Int, Key, Step, Tree};
use std::fmt;

/// One step of a key path, as stored in a tree walk.
#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    /// Position of an item in a list or tuple.
    Index(usize),
    /// Key of a dict entry (any key type, not only strings).
    Key(Key),
    /// Name of a record field or a custom node's child.
    Name(String),
}

impl Segment {
    pub(crate) fn from_step(s: &Step<'_>) -> Segment {
        match s {
            Step::Index(i) => Segment::Index(*i),
            Step::Key(k) => Segment::Key((*k).clone()),
            Step::Name(n) => Segment::Name(n.to_string()),
        }
    }

    /// The segment for one step of a tree walk (see [`crate::model::Tree::children`]).
    pub fn from_step_pub(s: &Step<'_>) -> Segment {
        Segment::from_step(s)
    }

    /// The escaped text form of this segment.
    pub fn text(&self) -> String {
        match self {
            Segment::Index(i) => i.to_string(),
            Segment::Name(n) => escape_str(n, false),
            Segment::Key(k) => key_text(k, false),
        }
    }
}

/// The escaped text of a path given as borrowed steps (see [`Tree::for_each_leaf_steps`]):
/// the same text as the [`KeyPath`] of those steps.
pub fn steps_text(steps: &[Step<'_>]) -> String {
    let mut out = String::new();
    for (i, s) in steps.iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        push_step_text(&mut out, s);
    }
    out
}

/// Append the escaped text of one step to `out` (no separator). Building the paths of 100k
/// leaves this way allocates nothing per step.
pub fn push_step_text(out: &mut String, step: &Step<'_>) {
    match step {
        Step::Index(i) => {
            use std::fmt::Write;
            let _ = write!(out, "{i}");
        }
        Step::Key(k) => push_key_text(out, k, false),
        Step::Name(n) => push_escaped(out, n, false),
    }
}

/// The escaped text of each step (see [`steps_text`]).
pub fn steps_texts(steps: &[Step<'_>]) -> Vec<String> {
    steps.iter().map(|s| steps_text(std::slice::from_ref(s))).collect()
}

/// The escaped path segment of a dict key (without cloning the key into a [`Segment`]).
pub fn key_segment_text(k: &Key) -> String {
    key_text(k, false)
}

/// The escaped path segment of a record field or custom child name.
pub fn name_segment_text(n: &str) -> String {
    escape_str(n, false)
}

fn escape_str(s: &str, in_tuple: bool) -> String {
    let mut out = String::with_capacity(s.len());
    push_escaped(&mut out, s, in_tuple);
    out
}

fn push_escaped(out: &mut String, s: &str, in_tuple: bool) {
    if s.is_empty() {
        out.push_str("~e");
        return;
    }
    let special = |b: u8| matches!(b, b'~' | b'/' | b'*') || (in_tuple && matches!(b, b',' | b'(' | b')'));
    if !s.bytes().any(special) {
        // The common case: nothing to escape.
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            '*' => out.push_str("~2"),
            ',' if in_tuple => out.push_str("~3"),
            '(' if in_tuple => out.push_str("~4"),
            ')' if in_tuple => out.push_str("~5"),
            c => out.push(c),
        }
    }
}

fn float_text(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        let mut s = String::new();
        crate::manifest::text::push_finite_float(&mut s, f);
        s
    }
}

fn key_text(k: &Key, in_tuple: bool) -> String {
    let mut out = String::new();
    push_key_text(&mut out, k, in_tuple);
    out
}

fn push_key_text(out: &mut String, k: &Key, in_tuple: bool) {
    use std::fmt::Write;
    match k {
        Key::Str(s) => push_escaped(out, s, in_tuple),
        Key::Int(i) => {
            let _ = write!(out, "~i{i}");
        }
        Key::Float(f) => {
            out.push_str("~f");
            out.push_str(&float_text(*f));
        }
        Key::Bool(b) => {
            let _ = write!(out, "~{b}");
        }
        Key::None => out.push_str("~none"),
        Key::Tuple(items) => {
            out.push_str("~t(");
            for (i, k) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_key_text(out, k, true);
            }
            out.push(')');
        }
    }
}

/// A key path: the segments from the root to a node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyPath(Vec<Segment>);

impl KeyPath {
    /// The empty path, naming the root.
    pub fn root() -> KeyPath {
        KeyPath(Vec::new())
    }
    /// The owned path of the borrowed steps of a tree walk (see [`Tree::for_each_leaf_steps`]).
    pub fn from_steps(steps: &[Step<'_>]) -> KeyPath {
        KeyPath(steps.iter().map(Segment::from_step).collect())
    }
    /// Descend one step, to the child named by `s`.
    pub fn push(&mut self, s: Segment) {
        self.0.push(s);
    }
    /// Go up one step; returns the segment removed, `None` at the root.
    pub fn pop(&mut self) -> Option<Segment> {
        self.0.pop()
    }
    /// The segments from the root down.
    pub fn segments(&self) -> &[Segment] {
        &self.0
    }
    /// True for the empty path.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
    /// Escaped text of each segment.
    pub fn texts(&self) -> Vec<String> {
        self.0.iter().map(Segment::text).collect()
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.texts().join("/"))
    }
}

/// Split a path string into its (still escaped) segment texts, validating escapes.
///
/// # Errors
/// [`Error::BadKeyPath`] for empty segments or unknown escapes.
pub fn split(path: &str) -> Result<Vec<String>> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(vec![]);
    }
    let segs: Vec<String> = trimmed.split('/').map(str::to_string).collect();
    for s in &segs {
        if s.is_empty() {
            return Err(bad(path, "empty segment (write an empty key as `~e`)"));
        }
        if !valid_segment(s) {
            return Err(bad(path, &format!("bad escape in segment `{s}` (a literal `~` is written `~0`)")));
        }
    }
    Ok(segs)
}

fn valid_segment(s: &str) -> bool {
    if matches!(s, "~e" | "~true" | "~false" | "~none") {
        return true;
    }
    if let Some(r) = s.strip_prefix("~i") {
        return Int::parse(r).is_some();
    }
    if let Some(r) = s.strip_prefix("~f") {
        return matches!(r, "nan" | "inf" | "-inf") || r.parse::<f64>().is_ok();
    }
    if s.starts_with("~t(") && s.ends_with(')') {
        return true;
    }
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'~' {
            if i + 1 >= b.len() || !(b'0'..=b'5').contains(&b[i + 1]) {
                return false;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    true
}

fn bad(path: &str, reason: &str) -> Error {
    Error::BadKeyPath { path: path.to_string(), reason: reason.to_string() }
}

/// Parse a segment text into a dict key (for lookups that must build a `Key`).
pub fn parse_key(seg: &str) -> Result<Key> {
    if seg == "~e" {
        return Ok(Key::Str(String::new()));
    }
    if seg == "~none" {
        return Ok(Key::None);
    }
    if seg == "~true" || seg == "~false" {
        return Ok(Key::Bool(seg == "~true"));
    }
    if let Some(i) = seg.strip_prefix("~i") {
        return Int::parse(i).map(Key::Int).ok_or_else(|| bad(seg, "`~i` must be followed by an integer"));
    }
    if let Some(f) = seg.strip_prefix("~f") {
        let v = match f {
            "nan" => f64::NAN,
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => f.parse::<f64>().map_err(|_| bad(seg, "`~f` must be followed by a float"))?,
        };
        return Ok(Key::Float(v));
    }
    if seg.starts_with("~t(") {
        return Err(bad(seg, "tuple keys can be matched by glob or by their exact text only"));
    }
    Ok(Key::Str(unescape(seg)))
}

/// Undo string escapes (`~0` `~1` `~2` `~3` `~4` `~5`, `~e`).
pub fn unescape(seg: &str) -> String {
    if seg == "~e" {
        return String::new();
    }
    let mut out = String::with_capacity(seg.len());
    let mut chars = seg.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                Some('2') => out.push('*'),
                Some('3') => out.push(','),
                Some('4') => out.push('('),
                Some('5') => out.push(')'),
                Some(o) => {
                    out.push('~');
                    out.push(o)
                }
                None => out.push('~'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Find the child of `tree` named by one segment text.
pub fn child<'t, L>(tree: &'t Tree<L>, seg: &str) -> Option<&'t Tree<L>> {
    match tree {
        Tree::Leaf(_) | Tree::Ref(_) => None,
        Tree::Shared { node, .. } => child(node, seg),
        Tree::List(v) | Tree::Tuple(v) => list_index(seg, v.len()).and_then(|i| v.get(i)),
        Tree::Dict(items) => items.iter().find(|(k, _)| key_text(k, false) == seg).map(|(_, c)| c),
        Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
            v.iter().find(|(n, _)| escape_str(n, false) == seg).map(|(_, c)| c)
        }
    }
}

/// The position a list segment names: `i` (no leading zeros), or `-k` counting from the end as
/// Python does; `None` when it is not an index or out of range (never wrapped around).
fn list_index(seg: &str, len: usize) -> Option<usize> {
    let (neg, digits) = match seg.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, seg),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    let n: usize = digits.parse().ok()?;
    let i = if neg { len.checked_sub(n).filter(|_| n > 0)? } else { n };
    (i < len).then_some(i)
}

/// Resolve a key path in a tree.
///
/// # Errors
/// [`Error::BadKeyPath`] for a malformed path, [`Error::KeyNotFound`] naming the first missing step.
pub fn resolve<'t, L>(tree: &'t Tree<L>, path: &str) -> Result<&'t Tree<L>> {
    resolve_place(tree, path).map(|n| crate::refs::follow(tree, n))
}

/// The node at a key path's place: a shared node as it is (the object with its id), a ref
/// followed to the shared node it names. [`resolve`] gives the object inside.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_place<'t, L>(tree: &'t Tree<L>, path: &str) -> Result<&'t Tree<L>> {
    let node = resolve_inner(tree, path)?;
    Ok(match node {
        Tree::Ref(id) => crate::refs::find_shared(tree, *id).unwrap_or(node),
        n => n,
    })
}

fn resolve_inner<'t, L>(tree: &'t Tree<L>, path: &str) -> Result<&'t Tree<L>> {
    let mut node = tree;
    let mut walked: Vec<String> = vec![];
    for seg in split(path)? {
        // A path below a ref continues in the object it refers to.
        node = crate::refs::follow(tree, node);
        node = match child(node, &seg) {
            Some(c) => c,
            None => {
                let here = if walked.is_empty() { "<root>".to_string() } else { walked.join("/") };
                let avail: Vec<String> =
                    node.children().iter().take(12).map(|(s, _)| Segment::from_step(s).text()).collect();
                let reason = if matches!(node, Tree::Leaf(_)) {
                    format!("`{here}` is a leaf and has no child `{seg}`")
                } else if let Tree::List(v) | Tree::Tuple(v) = node {
                    let n = v.len();
                    let kind = node.container_kind();
                    if n == 0 {
                        format!("`{here}` is an empty {kind}: it has no index `{seg}`")
                    } else {
                        format!("index `{seg}` is out of range for `{here}` ({kind} of {n}: 0..{} or -{n}..-1)", n - 1)
                    }
                } else {
                    format!("`{here}` ({}) has no child `{seg}`; it has: {}", node.container_kind(), avail.join(", "))
                };
                return Err(Error::KeyNotFound { path: path.to_string(), reason });
            }
        };
        walked.push(seg);
    }
    Ok(node)
}

/// A compiled key-path glob.
#[derive(Debug, Clone)]
pub struct Glob {
    source: String,
    segs: Vec<String>,
    optional: bool,
}

impl Glob {
    /// Compile a glob pattern. A pattern that begins with `?` is *optional*: a load does not
    /// refuse it for matching nothing (see `unmatched_patterns` in the engine's `read`); the `?` is not
    /// part of what it matches (so `??key` matches a key that itself begins with `?`).
    ///
    /// # Errors
    /// [`Error::BadKeyPath`] if the pattern is malformed.
    pub fn new(pattern: &str) -> Result<Glob> {
        let (optional, body) = match pattern.strip_prefix('?') {
            Some(rest) => (true, rest),
            None => (false, pattern),
        };
        let mut g = Glob::compile(body, pattern)?;
        g.optional = optional;
        Ok(g)
    }

    fn compile(pattern: &str, source: &str) -> Result<Glob> {
        let segs = if pattern.trim_matches('/').is_empty() {
            vec![]
        } else {
            let s: Vec<String> = pattern.trim_matches('/').split('/').map(str::to_string).collect();
            if s.iter().any(String::is_empty) {
                return Err(bad(pattern, "empty segment"));
            }
            if s.iter().any(|x| x.contains("**") && x != "**") {
                return Err(bad(pattern, "`**` must be a whole segment"));
            }
            s
        };
        if segs.len() > 256 {
            return Err(bad(pattern, "too many segments"));
        }
        Ok(Glob { source: source.to_string(), segs, optional: false })
    }

    /// The pattern text as given to [`Glob::new`].
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the pattern may match nothing (it was given with a leading `?`).
    pub fn optional(&self) -> bool {
        self.optional
    }

    /// True if the pattern goes on below this path: a part of it matches the path and more
    /// segments follow (`b/1` below `b`). A select reaches through a ref place this way.
    pub fn reaches_below(&self, path: &[String]) -> bool {
        (1..self.segs.len()).any(|k| match_segs(&self.segs[..k], path))
    }

    /// True if the pattern matches exactly this path (given as escaped segment texts).
    pub fn matches(&self, path: &[String]) -> bool {
        match_segs(&self.segs, path)
    }

    /// True if the pattern matches this path or any of its ancestors (selection semantics).
    pub fn selects(&self, path: &[String]) -> bool {
        (0..=path.len()).any(|n| match_segs(&self.segs, &path[..n]))
    }
}

fn match_segs(pat: &[String], path: &[String]) -> bool {
    wildcard(pat, path, |p| p == "**", |p, s| match_one(p, s))
}

/// Match one segment against a pattern segment where `*` matches any run of characters.
fn match_one(pat: &str, text: &str) -> bool {
    if !pat.contains('*') {
        return pat == text;
    }
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = text.chars().collect();
    wildcard(&p, &t, |c| *c == '*', |a, b| a == b)
}

/// Wildcard matching shared by segments (`**`) and characters (`*`): a star matches any run of
/// items. Iterative with backtracking to the last star only, so it runs in O(len(pat) × len(text))
/// at worst — no exponential blow-up on hostile patterns.
fn wildcard<P, T>(pat: &[P], text: &[T], is_star: impl Fn(&P) -> bool, eq: impl Fn(&P, &T) -> bool) -> bool {
    let (mut p, mut s) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while s < text.len() {
        if p < pat.len() && is_star(&pat[p]) {
            star = Some((p, s));
            p += 1;
        } else if p < pat.len() && eq(&pat[p], &text[s]) {
            p += 1;
            s += 1;
        } else if let Some((sp, ss)) = star {
            p = sp + 1;
            s = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    while p < pat.len() && is_star(&pat[p]) {
        p += 1;
    }
    p == pat.len()
}

/// A set of globs; empty means "everything".
#[derive(Debug, Clone, Default)]
pub struct Selection {
    globs: Vec<Glob>,
}

impl Selection {
    /// The selection of everything (no patterns).
    pub fn all() -> Selection {
        Selection::default()
    }
    /// Compile several patterns.
    ///
    /// # Errors
    /// [`Error::BadKeyPath`] for a malformed pattern.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Selection> {
        Ok(Selection { globs: patterns.iter().map(|p| Glob::new(p.as_ref())).collect::<Result<_>>()? })
    }
    /// True if there are no patterns, so every leaf is selected.
    pub fn is_all(&self) -> bool {
        self.globs.is_empty()
    }
    /// True if a leaf at this path is selected.
    pub fn selects(&self, path: &KeyPath) -> bool {
        if self.globs.is_empty() {
            return true;
        }
        self.selects_texts(&path.texts())
    }

    /// Like [`Selection::selects`] for a path given as escaped segment texts.
    pub fn selects_texts(&self, texts: &[String]) -> bool {
        self.globs.is_empty() || self.globs.iter().any(|g| g.selects(texts))
    }

    /// True if a pattern goes on below this path (see [`Glob::reaches_below`]).
    pub fn reaches_below_texts(&self, texts: &[String]) -> bool {
        self.globs.iter().any(|g| g.reaches_below(texts))
    }

    /// The compiled patterns.
    pub fn globs(&self) -> &[Glob] {
        &self.globs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Leaf, Node};

    fn t(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn escaping_round_trips() {
        for s in ["a/b", "~x", "a*b", "", "plain", "x~1"] {
            let seg = Segment::Name(s.to_string()).text();
            assert!(!seg.contains('/'), "{seg}");
            assert_eq!(unescape(&seg), s);
        }
        assert_eq!(Segment::Key(Key::Int(Int::Small(-3))).text(), "~i-3");
        assert_eq!(Segment::Key(Key::Float(1.5)).text(), "~f1.5");
        assert_eq!(Segment::Key(Key::Tuple(vec![Key::Str("a,b".into()), Key::None])).text(), "~t(a~3b,~none)");
        assert_eq!(parse_key("~i-3").unwrap(), Key::Int(Int::Small(-3)));
    }

    #[test]
    fn globs() {
        let g = Glob::new("params/**/kernel").unwrap();
        assert!(g.matches(&t(&["params", "kernel"])));
        assert!(g.matches(&t(&["params", "a", "b", "kernel"])));
        assert!(!g.matches(&t(&["opt", "kernel"])));
        let g = Glob::new("layers/*/w*").unwrap();
        assert!(g.matches(&t(&["layers", "0", "weight"])));
        assert!(!g.matches(&t(&["layers", "0", "bias"])));
        assert!(Glob::new("params").unwrap().selects(&t(&["params", "w"])));
        assert!(Glob::new("**").unwrap().matches(&t(&[])));
        assert!(Glob::new("a**").is_err());
    }

    #[test]
    fn resolve_paths() {
        let tree = Node::dict([("a/b", Node::list([Node::from(1i64), Node::from(2i64)]))]);
        assert!(matches!(resolve(&tree, "a~1b/1").unwrap(), Tree::Leaf(_)));
        let err = resolve(&tree, "a~1b/5").unwrap_err();
        assert!(matches!(err, Error::KeyNotFound { .. }), "{err}");
        assert!(resolve(&tree, "a~1b/01").is_err());
        assert!(split("a//b").is_err());
    }

    /// Issue 23: an index past the end is an error (never wrapped around); negative indexes
    /// count from the end as in Python.
    #[test]
    fn list_indexes_never_wrap() {
        let tree = Node::dict([("l", Node::list([Node::from(10i64), Node::from(20i64), Node::from(30i64)]))]);
        let at = |p: &str| match resolve(&tree, p) {
            Ok(Tree::Leaf(Leaf::Int(i))) => i.as_i64(),
            _ => None,
        };
        assert_eq!(at("l/2"), Some(30));
        assert_eq!(at("l/-1"), Some(30));
        assert_eq!(at("l/-3"), Some(10));
        for bad in ["l/3", "l/5", "l/-4", "l/-0", "l/+1", "l/-", "l/1x"] {
            assert_eq!(at(bad), None, "{bad}");
        }
        let err = resolve(&tree, "l/5").unwrap_err().to_string();
        assert!(err.contains("out of range") && err.contains("list of 3"), "{err}");
    }

    #[test]
    fn steps_text_matches_the_key_path_text() {
        use crate::model::{Key, Node};
        let tree = Node::dict([
            ("a/b", Node::list([Node::from(1i64), Node::from(2i64)])),
            ("", Node::from(0i64)),
            ("~x*", Node::from(3i64)),
        ]);
        let mut t = tree;
        if let crate::model::Tree::Dict(items) = &mut t {
            items.push((
                Key::Tuple(vec![Key::Int(crate::model::Int::Small(4)), Key::Str("(,)".into())]),
                Node::from(5i64),
            ));
        }
        let mut a = vec![];
        t.for_each_leaf(&mut |p, _| a.push(p.to_string()));
        let mut b = vec![];
        t.for_each_leaf_steps(&mut |p, _| b.push(steps_text(p)));
        assert_eq!(a, b);
        assert_eq!(b, ["a~1b/0", "a~1b/1", "~e", "~0x~2", "~t(~i4,~4~3~5)"]);
    }

    #[test]
    fn map_ref_gives_each_leaf_its_key_path_and_keeps_the_structure() {
        use crate::model::Node;
        let tree = Node::dict([
            ("a/b", Node::list([Node::from(1i64), Node::from(2i64)])),
            (
                "rec",
                Tree::Record { type_name: "m.P".into(), fields: vec![("x".into(), Node::tuple([Node::from(3i64)]))] },
            ),
        ]);
        let mut walked = vec![];
        tree.for_each_leaf(&mut |p, _| walked.push(p.clone()));
        let mut mapped = vec![];
        let paths: Tree<String> = tree
            .map_ref(&mut |p, _| {
                mapped.push(p.clone());
                Ok::<_, ()>(p.to_string())
            })
            .unwrap();
        assert_eq!(mapped, walked);
        assert_eq!(mapped.iter().map(|p| p.to_string()).collect::<Vec<_>>(), ["a~1b/0", "a~1b/1", "rec/x/0"]);
        let Tree::Dict(items) = &paths else { panic!("not a dict: {paths:?}") };
        assert!(matches!(&items[1].1, Tree::Record { type_name, fields } if type_name == "m.P" && fields.len() == 1));
        assert!(matches!(resolve(&paths, "rec/x/0"), Ok(Tree::Leaf(s)) if s == "rec/x/0"));
        let err = tree.map_ref(&mut |p, _| if p.to_string() == "a~1b/1" { Err("stop") } else { Ok(()) });
        assert_eq!(err.unwrap_err(), "stop");
    }
}
