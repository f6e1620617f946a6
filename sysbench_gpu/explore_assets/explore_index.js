/* SysBench explorer: the index page (runs and their metrics; sessions, sortable and filterable). */
(function () {
  "use strict";
  var X = window.SysbenchExplore;
  var el = X.el;
  var byId = X.byId;
  var clear = X.clear;
  var pct = X.pct;
  var ci = X.ci;
  var showError = X.showError;
  var hashParams = X.hashParams;
  var toHash = X.toHash;
  var select = X.select;
  var INDEX = X.INDEX;
  var TYPES = X.TYPES;

  // ------------------------------------------------------------ index page

  function renderRuns(index) {
    var head = ["Run", "Model", "Judge", "Status", "Sessions", "Turns", "Constraints", "CSR", "ISR", "SSR",
      "CSR (Eq. 1)", "ISR aligned", "ISR misaligned"];
    var table = el("table", { className: "grid runs", id: "runs-table" }, [
      el("thead", {}, [el("tr", {}, head.map(function (h) { return el("th", { text: h }); }))])
    ]);
    var body = el("tbody");
    var notes = clear(byId("run-notes"));
    index.runs.forEach(function (run) {
      var m = run.metrics || {};
      var c = m.ci95 || {};
      var align = m.isr_by_alignment || {};
      function metric(name) {
        return el("td", { className: "num" }, [pct(m[name]), el("span", { className: "ci", text: " " + ci(c[name]) })]);
      }
      body.appendChild(el("tr", { dataset: { status: run.status } }, [
        el("td", { title: run.path }, [el("strong", { text: run.label })]),
        el("td", { text: run.model || "?" }),
        el("td", { text: run.judge_model || "?" }),
        el("td", {}, [el("span", { className: "badge b-" + run.status, text: run.status, title: run.note || null })]),
        el("td", { className: "num", text: m.n_sessions === undefined ? "–" : m.n_sessions }),
        el("td", { className: "num", text: m.n_turns === undefined ? "–" : m.n_turns }),
        el("td", { className: "num", text: m.n_constraints === undefined ? "–" : m.n_constraints }),
        metric("csr"), metric("isr"), metric("ssr"),
        el("td", { className: "num", text: pct(m.csr_macro) }),
        el("td", { className: "num", text: pct(align.aligned) }),
        el("td", { className: "num", text: pct(align.misaligned) })
      ]));
      if (run.status !== "complete") {
        notes.appendChild(el("li", {}, [el("strong", { text: run.label + " is " + run.status + ": " }), run.note || ""]));
      }
    });
    table.appendChild(body);
    clear(byId("runs")).appendChild(table);
  }

  function sessionOutcome(summary, row) {
    if (!summary) return "absent";
    if (summary.first_fail !== null) return "failing";
    if (summary.judged < row.n_turns) return "incomplete";  // turns not generated, not judged or unparsed
    return "passing";
  }

  var COLUMNS = [
    { key: "id", label: "Session", num: true, value: function (r) { return r.id; } },
    { key: "domain", label: "Domain", value: function (r) { return r.domain || ""; } },
    { key: "scene", label: "Scene", value: function (r) { return r.scene || ""; } },
    { key: "group", label: "Turns are", value: function (r) { return r.group; } },
    { key: "alignment", label: "Alignment", value: function (r) { return r.alignment; } },
    { key: "passed", label: "Turns passed", num: true, value: function (r, s) { return s ? s.passed : -1; } },
    { key: "first_fail", label: "First failing turn", num: true,
      value: function (r, s) { return s && s.first_fail !== null ? s.first_fail : 99; } },
    { key: "failed_types", label: "Failed constraint types", value: function (r, s) { return s ? s.failed_types.join(" ") : ""; } },
    { key: "runs_failing", label: "Runs failing", num: true, value: function (r) { return runsFailing(r); } },
    { key: "attention", label: "Attention", value: function (r) { return r.attention.join(" "); } }
  ];

  function runsFailing(row) {
    return row.runs.filter(function (s) { return s && s.first_fail !== null; }).length;
  }

  function filterForm(index, state, onChange) {
    var form = clear(byId("filters"));
    var domains = {};
    index.order.forEach(function (id) { var d = index.sessions[id].domain; if (d) domains[d] = true; });
    form.appendChild(select("run", "Run", index.runs.map(function (r, i) { return [i, r.label]; }), state.run));
    form.appendChild(select("outcome", "Outcome", [["", "all"], ["failing", "failing (a turn failed)"],
      ["passing", "passing (every judged turn)"], ["incomplete", "not fully judged"]], state.outcome || ""));
    form.appendChild(select("type", "Failed type", [["", "any"]].concat(TYPES.map(function (t) { return [t, t]; })), state.type || ""));
    form.appendChild(select("group", "Turns are", [["", "any"], ["dependent", "dependent"], ["parallel", "parallel"]], state.group || ""));
    form.appendChild(select("align", "Alignment", [["", "any"], ["misaligned", "has misaligned turns"],
      ["aligned", "all aligned"]], state.align || ""));
    form.appendChild(select("domain", "Domain", [["", "any"]].concat(Object.keys(domains).sort().map(function (d) { return [d, d]; })), state.domain || ""));
    form.appendChild(select("attn", "Attention", [["", "any"], ["yes", "measured"]], state.attn || ""));
    var search = el("input", { type: "search", name: "q", id: "f-q", placeholder: "id, domain or scene" });
    search.value = state.q || "";
    form.appendChild(el("label", {}, ["Search ", search]));
    form.addEventListener("input", onChange);
    form.addEventListener("change", onChange);
    form.addEventListener("submit", function (event) { event.preventDefault(); });
  }

  function readForm() {
    var state = {};
    ["run", "outcome", "type", "group", "align", "domain", "attn", "q"].forEach(function (name) {
      state[name] = byId("f-" + name).value;
    });
    return state;
  }

  function matches(row, state) {
    var summary = row.runs[Number(state.run) || 0];
    if (state.outcome && sessionOutcome(summary, row) !== state.outcome) return false;
    if (state.type && !(summary && summary.failed_types.indexOf(state.type) >= 0)) return false;
    if (state.group && row.group !== state.group) return false;
    if (state.align === "misaligned" && row.alignment.indexOf("M") < 0) return false;
    if (state.align === "aligned" && row.alignment.indexOf("M") >= 0) return false;
    if (state.domain && row.domain !== state.domain) return false;
    if (state.attn === "yes" && !row.attention.length) return false;
    if (state.q) {
      var needle = state.q.toLowerCase();
      var hay = [String(row.id), row.domain || "", row.scene || ""].join(" ").toLowerCase();
      if (hay.indexOf(needle) < 0) return false;
    }
    return true;
  }

  function renderSessions(index, state) {
    var table = byId("sessions");
    var head = clear(table.tHead);
    var runIndex = Number(state.run) || 0;
    var sortKey = state.sort || "id";
    var descending = state.dir === "desc";
    head.appendChild(el("tr", {}, COLUMNS.map(function (column) {
      var mark = column.key === sortKey ? (descending ? " ▼" : " ▲") : "";
      return el("th", { className: "sortable", dataset: { key: column.key }, text: column.label + mark,
        title: "sort by " + column.label.toLowerCase() });
    })));
    var column = COLUMNS.filter(function (c) { return c.key === sortKey; })[0] || COLUMNS[0];
    var rows = index.order.map(function (id) { return index.sessions[String(id)]; })
      .filter(function (row) { return matches(row, state); });
    rows.sort(function (a, b) {
      var va = column.value(a, a.runs[runIndex]), vb = column.value(b, b.runs[runIndex]);
      var order = column.num ? va - vb : String(va).localeCompare(String(vb));
      if (order === 0) order = a.id - b.id;
      return descending ? -order : order;
    });
    var body = clear(table.tBodies[0]);
    rows.forEach(function (row) {
      var s = row.runs[runIndex];
      var href = "session.html" + toHash({ id: row.id, run: runIndex });
      body.appendChild(el("tr", { dataset: { id: row.id, outcome: sessionOutcome(s, row) } }, [
        el("td", { className: "num" }, [el("a", { href: href, text: String(row.id), className: "session-link" })]),
        el("td", { text: row.domain || "" }),
        el("td", { className: "scene", text: row.scene || "", title: row.scene || null }),
        el("td", { text: row.group }),
        el("td", { className: "mono", text: row.alignment,
          title: "A aligned, M misaligned, per turn" }),
        el("td", { className: "num", text: s ? s.passed + "/" + row.n_turns + (s.judged < row.n_turns ? " (" + s.judged + " judged)" : "") : "not in run" }),
        el("td", { className: "num", text: s && s.first_fail !== null ? String(s.first_fail) : "–" }),
        el("td", {}, s ? s.failed_types.map(function (t) { return el("span", { className: "chip t-" + t, text: t }); }) : []),
        el("td", { className: "num", text: runsFailing(row) + "/" + row.runs.filter(Boolean).length }),
        el("td", { text: row.attention.join(", ") })
      ]));
    });
    byId("count").textContent = "showing " + rows.length + " of " + index.order.length + " sessions";
  }

  function initIndex() {
    var index = window[INDEX];
    if (!index) { showError("data/index.js did not load: rebuild the site with sysbench-gpu explore"); return; }
    document.title = index.title;
    byId("title").textContent = index.title;
    byId("subtitle").textContent = "Made by " + index.tool + " " + index.version + " on " + index.created + "; " +
      index.runs.length + " run(s), " + index.order.length + " sessions" +
      (index.attention.length ? ", attention from " + index.attention.map(function (a) { return a.name; }).join(", ") : "") + ".";
    renderRuns(index);
    var state = hashParams();
    if (!state.run || !index.runs[Number(state.run)]) state.run = "0";
    filterForm(index, state, function () {
      var next = readForm();
      next.sort = state.sort; next.dir = state.dir;
      state = next;
      history.replaceState(null, "", toHash(state));
      renderSessions(index, state);
    });
    byId("sessions").tHead.addEventListener("click", function (event) {
      var key = event.target && event.target.dataset ? event.target.dataset.key : null;
      if (!key) return;
      state.dir = state.sort === key && state.dir !== "desc" ? "desc" : "asc";
      state.sort = key;
      history.replaceState(null, "", toHash(state));
      renderSessions(index, state);
    });
    renderSessions(index, state);
  }


  X.pages.index = initIndex;
})();
