// What every part of the page shares: the API (every request carries the page's token), the
// error banner, element building and number formatting.
"use strict";

const Core = (() => {
  // The token came in the page's URL; it goes back with every request, and nowhere else.
  const TOKEN = new URLSearchParams(location.search).get("token") || "";

  function url(endpoint, params) {
    const q = new URLSearchParams(Object.assign({ token: TOKEN }, params || {}));
    return `/api/${endpoint}?${q}`;
  }

  /** GET an API endpoint: its JSON, or an Error whose message is the server's (the CLI's words). */
  async function api(endpoint, params) {
    let r;
    try {
      r = await fetch(url(endpoint, params), { cache: "no-store" });
    } catch (e) {
      throw new Error("treepack view: the server does not answer (was `treepack view` stopped?)");
    }
    const text = await r.text();
    let body = null;
    try {
      body = JSON.parse(text);
    } catch (e) {
      // Not JSON: a plain-text answer (403 without the token, 404 of a route).
    }
    if (!r.ok) {
      const msg = body && body.error ? body.error : text.trim() || `HTTP ${r.status}`;
      const err = new Error(msg);
      err.status = r.status;
      throw err;
    }
    return body;
  }

  /** Show `msg` in the banner at the top of the page. */
  function showError(msg) {
    const box = document.getElementById("error");
    document.getElementById("error-text").textContent = String(msg && msg.message ? msg.message : msg);
    box.hidden = false;
  }

  function clearError() {
    document.getElementById("error").hidden = true;
  }

  /** An element: h("td", {class: "num"}, "text", child…). Text is always set as text, never HTML. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n, u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return u === 0 ? `${n} B` : `${v.toFixed(1)} ${units[u]}`;
  }

  function count(n) {
    return n === null || n === undefined ? "" : Number(n).toLocaleString("en-US");
  }

  function shape(s) {
    return `[${(s || []).join(", ")}]`;
  }

  /** The short description of a node a row shows: `dict[3]`, `float32[512, 256]`, `str "…"`. */
  function kindText(n) {
    if (n.kind === "array") return `${n.dtype}${shape(n.shape)}`;
    if (n.children !== undefined) {
      const t = n.type ? ` ${n.type}` : "";
      return `${n.kind}${t}[${count(n.children)}]`;
    }
    return n.summary || n.kind;
  }

  /** Run `fn` over `items` with at most `limit` running at once (requests the server reads). */
  async function pool(items, limit, fn, stopped) {
    let i = 0;
    const run = async () => {
      while (i < items.length && !(stopped && stopped())) {
        const item = items[i++];
        await fn(item);
      }
    };
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, run));
  }

  const state = { info: null, source: "a", names: [] };

  return { TOKEN, url, api, showError, clearError, h, bytes, count, shape, kindText, pool, state };
})();
