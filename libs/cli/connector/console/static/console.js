// connector console: progressive enhancement only — every page works without this file.
// Loaded from this origin (the Content-Security-Policy allows no inline script and no eval).
(function () {
  "use strict";

  // Theme: "auto" follows the system; the choice is kept in this browser only.
  var root = document.documentElement;
  function applyTheme(t) { if (t === "light" || t === "dark") root.dataset.theme = t; else delete root.dataset.theme; }
  try { applyTheme(localStorage.getItem("connector-console-theme")); } catch (e) { /* storage off */ }

  // htmx requests carry the session's CSRF token; live regions do not poll while the tab is hidden.
  document.addEventListener("htmx:configRequest", function (e) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) e.detail.headers["X-CSRF-Token"] = meta.content;
  });
  document.addEventListener("htmx:beforeRequest", function (e) {
    if (document.hidden && e.detail.elt && e.detail.elt.hasAttribute("data-live")) e.preventDefault();
  });

  function css(name) { return getComputedStyle(root).getPropertyValue(name).trim() || "#888"; }
  var KINDS = {
    rates: [["accepted", "--c1", "/s"], ["refused", "--c4", "/s"], ["executed", "--c2", "/s"], ["failed", "--c3", "/s"]],
    latency: [["ack_p99", "--c1", "s"], ["delivery_p95", "--c2", "s"], ["delay_p95", "--c3", "s"]],
    backlog: [["backlog", "--c2", ""], ["oldest_ready", "--c3", "s"]]
  };
  function draw(el) {
    if (el.dataset.drawn || typeof uPlot === "undefined") return;
    var d = JSON.parse(el.getAttribute("data-series") || "{}");
    var kind = KINDS[el.dataset.kind] || [];
    var data = [d.t || []], series = [{}];
    kind.forEach(function (k) {
      data.push(d[k[0]] || []);
      series.push({ label: k[0].replace("_", " "), stroke: css(k[1]), width: 1.5, spanGaps: false,
        value: function (u, v) { return v == null ? "–" : (Math.round(v * 1000) / 1000) + k[2]; } });
    });
    el.dataset.drawn = "1";
    var axis = { stroke: css("--muted"), grid: { stroke: css("--line"), width: 1 }, ticks: { stroke: css("--line") } };
    new uPlot({ width: Math.max(280, Math.min(el.clientWidth || 600, 1200)), height: 200, series: series,
      axes: [axis, Object.assign({}, axis)], cursor: { drag: { x: false, y: false } } }, data, el);
  }
  function drawAll(scope) { (scope || document).querySelectorAll(".chart[data-series]").forEach(draw); }

  document.addEventListener("DOMContentLoaded", function () {
    drawAll(document);
    var toggle = document.getElementById("theme");
    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () {
        var next = root.dataset.theme === "dark" ? "light" : root.dataset.theme === "light" ? "auto" : "dark";
        applyTheme(next);
        toggle.textContent = "Theme: " + next;
        try { localStorage.setItem("connector-console-theme", next); } catch (e) { /* storage off */ }
        document.querySelectorAll(".chart[data-drawn]").forEach(function (c) { c.textContent = ""; delete c.dataset.drawn; draw(c); });
      });
      toggle.textContent = "Theme: " + (root.dataset.theme || "auto");
    }
    // Destructive forms ask first, naming what they do (the button's text says the count).
    document.querySelectorAll("form[data-confirm]").forEach(function (f) {
      f.addEventListener("submit", function (e) { if (!window.confirm(f.getAttribute("data-confirm"))) e.preventDefault(); });
    });
  });
  document.addEventListener("htmx:afterSettle", function (e) { drawAll(e.target.parentNode || document); });
})();
