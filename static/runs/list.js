// The operator page: live rows from the websocket, controls over the REST API. Rows are
// rendered by the server (templates/runs/_run_row.html) and only there: for every run a push
// names at a version newer than its row, this module asks the server (/runs/rows/?ids=...)
// for the row as it is now, which also says whether the run belongs in the list (the filter
// is applied there, never here), and puts it in place. The pushes themselves are not
// rendered here, so the socket's messages stay the API's JSON and the page no rule of its own.

import { $, Live, api, keepFocus, liveTimes, setField, shortId, showDurations, span } from "./common.js";
import { controls } from "./controls.js";
import { bulkSelection } from "./bulk.js";
import { shortcuts } from "./keys.js";

// Screen readers hear live changes, a few at a time.
function announcer() {
  const region = $("#announce");
  let pending = [];
  let timer = null;
  return (text) => {
    if (!region) return;
    pending.push(text);
    clearTimeout(timer);
    timer = setTimeout(() => {
      const shown = pending.slice(-3);
      const more = pending.length - shown.length;
      region.textContent = shown.join(". ") + (more > 0 ? `, and ${more} more changes.` : ".");
      pending = [];
    }, 800);
  };
}

// How long the step a pending pause waits on has run (the row's data-since, the server's).
function stepTimes(root) {
  for (const node of root.querySelectorAll("[data-ticker][data-since]")) {
    const text = span(Math.max(0, (Date.now() - Date.parse(node.dataset.since)) / 1000));
    if (node.textContent !== text) node.textContent = text;
  }
}

function listPage(table) {
  const body = $("#run-rows");
  const empty = $("#empty");
  const filtered = table.dataset.filtered === "1";
  const newestFirst = table.dataset.sort === "-created";
  const query = table.dataset.query;
  const announce = announcer();
  const rows = new Map();
  const known = (row) => rows.set(row.dataset.runId, row);
  const stamp = (row) => {
    const duration = row.querySelector('[data-field="duration"]');
    if (duration) duration.dataset.at = String(Date.now());
    showDurations(row);
    stepTimes(row);
  };
  // A row's creation time (ms), as the server wrote it.
  const createdOf = (row) =>
    Date.parse(row.querySelector('time[data-field="created"]')?.getAttribute("datetime")) || 0;
  for (const row of body.querySelectorAll("tr.run")) { known(row); stamp(row); }

  const redrawTimes = liveTimes(table);
  // A running run's time goes on between pushes.
  setInterval(() => {
    for (const node of body.querySelectorAll('tr.run[data-state="running"] [data-field="duration"]')) {
      const base = Number(node.dataset.seconds || 0);
      const since = (Date.now() - Number(node.dataset.at || Date.now())) / 1000;
      node.textContent = span(base + since);
    }
    stepTimes(body);
  }, 1000);

  const showEmpty = () => { if (empty) empty.hidden = body.querySelector("tr.run") !== null; };
  const descendants = (row) => {
    const depth = Number(row.dataset.depth || 0);
    const found = [];
    for (let next = row.nextElementSibling; next?.matches("tr.run"); next = next.nextElementSibling) {
      if (Number(next.dataset.depth || 0) <= depth) break;
      found.push(next);
    }
    return found;
  };

  function place(fresh) {
    const parent = fresh.dataset.parent ? rows.get(fresh.dataset.parent) : null;
    if (parent) {
      const depth = Math.min(Number(parent.dataset.depth || 0) + 1, 4);
      fresh.dataset.depth = String(depth);
      fresh.classList.add("child");
      const after = descendants(parent).at(-1) || parent;
      after.after(fresh);
      const twisty = parent.querySelector('[data-toggle="children"]');
      if (twisty) {
        twisty.hidden = false;
        setField(parent, "child-count", String(descendants(parent).filter(
          (row) => row.dataset.parent === parent.dataset.runId).length));
        if (twisty.getAttribute("aria-expanded") === "false") fresh.hidden = true;
      }
    } else {
      // Newest first: before the first top-level row it is newer than, else last.
      const when = createdOf(fresh);
      const next = [...body.querySelectorAll("tr.run:not(.child)")].find(
        (row) => row !== fresh && createdOf(row) < when);
      if (next) next.before(fresh);
      else if (body.querySelector("tr.more")) body.querySelector("tr.more").before(fresh);
      else body.append(fresh);
    }
  }

  // Which runs belong: asked of the server, one request at a time, for every run a push
  // named since the last answer (the last answer always follows the last push).
  const asking = new Set();
  let inFlight = null;
  const leaving = new Map();

  const forced = new Set();  // runs whose row is taken even at the same version
  function ask(id, force = false) {
    if (force) forced.add(id);
    asking.add(id);
    if (!inFlight) inFlight = Promise.resolve().then(flush);
  }

  async function flush() {
    try {
      while (asking.size) {
        const ids = [...asking].slice(0, 100);
        ids.forEach((id) => asking.delete(id));
        const found = await belonging(ids);
        for (const id of ids) settle(id, found.get(id));
      }
    } catch {
      // the socket's next push or resume asks again
    } finally {
      inFlight = null;
      if (asking.size) inFlight = Promise.resolve().then(flush);
    }
  }

  async function belonging(ids) {
    const params = new URLSearchParams(query);
    params.set("ids", ids.join(","));
    const response = await fetch(`/runs/rows/?${params}`, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const holder = document.createElement("tbody");
    holder.innerHTML = await response.text();
    return new Map([...holder.querySelectorAll("tr.run")].map((row) => [row.dataset.runId, row]));
  }

  function settle(id, fresh) {
    const row = rows.get(id);
    const force = forced.delete(id);
    if (!fresh) {
      if (row && filtered) leave(row);
      return;
    }
    if (row) {
      clearTimeout(leaving.get(id));
      leaving.delete(id);
      row.classList.remove("leaving");
      if (Number(fresh.dataset.version) > Number(row.dataset.version) ||
          (force && Number(fresh.dataset.version) === Number(row.dataset.version))) {
        // Newer than the row shown: take the server's row, keep what the user set on it.
        const before = statusOf(row);
        fresh.className = row.className;
        fresh.dataset.depth = row.dataset.depth;
        fresh.hidden = row.hidden;
        const picked = row.querySelector("[data-select]")?.checked;
        if (picked) fresh.querySelector("[data-select]").checked = true;
        const twisty = row.querySelector('[data-toggle="children"]');
        fresh.querySelector('[data-toggle="children"]')?.replaceWith(twisty.cloneNode(true));
        keepFocus(row, fresh, () => row.replaceWith(fresh), '[data-field="link"]');
        known(fresh);
        stamp(fresh);
        redrawTimes();
        const now = statusOf(fresh);
        if (now !== before) announce(`Run ${shortId(id)} is ${now}`);
      }
      return;
    }
    if (!newestFirst && !fresh.dataset.parent) {
      reorderNote();
      return;
    }
    stamp(fresh);
    place(fresh);
    known(fresh);
    redrawTimes();
    showEmpty();
    announce(`New run ${shortId(id)}, ${fresh.dataset.agent}, ${statusOf(fresh)}`);
    document.dispatchEvent(new CustomEvent("runs:rows"));
  }

  function leave(row) {
    const id = row.dataset.runId;
    if (leaving.has(id)) return;
    row.classList.add("leaving");
    announce(`Run ${shortId(id)} is ${statusOf(row)} and no longer matches the filter`);
    leaving.set(id, setTimeout(() => {
      leaving.delete(id);
      for (const child of descendants(row)) child.dataset.depth = String(Math.max(0, Number(child.dataset.depth) - 1));
      row.remove();
      rows.delete(id);
      showEmpty();
      document.dispatchEvent(new CustomEvent("runs:rows"));
    }, 2500));
  }

  let newInOrder = 0;
  function reorderNote() {
    newInOrder += 1;
    const note = $("#reorder-note");
    if (!note) return;
    note.hidden = false;
    note.querySelector("a").textContent =
      `${newInOrder} new matching run${newInOrder === 1 ? "" : "s"}: reload to place them in this order`;
  }

  // A row's status as the server wrote it.
  const statusOf = (row) => row.querySelector('[data-field="status"]')?.textContent || "";

  function apply(run) {
    const row = rows.get(run.id);
    if (row) {
      if (Number(row.dataset.version) >= run.version) return false;  // shown already
      ask(run.id);
      return true;
    }
    // Newest first, a run older than every row shown belongs to the pages "Load more" has
    // not brought yet: it is shown when they are. One in between takes its place in order.
    if (newestFirst && (!run.parent_id || !rows.has(run.parent_id)) && body.querySelector("tr.more")) {
      const oldest = [...body.querySelectorAll("tr.run:not(.child)")].at(-1);
      if (oldest && Date.parse(run.created_at) < createdOf(oldest)) return false;
    }
    ask(run.id);
    return true;
  }

  document.addEventListener("runs:row", (event) => {
    if (rows.has(event.detail)) ask(event.detail, true);
  });

  new Live("/ws/runs/", (message) => {
    if (message.type === "snapshot") message.runs.slice().reverse().forEach(apply);
    else if (message.type === "run.changed") apply(message.run);
    else if (message.type === "bulk.changed") {
      document.dispatchEvent(new CustomEvent("bulk:changed", { detail: message.job }));
    }
  });

  body.addEventListener("click", async (event) => {
    const toggle = event.target.closest('[data-toggle="children"]');
    if (toggle) {
      const row = toggle.closest("tr.run");
      const open = toggle.getAttribute("aria-expanded") !== "false";
      toggle.setAttribute("aria-expanded", open ? "false" : "true");
      for (const child of descendants(row)) {
        child.hidden = open;
        const inner = child.querySelector('[data-toggle="children"]');
        if (!open && inner) inner.setAttribute("aria-expanded", "true");
      }
      return;
    }
    const more = event.target.closest('[data-action="more"]');
    if (!more) return;
    const marker = more.closest("tr.more");
    const params = new URLSearchParams(query);
    params.set("cursor", marker.dataset.cursor);
    more.disabled = true;
    const response = await fetch(`/runs/rows/?${params}`, { credentials: "same-origin" });
    if (!response.ok) { more.disabled = false; return; }
    const holder = document.createElement("tbody");
    holder.innerHTML = await response.text();
    for (const row of holder.querySelectorAll("tr.run")) {
      if (!rows.has(row.dataset.runId)) { known(row); stamp(row); } else row.remove();
    }
    marker.replaceWith(...holder.children);
    redrawTimes();
    document.dispatchEvent(new CustomEvent("runs:rows"));
  });

  // Copy an id: the rows show a short one.
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-copy]");
    if (!button) return;
    try {
      await navigator.clipboard.writeText(button.dataset.copy);
      button.classList.add("done");
      setTimeout(() => button.classList.remove("done"), 1200);
      notice(`Copied the ${button.dataset.copyWhat || "id"} ${button.dataset.copy}`);
    } catch {
      notice(`Copy it by hand: ${button.dataset.copy}`);
    }
  });

  // A server's answer is about what was sent: it goes when the form is changed.
  $("#new-run")?.addEventListener("input", (event) => {
    setField(event.currentTarget, "form-error", "");
  });
  agentHelp();

  $("#new-run")?.addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const error = form.querySelector('[data-field="form-error"]');
    const submit = form.querySelector('[data-action="create"]');
    error.textContent = "";
    let input;
    try {
      input = form.input.value.trim() ? JSON.parse(form.input.value) : {};
    } catch (problem) {
      error.textContent = `Input is not valid JSON: ${problem.message}`;
      return;
    }
    const budget = {};
    for (const field of form.querySelectorAll("[data-budget]")) {  // the server's budgets
      if (field.value) budget[field.name] = Number(field.value);
    }
    const policy = form.querySelector("[data-budget-policy]");
    if (policy && policy.value !== "stop") budget.on_exhausted = policy.value;
    submit.disabled = true;
    try {
      const run = await api("POST", "/api/runs/", { agent: form.agent.value, input, budget });
      const found = await belonging([run.id]).catch(() => new Map([[run.id, null]]));
      if (found.has(run.id)) {
        if (!rows.has(run.id)) settle(run.id, found.get(run.id));
        if (!newestFirst) notice(`Run ${shortId(run.id)} started.`, run.url, "Open it");
      } else {
        notice(`Run ${shortId(run.id)} started, but the filter hides it.`, run.url, "Open it",
          "/", "Show all runs");
      }
    } catch (problem) {
      error.textContent = problem.message;
    } finally {
      submit.disabled = false;
    }
  });

  filterForm();
  return apply;
}

// The new-run form's help: the server renders each agent's description and example input;
// picking an agent shows its own, and puts its example in the input unless the input was
// written by hand (it is empty, or still the example of the agent picked before).
function agentHelp() {
  const form = $("#new-run");
  if (!form) return;
  const helpOf = (name) => form.querySelector(`[data-agent-help="${CSS.escape(name)}"]`);
  const exampleOf = (name) => helpOf(name)?.querySelector("[data-example]")?.textContent ?? null;
  let shown = form.agent.value;
  form.agent.addEventListener("change", () => {
    const before = exampleOf(shown);
    const typed = form.input.value.trim();
    for (const help of form.querySelectorAll("[data-agent-help]")) help.hidden = true;
    shown = form.agent.value;
    const help = helpOf(shown);
    if (help) help.hidden = false;
    const example = exampleOf(shown);
    if (example !== null && (typed === "" || typed === before)) form.input.value = example;
  });
  form.addEventListener("click", (event) => {
    if (!event.target.closest('[data-action="use-example"]')) return;
    const example = exampleOf(form.agent.value);
    if (example === null) return;
    form.input.value = example;
    form.input.dispatchEvent(new Event("input", { bubbles: true }));  // an old error goes
    form.input.focus();
  });
}

// A toast with links (the shared toast takes text only).
export function notice(text, ...links) {
  const box = $("#toast");
  if (!box) return;
  box.replaceChildren(text);
  for (let i = 0; i < links.length; i += 2) {
    const link = document.createElement("a");
    link.href = links[i];
    link.textContent = links[i + 1];
    box.append(" ", link);
  }
  box.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { box.hidden = true; }, links.length ? 10000 : 5000);
}

// The filter form: the time range in the viewer's zone, the states picked shown in its summary.
function filterForm() {
  const form = $("#filters");
  if (!form) return;
  // On a phone the list comes first: the boxes start closed (the filter's when none is set).
  if (matchMedia("(max-width: 760px)").matches) {
    if ($("table.runs").dataset.filtered !== "1") $("#filter-box").open = false;
    const create = $("#new-run-box");
    if (create) create.open = false;
  }
  form.addEventListener("submit", () => {
    const zone = form.querySelector('[data-field="tz"]');
    const hasRange = form.elements.from.value || form.elements.to.value;
    zone.value = hasRange ? String(-new Date().getTimezoneOffset()) : "";
    if (!zone.value) zone.disabled = true;
    for (const field of form.elements) {
      if ((field.tagName === "INPUT" || field.tagName === "SELECT") && field.type !== "checkbox" &&
          field.value === "") field.disabled = true;  // a short, readable URL
    }
  });
  // Back from the filtered page (the page cache keeps the fields as they were sent).
  window.addEventListener("pageshow", () => {
    for (const field of form.elements) field.disabled = false;
  });
  const picker = $("#state-picker");
  picker?.addEventListener("change", () => {
    const chosen = [...picker.querySelectorAll("input:checked")].map((box) => box.value);
    setField(picker, "states-chosen", chosen.length ? chosen.join(", ") : "any");
  });
}

const table = $("table.runs:not(.single)");
if (table) {
  const apply = listPage(table);
  controls(apply);
  bulkSelection(table);
  shortcuts(table);
}
