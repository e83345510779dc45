"use strict";
// The film: reads the JSON block #film-data written by inspector/film.py and draws with canvas and SVG.
// Token text only reaches the page through textContent and canvas fillText, never as markup.
(function () {
  const D = JSON.parse(document.getElementById("film-data").textContent);
  const L = D.layers.length, H = D.heads.length, N = D.frames.length;
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"];
  const GREY = "#e8e8ec", MUTED = "#6b6b70";
  const state = { frame: N - 1, metric: "induction", timer: null };
  const decoded = new Map();

  function lower(fi) {  // uint8 lower triangles of every head of frame fi, decoded once
    if (!decoded.has(fi)) {
      const bin = atob(D.frames[fi].weights), q = new Uint8Array(bin.length);
      for (let k = 0; k < bin.length; k++) q[k] = bin.charCodeAt(k);
      decoded.set(fi, q);
    }
    return decoded.get(fi);
  }
  function colour(v) {  // scores in [0, 1], linear
    const x = Math.min(1, Math.max(0, v));
    return D.colormap[Math.round(x * (D.colormap.length - 1))];
  }
  function rgb(hex) { return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)); }
  const RGB = D.colormap.map(rgb);
  function headName(k) { return "L" + D.layers[Math.floor(k / H)] + " H" + D.heads[k % H]; }

  function drawScores() {
    const f = D.frames[state.frame];
    const cell = Math.max(24, Math.min(44, Math.floor(200 / Math.max(L, H))));
    const padL = 28, padT = 16;
    for (const canvas of document.querySelectorAll("canvas.score")) {
      const values = f.scores[canvas.dataset.key];
      canvas.width = padL + H * cell;
      canvas.height = padT + L * cell;
      const ctx = canvas.getContext("2d");
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, canvas.width, canvas.height);
      ctx.font = "11px system-ui, sans-serif";
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillStyle = MUTED;
      for (let h = 0; h < H; h++) ctx.fillText("H" + D.heads[h], padL + (h + 0.5) * cell, padT / 2);
      for (let l = 0; l < L; l++) ctx.fillText("L" + D.layers[l], padL / 2, padT + (l + 0.5) * cell);
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < H; h++) {
          const v = values[l * H + h];
          ctx.fillStyle = v === null ? GREY : colour(v);
          ctx.fillRect(padL + h * cell + 1, padT + l * cell + 1, cell - 2, cell - 2);
          if (v !== null && cell >= 28) {
            ctx.fillStyle = v > 0.6 ? "#111" : "#fff";
            ctx.fillText(v.toFixed(2), padL + (h + 0.5) * cell, padT + (l + 0.5) * cell);
          }
        }
      }
    }
  }

  function drawGrid() {
    const f = D.frames[state.frame], T = f.T, TRI = T * (T + 1) / 2, q = lower(state.frame);
    const canvas = $("grid"), gap = 10, padL = 28, padT = 16;
    const size = Math.max(72, Math.min(200, Math.floor((620 - padL) / H) - gap));
    canvas.width = padL + H * (size + gap);
    canvas.height = padT + L * (size + gap);
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillStyle = MUTED;
    for (let h = 0; h < H; h++) ctx.fillText("H" + D.heads[h], padL + h * (size + gap) + size / 2, padT / 2);
    for (let l = 0; l < L; l++) ctx.fillText("L" + D.layers[l], padL / 2, padT + l * (size + gap) + size / 2);
    const tile = document.createElement("canvas");
    tile.width = T;
    tile.height = T;
    const tctx = tile.getContext("2d"), img = tctx.createImageData(T, T), grey = rgb(GREY);
    ctx.imageSmoothingEnabled = false;
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < H; h++) {
        const base = (l * H + h) * TRI;
        for (let i = 0, o = 0; i < T; i++) {
          for (let j = 0; j < T; j++) {
            // square-root scale, as in the viewer and the PNGs: small weights stay visible
            const c = j <= i ? RGB[Math.round(Math.sqrt(q[base + o++] / D.scale) * (RGB.length - 1))] : grey;
            const p = 4 * (i * T + j);
            img.data[p] = c[0]; img.data[p + 1] = c[1]; img.data[p + 2] = c[2]; img.data[p + 3] = 255;
          }
        }
        tctx.putImageData(img, 0, 0);
        ctx.drawImage(tile, padL + h * (size + gap), padT + l * (size + gap), size, size);
      }
    }
  }

  const chart = { w: 900, h: 300, left: 44, right: 16, top: 12, bottom: 34 };
  function xOf(step) {
    const a = D.frames[0].step, b = D.frames[N - 1].step;
    return chart.left + (b > a ? (step - a) / (b - a) : 0.5) * (chart.w - chart.left - chart.right);
  }
  function yOf(v) { return chart.top + (1 - v) * (chart.h - chart.top - chart.bottom); }
  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    parent.appendChild(e);
    return e;
  }
  function drawChart() {
    const svg = $("chart"), key = state.metric;
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${chart.w} ${chart.h}`);
    svg.setAttribute("width", chart.w);
    svg.setAttribute("height", chart.h);
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      el("line", { x1: chart.left, x2: chart.w - chart.right, y1: yOf(v), y2: yOf(v), stroke: "#eee" }, svg);
      el("text", { x: chart.left - 6, y: yOf(v) + 4, "text-anchor": "end", class: "tick" }, svg).textContent = v;
    }
    const stride = Math.max(1, Math.ceil(N / 8));
    for (let fi = 0; fi < N; fi += stride) {
      const x = xOf(D.frames[fi].step);
      el("text", { x: x, y: chart.h - chart.bottom + 16, "text-anchor": "middle", class: "tick" }, svg)
        .textContent = D.frames[fi].step;
    }
    el("text", { x: chart.w - chart.right, y: chart.h - 4, "text-anchor": "end", class: "tick" }, svg)
      .textContent = "step";
    if (key in D.thresholds) {
      const y = yOf(D.thresholds[key]);
      el("line", { x1: chart.left, x2: chart.w - chart.right, y1: y, y2: y, stroke: "#999",
                   "stroke-dasharray": "5 4" }, svg);
    }
    for (let k = 0; k < L * H; k++) {
      const pts = D.frames.filter((f) => f.scores[key][k] !== null)
        .map((f) => xOf(f.step).toFixed(1) + "," + yOf(f.scores[key][k]).toFixed(1));
      el("polyline", { points: pts.join(" "), fill: "none", stroke: PALETTE[k % PALETTE.length],
                       "stroke-width": 1.8, "data-head": headName(k) }, svg);
    }
    el("line", { id: "cursor", y1: chart.top, y2: chart.h - chart.bottom, stroke: "#d62728" }, svg);
    const legend = $("legend");
    legend.replaceChildren();
    for (let k = 0; k < L * H; k++) {
      const item = document.createElement("span"), swatch = document.createElement("i");
      swatch.style.background = PALETTE[k % PALETTE.length];
      item.append(swatch, headName(k));
      legend.appendChild(item);
    }
    moveCursor();
  }
  function moveCursor() {
    const x = xOf(D.frames[state.frame].step);
    const cursor = $("cursor");
    cursor.setAttribute("x1", x);
    cursor.setAttribute("x2", x);
  }

  function show(fi) {
    state.frame = fi;
    const f = D.frames[fi], values = f.scores[state.metric];
    let best = -1;
    for (let k = 0; k < values.length; k++) if (values[k] !== null && (best < 0 || values[k] > values[best])) best = k;
    $("steplabel").textContent = `step ${f.step} (evaluation ${fi + 1} of ${N})` + (best < 0 ? "" :
      ` \u00b7 strongest ${D.scores[state.metric]}: ${headName(best)} ${values[best].toFixed(2)}`);
    drawScores();
    drawGrid();
    moveCursor();
    document.body.dataset.view = "step " + f.step;
  }

  $("step").addEventListener("input", (e) => show(Number(e.target.value)));
  $("metric").addEventListener("change", (e) => { state.metric = e.target.value; drawChart(); show(state.frame); });
  $("play").addEventListener("click", () => {
    if (state.timer !== null) {
      clearInterval(state.timer);
      state.timer = null;
      $("play").textContent = "play";
      return;
    }
    if (state.frame === N - 1) show(0);
    $("step").value = state.frame;
    $("play").textContent = "pause";
    state.timer = setInterval(() => {
      if (state.frame >= N - 1) { $("play").click(); return; }
      $("step").value = state.frame + 1;
      show(state.frame + 1);
    }, 500);
  });
  drawChart();
  show(N - 1);
})();
