// What both pages share: requests to the REST API, toasts, patching a run's row from a
// committed snapshot, and the websocket with backoff and "resume after seq".

export const $ = (selector, root = document) => root.querySelector(selector);

export function csrfToken() {
  const cookie = document.cookie.split("; ").find((c) => c.startsWith("csrftoken="));
  return cookie ? decodeURIComponent(cookie.split("=")[1]) : "";
}

export async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.detail || `HTTP ${response.status}`);
  return data;
}

export function toast(message) {
  const box = $("#toast");
  if (!box) return;
  box.textContent = message;
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

// Mirrors Run.status_label: the end cause once ended, otherwise the state.
export const statusLabel = (run) => (run.state === "ended" ? run.end_cause : run.state);

export function setField(row, name, text) {
  const node = row.querySelector(`[data-field="${name}"]`);
  if (node && node.textContent !== text) node.textContent = text;
}

// Show exactly the control buttons of the actions the server allows (the run's `actions`).
export function showActions(row, actions) {
  for (const button of row.querySelectorAll("button[data-action]")) {
    button.hidden = !actions.includes(button.dataset.action);
  }
}

// Apply a committed snapshot of a run to its row; never step back to an older version.
export function patchRow(row, run) {
  if (row.dataset.runId === run.id && Number(row.dataset.version) >= run.version) return false;
  Object.assign(row.dataset, {
    runId: run.id, state: run.state, endCause: run.end_cause || "", version: String(run.version),
    agent: run.agent, thread: run.thread_id, ticket: run.ticket ? run.ticket.id : "",
    ticketReason: run.ticket ? run.ticket.reason : "", actions: run.actions.join(" "),
  });
  showActions(row, run.actions);
  setField(row, "short-id", run.id.slice(0, 8));
  setField(row, "agent", run.agent);
  setField(row, "thread", run.thread_id);
  setField(row, "status", statusLabel(run));
  setField(row, "reason", run.stop_reason || "");
  setField(row, "generation", String(run.generation));
  const link = row.querySelector('[data-field="link"]');
  if (link) link.href = `/runs/${run.id}/`;
  const created = row.querySelector('[data-field="created"]');
  if (created && !created.getAttribute("datetime")) {
    created.setAttribute("datetime", run.created_at);
    created.textContent = "just now";
  }
  return true;
}

// --- the websocket, with backoff and "resume after seq" --------------------------------------

export class Live {
  constructor(path, onMessage) {
    this.path = path;
    this.onMessage = onMessage;
    this.lastSeq = 0;
    this.delay = 500;
    this.indicator = $("#live");
    this.connect();
  }

  show(status, text) {
    if (!this.indicator) return;
    this.indicator.dataset.status = status;
    this.indicator.textContent = text;
  }

  // The list socket carries every event, so seq has no holes but for rolled-back numbers:
  // a hole still open a second later is asked for again (replays are dropped if known).
  healLater(socket, after) {
    if (this.healing) return;
    this.healing = setTimeout(() => {
      this.healing = null;
      if (socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({ type: "resume", after }));
      }
    }, 1000);
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}${this.path}`);
    this.show("connecting", "connecting…");
    socket.onopen = () => {
      this.delay = 500;
      this.show("live", "live");
      if (this.lastSeq) socket.send(JSON.stringify({ type: "resume", after: this.lastSeq }));
    };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "run.changed" && message.seq > this.lastSeq + 1 && this.lastSeq) {
        this.healLater(socket, this.lastSeq);  // a push went missing (or is still on its way)
      }
      if (typeof message.seq === "number" && message.seq > this.lastSeq) this.lastSeq = message.seq;
      this.onMessage(message);
    };
    socket.onclose = () => {
      this.show("offline", `offline, retrying in ${Math.round(this.delay / 1000)} s`);
      setTimeout(() => this.connect(), this.delay);
      this.delay = Math.min(this.delay * 2, 15000);
    };
  }
}


// --- times for people: relative and live, the absolute local time (with its zone) on hover --

const UNITS = [["year", 31536000], ["month", 2592000], ["week", 604800], ["day", 86400],
  ["hour", 3600], ["minute", 60], ["second", 1]];
const relative = new Intl.RelativeTimeFormat(undefined, { numeric: "auto", style: "short" });
const absolute = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
  second: "2-digit", timeZoneName: "short",
});

// "12 seconds ago", "3 minutes ago", "in 2 hours" (a queued run's start_after).
export function relativeTime(iso, now = Date.now()) {
  const when = Date.parse(iso);
  if (Number.isNaN(when)) return "";
  const seconds = Math.round((when - now) / 1000);
  if (Math.abs(seconds) < 5) return "just now";
  for (const [unit, size] of UNITS) {
    if (Math.abs(seconds) >= size || unit === "second") {
      return relative.format(Math.trunc(seconds / size), unit);
    }
  }
  return "";
}

// "30 Nov 2026, 19:58:24 GMT+1": the viewer's own zone, named.
export function absoluteTime(iso) {
  const when = Date.parse(iso);
  return Number.isNaN(when) ? "" : absolute.format(new Date(when));
}

// Keep every <time datetime> under `root` current: relative text, absolute title. Returns a
// function that redraws at once (call it after adding rows).
export function liveTimes(root = document, every = 5000) {
  const draw = () => {
    const now = Date.now();
    for (const node of root.querySelectorAll("time[datetime]")) {
      const iso = node.getAttribute("datetime");
      if (!iso) continue;
      const text = relativeTime(iso, now);
      if (node.textContent !== text) node.textContent = text;
      const title = absoluteTime(iso);
      if (node.title !== title) node.title = title;
    }
  };
  draw();
  setInterval(draw, every);
  return draw;
}

// A running time for people, as the server's `span` filter writes it: "0.4 s", "3 m 05 s".
export function span(seconds) {
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  const whole = Math.floor(seconds);
  if (whole < 60) return `${whole} s`;
  const pad = (n) => String(n).padStart(2, "0");
  if (whole < 3600) return `${Math.floor(whole / 60)} m ${pad(whole % 60)} s`;
  return `${Math.floor(whole / 3600)} h ${pad(Math.floor((whole % 3600) / 60))} m`;
}
