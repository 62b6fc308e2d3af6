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

// Plotly prints labels on one line: break long ones at spaces (plotly reads <br>).
function wrap(text, width) {
  const words = String(text).split(/\s+/);
  const lines = [];
  let line = "";
  words.forEach((word) => {
    if (line && (line + " " + word).length > width) {
      lines.push(line);
      line = word;
    } else {
      line = line ? line + " " + word : word;
    }
  });
  if (line) lines.push(line);
  return lines.map(esc).join("<br>");
}

// Plotly reads a little HTML in every string it draws (tick labels, hover text, legend
// names, titles: <a href>, <b>, <br>, entities): every string from the data islands (tool
// names, run ids, gap and adapter names, dates) goes through esc, so it is shown as text.
function esc(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function escAll(texts) {
  return (texts || []).map(esc);
}

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
    const days = escAll(d.days);
    return [[
      { type: "bar", name: "runs", x: days, y: d.runs, marker: { color: "#9bb7d4" } },
      { type: "scatter", mode: "lines+markers", name: "success rate", x: days, y: d.rate,
        yaxis: "y2", line: { color: "#2a7d46" } },
    ], { xaxis: { type: "category", automargin: true },
         yaxis: { title: { text: "runs" }, rangemode: "tozero", tickformat: ",d" },
         yaxis2: { title: { text: "success rate" }, overlaying: "y", side: "right",
                   range: [0, 1.02], tick0: 0, dtick: 0.2, tickformat: ".0%" },
         bargap: days.length < 6 ? 0.6 : 0.2,
         legend: { orientation: "h", x: 0, y: 1.12 }, margin: { l: 60, r: 60, t: 36, b: 60 } }];
  },
  per_run(d) {
    const r = d.per_run;
    const labels = escAll(r.labels);
    const colours = { success: "#2a7d46", failure: "#c0392b", unknown: "#9aa3b2" };
    return [["success", "failure", "unknown"].map((kind) => {
      const pick = r.outcome.map((o, i) => (o === kind ? i : -1)).filter((i) => i >= 0);
      return { type: "bar", name: kind, x: pick.map((i) => labels[i]),
               y: pick.map((i) => r.spans[i]), customdata: pick.map((i) => r.ids[i]),
               marker: { color: colours[kind] }, hovertemplate: "%{x}: %{y} spans<extra></extra>" };
    }), { xaxis: { type: "category", categoryorder: "array", categoryarray: labels,
                   automargin: true, tickangle: -45 },
          yaxis: { title: { text: "spans" }, rangemode: "tozero", tickformat: ",d" },
          barmode: "overlay", legend: { orientation: "h", x: 0, y: 1.12 },
          margin: { l: 60, r: 20, t: 36, b: 90 } }];
  },
  tools(d) {
    const tools = escAll(d.tools);
    return [[
      { type: "bar", name: "errors", x: tools, y: d.tool_errors, marker: { color: "#c0392b" } },
      { type: "bar", name: "failed runs calling it", x: tools, y: d.tool_failed_runs,
        marker: { color: "#e6a23c" } },
    ], { barmode: "group", yaxis: { rangemode: "tozero", tickformat: ",d" },
         xaxis: { automargin: true }, legend: { orientation: "h", x: 0, y: 1.15 },
         margin: { l: 50, r: 20, t: 36, b: 60 } }];
  },
  nightly(d) {
    const nights = escAll(d.nights);
    return [[
      { type: "scatter", mode: "lines+markers", name: "gaps", x: nights, y: d.night_gaps },
      { type: "bar", name: "adapters trained", x: nights, y: d.night_trained },
      { type: "bar", name: "adapters promoted", x: nights, y: d.night_promoted },
    ], { barmode: "group", xaxis: { type: "category" }, bargap: d.nights.length < 6 ? 0.5 : 0.2,
         yaxis: { rangemode: "tozero", tickformat: ",d" },
         legend: { orientation: "h", x: 0, y: 1.15 }, margin: { l: 50, r: 20, t: 36, b: 40 } }];
  },
  gaps(d) {
    // Horizontal bars: a gap's whole name fits on the left (wrapped), the legend sits on top.
    const names = d.bars.map((b) => wrap(b.name, 34));
    return [[
      { type: "bar", orientation: "h", name: "coverage", y: names,
        x: d.bars.map((b) => b.coverage), marker: { color: "#6f9bd1" } },
      { type: "bar", orientation: "h", name: "delta", y: names,
        x: d.bars.map((b) => b.delta), marker: { color: "#e6a23c" } },
    ], { barmode: "group",
         xaxis: { range: [0, 1], tick0: 0, dtick: 0.25, tickformat: ".0%" },
         yaxis: { automargin: true, autorange: "reversed", type: "category" },
         legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
         margin: { l: 10, r: 20, t: 30, b: 30 } }];
  },
  map(d) {
    // Coloured by the gap whose signatures lie nearest; when no gap lists signatures, by
    // group of similar signatures (the server says which in the note under the map).
    const groups = {};
    d.points.forEach((p) => {
      const key = p.gap ? "gap:" + p.gap : (p.group ? "group:" + p.group : "");
      (groups[key] = groups[key] || { x: [], y: [], ids: [] });
      groups[key].x.push(p.x);
      groups[key].y.push(p.y);
      groups[key].ids.push(p.gap || "");
    });
    const label = (key) => {
      if (key.startsWith("gap:")) return esc(d.names[key.slice(4)] || key.slice(4));
      if (key.startsWith("group:")) return "signature group " + esc(key.slice(6));
      return "no gap";
    };
    const order = (key) => (key.startsWith("group:") ? Number(key.slice(6)) : 0);
    const traces = Object.keys(groups).sort((a, b) => order(a) - order(b) || (a < b ? -1 : 1))
      .map((key) => ({
        type: "scatter", mode: "markers", name: label(key),
        x: groups[key].x, y: groups[key].y, customdata: groups[key].ids,
        marker: { size: 7, opacity: key ? 0.85 : 0.35, color: key ? undefined : "#999" },
        hovertemplate: "%{fullData.name}<extra></extra>",
      }));
    traces.push({
      type: "scatter", mode: "markers+text", name: "gap signature",
      x: d.marks.map((m) => m.x), y: d.marks.map((m) => m.y), customdata: d.marks.map((m) => m.id),
      text: d.marks.map((m) => esc(m.name)), textposition: "top center",
      marker: { size: 13, symbol: "star", color: "#222" },
    });
    return [traces, { xaxis: { title: { text: "PC 1" } }, yaxis: { title: { text: "PC 2" } },
                      showlegend: true, legend: { orientation: "v", x: 1.02, y: 1 },
                      margin: { l: 50, r: 10, t: 10, b: 40 } }];
  },
  adapters(d) {
    const names = escAll(d.names);
    return [[
      intervalTrace("base", d.base, names, "#9bb7d4"),
      intervalTrace("with adapter", d.adapter, names, "#2a7d46"),
      intervalTrace("routed", d.router, names, "#e6a23c"),
    ], { barmode: "group", yaxis: { range: [0, 1], tick0: 0, dtick: 0.2, tickformat: ".0%",
                                     title: { text: "held-out success (95% CI)" } },
         legend: { orientation: "h", x: 0, y: 1.12 }, margin: { l: 60, r: 20, t: 36, b: 40 } }];
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
    if (node.dataset.chart === "per_run") {
      node.on("plotly_click", (event) => {
        const id = event.points && event.points[0] && event.points[0].customdata;
        if (id) window.location.href = "/run/" + encodeURIComponent(id);
      });
    }
    if (node.dataset.chart === "map") {
      node.on("plotly_click", (event) => {
        const id = event.points && event.points[0] && event.points[0].customdata;
        if (id) window.location.href = "/runs?finding=" + encodeURIComponent(id);
      });
    }
  });
}

// The run page: the tree's node a URL fragment (#span-<id>) names is selected and its detail
// shown in the pane; clicking a node changes the fragment, so a link can name a span.
function selectSpan(id, scroll) {
  const node = document.getElementById("span-" + id);
  const detail = document.getElementById("detail-" + id);
  if (!node || !detail) return false;
  document.querySelectorAll("#span-tree .node.selected").forEach((n) => {
    n.classList.remove("selected");
    n.removeAttribute("aria-current");
  });
  document.querySelectorAll("#detail-pane .detail").forEach((d) => { d.hidden = true; });
  node.classList.add("selected");
  node.setAttribute("aria-current", "true");
  detail.hidden = false;
  if (scroll) node.scrollIntoView({ block: "center" });
  return true;
}

function openFragment() {
  const id = decodeURIComponent(window.location.hash.slice(1));
  if (!id) return;
  if (id.startsWith("span-") && selectSpan(id.slice(5), true)) {
    document.querySelectorAll("#span-tree .node.target").forEach((n) => {
      n.classList.remove("target");
    });
    document.getElementById(id).classList.add("target");
    return;
  }
  const node = document.getElementById(id);
  if (node && node.tagName === "DETAILS") {
    node.open = true;
    node.classList.add("target");
    node.scrollIntoView({ block: "center" });
  }
}

function wireTabs() {
  document.querySelectorAll(".detail .tabs .tab").forEach((tab) => {
    tab.addEventListener("click", () => {
      const detail = tab.closest(".detail");
      detail.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t === tab));
      detail.querySelectorAll(".panel").forEach((p) => {
        p.hidden = p.dataset.panel !== tab.dataset.tab;
      });
    });
  });
}

// Tables with class "sortable": a click on a header sorts the rows shown by that column
// (numbers as numbers; a cell's data-sort value wins over its text); again reverses.
function wireSorting() {
  document.querySelectorAll("table.sortable").forEach((table) => {
    const body = table.tBodies[0];
    table.querySelectorAll("thead th").forEach((th, index) => {
      th.classList.add("sort-key");
      th.addEventListener("click", () => {
        const descending = th.dataset.dir !== "desc";
        table.querySelectorAll("thead th").forEach((h) => { delete h.dataset.dir; });
        th.dataset.dir = descending ? "desc" : "asc";
        const key = (row) => {
          const cell = row.cells[index];
          if (!cell) return "";
          const raw = cell.dataset.sort !== undefined ? cell.dataset.sort : cell.innerText.trim();
          const num = Number(raw);
          return raw !== "" && !Number.isNaN(num) ? num : raw.toLowerCase();
        };
        const rows = Array.from(body.rows).filter((r) => !r.querySelector("td.empty"));
        rows.sort((a, b) => {
          const x = key(a), y = key(b);
          const order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0)
            : (typeof x === "number" ? -1 : 1);
          return descending ? -order : order;
        });
        rows.forEach((r) => body.appendChild(r));
      });
    });
  });
}

// Filter forms with class "auto": a changed drop-down or date applies at once.
function wireFilters() {
  document.querySelectorAll("form.auto").forEach((form) => {
    form.querySelectorAll("select, input[type=date]").forEach((field) => {
      field.addEventListener("change", () => form.requestSubmit());
    });
  });
}

document.addEventListener("DOMContentLoaded", () => {
  drawCharts();
  wireTabs();
  wireSorting();
  wireFilters();
  openFragment();
  window.addEventListener("hashchange", openFragment);
});
