/* SysBench explorer: a session page (system message, turns, verdicts or scores, replies side by side). */
(function () {
  "use strict";
  var X = window.SysbenchExplore;
  var el = X.el;
  var byId = X.byId;
  var clear = X.clear;
  var showError = X.showError;
  var hashParams = X.hashParams;
  var toHash = X.toHash;
  var loadScript = X.loadScript;
  var verdictChip = X.verdictChip;
  var capital = X.capital;
  var INDEX = X.INDEX;
  var SESSIONS = X.SESSIONS;

  // ------------------------------------------------------------ session page

  function hasChecklist(turn, shown) {
    return turn.constraints.length > 0 || shown.some(function (i) {
      var entry = turn.runs[i];
      return !!(entry && entry.judgment && entry.judgment.verdicts && entry.judgment.verdicts.length);
    });
  }

  function verdictMatrix(turn, shown, runs) {
    var head = el("tr", {}, [el("th", { className: "c-id", text: "#" }), el("th", { className: "c-type", text: "Type" }),
      el("th", { text: "Constraint" })].concat(shown.map(function (i) { return el("th", { className: "c-run", text: runs[i].label }); })));
    var table = el("table", { className: "grid verdicts" }, [el("thead", {}, [head])]);
    var body = el("tbody");
    var ids = turn.constraints.map(function (c) { return String(c.id); });
    shown.forEach(function (i) {  // lines a judge wrote outside the checklist
      var entry = turn.runs[i];
      var verdicts = entry && entry.judgment && entry.judgment.verdicts ? entry.judgment.verdicts : [];
      verdicts.forEach(function (v) { if (ids.indexOf(v.id) < 0) ids.push(v.id); });
    });
    ids.forEach(function (id) {
      var constraint = turn.constraints.filter(function (c) { return String(c.id) === id; })[0];
      var cells = [
        el("td", { className: "num", text: id }),
        el("td", {}, constraint ? [el("span", { className: "chip t-" + constraint.type, text: constraint.type })] : []),
        el("td", { className: "text", text: constraint ? constraint.content : "(not in the checklist)" })
      ];
      shown.forEach(function (i) {
        var entry = turn.runs[i];
        var judgment = entry ? entry.judgment : null;
        var verdict = judgment ? (judgment.verdicts || []).filter(function (v) { return v.id === id; })[0] : null;
        var value = !entry ? "–" : !judgment ? "not judged" : judgment.parse === "unparsed" ? "unparsed" : null;
        cells.push(el("td", { className: "vcell" }, [value ? el("span", { className: "muted", text: value }) :
          verdictChip(verdict ? verdict.value : "missing", verdict ? verdict.raw : null)]));
      });
      body.appendChild(el("tr", {}, cells));
    });
    table.appendChild(body);
    return table;
  }

  function outcomeOf(entry) {
    var judgment = entry ? entry.judgment : null;
    if (!entry) return "absent";
    if (!judgment) return "unjudged";
    if (judgment.score !== undefined && judgment.score !== null) return "score";
    if (judgment.passed === true) return "pass";
    if (judgment.passed === false) return "fail";
    return judgment.parse === "skipped" ? "skipped" : "unparsed";
  }

  function replyCard(entry, run) {
    var card = el("div", { className: "card" });
    var judgment = entry ? entry.judgment : null;
    var outcome = outcomeOf(entry);
    var outcomeText = { absent: "not in this run", unjudged: "not judged", pass: "turn passed", fail: "turn failed",
      unparsed: "judge reply unparsed", skipped: "not judged (no reply)" }[outcome];
    if (outcome === "score") outcomeText = "score " + X.shortNumber(judgment.score) + (judgment.scale ? " / " + X.shortNumber(judgment.scale) : "");
    card.appendChild(el("div", { className: "card-head" }, [el("strong", { text: run.label }), " ",
      el("span", { className: "badge o-" + outcome, text: outcomeText, dataset: outcome === "score" ? { score: String(judgment.score) } : undefined }),
      judgment && judgment.scorer ? el("span", { className: "muted", text: " scored by " + judgment.scorer }) : null]));
    if (!entry) return card;
    if (entry.user) card.appendChild(el("div", { className: "note", text: "this run's user message: " + entry.user }));
    if (entry.reply === null) {
      card.appendChild(el("div", { className: "muted", text: "no reply (" + (entry.status || "ok") + (entry.overflow ? ", " + entry.overflow : "") + ")" }));
    } else {
      card.appendChild(el("div", { className: "text reply", text: entry.reply }));
      if (entry.finish && entry.finish !== "stop") card.appendChild(el("div", { className: "muted", text: "finish reason: " + entry.finish }));
    }
    if (judgment) {
      if (judgment.judge) card.appendChild(el("div", { className: "muted", text: "judge: " + judgment.judge }));
      if (judgment.reasoning) {
        card.appendChild(el("details", { className: "reasoning" }, [el("summary", { text: judgment.reasoning_title || "Judge's reasoning" }),
          el("div", { className: "text", text: judgment.reasoning })]));
      }
      if (judgment.raw_reply) {
        card.appendChild(el("details", { className: "reasoning" }, [el("summary", { text: "Judge's reply (did not parse)" }),
          el("div", { className: "text", text: judgment.raw_reply })]));
      }
    }
    return card;
  }

  function renderTurns(detail, shown, runs) {
    var root = clear(byId("turns"));
    detail.turns.forEach(function (turn) {
      var article = el("article", { className: "turn", id: "turn-" + turn.turn, dataset: { turn: turn.turn } });
      article.appendChild(el("h2", {}, ["Turn " + turn.turn + " ",
        turn.alignment ? el("span", { className: "badge a-" + turn.alignment, text: turn.alignment }) : null]));
      article.appendChild(el("div", { className: "label", text: "User" }));
      article.appendChild(el("div", { className: "text block user", text: turn.user === null ? "(no such turn in the first run)" : turn.user }));
      (turn.context || []).forEach(function (item) {
        article.appendChild(el("div", { className: "label", text: item.label }));
        article.appendChild(el("div", { className: "text block context", text: item.text }));
      });
      if (turn.answered === false) {
        article.appendChild(el("p", { className: "muted", text: "A context turn: no run answers it." }));
        root.appendChild(article);
        return;
      }
      if (hasChecklist(turn, shown)) article.appendChild(el("div", { className: "scroll" }, [verdictMatrix(turn, shown, runs)]));
      var replies = el("div", { className: "replies cols-" + Math.min(shown.length, 4) });
      shown.forEach(function (i) { replies.appendChild(replyCard(turn.runs[i], runs[i])); });
      article.appendChild(replies);
      root.appendChild(article);
    });
  }

  function runPicker(index, shown, onChange) {
    var box = clear(byId("run-picker"));
    if (index.runs.length < 2) return;
    box.appendChild(el("span", { className: "muted", text: "Runs side by side: " }));
    index.runs.forEach(function (run, i) {
      var input = el("input", { type: "checkbox", value: String(i), id: "run-" + i });
      input.checked = shown.indexOf(i) >= 0;
      input.addEventListener("change", function () {
        var picked = [];
        box.querySelectorAll("input").forEach(function (node) { if (node.checked) picked.push(Number(node.value)); });
        onChange(picked);
      });
      box.appendChild(el("label", { className: "pick" }, [input, " " + run.label]));
    });
  }


  function links(hash, key) {
    // Previous and next session in the index's order, keeping the runs picked; back to the index with the same run.
    var index = window[INDEX];
    var position = index.order.indexOf(key);
    var prev = index.order[position - 1], next = index.order[position + 1];
    byId("prev").href = "session.html" + toHash({ id: prev, run: hash.run || 0, show: hash.show });
    byId("next").href = "session.html" + toHash({ id: next, run: hash.run || 0, show: hash.show });
    byId("prev").hidden = prev === undefined;
    byId("next").hidden = next === undefined;
    byId("back").href = "index.html" + toHash({ run: hash.run || 0 });
  }

  function initSession() {
    var index = window[INDEX];
    if (!index) { showError("data/index.js did not load: rebuild the site with sysbench-gpu explore"); return; }
    var hash = hashParams();
    var row = X.sessionRow(index, hash.id);
    if (!row) { showError("no session " + hash.id + " in this site"); return; }
    var key = row.key;
    var benchmark = index.benchmarks[row.benchmark];
    var several = Object.keys(index.benchmarks).length > 1;
    links(hash, key);
    byId("title").textContent = capital(benchmark.unit) + " " + row.id;
    document.title = byId("title").textContent + " · " + benchmark.title + " explorer";
    byId("meta").textContent = [several ? benchmark.title : null].concat(benchmark.facets.filter(function (f) {
      return f.column !== false && row[f.key] !== null && row[f.key] !== undefined && row[f.key] !== "";
    }).map(function (f) { return f.label + ": " + row[f.key]; })).filter(Boolean).join(" · ");
    loadScript("data/sessions/" + key + ".js", function () {
      var detail = (window[SESSIONS] || {})[key];
      if (!detail) { showError("data/sessions/" + key + ".js holds no session " + key); return; }
      byId("system").textContent = detail.system;
      var notes = clear(byId("text-notes"));
      detail.runs_with_other_text.forEach(function (label) {
        notes.appendChild(el("span", { text: "Run " + label + " stores other texts or checklists for this session " +
          "(its own messages are shown with its replies). " }));
      });
      var section = byId("system-section");
      detail.system_by_run.forEach(function (text, i) {
        if (text === null || text === detail.system) return;
        section.appendChild(el("details", { className: "reasoning" }, [
          el("summary", { text: "System message as run " + index.runs[i].label + " stores it" }),
          el("div", { className: "text", text: text })]));
      });
      var present = index.runs.map(function (r, i) { return i; }).filter(function (i) { return row.runs[i]; });
      var first = Number(hash.run) || 0;
      var shown = present.indexOf(first) >= 0 ? [first].concat(present.filter(function (i) { return i !== first; })) : present;
      shown = shown.slice(0, 4);
      if (hash.show) {  // the runs picked on an earlier session page
        var picked = hash.show.split(",").map(Number).filter(function (i) { return present.indexOf(i) >= 0; });
        if (picked.length) shown = picked;
      }
      runPicker(index, shown, function (picked) {
        hash.show = picked.join(",");
        history.replaceState(null, "", toHash(hash));
        links(hash, key);
        renderTurns(detail, picked, index.runs);
      });
      renderTurns(detail, shown, index.runs);
    }, function () { showError("could not load data/sessions/" + key + ".js"); });
    if (row.attention.length) {
      byId("to-attention").hidden = false;
      byId("to-attention").addEventListener("click", function (event) {
        event.preventDefault();  // the hash names the session
        byId("attention-section").scrollIntoView();
      });
      loadScript("data/attention/" + key + ".js", function () { X.initAttention(key, index, hash); },
        function () { showError("could not load data/attention/" + key + ".js"); });
    }
    window.addEventListener("hashchange", function () { location.reload(); });
  }


  X.pages.session = initSession;
})();
