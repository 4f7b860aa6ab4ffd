// hpctrain web console: the jobs table kept live, sorting and searching, the log followed, confirmations.
// Text from the server is only ever set as textContent, never as HTML.
"use strict";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

// ---- tables drawn from the server's JSON, a page of rows at a time -------------------------------------------
// The rows stay data (arrays of strings from hpctrain.web.safeview); sorting and searching work on them, and only
// the rows of the page shown become DOM nodes: 100,000 jobs or 10,000 nodes draw PAGE_ROWS rows.
const PAGE_ROWS = 100;
const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
const sortState = new Map(); // table key -> {column, descending}: kept when a table is drawn again
const pageState = new Map(); // table key -> page number
const dataTables = []; // the tables the search box filters

function searchWords() {
  const box = document.getElementById("search");
  return box ? box.value.toLowerCase().split(/\s+/).filter(Boolean) : [];
}

function age(seconds) {
  if (!Number.isFinite(seconds)) return "";
  const s = Math.max(0, Math.round(Date.now() / 1000 - seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h " + (Math.floor(s / 60) % 60) + "m";
  return Math.floor(s / 86400) + "d " + (Math.floor(s / 3600) % 24) + "h";
}

// A table of `columns` and `rows` (arrays of cells). options.link(row): the href of the cell in options.linkColumn;
// options.ageColumn: that column holds seconds since the epoch, shown as an age and sorted by it.
function dataTable(key, columns, rows, options) {
  const opts = options || {};
  const wrap = el("div", null, "data-table");
  wrap.dataset.key = key;
  const table = el("table", null, "sortable");
  const head = table.createTHead().insertRow();
  const body = table.createTBody();
  const pager = el("div", null, "pager");
  const previous = el("button", "‹ previous");
  const next = el("button", "next ›");
  const where = el("span", null, "muted");
  previous.type = next.type = "button";
  pager.append(previous, where, next);
  const texts = rows.map((row) =>
    row.map((cell, i) => (i === opts.ageColumn ? age(cell) : cell === null ? "" : String(cell))),
  );
  const haystack = texts.map((row) => row.join(" ").toLowerCase());
  const draw = () => {
    const words = searchWords();
    let order = [];
    for (let i = 0; i < rows.length; i++) {
      if (words.every((w) => haystack[i].includes(w))) order.push(i);
    }
    const state = sortState.get(key);
    if (state) {
      const c = state.column;
      const byAge = c === opts.ageColumn;
      order.sort((a, b) => {
        const r = byAge
          ? (rows[b][c] === null ? -Infinity : rows[b][c]) - (rows[a][c] === null ? -Infinity : rows[a][c])
          : collator.compare(texts[a][c], texts[b][c]);
        return state.descending ? -r : r;
      });
    }
    const pages = Math.max(1, Math.ceil(order.length / PAGE_ROWS));
    const page = Math.min(pageState.get(key) || 0, pages - 1);
    pageState.set(key, page);
    const shown = order.slice(page * PAGE_ROWS, (page + 1) * PAGE_ROWS);
    body.replaceChildren(
      ...shown.map((i) => {
        const tr = document.createElement("tr");
        texts[i].forEach((text, c) => {
          const td = tr.insertCell();
          if (opts.link && c === opts.linkColumn) {
            const link = el("a", text);
            link.href = opts.link(rows[i]);
            td.appendChild(link);
          } else {
            td.textContent = text;
            if (text.length > 40) td.title = text; // the whole of a long cell, where the column cuts it
          }
        });
        return tr;
      }),
    );
    Array.from(head.cells).forEach((th, i) => {
      th.dataset.sort = state && i === state.column ? (state.descending ? "desc" : "asc") : "";
    });
    const first = order.length ? page * PAGE_ROWS + 1 : 0;
    where.textContent = `${first}–${page * PAGE_ROWS + shown.length} of ${order.length}` +
      (order.length !== rows.length ? ` (${rows.length} in all)` : "");
    previous.disabled = page === 0;
    next.disabled = page >= pages - 1;
    pager.hidden = order.length <= PAGE_ROWS;
  };
  columns.forEach((column, i) => {
    const th = el("th", column);
    th.addEventListener("click", () => {
      const old = sortState.get(key);
      sortState.set(key, { column: i, descending: old && old.column === i ? !old.descending : false });
      pageState.set(key, 0);
      draw();
    });
    head.appendChild(th);
  });
  previous.addEventListener("click", () => {
    pageState.set(key, (pageState.get(key) || 0) - 1);
    draw();
  });
  next.addEventListener("click", () => {
    pageState.set(key, (pageState.get(key) || 0) + 1);
    draw();
  });
  wrap.append(table, pager);
  wrap.draw = draw;
  draw();
  return wrap;
}

// The page's own tables (server-rendered, a few rows): sorted in place by a click on a header.
function makeSortable(table, key) {
  const sortRows = () => {
    const state = sortState.get(key);
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
  };
  Array.from(table.tHead.rows[0].cells).forEach((th, column) => {
    th.addEventListener("click", () => {
      const old = sortState.get(key);
      sortState.set(key, { column, descending: old && old.column === column ? !old.descending : false });
      sortRows();
    });
  });
}

function applySearch() {
  dataTables.forEach((table) => {
    pageState.set(table.dataset.key, 0);
    table.draw();
  });
}

// The nodes for a View's parts (hpctrain.web.safeview): a table each, a line each.
function partsNodes(key, parts) {
  const nodes = [];
  parts.forEach((part, index) => {
    if (part.table) {
      if (part.table.title) nodes.push(el("h3", part.table.title));
      nodes.push(dataTable(key + "/" + index, part.table.columns, part.table.rows));
    } else {
      nodes.push(el("p", part.line, "line"));
    }
  });
  return nodes;
}

function trackTables(box) {
  dataTables.length = 0;
  box.querySelectorAll("div.data-table").forEach((table) => dataTables.push(table));
}

// Ask `url` every `seconds` while the page is in view (a tab in the background asks nothing; back in view it asks at
// once); give each new answer to `show`. The answer's version (ETag) is sent back: the console answers 304, with
// nothing built or sent, while it is unchanged. `status` says when it was last asked, or what went wrong. A `show`
// that returns false has seen the last answer (a job that ended): nothing more is asked.
function poll(url, seconds, show, status) {
  let etag = null;
  let paused = false;
  let done = false;
  const load = () => {
    if (done) return;
    if (document.hidden) {
      paused = true;
      return;
    }
    const headers = etag ? { "If-None-Match": etag } : {};
    fetch(url, { credentials: "same-origin", cache: "no-store", headers })
      .then((response) => {
        if (response.status === 401) throw new Error("logged out: open the URL with ?token= again");
        if (response.status === 304) return null;
        return response.json().then((data) => {
          if (!response.ok) throw new Error(data.error || "the console answered " + response.status);
          etag = response.headers.get("ETag");
          return data;
        });
      })
      .then((data) => {
        if (data && show(data) === false) done = true;
        if (status) status(null);
      })
      .catch((err) => status && status(String(err.message || err)))
      .finally(() => {
        if (seconds > 0 && !done) setTimeout(load, Math.max(1, seconds) * 1000);
      });
  };
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && paused) {
      paused = false;
      load();
    }
  });
  load();
}

function asOf(error) {
  const taken = document.getElementById("taken");
  if (taken) taken.textContent = error || "as of " + new Date().toLocaleTimeString();
}

// ---- the jobs page: every scheduler's jobs in one table -------------------------------------------------------
function followJobs(box) {
  const show = (data) => {
    const nodes = data.schedulers.filter((s) => s.error).map((s) => el("p", s.name + ": " + s.error, "error"));
    const table = dataTable("jobs", data.columns, data.rows, {
      linkColumn: 1,
      link: (row) => "/job/" + encodeURIComponent(row[0]) + "/" + encodeURIComponent(row[1]),
      ageColumn: data.age_column,
    });
    table.id = "jobs-table";
    if (!data.rows.length) nodes.push(el("p", "no jobs", "muted"));
    box.replaceChildren(...nodes, table);
    trackTables(box);
  };
  poll("/api/jobs", parseFloat(box.dataset.interval) || 5, show, asOf);
}

// ---- the cluster page: each scheduler's view, asked once ----------------------------------------------------------
function showCluster(box) {
  const show = (data) => {
    const sections = data.schedulers.map((section) => {
      const node = el("section");
      node.appendChild(el("h2", section.name));
      if (section.error) node.appendChild(el("p", section.error, "error"));
      node.append(...partsNodes("cluster/" + section.name, section.parts));
      return node;
    });
    box.replaceChildren(...sections);
    trackTables(box);
  };
  poll(box.dataset.src, 0, show, asOf);
}

// ---- a job's page: its details kept current until the job has ended -----------------------------------------
function followDetails(box) {
  const show = (data) => {
    box.replaceChildren(...partsNodes("details", data.parts));
    if (data.ended) box.dataset.ended = "1"; // the plots ask once more, then stop too (jobpage.js)
    return !data.ended;
  };
  const status = (error) => {
    const said = document.getElementById("details-error");
    if (said) said.textContent = error || "";
  };
  poll(box.dataset.src, parseFloat(box.dataset.interval) || 5, show, status);
}

// ---- a job's log --------------------------------------------------------------------------------------------
const KEEP_LINES = 2000;

// Followed while the tab is in view: a tab in the background closes its stream (the console then asks the
// scheduler nothing for it); back in view it opens it again, which sends the last lines at once, then new ones.
function followLog(pre) {
  const state = document.getElementById("log-state");
  let source = null;
  let ended = false;
  const add = (text, cls) => {
    pre.appendChild(el("span", text + "\n", cls));
    while (pre.childNodes.length > KEEP_LINES) pre.removeChild(pre.firstChild);
  };
  const open = () => {
    pre.replaceChildren();
    if (state) state.textContent = "following…";
    source = new EventSource(pre.dataset.src);
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
      ended = true;
      if (state) state.textContent = "(ended)";
    });
    source.onerror = () => {
      if (state) state.textContent = "(reconnecting…)";
    };
  };
  document.addEventListener("visibilitychange", () => {
    if (ended) return;
    if (document.hidden && source) {
      source.close();
      source = null;
      if (state) state.textContent = "(paused in the background)";
    } else if (!document.hidden && !source) {
      open();
    }
  });
  if (!document.hidden) open();
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
  // (a page's own tables; those drawn from JSON are sorted, searched and paged as data)
  const search = document.getElementById("search");
  if (search) search.addEventListener("input", applySearch);
  const jobs = document.getElementById("jobs");
  if (jobs) followJobs(jobs);
  const cluster = document.getElementById("cluster");
  if (cluster) showCluster(cluster);
  const details = document.getElementById("details");
  if (details) followDetails(details);
  const log = document.getElementById("log");
  if (log) followLog(log);
});
