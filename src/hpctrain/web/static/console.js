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
const sortState = new Map(); // table key -> {column, descending}: kept when a table is drawn again

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

// ---- tables and lines from the server's JSON (hpctrain.web.safeview) ------------------------------------------
function partsTable(key, table, linkScheduler) {
  const node = el("table", null, "sortable");
  const head = node.createTHead().insertRow();
  table.columns.forEach((column) => head.appendChild(el("th", column)));
  const body = node.createTBody();
  table.rows.forEach((row) => {
    const tr = body.insertRow();
    row.forEach((cell, i) => {
      const td = tr.insertCell();
      if (i === 0 && linkScheduler) {
        const link = el("a", cell);
        link.href = "/job/" + encodeURIComponent(linkScheduler) + "/" + encodeURIComponent(cell);
        td.appendChild(link);
      } else {
        td.textContent = cell;
      }
    });
  });
  makeSortable(node, key);
  return node;
}

// The nodes for a View's parts: a table each (sortable; its first column linked to the job's page when
// `linkScheduler` is given), a line each.
function partsNodes(key, parts, linkScheduler) {
  const nodes = [];
  parts.forEach((part, index) => {
    if (part.table) {
      if (part.table.title) nodes.push(el("h3", part.table.title));
      nodes.push(partsTable(key + "/" + index, part.table, linkScheduler));
    } else {
      nodes.push(el("p", part.line, "line"));
    }
  });
  return nodes;
}

// Ask `url` every `seconds`; give each answer to `show` (an unchanged one is not drawn again: the page keeps its
// focus and hover); say what went wrong in `status`.
function poll(url, seconds, show, status) {
  let shown = null;
  const load = () => {
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then((response) => {
        if (response.status === 401) throw new Error("logged out: open the URL with ?token= again");
        return response.json().then((data) => {
          if (!response.ok) throw new Error(data.error || "the console answered " + response.status);
          return data;
        });
      })
      .then((data) => {
        const text = JSON.stringify(data.schedulers || data.parts);
        if (text !== shown) {
          shown = text;
          show(data);
        }
        if (status) status(data, null);
      })
      .catch((err) => status && status(null, String(err.message || err)))
      .finally(() => setTimeout(load, Math.max(1, seconds) * 1000));
  };
  load();
}

// ---- the jobs page ------------------------------------------------------------------------------------------
function followJobs(box) {
  const taken = document.getElementById("taken");
  const show = (data) => {
    const sections = data.schedulers.map((section) => {
      const node = el("section");
      node.appendChild(el("h2", section.name));
      if (section.error) node.appendChild(el("p", section.error, "error"));
      node.append(...partsNodes(section.name, section.parts, section.name));
      return node;
    });
    box.replaceChildren(...sections);
    applySearch();
  };
  const status = (data, error) => {
    if (taken) taken.textContent = error || "as of " + data.taken;
  };
  poll("/api/jobs", parseFloat(box.dataset.interval) || 5, show, status);
}

// ---- a job's page: its details kept current -----------------------------------------------------------------
function followDetails(box) {
  const show = (data) => box.replaceChildren(...partsNodes("details", data.parts, null));
  const status = (data, error) => {
    const said = document.getElementById("details-error");
    if (said) said.textContent = error || "";
  };
  poll(box.dataset.src, parseFloat(box.dataset.interval) || 5, show, status);
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

// ---- the job form: a job file chosen on this machine is read into the form's text box (sent as text) -----------
function loadJobFile(input) {
  input.addEventListener("change", () => {
    const file = input.files[0];
    if (!file) return;
    file.text().then((text) => {
      document.getElementById("job-file-text").value = text;
      document.getElementById("job-file-name").value = file.name;
    });
  });
}

document.addEventListener("DOMContentLoaded", () => {
  confirmForms();
  const upload = document.getElementById("job-file-upload");
  if (upload) loadJobFile(upload);
  document.querySelectorAll("table.sortable").forEach((table, i) => makeSortable(table, "page/" + i));
  // (a page's own tables; those drawn from JSON are made sortable as they are drawn)
  const search = document.getElementById("search");
  if (search) search.addEventListener("input", applySearch);
  const jobs = document.getElementById("jobs");
  if (jobs) followJobs(jobs);
  const details = document.getElementById("details");
  if (details) followDetails(details);
  const log = document.getElementById("log");
  if (log) followLog(log);
});
