// The control buttons of a run's row (list and run page) and the Stop and Resume dialogs.

import { $, api, setField, toast } from "./common.js";

export function controls(apply) {
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

