// The operator page and a run's page: live rows from the websocket, controls over the REST API.
// Rows are rendered by the server (templates/runs/_run_row.html); this module only patches
// their fields, data attributes and shown buttons, and clones the same partial for runs that
// appear.

const $ = (selector, root = document) => root.querySelector(selector);

function csrfToken() {
  const cookie = document.cookie.split("; ").find((c) => c.startsWith("csrftoken="));
  return cookie ? decodeURIComponent(cookie.split("=")[1]) : "";
}

async function api(method, path, body) {
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

function toast(message) {
  const box = $("#toast");
  if (!box) return;
  box.textContent = message;
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

// Mirrors Run.status_label: the end cause once ended, otherwise the state.
const statusLabel = (run) => (run.state === "ended" ? run.end_cause : run.state);

function setField(row, name, text) {
  const node = row.querySelector(`[data-field="${name}"]`);
  if (node && node.textContent !== text) node.textContent = text;
}

// Show exactly the control buttons of the actions the server allows (the run's `actions`).
function showActions(row, actions) {
  for (const button of row.querySelectorAll("button[data-action]")) {
    button.hidden = !actions.includes(button.dataset.action);
  }
}

// Apply a committed snapshot of a run to its row; never step back to an older version.
function patchRow(row, run) {
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

class Live {
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

// --- the run list ------------------------------------------------------------------------------

function listPage(table) {
  const body = $("#run-rows");
  const template = $("#run-row");
  const rows = new Map();
  for (const row of body.querySelectorAll("tr.run")) rows.set(row.dataset.runId, row);
  const filters = { status: table.dataset.status, agent: table.dataset.byAgent, q: table.dataset.q };

  const matches = (run) =>
    (!filters.status || filters.status === run.state || filters.status === run.end_cause) &&
    (!filters.agent || filters.agent === run.agent) &&
    (!filters.q || filters.q === run.id || filters.q === run.thread_id);

  function apply(run) {
    const row = rows.get(run.id);
    if (row) return patchRow(row, run);
    const first = body.querySelector("tr.run");
    const newest = !first || !first.querySelector("time").getAttribute("datetime") ||
      run.created_at >= first.querySelector("time").getAttribute("datetime");
    if (!matches(run) || !newest) return false;  // older runs are one "Load more" away
    const fresh = template.content.firstElementChild.cloneNode(true);
    patchRow(fresh, run);
    body.prepend(fresh);
    rows.set(run.id, fresh);
    $(".empty")?.remove();
    return true;
  }

  new Live("/ws/runs/", (message) => {
    if (message.type === "snapshot") message.runs.slice().reverse().forEach(apply);
    else if (message.type === "run.changed") apply(message.run);
  });

  body.addEventListener("click", async (event) => {
    const more = event.target.closest('[data-action="more"]');
    if (!more) return;
    const marker = more.closest("tr.more");
    const query = new URLSearchParams({
      status: filters.status, by_agent: filters.agent, q: filters.q, cursor: marker.dataset.cursor,
    });
    const response = await fetch(`/runs/rows/?${query}`, { credentials: "same-origin" });
    const holder = document.createElement("tbody");
    holder.innerHTML = await response.text();
    for (const row of holder.querySelectorAll("tr.run")) {
      if (!rows.has(row.dataset.runId)) rows.set(row.dataset.runId, row);
      else row.remove();
    }
    marker.replaceWith(...holder.children);
  });

  $("#new-run")?.addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const error = form.querySelector('[data-field="form-error"]');
    error.textContent = "";
    let input;
    try {
      input = form.input.value.trim() ? JSON.parse(form.input.value) : {};
    } catch (problem) {
      error.textContent = `Input is not valid JSON: ${problem.message}`;
      return;
    }
    const budget = {};
    for (const name of ["max_steps", "max_seconds", "max_tokens"]) {
      if (form[name].value) budget[name] = Number(form[name].value);
    }
    try {
      apply(await api("POST", "/api/runs/", { agent: form.agent.value, input, budget }));
    } catch (problem) {
      error.textContent = problem.message;
    }
  });
  return apply;
}

// --- a run's page ------------------------------------------------------------------------------

function runPage(panel) {
  const runId = panel.dataset.runId;
  let pending = null;
  const refresh = () => {
    clearTimeout(pending);
    pending = setTimeout(async () => {
      const response = await fetch(`/runs/${runId}/panel/`, { credentials: "same-origin" });
      if (response.ok) panel.innerHTML = await response.text();
    }, 50);
  };
  const inTree = (run) => {
    const ids = ($(".panel", panel)?.dataset.treeIds || runId).split(",");
    return ids.includes(run.id) || (run.parent_id && ids.includes(run.parent_id));
  };
  new Live("/ws/runs/", (message) => {
    if (message.type === "run.changed" && inTree(message.run)) refresh();
    if (message.type === "snapshot") refresh();
  });
  return (run) => {
    const row = panel.querySelector(`tr.run[data-run-id="${run.id}"]`);
    if (row) patchRow(row, run);
    refresh();
  };
}

// --- a run's live output -------------------------------------------------------------------------

// Text streamed by a model call comes on the run's own socket as `run.output` messages: not
// committed state (no seq, nothing stored), so it is shown apart and dropped when a step
// commits (its event holds the final message) or the run ends; after the end, none is shown.
function liveOutput(box) {
  const text = box.querySelector('[data-field="live-output"]');
  let ended = box.dataset.state === "ended";
  let generation = 0;
  let call = 0;
  let base = 0;  // where the text held starts in the call's text (> 0: joined mid-stream)
  let held = "";
  const clear = () => {
    base = 0;
    held = "";
    text.textContent = "";
    box.hidden = true;
  };

  // Put `delta` at `offset` of the call's text; a hole (a lost push, a late join) starts
  // the text held over from there.
  function place(offset, delta) {
    if (offset < base || offset - base > held.length) {
      base = offset;
      held = "";
    }
    held = held.slice(0, offset - base) + delta;
    text.textContent = (base > 0 ? "… " : "") + held;
    box.hidden = false;
  }

  function follow(run, event) {
    generation = Math.max(generation, run.generation);
    if (run.state === "ended") ended = true;
    if (ended || run.state !== "running" || (event && event.kind === "step")) clear();
  }

  function connect(delay) {
    if (ended) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/runs/${box.dataset.runId}/`);
    socket.onopen = () => { delay = 500; };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "snapshot" && message.runs.length) follow(message.runs[0], null);
      else if (message.type === "run.changed") follow(message.run, message.event);
      else if (message.type === "run.output" && !ended && message.generation >= generation) {
        generation = message.generation;
        if (message.call !== call) {
          call = message.call;
          clear();
        }
        place(message.offset, message.delta);
      }
      if (ended) socket.close();
    };
    socket.onclose = () => {
      if (!ended) setTimeout(() => connect(Math.min(delay * 2, 15000)), delay);
    };
  }

  connect(500);
}

// --- controls ----------------------------------------------------------------------------------

function controls(apply) {
  const stopDialog = $("#stop-dialog");
  const resumeDialog = $("#resume-dialog");
  let target = null;

  async function act(path, body) {
    try {
      apply(await api("POST", path, body));
    } catch (problem) {
      toast(problem.message);
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("tr.run [data-action]");
    if (!button) return;
    const row = button.closest("tr.run");
    const id = row.dataset.runId;
    target = row;
    switch (button.dataset.action) {
      case "cancel": act(`/api/runs/${id}/cancel/?wait=2`, {}); break;
      case "pause": act(`/api/runs/${id}/pause/?wait=5`); break;
      case "stop":
        if (!stopDialog) return;
        setField(stopDialog, "stop-run", id.slice(0, 8));
        stopDialog.querySelector('[name="reason"]').value = "";
        stopDialog.showModal();
        break;
      case "resume":
        if (!resumeDialog) return;
        setField(resumeDialog, "resume-run", id.slice(0, 8));
        resumeDialog.querySelector('[name="resume_input"]').value =
          row.dataset.ticketReason === "approval" ? '{"approved": true}' : "";
        resumeDialog.showModal();
        break;
    }
  });

  stopDialog?.addEventListener("close", () => {
    const reason = stopDialog.querySelector('[name="reason"]').value.trim();
    if (stopDialog.returnValue === "confirm" && target && reason) {
      act(`/api/runs/${target.dataset.runId}/stop/?wait=2`, { reason });
    }
  });

  resumeDialog?.addEventListener("close", () => {
    if (resumeDialog.returnValue !== "confirm" || !target) return;
    const raw = resumeDialog.querySelector('[name="resume_input"]').value.trim();
    let input = null;
    try {
      input = raw ? JSON.parse(raw) : null;
    } catch (problem) {
      toast(`Input is not valid JSON: ${problem.message}`);
      return;
    }
    act(`/api/runs/${target.dataset.runId}/resume/`, { ticket: target.dataset.ticket, input });
  });
}

const table = $("table.runs:not(.single)");
const panel = $("#panel");
const apply = table ? listPage(table) : panel ? runPage(panel) : null;
if (apply) controls(apply);
const output = $("#live-output");
if (output) liveOutput(output);
