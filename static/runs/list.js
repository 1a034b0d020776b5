// The operator page: live rows from the websocket, controls over the REST API. Rows are
// rendered by the server (templates/runs/_run_row.html); this module only patches their
// fields, data attributes and shown buttons, and clones the same partial for runs that appear.

import { $, api, Live, patchRow } from "./common.js";
import { controls } from "./controls.js";

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


const table = $("table.runs:not(.single)");
if (table) controls(listPage(table));
