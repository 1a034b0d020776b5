// The workers page: Drain and Undrain over the REST API, then the server's page again.

import { toast } from "./common.js";
import { send } from "./controls.js";

document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-worker-action]");
  if (!button || button.disabled) return;
  const name = button.closest("tr.worker").dataset.worker;
  const action = button.dataset.workerAction;
  button.disabled = true;
  try {
    await send("POST", `/api/workers/${encodeURIComponent(name)}/${action}/`);
    location.reload();
  } catch (problem) {
    toast(problem.message);
    button.disabled = false;
  }
});
