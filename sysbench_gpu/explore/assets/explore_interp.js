/* SysBench explorer: the index page's "Heads, failure probe, decay" section (index.interp), from the files
 * `sysbench-gpu attention-analyze` wrote in each attention folder. Hidden when no folder has them. */
(function () {
  "use strict";
  var X = window.SysbenchExplore;
  var el = X.el;
  var byId = X.byId;

  function num(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }

  function interval(pair, digits) {
    return pair && pair[0] !== null && pair[1] !== null ? " [" + num(pair[0], digits) + ", " + num(pair[1], digits) + "]" : "";
  }

  function table(head, rows) {
    return el("table", { className: "grid" }, [
      el("thead", {}, [el("tr", {}, head.map(function (h) { return el("th", { text: h }); }))]),
      el("tbody", {}, rows.map(function (row) {
        return el("tr", {}, row.map(function (cell) { return el("td", { text: cell }); }));
      }))
    ]);
  }

  function probeText(probe) {
    if (!probe) return null;
    if (probe.status !== "ok") return "Failure probe: " + probe.reason + ".";
    return "Failure probe, cross-validated AUC (folds grouped by session): per-head shares " + num(probe.probe.auc, 3) +
      interval(probe.probe.ci95, 3) + "; baseline (turn, reply length) " + num(probe.baseline.auc, 3) +
      interval(probe.baseline.ci95, 3) + ", over " + probe.n_turns + " turns.";
  }

  function entryNode(entry) {
    var parts = [el("h3", { text: entry.name })];
    if (entry.top_heads) {
      parts.push(el("p", { className: "muted", text: "Heads: " + (entry.criterion || "") }));
      parts.push(table(["layer", "head", "r", "95% CI", "q", "mean share"], entry.top_heads.map(function (h) {
        return [String(h.layer), String(h.head), num(h.r, 3), interval(h.ci95, 3), num(h.q, 3), num(h.mean_share, 4)];
      })));
    }
    var probe = probeText(entry.probe);
    if (probe) parts.push(el("p", { text: probe }));
    if (entry.decay) {
      parts.push(el("p", { className: "muted", text: "Decay: slope of the system share per turn and per log2 distance bin (95% session-bootstrap CI)." }));
      parts.push(table(["history", "condition", "layer", "per turn", "per distance bin"], entry.decay.map(function (d) {
        return [d.history, d.condition, d.layer, num(d.turn_slope, 4) + interval(d.turn_ci95, 4),
          num(d.distance_slope, 4) + interval(d.distance_ci95, 4)];
      })));
    }
    entry.figures.forEach(function (path) {
      parts.push(el("img", { src: path, alt: path, className: "figure" }));
    });
    return el("div", { className: "interp" }, parts);
  }

  function initInterp() {
    var index = window[X.INDEX];
    var box = byId("interp");
    if (!index || !box || !index.interp || !index.interp.length) return;
    box.hidden = false;
    index.interp.forEach(function (entry) { box.appendChild(entryNode(entry)); });
  }

  document.addEventListener("DOMContentLoaded", initInterp);
})();
