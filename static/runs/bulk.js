// Bulk jobs: pick runs on the list (or "all matching this filter"), preview how many the job
// takes, start it, follow its progress pushed on the list socket, abort it. The job runs on
// the server (POST /api/bulk/); the page only asks and shows.

import { $, Live, absoluteTime, api, liveTimes, setField, shortId, toast } from "./common.js";

const VERBS = { cancel: "Cancel", stop: "Stop" };
const FINISHED = new Set(["done", "aborted"]);

export function jobSummary(job) {
  const split = `${job.applied} applied, ${job.unchanged} already ended, ${job.refused} refused`;
  return `${job.done} of ${job.total} handled (${split})`;
}

// The progress of one job, in `box`: counts, a bar, Abort while it can be.
function progressView(box) {
  let shown = null;
  box.addEventListener("click", async (event) => {
    if (!event.target.closest("[data-bulk='abort']") || !shown) return;
    event.target.disabled = true;
    try {
      draw(await api("POST", `/api/bulk/${shown.id}/abort/`, {}));
    } catch (problem) {
      toast(problem.message);
      event.target.disabled = false;
    }
  });

  function draw(job) {
    if (shown && shown.id === job.id && shown.version > job.version) return;
    shown = job;
    box.hidden = false;
    box.replaceChildren();
    const title = document.createElement("strong");
    title.textContent = `${VERBS[job.action]} job ${shortId(job.id)}: ${job.state}`;
    const bar = document.createElement("progress");
    bar.max = Math.max(job.total, 1);
    bar.value = job.done;
    bar.setAttribute("aria-label", "Bulk job progress");
    const counts = document.createElement("span");
    counts.dataset.field = "bulk-counts";
    counts.textContent = jobSummary(job);
    const buttons = document.createElement("span");
    buttons.className = "buttons";
    if (!FINISHED.has(job.state)) {
      const abort = document.createElement("button");
      abort.type = "button";
      abort.dataset.bulk = "abort";
      abort.textContent = "Abort job";
      buttons.append(abort);
    }
    const all = document.createElement("a");
    all.href = "/bulk/";
    all.className = "button";
    all.textContent = "All bulk jobs";
    buttons.append(all);
    box.append(title, bar, counts, buttons);
    box.dataset.state = job.state;
  }

  document.addEventListener("bulk:changed", (event) => {
    if (shown && event.detail.id === shown.id) draw(event.detail);
  });
  return draw;
}

export function bulkSelection(table) {
  const bar = $("#bulk-bar");
  const dialog = $("#bulk-dialog");
  if (!bar || !dialog) return;
  const body = $("#run-rows");
  const allMatching = bar.querySelector("[data-bulk='all-matching']");
  const pageBox = table.querySelector("[data-select-page]");
  const filter = JSON.parse($("#list-filter")?.textContent || "{}");
  const showProgress = progressView($("#bulk-progress"));
  let action = null;
  let selection = null;

  const picked = () => [...body.querySelectorAll("tr.run [data-select]:checked")]
    .map((box) => box.closest("tr.run").dataset.runId);

  function refresh() {
    const ids = picked();
    for (const row of body.querySelectorAll("tr.run")) {
      row.classList.toggle("selected", Boolean(row.querySelector("[data-select]")?.checked));
    }
    bar.hidden = !ids.length && !allMatching.checked;
    setField(bar, "bulk-count", allMatching.checked ? "Every matching run that has not ended"
      : `${ids.length} selected`);
    const boxes = body.querySelectorAll("tr.run [data-select]");
    if (pageBox) {
      pageBox.checked = boxes.length > 0 && ids.length === boxes.length;
      pageBox.indeterminate = ids.length > 0 && ids.length < boxes.length;
    }
  }

  table.addEventListener("change", (event) => {
    if (event.target.matches("[data-select-page]")) {
      for (const box of body.querySelectorAll("tr.run:not([hidden]) [data-select]")) {
        box.checked = event.target.checked;
      }
    }
    refresh();
  });
  allMatching.addEventListener("change", refresh);
  document.addEventListener("runs:rows", refresh);
  document.addEventListener("runs:toggle-select", refresh);

  bar.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-bulk]");
    if (!button) return;
    if (button.dataset.bulk === "clear") {
      allMatching.checked = false;
      for (const box of body.querySelectorAll("[data-select]:checked")) box.checked = false;
      refresh();
      return;
    }
    action = button.dataset.bulk;
    selection = allMatching.checked ? { filter } : { ids: picked() };
    setField(dialog, "bulk-verb", VERBS[action]);
    setField(dialog, "bulk-scope", selection.filter
      ? (Object.keys(filter).length ? "Every run that matches the list's filter and has not ended."
        : "Every run that has not ended.")
      : `The ${selection.ids.length} run${selection.ids.length === 1 ? "" : "s"} you selected.`);
    dialog.querySelector('[data-field="bulk-reason-label"]').hidden = action !== "stop";
    dialog.querySelector('[name="bulk_reason"]').value = "";
    const confirm = dialog.querySelector("[data-bulk='confirm']");
    confirm.disabled = true;
    confirm.textContent = `${VERBS[action]} runs`;
    setField(dialog, "bulk-preview", "Counting…");
    dialog.showModal();
    try {
      const preview = await api("POST", "/api/bulk/preview/", selection);
      const ended = preview.total - preview.live;
      setField(dialog, "bulk-preview", preview.live
        ? `${preview.live} run${preview.live === 1 ? "" : "s"} will be ${action === "stop" ? "stopped" : "cancelled"}` +
          (ended ? `; ${ended} already ended and will be left as they are.` : ".")
        : "None of these runs is still going: there is nothing to do.");
      confirm.disabled = preview.live === 0;
    } catch (problem) {
      setField(dialog, "bulk-preview", problem.message);
    }
  });

  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "confirm" || !action) return;
    const reason = dialog.querySelector('[name="bulk_reason"]').value.trim();
    if (action === "stop" && !reason) {
      toast("A stop needs a reason: the job was not started.");
      return;
    }
    try {
      const job = await api("POST", "/api/bulk/", { action, ...(reason ? { reason } : {}), ...selection });
      showProgress(job);
      allMatching.checked = false;
      for (const box of body.querySelectorAll("[data-select]:checked")) box.checked = false;
      refresh();
    } catch (problem) {
      toast(problem.message);
    }
  });
  refresh();
}

// The bulk jobs page: its rows kept live from the list socket; Abort on the ones still going.
function jobsPage(list) {
  const template = $("#bulk-row");
  const rows = new Map([...list.querySelectorAll("tr.job")].map((row) => [row.dataset.jobId, row]));
  const redraw = liveTimes(list);

  function patch(row, job) {
    if (Number(row.dataset.version || 0) > job.version) return;
    row.dataset.jobId = job.id;
    row.dataset.state = job.state;
    row.dataset.version = String(job.version);
    setField(row, "job-id", shortId(job.id));
    setField(row, "action", job.action);
    setField(row, "job-state", job.state);
    setField(row, "scope", job.filter ? "a filter" : `${job.total} chosen runs`);
    setField(row, "by", `${job.requested_by} (${job.source})`);
    setField(row, "counts", jobSummary(job));
    setField(row, "reason", job.reason || "");
    const bar = row.querySelector("progress");
    bar.max = Math.max(job.total, 1);
    bar.value = job.done;
    const created = row.querySelector('[data-field="created"]');
    created.setAttribute("datetime", job.created_at);
    created.title = absoluteTime(job.created_at);
    const abort = row.querySelector("[data-bulk='abort']");
    if (abort) abort.hidden = FINISHED.has(job.state);
    redraw();
  }

  function apply(job) {
    let row = rows.get(job.id);
    if (!row) {
      row = template.content.firstElementChild.cloneNode(true);
      list.querySelector("tbody").prepend(row);
      rows.set(job.id, row);
      $("#no-jobs")?.remove();
    }
    patch(row, job);
  }

  new Live("/ws/runs/", (message) => {
    if (message.type === "bulk.changed") apply(message.job);
  });

  list.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-bulk='abort']");
    if (!button) return;
    button.disabled = true;
    try {
      apply(await api("POST", `/api/bulk/${button.closest("tr.job").dataset.jobId}/abort/`, {}));
    } catch (problem) {
      toast(problem.message);
    } finally {
      button.disabled = false;
    }
  });
}

const jobs = $("table.jobs");
if (jobs) jobsPage(jobs);
