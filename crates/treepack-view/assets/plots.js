// Plots of the viewer: line plots, histograms and series through the vendored uPlot
// (assets/vendor/uplot, design.md decision 87); heatmaps on a canvas, one pixel per value the
// server sent (its block means), scaled by CSS.
"use strict";

const Plots = (() => {
  // Viridis at nine stops (matplotlib's), interpolated linearly: perceptually ordered, so a
  // gradient in the data reads as a gradient on screen, and it survives greyscale printing.
  const VIRIDIS = [
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
  ];
  // Blocks with no finite value (NaN, ±inf only).
  const MISSING = [255, 0, 255];

  /** The colour of t in [0, 1] (clamped), as [r, g, b]. */
  function colormap(t) {
    if (!(t >= 0)) t = 0;
    if (t > 1) t = 1;
    const x = t * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
    const f = x - i;
    const a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return [0, 1, 2].map((k) => Math.round(a[k] + (b[k] - a[k]) * f));
  }

  function width(el) {
    return Math.max(320, Math.min(el.clientWidth || 800, 1400) - 8);
  }

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "string") return v;
    if (Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(4) : String(+v.toPrecision(6));
  }

  function plot(el, opts, data) {
    el.textContent = "";
    const u = new uPlot(Object.assign({ width: width(el), height: 320 }, opts), data, el);
    return u;
  }

  /** A line plot of ys over xs (nulls are gaps). */
  function line(el, xs, ys, label) {
    return plot(el, {
      scales: { x: { time: false } },
      series: [{ label: "index" }, { label: label || "value", stroke: "#2f6fde", width: 1, points: { show: xs.length < 200 } }],
      axes: [{}, { values: (u, vals) => vals.map(fmt), size: 70 }],
      legend: { live: true },
    }, [xs, ys]);
  }

  /** A histogram: counts[i] of values in [edges[i], edges[i + 1]). */
  function histogram(el, edges, counts) {
    const xs = edges.slice(0, counts.length).map(Number);
    return plot(el, {
      scales: { x: { time: false, range: [Number(edges[0]), Number(edges[edges.length - 1])] } },
      series: [
        { label: "from" },
        { label: "count", fill: "rgba(47,111,222,0.35)", stroke: "#2f6fde", paths: uPlot.paths.bars({ size: [1, Infinity], align: 1 }) },
      ],
      axes: [{ values: (u, vals) => vals.map(fmt) }, { size: 60 }],
    }, [xs, counts]);
  }

  /** Several series over the same x (history plots). `series`: [{label, values, stroke}]. */
  function series(el, xs, list, xlabel, xvalues) {
    return plot(el, {
      height: 260,
      scales: { x: { time: false } },
      series: [{ label: xlabel || "step", value: (u, v) => (xvalues && v != null ? xvalues[v] : v) }]
        .concat(list.map((s) => ({ label: s.label, stroke: s.stroke, width: 2, points: { show: true }, spanGaps: false }))),
      // Whole steps only: a tree between two trees means nothing.
      axes: [{ incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000], values: (u, vals) => vals.map((v) => (xvalues && Number.isInteger(v) ? (xvalues[v] ?? "") : v)) }, { values: (u, vals) => vals.map(fmt), size: 70 }],
    }, [xs].concat(list.map((s) => s.values)));
  }

  /**
   * Draw a heatmap of `data` (row-major, rows × cols, null for missing) on `canvas`, one pixel
   * per value, coloured between lo and hi. The canvas keeps the values for the hover read-out.
   */
  function heatmap(canvas, rows, cols, data, lo, hi) {
    canvas.width = cols;
    canvas.height = rows;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(cols, rows);
    const span = hi - lo;
    for (let i = 0; i < rows * cols; i++) {
      const v = data[i];
      const c = v === null || v === undefined ? MISSING : colormap(span > 0 ? (v - lo) / span : 0.5);
      img.data[4 * i] = c[0];
      img.data[4 * i + 1] = c[1];
      img.data[4 * i + 2] = c[2];
      img.data[4 * i + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    // Shown at least 256 px and at most the pane's width, square pixels.
    const box = canvas.parentElement ? canvas.parentElement.clientWidth - 80 : 800;
    const scale = Math.max(1, Math.min(box / cols, Math.max(256 / cols, 512 / rows)));
    canvas.style.width = Math.round(cols * scale) + "px";
    canvas.style.height = Math.round(rows * scale) + "px";
    canvas.dataset.lo = lo;
    canvas.dataset.hi = hi;
  }

  /** A vertical colour bar from lo (bottom) to hi (top). */
  function legend(el, lo, hi) {
    el.textContent = "";
    const top = document.createElement("span");
    top.textContent = fmt(hi);
    const bar = document.createElement("canvas");
    bar.width = 1;
    bar.height = 100;
    const ctx = bar.getContext("2d");
    for (let y = 0; y < 100; y++) {
      const c = colormap(1 - y / 99);
      ctx.fillStyle = `rgb(${c[0]},${c[1]},${c[2]})`;
      ctx.fillRect(0, y, 1, 1);
    }
    const bottom = document.createElement("span");
    bottom.textContent = fmt(lo);
    el.append(top, bar, bottom);
  }

  return { colormap, line, histogram, series, heatmap, legend, fmt, MISSING };
})();
