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

