//! A tree as a compact HTML fragment, no server: what a notebook shows for `treepack.open(...)`
//! (`View._repr_html_`). Collapsible through `<details>` (no script, which notebooks may not
//! run), at most a given number of rows, each with kind, dtype, shape and bytes; containers
//! with their leaf count and bytes. python/treepack/_html.py draws `load_structure` results the
//! same way.

use crate::sources::Sub;
use std::collections::HashMap;
use std::fmt::Write;
use treepack::format::keypath::Segment;
use treepack::format::manifest::Entry;
use treepack::format::model::{Key, Step};
use treepack::Tree;

/// The styles of the fragment (inline: a notebook's page has no stylesheet of ours).
pub const STYLE: &str = "font:12px/1.5 ui-monospace,SFMono-Regular,Menlo,monospace";
const MUTED: &str = "color:#6b7385";

/// `text` with `&`, `<`, `>`, `"` and `'` escaped: key names and strings come from the file.
pub fn escape(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => s.push_str("&amp;"),
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '"' => s.push_str("&quot;"),
            '\'' => s.push_str("&#39;"),
            c => s.push(c),
        }
    }
    s
}

/// Bytes as `512.0 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (n as f64, 0);
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

struct Render {
    out: String,
    rows: usize,
    max_rows: usize,
    left_out: u64,
    counts: HashMap<usize, Sub>,
}

/// The subtree `node` (named `title`) as HTML: its first `max_rows` rows, the first level open.
pub fn tree_html(node: &Tree<Entry>, title: &str, max_rows: usize) -> String {
    let mut counts = HashMap::new();
    let total = crate::sources::count_into(node, &mut counts);
    let mut r = Render { out: String::new(), rows: 0, max_rows, left_out: 0, counts };
    let _ = write!(r.out, "<div class=\"treepack-tree\" style=\"{STYLE}\">");
    r.node(title, node, 0);
    if r.left_out > 0 {
        let _ = write!(r.out, "<div style=\"{MUTED}\">… {} more rows not shown</div>", r.left_out);
    }
    let _ = write!(
        r.out,
        "<div style=\"{MUTED}\">{} leaves, {} arrays, {}</div></div>",
        total.leaves,
        total.arrays,
        human_bytes(total.bytes)
    );
    r.out
}

fn label(step: &Step<'_>) -> String {
    match step {
        Step::Index(i) => i.to_string(),
        Step::Key(Key::Str(s)) => s.clone(),
        Step::Name(n) => n.to_string(),
        s => Segment::from_step_pub(s).text(),
    }
}

impl Render {
    fn node(&mut self, name: &str, t: &Tree<Entry>, depth: usize) {
        if self.rows >= self.max_rows {
            self.left_out += 1;
            return;
        }
        self.rows += 1;
        let t = t.unshared();
        let name = escape(name);
        match t {
            Tree::Leaf(e) => {
                let _ = write!(self.out, "<div style=\"padding-left:{}\">{name}: {}</div>", indent(depth), leaf(e));
            }
            Tree::Ref(id) => {
                let _ = write!(
                    self.out,
                    "<div style=\"padding-left:{}\">{name}: <span style=\"{MUTED}\">ref #{id}</span></div>",
                    indent(depth)
                );
            }
            _ => {
                let sub = self.counts.get(&(t as *const _ as usize)).copied().unwrap_or_default();
                let kids = t.children();
                let kind = match t {
                    Tree::Record { type_name, .. } | Tree::Custom { type_name, .. } => {
                        format!("{} {}", t.container_kind(), escape(type_name))
                    }
                    _ => t.container_kind().to_string(),
                };
                let _ = write!(
                    self.out,
                    "<details{} style=\"padding-left:{}\"><summary>{name}: {kind}[{}] \
                     <span style=\"{MUTED}\">{} leaves · {}</span></summary>",
                    if depth == 0 { " open" } else { "" },
                    if depth == 0 { "0" } else { "1em" },
                    kids.len(),
                    sub.leaves,
                    human_bytes(sub.bytes)
                );
                for (step, child) in kids {
                    self.node(&label(&step), child, depth + 1);
                }
                self.out.push_str("</details>");
            }
        }
    }
}

/// A leaf's indent inside its container's `<details>` (which nest, so indents add up): past the
/// summary's disclosure triangle.
fn indent(depth: usize) -> &'static str {
    if depth == 0 {
        "0"
    } else {
        "2.2em"
    }
}

fn leaf(e: &Entry) -> String {
    match e {
        Entry::Array(a) => {
            // The manifest's preview (first values, min and max), as `treepack inspect` shows it.
            let preview = a.preview.as_ref().map(|p| treepack::format::preview::text(p, 60)).unwrap_or_default();
            format!(
                "<b>{}</b>{:?} <span style=\"{MUTED}\">{}{}{}</span>",
                escape(&a.dtype.display()),
                a.shape,
                human_bytes(a.nbytes()),
                if preview.is_empty() { "" } else { "  " },
                escape(&preview)
            )
        }
        Entry::Str(_) | Entry::Bytes(_) => {
            format!("{} <span style=\"{MUTED}\">{}</span>", e.kind(), human_bytes(e.nbytes()))
        }
        e => format!("{} <span style=\"{MUTED}\">{}</span>", e.kind(), escape(&crate::listing::summary(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_the_file_are_escaped() {
        assert_eq!(escape("<script>&'\""), "&lt;script&gt;&amp;&#39;&quot;");
    }
}
