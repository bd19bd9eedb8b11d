// The diff pane (two trees: added, removed, changed, with per-array change norms, sortable)
// and the history pane (a repository's trees in save order, what changed between consecutive
// ones, one array's change over the steps).
"use strict";

const Compare = (() => {
  const { api, h, bytes, count, showError } = Core;
  const $ = (id) => document.getElementById(id);
  const OPS = { "+": ["added", "op-add"], "-": ["removed", "op-del"], "~": ["changed", "op-chg"] };
  // Rows drawn at once (a diff may list 20,000).
  const SHOWN = 2000;

  const diff = { rows: [], sort: { key: "order", dir: 1 }, filter: "", norms: new Map(), run: 0, a: null, b: null };

  /** Fill the from/to pickers with every tree the server can open. */
  function sources() {
    const out = [];
    const info = Core.state.info;
    if (info.tree) out.push(["a", `a: ${info.location}`]);
    if (info.other) out.push(["b", `b: ${info.other}`]);
    for (const n of Core.state.names) out.push([`@${n.name}`, `@${n.name}`]);
    return out;
  }

  function fillPickers(a, b) {
    for (const [id, v] of [["diff-a", a], ["diff-b", b]]) {
      const sel = $(id);
      sel.textContent = "";
      for (const [val, label] of sources()) sel.append(h("option", { value: val }, label));
      if (v) sel.value = v;
    }
  }

  /** Compare trees a and b (source ids) and list what differs. */
  async function showDiff(a, b) {
    fillPickers(a, b);
    const my = ++diff.run;
    diff.a = a; diff.b = b; diff.rows = []; diff.norms = new Map();
    $("diff-summary").textContent = "comparing…";
    $("diff-table").textContent = "";
    let r;
    try {
      r = await api("diff", { a, b });
    } catch (e) {
      $("diff-summary").textContent = "";
      showError(e);
      return;
    }
    if (my !== diff.run) return;
    diff.rows = r.rows.map((x, i) => Object.assign({ order: i }, x));
    $("diff-summary").textContent = r.identical ? "identical" :
      `${count(r.added)} added, ${count(r.removed)} removed, ${count(r.changed)} changed` + (r.total > r.rows.length ? ` (first ${count(r.rows.length)} listed)` : "");
    render();
    // Norms of changed arrays, a few at a time; each arrival re-sorts if sorted by a norm.
    const todo = diff.rows.filter((x) => x.norm);
    await Core.pool(todo, 2, async (x) => {
      try {
        x.n = await api("norm", { a, b, path: x.path });
      } catch (e) {
        x.n = { error: e.message };
      }
      if (my === diff.run) scheduleRender();
    }, () => my !== diff.run);
  }

  let pending = false;
  function scheduleRender() {
    if (pending) return;
    pending = true;
    setTimeout(() => { pending = false; render(); }, 150);
  }

  const COLS = [
    ["op", "", (x) => x.op],
    ["path", "path", (x) => x.path],
    ["old", "from", (x) => x.old || ""],
    ["new", "to", (x) => x.new || ""],
    ["chunks", "chunks differ", (x) => (x.chunks ? x.chunks_differ / x.chunks : -1), true],
    ["rel", "‖Δ‖/‖a‖", (x) => (x.n && x.n.rel != null ? x.n.rel : -1), true],
    ["l2", "‖Δ‖₂", (x) => (x.n && x.n.l2 != null ? x.n.l2 : -1), true],
    ["linf", "max |Δ|", (x) => (x.n && x.n.linf != null ? x.n.linf : -1), true],
  ];

  function render() {
    const t = $("diff-table");
    t.textContent = "";
    const head = h("tr", {}, COLS.map(([key, label, , num]) => {
      const mark = diff.sort.key === key ? (diff.sort.dir > 0 ? " ▲" : " ▼") : "";
      return h("th", { class: num ? "num" : "", onclick: () => sortBy(key) }, label + mark);
    }));
    t.append(head);
    const f = diff.filter.toLowerCase();
    let rows = diff.rows.filter((x) => !f || x.path.toLowerCase().includes(f));
    const col = COLS.find((c) => c[0] === diff.sort.key);
    const key = diff.sort.key === "order" ? (x) => x.order : col[2];
    rows = rows.slice().sort((p, q) => {
      const a = key(p), b = key(q);
      return (a < b ? -1 : a > b ? 1 : 0) * diff.sort.dir;
    });
    for (const x of rows.slice(0, SHOWN)) {
      const [word, cls] = OPS[x.op] || [x.op, ""];
      const n = x.n || {};
      const normCell = (v) => h("td", { class: "num" }, x.norm ? (x.n ? (n.error ? "–" : Plots.fmt(v)) : "…") : "");
      t.append(h("tr", { class: "clickable", title: n.error || `open ${x.path}`, onclick: () => App.reveal(x.op === "-" ? diff.a : diff.b, x.path) },
        h("td", { class: cls, title: word }, x.op),
        h("td", { class: "mono" }, x.path || "<root>"),
        h("td", {}, x.old || ""), h("td", {}, x.new || ""),
        h("td", { class: "num" }, x.chunks ? `${count(x.chunks_differ)} / ${count(x.chunks)}` : ""),
        normCell(n.rel), normCell(n.l2), normCell(n.linf)));
    }
    if (rows.length > SHOWN) t.append(h("tr", {}, h("td", { colspan: COLS.length, class: "muted" }, `${count(rows.length - SHOWN)} more rows: filter by path to see them`)));
  }

  function sortBy(key) {
    if (diff.sort.key === key) diff.sort.dir = -diff.sort.dir;
    else diff.sort = { key, dir: ["rel", "l2", "linf", "chunks"].includes(key) ? -1 : 1 };
    render();
  }

  // ---- history
  const hist = { data: null, run: 0 };

  async function showHistory() {
    const my = ++hist.run;
    $("history-summary").textContent = "reading the repository's trees…";
    let r;
    try {
      r = hist.data || (await api("history"));
    } catch (e) {
      $("history-summary").textContent = "";
      showError(e);
      return;
    }
    if (my !== hist.run) return;
    hist.data = r;
    const trees = r.trees;
    $("history-summary").textContent = `${r.repository}: ${count(trees.length)} trees, oldest first; ` +
      `${count(r.arrays_total)} arrays changed at some step`;
    const t = $("history-table");
    t.textContent = "";
    t.append(h("tr", {}, ["name", "saved", "root", "leaves", "bytes", "written", "reused", "+", "−", "~"].map((x, i) => h("th", { class: i >= 3 ? "num" : "" }, x))));
    trees.forEach((x, i) => {
      const prev = i > 0 ? trees[i - 1].name : null;
      t.append(h("tr", { class: "clickable", title: prev ? `diff @${prev} → @${x.name}` : `open @${x.name}`,
        onclick: () => (prev ? App.openDiff(`@${prev}`, `@${x.name}`) : App.reveal(`@${x.name}`, "")) },
        h("td", { class: "mono" }, x.name),
        h("td", {}, new Date(x.saved_ms).toISOString().replace("T", " ").slice(0, 19)),
        h("td", { class: "mono" }, x.root.slice(0, 12)),
        h("td", { class: "num" }, count(x.leaves)), h("td", { class: "num" }, bytes(x.bytes)),
        h("td", { class: "num" }, bytes(x.bytes_written)), h("td", { class: "num" }, bytes(x.bytes_reused)),
        h("td", { class: "num op-add" }, x.added ?? ""), h("td", { class: "num op-del" }, x.removed ?? ""),
        h("td", { class: "num op-chg" }, x.changed ?? "")));
    });
    const xs = trees.map((_, i) => i);
    const names = trees.map((x) => x.name);
    Plots.series($("history-plot"), xs, [
      { label: "changed", values: trees.map((x) => x.changed ?? null), stroke: "#b7791f" },
      { label: "added", values: trees.map((x) => x.added ?? null), stroke: "#1f8a4c" },
      { label: "removed", values: trees.map((x) => x.removed ?? null), stroke: "#c0392b" },
    ], "tree", names);
    const sel = $("history-array");
    sel.textContent = "";
    sel.append(h("option", { value: "" }, "pick an array…"));
    for (const a of r.arrays) sel.append(h("option", { value: a.path }, a.path));
    sel.onchange = () => showArray(sel.value);
    if (r.arrays.length) { sel.value = r.arrays[0].path; showArray(sel.value); }
  }

  /** One array over the history: the fraction of its chunks that changed (manifests) and its
   *  relative change ‖Δ‖/‖a‖ (data, read by the server), per step. */
  async function showArray(path) {
    const el = $("history-array-plot");
    el.textContent = "";
    $("history-array-info").textContent = "";
    if (!path) return;
    const r = hist.data;
    const a = r.arrays.find((x) => x.path === path);
    const xs = r.trees.map((_, i) => i);
    const names = r.trees.map((x) => x.name);
    const chunkSeries = { label: "chunks changed (fraction)", values: a.chunks_changed, stroke: "#b7791f" };
    Plots.series(el, xs, [chunkSeries], "tree", names);
    $("history-array-info").textContent = "reading the array in each tree…";
    try {
      const n = await api("history_norms", { path });
      if ($("history-array").value !== path) return;
      const rel = n.steps.map((s) => (s && s.rel != null ? s.rel : null));
      const errors = n.steps.filter((s) => s && s.error).map((s) => s.error);
      Plots.series(el, xs, [chunkSeries, { label: "‖Δ‖/‖prev‖", values: rel, stroke: "#2f6fde" }], "tree", names);
      $("history-array-info").textContent = errors.length ? errors[0] : "";
    } catch (e) {
      $("history-array-info").textContent = e.message;
    }
  }

  function init() {
    $("diff-run").addEventListener("click", () => App.openDiff($("diff-a").value, $("diff-b").value));
    $("diff-filter").addEventListener("input", (e) => { diff.filter = e.target.value; render(); });
  }

  return { showDiff, showHistory, init, fillPickers, get diffShown() { return diff.a !== null; } };
})();
