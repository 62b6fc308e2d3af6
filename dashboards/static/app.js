// tracegym dashboard: draws the charts from the JSON data islands each page carries
// (<script type="application/json">, parsed, never evaluated) and opens the span a URL
// fragment names. Loaded from the dashboard itself: the Content-Security-Policy allows no
// inline script.
"use strict";

function readData(id) {
  const node = document.getElementById(id);
  if (!node) return null;
  try {
    return JSON.parse(node.textContent);
  } catch (err) {
    return null;
  }
}

const LAYOUT = {
  margin: { l: 50, r: 50, t: 10, b: 40 },
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  font: { size: 12 },
  legend: { orientation: "h", y: -0.2 },
};
const CONFIG = { displaylogo: false, responsive: true };

function intervalTrace(name, items, names, color) {
  const y = items.map((r) => (r ? r.rate : null));
  const plus = items.map((r) => (r && r.ci ? r.ci[1] - r.rate : 0));
  const minus = items.map((r) => (r && r.ci ? r.rate - r.ci[0] : 0));
  return {
    type: "bar", name: name, x: names, y: y, marker: { color: color },
    error_y: { type: "data", symmetric: false, array: plus, arrayminus: minus, visible: true },
  };
}

const CHARTS = {
  daily(d) {
    return [[
      { type: "bar", name: "runs", x: d.days, y: d.runs, marker: { color: "#9bb7d4" } },
      { type: "scatter", mode: "lines+markers", name: "success rate", x: d.days, y: d.rate,
        yaxis: "y2", line: { color: "#2a7d46" } },
    ], { xaxis: { type: "category" }, yaxis: { title: { text: "runs" } },
         yaxis2: { title: { text: "success rate" }, overlaying: "y", side: "right",
                   range: [0, 1], tickformat: ".0%" } }];
  },
  tools(d) {
    return [[
      { type: "bar", name: "errors", x: d.tools, y: d.tool_errors, marker: { color: "#c0392b" } },
      { type: "bar", name: "failed runs calling it", x: d.tools, y: d.tool_failed_runs,
        marker: { color: "#e6a23c" } },
    ], { barmode: "group" }];
  },
  nightly(d) {
    return [[
      { type: "scatter", mode: "lines+markers", name: "gaps", x: d.nights, y: d.night_gaps },
      { type: "bar", name: "adapters trained", x: d.nights, y: d.night_trained },
      { type: "bar", name: "adapters promoted", x: d.nights, y: d.night_promoted },
    ], { barmode: "group", xaxis: { type: "category" } }];
  },
  gaps(d) {
    const names = d.bars.map((b) => b.name);
    return [[
      { type: "bar", name: "coverage", x: names, y: d.bars.map((b) => b.coverage) },
      { type: "bar", name: "delta", x: names, y: d.bars.map((b) => b.delta) },
    ], { barmode: "group", yaxis: { range: [0, 1] } }];
  },
  map(d) {
    const groups = {};
    d.points.forEach((p) => {
      const key = p.gap || "";
      (groups[key] = groups[key] || { x: [], y: [], ids: [] });
      groups[key].x.push(p.x);
      groups[key].y.push(p.y);
      groups[key].ids.push(p.gap || "");
    });
    const traces = Object.keys(groups).sort().map((key) => ({
      type: "scatter", mode: "markers", name: key ? (d.names[key] || key) : "no gap",
      x: groups[key].x, y: groups[key].y, customdata: groups[key].ids,
      marker: { size: 7, opacity: key ? 0.85 : 0.35, color: key ? undefined : "#999" },
      hovertemplate: "%{fullData.name}<extra></extra>",
    }));
    traces.push({
      type: "scatter", mode: "markers+text", name: "gap signature",
      x: d.marks.map((m) => m.x), y: d.marks.map((m) => m.y), customdata: d.marks.map((m) => m.id),
      text: d.marks.map((m) => m.name), textposition: "top center",
      marker: { size: 13, symbol: "star", color: "#222" },
    });
    return [traces, { xaxis: { title: { text: "PC 1" } }, yaxis: { title: { text: "PC 2" } },
                      showlegend: true }];
  },
  adapters(d) {
    return [[
      intervalTrace("base", d.base, d.names, "#9bb7d4"),
      intervalTrace("with adapter", d.adapter, d.names, "#2a7d46"),
      intervalTrace("routed", d.router, d.names, "#e6a23c"),
    ], { barmode: "group", yaxis: { range: [0, 1], tickformat: ".0%",
                                     title: { text: "held-out success (95% CI)" } } }];
  },
};

function drawCharts() {
  if (typeof Plotly === "undefined") return;
  document.querySelectorAll("[data-chart]").forEach((node) => {
    const data = readData(node.dataset.source);
    const make = CHARTS[node.dataset.chart];
    if (!data || !make) return;
    const [traces, layout] = make(data);
    Plotly.newPlot(node, traces, Object.assign({}, LAYOUT, layout), CONFIG).then(() => {
      node.dataset.drawn = "1";
    });
    if (node.dataset.chart === "map") {
      node.on("plotly_click", (event) => {
        const id = event.points && event.points[0] && event.points[0].customdata;
        if (id) window.location.href = "/runs?finding=" + encodeURIComponent(id);
      });
    }
  });
}

function openFragment() {
  const id = decodeURIComponent(window.location.hash.slice(1));
  if (!id) return;
  const node = document.getElementById(id);
  if (node && node.tagName === "DETAILS") {
    node.open = true;
    node.classList.add("target");
    node.scrollIntoView({ block: "center" });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  drawCharts();
  openFragment();
  window.addEventListener("hashchange", openFragment);
});
