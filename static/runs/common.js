// What both pages share: requests to the REST API, toasts, the server's rules the page is
// given, the websocket with backoff and "resume after seq", and the one duration format.
// Rows and panels are the server's rendering (the pages fetch them); nothing here decides
// how a run is shown.

export const $ = (selector, root = document) => root.querySelector(selector);

// The server's rules a sentence of the script needs (runs/pages/page_rules.py), embedded in
// the page with json_script: the length of a short id, the resume dialog's texts.
export const rules = JSON.parse($("#page-rules")?.textContent || "{}");

// An id as the server shows it in a row or a sentence.
export const shortId = (id) => String(id).slice(0, rules.short_id || Infinity);

export function csrfToken() {
  const cookie = document.cookie.split("; ").find((c) => c.startsWith("csrftoken="));
  return cookie ? decodeURIComponent(cookie.split("=")[1]) : "";
}

// A request that never got an answer (server down, network lost), in human words.
export const UNREACHABLE = "The server could not be reached, so the request may not have " +
  "been received. Check the connection (the page reconnects by itself) and try again.";

// fetch(), with a failure to reach the server said in human words.
export async function reach(path, options) {
  try {
    return await fetch(path, options);
  } catch {
    throw new Error(UNREACHABLE);
  }
}

export async function api(method, path, body) {
  const response = await reach(path, {
    method,
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const problem = new Error(data.detail || `HTTP ${response.status}`);
    problem.status = response.status;  // the server answered: not a lost connection
    throw problem;
  }
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

export function setField(row, name, text) {
  const node = row.querySelector(`[data-field="${name}"]`);
  if (node && node.textContent !== text) node.textContent = text;
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
    if (this.indicator) {
      this.indicator.dataset.status = status;
      this.indicator.textContent = text;
    }
    // Once the socket was lost, the page says so until it is live again (not while the
    // first connection is still being made).
    const root = document.documentElement;
    const was = root.dataset.connection;
    const now = status === "live" ? "live" : status === "offline" || was === "offline" ? "offline" : status;
    if (now !== was) {
      root.dataset.connection = now;
      this.banner(now === "offline");
      document.dispatchEvent(new CustomEvent("connection", { detail: now }));
    }
    if (now === "offline") setField(this.banner(true), "retry", status === "offline" ? text : "reconnecting…");
  }

  // The page-level banner of a lost connection, with "Reconnect now".
  banner(shown) {
    let box = $("#offline-banner");
    if (!box && shown) {
      box = document.createElement("div");
      box.id = "offline-banner";
      box.className = "offline-banner";
      box.setAttribute("role", "alert");
      box.innerHTML = "<strong>Disconnected from the server:</strong> what you see may be " +
        "stale, and the controls wait until the page is live again. " +
        '<span class="muted" data-field="retry"></span> ' +
        '<button type="button" data-action="reconnect">Reconnect now</button>';
      box.querySelector("button").addEventListener("click", () => this.reconnect());
      ($("#main") || document.body).prepend(box);
    }
    if (box) box.hidden = !shown;
    return box;
  }

  reconnect() {
    clearTimeout(this.retry);
    if (this.socket && this.socket.readyState !== WebSocket.CLOSED) return;
    this.delay = 500;
    this.connect();
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
    this.socket = socket;
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
      this.retry = setTimeout(() => this.connect(), this.delay);
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

// A duration for people: "840 ms", "2.4 s", "12 s", "3 m 05 s", "2 h 04 m". The one format
// of every duration the pages show: the server renders none, it gives `data-seconds`.
export function span(seconds) {
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  const whole = Math.floor(seconds);
  if (whole < 60) return `${whole} s`;
  const pad = (n) => String(n).padStart(2, "0");
  if (whole < 3600) return `${Math.floor(whole / 60)} m ${pad(whole % 60)} s`;
  return `${Math.floor(whole / 3600)} h ${pad(Math.floor((whole % 3600) / 60))} m`;
}

// Write out every duration under `root` the server rendered as `data-duration data-seconds`.
export function showDurations(root = document) {
  for (const node of root.querySelectorAll("[data-duration][data-seconds]")) {
    const seconds = Number(node.dataset.seconds);
    const text = Number.isFinite(seconds) ? span(seconds) : "";
    if (node.textContent !== text) node.textContent = text;
  }
}

// After `old` is replaced by `fresh` (the server's new rendering of the same thing), the
// element that had the focus in `old` gives it to its counterpart in `fresh`, found by
// the same data-action or data-field (else `fallback` in `fresh`), so a redraw never
// takes the keyboard's place away.
export function keepFocus(old, fresh, swap, fallback = null) {
  const active = document.activeElement;
  const had = active && active !== document.body && old.contains(active) ? active : null;
  swap();
  if (!had) return;
  const key = had.dataset.action ? `[data-action="${had.dataset.action}"]`
    : had.dataset.field ? `[data-field="${had.dataset.field}"]` : fallback;
  const target = (key && fresh.querySelector(key)) || (fallback && fresh.querySelector(fallback));
  target?.focus({ preventScroll: true });
}
