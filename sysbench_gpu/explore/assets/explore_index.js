/* SysBench explorer: the index page (runs and their metrics; sessions, sortable and filterable).
 * Columns and filters follow index.benchmarks: each benchmark's facets (session fields), its outcome
 * ("checklist": turns pass or fail; "score": turns have a score) and its runs' headline cells. */
(function () {
  "use strict";
  var X = window.SysbenchExplore;
  var el = X.el;
  var byId = X.byId;
  var clear = X.clear;
  var pct = X.pct;
  var ci = X.ci;
  var score = X.score;
  var scoreCi = X.scoreCi;
  var capital = X.capital;
  var showError = X.showError;
  var hashParams = X.hashParams;
  var toHash = X.toHash;
  var select = X.select;
  var INDEX = X.INDEX;

  function names(index) { return Object.keys(index.benchmarks); }

  function outcomes(index) {
    var found = {};
    names(index).forEach(function (name) { found[index.benchmarks[name].outcome] = true; });
    return found;
  }

  function facets(index, wanted) {
    // The facets of every benchmark explored, by key, in order (the first benchmark's label wins).
    var seen = {}, list = [];
    names(index).forEach(function (name) {
      (index.benchmarks[name].facets || []).forEach(function (facet) {
        if (seen[facet.key] || !wanted(facet)) return;
        seen[facet.key] = true;
        list.push(facet);
      });
    });
    return list;
  }

  // ------------------------------------------------------------ runs

  function cellNode(cell) {
    if (!cell) return el("td", { className: "num", text: "–" });
    var value = cell.kind === "percent" ? pct(cell.value) : cell.kind === "score" ? score(cell.value) :
      cell.value === null || cell.value === undefined ? "–" : String(cell.value);
    var interval = cell.kind === "percent" ? ci(cell.ci) : cell.kind === "score" ? scoreCi(cell.ci) : "";
    return el("td", { className: "num" }, [value, interval ? el("span", { className: "ci", text: " " + interval }) : null,
      cell.detail ? el("div", { className: "ci detail", text: cell.detail }) : null]);
  }

  function runsTable(index, name, members, number) {
    var labels = [];
    members.forEach(function (i) {
      index.runs[i].cells.forEach(function (cell) { if (labels.indexOf(cell.label) < 0) labels.push(cell.label); });
    });
    var head = ["Run", "Model", "Judge", "Status"].concat(labels);
    var table = el("table", { className: "grid runs", id: number ? "runs-table-" + (number + 1) : "runs-table",
      dataset: { benchmark: name } }, [
      el("thead", {}, [el("tr", {}, head.map(function (h) { return el("th", { text: h }); }))])
    ]);
    var body = el("tbody");
    members.forEach(function (i) {
      var run = index.runs[i];
      var byLabel = {};
      run.cells.forEach(function (cell) { byLabel[cell.label] = cell; });
      body.appendChild(el("tr", { dataset: { status: run.status } }, [
        el("td", { title: run.path }, [el("strong", { text: run.label })]),
        el("td", { text: run.model || "?" }),
        el("td", { text: run.judge_model || "?" }),
        el("td", {}, [el("span", { className: "badge b-" + run.status, text: run.status, title: run.note || null })])
      ].concat(labels.map(function (label) { return cellNode(byLabel[label]); }))));
    });
    table.appendChild(body);
    return table;
  }

  function renderRuns(index) {
    var root = clear(byId("runs"));
    var notes = clear(byId("run-notes"));
    var several = names(index).length > 1;
    names(index).forEach(function (name, number) {
      var benchmark = index.benchmarks[name];
      var members = index.runs.map(function (r, i) { return i; }).filter(function (i) { return index.runs[i].benchmark === name; });
      if (several) root.appendChild(el("h3", { text: benchmark.title }));
      if (benchmark.caption) root.appendChild(el("p", { className: "muted caption", text: benchmark.caption }));
      root.appendChild(el("div", { className: "scroll" }, [runsTable(index, name, members, number)]));
    });
    index.runs.forEach(function (run) {
      if (run.status !== "complete") {
        notes.appendChild(el("li", {}, [el("strong", { text: run.label + " is " + run.status + ": " }), run.note || ""]));
      }
    });
  }

  // ------------------------------------------------------------ sessions

  function failing(s) { return !!s && s.first_fail !== undefined && s.first_fail !== null; }

  function sessionOutcome(summary, row) {
    if (!summary) return "absent";
    if (failing(summary)) return "failing";
    if (summary.judged < row.n_answered) return "incomplete";  // turns not generated, not judged or unparsed
    return summary.score !== undefined ? "scored" : "passing";
  }

  function runsFailing(row) {
    return row.runs.filter(failing).length;
  }

  function facetText(value) { return value === null || value === undefined ? "" : String(value); }

  function columns(index) {
    var several = names(index).length > 1;
    var kinds = outcomes(index);
    var first = index.benchmarks[names(index)[0]] || { unit: "session" };
    var list = [{ key: "id", label: several ? "Session" : capital(first.unit), num: true, value: function (r) { return r.id; },
      cell: function (r, s, runIndex) {
        var href = "session.html" + toHash({ id: r.key, run: runIndex });
        return el("td", { className: "num" }, [el("a", { href: href, text: String(r.id), className: "session-link" })]);
      } }];
    if (several) {
      list.push({ key: "benchmark", label: "Benchmark", value: function (r) { return index.benchmarks[r.benchmark].title; } });
    }
    facets(index, function (f) { return f.column !== false; }).forEach(function (facet) {
      list.push({ key: "f_" + facet.key, label: facet.label, value: function (r) { return facetText(r[facet.key]); },
        cell: function (r) {
          var text = facetText(r[facet.key]);
          return el("td", { className: (facet.mono ? "mono " : "") + "facet f-" + facet.key, text: text,
            title: facet.hint || (text.length > 30 ? text : null) });
        } });
    });
    if (kinds.checklist) {
      list.push({ key: "passed", label: "Turns passed", num: true, value: function (r, s) { return s && s.passed !== undefined ? s.passed : -1; },
        cell: function (r, s) {
          return el("td", { className: "num", text: !s ? "not in run" : s.passed === undefined ? "" :
            s.passed + "/" + r.n_answered + (s.judged < r.n_answered ? " (" + s.judged + " judged)" : "") });
        } });
      list.push({ key: "first_fail", label: "First failing turn", num: true,
        value: function (r, s) { return failing(s) ? s.first_fail : 99; },
        cell: function (r, s) { return el("td", { className: "num", text: failing(s) ? String(s.first_fail) : "–" }); } });
      list.push({ key: "failed_types", label: "Failed constraint types", value: function (r, s) { return s && s.failed_types ? s.failed_types.join(" ") : ""; },
        cell: function (r, s) {
          return el("td", {}, s && s.failed_types ? s.failed_types.map(function (t) { return el("span", { className: "chip t-" + t, text: t }); }) : []);
        } });
      list.push({ key: "runs_failing", label: "Runs failing", num: true, value: function (r) { return runsFailing(r); },
        cell: function (r) { return el("td", { className: "num", text: runsFailing(r) + "/" + r.runs.filter(Boolean).length }); } });
    }
    if (kinds.score) {
      list.push({ key: "score", label: "Mean score", num: true,
        value: function (r, s) { return s && s.score !== undefined && s.score !== null ? s.score : -1; },
        cell: function (r, s) {
          return el("td", { className: "num", text: !s ? (kinds.checklist ? "–" : "not in run") : s.score === undefined ? "" :
            score(s.score) + (s.judged < r.n_answered ? " (" + s.judged + "/" + r.n_answered + " scored)" : "") });
        } });
      list.push({ key: "lowest", label: "Lowest score", num: true,
        value: function (r, s) { return s && s.lowest !== undefined && s.lowest !== null ? s.lowest : -1; },
        cell: function (r, s) { return el("td", { className: "num", text: s && s.lowest !== undefined ? score(s.lowest) : "–" }); } });
      list.push({ key: "scores", label: "Turn scores", value: function (r, s) { return s && s.scores ? s.scores.join(" ") : ""; },
        cell: function (r, s) {
          return el("td", { className: "mono scores", title: "score of each answered turn",
            text: s && s.scores ? s.scores.map(X.shortNumber).join(" · ") : "" });
        } });
    }
    list.push({ key: "attention", label: "Attention", value: function (r) { return r.attention.join(" "); },
      cell: function (r) { return el("td", { text: r.attention.join(", ") }); } });
    return list;
  }

  function filterNames(index) {
    var list = ["run", "bench", "outcome", "type"];
    facets(index, function (f) { return f.filter; }).forEach(function (f) { list.push("f_" + f.key); });
    return list.concat(["attn", "q"]);
  }

  function filterForm(index, state, onChange) {
    var form = clear(byId("filters"));
    var kinds = outcomes(index);
    form.appendChild(select("run", "Run", index.runs.map(function (r, i) { return [i, r.label]; }), state.run));
    if (names(index).length > 1) {
      form.appendChild(select("bench", "Benchmark", [["", "any"]].concat(names(index).map(function (n) {
        return [n, index.benchmarks[n].title]; })), state.bench || ""));
    }
    var options = [["", "all"]];
    if (kinds.checklist) options.push(["failing", "failing (a turn failed)"], ["passing", "passing (every judged turn)"]);
    if (kinds.score) options.push(["scored", "scored (every answered turn)"]);
    options.push(["incomplete", "not fully judged"]);
    form.appendChild(select("outcome", "Outcome", options, state.outcome || ""));
    var types = [];
    names(index).forEach(function (n) {
      (index.benchmarks[n].kinds || []).forEach(function (t) { if (types.indexOf(t) < 0) types.push(t); });
    });
    if (types.length) {
      form.appendChild(select("type", "Failed type", [["", "any"]].concat(types.map(function (t) { return [t, t]; })), state.type || ""));
    }
    facets(index, function (f) { return f.filter; }).forEach(function (facet) {
      var values = {};
      index.order.forEach(function (key) { var v = facetText(index.sessions[key][facet.key]); if (v) values[v] = true; });
      form.appendChild(select("f_" + facet.key, facet.label, [["", "any"]].concat(Object.keys(values).sort().map(function (v) {
        return [v, v]; })), state["f_" + facet.key] || ""));
    });
    form.appendChild(select("attn", "Attention", [["", "any"], ["yes", "measured"]], state.attn || ""));
    var search = el("input", { type: "search", name: "q", id: "f-q", placeholder: "id or any field" });
    search.value = state.q || "";
    form.appendChild(el("label", {}, ["Search ", search]));
    form.addEventListener("input", onChange);
    form.addEventListener("change", onChange);
    form.addEventListener("submit", function (event) { event.preventDefault(); });
  }

  function readForm(index) {
    var state = {};
    filterNames(index).forEach(function (name) {
      var node = byId("f-" + name);
      if (node) state[name] = node.value;
    });
    return state;
  }

  function matches(index, row, state) {
    var summary = row.runs[Number(state.run) || 0];
    if (state.bench && row.benchmark !== state.bench) return false;
    if (state.outcome && sessionOutcome(summary, row) !== state.outcome) return false;
    if (state.type && !(summary && summary.failed_types && summary.failed_types.indexOf(state.type) >= 0)) return false;
    var facetList = facets(index, function (f) { return f.filter; });
    for (var i = 0; i < facetList.length; i++) {
      var wanted = state["f_" + facetList[i].key];
      if (wanted && facetText(row[facetList[i].key]) !== wanted) return false;
    }
    if (state.attn === "yes" && !row.attention.length) return false;
    if (state.q) {
      var needle = state.q.toLowerCase();
      var hay = [String(row.id), row.key].concat(facets(index, function (f) { return f.column !== false; }).map(function (f) {
        return facetText(row[f.key]); })).join(" ").toLowerCase();
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
    var cols = columns(index);
    head.appendChild(el("tr", {}, cols.map(function (column) {
      var mark = column.key === sortKey ? (descending ? " ▼" : " ▲") : "";
      return el("th", { className: "sortable", dataset: { key: column.key }, text: column.label + mark,
        title: "sort by " + column.label.toLowerCase() });
    })));
    var column = cols.filter(function (c) { return c.key === sortKey; })[0] || cols[0];
    var position = {};
    index.order.forEach(function (key, i) { position[key] = i; });
    var rows = index.order.map(function (key) { return index.sessions[key]; })
      .filter(function (row) { return matches(index, row, state); });
    rows.sort(function (a, b) {
      var va = column.value(a, a.runs[runIndex]), vb = column.value(b, b.runs[runIndex]);
      var order = column.num ? va - vb : String(va).localeCompare(String(vb));
      if (order === 0) order = position[a.key] - position[b.key];
      return descending ? -order : order;
    });
    var body = clear(table.tBodies[0]);
    rows.forEach(function (row) {
      var s = row.runs[runIndex];
      body.appendChild(el("tr", { dataset: { id: row.id, key: row.key, benchmark: row.benchmark, outcome: sessionOutcome(s, row) } },
        cols.map(function (c) { return c.cell ? c.cell(row, s, runIndex) : el("td", { text: c.value(row, s) }); })));
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
      var next = readForm(index);
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
