// The list's keyboard shortcuts, as the page documents them (#shortcuts).

import { $ } from "./common.js";

const typing = (target) => target.closest("input, textarea, select, [contenteditable]") !== null;

export function shortcuts(table) {
  const help = $("#shortcuts");
  const helpButton = $("[data-toggle='shortcuts']");
  let current = null;
  let pendingG = false;

  const visible = () => [...table.querySelectorAll("#run-rows tr.run:not([hidden])")];

  function focusRow(row) {
    current?.classList.remove("focused");
    current = row;
    if (!row) return;
    row.classList.add("focused");
    row.querySelector('[data-field="link"]')?.focus({ preventScroll: true });
    row.scrollIntoView({ block: "nearest" });
  }

  function toggleHelp(show = help.hidden) {
    help.hidden = !show;
    helpButton?.setAttribute("aria-expanded", show ? "true" : "false");
    if (show) help.scrollIntoView({ block: "nearest" });
  }
  helpButton?.addEventListener("click", () => toggleHelp());

  // A row's link taking focus (by Tab too) makes it the current row.
  table.addEventListener("focusin", (event) => {
    const row = event.target.closest("tr.run");
    if (row && row !== current) {
      current?.classList.remove("focused");
      current = row;
      row.classList.add("focused");
    }
  });

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape" && typing(event.target)) {
      event.target.blur();
      return;
    }
    if (typing(event.target) || document.querySelector("dialog[open]")) return;
    const rows = visible();
    const at = current ? rows.indexOf(current) : -1;
    if (pendingG) {
      pendingG = false;
      if (event.key === "o") { location.href = "/overview/"; event.preventDefault(); }
      if (event.key === "b") { location.href = "/bulk/"; event.preventDefault(); }
      return;
    }
    switch (event.key) {
      case "/":
        event.preventDefault();
        $('#filters [name="q"]')?.focus();
        break;
      case "j":
        focusRow(rows[Math.min(at + 1, rows.length - 1)] || null);
        break;
      case "k":
        focusRow(rows[Math.max(at - 1, 0)] || null);
        break;
      case "o":
      case "Enter":
        if (current && event.key === "o") location.href = current.querySelector('[data-field="link"]').href;
        break;
      case "x": {
        const box = current?.querySelector("[data-select]");
        if (box) {
          box.checked = !box.checked;
          document.dispatchEvent(new CustomEvent("runs:toggle-select"));
        }
        break;
      }
      case "n": {
        const form = $("#new-run");
        if (form) {
          form.closest("details").open = true;
          event.preventDefault();
          form.querySelector('[name="input"]').focus();
        }
        break;
      }
      case "g":
        pendingG = true;
        break;
      case "?":
        toggleHelp();
        break;
      default:
    }
  });
}
