// The page of a review link: a reviewer without an account answers one run's question.
// The answer goes to the same link as JSON (runs.api.review); the server checks it.

import { $ } from "./common.js";
import { formValue, schemaForm } from "./controls.js";

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
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    const body = { name: form.name.value.trim() };
    const choice = event.submitter ? event.submitter.value : "answer";
    if (choice === "approve" || choice === "reject") body.decision = choice;
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
