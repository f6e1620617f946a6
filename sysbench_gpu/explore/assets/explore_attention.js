/* SysBench explorer: a session's tokens coloured by their attention to the system text. */
(function () {
  "use strict";
  var X = window.SysbenchExplore;
  var el = X.el;
  var byId = X.byId;
  var clear = X.clear;
  var select = X.select;
  var ATTENTION = X.ATTENTION;

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

  // Knockout (attention --knockout): Δ mean log p of the reply with the system text's keys hidden.
  function knockoutLine(entry, armName, number) {
    var row = entry.knockout && entry.knockout[armName] && entry.knockout[armName][String(number)];
    if (!row) return null;
    return el("div", { className: "knockout", dataset: { delta: row.delta },
      title: "mean log p per reply token: plain " + fmt(row.logp_plain) + ", knocked out " + fmt(row.logp_knockout),
      text: "knockout Δ log p " + (row.delta > 0 ? "+" : "") + fmt(row.delta) });
  }

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
        knockoutLine(entry, armName, number),
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

  X.initAttention = initAttention;
})();
