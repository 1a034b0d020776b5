// A run's page: its panel kept current part by part from the server's renderings on each
// committed change of the run or its children, the controls, the activity log as it grows, the live (uncommitted) output
// of its model calls, and times shown in the reader's own zone.

import { $, absoluteTime, keepFocus, Live, relativeTime, shortId, showDurations, span, toast } from "./common.js";
import { controls, send } from "./controls.js";

// --- times ----------------------------------------------------------------------------------

const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
const clock = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });

// Every <time datetime> under `root`: the local clock (or "3 min ago" for data-relative),
// the full local date, time and zone on hover.
function localTimes(root = document) {
  for (const node of root.querySelectorAll("time[datetime]")) {
    const value = node.getAttribute("datetime");
    if (!value) continue;
    const date = new Date(value);
    if (Number.isNaN(date.getTime())) continue;
    node.title = absoluteTime(value);
    node.textContent = "relative" in node.dataset ? relativeTime(value) : clock.format(date);
  }
  const note = $('[data-field="zone"]');
  if (note) {
    const offset = -new Date().getTimezoneOffset();
    const sign = offset >= 0 ? "+" : "−";
    const hours = String(Math.floor(Math.abs(offset) / 60)).padStart(2, "0");
    const minutes = String(Math.abs(offset) % 60).padStart(2, "0");
    note.textContent = `Times are in your zone, ${zone} (UTC${sign}${hours}:${minutes}); hover one for the full date.`;
  }
}

// Tickers: time in the current state, running time (committed seconds + the live attempt).
function tick() {
  const now = Date.now();
  for (const node of document.querySelectorAll("[data-ticker]")) {
    const since = Date.parse(node.dataset.since);
    if (Number.isNaN(since)) continue;
    const seconds = Number(node.dataset.base || 0) + Math.max(0, (now - since) / 1000);
    const text = span(seconds);
    if (node.textContent !== text) node.textContent = text;
  }
  for (const node of document.querySelectorAll("time[data-relative][datetime]")) {
    const text = relativeTime(node.getAttribute("datetime"), now);
    if (node.textContent !== text) node.textContent = text;
  }
}

// --- the panel ------------------------------------------------------------------------------

// The panel is made of parts (`data-part`), each rendered by the server, and follows the
// pushes part by part: a change of the run fetches its summary, ask, trace, requests and attempts
// parts and the timeline's events after the newest one shown (its input and output too when
// its state changed); a change of a child fetches that child's row (the whole tree when
// the child is new); the socket's snapshot (a first connection, a reconnection) fetches
// the whole panel. What is asked within 50 ms, or while a fetch is out, goes as one request.
const RUN_PARTS = ["summary", "ask", "trace", "requests", "attempts"];

function runPage(panel) {
  const runId = panel.dataset.runId;
  const part = (name) => panel.querySelector(`[data-part="${name}"]`);
  const shown = () => part("summary")?.dataset || {};
  const treeIds = () => (part("tree")?.dataset.treeIds || runId).split(",");
  const newestSeq = () => Number(panel.querySelector('[data-part="timeline"] li[data-seq]')?.dataset.seq || 0);
  let wanted = null;
  let timer = null;
  let fetching = false;

  // What is wanted gathers until the next fetch: 50 ms after the first want, or once the
  // fetch out has ended; so there is one request at a time, however fast the pushes come.
  const want = (change) => {
    wanted ??= { whole: false, parts: new Set(), newEvents: false, rows: new Set() };
    change(wanted);
    if (timer === null && !fetching) timer = setTimeout(next, 50);
  };
  async function next() {
    timer = null;
    if (fetching || !wanted) return;
    const asked = wanted;
    wanted = null;
    fetching = true;
    try {
      await fetchParts(asked);
    } catch {
      // Offline: once the socket is back, its snapshot fetches the whole panel.
    } finally {
      fetching = false;
      if (wanted && timer === null) timer = setTimeout(next, 50);
    }
  }

  async function fetchParts(asked) {
    let url = `/runs/${runId}/panel/`;
    if (!asked.whole) {
      const query = new URLSearchParams();
      const parts = [...asked.parts];
      if (asked.newEvents && !asked.parts.has("timeline")) {
        parts.push("timeline");
        query.set("after", newestSeq());
      }
      if (parts.length) query.set("parts", parts.join(","));
      if (asked.rows.size) query.set("rows", [...asked.rows].join(","));
      url += `?${query}`;
    }
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) return;
    const holder = document.createElement("div");
    holder.innerHTML = await response.text();
    for (const fresh of holder.querySelectorAll("[data-part]")) {
      if (fresh.parentElement.closest("[data-part]")) continue;  // inside a part that is placed
      place(fresh);
    }
    localTimes(panel);
    showDurations(panel);
    tick();
  }

  function place(fresh) {
    const name = fresh.dataset.part;
    if (name === "timeline-new") {
      const list = part("timeline")?.querySelector("ol.timeline");
      if (!list) return;
      const seq = newestSeq();
      list.prepend(...[...fresh.children].filter((item) => !item.dataset.seq || Number(item.dataset.seq) > seq));
      const events = list.querySelectorAll("li[data-seq]");  // the newest the server shows, no more
      for (let i = Number(fresh.dataset.eventsAtMost); i < events.length; i++) events[i].remove();
      return;
    }
    if (name === "rows") {
      for (const row of [...fresh.children]) {
        const old = part("tree")?.querySelector(`li[data-run-id="${row.dataset.runId}"]`);
        if (old) old.replaceWith(row);
        else want((w) => w.parts.add("tree"));
      }
      return;
    }
    const old = part(name);
    if (!old) return;
    const open = [...old.querySelectorAll("details[open] > summary")].map((s) => s.textContent);
    const link = old.querySelector('[data-field="new-link"]:not([hidden])');
    keepFocus(old, fresh, () => old.replaceWith(fresh));
    for (const summary of fresh.querySelectorAll("details > summary")) {
      if (open.includes(summary.textContent)) summary.parentElement.open = true;
    }
    if (link) fresh.querySelector('[data-field="new-link"]')?.replaceWith(link);
  }

  // The run as committed, pushed or answered: what it changed is fetched. A push of a
  // version shown already asks nothing; an answer always asks (a request may be pending).
  const changed = (run, answered = false) => {
    if (!answered && run.version <= Number(shown().version || 0)) return;
    want((w) => {
      for (const name of RUN_PARTS) w.parts.add(name);
      w.newEvents = true;
      if (!run?.state || run.state !== shown().state) w.parts.add("io");
    });
  };
  new Live("/ws/runs/", (message) => {
    if (message.type === "snapshot") want((w) => { w.whole = true; });
    if (message.type !== "run.changed") return;
    const run = message.run;
    if (run.id === runId) changed(run);
    else if (treeIds().includes(run.id)) want((w) => w.rows.add(run.id));
    else if (run.parent_id && treeIds().includes(run.parent_id)) want((w) => w.parts.add("tree"));
  });
  // A control's answer, a live request taken (it shows in the timeline), a link made.
  const refresh = (names = [...RUN_PARTS, "timeline"]) => want((w) => {
    for (const name of names) w.parts.add(name);
  });
  return { apply: (run) => changed(run, true), refresh };
}

// The panel's own buttons (outside the row): run again, approve / reject, answer, links.
function panelActions(panel, page, control) {
  const runId = panel.dataset.runId;
  panel.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-run-action]");
    if (!button || button.disabled) return;
    const action = button.dataset.runAction;
    const row = panel.querySelector(`tr.run[data-run-id="${runId}"]`);
    const run = async (work) => {
      button.disabled = true;
      try {
        await work();
      } catch (problem) {
        toast(problem.message);
      } finally {
        if (button.isConnected) button.disabled = false;
      }
    };
    switch (action) {
      case "rerun":
        await run(async () => {
          const again = (await send("POST", `/api/runs/${runId}/rerun/`)).data;
          toast(`Started run ${shortId(again.id)}.`);
          location.assign(again.url);
        });
        break;
      case "edit":
        control.openResume(row, "edit");
        break;
      case "approve":
      case "reject": {
        const bound = panel.querySelector('.ask [data-field="action"]');
        if (bound && action === "reject") {  // asks for a reason, then a confirmation
          control.openResume(row, "reject");
          break;
        }
        // A reject refuses what the run waits for: confirmed first, like a cancel.
        if (action === "reject" && !confirm(`Reject the request of run ${shortId(runId)}?`)) break;
        await run(async () => {
          page.apply((await send("POST", `/api/runs/${runId}/resume/`, {
            ticket: row.dataset.ticket, input: bound
              ? { approved: true, digest: bound.dataset.digest }
              : { approved: action === "approve" } })).data);
          toast(action === "approve" ? "Approved: the run goes on." : "Rejected.");
        });
        break;
      }
      case "answer":
        control.openResume(row);
        break;
      case "resume-now":
        await run(async () => {
          page.apply((await send("POST", `/api/runs/${runId}/resume/`, {
            ticket: row.dataset.ticket })).data);
          toast("Resumed: the run goes on from its last committed step.");
        });
        break;
      case "raise-budget": {
        const field = panel.querySelector("[data-raise]");
        if (!field.reportValidity()) break;
        const budget = { [field.dataset.raise]: Number(field.value) };
        await run(async () => {
          page.apply((await send("POST", `/api/runs/${runId}/resume/`, {
            ticket: row.dataset.ticket, input: { budget } })).data);
          toast("Budget raised: the run goes on from its last committed step.");
        });
        break;
      }
      case "make-link":
        await run(async () => {
          const link = (await send("POST", `/api/runs/${runId}/review-links/`, {})).data;
          page.refresh(["ask"]);
          const box = panel.querySelector('[data-field="new-link"]');
          box.querySelector('[data-field="new-link-url"]').value = link.url;
          box.hidden = false;
          box.querySelector("input").select();
        });
        break;
      case "copy-link":
        await copy(panel.querySelector('[data-field="new-link-url"]').value, "Link copied.");
        break;
      case "revoke-link": {
        const id = button.closest("[data-link-id]").dataset.linkId;
        await run(async () => {
          await send("POST", `/api/runs/${runId}/review-links/${id}/revoke/`);
          toast("Link revoked: it can no longer be opened.");
          page.refresh(["ask"]);
        });
        break;
      }
    }
  });
}

async function copy(text, done) {
  try {
    await navigator.clipboard.writeText(text);
    toast(done);
  } catch {
    toast("Copying is not allowed here: select the text and copy it.");
  }
}

// --- steering: a message to the live attempt's inbox, with its receipt ----------------------

function steering(form) {
  const runId = form.dataset.runId;
  const receipt = form.querySelector('[data-field="steer-receipt"]');
  form.addEventListener("input", () => { receipt.textContent = ""; });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = form.message.value.trim();
    if (!text) return;
    let message;
    try {
      message = JSON.parse(text);
    } catch {
      message = text;  // plain words go as a JSON string
    }
    const button = form.querySelector('[data-action="send-message"]');
    button.disabled = true;
    try {
      const answer = (await send("POST", `/api/runs/${runId}/deliver/`, { command: "message", message })).data;
      receipt.dataset.outcome = "delivered";
      receipt.textContent = `Delivered to attempt ${answer.generation} at ${clock.format(new Date())}.`;
      form.message.value = "";
    } catch (problem) {
      receipt.dataset.outcome = "refused";
      if (problem.data?.code === "not_active") {
        const run = await send("GET", `/api/runs/${runId}/`).then((a) => a.data).catch(() => null);
        const state = run ? (run.state === "ended" ? `ended (${run.end_cause})` : run.state) : "not running";
        receipt.textContent = `Not delivered: the run is ${state}, and a message goes only to a running attempt.`;
      } else {
        receipt.textContent = `Not delivered: ${problem.message}`;
      }
    } finally {
      button.disabled = false;
    }
  });
}

// --- the activity log -----------------------------------------------------------------------

// Entries come as `run.activity` pushes on the run's socket; the page then asks the server
// for the entries after the last one it shows, rendered by the same partial as at load.
function activityLog(section) {
  const list = section.querySelector(".activity-log");
  let fetching = false;
  let again = false;
  const lastSeq = () => Number(list.lastElementChild?.dataset.seq || 0);
  async function more() {
    if (fetching) {
      again = true;
      return;
    }
    fetching = true;
    try {
      const response = await fetch(`/runs/${section.dataset.runId}/activity/?after=${lastSeq()}`,
                                   { credentials: "same-origin" });
      if (!response.ok) return;
      const holder = document.createElement("ol");
      holder.innerHTML = await response.text();
      const counted = holder.querySelector('template[data-field="activity-count"]');
      counted?.remove();
      const fresh = [...holder.children].filter((item) => Number(item.dataset.seq) > lastSeq());
      if (fresh.length) {
        list.querySelector(".empty")?.remove();
        const follow = list.scrollTop + list.clientHeight >= list.scrollHeight - 8;
        list.append(...fresh);
        localTimes(list);
        showDurations(list);
        if (follow) list.scrollTop = list.scrollHeight;
        const count = section.querySelector('[data-field="activity-count"]');
        if (count && counted && !count.querySelector("a")) {
          count.textContent = counted.content.textContent;
        }
      }
    } finally {
      fetching = false;
      if (again) {
        again = false;
        more();
      }
    }
  }
  list.scrollTop = list.scrollHeight;
  return more;
}

// --- the run's own socket: live output and activity ----------------------------------------

// Text streamed by a model call comes on the run's own socket as `run.output` messages: not
// committed state (no seq, nothing stored), so it is shown apart and dropped when a step
// commits (its event holds the final message) or the run ends; after the end, none is shown.
function runSocket(box, { onActivity, onControl }) {
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
    socket.onopen = () => {
      delay = 500;
      onActivity();  // what was written while the page was away
    };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "snapshot" && message.runs.length) follow(message.runs[0], null);
      else if (message.type === "run.changed") follow(message.run, message.event);
      else if (message.type === "run.activity") {
        onActivity();
        if (message.entries.some((entry) => entry.kind === "control")) onControl();
      } else if (message.type === "run.output" && !ended && message.generation >= generation) {
        generation = message.generation;
        if (message.call !== call) {
          call = message.call;
          clear();
        }
        place(message.offset, message.delta);
      }
      if (ended) {
        socket.close();
        setTimeout(onActivity, 1000);  // the last entries, written with the end
      }
    };
    socket.onclose = () => {
      if (!ended) setTimeout(() => connect(Math.min(delay * 2, 15000)), delay);
    };
  }

  connect(500);
}

// --- wiring ---------------------------------------------------------------------------------

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (button) copy(button.dataset.copy, "Run id copied.");
});

localTimes();
showDurations();
tick();
setInterval(tick, 1000);

const panel = $("#panel");
const section = $("#activity[data-run-id]");
const more = section ? activityLog(section) : () => {};
if (panel) {
  const page = runPage(panel);
  const control = controls(page.apply);
  panelActions(panel, page, control);
  const output = $("#live-output");
  if (output) runSocket(output, { onActivity: more, onControl: page.refresh });
}
const steer = $("#steer");
if (steer) steering(steer);
