// The report page: reads the JSON island and draws the views. Everything it shows was
// aggregated by msmemscope; the page only lays it out (charts with uPlot).
"use strict";

const DATA = JSON.parse(document.getElementById("report-data").textContent);
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"];

// What the page computed, for whoever drives it (tests read this and the data-* attributes).
window.msmemscopeReport = { ready: false, peaks: {}, views: [] };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return node;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Math.abs(n), u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return (n < 0 ? "-" : "") + (u === 0 ? String(v) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)) + " " + units[u];
}

function fmtMs(ms) {
  if (ms >= 1000) return (ms / 1000).toFixed(3) + " s";
  return ms.toFixed(3) + " ms";
}

// A tick label with just the decimals its spacing needs.
function fmtTick(ms, incr) {
  const inSeconds = incr >= 1000;
  const v = inSeconds ? ms / 1000 : ms;
  const step = inSeconds ? incr / 1000 : incr;
  const decimals = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step) + 1e-9)));
  return v.toFixed(decimals) + (inSeconds ? " s" : " ms");
}

// An opaque, lighter shade: lower areas are drawn over higher ones, so no fill may show
// through another.
function tint(hex) {
  const n = parseInt(hex.slice(1), 16);
  const mix = (c) => Math.round(c + (255 - c) * 0.35);
  return "rgb(" + mix(n >> 16) + "," + mix((n >> 8) & 255) + "," + mix(n & 255) + ")";
}

function card(title, ...children) {
  return el("div", { class: "card" }, el("h2", {}, title), ...children);
}

function table(headers, rows, opts) {
  const head = el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : "" }, h.label || h)));
  const t = el("table", opts || {}, el("thead", {}, head), el("tbody", {}, rows));
  return el("div", { class: "scroll" }, t);
}

// ---------------------------------------------------------------------------------- timeline

function maxOf(values) {
  let m = 0;
  for (const v of values) if (v !== null && v > m) m = v;
  return m;
}

function drawTimeline(container, tl, index, axis) {
  const peak = maxOf(tl.max);
  window.msmemscopeReport.peaks[tl.label] = peak;
  const facts = el("div", { class: "facts" },
    el("span", {}, "device ", el("b", {}, tl.label)),
    el("span", {}, "file ", el("b", {}, tl.file)),
    el("span", { id: "timeline-peak-" + index, "data-bytes": String(peak), "data-device": tl.label },
      "peak allocated ", el("b", {}, fmtBytes(peak)), " at " + fmtMs(tl.peak.ms)),
    el("span", {}, "rows ", el("b", {}, tl.rows.toLocaleString())),
    el("span", {}, "MALLOC ", el("b", {}, tl.mallocs.toLocaleString()), " / FREE ", el("b", {}, tl.frees.toLocaleString())),
    el("span", {}, "live at end ", el("b", {}, fmtBytes(tl.live_at_end.bytes)), " in " + tl.live_at_end.count + " blocks"),
    el("span", {}, "bucket ", el("b", {}, fmtMs(tl.bucket_ms))),
    tl.dropped_marks ? el("span", {}, tl.dropped_marks + " marks not shown") : null);
  const wrap = el("div", { class: "chart-wrap" });
  const tip = el("div", { class: "tooltip" });
  const tools = el("div", { class: "chart-tools" });
  const legend = el("div", { class: "legend-owners" });
  const box = container.appendChild(card("Memory on device " + tl.label, facts, tools, wrap, legend));
  wrap.appendChild(tip);
  if (tl.t.length === 0) {
    wrap.appendChild(el("p", { class: "empty" }, "No rows in this dump."));
    return;
  }

  // Stacked owners: cumulative sums drawn from the top one down, each filled to the axis.
  const owners = tl.owners;
  const cumulative = [];
  let running = new Array(tl.t.length).fill(0);
  for (const o of owners) {
    running = running.map((v, i) => v + o.bytes[i]);
    cumulative.push(running);
  }
  const series = [{ label: "time" }];
  const data = [tl.t];
  for (let k = owners.length - 1; k >= 0; k--) {
    const color = COLORS[k % COLORS.length];
    series.push({ label: owners[k].name, stroke: color, fill: tint(color), width: 0, points: { show: false } });
    data.push(cumulative[k]);
  }
  series.push({ label: "allocated (max)", stroke: "#20303f", width: 1.5, points: { show: false } });
  data.push(tl.max);
  series.push({ label: "allocated (min)", stroke: "#20303f", dash: [3, 3], width: 1, points: { show: false } });
  data.push(tl.min);
  if (tl.reserved) {
    series.push({ label: "reserved", stroke: "#e15759", width: 1.5, spanGaps: true, points: { show: false } });
    data.push(tl.reserved);
  }
  owners.forEach((o, k) => legend.appendChild(el("span", {}, el("i", { style: "background:" + tint(COLORS[k % COLORS.length]) }), o.name)));
  legend.appendChild(el("span", {}, el("i", { style: "background:#20303f" }), "allocated max / min (dashed)"));
  if (tl.reserved) legend.appendChild(el("span", {}, el("i", { style: "background:#e15759" }), "reserved"));
  legend.appendChild(el("span", {}, el("i", { style: "background:#8a5a00" }), "step"));
  legend.appendChild(el("span", {}, el("i", { style: "background:#7b3fa0" }), "mark"));

  const xEnd = tl.t[tl.t.length - 1] + tl.bucket_ms;
  // By step (the default when the run has steps): each step the same width, everything before
  // the first step one band ("start-up"), so a short script's steps are not crammed at the right
  // of its import time. Position p in [i, i + 1) is band i, linear in time within it.
  const bounds = [0];
  for (const [ms] of tl.steps) if (ms > bounds[bounds.length - 1] && ms < xEnd) bounds.push(ms);
  bounds.push(xEnd);
  const stepNames = ["start-up", ...tl.steps.filter(([ms]) => ms > 0 && ms < xEnd).map(([, name]) => "step " + name)];
  const byStep = axis === undefined ? bounds.length > 3 : axis === "step" && bounds.length > 2;
  const toStep = (ms) => {
    let lo = 0, hi = bounds.length - 2;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (bounds[mid] <= ms) lo = mid; else hi = mid - 1; }
    const width = bounds[lo + 1] - bounds[lo];
    return lo + (width > 0 ? Math.min(1, Math.max(0, (ms - bounds[lo]) / width)) : 0);
  };
  const toX = (ms) => (byStep ? toStep(ms) : ms);
  const xMax = () => (byStep ? bounds.length - 1 : xEnd);
  data[0] = tl.t.map(toX);
  wrap.dataset.axis = byStep ? "step" : "time";
  const devicePeak = DATA.leaks && DATA.leaks.peak && DATA.leaks.peak.devices
    ? DATA.leaks.peak.devices.find((d) => d.device === tl.label) : null;
  const drawMarkers = (u) => {
    const ctx = u.ctx, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
    ctx.save();
    ctx.font = Math.round(10 * devicePixelRatio) + "px sans-serif";
    // Step labels only where they fit (the axis names the steps in step mode).
    const shown = tl.steps.filter(([ms]) => { const x = u.valToPos(toX(ms), "x", true); return x >= u.bbox.left && x <= u.bbox.left + u.bbox.width; });
    for (const [ms, step] of shown.length <= 200 ? shown : []) {
      const x = Math.round(u.valToPos(toX(ms), "x", true));
      ctx.strokeStyle = "#8a5a00";
      ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
      if (!byStep && shown.length <= 30) {
        ctx.fillStyle = "#8a5a00";
        ctx.fillText("step " + step, x + 3, top + 11 * devicePixelRatio);
      }
    }
    ctx.setLineDash([]);
    ctx.fillStyle = "#7b3fa0";
    for (const [ms] of tl.marks) {
      const x = u.valToPos(toX(ms), "x", true);
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath(); ctx.moveTo(x - 4, bottom); ctx.lineTo(x + 4, bottom); ctx.lineTo(x, bottom - 7); ctx.fill();
    }
    ctx.restore();
    placePeak(u);
  };
  // The peak: a marker over the chart; clicking it lists what was live there by line.
  const marker = el("button", { class: "peak-marker", title: "the peak: what was live there" }, "\u25bc peak");
  const panel = el("div", { class: "peak-panel" });
  panel.style.display = "none";
  marker.dataset.bytes = String(peak);
  if (devicePeak) marker.dataset.step = String(devicePeak.peak.step);
  marker.addEventListener("click", () => {
    if (panel.style.display === "block") { panel.style.display = "none"; return; }
    const lines = devicePeak ? devicePeak.peak.lines : [];
    panel.replaceChildren(
      el("div", { class: "peak-title" }, "Peak " + fmtBytes(devicePeak ? devicePeak.peak.bytes : peak) +
        (devicePeak ? " at step " + devicePeak.peak.step + (devicePeak.peak.op ? ", in " + devicePeak.peak.op : "") : " at " + fmtMs(tl.peak.ms))),
      ...(lines.length ? lines.slice(0, 10).map((l) => el("div", { class: "peak-panel-line", "data-site": l.site || "" },
        fmtBytes(l.bytes) + "  " + (l.site || "(no Python line recorded)") +
        (l.modules && l.modules.length ? "  in " + l.modules.join(", ") : ""))) :
        [el("div", {}, "The leaks analysis gives the lines live at the peak (leaks/peak.json).")]));
    panel.style.display = "block";
  });
  wrap.append(marker, panel);
  const placePeak = (u) => {
    const x = u.valToPos(toX(tl.peak.ms), "x") + u.bbox.left / devicePixelRatio;
    marker.style.left = Math.round(x - 24) + "px";
    marker.style.display = x < u.bbox.left / devicePixelRatio || x > (u.bbox.left + u.bbox.width) / devicePixelRatio ? "none" : "block";
  };
  const showTip = (u) => {
    const i = u.cursor.idx;
    if (i === null || i === undefined || u.cursor.left < 0) { tip.style.display = "none"; return; }
    const band = byStep ? stepNames[Math.min(stepNames.length - 1, Math.floor(data[0][i]))] + ", " : "";
    const lines = [
      band + "t " + fmtMs(tl.t[i]) + " .. " + fmtMs(tl.t[i] + tl.bucket_ms),
      "allocated " + fmtBytes(tl.min[i]) + " .. " + fmtBytes(tl.max[i]),
    ];
    if (tl.reserved && tl.reserved[i] !== null) lines.push("reserved " + fmtBytes(tl.reserved[i]));
    const [mallocs, frees] = tl.counts[i];
    lines.push(mallocs + " MALLOC, " + frees + " FREE");
    const h = tl.hover[i];
    if (h) lines.push("largest: " + fmtBytes(h[0]) + (h[1] ? (h[4] ? " in " : " after ") + h[1] : "") + " (" + h[2] + ")");
    for (const o of owners) if (o.bytes[i]) lines.push("  " + o.name + ": " + fmtBytes(o.bytes[i]));
    tip.replaceChildren(...lines.map((l) => el("div", {}, l)));
    tip.style.display = "block";
    const left = u.cursor.left + u.bbox.left / devicePixelRatio + 14;
    tip.style.left = Math.min(left, wrap.clientWidth - 260) + "px";
    tip.style.top = (u.cursor.top + 10) + "px";
  };
  const width = Math.max(600, (document.querySelector("main").clientWidth || 1000) - 60);
  const opts = {
    width, height: 320,
    scales: { x: { time: false, range: (u, min, max) => [min, max] } },
    series,
    legend: { show: false },
    cursor: { drag: { x: true, y: false }, points: { show: false } },
    axes: [
      byStep ? {
        label: "step (start-up is one band)", space: 60,
        splits: (u, axisIdx, min, max) => {
          const first = Math.max(0, Math.ceil(min)), last = Math.min(stepNames.length - 1, Math.floor(max));
          const every = Math.max(1, Math.ceil((last - first + 1) / 12));
          const out = [];
          for (let v = first; v <= last; v += every) out.push(v);
          return out;
        },
        values: (u, vals) => vals.map((v) => stepNames[v] || ""),
      } : { label: "time since the first row", space: 90, values: (u, vals, axis, space, incr) => vals.map((v) => fmtTick(v, incr)) },
      { size: 80, values: (u, vals) => vals.map((v) => fmtBytes(v)) },
    ],
    hooks: { draw: [drawMarkers], setCursor: [showTip] },
  };
  const plot = new uPlot(opts, data, wrap);
  wrap.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  const view = () => [plot.scales.x.min, plot.scales.x.max];
  const setX = (min, max) => plot.setScale("x", { min: Math.max(0, min), max: Math.min(xMax(), max) });
  // Zoom: drag a range, or the wheel around the cursor; pan: the buttons or shift+wheel.
  plot.over.addEventListener("wheel", (e) => {
    e.preventDefault();
    const [min, max] = view();
    const span = max - min;
    if (e.shiftKey) {
      const step = span * 0.1 * Math.sign(e.deltaY);
      setX(min + step, max + step);
      return;
    }
    const at = plot.posToVal(e.offsetX, "x");
    const factor = e.deltaY < 0 ? 0.8 : 1.25;
    setX(at - (at - min) * factor, at + (max - at) * factor);
  }, { passive: false });
  const pan = (dir) => { const [min, max] = view(); const s = (max - min) * 0.25 * dir; setX(min + s, max + s); };
  const zoom = (f) => { const [min, max] = view(); const c = (min + max) / 2, h = (max - min) * f / 2; setX(c - h, c + h); };
  tools.append(...[
    el("button", { onclick: () => pan(-1), title: "pan left" }, "\u25c0"),
    el("button", { onclick: () => pan(1), title: "pan right" }, "\u25b6"),
    el("button", { onclick: () => zoom(0.5), title: "zoom in" }, "+"),
    el("button", { onclick: () => zoom(2), title: "zoom out" }, "\u2212"),
    el("button", { onclick: () => setX(0, xMax()), title: "whole run" }, "reset"),
    bounds.length > 2 ? el("button", { class: "axis-toggle", title: "the x axis by step or by time", onclick: () => {
      const again = el("div");
      container.replaceChild(again, box);
      drawTimeline(again, tl, index, byStep ? "time" : "step");
    } }, byStep ? "by time" : "by step") : null,
    el("span", {}, "drag to zoom, wheel to zoom, shift+wheel to pan; hover for the op, size and owner")].filter(Boolean));
}

function timelineView(view) {
  if (!DATA.timelines.length) {
    view.appendChild(card("Timeline", el("p", { class: "empty" }, "This run has no event dump (device_*/dump/).")));
    return;
  }
  DATA.timelines.forEach((tl, i) => drawTimeline(view, tl, i));
  if (DATA.decompose) decomposeCard(view, DATA.decompose);
}

// Bytes by owner per step: the decompose analysis's table.
function decomposeCard(view, d) {
  const rows = d.lines.map((l) => {
    const [step, device, pool, owner, current, peak, max] = l;
    return el("tr", { class: owner === "total" ? "decompose-row total" : "decompose-row", "data-line": JSON.stringify(l) },
      el("td", { class: "num" }, String(step)), el("td", {}, device), el("td", {}, pool), el("td", {}, owner),
      el("td", { class: "num" }, fmtBytes(current)), el("td", { class: "num" }, fmtBytes(peak)), el("td", { class: "num" }, fmtBytes(max)));
  });
  const note = d.lines.length < d.total ? el("p", { class: "empty" }, "the last " + d.lines.length + " of " + d.total + " lines") : null;
  view.appendChild(card("Bytes by owner per step (decompose)", note,
    table([{ label: "step", num: true }, "device", "pool", "owner", { label: "current", num: true },
      { label: "at the pool's peak", num: true }, { label: "own max", num: true }], rows, { class: "decompose-table" })));
}

// ---------------------------------------------------------------------------------- leaks

function leaksView(view) {
  const leaks = DATA.leaks;
  if (!leaks) {
    view.appendChild(card("Leaks (leaks analysis)", el("p", { class: "empty" }, "No event dump in this run.")));
  } else {
    leakSiteCards(view, leaks.findings);
    peakCards(view, leaks.peak);
    const byStep = new Map();
    for (const r of leaks.rows) {
      if (!byStep.has(r.step)) byStep.set(r.step, []);
      byStep.get(r.step).push(r);
    }
    const body = [];
    for (const s of leaks.steps) {
      const rows = byStep.get(s.step) || [];
      const shown = rows.length < s.count ? " (the " + rows.length + " largest shown)" : "";
      body.push(el("h3", {}, "step " + s.step + ": " + s.count + " block(s), " + fmtBytes(s.bytes) + shown));
      body.push(table(["device", "pool", { label: "size", num: true }, "Mb(s)", "address", "kernel", { label: "row ID", num: true }],
        rows.map((r) => el("tr", { class: "leak-row", "data-ptr": r.ptr, "data-device": r.device, "data-step": String(r.step) },
          el("td", {}, r.device), el("td", {}, r.pool), el("td", { class: "num" }, fmtBytes(r.size)), el("td", {}, r.mb),
          el("td", {}, r.ptr), el("td", {}, "kernel_" + r.kernel), el("td", { class: "num" }, String(r.row_id))))));
    }
    if (!leaks.rows.length) body.push(el("p", { class: "empty" }, "No block was judged a leak."));
    // The blocks behind the sites, one click away.
    const raw = el("details", { id: "leak-blocks" },
      el("summary", {}, "Leaked blocks (" + leaks.total + ") and the report text"), ...body,
      el("h3", {}, "Report"), el("pre", { id: "leak-text" }, leaks.text));
    view.appendChild(card("Leaked blocks per step (the original msMemScope's report)", raw));
  }
  hostLeakCards(view);
}

// What each device's peak is made of: when, the owners, the user's lines live then.
function peakCards(view, doc) {
  if (!doc || !doc.devices) return;
  for (const d of doc.devices) {
    const p = d.peak;
    const when = "at step " + p.step + (p.op ? ", in " + p.op : "") + (p.phase ? " (" + p.phase + ")" : "");
    const labelled = (p.owners || []).some((o) => o.owner !== "unlabelled");
    const owners = labelled ? p.owners.map((o) => o.owner + " " + fmtBytes(o.bytes)).join(", ") : "";
    const rows = (p.lines || []).map((l) => el("tr", { class: "peak-line", "data-site": l.site || "" },
      el("td", { class: "site" }, el("div", { class: "site-line" }, l.site || "(no Python line recorded)"),
        l.source ? el("code", { class: "site-source" }, l.source) : null,
        l.frame ? el("div", { class: "site-frame" }, "inside " + l.frame) : null,
        l.modules && l.modules.length ? el("div", { class: "site-module" },
          "in " + l.modules.join(", ") + (l.more_modules ? " and more" : "")) : null),
      el("td", {}, (l.ops || []).join(", ")), el("td", { class: "num" }, fmtBytes(l.bytes)),
      el("td", { class: "num" }, String(l.blocks)), el("td", {}, l.owner || "")));
    if (p.other_lines && p.other_lines.bytes) {
      rows.push(el("tr", {}, el("td", {}, "other lines"), el("td", {}, ""), el("td", { class: "num" }, fmtBytes(p.other_lines.bytes)),
        el("td", { class: "num" }, String(p.other_lines.blocks)), el("td", {}, "")));
    }
    const steps = (d.steps || []).map((s) => [s.step, s.bytes]);
    view.appendChild(card("Peak on device " + d.device + ": " + fmtBytes(p.bytes) + " " + when,
      el("p", { class: "peak-when", "data-step": String(p.step), "data-bytes": String(p.bytes) },
        owners ? "By owner: " + owners + "." : "Owners are split with --analysis=leaks,decompose."),
      el("div", { class: "peak-steps" }, "Each step's peak: ", sparkline(steps)),
      table(["line", "op", { label: "bytes", num: true }, { label: "blocks", num: true }, "owner"], rows, { class: "peak-lines" })));
  }
}

// The findings by site: the user's line, its source, what holds it, bytes per step.
function leakSiteCards(view, f) {
  if (!f) return;
  const place = (s) => el("td", { class: "site" },
    el("div", { class: "site-line" }, s.site || "(no Python line recorded)"),
    s.source ? el("code", { class: "site-source" }, s.source) : null,
    s.frame ? el("div", { class: "site-frame" }, "inside " + s.frame) : null);
  const rows = f.leaks.map((s) => el("tr", { class: "leak-site", "data-site": s.site || "" },
    place(s),
    el("td", {}, (s.ops || []).join(", ")),
    el("td", { class: "num" }, "+" + fmtBytes(s.bytes_per_step)),
    el("td", { class: "num" }, fmtBytes(s.leaked_bytes) + " in " + s.leaked_blocks),
    el("td", {}, "steps " + s.first_step + "\u2013" + s.last_step),
    el("td", {}, sparkline(s.series)),
    el("td", { class: "holder" }, ...(s.holders.length ? s.holders.map((h) =>
      el("div", {}, h.chain + (h.blocks > 1 ? " (" + h.blocks + " blocks)" : ""))) : ["not searched"]))));
  const note = el("p", {}, "A leak is a line whose live memory grows from step to step (new highs at two step ends or more); " +
    "memory made once, or that grew and then stayed flat (a window, a cache that filled up), is resident, listed below. " + f.steps_marked + " step(s) were marked.");
  view.appendChild(card("Leaking sites (" + f.leaks.length + ")", note,
    f.leaks.length ? table(["line", "op", { label: "per step", num: true }, { label: "leaked", num: true }, "grew", "live bytes per step", "held by"],
      rows, { class: "leak-sites" }) : el("p", { class: "empty" }, "No line's memory grows from step to step.")));
  if (f.resident.length) {
    view.appendChild(card("Resident: kept but not growing (" + f.resident.length + ")",
      table(["line", "op", { label: "bytes", num: true }, { label: "blocks", num: true }, "since step"],
        f.resident.map((s) => el("tr", { class: "resident-site" }, place(s), el("td", {}, (s.ops || []).join(", ")),
          el("td", { class: "num" }, fmtBytes(s.bytes)), el("td", { class: "num" }, String(s.blocks)),
          el("td", {}, String(s.since_step) + (s.bounded ? " (bounded: stopped growing at step " + s.stopped_at_step + ")" : "")))),
        { class: "resident-sites" })));
  }
}

function sparkline(series) {
  if (!series || series.length < 2) return el("span", { class: "empty" }, "no series");
  const w = 140, h = 26;
  const xs = series.map((p) => p[0]), ys = series.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = Math.max(...ys) || 1;
  const pts = series.map(([x, y]) => ((x - x0) / ((x1 - x0) || 1) * (w - 2) + 1).toFixed(1) + "," +
    (h - 1 - y / y1 * (h - 2)).toFixed(1)).join(" ");
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "spark");
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts); line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#a1221b"); line.setAttribute("stroke-width", "1.5");
  const title = document.createElementNS(ns, "title");
  title.textContent = "live bytes per beat: " + fmtBytes(ys[0]) + " \u2192 " + fmtBytes(ys[ys.length - 1]) + " (max " + fmtBytes(y1) + ")";
  svg.append(title, line);
  return svg;
}

function siteRows(sites, cols) {
  const rows = [];
  for (const s of sites) {
    const cls = s.class.startsWith("resident") ? "resident" : s.class.split("/")[0];
    const stack = el("tr", { class: "stack", style: "display:none" },
      el("td", { colspan: String(cols) }, el("pre", { class: "site-stack" },
        s.frames.length ? s.frames.join("\n") : "(unresolved stack" + (s.stack_id === null ? ": unknown bucket" : " " + s.stack_id) + ")")));
    const row = el("tr", {
      class: "site-row clickable", "data-rank": s.rank, "data-class": s.class, "data-lsi": s.lsi_text,
      "data-unfreed-bytes": String(s.unfreed.bytes), title: "click for the call stack",
      onclick: () => { stack.style.display = stack.style.display === "none" ? "" : "none"; },
    },
    el("td", {}, s.rank), el("td", {}, el("span", { class: "tag " + cls }, s.class)),
    el("td", { class: "num" }, s.lsi_text),
    el("td", { class: "num" }, fmtBytes(s.unfreed.bytes) + " / " + s.unfreed.count),
    el("td", { class: "num" }, fmtBytes(s.allocated.bytes) + " / " + s.allocated.count),
    el("td", {}, sparkline(s.series)),
    el("td", {}, s.frames[0] || (s.stack_id === null ? "unknown bucket" : "stack " + s.stack_id)));
    rows.push(row, stack);
  }
  return rows;
}

function hostLeakCards(view) {
  const hl = DATA.host_leak;
  if (!hl.windows.length && !hl.overviews.length) return;
  const headers = ["rank", "class", { label: "LSI", num: true }, { label: "unfreed", num: true },
    { label: "allocated", num: true }, "live bytes per beat", "innermost frame"];
  for (const w of hl.windows) {
    const facts = el("div", { class: "facts" },
      el("span", {}, "window ", el("b", {}, String(w.stage))),
      el("span", {}, "unfreed ", el("b", {}, fmtBytes(w.unfreed.bytes)), " in " + w.unfreed.count + " blocks"),
      el("span", {}, "sites ", el("b", {}, String(w.sites_total))),
      el("span", {}, "beat ", el("b", {}, w.beat_ms + " ms")));
    const parts = [facts];
    for (const reason of w.unusable) parts.push(el("p", { class: "empty" }, "Not usable as a leak conclusion: " + reason));
    parts.push(el("h3", {}, "TOP " + w.top_n + " leak sites"));
    parts.push(w.sites.length ? table(headers, siteRows(w.sites, headers.length), { class: "host-sites" }) : el("p", { class: "empty" }, "No leak site."));
    if (w.resident.length) {
      parts.push(el("h3", {}, "Resident baselines"));
      parts.push(table(headers, siteRows(w.resident, headers.length), { class: "host-resident" }));
    }
    view.appendChild(card("Host heap leaks, window " + w.stage, ...parts));
  }
  if (!hl.windows.length) {
    for (const o of hl.overviews) view.appendChild(card("Host heap leaks: " + o.file, el("pre", {}, o.text)));
  }
}

// ---------------------------------------------------------------------------------- compare

function compareView(view) {
  if (!DATA.compare.length) {
    view.appendChild(card("Compare", el("p", { class: "empty" },
      "No compare/memory_compare_*.csv in this run (msmemscope --compare --input-path=BASE,COMPARE -o RUN_DIR writes one).")));
    return;
  }
  for (const c of DATA.compare) {
    const facts = el("div", { class: "facts" },
      el("span", {}, "ops ", el("b", {}, String(c.total))),
      el("span", {}, "matched ", el("b", {}, String(c.matched))),
      el("span", {}, "only in base ", el("b", {}, String(c.base_only))),
      el("span", {}, "only in compare ", el("b", {}, String(c.compare_only))),
      el("span", {}, "memory differs ", el("b", {}, String(c.changed))),
      c.rows.length < c.total ? el("span", {}, c.rows.length + " rows shown: the first ones, then those whose memory differs") : null);
    const rows = [];
    let next = 0;
    for (const [index, f] of c.rows) {
      if (index > next) rows.push(el("tr", { class: "gap" }, el("td", { colspan: "7", class: "empty" }, "\u2026 " + (index - next) + " op(s) with the same memory \u2026")));
      next = index + 1;
      const [event, name, device, base, other, diff] = f;
      const kind = base === "N/A" ? "compare-only" : other === "N/A" ? "base-only" : diff !== "0" ? "changed" : "same";
      rows.push(el("tr", { class: "compare-row " + kind, "data-fields": JSON.stringify(f), "data-index": String(index) },
        el("td", {}, device), el("td", {}, event),
        el("td", {}, base === "N/A" ? "" : name), el("td", { class: "num" }, base),
        el("td", {}, other === "N/A" ? "" : name), el("td", { class: "num" }, other),
        el("td", { class: "num diff" }, diff)));
    }
    if (next < c.total) rows.push(el("tr", { class: "gap" }, el("td", { colspan: "7", class: "empty" }, "\u2026 " + (c.total - next) + " more op(s) with the same memory")));
    const only = el("input", { type: "checkbox" });
    const grid = table(["device", "event", "base op", { label: "base bytes", num: true }, "compare op",
      { label: "compare bytes", num: true }, { label: "diff", num: true }], rows, { class: "compare-table" });
    only.addEventListener("change", () => {
      for (const r of rows) {
        const same = r.classList.contains("same") || r.classList.contains("gap");
        r.style.display = only.checked && same ? "none" : "";
      }
    });
    view.appendChild(card("Compare: " + c.file, facts,
      el("label", {}, only, " only the ops whose memory differs or that one side lacks"), grid));
  }
}

// ---------------------------------------------------------------------------------- OOM

function oomView(view) {
  const rows = DATA.oom.rows;
  if (!rows.length) {
    view.appendChild(card("Out of memory", el("p", { class: "empty" }, "No OOM_DETAIL rows: no allocation failed while the oom analysis was on.")));
    return;
  }
  const groups = [["OOM_TRIGGER", "Triggers"], ["OOM_RECENT_ALLOC", "Most recent live blocks"], ["OOM_TOP_ALLOC", "Largest live blocks"]];
  const parts = [];
  // The OOM summary made from the dump: each failure, its op and line, the largest live sites.
  if (DATA.oom.summary) parts.push(el("pre", { class: "oom-summary" }, DATA.oom.summary));
  for (const [type, title] of groups) {
    const mine = rows.filter((r) => r.type === type);
    if (!mine.length) continue;
    parts.push(el("h3", {}, title + " (" + mine.length + ")"));
    const body = [];
    for (const r of mine) {
      const a = r.attrs;
      const size = a.size !== undefined ? a.size : a.req_size;
      const stackText = [r.c_stack, r.python_stack].filter((s) => s).join("\n");
      const stack = el("tr", { class: "stack", style: "display:none" }, el("td", { colspan: "6" }, el("pre", {}, stackText || "(no stack recorded)")));
      body.push(el("tr", { class: "oom-row clickable", "data-type": r.type, onclick: () => { stack.style.display = stack.style.display === "none" ? "" : "none"; } },
        el("td", { class: "num" }, String(r.id)), el("td", {}, r.device), el("td", {}, r.ptr || a.ptr || ""),
        el("td", { class: "num" }, size !== undefined ? fmtBytes(Number(size)) : ""),
        el("td", {}, a.func || a.pool || r.name || ""),
        el("td", {}, Object.entries(a).map(([k, v]) => k + "=" + v).join(", "))), stack);
    }
    parts.push(table([{ label: "row ID", num: true }, "device", "address", { label: "size", num: true }, "function / pool", "Attr"], body));
  }
  if (DATA.oom.dropped) parts.push(el("p", { class: "empty" }, DATA.oom.dropped + " more rows not shown"));
  view.appendChild(card("Out of memory", ...parts));
}

// ---------------------------------------------------------------------------------- watch

function watchView(view) {
  if (!DATA.watch.length) {
    view.appendChild(card("Watch", el("p", { class: "empty" }, "No watch_dump/*.csv in this run (--watch start,end writes them).")));
    return;
  }
  for (const w of DATA.watch) {
    if (w.error) { view.appendChild(card("Watch: " + w.file, el("p", { class: "empty" }, w.error))); continue; }
    const changed = w.rows.filter((r) => r.changed);
    const facts = el("div", { class: "facts" },
      el("span", {}, "rows ", el("b", {}, String(w.total))),
      el("span", {}, "checksum changes ", el("b", {}, String(w.changes))));
    const all = el("input", { type: "checkbox" });
    const render = () => {
      const rows = (all.checked ? w.rows : changed).map((r) => el("tr", { class: r.changed ? "watch-row watch-change" : "watch-row", "data-block": r.block },
        el("td", {}, r.block), r.fields.map((f) => el("td", {}, f))));
      holder.replaceChildren(rows.length ? table(["block"].concat(w.header), rows) : el("p", { class: "empty" }, "No checksum changed."));
    };
    const holder = el("div");
    all.addEventListener("change", render);
    view.appendChild(card("Watch: " + w.file, facts, w.summary ? el("pre", { class: "watch-summary" }, w.summary) : null,
      el("label", {}, all, " show every row (changes highlighted)"), holder));
    render();
  }
}

// ---------------------------------------------------------------------------------- layout

const VIEWS = [
  ["timeline", "Timeline", timelineView, () => DATA.timelines.length],
  ["leaks", "Leaks", leaksView, () => (DATA.leaks ? DATA.leaks.total : 0) + DATA.host_leak.windows.reduce((s, w) => s + w.sites.length, 0)],
  ["compare", "Compare", compareView, () => DATA.compare.reduce((s, c) => s + c.total, 0)],
  ["oom", "OOM", oomView, () => DATA.oom.rows.filter((r) => r.type === "OOM_TRIGGER").length],
  ["watch", "Watch", watchView, () => DATA.watch.reduce((s, w) => s + (w.changes || 0), 0)],
];

function main() {
  const header = el("header", {}, el("h1", {}, "msmemscope report: " + (DATA.run || "")),
    el("div", { class: "meta" }, DATA.generated_by + (DATA.config && DATA.config.analysis ? " \u00b7 analysis " + JSON.stringify(DATA.config.analysis) : "")));
  const nav = el("nav");
  const main = el("main");
  document.body.append(header, nav, main);
  const sections = {};
  for (const [id, title, , count] of VIEWS) {
    nav.appendChild(el("a", { href: "#" + id, id: "tab-" + id }, title, el("span", { class: "count" }, String(count()))));
    sections[id] = main.appendChild(el("section", { class: "view", id: "view-" + id }));
  }
  const built = new Set();
  const show = () => {
    const id = (location.hash || "#timeline").slice(1);
    const entry = VIEWS.find((v) => v[0] === id) || VIEWS[0];
    for (const [vid] of VIEWS) {
      sections[vid].classList.toggle("active", vid === entry[0]);
      document.getElementById("tab-" + vid).classList.toggle("active", vid === entry[0]);
    }
    // Charts need a visible container to size themselves, so each view is built when shown.
    if (!built.has(entry[0])) {
      built.add(entry[0]);
      entry[2](sections[entry[0]]);
      window.msmemscopeReport.views.push(entry[0]);
    }
  };
  window.addEventListener("hashchange", show);
  show();
  window.msmemscopeReport.ready = true;
}

main();
