// A run's page: its panel re-rendered by the server on each committed change of the run or
// its children, the controls, and the live (uncommitted) output of its model calls.

import { $, Live, patchRow } from "./common.js";
import { controls } from "./controls.js";

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


const panel = $("#panel");
if (panel) controls(runPage(panel));
const output = $("#live-output");
if (output) liveOutput(output);
