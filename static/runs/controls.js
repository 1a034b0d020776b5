// The control buttons of a run's row (list and run page), the Stop and Resume dialogs, and
// what each request shows while it goes: a button is disabled while its request is in
// flight, a cancel is sent at once after a native confirm(), and a request not applied yet
// is the row's `data-pending` (the server's). Which buttons a run shows is the server's
// rendering of the row (its `actions`); nothing here decides it.

import { $, csrfToken, reach, rules, setField, shortId, toast } from "./common.js";

// A request to the REST API: {status, data}; an error answer throws with its detail.
export async function send(method, path, body) {
  const response = await reach(path, {
    method,
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json",
               "X-CSRFToken": csrfToken() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const problem = new Error(data.detail || `HTTP ${response.status}`);
    problem.status = response.status;
    problem.data = data;
    throw problem;
  }
  return { status: response.status, data };
}

// Disable `button` while `work` runs (and mark it busy for assistive technology).
export async function busy(button, work) {
  if (button) {
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
  }
  try {
    return await work();
  } finally {
    if (button && button.isConnected) {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  }
}

// What a run's end means to someone who asked for another one: "had already completed".
const HAD = { completed: "completed", failed: "failed", cancelled: "been cancelled",
  stopped: "been stopped" };
const ENDS = { cancel: "cancelled", stop: "stopped" };

// The sentence for a run found ended by a request `action` (cancel, stop, pause), or null
// when the request itself ended it.
export function alreadyEnded(run, action) {
  if (!run || run.state !== "ended" || run.end_cause === ENDS[action]) return null;
  const verb = { cancel: "cancelled", stop: "stopped", pause: "paused" }[action];
  return `Run ${shortId(run.id)} had already ${HAD[run.end_cause] || "ended"}; nothing was ${verb}.`;
}

export function controls(apply) {
  const stopDialog = $("#stop-dialog");
  const resumeDialog = $("#resume-dialog");
  const inFlight = new Set();  // "runId action" of requests not answered yet
  let target = null;  // the id of the run the open dialog is about

  const rowOf = (id) => document.querySelector(`tr.run[data-run-id="${id}"]`);

  // Put each control button in the state its run's requests give it. Labels never change
  // (the actions column keeps its width): a request in flight disables its button and
  // marks it busy; a pending request (data-pending, the server's) disables its own button.
  function reflect() {
    for (const button of document.querySelectorAll("tr.run button[data-action]")) {
      const row = button.closest("tr.run");
      const action = button.dataset.action;
      const flying = inFlight.has(`${row.dataset.runId} ${action}`);
      const disabled = flying || row.dataset.pending === action || offline();
      if (button.disabled !== disabled) button.disabled = disabled;
      if (flying) button.setAttribute("aria-busy", "true");
      else if (button.hasAttribute("aria-busy")) button.removeAttribute("aria-busy");
    }
    watchDialogs();
  }
  const offline = () => document.documentElement.dataset.connection === "offline";

  // Rows change under us (pushes patch them, the run page re-renders its panel).
  new MutationObserver(reflect).observe(document.body, {
    subtree: true, childList: true, attributeFilter: ["data-state", "data-pending"] });
  document.addEventListener("connection", reflect);

  // A run that ends by itself (or is resumed elsewhere) while its dialog is open: the
  // dialog says so and offers nothing to confirm.
  function watchDialogs() {
    const row = target && rowOf(target);
    if (!row) return;
    if (stopDialog?.open && row.dataset.state === "ended") {
      const run = { id: target, state: "ended", end_cause: row.dataset.endCause };
      settled(stopDialog, alreadyEnded(run, "stop") || `Run ${shortId(target)} is stopped.`);
    }
    if (resumeDialog?.open && row.dataset.state !== "awaiting") {
      settled(resumeDialog, row.dataset.state === "ended"
        ? `Run ${shortId(target)} ended (${row.dataset.endCause}) while this was open; there is nothing to resume.`
        : `Run ${shortId(target)} is ${row.dataset.state} now: it was resumed elsewhere.`);
    }
  }

  // A dialog whose run moved on: the message, no confirming button, Back becomes Close.
  function settled(dialog, message) {
    setField(dialog, "dialog-error", message);
    for (const button of dialog.querySelectorAll('button[type="submit"]')) button.hidden = true;
    const back = dialog.querySelector('button[value="cancel"]');
    if (back && back.textContent !== "Close") {
      back.textContent = "Close";
      back.focus();
    }
  }

  function unsettle(dialog) {
    const back = dialog.querySelector('button[value="cancel"]');
    if (back) back.textContent = "Back";
    dialog.querySelector('button[value="confirm"]').hidden = false;
  }

  async function act(id, action, path, body) {
    const key = `${id} ${action}`;
    if (inFlight.has(key)) return null;
    inFlight.add(key);
    reflect();
    try {
      const answer = await send("POST", path, body);
      apply(answer.data);
      // A request taken but not applied changes no version: the row is asked for again.
      if (answer.status === 202) document.dispatchEvent(new CustomEvent("runs:row", { detail: id }));
      return answer;
    } catch (problem) {
      if (problem.data && problem.data.run) apply(problem.data.run);
      toast(problem.message);
      return null;
    } finally {
      inFlight.delete(key);
      reflect();
    }
  }

  // Cancel: sent at once (the durable intent is written first), after a native confirm().
  async function cancel(id) {
    if (!confirm(`Cancel run ${shortId(id)}? It ends now, marked cancelled; this cannot be undone.`)) return;
    const answer = await act(id, "cancel", `/api/runs/${id}/cancel/?wait=2`, {});
    if (!answer) return;
    toast(alreadyEnded(answer.data, "cancel") || (answer.status === 202
      ? `Cancel of run ${shortId(id)} recorded: the run ends as soon as its attempt stops.`
      : `Run ${shortId(id)} is cancelled.`));
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("tr.run [data-action]");
    if (!button || button.disabled) return;
    const row = button.closest("tr.run");
    const id = row.dataset.runId;
    switch (button.dataset.action) {
      case "cancel": cancel(id); break;
      case "pause": pause(id); break;
      case "stop": openStop(id); break;
      case "resume": openResume(row); break;
    }
  });

  async function pause(id) {
    const answer = await act(id, "pause", `/api/runs/${id}/pause/?wait=2`);
    if (!answer) return;
    if (answer.status === 202) {
      toast("Pause requested: it takes effect when the current step ends.");
    } else {
      toast(`Run ${shortId(id)} is paused.`);
    }
  }

  // --- Stop ---------------------------------------------------------------------------

  function openStop(id) {
    if (!stopDialog) return;
    target = id;
    unsettle(stopDialog);
    setField(stopDialog, "stop-run", shortId(id));
    setField(stopDialog, "dialog-error", "");
    stopDialog.querySelector('[name="reason"]').value = "";
    stopDialog.showModal();
  }

  stopDialog?.addEventListener("submit", async (event) => {
    const confirmed = event.submitter && event.submitter.value === "confirm";
    if (!confirmed || !target) return;
    event.preventDefault();  // the dialog stays open until the server answers
    const reason = stopDialog.querySelector('[name="reason"]').value.trim();
    if (!reason) {
      setField(stopDialog, "dialog-error", "Give a reason.");
      return;
    }
    const id = target;
    await busy(event.submitter, async () => {
      try {
        const answer = await send("POST", `/api/runs/${id}/stop/?wait=2`, { reason });
        apply(answer.data);
        if (answer.status === 202) document.dispatchEvent(new CustomEvent("runs:row", { detail: id }));
        const already = alreadyEnded(answer.data, "stop");
        if (already) return settled(stopDialog, already);
        stopDialog.close("done");
        toast(answer.status === 202
          ? `Stop of run ${shortId(id)} recorded: the run ends as soon as its attempt stops.`
          : `Run ${shortId(id)} is stopped.`);
      } catch (problem) {
        setField(stopDialog, "dialog-error", problem.message);
      }
    });
  });

  // --- Resume: the ticket's prompt, Approve / Reject, a form from its schema ---------------

  let ticket = null;
  let mode = "review";  // for a ticket bound to an action: "review", "edit" or "reject"

  // Approve / Edit / Reject of a ticket bound to one call: the buttons and fields a mode needs.
  function setMode(next) {
    mode = next;
    const box = resumeDialog.querySelector('[data-field="resume-action"]');
    const reject = resumeDialog.querySelector('[data-action="reject-resume"]');
    const edit = resumeDialog.querySelector('[data-action="edit-resume"]');
    const confirm = resumeDialog.querySelector('[data-action="confirm-resume"]');
    const focus = actionMode(box, mode);
    edit.hidden = mode !== "review";
    confirm.hidden = mode === "reject";
    confirm.textContent = mode === "edit" ? "Approve edited" : "Approve";
    reject.textContent = mode === "reject" ? "Confirm rejection" : "Reject…";
    setField(resumeDialog, "dialog-error", "");
    focus?.focus();
  }

  async function openResume(row, wanted = "review") {
    if (!resumeDialog) return;
    const id = row.dataset.runId;
    target = id;
    ticket = null;
    mode = "review";
    unsettle(resumeDialog);
    setField(resumeDialog, "resume-run", shortId(id));
    setField(resumeDialog, "dialog-error", "");
    setField(resumeDialog, "resume-why", "");
    const promptBox = resumeDialog.querySelector('[data-field="resume-prompt"]');
    const form = resumeDialog.querySelector('[data-field="schema-form"]');
    const raw = resumeDialog.querySelector('[data-field="raw-input"]');
    const reject = resumeDialog.querySelector('[data-action="reject-resume"]');
    const confirm = resumeDialog.querySelector('[data-action="confirm-resume"]');
    promptBox.hidden = true;
    form.hidden = true;
    raw.hidden = false;
    const actionBox = resumeDialog.querySelector('[data-field="resume-action"]');
    actionBox.hidden = true;
    actionBox.replaceChildren();
    resumeDialog.querySelector('[data-action="edit-resume"]').hidden = true;
    reject.hidden = true;
    reject.textContent = "Reject";
    confirm.hidden = false;
    confirm.textContent = "Resume";
    resumeDialog.querySelector('[name="resume_input"]').value = "";
    resumeDialog.showModal();
    try {  // the ticket as the server has it now: its prompt and schema
      ticket = (await send("GET", `/api/runs/${id}/`)).data.ticket;
    } catch (problem) {
      setField(resumeDialog, "dialog-error", problem.message);
      return;
    }
    if (!ticket) {
      setField(resumeDialog, "dialog-error", "The run has no open ticket any more.");
      return;
    }
    const why = (rules.resume_why || {})[ticket.reason] || "";
    setField(resumeDialog, "resume-why", why);
    if (ticket.action) {  // one call: shown readably, approved, edited or rejected
      actionView(actionBox, ticket.action);
      actionBox.hidden = false;
      raw.hidden = true;
      reject.hidden = false;
      setMode(wanted);
      return;
    }
    if (ticket.prompt !== null && ticket.prompt !== undefined) {
      promptBox.textContent = JSON.stringify(ticket.prompt, null, 2);
      promptBox.hidden = false;
    }
    if (ticket.reason === "approval") {
      raw.hidden = true;
      reject.hidden = false;
      confirm.textContent = "Approve";
    } else if (ticket.schema && schemaForm(form, ticket.schema)) {
      form.hidden = false;
      raw.hidden = true;
      form.querySelector("input, select, textarea")?.focus();
    }
  }

  resumeDialog?.addEventListener("submit", async (event) => {
    const choice = event.submitter ? event.submitter.value : "";
    if (!["confirm", "reject", "edit"].includes(choice) || !target) return;
    event.preventDefault();
    if (ticket && ticket.action && (choice === "edit" || (choice === "reject" && mode !== "reject"))) {
      setMode(choice);  // Reject asks for a reason first, then for a confirmation
      return;
    }
    // Any other reject refuses what the run waits for: confirmed first, like a cancel.
    if (choice === "reject" && !(ticket && ticket.action) &&
        !confirm(`Reject the request of run ${shortId(target)}?`)) return;
    let input;
    try {
      input = resumeInput(choice);
    } catch (problem) {
      setField(resumeDialog, "dialog-error", problem.message);
      return;
    }
    const id = target;
    const ticketId = ticket ? ticket.id : rowOf(id)?.dataset.ticket;
    await busy(event.submitter, async () => {
      try {
        apply((await send("POST", `/api/runs/${id}/resume/`, { ticket: ticketId, input })).data);
        resumeDialog.close("done");
        toast(choice === "reject" ? "Rejected: the run goes on with your answer."
          : ticket && ticket.action ? `Approved: ${ticket.action.tool} runs${mode === "edit" ? " with your edits" : ""}.`
            : `Run ${shortId(id)} resumed.`);
      } catch (problem) {
        setField(resumeDialog, "dialog-error", problem.message);
      }
    });
  });

  function resumeInput(choice) {
    if (ticket && ticket.action) {
      return actionDecision(resumeDialog.querySelector('[data-field="resume-action"]'),
                            ticket.action, mode, choice === "confirm");
    }
    if (ticket && ticket.reason === "approval") return { approved: choice === "confirm" };
    const form = resumeDialog.querySelector('[data-field="schema-form"]');
    if (!form.hidden) return formValue(form, ticket.schema);
    const raw = resumeDialog.querySelector('[name="resume_input"]').value.trim();
    try {
      return raw ? JSON.parse(raw) : null;
    } catch (problem) {
      throw new Error(`Input is not valid JSON: ${problem.message}`);
    }
  }

  reflect();
  return { openResume, send };
}

// --- a form for the JSON Schema an agent declares -------------------------------------------

// Fields for an object schema whose properties are strings, numbers, integers, booleans or
// enums; false (and the page falls back to JSON) for anything else, or for a schema the
// form cannot follow. The schema is the agent's, so nothing in it is trusted: a keyword of
// the wrong type or out of range is ignored, and a property's name is only ever a key of an
// object with no prototype ("__proto__" is a name like any other). The server checks the
// input against the schema on resume; the form only helps to write it.
const LONGEST = 1000000;  // characters a field's maxLength may ask for; more is ignored

function finite(value) {
  return typeof value === "number" && Number.isFinite(value);
}

function ownEntries(object) {
  return object && typeof object === "object" && !Array.isArray(object)
    ? Object.entries(object) : [];
}

export function schemaForm(box, schema) {
  try {
    return buildForm(box, schema);
  } catch {
    box.replaceChildren();
    return false;
  }
}

function buildForm(box, schema) {
  const properties = schema && schema.type === "object" && ownEntries(schema.properties);
  if (!properties || !properties.length) return false;
  const simple = ["string", "number", "integer", "boolean"];
  const typed = (p) => p && typeof p === "object" && (simple.includes(p.type) || Array.isArray(p.enum));
  if (!properties.every(([, p]) => typed(p))) return false;
  const required = new Set(Array.isArray(schema.required) ? schema.required.map(String) : []);
  box.replaceChildren(Object.assign(document.createElement("legend"), { textContent: "Input" }));
  for (const [name, property] of properties) {
    const label = document.createElement("label");
    const title = typeof property.title === "string" && property.title ? property.title : name;
    label.append(`${title}${required.has(name) ? " *" : ""} `);
    const longest = Number.isInteger(property.maxLength) && property.maxLength > 0
      && property.maxLength <= LONGEST ? property.maxLength : null;
    let field;
    if (Array.isArray(property.enum)) {
      field = document.createElement("select");
      // Nothing chosen until someone chooses: a required one is refused empty.
      field.append(new Option(required.has(name) ? "choose…" : "", ""));
      for (const value of property.enum) field.append(new Option(String(value), JSON.stringify(value)));
    } else if (property.type === "boolean") {
      field = Object.assign(document.createElement("input"), { type: "checkbox" });
      label.classList.add("check");
    } else if (property.type === "string" && (longest || 0) > 200) {
      field = Object.assign(document.createElement("textarea"), { rows: 3 });
      field.maxLength = longest;
    } else {
      field = document.createElement("input");
      field.type = property.type === "string" ? "text" : "number";
      if (property.type === "integer") field.step = "1";
      if (property.type === "number") field.step = "any";
      if (finite(property.minimum)) field.min = String(property.minimum);
      if (finite(property.maximum)) field.max = String(property.maximum);
      if (longest && property.type === "string") field.maxLength = longest;
    }
    field.name = `schema:${name}`;
    if (required.has(name) && property.type !== "boolean") field.required = true;
    if (property.default !== undefined) {
      if (field.type === "checkbox") field.checked = Boolean(property.default);
      else field.value = property.enum ? JSON.stringify(property.default) : String(property.default);
    }
    label.append(field);
    if (typeof property.description === "string" && property.description) {
      label.append(Object.assign(document.createElement("small"), {
        className: "muted", textContent: property.description }));
    }
    box.append(label);
  }
  return true;
}

// The answer the form holds, built on an object with no prototype: every property of the
// schema is an own key of it, "__proto__" included.
export function formValue(box, schema) {
  const value = Object.create(null);
  for (const [name, property] of ownEntries(schema.properties)) {
    const field = [...box.querySelectorAll("[name]")].find((node) => node.name === `schema:${name}`);
    if (!field) continue;
    if (field.type === "checkbox") value[name] = field.checked;
    else if (field.value === "") continue;
    else if (Array.isArray(property.enum)) value[name] = JSON.parse(field.value);
    else if (property.type === "number" || property.type === "integer") value[name] = Number(field.value);
    else value[name] = field.value;
  }
  return value;
}

// --- one tool call asked for approval (a ticket's `action`) ---------------------------------

// One argument as people read it: text as it is, anything else as compact JSON.
const argumentText = (value) => (typeof value === "string" ? value : JSON.stringify(value));

// The call into `box`: its tool, its arguments by name, the agent's rationale (the same
// reading as the server's templates/runs/_action.html), and the editor of `actionEditor`.
export function actionView(box, action) {
  const view = Object.assign(document.createElement("div"), { className: "action" });
  view.dataset.field = "action";
  view.dataset.tool = action.tool;
  view.dataset.digest = action.digest;
  const tool = Object.assign(document.createElement("p"), { className: "action-tool" });
  tool.append("Call ", Object.assign(document.createElement("code"), { textContent: action.tool }),
              " with:");
  view.append(tool);
  const names = Object.keys(action.arguments || {});
  if (names.length) {
    const list = Object.assign(document.createElement("dl"), { className: "arguments" });
    for (const name of names) {
      const value = action.arguments[name];
      const row = document.createElement("div");
      const dd = Object.assign(document.createElement("dd"), { textContent: argumentText(value) });
      if (typeof value !== "string") dd.className = "json";
      row.append(Object.assign(document.createElement("dt"), { textContent: name }), dd);
      list.append(row);
    }
    view.append(list);
  } else {
    view.append(Object.assign(document.createElement("p"), {
      className: "muted", textContent: "no arguments" }));
  }
  if (action.rationale) {
    const why = Object.assign(document.createElement("p"), { className: "rationale" });
    why.append(Object.assign(document.createElement("span"), {
      className: "muted", textContent: "Why, as the agent says:" }), ` ${action.rationale}`);
    view.append(why);
  }
  box.replaceChildren(view);
  actionEditor(box, action);
}

// Below the call: a field per argument to edit it (hidden until Edit) and the reason of
// a rejection (hidden until Reject).
export function actionEditor(box, action) {
  const edit = Object.assign(document.createElement("fieldset"), { className: "action-edit",
                                                                    hidden: true });
  edit.dataset.field = "action-edit";
  edit.append(Object.assign(document.createElement("legend"), {
    textContent: "The arguments to run (text as it is; other values as JSON)" }));
  for (const [name, value] of Object.entries(action.arguments || {})) {
    const label = document.createElement("label");
    const text = argumentText(value);
    const field = Object.assign(document.createElement("textarea"), {
      name: `argument:${name}`, value: text,
      rows: Math.min(6, Math.max(1, Math.ceil(text.length / 60), text.split("\n").length)) });
    field.spellcheck = false;
    field.dataset.json = typeof value === "string" ? "0" : "1";
    if (field.dataset.json === "1") field.className = "json";
    label.append(name, field);
    edit.append(label);
  }
  const reason = Object.assign(document.createElement("label"), { className: "action-reason",
                                                                   hidden: true });
  reason.dataset.field = "action-reason";
  reason.append("Why you reject it (the agent is told)",
                Object.assign(document.createElement("textarea"), {
                  name: "reject_reason", rows: 2, maxLength: 500 }));
  box.append(edit, reason);
}

// Show the part of `box` that `mode` needs: "review" (the call), "edit" (its arguments to
// edit) or "reject" (a reason). Returns the field to focus.
export function actionMode(box, mode) {
  const edit = box.querySelector('[data-field="action-edit"]');
  const reason = box.querySelector('[data-field="action-reason"]');
  edit.hidden = mode !== "edit";
  reason.hidden = mode !== "reject";
  return mode === "edit" ? edit.querySelector("textarea") : mode === "reject"
    ? reason.querySelector("textarea") : null;
}

// The resume input of a decision on `action` made in `box`: approve (with the edited
// arguments in edit mode) or reject (with the reason given). Throws what is wrong.
export function actionDecision(box, action, mode, approved) {
  if (!approved) {
    const reason = box.querySelector('[name="reject_reason"]').value.trim();
    if (!reason) throw new Error("Give a reason: the agent is told why.");
    return { approved: false, reason, digest: action.digest };
  }
  if (mode !== "edit") return { approved: true, digest: action.digest };
  const edited = {};
  for (const field of box.querySelectorAll('[data-field="action-edit"] textarea')) {
    const name = field.name.slice("argument:".length);
    if (field.dataset.json === "1") {
      try {
        edited[name] = JSON.parse(field.value);
      } catch (problem) {
        throw new Error(`${name} is not valid JSON: ${problem.message}`);
      }
    } else edited[name] = field.value;
  }
  return { approved: true, arguments: edited, digest: action.digest };
}
