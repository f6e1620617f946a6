/* SysBench explorer: the index and session pages. No framework, no network.
 * Data arrive as scripts that assign to globals (data/index.js, data/sessions/<id>.js,
 * data/attention/<id>.js). Every text from a run goes into the page through text nodes
 * (textContent), never as HTML: model replies and judge reasoning are untrusted. */
(function () {
  "use strict";

  var INDEX = "SYSBENCH_EXPLORE_INDEX";
  var SESSIONS = "SYSBENCH_EXPLORE_SESSIONS";
  var ATTENTION = "SYSBENCH_EXPLORE_ATTENTION";
  var TYPES = ["action", "content", "background", "role", "format", "style"];

  // ------------------------------------------------------------ helpers

  function el(tag, props, children) {
    var node = document.createElement(tag);
    var key;
    props = props || {};
    for (key in props) {
      if (!Object.prototype.hasOwnProperty.call(props, key) || props[key] === undefined || props[key] === null) continue;
      if (key === "text") node.textContent = String(props[key]);
      else if (key === "className") node.className = props[key];
      else if (key === "dataset") Object.keys(props[key]).forEach(function (k) { node.dataset[k] = props[key][k]; });
      else if (key === "on") Object.keys(props[key]).forEach(function (k) { node.addEventListener(k, props[key][k]); });
      else node.setAttribute(key, props[key]);
    }
    (children || []).forEach(function (child) {
      if (child === null || child === undefined) return;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function byId(id) { return document.getElementById(id); }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

  function pct(value) { return value === null || value === undefined ? "–" : (100 * value).toFixed(1); }

  function ci(pair) { return pair ? "[" + pct(pair[0]) + ", " + pct(pair[1]) + "]" : ""; }

  function showError(message) {
    var node = byId("error");
    if (!node) return;
    node.textContent = message;
    node.hidden = false;
  }

  function hashParams() {
    var params = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      if (!part) return;
      var pair = part.split("=");
      params[decodeURIComponent(pair[0])] = decodeURIComponent(pair.slice(1).join("="));
    });
    return params;
  }

  function toHash(params) {
    return "#" + Object.keys(params).filter(function (k) { return params[k] !== "" && params[k] !== undefined; })
      .map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(params[k]); }).join("&");
  }

  function loadScript(src, onload, onerror) {
    var script = document.createElement("script");
    script.src = src;
    script.onload = onload;
    script.onerror = onerror;
    document.head.appendChild(script);
  }

  function verdictChip(value, raw) {
    var label = value === "yes" ? "yes" : value === "no" ? "no" : value === "missing" ? "missing" : "other";
    var text = label === "other" && raw ? "other (" + raw + ")" : label;
    return el("span", { className: "verdict v-" + label, text: text, title: raw ? "judge wrote: " + raw : null });
  }

  function select(name, label, options, value) {
    var node = el("select", { name: name, id: "f-" + name });
    options.forEach(function (option) {
      var opt = el("option", { value: option[0], text: option[1] });
      if (String(option[0]) === String(value)) opt.selected = true;
      node.appendChild(opt);
    });
    return el("label", {}, [label + " ", node]);
  }

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

  // ------------------------------------------------------------ session page

  function verdictMatrix(turn, shown, runs) {
    var head = el("tr", {}, [el("th", { className: "c-id", text: "#" }), el("th", { className: "c-type", text: "Type" }),
      el("th", { text: "Constraint" })].concat(shown.map(function (i) { return el("th", { className: "c-run", text: runs[i].label }); })));
    var table = el("table", { className: "grid verdicts" }, [el("thead", {}, [head])]);
    var body = el("tbody");
    var ids = turn.constraints.map(function (c) { return String(c.id); });
    shown.forEach(function (i) {  // lines a judge wrote outside the checklist
      var entry = turn.runs[i];
      var verdicts = entry && entry.judgment ? entry.judgment.verdicts : [];
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
        var verdict = judgment ? judgment.verdicts.filter(function (v) { return v.id === id; })[0] : null;
        var value = !entry ? "–" : !judgment ? "not judged" : judgment.parse === "unparsed" ? "unparsed" : null;
        cells.push(el("td", { className: "vcell" }, [value ? el("span", { className: "muted", text: value }) :
          verdictChip(verdict ? verdict.value : "missing", verdict ? verdict.raw : null)]));
      });
      body.appendChild(el("tr", {}, cells));
    });
    table.appendChild(body);
    return table;
  }

  function replyCard(entry, run) {
    var card = el("div", { className: "card" });
    var judgment = entry ? entry.judgment : null;
    var outcome = !entry ? "absent" : !judgment ? "unjudged" : judgment.passed === true ? "pass" : judgment.passed === false ? "fail" : "unparsed";
    var outcomeText = { absent: "not in this run", unjudged: "not judged", pass: "turn passed", fail: "turn failed", unparsed: "judge reply unparsed" }[outcome];
    card.appendChild(el("div", { className: "card-head" }, [el("strong", { text: run.label }), " ",
      el("span", { className: "badge o-" + outcome, text: outcomeText })]));
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
        card.appendChild(el("details", { className: "reasoning" }, [el("summary", { text: "Judge's reasoning" }),
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
      article.appendChild(el("div", { className: "scroll" }, [verdictMatrix(turn, shown, runs)]));
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

  // ------------------------------------------------------------ attention

  function decodeLevels(text) {
    var raw = atob(text);
    var levels = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) levels[i] = raw.charCodeAt(i);
    return levels;
  }

  function tokenKinds(arm) {
    var n = arm.lengths.length;
    var kinds = new Array(n);
    var i;
    for (i = 0; i < n; i++) kinds[i] = "tmpl";
    function mark(span, kind) { for (var k = span[0]; k < span[1] && k < n; k++) kinds[k] = kind; }
    arm.users.forEach(function (span) { mark(span, "user"); });
    arm.replies.forEach(function (span) { mark(span, "reply"); });
    mark(arm.system, "system");
    mark([0, arm.lead_end], "lead");
    return kinds;
  }

  function scaleMax(arms, layer, variant) {
    // The colour scale: the largest value among reply tokens (tokens after the system text when there
    // are none), over both arms, so the arms compare on one scale; larger values saturate.
    var top = 0;
    arms.forEach(function (arm) {
      if (!arm || !arm.values[layer]) return;
      var levels = decodeLevels(arm.values[layer][variant]);
      var spans = arm.replies.length ? arm.replies : [[arm.system[1], levels.length]];
      spans.forEach(function (span) {
        for (var i = span[0]; i < span[1] && i < levels.length; i++) if (levels[i] > top) top = levels[i];
      });
    });
    return Math.max(top, 1) / 255;
  }

  function colour(value, scale) {
    var alpha = Math.min(1, value / scale);
    return "rgba(230, 85, 13, " + alpha.toFixed(3) + ")";
  }

  function tokenLine(arm, kinds, levels, from, to, scale) {
    var line = el("div", { className: "tokens" });
    var offset = 0;
    for (var i = 0; i < from; i++) offset += arm.lengths[i];
    for (i = from; i < to; i++) {
      var piece = arm.text.slice(offset, offset + arm.lengths[i]);
      offset += arm.lengths[i];
      var value = levels[i] / 255;
      var span = el("span", { className: "tok k-" + kinds[i], dataset: { i: i, level: levels[i] },
        title: "token " + i + " (" + kinds[i] + "): share " + value.toFixed(3) });
      span.textContent = piece;
      span.style.backgroundColor = colour(value, scale);
      line.appendChild(span);
    }
    return line;
  }

  function meanFor(arm, layer, turnNumber, key) {
    var rows = (arm && arm.turn_means[layer]) || [];
    var row = rows.filter(function (r) { return r.turn === turnNumber; })[0];
    return row ? row[key] : null;
  }

  function fmt(value) { return value === null || value === undefined ? "–" : value.toFixed(3); }

  function renderAttention(data, index, state) {
    var section = byId("attention-section");
    var entry = data.sources[state.source] || data.sources[0];
    var source = index.attention[entry.source];
    var arm = entry.arms[state.arm] || entry.arms.system || entry.arms.control;
    var armName = entry.arms[state.arm] ? state.arm : (entry.arms.system ? "system" : "control");
    var other = entry.arms[armName === "system" ? "control" : "system"];
    var variant = state.variant === "share" ? "share" : "excl";
    var root = clear(byId("attention"));
    var notes = clear(byId("attention-notes"));
    Object.keys(entry.skipped || {}).forEach(function (name) {
      notes.appendChild(el("p", { text: name + " arm not measured: " + entry.skipped[name] }));
    });
    if (!arm) { root.appendChild(el("p", { className: "muted", text: "No arm of this source measured this session." })); return; }
    if (arm.stopped) notes.appendChild(el("p", { text: "Conversation stops early: " + arm.stopped }));
    if (arm.turns_dropped_for_length) notes.appendChild(el("p", { text: arm.turns_dropped_for_length + " turn(s) dropped to fit the model's length" }));
    var layer = arm.values[state.layer] ? state.layer : source.layers[0].label;
    var scale = state.scale === "one" ? 1 : scaleMax([entry.arms.system, entry.arms.control], layer, variant);
    var legend = clear(byId("legend"));
    legend.appendChild(el("span", { text: "0" }));
    legend.appendChild(el("span", { className: "ramp" }));
    legend.appendChild(el("span", { text: scale.toFixed(3) + (scale < 1 ? " and above" : "") }));
    legend.appendChild(el("span", { className: "muted", text: "  " + (variant === "excl" ? "share with the template's leading tokens excluded" : "share of all attention") }));
    var levels = decodeLevels(arm.values[layer][variant]);
    var kinds = tokenKinds(arm);
    var view = el("div", { className: "attn-view", id: "attn-view", dataset: { arm: armName, layer: layer, variant: variant, scale: scale.toFixed(6) } });
    var meanKey = variant === "excl" ? "reply_excl" : "reply_share";
    view.appendChild(el("div", { className: "attn-row" }, [
      el("div", { className: "attn-side" }, [el("strong", { text: "System text" }),
        el("div", { className: "muted", text: armName === "system" ? "as system message" : "inside user message 1" })]),
      tokenLine(arm, kinds, levels, 0, arm.turns.length ? arm.turns[0][0] : arm.lengths.length, scale)
    ]));
    arm.turns.forEach(function (span, k) {
      var number = arm.turn_numbers[k];
      var mine = meanFor(arm, layer, number, meanKey);
      var theirs = meanFor(other, layer, number, meanKey);
      var side = el("div", { className: "attn-side", dataset: { turn: number } }, [
        el("strong", { text: "Turn " + number }),
        el("div", { className: "mean", text: "reply mean " + fmt(mine) }),
        other ? el("div", { className: "muted", text: (armName === "system" ? "control " : "system ") + fmt(theirs) }) : null,
        el("div", { className: "bar" }, [el("span", { className: "bar-fill" })])
      ]);
      side.querySelector(".bar-fill").style.width = Math.min(100, 100 * (mine || 0) / scale).toFixed(1) + "%";
      view.appendChild(el("div", { className: "attn-row", id: "attn-turn-" + number }, [side, tokenLine(arm, kinds, levels, span[0], span[1], scale)]));
    });
    root.appendChild(view);
    section.hidden = false;
  }

  function attentionControls(data, index, state, rerender) {
    var form = clear(byId("attention-controls"));
    var entry = data.sources[state.source] || data.sources[0];
    var source = index.attention[entry.source];
    if (data.sources.length > 1) {
      form.appendChild(select("source", "Source", data.sources.map(function (s, i) { return [i, index.attention[s.source].name]; }), state.source));
    } else {
      form.appendChild(el("span", { className: "muted", text: source.name + " " }));
    }
    var arms = el("span", { className: "arms" }, [el("span", { text: "Arm " })]);
    [["system", "system message"], ["control", "as user (control)"]].forEach(function (pair) {
      var input = el("input", { type: "radio", name: "arm", value: pair[0], id: "arm-" + pair[0] });
      input.checked = state.arm === pair[0];
      input.disabled = !entry.arms[pair[0]];
      arms.appendChild(el("label", {}, [input, " " + pair[1] + " "]));
    });
    form.appendChild(arms);
    form.appendChild(select("layer", "Layer", source.layers.map(function (l) { return [l.label, l.label + " (" + l.index + ")"]; }), state.layer));
    form.appendChild(select("variant", "Value", [["excl", "share, lead excluded"], ["share", "share"]], state.variant));
    form.appendChild(select("scale", "Scale", [["auto", "largest in the replies"], ["one", "0 to 1"]], state.scale));
    form.onchange = function () {
      var checked = form.querySelector("input[name=arm]:checked");
      state.arm = checked ? checked.value : state.arm;
      state.layer = byId("f-layer").value;
      state.variant = byId("f-variant").value;
      state.scale = byId("f-scale").value;
      var sourceSelect = byId("f-source");
      if (sourceSelect && Number(sourceSelect.value) !== Number(state.source)) {
        state.source = Number(sourceSelect.value);
        rerender(true);
        return;
      }
      rerender(false);
    };
  }

  function initAttention(id, index, hash) {
    var data = (window[ATTENTION] || {})[String(id)];
    if (!data) return;
    var state = { source: Number(hash.source) || 0, arm: hash.arm || "system", layer: hash.layer || "",
      variant: hash.variant || "excl", scale: hash.scale || "auto" };
    function rerender(controlsToo) {
      var entry = data.sources[state.source] || data.sources[0];
      var source = index.attention[entry.source];
      if (!entry.arms[state.arm]) state.arm = entry.arms.system ? "system" : "control";
      if (!source.layers.some(function (l) { return l.label === state.layer; })) state.layer = source.layers[0].label;
      if (controlsToo) attentionControls(data, index, state, rerender);
      renderAttention(data, index, state);
    }
    rerender(true);
  }

  function links(hash) {
    // Previous and next session in id order, keeping the runs picked; back to the index with the same run.
    var index = window[INDEX];
    var position = index.order.indexOf(Number(hash.id));
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
    var id = hash.id;
    var row = index.sessions[String(id)];
    if (!row) { showError("no session " + id + " in this site"); return; }
    links(hash);
    document.title = "Session " + id + " · SysBench explorer";
    byId("title").textContent = "Session " + id;
    byId("meta").textContent = [row.domain, row.scene, row.group + " turns",
      "alignment " + row.alignment.split("").join(" ")].filter(Boolean).join(" · ");
    loadScript("data/sessions/" + Number(id) + ".js", function () {
      var detail = (window[SESSIONS] || {})[String(id)];
      if (!detail) { showError("data/sessions/" + id + ".js holds no session " + id); return; }
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
        links(hash);
        renderTurns(detail, picked, index.runs);
      });
      renderTurns(detail, shown, index.runs);
    }, function () { showError("could not load data/sessions/" + id + ".js"); });
    if (row.attention.length) {
      byId("to-attention").hidden = false;
      byId("to-attention").addEventListener("click", function (event) {
        event.preventDefault();  // the hash names the session
        byId("attention-section").scrollIntoView();
      });
      loadScript("data/attention/" + Number(id) + ".js", function () { initAttention(id, index, hash); },
        function () { showError("could not load data/attention/" + id + ".js"); });
    }
    window.addEventListener("hashchange", function () { location.reload(); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    try {
      if (document.body.dataset.page === "index") initIndex();
      else if (document.body.dataset.page === "session") initSession();
    } catch (error) {
      showError("explorer error: " + error.message);
      throw error;
    }
  });
})();
