// aionet dashboard: plain JS, canvas charts, one server-sent-events stream (/events).
// Rates are computed here from consecutive counter snapshots; history is bounded (HISTORY points).
"use strict";

const WINDOW_S = 120; // seconds of history the charts show
const HISTORY = 600; // points kept per series (bounded)
const COLORS = ["#7fb2ff", "#3ecf8e", "#f5b942", "#c792ea", "#ff8a65", "#4dd0e1", "#f06292", "#aed581"];
const state = { prev: {}, series: { msgs: {}, bytes: {}, p50: {}, p99: {} }, colors: {}, order: [] };

function colorOf(name) {
  if (!(name in state.colors)) state.colors[name] = COLORS[Object.keys(state.colors).length % COLORS.length];
  return state.colors[name];
}
function fmtBytes(n) {
  if (n == null) return "–";
  const u = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
  while (Math.abs(n) >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : Math.round(n)) + " " + u[i];
}
function fmtNum(n) {
  if (n == null) return "–";
  if (Number.isInteger(n) && n < 1000) return n.toString();
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + "k";
  return n >= 10 ? Math.round(n).toString() : n.toFixed(1);
}
function fmtMs(s) { return s == null ? "–" : (s * 1000 < 1 ? (s * 1e6).toFixed(0) + " µs" : (s * 1000).toFixed(1) + " ms"); }
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function push(map, name, v, t) {
  const a = map[name] || (map[name] = []);
  a.push([t, v]);
  while (a.length > HISTORY || (a.length && a[0][0] < t - WINDOW_S)) a.shift();
}

// ------------------------------------------------------------------ charts
function drawChart(id, seriesMap, fmt, dashed) {
  const c = document.getElementById(id);
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth, h = c.clientHeight || 170;
  if (c.width !== w * dpr) { c.width = w * dpr; c.height = h * dpr; }
  const g = c.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const left = 54, right = 8, top = 8, bottom = 18;
  let max = 0;
  for (const m of [seriesMap, dashed || {}]) for (const a of Object.values(m)) for (const [, v] of a) if (v != null && v > max) max = v;
  max = max > 0 ? niceMax(max) : 1;
  g.strokeStyle = "#263049"; g.fillStyle = "#8391ab"; g.font = "11px system-ui, sans-serif"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = top + (h - top - bottom) * (1 - i / 4);
    g.beginPath(); g.moveTo(left, y); g.lineTo(w - right, y); g.stroke();
    g.fillText(fmt(max * i / 4), 4, y + 4);
  }
  const span_s = chartSpan();
  g.fillText(span_s >= 120 ? "2 min ago" : Math.round(span_s) + " s ago", left, h - 4);
  g.fillText("now", w - right - 22, h - 4);
  const plot = (a, color, dash, fill) => {
    if (!a || a.length < 2) return;
    const now = state.now, span = w - left - right, secs = chartSpan();
    const xs = a.map(([t]) => w - right - span * Math.min(1, (now - t) / secs));
    const ys = a.map(([, v]) => top + (h - top - bottom) * (1 - (v || 0) / max));
    g.setLineDash(dash ? [4, 4] : []); g.strokeStyle = color; g.lineWidth = 2; g.lineJoin = "round";
    g.beginPath(); ys.forEach((y, i) => (i ? g.lineTo(xs[i], y) : g.moveTo(xs[0], y))); g.stroke();
    if (fill) {
      g.lineTo(xs[xs.length - 1], h - bottom); g.lineTo(xs[0], h - bottom); g.closePath();
      const grad = g.createLinearGradient(0, top, 0, h - bottom);
      grad.addColorStop(0, color + "40"); grad.addColorStop(1, color + "00");
      g.fillStyle = grad; g.fill();
    }
  };
  for (const [name, a] of Object.entries(seriesMap)) plot(a, colorOf(name), false, true);
  for (const [name, a] of Object.entries(dashed || {})) plot(a, colorOf(name), true, false);
  g.setLineDash([]);
}
function chartSpan() {
  // the charts fill their width from the first point on, up to WINDOW_S of history
  return Math.min(WINDOW_S, Math.max(10, state.now - (state.first || state.now)));
}
function niceMax(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}
function legend(id, names, extra) {
  const L = document.getElementById(id); L.replaceChildren();
  for (const n of names) L.append(el("span", {}, el("span", { class: "swatch", style: "background:" + colorOf(n) }), n));
  if (extra) L.append(el("span", {}, extra));
}

// ------------------------------------------------------------------ panels
function renderMembers(snap) {
  const tb = document.querySelector("#members tbody");
  const names = Object.keys(snap.members).sort();
  tb.replaceChildren(...names.map(name => {
    const m = snap.members[name], s = snap.nodes[name] || {}, t = s.tasks || {};
    const gpus = (m.gpus || []).length ? `, ${m.gpus.length} GPU (${m.gpus.map(g => g.name).join(", ")})` : "";
    const cpu = m.cpu_percent == null ? "–" : m.cpu_percent.toFixed(0) + "%";
    return el("tr", { "data-member": name, "data-state": m.state, class: m.state === "alive" ? "" : "down" },
      el("td", {}, el("span", { class: "swatch", style: "background:" + colorOf(name) }), name, m.self ? el("span", { class: "me" }, "(this page)") : ""),
      el("td", {}, el("span", { class: "badge " + m.state }, m.state)),
      el("td", {}, m.address || "–"),
      el("td", {}, cpu, el("span", { class: "bar", style: `width:${Math.min(60, (m.cpu_percent || 0) * 0.6)}px` })),
      el("td", {}, fmtBytes(m.rss)),
      el("td", {}, m.loop_lag_ms == null ? "–" : m.loop_lag_ms.toFixed(1) + " ms"),
      el("td", {}, (m.cpu_count || "?") + " CPU" + gpus),
      el("td", {}, m.state === "alive" ? `${t.queued ?? "–"} / ${t.running ?? "–"}` : "–"));
  }));
  const counts = {};
  for (const n of names) counts[snap.members[n].state] = (counts[snap.members[n].state] || 0) + 1;
  const parts = Object.entries(counts).map(([k, v]) => `<b>${v}</b> ${k}`).join(" · ");
  document.getElementById("summary").innerHTML = `<b>${names.length}</b> members: ${parts}`;
}

// per member, as the node that runs them sees them: waiting, running, ran, raised
const TASK_PARTS = [["queued", "#f5b942", "queued"], ["running", "#7fb2ff", "running"], ["ran", "#3ecf8e", "ran"], ["errors", "#f2545b", "raised"]];
function renderTasks(snap) {
  const box = document.getElementById("tasks");
  const rows = [];
  let maxTotal = 1;
  const names = Object.keys(snap.nodes).sort();
  for (const n of names) {
    const t = snap.nodes[n].tasks || {};
    maxTotal = Math.max(maxTotal, TASK_PARTS.reduce((a, [k]) => a + (t[k] || 0), 0));
  }
  for (const n of names) {
    const t = snap.nodes[n].tasks || {};
    const bar = el("div", { class: "stack" });
    for (const [k, c] of TASK_PARTS) if (t[k]) bar.append(el("span", { style: `width:${100 * t[k] / maxTotal}%;background:${c}`, title: `${k}: ${t[k]}` }));
    rows.push(el("div", { class: "taskrow" }, el("span", {}, n), bar));
  }
  if (maxTotal === 1 && !names.some(n => TASK_PARTS.some(([k]) => (snap.nodes[n].tasks || {})[k]))) {
    rows.push(el("div", { class: "empty" }, "no tasks yet: node.submit(...) shows up here"));
  }
  const lg = el("div", { class: "tasklegend" });
  for (const [k, c, label] of TASK_PARTS) {
    const total = names.reduce((a, n) => a + ((snap.nodes[n].tasks || {})[k] || 0), 0);
    lg.append(el("span", {}, el("span", { class: "swatch", style: "background:" + c }), `${label} ${fmtNum(total)}`));
  }
  box.replaceChildren(...rows, lg);
}

function renderEvents(snap) {
  const ul = document.getElementById("events");
  const evs = (snap.events || []).slice().reverse();
  if (!evs.length) { ul.replaceChildren(el("li", {}, el("span", { class: "d" }, "no events yet"))); return; }
  ul.replaceChildren(...evs.map(e => {
    const kcls = /fail|lost|undeliverable/.test(e.kind) ? "bad" : e.kind;
    return el("li", {}, el("span", { class: "t" }, new Date(e.t * 1000).toLocaleTimeString()),
      el("span", { class: "k " + kcls }, e.kind), el("span", {}, e.who), el("span", { class: "d", title: e.detail || "" }, e.detail || ""));
  }));
}

function update(snap) {
  document.getElementById("origin").textContent = snap.node;
  state.now = snap.time;
  if (!state.first) state.first = snap.time;
  renderMembers(snap);
  const names = Object.keys(snap.members).sort();
  for (const n of names) {
    const s = snap.nodes[n], p = state.prev[n];
    const alive = snap.members[n].state === "alive";
    if (s && p && s.time > p.time && alive) {
      const dt = s.time - p.time;
      push(state.series.msgs, n, Math.max(0, (s.messages_sent + s.messages_received - p.messages_sent - p.messages_received) / dt), s.time);
      push(state.series.bytes, n, Math.max(0, (s.bytes_sent + s.bytes_received - p.bytes_sent - p.bytes_received) / dt), s.time);
    } else if (!alive) {
      push(state.series.msgs, n, 0, snap.time); push(state.series.bytes, n, 0, snap.time);
    }
    if (s && s.latency && alive && (!p || s.time > p.time)) {
      push(state.series.p50, n, s.latency.p50 || 0, s.time); push(state.series.p99, n, s.latency.p99 || 0, s.time);
    }
    if (s && (!p || s.time > p.time)) state.prev[n] = s;
  }
  drawAll();
  legend("legend-msgs", names);
  legend("legend-bytes", names);
  legend("legend-lat", names, "solid p50 · dashed p99");
  renderTasks(snap);
  renderEvents(snap);
}
function drawAll() {
  drawChart("chart-msgs", state.series.msgs, fmtNum);
  drawChart("chart-bytes", state.series.bytes, v => fmtBytes(v));
  drawChart("chart-lat", state.series.p50, fmtMs, state.series.p99);
}

function connect() {
  const conn = document.getElementById("conn");
  const es = new EventSource("/events");
  es.onopen = () => { conn.textContent = "live"; conn.className = "conn on"; };
  es.onmessage = ev => update(JSON.parse(ev.data));
  es.onerror = () => { conn.textContent = "reconnecting"; conn.className = "conn off"; };
  window.addEventListener("resize", drawAll);
}
connect();
