// The overview: the figures of /api/overview/ as cards, uPlot charts and a table by agent,
// asked for every few seconds (each figure is one indexed query on the server) over the
// range of the URL: ?window=seconds, or ?since=…&until=… (the server checks the range).

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { $, api, span } from "./common.js";

const EVERY = 5000;
const STATES = ["queued", "running", "awaiting"];
const CAUSES = ["completed", "failed", "cancelled", "stopped"];
const PATHS = ["live", "durable", "sweeper"];

const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
const palette = () => ({
  fg: css("--muted"), grid: css("--line"),
  queued: css("--s-queued-fg"), running: css("--accent"), awaiting: "#8b5cf6",
  completed: "#16a34a", failed: "#dc2626", cancelled: "#d97706", stopped: "#a16207",
  started: css("--accent"), ended: "#16a34a",
  live: css("--accent"), durable: "#8b5cf6", sweeper: "#d97706",
});

function axes(colors, x = {}) {
  const axis = { stroke: colors.fg, grid: { stroke: colors.grid, width: 1 }, ticks: { stroke: colors.grid } };
  return [{ ...axis, ...x }, { ...axis, size: 54 }];
}

function sized(node) {
  return { width: Math.max(node.clientWidth, 260), height: node.clientWidth < 480 ? 190 : 230 };
}

function makeCharts() {
  const colors = palette();
  const node = (name) => $(`[data-chart="${name}"]`);
  const charts = {};
  const integer = { values: (u, splits) => splits.map((v) => (Number.isInteger(v) ? v : "")) };

  charts.throughput = new uPlot({
    ...sized(node("throughput")),
    scales: { x: { time: true } },
    series: [{}, { label: "started", stroke: colors.started, width: 2 },
      { label: "ended", stroke: colors.ended, width: 2, dash: [6, 3] }],
    axes: [axes(colors)[0], { ...axes(colors)[1], ...integer }],
  }, [[], [], []], node("throughput"));

  // A short history (a site just started, samples just begun) is a few points on a wide
  // axis: they are drawn as dots, which a line of two points would not show.
  const sparse = (u, i) => u.data[i].filter((v) => v != null).length <= 12;
  charts.live = new uPlot({
    ...sized(node("live")),
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(4, (max ?? 0) + 1)] } },
    series: [{}, ...STATES.map((state) => ({ label: state, stroke: colors[state], width: 2,
      points: { show: sparse, size: 6, fill: colors[state] },
      value: (u, v, i, at) => (at == null ? "–" : v == null ? "no sample" : v) }))],
    axes: [axes(colors)[0], { ...axes(colors)[1], ...integer }],
  }, [[], [], [], []], node("live"));

  // Each cause in its own colour (the state badges' hues), not one colour for every bar.
  const causeColours = { values: () => CAUSES.map((cause) => colors[cause]) };
  const bars = uPlot.paths.bars({ size: [0.6, 80], disp: { fill: causeColours, stroke: causeColours } });
  charts.ended = new uPlot({
    ...sized(node("ended")),
    scales: { x: { time: false, range: [-0.5, CAUSES.length - 0.5] } },
    series: [{ label: "cause", value: (u, i) => CAUSES[i] ?? "" },
      { label: "runs", stroke: colors.fg, fill: colors.running, paths: bars, points: { show: false } }],
    axes: [{ ...axes(colors)[0], splits: () => CAUSES.map((_, i) => i),
      values: (u, splits) => splits.map((i) => CAUSES[i] ?? ""), grid: { show: false } },
    { ...axes(colors)[1], ...integer }],
    legend: { show: false },
  }, [CAUSES.map((_, i) => i), CAUSES.map(() => 0)], node("ended"));

  charts.stop = new uPlot({
    ...sized(node("stop")),
    scales: { x: { time: false, distr: 3 }, y: { range: [0, 100] } },
    series: [{ label: "within", value: (u, v) => (v == null ? "" : span(v)) },
      ...PATHS.map((path) => ({ label: path, stroke: colors[path], width: 2,
        value: (u, v) => (v == null ? "–" : `${v.toFixed(0)} %`) }))],
    axes: [{ ...axes(colors)[0], values: (u, splits) => splits.map((v) => (v == null ? "" : span(v))) },
      { ...axes(colors)[1], values: (u, splits) => splits.map((v) => `${v} %`) }],
  }, [[], [], [], []], node("stop"));

  window.addEventListener("resize", () => {
    for (const [name, chart] of Object.entries(charts)) chart.setSize(sized(node(name)));
  });
  return charts;
}

function figure(name, text) {
  const node = $(`[data-figure="${name}"]`);
  if (node && node.textContent !== text) node.textContent = text;
}

const percent = (rate) => (rate === null ? "–" : `${(rate * 100).toFixed(1)} %`);
const minutes = (seconds) => (seconds % 3600 === 0 ? `${seconds / 3600} h` : `${seconds / 60} min`);

function cells(row, values) {
  values.forEach(([text, label], i) => {
    const cell = document.createElement(i ? "td" : "th");
    if (i) cell.className = "num";
    else cell.scope = "row";
    cell.textContent = text;
    cell.dataset.label = label;  // a phone shows the cells as a card, each with its column
    row.append(cell);
  });
}

function agentRows(agents) {
  return agents.map((figures) => {
    const row = document.createElement("tr");
    row.dataset.agent = figures.agent;
    const stop = figures.time_to_stop;
    cells(row, [
      [figures.agent, "Agent"],
      ...STATES.map((state) => [String(figures.live[state]), state]),
      ...CAUSES.map((cause) => [String(figures.ended[cause]), cause]),
      [percent(figures.failure_rate), "failure rate"],
      [String(stop.count), "stops"],
      [stop.mean === null ? "–" : span(stop.mean), "time to stop, mean"],
      [stop.max === null ? "–" : span(stop.max), "slowest"],
    ]);
    return row;
  });
}

function draw(charts, data) {
  figure("queued", String(data.runs.queued));
  figure("running", String(data.runs.running));
  figure("awaiting", String(data.runs.awaiting));
  figure("ended", String(data.duration.count));
  figure("failure-rate", percent(data.failure_rate));
  const p = data.duration;
  figure("p50", p.p50 === null ? "–" : span(p.p50));
  figure("p95", p.p95 === null ? "–" : span(p.p95));
  figure("p99", p.p99 === null ? "–" : span(p.p99));
  figure("pending", String(data.pending_intents));
  $('[data-field="bucket"]').textContent = `(per ${minutes(data.bucket)})`;
  $('[data-field="live-note"]').textContent = data.bucket > data.sample_seconds
    ? `(the highest of each ${minutes(data.bucket)}, sampled each minute)`
    : "(sampled each minute)";

  const from = Date.parse(data.since) / 1000;
  const to = Math.max(Date.parse(data.until) / 1000, from + data.bucket);
  const xs = data.series.map((point) => Date.parse(point.at) / 1000);
  charts.throughput.setData([xs, data.series.map((p) => p.started), data.series.map((p) => p.ended)], false);
  charts.throughput.setScale("x", { min: from, max: to });

  const live = data.live_series;
  charts.live.setData([live.map((point) => Date.parse(point.at) / 1000),
    ...STATES.map((state) => live.map((point) => point[state]))], false);
  charts.live.setScale("x", { min: from, max: to });

  charts.ended.setData([CAUSES.map((_, i) => i), CAUSES.map((cause) => data.ended[cause] || 0)]);

  const paths = data.time_to_stop;
  const any = Object.values(paths)[0];
  if (any) {
    const bounds = any.buckets.filter(([bound]) => bound !== "+Inf").map(([bound]) => Number(bound));
    const share = (path) => {
      const row = paths[path];
      if (!row || !row.count) return bounds.map(() => null);
      return row.buckets.filter(([bound]) => bound !== "+Inf").map(([, n]) => (100 * n) / row.count);
    };
    charts.stop.setData([bounds, ...PATHS.map(share)]);
  }
  const rows = PATHS.filter((path) => paths[path]?.count).map((path) => {
    const row = document.createElement("tr");
    const texts = [path, String(paths[path].count), `${((paths[path].sum / paths[path].count) * 1000).toFixed(0)} ms`];
    texts.forEach((text, i) => {
      const cell = document.createElement("td");
      cell.textContent = text;
      if (i) cell.className = "num";
      row.append(cell);
    });
    return row;
  });
  if (rows.length) $('[data-field="stop-table"]').replaceChildren(...rows);
  if (data.agents.length) $('[data-field="agents"]').replaceChildren(...agentRows(data.agents));
}

// datetime-local's text for an instant, in the viewer's zone (to the minute).
function local(iso) {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return "";
  const shifted = new Date(at.getTime() - at.getTimezoneOffset() * 60000);
  return shifted.toISOString().slice(0, 16);
}

// The API's query for the range of the page's URL: ?window=… or ?since=…&until=….
function rangeQuery() {
  const asked = new URLSearchParams(location.search);
  const query = new URLSearchParams();
  for (const name of ["window", "since", "until"]) {
    if (asked.get(name)) query.set(name, asked.get(name));
  }
  if (!query.has("window") && !query.has("since")) query.set("window", "3600");
  return query.toString();
}

function rangeForm(poll) {
  const form = $("#range");
  const picker = form.elements.window;
  const custom = form.querySelector('[data-field="custom"]');
  const asked = new URLSearchParams(location.search);
  form.elements.since.value = local(asked.get("since"));
  form.elements.until.value = local(asked.get("until"));

  function go(query) {
    history.replaceState(null, "", `${location.pathname}?${query}`);
    poll();
  }
  picker.addEventListener("change", () => {
    custom.hidden = picker.value !== "custom";
    if (picker.value === "custom") {
      if (!form.elements.since.value) {
        form.elements.since.value = local(new Date(Date.now() - 3600 * 1000).toISOString());
      }
      form.elements.since.focus();
      return;
    }
    go(new URLSearchParams({ window: picker.value }).toString());
  });
  form.addEventListener("input", () => { form.querySelector('[data-field="range-error"]').textContent = ""; });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const name of ["since", "until"]) {
      const value = form.elements[name].value;
      if (value) query.set(name, new Date(value).toISOString());  // the viewer's zone
    }
    go(query.toString());
  });
}

function start() {
  const charts = makeCharts();
  const live = $("#live");
  const problem = $('[data-field="range-error"]');
  let timer = null;

  async function poll() {
    clearTimeout(timer);
    const query = rangeQuery();
    $('[data-field="api-link"]').href = `/api/overview/?${query}`;
    try {
      draw(charts, await api("GET", `/api/overview/?${query}`));
      problem.textContent = "";
      live.dataset.status = "live";
      live.textContent = "live";
    } catch (failure) {
      if (failure.status === 400) {
        problem.textContent = failure.message;  // the server's word on the range
        live.dataset.status = "live";
        live.textContent = "live";
      } else {
        live.dataset.status = "offline";
        live.textContent = `offline (${failure.message}), retrying`;
      }
    }
    timer = setTimeout(poll, document.hidden ? EVERY * 6 : EVERY);
  }
  rangeForm(poll);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
  poll();
}

start();
