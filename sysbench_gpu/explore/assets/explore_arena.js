/* The arena page: the leaderboard, then one session's battles with both replies side by side.
   Every text is put into the page with textContent, never as HTML. */
(function () {
  "use strict";
  var INDEX = window.SYSBENCH_ARENA_INDEX;
  var SESSIONS = "SYSBENCH_ARENA_SESSIONS";
  var SHOWN = 60; // battles drawn at once; the filters narrow the rest

  function byId(id) { return document.getElementById(id); }
  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function showError(text) { var node = byId("error"); node.textContent = text; node.hidden = false; }
  function model(i) { var run = INDEX.runs[i]; return run ? (run.label || run.model || run.run) : "run " + i; }
  function fmt(value) { return value === null || value === undefined ? "-" : Number(value).toFixed(0); }

  function ratings() {
    var table = byId("ratings");
    var head = el("tr");
    ["#", "Model", "Rating", "95% CI", "Battles", "W / T / L", "Online Elo"].forEach(function (name, i) {
      head.appendChild(el("th", i > 1 ? "num" : "", name));
    });
    table.appendChild(head);
    INDEX.ratings.forEach(function (row, rank) {
      var tr = el("tr");
      tr.appendChild(el("td", "num", rank + 1));
      tr.appendChild(el("td", "", row.label || row.model));
      var rating = el("td", "num", row.rating === null ? "unrated" : fmt(row.rating));
      if (row.unrated) rating.title = row.unrated;
      tr.appendChild(rating);
      tr.appendChild(el("td", "num", row.ci ? "[" + fmt(row.ci[0]) + ", " + fmt(row.ci[1]) + "]" : "-"));
      tr.appendChild(el("td", "num", row.battles));
      tr.appendChild(el("td", "num", row.wins + " / " + row.ties + " / " + row.losses));
      tr.appendChild(el("td", "num", fmt(row.online_elo)));
      table.appendChild(tr);
    });
    var fit = INDEX.fit || {};
    var meta = (fit.battles || 0) + " battles decided by " + (fit.by || "?") + " (" + (fit.mode || "?") + ")";
    if (INDEX.consistency && INDEX.consistency.rate !== null) {
      meta += "; judge position consistency " + (100 * INDEX.consistency.rate).toFixed(1) + "%";
    }
    if (fit.resamples_failed) {
      meta += "; " + fit.resamples_failed + " of " + fit.resamples + " resamples had no finite fit (left out of the CIs)";
    }
    INDEX.ratings.forEach(function (row) {
      if (row.unrated) meta += "; unrated: " + (row.label || row.model) + " (" + row.unrated + ")";
    });
    byId("meta").textContent = meta;
  }

  function outcomeOf(battle) {
    var winners = battle.records.filter(function (r) { return r.status === "ok"; }).map(function (r) { return r.winner; });
    if (!winners.length) return "unparsed";
    if (winners.length === 2 && winners[0] !== winners[1]) return "split";
    return winners[0];
  }

  function verdictLine(battle, record) {
    var line = el("div", "reply");
    var who = record.winner === "a" ? model(battle.a) : record.winner === "b" ? model(battle.b) : "tie";
    var head = record.by === "judge"
      ? "order " + record.order + " (" + model(record.order === "ab" ? battle.a : battle.b) + " shown as A): judge said "
        + (record.answer || "nothing usable") + " → " + (record.status === "ok" ? who : "unparsed")
      : "verdicts: " + who;
    line.appendChild(el("span", "verdict " + (record.winner === "tie" ? "v-other" : "v-yes"), head));
    if (record.reason) line.appendChild(el("div", "text muted", record.reason));
    return line;
  }

  function drawBattles(detail) {
    var box = byId("battles");
    box.textContent = "";
    var pair = byId("pair").value;
    var outcome = byId("outcome").value;
    var chosen = detail.battles.filter(function (b) {
      return (!pair || pair === b.a + "-" + b.b) && (!outcome || outcomeOf(b) === outcome);
    });
    byId("count").textContent = chosen.length + " battle(s)" + (chosen.length > SHOWN ? "; the first " + SHOWN + " shown" : "");
    chosen.slice(0, SHOWN).forEach(function (battle) {
      var article = el("article", "turn");
      var result = outcomeOf(battle);
      var label = result === "a" ? model(battle.a) + " wins" : result === "b" ? model(battle.b) + " wins" : result;
      article.appendChild(el("h3", "", "Turn " + battle.turn + " · " + model(battle.a) + " vs " + model(battle.b) + " · " + label));
      article.appendChild(el("div", "label", "User"));
      article.appendChild(el("div", "text block", detail.turns[String(battle.turn)] || ""));
      var cols = el("div", "replies cols-2");
      [battle.a, battle.b].forEach(function (i) {
        var card = el("div", "card");
        card.appendChild(el("div", "card-head", model(i)));
        var replies = detail.replies[String(i)] || {};
        card.appendChild(el("div", "text", replies[String(battle.turn)] || "(no reply)"));
        cols.appendChild(card);
      });
      article.appendChild(cols);
      battle.records.forEach(function (record) { article.appendChild(verdictLine(battle, record)); });
      box.appendChild(article);
    });
  }

  function loadSession() {
    var id = byId("session").value;
    if (!id) return;
    var detail = (window[SESSIONS] || {})[id];
    if (detail) { drawBattles(detail); return; }
    var script = document.createElement("script");
    script.src = "data/arena/s" + id + ".js";
    script.onload = function () {
      var loaded = (window[SESSIONS] || {})[id];
      if (!loaded) { showError("data/arena/s" + id + ".js holds no session " + id); return; }
      drawBattles(loaded);
    };
    script.onerror = function () { showError("cannot read data/arena/s" + id + ".js"); };
    document.head.appendChild(script);
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!INDEX) { showError("data/arena/index.js is missing: run sysbench-gpu explore --arena ARENA_DIR --out SITE"); return; }
    byId("title").textContent = INDEX.title;
    ratings();
    var sessions = byId("session");
    INDEX.sessions.forEach(function (id) { sessions.appendChild(el("option", "", id)).value = String(id); });
    var pairs = byId("pair");
    pairs.appendChild(el("option", "", "every pair")).value = "";
    INDEX.pairs.forEach(function (pair) {
      pairs.appendChild(el("option", "", model(pair[0]) + " vs " + model(pair[1]))).value = pair[0] + "-" + pair[1];
    });
    ["session", "pair", "outcome"].forEach(function (id) { byId(id).addEventListener("change", loadSession); });
    loadSession();
  });
})();
