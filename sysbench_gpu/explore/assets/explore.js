/* SysBench explorer: the index and session pages. No framework, no network.
 * Data arrive as scripts that assign to globals (data/index.js, data/sessions/<key>.js,
 * data/attention/<key>.js; a session's key is <benchmark>-<system_id>). Every text from a run goes
 * into the page through text nodes (textContent), never as HTML: model replies and judge reasoning
 * are untrusted. What differs between benchmarks comes from the data (index.benchmarks: the layout
 * of each benchmark's runs and sessions); the pages never ask which benchmark a run is. */
(function () {
  "use strict";

  var INDEX = "SYSBENCH_EXPLORE_INDEX";
  var SESSIONS = "SYSBENCH_EXPLORE_SESSIONS";
  var ATTENTION = "SYSBENCH_EXPLORE_ATTENTION";

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

  function score(value) { return value === null || value === undefined ? "–" : Number(value).toFixed(2); }

  function shortNumber(value) { return value === null || value === undefined ? "–" : String(Math.round(value * 100) / 100); }

  function scoreCi(pair) { return pair ? "[" + score(pair[0]) + ", " + score(pair[1]) + "]" : ""; }

  function capital(text) { return text ? text.charAt(0).toUpperCase() + text.slice(1) : ""; }

  function sessionRow(index, key) {
    // A session by its key; an address from before keys named the benchmark (#id=12) finds the one session 12.
    var row = index.sessions[String(key)];
    if (row || !/^[0-9]+$/.test(String(key))) return row || null;
    var found = index.order.filter(function (k) { return index.sessions[k].id === Number(key); });
    return found.length === 1 ? index.sessions[found[0]] : null;
  }

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

  // ------------------------------------------------------------ pages

  // The page scripts (explore_index.js, explore_session.js, explore_attention.js) take these helpers
  // from here and register their page; the one named by <body data-page> runs once the document is read.
  window.SysbenchExplore = {
    INDEX: INDEX, SESSIONS: SESSIONS, ATTENTION: ATTENTION,
    el: el, byId: byId, clear: clear, pct: pct, ci: ci, score: score, scoreCi: scoreCi, shortNumber: shortNumber, capital: capital,
    sessionRow: sessionRow, showError: showError, hashParams: hashParams,
    toHash: toHash, loadScript: loadScript, verdictChip: verdictChip, select: select, pages: {}
  };

  document.addEventListener("DOMContentLoaded", function () {
    var page = window.SysbenchExplore.pages[document.body.dataset.page];
    try {
      if (page) page();
    } catch (error) {
      showError("explorer error: " + error.message);
      throw error;
    }
  });
})();
