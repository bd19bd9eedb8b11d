// The leaf panel: what the manifest says of the node picked, and the views of its data —
// line plot (1-D), heatmap with axis and slice pickers (n-D), histogram with stats, element
// table, image (pixels of (H, W), (H, W, 3|4) arrays, a PNG the server encodes), a pandas
// DataFrame's table, string text, bytes as hex or as the image or audio they hold. Arrays are read by
// slice and downsampled on the server; the page asks for a step so that a read stays bounded.
"use strict";

const Leaf = (() => {
  const { api, h, bytes, count, shape, kindText, showError, url } = Core;
  // The most elements one slice request reads (the server's READ_CAP), and per axis of a plot.
  const READ_CAP = 1 << 24;
  const AXIS_READ = 2048;
  let current = null; // {source, path, node, view}
  let seq = 0; // a newer pick makes older answers stale

  const $ = (id) => document.getElementById(id);

  async function open(source, path) {
    const my = ++seq;
    $("leaf-empty").hidden = true;
    $("leaf").hidden = false;
    $("leaf-path").textContent = path === "" ? "<root>" : path;
    $("leaf-details").textContent = "";
    $("views").textContent = "";
    $("view-controls").textContent = "";
    $("view-body").textContent = "";
    let node;
    try {
      node = await api("node", { t: source, path });
    } catch (e) {
      if (my === seq) {
        $("view-body").append(h("div", { class: "error" }, e.message));
        showError(e);
      }
      return;
    }
    if (my !== seq) return;
    current = { source, path, node, view: null };
    details(node);
    const views = viewsOf(node);
    for (const v of views) {
      $("views").append(h("button", { dataset: { view: v }, onclick: () => show(v) }, v));
    }
    if (views.length) show(views[0]);
  }

  function viewsOf(n) {
    if (n.views) return n.views;
    if (n.kind === "str") return ["text"];
    if (n.kind === "bytes") return ["bytes"];
    return [];
  }

  function row(label, value, mono) {
    if (value === undefined || value === null || value === "") return null;
    return h("tr", {}, h("td", {}, label), h("td", { class: mono ? "mono" : "" }, value));
  }

  function json(v) {
    return JSON.stringify(v, null, 1).replace(/\n\s*/g, " ");
  }

  function details(n) {
    const t = $("leaf-details");
    const st = n.storage || {};
    const rows = [
      row("kind", n.shared !== undefined ? `${n.kind} (shared #${n.shared})` : n.kind),
      row("type", n.type, true),
      row("dtype", n.dtype, true),
      row("shape", n.shape ? shape(n.shape) : null, true),
      row("bytes", n.bytes !== undefined ? `${bytes(n.bytes)} (${count(n.bytes)})` : null),
      row("children", n.children !== undefined ? count(n.children) : null),
      row("leaves", n.leaves !== undefined ? `${count(n.leaves)} (${count(n.arrays)} arrays)` : null),
      row("value", n.value !== undefined ? json(n.value) : null, true),
      row("size", n.size !== undefined ? `${bytes(n.size)}${n.inline ? ", inline in the manifest" : ", in a pack"}` : null),
      row("storage", st.inline ? "inline in the manifest" : st.chunk_shape
        ? `chunks of ${shape(st.chunk_shape)} on a ${shape(st.grid)} grid (${count(st.chunks)} chunks)` : null),
      row("codec", st.codecs ? st.codecs.join(", ") : st.codec),
      row("stored", st.stored_bytes !== undefined ? bytes(st.stored_bytes) : null),
      row("hash", n.hash, true),
      row("chunk hashes", st.chunk_hashes && st.chunk_hashes.length
        ? st.chunk_hashes.slice(0, 4).join(" ") + (st.chunks > 4 ? ` … (${count(st.chunks)} chunks)` : "") : null, true),
      row("annotation", n.annotation ? json(n.annotation) : null, true),
      row("preview", n.preview ? json(n.preview) : null, true),
      row("data", n.data !== undefined ? json(n.data) : null, true),
      row("ref to", n.target, true),
    ];
    t.append(...rows.filter(Boolean));
  }

  function show(view) {
    if (!current) return;
    current.view = view;
    for (const b of $("views").children) b.classList.toggle("active", b.dataset.view === view);
    $("view-controls").textContent = "";
    $("view-body").textContent = "";
    const fn = { line, heatmap, histogram, table, image: imageView, frame: frameView, text, bytes: bytesView }[view];
    if (fn) fn(current);
  }

  /** Run a view's request; its error (the server's, in the CLI's words) goes in the view, not a blank pane. */
  async function guarded(cur, body, work) {
    const my = seq;
    body.textContent = "loading…";
    try {
      const r = await work();
      if (my !== seq || current !== cur) return null;
      body.textContent = "";
      return r;
    } catch (e) {
      if (my === seq) {
        body.textContent = "";
        body.append(h("div", { class: "error" }, e.message));
      }
      return null;
    }
  }

  function sliceInput(value, onApply, hint) {
    const input = h("input", { type: "text", value, spellcheck: "false", title: "numpy-style slice" });
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") onApply(input.value); });
    const box = h("label", {}, "slice ", input, " ", h("button", { onclick: () => onApply(input.value) }, "apply"));
    if (hint) box.append(" ", h("span", { class: "muted" }, hint));
    return { box, input };
  }

  // ---- line plot (1-D)
  function line(cur) {
    const n = cur.node.shape[0];
    const step = Math.max(1, Math.ceil(n / READ_CAP));
    const { box } = sliceInput(step > 1 ? `::${step}` : ":", (s) => draw(s), step > 1 ? `every ${step}th element (reads stay under ${count(READ_CAP)})` : "");
    const info = h("span", { class: "muted" });
    $("view-controls").append(box, info);
    const plotEl = h("div", { class: "plot" });
    $("view-body").append(plotEl);
    const draw = async (s) => {
      const r = await guarded(cur, plotEl, () => api("slice", { t: cur.source, path: cur.path, slice: s, max: 4000 }));
      if (!r) return;
      if (r.kind !== "line") { plotEl.textContent = `the slice selects ${r.kind === "scalar" ? "one element: " + r.value : "more than one axis"}`; return; }
      info.textContent = `${count(r.length)} points${r.downsampled ? " (min/max per bucket)" : ""}; min ${Plots.fmt(r.min)}, max ${Plots.fmt(r.max)}` +
        (r.nan ? `, ${count(r.nan)} NaN` : "") + (r.inf ? `, ${count(r.inf)} inf` : "");
      Plots.line(plotEl, r.x, r.y, cur.node.dtype);
    };
    draw(step > 1 ? `::${step}` : ":");
  }

  // ---- heatmap (n-D): two axes shown, the others indexed
  function heatmap(cur) {
    const dims = cur.node.shape;
    const nd = dims.length;
    const st = { rowAxis: nd - 2, colAxis: nd - 1, index: dims.map(() => 0), max: 512, symmetric: false };
    const controls = $("view-controls");
    const axisSel = (which) => {
      const sel = h("select", {}, dims.map((d, i) => h("option", { value: i }, `axis ${i} (${d})`)));
      sel.value = st[which];
      sel.addEventListener("change", () => { st[which] = Number(sel.value); rebuild(); });
      return sel;
    };
    const idxBox = h("span", { class: "controls" });
    const { box, input } = sliceInput("", (s) => draw(s));
    const maxSel = h("select", {}, [256, 512, 1024].map((m) => h("option", { value: m }, `${m} px`)));
    maxSel.value = st.max;
    maxSel.addEventListener("change", () => { st.max = Number(maxSel.value); draw(input.value); });
    const sym = h("input", { type: "checkbox" });
    sym.addEventListener("change", () => { st.symmetric = sym.checked; draw(input.value); });
    if (nd > 2) controls.append(h("label", {}, "rows ", axisSel("rowAxis")), h("label", {}, "columns ", axisSel("colAxis")));
    controls.append(idxBox, box, h("label", {}, "max ", maxSel), h("label", {}, sym, " symmetric around 0"));
    const canvas = h("canvas", { class: "heatmap", id: "heatmap-canvas" });
    const legendEl = h("div", { class: "legend" });
    const hover = h("div", { class: "hover muted" });
    const wrap = h("div", { class: "heatmap-wrap" }, canvas, legendEl);
    const bodyEl = h("div", {}, hover, wrap);
    const status = h("div", { class: "muted" });
    $("view-body").append(status, bodyEl);
    let last = null;

    function build() {
      return dims.map((d, i) => {
        if (i === st.rowAxis || i === st.colAxis) {
          const s = Math.max(1, Math.ceil(d / AXIS_READ));
          return s > 1 ? `::${s}` : ":";
        }
        return String(st.index[i]);
      }).join(", ");
    }
    function rebuild() {
      if (st.rowAxis === st.colAxis) st.colAxis = (st.rowAxis + 1) % nd;
      idxBox.textContent = "";
      dims.forEach((d, i) => {
        if (i === st.rowAxis || i === st.colAxis) return;
        const num = h("input", { type: "number", min: 0, max: d - 1, value: st.index[i] });
        const range = h("input", { type: "range", min: 0, max: d - 1, value: st.index[i] });
        const set = (v) => { st.index[i] = Math.max(0, Math.min(d - 1, Number(v) || 0)); num.value = range.value = st.index[i]; input.value = build(); draw(input.value); };
        num.addEventListener("change", () => set(num.value));
        range.addEventListener("change", () => set(range.value));
        idxBox.append(h("label", {}, `axis ${i} `, range, num));
      });
      input.value = build();
      draw(input.value);
    }
    async function draw(s) {
      const r = await guarded(cur, status, () => api("slice", { t: cur.source, path: cur.path, slice: s, max: st.max }));
      if (!r) return;
      if (r.kind !== "heatmap") { status.textContent = `the slice has ${r.kind === "line" ? "one axis: use the line view" : "no axis"}`; return; }
      let { data, rows, cols } = r;
      let [nr, nc] = r.shape;
      // Axes picked in the other order: the server answers in axis order, so transpose.
      if (nd > 2 && st.rowAxis > st.colAxis && s === build()) {
        const t = new Array(nr * nc);
        for (let i = 0; i < nr; i++) for (let j = 0; j < nc; j++) t[j * nr + i] = data[i * nc + j];
        data = t; [nr, nc] = [nc, nr]; [rows, cols] = [cols, rows];
      }
      let lo = r.min ?? 0, hi = r.max ?? 0;
      if (st.symmetric) { const m = Math.max(Math.abs(lo), Math.abs(hi)); lo = -m; hi = m; }
      Plots.heatmap(canvas, nr, nc, data, lo, hi);
      Plots.legend(legendEl, lo, hi);
      last = { data, nr, nc, rows, cols };
      status.textContent = `${count(r.elements)} elements read, shown as ${nr} × ${nc}` +
        (r.factor[0] * r.factor[1] > 1 ? ` (means of ${r.factor[0]} × ${r.factor[1]} blocks)` : "") +
        (r.nan ? `; ${count(r.nan)} NaN` : "") + (r.inf ? `; ${count(r.inf)} inf` : "") + (r.nan || r.inf ? " (magenta where a block has no finite value)" : "");
    }
    canvas.addEventListener("mousemove", (e) => {
      if (!last) return;
      const j = Math.floor((e.offsetX / canvas.clientWidth) * last.nc);
      const i = Math.floor((e.offsetY / canvas.clientHeight) * last.nr);
      if (i < 0 || j < 0 || i >= last.nr || j >= last.nc) return;
      const v = last.data[i * last.nc + j];
      hover.textContent = `row ${last.rows.start + i * last.rows.step}, column ${last.cols.start + j * last.cols.step}: ${Plots.fmt(v)}`;
    });
    rebuild();
  }

  // ---- histogram and stats
  function histogram(cur) {
    const bins = h("select", {}, [16, 32, 64, 128, 256].map((b) => h("option", { value: b }, `${b} bins`)));
    bins.value = 64;
    bins.addEventListener("change", () => draw());
    $("view-controls").append(bins);
    const statsEl = h("table", { class: "details stats" });
    const plotEl = h("div", { class: "plot" });
    $("view-body").append(statsEl, plotEl);
    const draw = async () => {
      const r = await guarded(cur, plotEl, () => api("stats", { t: cur.source, path: cur.path, bins: bins.value }));
      if (!r) return;
      statsEl.textContent = "";
      const f = Plots.fmt;
      statsEl.append(...[
        ["elements", count(r.count) + (r.sampled ? ` (every ${r.step}th index of axis 0 of ${count(r.elements)})` : "")],
        ["min / max", `${f(r.min)} / ${f(r.max)}`], ["mean", f(r.mean)], ["std", f(r.std)],
        ["zeros", count(r.zeros)], ["NaN", count(r.nan)], ["+inf / −inf", `${count(r.posinf)} / ${count(r.neginf)}`],
      ].map(([k, v]) => row(k, v)));
      if (r.finite > 0) Plots.histogram(plotEl, r.edges, r.counts);
      else plotEl.textContent = "no finite values";
    };
    draw();
  }

  // ---- element table (any dtype)
  function defaultTableSlice(dims) {
    if (dims.length === 0) return "";
    if (dims.length === 1) return `0:${Math.min(dims[0], 1000)}`;
    return dims.map((d, i) => (i < dims.length - 2 ? "0" : `0:${Math.min(d, i === dims.length - 2 ? 50 : 20)}`)).join(", ");
  }

  function table(cur) {
    const dims = cur.node.shape;
    const { box } = sliceInput(defaultTableSlice(dims), (s) => draw(s), "at most 10,000 elements");
    $("view-controls").append(box);
    const bodyEl = h("div", { class: "scroll table-scroll" });
    $("view-body").append(bodyEl);
    const cell = (v) => h("td", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v));
    const draw = async (s) => {
      const r = await guarded(cur, bodyEl, () => api("values", { t: cur.source, path: cur.path, slice: s }));
      if (!r) return;
      const t = h("table", { class: "grid values" });
      if (r.shape.length === 2) {
        const [nr, nc] = r.shape;
        t.append(h("tr", {}, h("th", {}, ""), Array.from({ length: nc }, (_, j) => h("th", { class: "num" }, j))));
        for (let i = 0; i < nr; i++) t.append(h("tr", {}, h("th", { class: "num" }, i), r.values.slice(i * nc, (i + 1) * nc).map(cell)));
      } else {
        r.values.forEach((v, i) => t.append(h("tr", {}, h("th", { class: "num" }, i), cell(v))));
      }
      bodyEl.append(t);
    };
    draw(defaultTableSlice(dims));
  }

  // ---- image: the server encodes the slice as a PNG (block means when bigger than asked)
  function imageView(cur) {
    const dims = cur.node.shape;
    const nd = dims.length;
    const colour = nd >= 3 && (dims[nd - 1] === 3 || dims[nd - 1] === 4);
    const hAx = colour ? nd - 3 : nd - 2;
    const channels = colour ? dims[nd - 1] : 1;
    // One step on both axes keeps a read under the server's cap.
    const step = Math.max(1, Math.ceil(Math.sqrt((dims[hAx] * dims[hAx + 1] * channels) / READ_CAP)));
    const spec = dims.map((d, i) => (i < hAx ? "0" : i <= hAx + 1 && step > 1 ? `::${step}` : ":")).join(", ");
    const { box, input } = sliceInput(spec, (s) => draw(s), step > 1 ? `every ${step}th pixel (reads stay under ${count(READ_CAP)} elements)` : "");
    const maxSel = h("select", {}, [256, 512, 1024, 2048].map((m) => h("option", { value: m }, `${m} px`)));
    maxSel.value = 1024;
    maxSel.addEventListener("change", () => draw(input.value));
    const status = h("div", { class: "muted" });
    $("view-controls").append(box, h("label", {}, "max ", maxSel));
    const img = h("img", { class: "array-image", id: "image-view", alt: cur.path });
    const bodyEl = h("div", {}, status, img);
    $("view-body").append(bodyEl);
    let objectUrl = null;
    const draw = async (s) => {
      const blob = await guarded(cur, status, async () => {
        const r = await fetch(url("image", { t: cur.source, path: cur.path, slice: s, max: maxSel.value }), { cache: "no-store" });
        if (!r.ok) {
          const text = await r.text();
          let msg = text;
          try { msg = JSON.parse(text).error || text; } catch (e) { /* plain text */ }
          throw new Error(msg);
        }
        return r.blob();
      });
      if (!blob) { img.hidden = true; return; }
      if (objectUrl) URL.revokeObjectURL(objectUrl);
      objectUrl = URL.createObjectURL(blob);
      img.onload = () => {
        const [w, hgt] = [img.naturalWidth, img.naturalHeight];
        // Small images enlarged (pixels kept square and sharp), big ones fit the pane.
        const scale = Math.max(1, Math.floor(256 / Math.max(w, hgt)));
        img.style.width = `${w * scale}px`;
        img.classList.toggle("pixelated", scale > 1);
        img.dataset.ready = "1";
        status.textContent = `${w} × ${hgt} pixels${channels === 1 ? " (grey)" : channels === 3 ? " (RGB)" : " (RGBA)"}` +
          (cur.node.dtype === "uint8" ? "" : ", values 0–1 as 0–255, clipped");
      };
      img.hidden = false;
      img.src = objectUrl;
    };
    draw(spec);
  }

  // ---- a pandas DataFrame or Series: a page of rows, built on the server from its columns
  function frameView(cur) {
    const st = { offset: 0, limit: 50, colOffset: 0 };
    const COLS = 50;
    const info = h("span", { class: "muted", id: "frame-info" });
    const prev = h("button", { onclick: () => { st.offset = Math.max(0, st.offset - st.limit); draw(); } }, "◀ rows");
    const next = h("button", { id: "frame-next", onclick: () => { st.offset += st.limit; draw(); } }, "rows ▶");
    const cprev = h("button", { onclick: () => { st.colOffset = Math.max(0, st.colOffset - COLS); draw(); } }, "◀ columns");
    const cnext = h("button", { onclick: () => { st.colOffset += COLS; draw(); } }, "columns ▶");
    const per = h("select", {}, [20, 50, 100, 500].map((n) => h("option", { value: n }, `${n} rows`)));
    per.value = st.limit;
    per.addEventListener("change", () => { st.limit = Number(per.value); draw(); });
    $("view-controls").append(prev, next, per, cprev, cnext, info);
    const bodyEl = h("div", { class: "scroll table-scroll" });
    $("view-body").append(bodyEl);
    const cell = (v) => h("td", { class: typeof v === "number" ? "num" : v === null ? "muted" : "" },
      v === null ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v));
    const label = (v) => (v === null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v));
    const draw = async () => {
      const r = await guarded(cur, bodyEl, () => api("frame", {
        t: cur.source, path: cur.path, offset: st.offset, limit: st.limit, col_offset: st.colOffset, col_limit: COLS,
      }));
      if (!r) return;
      st.offset = r.offset;
      const cols = r.columns;
      const t = h("table", { class: "grid values frame", id: "frame-table" });
      t.append(h("tr", {}, h("th", { title: r.index.dtype }, label(r.index.name)), cols.map((c) => h("th", { title: c.path }, label(c.label)))));
      t.append(h("tr", { class: "dtypes" }, h("th", { class: "muted" }, r.index.dtype), cols.map((c) => h("th", { class: "muted" }, c.dtype))));
      for (let i = 0; i < r.count; i++) {
        t.append(h("tr", {}, h("td", { class: "index" }, label(r.index.values[i])), cols.map((c) => cell(c.values[i]))));
      }
      bodyEl.append(t);
      prev.disabled = r.offset === 0;
      next.disabled = r.offset + r.count >= r.rows;
      cprev.disabled = r.columns_offset === 0;
      cnext.disabled = r.columns_offset + cols.length >= r.columns_total;
      cprev.hidden = cnext.hidden = r.columns_total <= COLS;
      info.textContent = `rows ${count(r.count ? r.offset + 1 : 0)}–${count(r.offset + r.count)} of ${count(r.rows)}; ` +
        `${r.columns_total > COLS ? `columns ${count(r.columns_offset + 1)}–${count(r.columns_offset + cols.length)} of ` : ""}${count(r.columns_total)} column${r.columns_total === 1 ? "" : "s"}`;
    };
    draw();
  }

  // ---- strings and bytes
  async function text(cur) {
    const pre = h("pre", {});
    $("view-body").append(pre);
    const r = await guarded(cur, pre, () => api("text", { t: cur.source, path: cur.path, limit: 65536 }));
    if (!r) return;
    pre.textContent = r.text;
    if (r.truncated) $("view-controls").append(h("span", { class: "muted" }, `first 64 KiB of ${bytes(r.size)}`));
  }

  async function bytesView(cur) {
    const bodyEl = h("div", {});
    $("view-body").append(bodyEl);
    const r = await guarded(cur, bodyEl, () => api("text", { t: cur.source, path: cur.path, limit: 4096 }));
    if (!r) return;
    const src = url("raw", { t: cur.source, path: cur.path });
    if (r.mime && r.mime.startsWith("image/")) bodyEl.append(h("img", { class: "preview", src, alt: cur.path }));
    if (r.mime && r.mime.startsWith("audio/")) bodyEl.append(h("audio", { controls: true, src }));
    bodyEl.append(h("div", { class: "muted" }, `${bytes(r.size)}${r.mime ? ", " + r.mime : ""}${r.truncated ? "; first 4 KiB:" : ":"}`), h("pre", {}, r.hex));
  }

  return { open, kindText };
})();
