// The page of a review link: a reviewer without an account answers one run's question.
// The answer goes to the same link as JSON (runs.api.review); the server checks it.

import { $ } from "./common.js";
import { actionDecision, actionEditor, actionMode, formValue, schemaForm } from "./controls.js";

const absolute = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
for (const node of document.querySelectorAll("time[datetime]")) {
  const date = new Date(node.getAttribute("datetime"));
  if (!Number.isNaN(date.getTime())) node.textContent = absolute.format(date);
}

const form = $("#review-form");
if (form) {
  let schema = null;
  try {
    schema = JSON.parse($("#review-schema")?.textContent || "null");
  } catch {
    schema = null;  // the raw-JSON answer is there for any schema
  }
  const fields = form.querySelector('[data-field="schema-form"]');
  const raw = form.querySelector('[data-field="raw-input"]');
  const structured = fields && schema && schemaForm(fields, schema);
  if (structured) {
    fields.querySelector("legend").textContent = "Your answer";
    fields.hidden = false;
    raw.hidden = true;
  }
  const error = form.querySelector('[data-field="form-error"]');
  // A ticket bound to one call: Approve as shown, Edit its arguments, or Reject with a
  // reason (asked first, then confirmed).
  const action = JSON.parse($("#review-action")?.textContent || "null");
  const actionBox = $('[data-field="review-action"]');
  let mode = "review";
  const approve = form.querySelector('button[value="approve"]');
  const edit = form.querySelector('button[value="edit"]');
  const reject = form.querySelector('button[value="reject"]');
  const setMode = (next) => {
    mode = next;
    actionMode(actionBox, mode)?.focus();
    edit.hidden = mode !== "review";
    approve.hidden = mode === "reject";
    approve.textContent = mode === "edit" ? "Approve edited" : "Approve";
    reject.textContent = mode === "reject" ? "Confirm rejection" : "Reject…";
    back.hidden = mode === "review";
    error.textContent = "";
  };
  const back = form.querySelector('[data-review="back"]');
  back?.addEventListener("click", () => setMode("review"));
  if (action) actionEditor(actionBox, action);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    const body = { name: form.name.value.trim() };
    const choice = event.submitter ? event.submitter.value : "answer";
    if (action && (choice === "edit" || (choice === "reject" && mode !== "reject"))) {
      setMode(choice);
      return;
    }
    if (action) {
      if (!body.name) {
        error.textContent = "Give your name: it is recorded with your decision.";
        form.name.focus();
        return;
      }
      try {
        const decision = actionDecision(actionBox, action, mode, choice === "approve");
        body.decision = decision.approved ? "approve" : "reject";
        for (const key of ["arguments", "reason", "digest"]) {
          if (key in decision) body[key] = decision[key];
        }
      } catch (problem) {
        error.textContent = problem.message;
        return;
      }
    } else if (choice === "approve" || choice === "reject") body.decision = choice;
    else if (structured) body.input = formValue(fields, schema);
    else if (form.input && form.input.value.trim()) {
      try {
        body.input = JSON.parse(form.input.value);
      } catch (problem) {
        error.textContent = `Your answer is not valid JSON: ${problem.message}`;
        return;
      }
    } else body.input = null;
    const buttons = form.querySelectorAll("button");
    buttons.forEach((button) => { button.disabled = true; });
    try {
      const response = await fetch(location.pathname, {
        method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify(body) });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(data.detail || `HTTP ${response.status}`);
      $("#review").hidden = true;
      $("#review-done").hidden = false;
      $("#review-done h1").focus?.();
    } catch (problem) {
      error.textContent = problem.message;
    } finally {
      buttons.forEach((button) => { button.disabled = false; });
    }
  });
}
