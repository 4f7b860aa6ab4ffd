// hpctrain web console: the jobs table kept live, sorting and searching, the log followed, confirmations.
// Text from the server is only ever set as textContent, never as HTML.
"use strict";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

// ---- sorting and searching any table.sortable -------------------------------------------------------------
const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
const sortState = new Map(); // table key -> {column, descending}

function sortRows(table) {
  const state = sortState.get(table.dataset.key || "");
  if (!state) return;
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = a.cells[state.column] ? a.cells[state.column].textContent : "";
    const y = b.cells[state.column] ? b.cells[state.column].textContent : "";
    return state.descending ? collator.compare(y, x) : collator.compare(x, y);
  });
  rows.forEach((row) => body.appendChild(row));
  Array.from(table.tHead.rows[0].cells).forEach((th, i) => {
    th.dataset.sort = i === state.column ? (state.descending ? "desc" : "asc") : "";
  });
}

function makeSortable(table, key) {
  table.dataset.key = key;
  Array.from(table.tHead.rows[0].cells).forEach((th, column) => {
    th.addEventListener("click", () => {
      const old = sortState.get(key);
      const descending = old && old.column === column ? !old.descending : false;
      sortState.set(key, { column, descending });
      sortRows(table);
    });
  });
  sortRows(table);
}

function applySearch() {
  const box = document.getElementById("search");
  const words = box ? box.value.toLowerCase().split(/\s+/).filter(Boolean) : [];
  document.querySelectorAll("table.sortable tbody tr").forEach((row) => {
    const text = row.textContent.toLowerCase();
    row.hidden = !words.every((w) => text.includes(w));
  });
}

// ---- the jobs page ------------------------------------------------------------------------------------------
function jobTable(scheduler, index, table) {
  const node = el("table", null, "sortable");
  const head = node.createTHead().insertRow();
  table.columns.forEach((column) => head.appendChild(el("th", column)));
  const body = node.createTBody();
  table.rows.forEach((row) => {
    const tr = body.insertRow();
    row.forEach((cell, i) => {
      const td = tr.insertCell();
      if (i === 0) {
        const link = el("a", cell);
        link.href = "/job/" + encodeURIComponent(scheduler) + "/" + encodeURIComponent(cell);
        td.appendChild(link);
      } else {
        td.textContent = cell;
      }
    });
  });
  makeSortable(node, scheduler + "/" + index);
  return node;
}

let shownJobs = null; // the last answer drawn: an unchanged one leaves the page (and its focus, hover) alone

function showJobs(box, data) {
  const taken = document.getElementById("taken");
  if (taken) taken.textContent = "as of " + data.taken;
  const text = JSON.stringify(data.schedulers);
  if (text === shownJobs) return;
  shownJobs = text;
  const sections = data.schedulers.map((section) => {
    const node = el("section");
    node.appendChild(el("h2", section.name));
    if (section.error) node.appendChild(el("p", section.error, "error"));
    section.parts.forEach((part, index) => {
      if (part.table) {
        if (part.table.title) node.appendChild(el("h3", part.table.title));
        node.appendChild(jobTable(section.name, index, part.table));
      } else {
        node.appendChild(el("p", part.line, "line"));
      }
    });
    return node;
  });
  box.replaceChildren(...sections);
  applySearch();
}

function followJobs(box) {
  const every = Math.max(1, parseFloat(box.dataset.interval) || 5) * 1000;
  const load = () => {
    fetch("/api/jobs", { credentials: "same-origin", cache: "no-store" })
      .then((response) => {
        if (response.status === 401) throw new Error("logged out: open the URL with ?token= again");
        if (!response.ok) throw new Error("the console answered " + response.status);
        return response.json();
      })
      .then((data) => showJobs(box, data))
      .catch((err) => {
        const taken = document.getElementById("taken");
        if (taken) taken.textContent = String(err.message || err);
      })
      .finally(() => setTimeout(load, every));
  };
  load();
}

// ---- a job's log --------------------------------------------------------------------------------------------
const KEEP_LINES = 2000;

function followLog(pre) {
  const state = document.getElementById("log-state");
  const source = new EventSource(pre.dataset.src);
  const add = (text, cls) => {
    pre.appendChild(el("span", text + "\n", cls));
    while (pre.childNodes.length > KEEP_LINES) pre.removeChild(pre.firstChild);
  };
  source.addEventListener("log", (event) => {
    const data = JSON.parse(event.data);
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    if (data.skipped) add("… " + data.skipped + " earlier lines not shown", "note");
    (data.lines || []).forEach((text) => add(text));
    (data.notes || []).forEach((text) => add(text, "note"));
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  });
  source.addEventListener("end", () => {
    source.close();
    if (state) state.textContent = "(ended)";
  });
  source.onerror = () => {
    if (state) state.textContent = "(reconnecting…)";
  };
}

// ---- confirmations for forms that change something -----------------------------------------------------------
function confirmForms() {
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
}

document.addEventListener("DOMContentLoaded", () => {
  confirmForms();
  document.querySelectorAll("table.sortable").forEach((table, i) => makeSortable(table, "page/" + i));
  const search = document.getElementById("search");
  if (search) search.addEventListener("input", applySearch);
  const jobs = document.getElementById("jobs");
  if (jobs) followJobs(jobs);
  const log = document.getElementById("log");
  if (log) followLog(log);
});
