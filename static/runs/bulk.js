// Bulk jobs: pick runs on the list (or "all matching this filter"), preview how many the job
// takes, start it, follow its progress pushed on the list socket, abort it. The job runs on
// the server (POST /api/bulk/); the page only asks and shows.

import { $, Live, api, keepFocus, liveTimes, setField, toast } from "./common.js";

// A pushed job, as the server renders it (`view`: "row" for the jobs page, "progress" for the
// list's progress box); null if it is gone.
async function rendered(job, view) {
  const params = new URLSearchParams({ ids: job.id, view });
  const response = await fetch(`/bulk/rows/?${params}`, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  const holder = document.createElement("tbody");
  holder.innerHTML = await response.text();
  return holder.firstElementChild;
}

// Whether the element drawn for a job is at least as new as `job` (pushes can overtake).
const newer = (element, job) => element && element.dataset.jobId === job.id
  && Number(element.dataset.version) >= job.version;

// The progress of one job, in `box`: counts, a bar, Abort while it can be.
function progressView(box) {
  box.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-bulk='abort']");
    const shown = box.firstElementChild;
    if (!button || !shown) return;
    button.disabled = true;
    try {
      await draw(await api("POST", `/api/bulk/${shown.dataset.jobId}/abort/`, {}));
    } catch (problem) {
      toast(problem.message);
      button.disabled = false;
    }
  });

  let following = null;  // the job the box shows, or is about to show once fetched

  async function draw(job) {
    following = job.id;
    if (newer(box.firstElementChild, job)) return;
    const fresh = await rendered(job, "progress");
    if (!fresh || newer(box.firstElementChild, { ...job, version: Number(fresh.dataset.version) })) return;
    box.replaceChildren(fresh);
    box.hidden = false;
    box.dataset.state = fresh.dataset.state;
  }

  document.addEventListener("bulk:changed", (event) => {
    if (event.detail.id === following) draw(event.detail).catch(() => {});
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
    const verb = button.dataset.verb;
    selection = allMatching.checked ? { filter } : { ids: picked() };
    setField(dialog, "bulk-verb", verb);
    setField(dialog, "bulk-scope", selection.filter
      ? (Object.keys(filter).length ? "Every run that matches the list's filter and has not ended."
        : "Every run that has not ended.")
      : `The ${selection.ids.length} run${selection.ids.length === 1 ? "" : "s"} you selected.`);
    dialog.querySelector('[data-field="bulk-reason-label"]').hidden = action !== "stop";
    dialog.querySelector('[name="bulk_reason"]').value = "";
    const confirm = dialog.querySelector("[data-bulk='confirm']");
    confirm.disabled = true;
    confirm.textContent = `${verb} runs`;
    setField(dialog, "bulk-preview", "Counting…");
    setField(dialog, "bulk-error", "");
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

  // The dialog stays open until the job is started: a stop without a reason, or a refusal
  // by the server, is said in it.
  dialog.addEventListener("submit", async (event) => {
    if (!event.submitter || event.submitter.value !== "confirm" || !action) return;
    event.preventDefault();
    const reason = dialog.querySelector('[name="bulk_reason"]').value.trim();
    if (action === "stop" && !reason) {
      setField(dialog, "bulk-error", "Give a reason: a stop records why.");
      dialog.querySelector('[name="bulk_reason"]').focus();
      return;
    }
    const confirm = event.submitter;
    confirm.disabled = true;
    try {
      const job = await api("POST", "/api/bulk/", { action, ...(reason ? { reason } : {}), ...selection });
      dialog.close("done");
      await showProgress(job);
      allMatching.checked = false;
      for (const box of body.querySelectorAll("[data-select]:checked")) box.checked = false;
      refresh();
    } catch (problem) {
      setField(dialog, "bulk-error", problem.message);
    } finally {
      confirm.disabled = false;
    }
  });
  refresh();
}

// The bulk jobs page: its rows kept live from the list socket; Abort on the ones still going.
function jobsPage(list) {
  const body = list.querySelector("tbody");
  const redraw = liveTimes(list);
  const rowOf = (id) => [...body.querySelectorAll("tr.job")].find((row) => row.dataset.jobId === id);

  async function apply(job) {
    if (newer(rowOf(job.id), job)) return;
    const fresh = await rendered(job, "row");
    const row = rowOf(job.id);
    if (!fresh || (row && Number(row.dataset.version) >= Number(fresh.dataset.version))) return;
    if (row) keepFocus(row, fresh, () => row.replaceWith(fresh), "[data-bulk='abort']");
    else {
      body.prepend(fresh);
      $("#no-jobs")?.remove();
    }
    redraw();
  }

  new Live("/ws/runs/", (message) => {
    if (message.type === "bulk.changed") apply(message.job).catch(() => {});
  });

  list.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-bulk='abort']");
    if (!button) return;
    button.disabled = true;
    try {
      await apply(await api("POST", `/api/bulk/${button.closest("tr.job").dataset.jobId}/abort/`, {}));
    } catch (problem) {
      toast(problem.message);
    } finally {
      button.disabled = false;
    }
  });
}

// One job's page: its progress box and the page of its runs shown, both redrawn by the
// server (the same fragments as the other pages) when the job's progress is pushed.
function jobPage(section) {
  const id = section.dataset.jobId;
  const draw = progressView($("#bulk-progress"));
  const items = $("#bulk-items");
  const redraw = liveTimes(document.querySelector("main"));
  let fetching = false;
  let again = false;
  async function reload() {
    if (fetching) {
      again = true;
      return;
    }
    fetching = true;
    try {
      const params = new URLSearchParams({ items: "1", after: section.dataset.after || "0" });
      const response = await fetch(`/bulk/${id}/?${params}`, { credentials: "same-origin" });
      if (response.ok) {
        items.innerHTML = await response.text();
        redraw();
      }
    } finally {
      fetching = false;
      if (again) {
        again = false;
        reload().catch(() => {});
      }
    }
  }
  new Live("/ws/runs/", (message) => {
    if (message.type === "bulk.changed" && message.job.id === id) {
      draw(message.job).catch(() => {});
      reload().catch(() => {});
    } else if (message.type === "snapshot") {
      reload().catch(() => {});  // what changed while the page was away
    }
  });
}

const jobs = $("table.jobs");
if (jobs) jobsPage(jobs);
const job = $("#bulk-job");
if (job) jobPage(job);
