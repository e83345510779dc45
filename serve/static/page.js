"use strict";
// The live page: stream a completion from /v1/completions (server-sent events, logprobs 5), show each token as it
// arrives, and on demand ask /api/attention for the attention of the position that chose a token. Token text only
// reaches the page through textContent, never innerHTML, so no token can inject markup.
const $ = (id) => document.getElementById(id);
const state = { tokens: [], prompt: "", controller: null, selected: -1, attention: null, auth: false };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("apikey").value;
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  td.textContent = text;
  tr.appendChild(td);
  return td;
}

function shown(s) { return JSON.stringify(s).slice(1, -1); }  // "\n" stays visible as \n

async function loadHealth() {
  try {
    const r = await fetch("/health");
    const h = await r.json();
    $("model").textContent = h.model + " · context " + h.context + " · batch " + h.max_batch;
    state.auth = h.auth;
    $("keyrow").hidden = !h.auth;
    $("max_tokens").max = h.max_tokens;
  } catch (e) { $("health").textContent = "server unreachable"; }
}

function request() {
  const num = (id) => Number($(id).value);
  const body = { prompt: $("prompt").value, max_tokens: num("max_tokens"), temperature: num("temperature"),
                 top_p: num("top_p"), top_k: num("top_k"), repetition_penalty: num("repetition_penalty"),
                 stream: true, logprobs: 5 };
  if ($("seed").value !== "") body.seed = num("seed");
  const stops = $("stop").value.split("\n").filter((s) => s).map((s) => s.replace(/\\n/g, "\n").replace(/\\t/g, "\t"));
  if (stops.length) body.stop = stops;
  return body;
}

function addToken(tok, id, logprob, top) {
  const i = state.tokens.length;
  state.tokens.push({ text: tok, id: id, logprob: logprob, top: top });
  const span = document.createElement("span");
  span.className = "tok";
  span.dataset.i = String(i);
  span.textContent = tok;
  span.addEventListener("mouseenter", () => showAlternatives(i));
  span.addEventListener("click", () => select(i));
  $("gen").appendChild(span);
}

async function generate(ev) {
  ev.preventDefault();
  const body = request();
  state.tokens = []; state.prompt = body.prompt; state.selected = -1; state.attention = null;
  $("prompt-echo").textContent = body.prompt;
  $("gen").textContent = "";
  $("attn").textContent = ""; $("heads").textContent = ""; $("sel").textContent = "none selected";
  $("alts").tBodies[0].textContent = "";
  $("go").disabled = true; $("halt").disabled = false;
  const controller = new AbortController();
  state.controller = controller;
  const t0 = performance.now();
  let first = 0, finish = null;
  try {
    const r = await fetch("/v1/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                signal: controller.signal });
    if (!r.ok) {
      const err = await r.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || ("HTTP " + r.status));
    }
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        for (const c of chunk.choices) {
          const lp = c.logprobs;
          if (lp) lp.tokens.forEach((t, k) => addToken(t, lp.token_ids[k], lp.token_logprobs[k], lp.top_logprobs[k]));
          if (c.finish_reason) finish = c.finish_reason;
        }
        if (!first && state.tokens.length) first = performance.now() - t0;
        const secs = (performance.now() - t0) / 1000;
        $("status").textContent = state.tokens.length + " tokens · first after " + Math.round(first) + " ms · " +
          (state.tokens.length / secs).toFixed(1) + " tokens/s";
      }
    }
    $("status").textContent += " · finish: " + (finish || "?");
  } catch (e) {
    $("status").textContent = e.name === "AbortError" ? "stopped after " + state.tokens.length + " tokens"
                                                      : "error: " + e.message;
  } finally {
    $("go").disabled = false; $("halt").disabled = true; state.controller = null;
  }
}

function altRow(label, p, chosen) {
  const tr = document.createElement("tr");
  if (chosen) tr.className = "chosen";
  const code = document.createElement("code");
  code.className = "t";
  code.textContent = label;
  cell(tr, "").appendChild(code);
  cell(tr, (100 * p).toFixed(1) + "%", "p");
  const bar = document.createElement("div");
  bar.className = "barfill";
  bar.style.width = (100 * p).toFixed(1) + "%";
  cell(tr, "", "bar").appendChild(bar);
  return tr;
}

function showAlternatives(i) {
  const t = state.tokens[i], top = t.top || {};
  const tbody = $("alts").tBodies[0];
  tbody.textContent = "";
  $("sel").textContent = "#" + i + " " + shown(t.text) + "  (p = " + Math.exp(t.logprob).toFixed(3) + ")";
  for (const [text, lp] of Object.entries(top)) tbody.appendChild(altRow(shown(text), Math.exp(lp), text === t.text));
  // a token sampled from outside the top 5 is shown below them
  if (!(t.text in top)) tbody.appendChild(altRow(shown(t.text) + " (chosen)", Math.exp(t.logprob), true));
}

async function select(i) {
  state.selected = i;
  for (const s of document.querySelectorAll(".tok.on")) s.classList.remove("on");
  document.querySelector('.tok[data-i="' + i + '"]').classList.add("on");
  showAlternatives(i);
  $("attn").textContent = "capturing...";
  try {
    const ids = state.tokens.slice(0, i).map((t) => t.id);
    const r = await fetch("/api/attention", { method: "POST", headers: headers(),
                                               body: JSON.stringify({ prompt: state.prompt, token_ids: ids }) });
    const a = await r.json();
    if (!r.ok) throw new Error((a.error && a.error.message) || ("HTTP " + r.status));
    if (state.selected !== i) return;
    state.attention = a;
    fillPickers(a);
    drawAttention();
  } catch (e) { $("attn").textContent = "error: " + e.message; }
}

function labelOf(layer, head) {
  const h = (state.attention.heads || []).find((s) => s.layer === layer && s.head === head);
  return h ? h.label : "";
}

function fillPickers(a) {
  const layer = $("layer"), keepL = layer.value;
  layer.textContent = "";
  for (let l = 0; l < a.n_layer; l++) layer.add(new Option(String(l), String(l)));
  if (keepL && Number(keepL) < a.n_layer) layer.value = keepL;
  fillHeads();
}

function fillHeads() {
  const a = state.attention, head = $("head"), keep = head.value, l = Number($("layer").value);
  head.textContent = "";
  head.add(new Option("average of heads", "avg"));
  for (let h = 0; h < a.n_head; h++) head.add(new Option(h + " · " + labelOf(l, h), String(h)));
  head.value = keep && (keep === "avg" || Number(keep) < a.n_head) ? keep : "avg";
}

function drawAttention() {
  const a = state.attention;
  if (!a) return;
  const l = Number($("layer").value), hv = $("head").value;
  let w;
  if (hv === "avg") {
    w = a.weights[l][0].map((_, k) => a.weights[l].reduce((s, row) => s + row[k], 0) / a.n_head);
  } else {
    w = a.weights[l][Number(hv)];
  }
  const labels = [];
  for (let h = 0; h < a.n_head; h++) labels.push("h" + h + " " + labelOf(l, h));
  $("heads").textContent = "layer " + l + " heads: " + labels.join(" · ");
  const box = $("attn"), top = Math.max(...w);
  box.textContent = "";
  a.tokens.forEach((t, k) => {
    const span = document.createElement("span");
    span.className = "ctx";
    span.textContent = t;
    span.title = (100 * w[k]).toFixed(1) + "%";
    span.style.backgroundColor = "rgba(214, 39, 40, " + (top > 0 ? w[k] / top : 0).toFixed(3) + ")";
    box.appendChild(span);
  });
}

$("form").addEventListener("submit", generate);
$("halt").addEventListener("click", () => state.controller && state.controller.abort());
$("layer").addEventListener("change", () => { fillHeads(); drawAttention(); });
$("head").addEventListener("change", drawAttention);
document.body.dataset.ready = "1";
loadHealth();
