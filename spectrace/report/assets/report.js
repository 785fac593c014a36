// spectrace report: the page of one trace (spectrace/report/data.py builds its data).
// Every string comes from the trace and is untrusted: text goes in through textContent and
// attributes through setAttribute, never as HTML.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("trace-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const FATES = D.fates; // root, correct, rejected, unreached, bonus
  const COLORS = {root: ["#e0e0e0", "#616161"], correct: ["#c8e6c9", "#2e7d32"], rejected: ["#ffcdd2", "#c62828"],
                  unreached: ["#f5f5f5", "#9e9e9e"], bonus: ["#bbdefb", "#1565c0"], drafted: ["#e0f7fa", "#00838f"]};
  const ORDER = ["DRAFT", "VERIFY", "ACCEPT", "COMMIT", "EXTEND"];
  const PHASE_EVENTS = {DRAFT: ["draft"], VERIFY: ["verify"], ACCEPT: ["verify"], COMMIT: ["commit", "finish"],
                        EXTEND: ["extend"]};
  const PHASE_WHAT = {DRAFT: "draft KV scratch, [topk][step], released after drafting",
                      VERIFY: "target KV of the verify rows", ACCEPT: "target KV of the verify rows",
                      COMMIT: "target KV: keep the accepted path, release the rest", EXTEND: "draft KV (DRAFT_EXTEND)"};
  const LABEL = 40;
  const algo = String(D.meta.algo);
  const byRequest = new Map();
  D.steps.forEach((s, i) => { if (!byRequest.has(s.r)) byRequest.set(s.r, []); byRequest.get(s.r).push(i); });
  const state = {req: D.requests.length ? D.requests[0].id : 0, pos: 0, phase: 0, node: 0};

  // ---- helpers --------------------------------------------------------------------------
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  const tokText = (t) => (D.tokens[t] !== undefined ? D.tokens[t] : "<" + t + ">");
  const flowing = (t) => tokText(t).replace(/↵/g, "↵\n"); // `shown` writes a line break as ↵ (a literal ↵ is escaped)
  const label = (s) => (s.length > LABEL ? s.slice(0, LABEL - 1) + "…" : s);
  const fmt = (x, d) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(d === undefined ? 3 : d));
  const fate = (n) => FATES[n[3]];
  const steps = () => byRequest.get(state.req) || [];
  const current = () => D.steps[steps()[state.pos]];
  function phases(s) {
    const out = [];
    for (let d = 1; d <= s.levels; d++) out.push("DRAFT " + d);
    out.push("VERIFY", "ACCEPT", "COMMIT");
    if (algo !== "none") out.push("EXTEND");
    return out;
  }
  const after = (phase, name) => ORDER.indexOf(phase.split(" ")[0]) >= ORDER.indexOf(name);
  function children(nodes) {
    const kids = nodes.map(() => []);
    nodes.forEach((n, i) => { if (n[1] >= 0) kids[n[1]].push(i); });
    return kids;
  }
  function visible(s, phase) {
    const n = s.n, keep = new Set();
    n.forEach((node, i) => {
      const bonus = fate(node) === "bonus";
      if (phase.startsWith("DRAFT")) { if (!bonus && node[2] <= Number(phase.split(" ")[1])) keep.add(i); }
      else if (phase === "VERIFY") { if (!bonus) keep.add(i); }
      else keep.add(i);
    });
    const kids = children(n), out = [], stack = [0];
    while (stack.length) {
      const i = stack.pop();
      if (keep.has(i)) out.push(i);
      for (let k = kids[i].length - 1; k >= 0; k--) stack.push(kids[i][k]);
    }
    return out;
  }
  function acceptedPath(s) { // node indices of the correct drafts, by depth
    return s.n.map((n, i) => [n, i]).filter(([n]) => fate(n) === "correct").sort((a, b) => a[0][2] - b[0][2])
      .map(([, i]) => i);
  }

  // ---- the summary ----------------------------------------------------------------------
  function barChart(title, labels, values, fmtValue, id) {
    const w = 300, h = 150, pad = 28, box = el("figure", {class: "chart", id: id});
    box.appendChild(el("figcaption", {}, title));
    const g = svg("svg", {width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img"});
    const top = Math.max(...values, 1e-9), bw = (w - pad) / Math.max(values.length, 1);
    values.forEach((v, i) => {
      const bh = (h - 2 * pad) * v / top, x = pad + i * bw;
      const bar = svg("rect", {x: x + 2, y: h - pad - bh, width: Math.max(bw - 4, 1), height: bh, class: "bar"});
      bar.appendChild(svg("title", {}, `${labels[i]}: ${fmtValue(v)}`));
      g.appendChild(bar);
      g.appendChild(svg("text", {x: x + bw / 2, y: h - pad + 12, "text-anchor": "middle"}, labels[i]));
      g.appendChild(svg("text", {x: x + bw / 2, y: h - pad - bh - 3, "text-anchor": "middle"}, fmtValue(v)));
    });
    box.appendChild(g);
    return box;
  }
  function lineChart(title, values, id) {
    const w = 620, h = 150, pad = 30, box = el("figure", {class: "chart", id: id});
    box.appendChild(el("figcaption", {}, title));
    const g = svg("svg", {width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img"});
    const top = Math.max(...values, 1), n = Math.max(values.length - 1, 1), stride = Math.max(1, Math.floor(values.length / 2000));
    const pts = [];
    for (let i = 0; i < values.length; i += stride) pts.push(`${pad + (w - 2 * pad) * i / n},${h - pad - (h - 2 * pad) * values[i] / top}`);
    g.appendChild(svg("polyline", {points: pts.join(" "), class: "line"}));
    g.appendChild(svg("text", {x: 2, y: pad}, fmt(top, 2)));
    g.appendChild(svg("text", {x: 2, y: h - pad}, "0"));
    g.appendChild(svg("text", {x: w - pad, y: h - 8, "text-anchor": "end"}, `step ${values.length}`));
    box.appendChild(g);
    return box;
  }
  function summary() {
    const m = D.summary, meta = D.meta, box = el("section", {id: "summary"});
    const shape = algo === "none" ? "" : ` (${meta.num_steps}, ${meta.topk}, ${meta.num_draft_tokens})`;
    box.appendChild(el("h1", {}, `spectrace · ${algo}${shape}`));
    const known = (v) => v !== null && v !== undefined;
    box.appendChild(el("p", {class: "meta", id: "meta"}, [
      ["acceptance", meta.acceptance], ["temperature", meta.temperature], ["backend", meta.backend],
      ["device", meta.device], ["dtype", meta.dtype], ["trace level", meta.trace_level],
    ].filter(([, v]) => known(v)).map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : v}`)
      .concat([`${D.requests.length} request(s)`, `${D.steps.length} steps`]).join(" · ")));
    for (const n of D.notices) box.appendChild(el("p", {class: "notice"}, n));
    if (m.derived) box.appendChild(el("p", {class: "notice", id: "derived"},
      "no summary record (the run did not finish): these numbers come from the steps the trace holds"));
    const cards = el("div", {class: "cards"});
    const card = (id, name, value) => {
      const c = el("div", {class: "card"});
      c.appendChild(el("div", {class: "value", id: id}, value));
      c.appendChild(el("div", {class: "name"}, name));
      cards.appendChild(c);
    };
    card("sum-tau", "τ accept_length", fmt(m.accept_length));
    card("sum-alpha", "α accept_rate", fmt(m.accept_rate));
    card("sum-verify", "verify_ct", String(m.verify_ct));
    card("sum-tokens", "completion tokens", String(m.completion_tokens));
    card("sum-tps", "tokens/s", fmt(m.tokens_per_s, 1));
    box.appendChild(cards);
    const charts = el("div", {class: "charts"});
    const pos = m.per_position || [];
    if (pos.length) charts.appendChild(barChart("acceptance by draft position", pos.map((_, i) => String(i + 1)), pos,
      (v) => fmt(v, 2), "chart-position"));
    const hist = m.accept_len_histogram || {};
    const keys = Object.keys(hist).sort((a, b) => a - b);
    if (keys.length) charts.appendChild(barChart("accept_len histogram", keys, keys.map((k) => hist[k]), String,
      "chart-histogram"));
    let total = 0;
    const running = D.steps.map((s, i) => (total += s.al) / (i + 1));
    if (running.length) charts.appendChild(lineChart("mean accept_len of the steps so far", running, "chart-tau"));
    box.appendChild(charts);
    return box;
  }

  // ---- the text ---------------------------------------------------------------------------
  const legend = [["tok-prefill", "first token (prefill)"], ["tok-draft d1", "accepted draft, depth 1"],
                  ["tok-draft d3", "depth 3"], ["tok-draft d5", "depth 5+"], ["tok-bonus", "bonus"],
                  ["tok-plain", "plain decode"]];
  function textPanel() {
    const box = el("section", {id: "text-panel"});
    const bar = el("div", {class: "bar-row"});
    bar.appendChild(el("h2", {}, "generated text"));
    const pick = el("select", {id: "request", "aria-label": "request"});
    for (const r of D.requests) pick.appendChild(el("option", {value: String(r.id)}, `request ${r.id}`));
    pick.addEventListener("change", () => { state.req = Number(pick.value); state.pos = 0; state.phase = 0; renderText(); render(); });
    bar.appendChild(pick);
    const keys = el("span", {class: "legend"});
    for (const [cls, name] of legend) keys.appendChild(el("span", {class: "tok " + cls}, name));
    bar.appendChild(keys);
    box.appendChild(bar);
    box.appendChild(el("div", {id: "text"}));
    return box;
  }
  function renderText() {
    const box = document.getElementById("text"), frag = document.createDocumentFragment();
    box.textContent = "";
    const req = D.requests.find((r) => r.id === state.req) || {};
    if (req.prompt) frag.appendChild(el("span", {class: "prompt"}, req.prompt.replace(/↵/g, "↵\n")));
    if (req.first !== null && req.first !== undefined) frag.appendChild(el("span", {class: "tok tok-prefill", "data-k": "-1"}, flowing(req.first)));
    steps().forEach((gi, pos) => {
      const s = D.steps[gi];
      s.c.forEach((t, k) => {
        const cls = s.n.length <= 2 ? "tok-plain" : k < s.nd ? "tok-draft d" + Math.min(k + 1, 8) : "tok-bonus";
        frag.appendChild(el("span", {class: "tok " + cls, "data-pos": String(pos), "data-k": String(k)}, flowing(t)));
      });
    });
    box.appendChild(frag);
  }
  function tokenTip(span) {
    if (span.dataset.pos === undefined) return "the first token, from the prefill";
    const s = D.steps[steps()[Number(span.dataset.pos)]], k = Number(span.dataset.k), path = acceptedPath(s);
    const head = `step ${s.s} · request ${s.r} · `;
    const competing = (parent, self) => children(s.n)[parent].filter((i) => i !== self)
      .map((i) => `"${label(tokText(s.n[i][0]))}" q ${fmt(s.n[i][4])} (${fate(s.n[i])})`);
    let lines;
    if (s.n.length <= 2) lines = [head + "plain decode (no drafts)"];
    else if (k < s.nd) {
      const i = path[k], n = s.n[i];
      lines = [head + `accepted draft at depth ${n[2]}: q ${fmt(n[4])}, p ${fmt(n[6])}`];
      const rivals = competing(n[1], i);
      lines.push(rivals.length ? "drafts beside it: " + rivals.join(", ") : "no other draft at its parent");
    } else {
      const b = s.n[s.n.length - 1], rivals = competing(b[1], s.n.length - 1);
      lines = [head + `bonus: the target's token after the last correct draft (p ${fmt(b[6])})`];
      lines.push(rivals.length ? "drafts the target refused here: " + rivals.join(", ") : "no draft at this position");
    }
    return lines.join("\n");
  }

  // ---- the step viewer --------------------------------------------------------------------
  function viewer() {
    const box = el("section", {id: "viewer"});
    const bar = el("div", {class: "bar-row"});
    bar.appendChild(el("h2", {}, "steps"));
    bar.appendChild(el("input", {type: "range", id: "slider", min: "0", max: "0", value: "0", "aria-label": "step"}));
    bar.appendChild(el("span", {id: "step-label"}));
    bar.appendChild(el("span", {class: "hint"}, "← → phase · shift+← → or PgUp PgDn step · ↑ ↓ node · click a token or a node"));
    box.appendChild(bar);
    box.appendChild(el("div", {id: "phases"}));
    const row = el("div", {class: "viewer-row"});
    row.appendChild(el("div", {id: "tree"}));
    const side = el("div", {class: "side"});
    side.appendChild(el("div", {id: "inspector"}));
    side.appendChild(el("pre", {id: "kv"}));
    row.appendChild(side);
    box.appendChild(row);
    return box;
  }
  function drawTree(s, phase) {
    const box = document.getElementById("tree");
    box.textContent = "";
    const shown = visible(s, phase), keep = new Set(shown), kids = children(s.n), walked = after(phase, "ACCEPT");
    const W = 132, H = 50, GX = 14, GY = 34, x = {}, y = {};
    let leaf = 0;
    (function place(i) { // leaves left to right in walk order; a parent over its children
      const cs = kids[i].filter((c) => keep.has(c));
      cs.forEach(place);
      x[i] = cs.length ? (x[cs[0]] + x[cs[cs.length - 1]]) / 2 : leaf++ * (W + GX);
      y[i] = s.n[i][2] * (H + GY);
    })(0);
    const width = Math.max(leaf, 1) * (W + GX), height = (Math.max(...shown.map((i) => s.n[i][2])) + 1) * (H + GY);
    const g = svg("svg", {width: width, height: height, viewBox: `0 0 ${width} ${height}`, id: "tree-svg"});
    const path = new Set([0, ...acceptedPath(s)]);
    for (const i of shown) {
      const p = s.n[i][1];
      if (p < 0 || !keep.has(p)) continue;
      const bonus = fate(s.n[i]) === "bonus", onPath = walked && path.has(i) && path.has(p);
      g.appendChild(svg("line", {x1: x[p] + W / 2, y1: y[p] + H, x2: x[i] + W / 2, y2: y[i],
        class: "edge" + (onPath || bonus ? " accepted" : "") + (bonus ? " bonus" : "")}));
    }
    for (const i of shown) {
      const n = s.n[i], f = fate(n), colors = COLORS[walked || f === "root" ? f : "drafted"];
      const node = svg("g", {class: "node fate-" + (walked || f === "root" ? f : "drafted") + (i === state.node ? " selected" : ""),
        transform: `translate(${x[i]},${y[i]})`, "data-node": i});
      node.appendChild(svg("rect", {width: W, height: H, rx: 6, fill: colors[0], stroke: colors[1]}));
      const lines = [`"${label(tokText(n[0]))}"`, `#${i}  id ${n[0]}`];
      if (n[4] !== null) lines.push(`q ${fmt(n[4])}` + (n[6] !== null && after(phase, "VERIFY") ? `  p ${fmt(n[6])}` : ""));
      else if (f === "bonus") lines.push("bonus" + (n[6] !== null ? `  p ${fmt(n[6])}` : ""));
      lines.forEach((t, k) => node.appendChild(svg("text", {x: W / 2, y: 15 + 14 * k, "text-anchor": "middle",
        class: k === 0 ? "token" : ""}, t)));
      node.addEventListener("click", () => { state.node = i; render(); });
      g.appendChild(node);
    }
    box.appendChild(g);
    return shown;
  }
  function inspector(s, phase, shown) {
    const box = document.getElementById("inspector");
    box.textContent = "";
    const i = shown.includes(state.node) ? state.node : shown[Math.min(1, shown.length - 1)], n = s.n[i], f = fate(n);
    state.node = i;
    box.appendChild(el("h3", {}, `node ${i}`));
    const rows = [["token", tokText(n[0])], ["id", String(n[0])], ["depth", String(n[2])],
                  ["parent", n[1] < 0 ? "-" : String(n[1])]];
    if (n[4] !== null) rows.push(["q (draft)", fmt(n[4])], ["score (path)", fmt(n[5])]);
    if (after(phase, "VERIFY") || f === "bonus") rows.push(["p (target)", fmt(n[6])]);
    rows.push(["fate", after(phase, "ACCEPT") || f === "root" ? f : "drafted, not yet judged"]);
    const dl = el("dl", {id: "inspector-fields"});
    for (const [k, v] of rows) { dl.appendChild(el("dt", {}, k)); dl.appendChild(el("dd", {}, v)); }
    box.appendChild(dl);
    if (s.t && Object.keys(s.t).length) box.appendChild(el("p", {class: "timing"},
      "ms: " + Object.entries(s.t).map(([k, v]) => `${k} ${v}`).join("  ")));
    if (s.ad) box.appendChild(el("p", {class: "timing"}, "adaptive: " + JSON.stringify(s.ad)));
  }
  const span = (xs) => (!Array.isArray(xs) || !xs.length ? "-" : xs.length <= 10 ? xs.join(" ") : xs.slice(0, 8).join(" ") + ` … (${xs.length})`);
  function kvPanel(s, phase) {
    const kv = s.kv || {}, kind = phase.split(" ")[0], lines = [];
    const [before, afterLen] = kv.target_seq_len || [null, null];
    let head = `${kv.style}  target seq_len ${before}` + (after(phase, "COMMIT") ? ` -> ${afterLen}` : "");
    if (kv.draft_seq_len) head += `  draft ${kv.draft_seq_len[0]}` + (kind === "EXTEND" ? ` -> ${kv.draft_seq_len[1]}` : "");
    lines.push(head);
    if (kv.style === "vllm" && after(phase, "COMMIT")) {
      const n = s.n.length - 1;
      lines.push(`num_computed_tokens = ${before} + ${n} verified - ${before + n - afterLen} rejected = ${afterLen}`);
    }
    const tail = after(phase, "COMMIT") ? kv.req_to_token_tail : kv.req_to_token_tail_before;
    if (tail) lines.push(`req_to_token[${s.r}, ${tail.start}:] ${span(tail.slots)}`);
    lines.push(PHASE_WHAT[kind]);
    for (const e of kv.events || []) {
      if (!PHASE_EVENTS[kind].includes(e.phase)) continue;
      let line = `${String(e.pool).padEnd(6)} ${String(e.op).padEnd(8)}`;
      if (e.op === "move") line += ` slots ${span(e.from_slots)} -> ${span(e.to_slots)}`;
      else { if ("positions" in e) line += ` pos ${span(e.positions)}`; if ("slots" in e) line += ` slots ${span(e.slots)}`; }
      lines.push(line);
    }
    document.getElementById("kv").textContent = lines.join("\n");
  }
  function render() {
    const list = steps(), slider = document.getElementById("slider");
    if (!list.length) { document.getElementById("step-label").textContent = "no steps in this trace"; return; }
    state.pos = Math.max(0, Math.min(state.pos, list.length - 1));
    const s = current(), ph = phases(s);
    state.phase = Math.max(0, Math.min(state.phase, ph.length - 1));
    const phase = ph[state.phase];
    slider.max = String(list.length - 1);
    slider.value = String(state.pos);
    document.getElementById("step-label").textContent =
      `step ${s.s} (${state.pos + 1} of ${list.length}) · accept_len ${s.al}` + (s.f ? ` · finished: ${s.f}` : "");
    const bar = document.getElementById("phases");
    bar.textContent = "";
    ph.forEach((name, k) => {
      const b = el("button", {class: "phase" + (k === state.phase ? " current" : ""), "data-phase": name}, name);
      b.addEventListener("click", () => { state.phase = k; render(); });
      bar.appendChild(b);
    });
    document.getElementById("phases").setAttribute("data-current", phase);
    inspector(s, phase, drawTree(s, phase));
    kvPanel(s, phase);
    for (const old of document.querySelectorAll("#text .current")) old.classList.remove("current");
    for (const t of document.querySelectorAll(`#text [data-pos="${state.pos}"]`)) t.classList.add("current");
  }
  function move(phaseDelta, stepDelta) {
    const list = steps();
    if (!list.length) return;
    if (stepDelta) { state.pos += stepDelta; state.phase = 0; }
    else {
      state.phase += phaseDelta;
      if (state.phase < 0 && state.pos > 0) { state.pos -= 1; state.phase = phases(current()).length - 1; }
      else if (state.phase >= phases(current()).length && state.pos < list.length - 1) { state.pos += 1; state.phase = 0; }
    }
    render();
  }

  // ---- the page ---------------------------------------------------------------------------
  document.body.appendChild(summary());
  document.body.appendChild(textPanel());
  document.body.appendChild(viewer());
  const tip = el("div", {id: "tooltip", role: "tooltip"});
  document.body.appendChild(tip);
  const text = document.getElementById("text");
  text.addEventListener("mouseover", (ev) => {
    const t = ev.target.closest(".tok");
    if (!t) return;
    tip.textContent = tokenTip(t);
    tip.style.display = "block";
    tip.style.left = Math.min(ev.pageX + 12, window.innerWidth - 420) + "px";
    tip.style.top = ev.pageY + 16 + "px";
  });
  text.addEventListener("mouseout", () => { tip.style.display = "none"; });
  text.addEventListener("click", (ev) => {
    const t = ev.target.closest(".tok[data-pos]");
    if (t) { state.pos = Number(t.dataset.pos); state.phase = phases(current()).indexOf("ACCEPT"); render(); }
  });
  document.getElementById("slider").addEventListener("input", (ev) => { state.pos = Number(ev.target.value); state.phase = 0; render(); });
  document.addEventListener("keydown", (ev) => {
    if (ev.target.tagName === "SELECT") return;
    const keys = {ArrowRight: () => move(ev.shiftKey ? 0 : 1, ev.shiftKey ? 1 : 0),
                  ArrowLeft: () => move(ev.shiftKey ? 0 : -1, ev.shiftKey ? -1 : 0),
                  PageDown: () => move(0, 1), PageUp: () => move(0, -1),
                  Home: () => { state.pos = 0; state.phase = 0; render(); },
                  End: () => { state.pos = steps().length - 1; state.phase = 0; render(); },
                  ArrowDown: () => nodeMove(1), ArrowUp: () => nodeMove(-1)};
    if (keys[ev.key]) { ev.preventDefault(); keys[ev.key](); }
  });
  function nodeMove(delta) {
    if (!steps().length) return;
    const s = current(), shown = visible(s, phases(s)[state.phase]), k = shown.indexOf(state.node);
    state.node = shown[Math.max(0, Math.min(shown.length - 1, k + delta))];
    render();
  }
  renderText();
  render();
  document.body.setAttribute("data-ready", "1");
  document.body.setAttribute("data-ready-ms", String(Math.round(performance.now())));  // docs/report_times.py
})();
