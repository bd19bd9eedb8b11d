// The page's frame: tabs, the tree picker, and the tree panel — a virtualised list (only the
// rows in view are in the DOM) of the levels opened so far, each level fetched a page at a time
// from the server, so a tree of a million leaves opens as fast as a small one. Glob search
// lists matching nodes flat.
"use strict";

const App = (() => {
  const { api, h, bytes, count, kindText, showError, clearError, state } = Core;
  const $ = (id) => document.getElementById(id);
  const ROW_H = 22;
  const PAGE = 1000;

  // rows: {depth, node, open, loading} or {depth, more: {path, offset, total}}
  let rows = [];
  let saved = null; // the tree's rows while search results are shown
  let selected = null;

  // ---- the virtualised list
  function render() {
    const scroll = $("tree-scroll");
    $("tree-spacer").style.height = `${rows.length * ROW_H}px`;
    const first = Math.max(0, Math.floor(scroll.scrollTop / ROW_H) - 10);
    const last = Math.min(rows.length, Math.ceil((scroll.scrollTop + scroll.clientHeight) / ROW_H) + 10);
    const box = $("tree-rows");
    box.style.transform = `translateY(${first * ROW_H}px)`;
    box.textContent = "";
    for (let i = first; i < last; i++) box.append(rowEl(rows[i], i));
  }

  function rowEl(r, i) {
    const pad = { style: `padding-left:${6 + r.depth * 14}px` };
    if (r.more) {
      return h("div", Object.assign({ class: "row more", dataset: { i } }, pad), h("span", { class: "caret" }, ""),
        `… ${count(r.more.total - r.more.offset)} more (load ${count(Math.min(PAGE, r.more.total - r.more.offset))})`);
    }
    const n = r.node;
    const container = n.children !== undefined && n.children > 0;
    const caret = container ? (r.loading ? "…" : r.open ? "▾" : "▸") : "";
    const size = n.children !== undefined ? `${count(n.leaves)} · ${bytes(n.bytes)}` : n.bytes ? bytes(n.bytes) : "";
    const label = r.flat ? n.path : n.path === "" ? "<root>" : n.label;
    return h("div", Object.assign({ class: `row${selected === n.path ? " selected" : ""}`, dataset: { i, path: n.path }, title: n.path || "<root>" }, pad),
      h("span", { class: "caret", dataset: { toggle: "1" } }, caret),
      h("span", { class: "name" }, label),
      h("span", { class: "kind" }, kindText(n)),
      h("span", { class: "size" }, size));
  }

  async function fetchChildren(path, offset) {
    return api("children", { t: state.source, path, offset, limit: PAGE });
  }

  /** The rows for a page of children, and a "more" row when the level goes on. */
  function childRows(page, depth) {
    const out = page.children.map((node) => ({ depth, node, open: false }));
    const next = page.offset + page.children.length;
    if (next < page.total) out.push({ depth, more: { path: page.path, offset: next, total: page.total } });
    return out;
  }

  async function toggle(i) {
    const r = rows[i];
    if (!r || r.more || r.flat) return;
    if (r.open) {
      let j = i + 1;
      while (j < rows.length && rows[j].depth > r.depth) j++;
      rows.splice(i + 1, j - i - 1);
      r.open = false;
      render();
      return;
    }
    if (!(r.node.children > 0)) return;
    r.loading = true;
    render();
    try {
      const page = await fetchChildren(r.node.path, 0);
      const at = rows.indexOf(r);
      if (at < 0) return;
      rows.splice(at + 1, 0, ...childRows(page, r.depth + 1));
      r.open = true;
    } catch (e) {
      showError(e);
    } finally {
      r.loading = false;
      render();
    }
  }

  async function loadMore(i) {
    const r = rows[i];
    try {
      const page = await fetchChildren(r.more.path, r.more.offset);
      const at = rows.indexOf(r);
      if (at >= 0) rows.splice(at, 1, ...childRows(page, r.depth));
    } catch (e) {
      showError(e);
    }
    render();
  }

  function select(path) {
    selected = path;
    render();
    Leaf.open(state.source, path);
    setHash({ tab: "tree", t: state.source, path });
  }

  async function loadTree() {
    rows = [];
    saved = null;
    selected = null;
    $("search").value = "";
    $("search-clear").hidden = true;
    $("search-info").hidden = true;
    $("leaf").hidden = true;
    $("leaf-empty").hidden = false;
    render();
    try {
      const [root, page] = await Promise.all([api("node", { t: state.source, path: "", hash: 0 }), fetchChildren("", 0)]);
      rows = [{ depth: 0, node: Object.assign({ label: "<root>" }, root), open: true }, ...childRows(page, 1)];
      $("tree-totals").textContent = `${count(root.leaves)} leaves, ${count(root.arrays)} arrays, ${bytes(root.bytes)}`;
    } catch (e) {
      showError(e);
      $("tree-totals").textContent = "";
    }
    render();
  }

  /** Open the tree `source` at `path`: each level on the way opened, the node picked. */
  async function reveal(source, path) {
    showTab("tree");
    if (source !== state.source) {
      state.source = source;
      $("source").value = source;
      await loadTree();
    } else if (saved) {
      clearSearch();
    }
    const segs = path === "" ? [] : path.split("/");
    for (let k = 1; k < segs.length; k++) {
      const prefix = segs.slice(0, k).join("/");
      const i = rows.findIndex((r) => r.node && r.node.path === prefix);
      if (i < 0) break; // beyond the pages loaded: the leaf panel still opens
      if (!rows[i].open) await toggle(i);
    }
    select(path);
    const i = rows.findIndex((r) => r.node && r.node.path === path);
    if (i >= 0) $("tree-scroll").scrollTop = Math.max(0, i * ROW_H - 100);
  }

  // ---- search
  async function search(pattern) {
    if (!pattern.trim()) return clearSearch();
    try {
      const r = await api("search", { t: state.source, glob: pattern, limit: 5000 });
      if (!saved) saved = rows;
      rows = r.matches.map((node) => ({ depth: 0, node, flat: true }));
      $("search-info").hidden = false;
      $("search-info").textContent = `${count(r.total)} match${r.total === 1 ? "" : "es"} for ${r.pattern}` +
        (r.total > r.matches.length ? ` (first ${count(r.matches.length)})` : "");
      $("search-clear").hidden = false;
      $("tree-scroll").scrollTop = 0;
      render();
    } catch (e) {
      showError(e);
    }
  }

  function clearSearch() {
    if (saved) rows = saved;
    saved = null;
    $("search").value = "";
    $("search-clear").hidden = true;
    $("search-info").hidden = true;
    render();
  }

  // ---- tabs, pickers, the URL's hash (which pane, tree and node: a reload comes back there)
  function showTab(tab) {
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === tab);
    for (const p of ["tree", "diff", "history"]) $(`pane-${p}`).hidden = p !== tab;
    $("source-box").hidden = tab !== "tree" || $("source").options.length < 2;
    if (tab === "tree") render();
  }

  function setHash(o) {
    history.replaceState(null, "", `${location.pathname}${location.search}#${new URLSearchParams(o)}`);
  }

  function openDiff(a, b) {
    showTab("diff");
    setHash({ tab: "diff", a, b });
    Compare.showDiff(a, b);
  }

  function openHistory() {
    showTab("history");
    setHash({ tab: "history" });
    Compare.showHistory();
  }

  async function boot() {
    $("error-close").addEventListener("click", clearError);
    const scroll = $("tree-scroll");
    scroll.addEventListener("scroll", () => requestAnimationFrame(render));
    window.addEventListener("resize", () => render());
    $("tree-rows").addEventListener("click", (e) => {
      const el = e.target.closest(".row");
      if (!el) return;
      const i = Number(el.dataset.i);
      const r = rows[i];
      if (r.more) return loadMore(i);
      if (e.target.dataset.toggle) return toggle(i);
      select(r.node.path);
      if (!r.open && !r.flat && r.node.children > 0) toggle(i);
    });
    $("search-form").addEventListener("submit", (e) => { e.preventDefault(); search($("search").value); });
    $("search-clear").addEventListener("click", clearSearch);
    $("tab-tree").addEventListener("click", () => showTab("tree"));
    $("tab-diff").addEventListener("click", () => openDiff($("diff-a").value || "a", $("diff-b").value || "b"));
    $("tab-history").addEventListener("click", openHistory);
    $("source").addEventListener("change", (e) => { state.source = e.target.value; loadTree(); });
    Compare.init();
    let info;
    try {
      info = await api("info");
    } catch (e) {
      showError(e);
      return;
    }
    state.info = info;
    $("location").textContent = info.other ? `${info.location}  ↔  ${info.other}` : info.location;
    document.title = `treepack view: ${info.location}`;
    if (info.repository) {
      try {
        state.names = (await api("names")).names;
      } catch (e) {
        showError(e);
      }
    }
    const sel = $("source");
    if (info.tree) sel.append(h("option", { value: "a" }, `a: ${info.location}`));
    if (info.other) sel.append(h("option", { value: "b" }, `b: ${info.other}`));
    for (const n of state.names) sel.append(h("option", { value: `@${n.name}` }, `@${n.name}`));
    state.source = info.tree ? "a" : state.names.length ? `@${state.names[state.names.length - 1].name}` : "a";
    sel.value = state.source;
    $("tab-diff").hidden = !(info.other || state.names.length > 1);
    $("tab-history").hidden = !info.repository;
    const hash = new URLSearchParams(location.hash.slice(1));
    const tab = hash.get("tab") || (info.other ? "diff" : info.tree ? "tree" : "history");
    if (tab === "diff") {
      const prev = state.names.length > 1 ? `@${state.names[state.names.length - 2].name}` : state.source;
      const a = hash.get("a") || (info.other ? "a" : prev);
      const b = hash.get("b") || (info.other ? "b" : state.source);
      openDiff(a, b);
      loadTree();
    } else if (tab === "history" && info.repository) {
      openHistory();
      loadTree();
    } else {
      showTab("tree");
      if (hash.get("t")) { state.source = hash.get("t"); sel.value = state.source; }
      await loadTree();
      if (hash.get("path") !== null) reveal(state.source, hash.get("path"));
    }
  }

  document.addEventListener("DOMContentLoaded", boot);
  return { reveal, openDiff, render };
})();
