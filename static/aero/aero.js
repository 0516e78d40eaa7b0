/* AERO page behaviour. Everything here is progressive enhancement: pages work without it. */
(function () {
  "use strict";

  function lastSeq() {
    var items = document.querySelectorAll("#timeline-list > li[data-seq]");
    return items.length ? items[items.length - 1].getAttribute("data-seq") : null;
  }

  // The timeline opens on its newest entry (the list scrolls; the page does not jump).
  function showNewest() {
    var list = document.getElementById("timeline-list");
    if (list) { list.scrollTop = list.scrollHeight; }
  }

  function install() {
    showNewest();
    if (!window.htmx) { return; }
    // The ws extension reconnects to the URL it was given; ask for what we have not seen
    // yet instead, so a reconnect neither repeats nor loses events.
    htmx.createWebSocket = function (url) {
      var target = new URL(url, window.location.href);
      var seq = lastSeq();
      if (seq !== null) { target.searchParams.set("last_seq", seq); }
      var composer = document.getElementById("session-composer");
      if (composer) { target.searchParams.set("composer", composer.getAttribute("data-key") || ""); }
      return new WebSocket(target.toString(), []);
    };
    // A pushed fragment may replace a form someone is typing in (a reason for a
    // decision): keep what was typed across the swap.
    var kept = {};
    document.body.addEventListener("htmx:wsBeforeMessage", function () {
      kept = {};
      document.querySelectorAll("input[data-keep]").forEach(function (el) {
        if (el.id && el.value) { kept[el.id] = el.value; }
      });
    });
    document.body.addEventListener("htmx:wsAfterMessage", function () {
      Object.keys(kept).forEach(function (id) {
        var el = document.getElementById(id);
        if (el && !el.value) { el.value = kept[id]; }
      });
      showNewest();
    });
  }

  // Behaviour that would otherwise be an inline handler (the Content Security Policy
  // allows none): a select that submits its form on change, a form that asks first.
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el instanceof HTMLSelectElement && el.hasAttribute("data-autosubmit") && el.form) {
      el.form.submit();
    }
  });
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.hasAttribute("data-confirm") &&
        !window.confirm(form.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });

  // Deadlines count down in place; the server-rendered text stands without JS.
  function tickDeadlines() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var deadline = Date.parse(el.getAttribute("data-deadline"));
      if (isNaN(deadline)) { return; }
      var minutes = Math.max(0, Math.round((deadline - now) / 60000));
      // The words come from the page (data-left / data-passed, translated there); "{minutes}"
      // stands for the minutes.
      var left = el.getAttribute("data-left") || "times out in {minutes} min";
      var passed = el.getAttribute("data-passed") || "deadline passed: becoming a manual to-do";
      el.textContent = minutes > 0 ? left.replace("{minutes}", minutes) : passed;
    });
  }
  setInterval(tickDeadlines, 30000);

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", install);
  } else {
    install();
  }
})();
