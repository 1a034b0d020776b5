// The overview: the figures of /api/overview/ as cards and uPlot charts, asked for every few
// seconds (each figure is one indexed query on the server).

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { $, api, span } from "./common.js";

const EVERY = 5000;
const KEEP = 720; // live-state points kept: an hour at 5 s
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

  charts.live = new uPlot({
    ...sized(node("live")),
    scales: { x: { time: true, auto: false }, y: { range: (u, min, max) => [0, Math.max(4, max + 1)] } },
    series: [{}, ...STATES.map((state) => ({ label: state, stroke: colors[state], width: 2 }))],
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

const liveHistory = [[], [], [], []];

function draw(charts, data) {
  figure("queued", String(data.runs.queued));
  figure("running", String(data.runs.running));
  figure("awaiting", String(data.runs.awaiting));
  figure("ended", String(data.duration.count));
  figure("failure-rate", data.failure_rate === null ? "–" : `${(data.failure_rate * 100).toFixed(1)} %`);
  const p = data.duration;
  figure("p50", p.p50 === null ? "–" : span(p.p50));
  figure("p95", p.p95 === null ? "–" : span(p.p95));
  figure("p99", p.p99 === null ? "–" : span(p.p99));
  figure("pending", String(data.pending_intents));
  $('[data-field="bucket"]').textContent = `(per ${data.bucket / 60} min)`;

  const xs = data.series.map((point) => Date.parse(point.at) / 1000);
  charts.throughput.setData([xs, data.series.map((p) => p.started), data.series.map((p) => p.ended)]);

  liveHistory[0].push(Date.now() / 1000);
  STATES.forEach((state, i) => liveHistory[i + 1].push(data.runs[state]));
  if (liveHistory[0].length > KEEP) liveHistory.forEach((column) => column.shift());
  charts.live.setData(liveHistory, false);
  // At least five minutes wide, so the first points are not stretched over a year.
  const last = liveHistory[0].at(-1);
  charts.live.setScale("x", { min: Math.min(liveHistory[0][0], last - 300), max: last + 5 });

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
    const cells = [path, String(paths[path].count), `${((paths[path].sum / paths[path].count) * 1000).toFixed(0)} ms`];
    cells.forEach((text, i) => {
      const cell = document.createElement("td");
      cell.textContent = text;
      if (i) cell.className = "num";
      row.append(cell);
    });
    return row;
  });
  if (rows.length) $('[data-field="stop-table"]').replaceChildren(...rows);
}

function start() {
  const charts = makeCharts();
  const live = $("#live");
  const windowPicker = $("#window");
  const fromUrl = new URLSearchParams(location.search).get("window");
  if (fromUrl && [...windowPicker.options].some((o) => o.value === fromUrl)) windowPicker.value = fromUrl;
  let timer = null;

  async function poll() {
    clearTimeout(timer);
    try {
      draw(charts, await api("GET", `/api/overview/?window=${windowPicker.value}`));
      live.dataset.status = "live";
      live.textContent = "live";
    } catch (problem) {
      live.dataset.status = "offline";
      live.textContent = `offline (${problem.message}), retrying`;
    }
    timer = setTimeout(poll, document.hidden ? EVERY * 6 : EVERY);
  }
  windowPicker.addEventListener("change", () => {
    const url = new URL(location.href);
    url.searchParams.set("window", windowPicker.value);
    history.replaceState(null, "", url);
    poll();
  });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
  poll();
}

start();
