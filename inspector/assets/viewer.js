"use strict";
(function () {
  const D = JSON.parse(document.getElementById("attn-data").textContent);
  const T = D.T, L = D.layers.length, H = D.heads.length, TRI = T * (T + 1) / 2;
  const bin = atob(D.weights);
  const Q = new Uint8Array(bin.length);
  for (let k = 0; k < bin.length; k++) Q[k] = bin.charCodeAt(k);
  const GREY = "#d9d9d9";
  const state = { layer: 0, head: H > 1 ? H : 0, query: T - 1 };  // head index H = head average
  const cache = new Map();
  const $ = (id) => document.getElementById(id);
  const tip = $("tip");

  function matrix(li, hi) {
    const key = li * (H + 1) + hi;
    if (cache.has(key)) return cache.get(key);
    const M = new Float32Array(T * T);
    const heads = hi < H ? [hi] : [...Array(H).keys()];
    for (const h of heads) {
      const base = (li * H + h) * TRI;
      for (let i = 0, o = 0; i < T; i++) for (let j = 0; j <= i; j++, o++) M[i * T + j] += Q[base + o];
    }
    const s = D.scale * heads.length;
    for (let k = 0; k < M.length; k++) M[k] /= s;
    cache.set(key, M);
    return M;
  }
  function color(v) {  // same square-root scale and colormap as the PNGs
    const x = Math.sqrt(Math.min(1, Math.max(0, v)));
    return D.colormap[Math.round(x * (D.colormap.length - 1))];
  }
  function show(t) {
    return t.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/ /g, "\u2423");
  }
  function short(t) { const s = show(t); return s.length > 10 ? s.slice(0, 9) + "\u2026" : s; }
  function headName(hi) { return hi < H ? "head " + D.heads[hi] : "head average"; }
  function fmt(v) { return v.toFixed(3); }

  // ---- the big map --------------------------------------------------------------------------
  const map = $("map");
  const geo = { cell: 1, left: 0, top: 0 };
  function drawMap() {
    const M = matrix(state.layer, state.head);
    const cell = Math.max(2, Math.min(26, Math.floor(600 / T)));
    const labels = cell >= 9;
    const ctx = map.getContext("2d");
    ctx.font = "11px ui-monospace, Menlo, Consolas, monospace";
    let lab = 0;
    if (labels) for (const t of D.tokens) lab = Math.max(lab, ctx.measureText(short(t)).width);
    const left = labels ? Math.ceil(lab) + 10 : 4, top = labels ? Math.ceil(lab) + 10 : 4;
    const w = left + T * cell + 4, h = top + T * cell + 4, dpr = window.devicePixelRatio || 1;
    map.width = w * dpr; map.height = h * dpr; map.style.width = w + "px"; map.style.height = h + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, h);
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
      ctx.fillStyle = j > i ? GREY : color(M[i * T + j]);
      ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
    }
    ctx.strokeStyle = "#d62728"; ctx.lineWidth = 1.5;
    ctx.strokeRect(left + 0.75, top + state.query * cell + 0.75, T * cell - 1.5, cell - 1.5);
    if (labels) {
      ctx.font = "11px ui-monospace, Menlo, Consolas, monospace";
      ctx.textBaseline = "middle";
      for (let i = 0; i < T; i++) {
        ctx.fillStyle = i === state.query ? "#d62728" : "#333";
        ctx.textAlign = "right";
        ctx.fillText(short(D.tokens[i]), left - 5, top + i * cell + cell / 2);
        ctx.save();
        ctx.translate(left + i * cell + cell / 2, top - 5);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left";
        ctx.fillStyle = "#333";
        ctx.fillText(short(D.tokens[i]), 0, 0);
        ctx.restore();
      }
    }
    Object.assign(geo, { cell, left, top });
  }
  function cellAt(ev) {
    const r = map.getBoundingClientRect();
    const j = Math.floor((ev.clientX - r.left - geo.left) / geo.cell);
    const i = Math.floor((ev.clientY - r.top - geo.top) / geo.cell);
    return i >= 0 && i < T && j >= 0 && j < T ? { i, j } : null;
  }
  function showTip(ev, text) {
    tip.textContent = text; tip.hidden = false;
    tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
  }
  map.addEventListener("mousemove", (ev) => {
    const c = cellAt(ev);
    if (!c) { tip.hidden = true; return; }
    const v = c.j > c.i ? "masked (future)" : fmt(matrix(state.layer, state.head)[c.i * T + c.j]);
    showTip(ev, "query " + c.i + " " + JSON.stringify(D.tokens[c.i]) + "\nkey   " + c.j + " " +
      JSON.stringify(D.tokens[c.j]) + "\nweight " + v);
  });
  map.addEventListener("mouseleave", () => { tip.hidden = true; });
  map.addEventListener("click", (ev) => { const c = cellAt(ev); if (c) { state.query = c.i; draw(); } });

  // ---- the token view: what the selected query attends to -----------------------------------
  const tokensBox = $("tokens");
  function drawTokens() {
    const M = matrix(state.layer, state.head);
    tokensBox.textContent = "";
    D.tokens.forEach((t, j) => {
      const s = document.createElement("span");
      s.className = "tok";
      s.textContent = t.replace(/\n/g, "\u21b5");
      if (j >= D.n_prompt) s.classList.add("gen");
      if (j === state.query) s.classList.add("query");
      if (j > state.query) s.classList.add("future");
      else {
        const a = Math.sqrt(M[state.query * T + j]);
        s.style.backgroundColor = "rgba(33,113,181," + a.toFixed(3) + ")";
        if (a > 0.55) s.style.color = "#fff";
      }
      s.addEventListener("click", () => { state.query = j; draw(); });
      s.addEventListener("mousemove", (ev) => showTip(ev, j > state.query ? "token " + j + ": after the query" :
        "query " + state.query + " \u2192 token " + j + ": " + fmt(M[state.query * T + j])));
      s.addEventListener("mouseleave", () => { tip.hidden = true; });
      tokensBox.appendChild(s);
      if (t.includes("\n")) {
        tokensBox.appendChild(Object.assign(document.createElement("span"), { className: "nlbreak" }));
      }
    });
    $("qlabel").textContent = state.query + " " + JSON.stringify(D.tokens[state.query]);
  }

  // ---- thumbnails of the heads of the current layer -------------------------------------------
  function drawThumbs() {
    const box = $("thumbs");
    box.textContent = "";
    const rgb = D.colormap.map((c) => [1, 3, 5].map((k) => parseInt(c.slice(k, k + 2), 16)));
    for (let hi = 0; hi < (H > 1 ? H + 1 : 1); hi++) {
      const M = matrix(state.layer, hi);
      const div = document.createElement("div");
      div.className = "thumb" + (hi === state.head ? " on" : "");
      const c = document.createElement("canvas");
      c.width = T; c.height = T;
      const ctx = c.getContext("2d"), img = ctx.createImageData(T, T);
      for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
        const p = (i * T + j) * 4;
        const col = j > i ? [217, 217, 217] :
          rgb[Math.round(Math.sqrt(Math.min(1, M[i * T + j])) * (rgb.length - 1))];
        img.data[p] = col[0]; img.data[p + 1] = col[1]; img.data[p + 2] = col[2]; img.data[p + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
      const cap = document.createElement("div");
      const st = hi < H ? stat(D.layers[state.layer], D.heads[hi]) : null;
      cap.textContent = (hi < H ? "H" + D.heads[hi] : "avg") + (st && st.label !== "mixed" ? " " + st.label : "");
      div.append(c, cap);
      div.addEventListener("click", () => { state.head = hi; draw(); });
      box.appendChild(div);
    }
  }

  // ---- the statistics table -----------------------------------------------------------------
  const COLS = ["layer", "head", "label"].concat(D.stat_keys);
  let sortKey = null, sortDir = 1;
  function stat(layer, head) { return D.stats.find((s) => s.layer === layer && s.head === head) || null; }
  function drawTable() {
    const table = $("stats");
    table.textContent = "";
    const thead = table.createTHead().insertRow();
    for (const k of COLS) {
      const th = document.createElement("th");
      th.textContent = k + (k === sortKey ? (sortDir > 0 ? " \u25b2" : " \u25bc") : "");
      th.title = D.descriptions[k] || "";
      th.addEventListener("click", () => { sortDir = sortKey === k ? -sortDir : -1; sortKey = k; drawTable(); });
      thead.appendChild(th);
    }
    const rows = D.stats.slice();
    if (sortKey) rows.sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      if (x === y) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    const body = table.createTBody();
    for (const s of rows) {
      const tr = body.insertRow();
      const li = D.layers.indexOf(s.layer), hi = D.heads.indexOf(s.head);
      if (li === state.layer && hi === state.head) tr.className = "on";
      for (const k of COLS) {
        const td = tr.insertCell(), v = s[k];
        if (k === "label") { td.className = "label"; td.textContent = v; continue; }
        if (v === null || v === undefined) { td.textContent = "\u2013"; continue; }
        td.textContent = k === "layer" || k === "head" ? String(v) : v.toFixed(k === "mean_distance" ? 1 : 2);
        if (D.unit_keys.includes(k)) td.style.backgroundColor = "rgba(33,113,181," + (0.6 * v).toFixed(3) + ")";
      }
      tr.addEventListener("click", () => { state.layer = li; state.head = hi; syncPickers(); draw(); });
    }
  }

  // ---- pickers ------------------------------------------------------------------------------
  const layerSel = $("layer"), headSel = $("head");
  D.layers.forEach((l, li) => layerSel.add(new Option("layer " + l, String(li))));
  D.heads.forEach((h, hi) => headSel.add(new Option("head " + h, String(hi))));
  if (H > 1) headSel.add(new Option("head average", String(H)));
  function syncPickers() { layerSel.value = String(state.layer); headSel.value = String(state.head); }
  layerSel.addEventListener("change", () => { state.layer = +layerSel.value; draw(); });
  headSel.addEventListener("change", () => { state.head = +headSel.value; draw(); });

  function draw() {
    drawMap(); drawTokens(); drawThumbs(); drawTable();
    const s = state.head < H ? stat(D.layers[state.layer], D.heads[state.head]) : null;
    $("status").textContent = "layer " + D.layers[state.layer] + ", " + headName(state.head) +
      (s ? " \u00b7 " + s.label : "") + " \u00b7 query " + state.query;
    document.body.dataset.view = "L" + state.layer + " H" + state.head + " Q" + state.query;
  }
  // legend
  const lg = $("legendbar"), lctx = lg.getContext("2d");
  for (let x = 0; x < lg.width; x++) {
    lctx.fillStyle = color((x / (lg.width - 1)) ** 2);  // x runs along sqrt(weight)
    lctx.fillRect(x, 0, 1, lg.height);
  }
  syncPickers();
  draw();
})();
