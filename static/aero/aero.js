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

  var sockets = {};  // each live region's socket by its path: a held message goes back to it
  var pressed = false, replaying = false, held = [], pressTimer = null;
  var HOLD_MS = 3000;

  function replayHeld() {
    var messages = held;
    held = [];
    document.body.removeAttribute("data-live-held");
    replaying = true;
    try {
      messages.forEach(function (item) {
        var socket = sockets[item.path];
        // Through the socket's own listeners: the ws extension swaps it as it came.
        if (socket) { socket.dispatchEvent(new MessageEvent("message", {data: item.message})); }
      });
    } finally {
      replaying = false;
    }
  }
  function pressStart(event) {
    var el = event.target;
    if (!(el instanceof Element) || !el.closest("button, input[type=submit], a[href], summary, label")) { return; }
    if (event.type === "keydown" && event.key !== " ") { return; }  // Enter clicks on keydown
    pressed = true;
    clearTimeout(pressTimer);
    pressTimer = setTimeout(pressEnd, HOLD_MS);
  }
  function pressEnd(event) {
    if (!pressed || (event && event.type === "keyup" && event.key !== " ")) { return; }
    clearTimeout(pressTimer);
    // The click is dispatched right after the release, before this timer fires.
    setTimeout(function () { pressed = false; replayHeld(); }, 0);
  }
  document.addEventListener("pointerdown", pressStart, true);
  document.addEventListener("keydown", pressStart, true);
  ["pointerup", "pointercancel", "keyup"].forEach(function (type) {
    document.addEventListener(type, pressEnd, true);
  });
  window.addEventListener("blur", pressEnd);

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
      var socket = new WebSocket(target.toString(), []);
      sockets[target.pathname] = socket;
      return socket;
    };
    // A click is a press and a release on the same element. A pushed fragment that
    // replaced the button in between (an approver pressing "Approve" as someone else's
    // decision re-rendered the actions) swallowed the click: nothing was decided. While
    // a press on a control lasts, pushed messages wait; once the release's click has
    // run, they are applied in the order they came. A press held longer than a click
    // (a drag, a pointer that left the window) lets them through after HOLD_MS.
    document.body.addEventListener("htmx:wsBeforeMessage", function (event) {
      if (!pressed || replaying) { return; }
      var source = event.target instanceof Element && event.target.getAttribute("ws-connect");
      if (!source) { return; }
      event.preventDefault();
      held.push({path: new URL(source, window.location.href).pathname, message: event.detail.message});
      document.body.setAttribute("data-live-held", String(held.length));
    });
    // A pushed fragment may replace a form someone is working in (a reason for a
    // decision, an argument edit): keep what was typed, which editor was open and where
    // the caret was across the swap, so a live update never costs an approver their work.
    var kept = {}, opened = [], states = {}, focused = null;
    document.body.addEventListener("htmx:wsBeforeMessage", function () {
      kept = {};
      document.querySelectorAll("input[data-keep], textarea[data-keep]").forEach(function (el) {
        if (el.id && el.value !== el.defaultValue) { kept[el.id] = el.value; }
      });
      opened = [];
      document.querySelectorAll("details[data-keep-open][open]").forEach(function (el) {
        if (el.id) { opened.push(el.id); }
      });
      // Collapsible panels (the agent tree) stay as the viewer left them, open or closed.
      states = {};
      document.querySelectorAll("details[data-keep-state]").forEach(function (el) {
        if (el.id) { states[el.id] = el.open; }
      });
      var active = document.activeElement;
      focused = active && active.id && active.hasAttribute("data-keep")
        ? {id: active.id, start: active.selectionStart, end: active.selectionEnd} : null;
    });
    document.body.addEventListener("htmx:wsAfterMessage", function () {
      opened.forEach(function (id) {
        var el = document.getElementById(id);
        if (el) { el.open = true; }
      });
      Object.keys(states).forEach(function (id) {
        var el = document.getElementById(id);
        if (el && el.hasAttribute("data-keep-state")) { el.open = states[id]; }
      });
      restoreTyped();
      showNewest();
    });
    // An editor the queue loads when it opens (reopened above) arrives after the push:
    // what was typed in it is put back when it does.
    document.body.addEventListener("htmx:afterSwap", restoreTyped);

    function restoreTyped() {
      Object.keys(kept).forEach(function (id) {
        var el = document.getElementById(id);
        if (el) {
          if (el.value === el.defaultValue) { el.value = kept[id]; }
          delete kept[id];
        }
      });
      if (focused) {
        var el = document.getElementById(focused.id);
        if (el) {
          if (document.activeElement !== el) {
            el.focus();
            try { el.setSelectionRange(focused.start, focused.end); } catch (e) { /* not a text input */ }
          }
          focused = null;
        }
      }
    }
  }

  // Behaviour that would otherwise be an inline handler (the Content Security Policy
  // allows none): a select that submits its form on change, a form that asks first.
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el instanceof HTMLSelectElement && el.hasAttribute("data-autosubmit") && el.form) {
      el.form.submit();
    }
  });
  // A pushed fragment is rendered once for every viewer, so its plain forms carry no
  // CSRF token of their own: take the page's (set once on <body hx-headers>).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || (form.method || "").toLowerCase() !== "post") { return; }
    if (form.querySelector("input[name=csrfmiddlewaretoken]")) { return; }
    try {
      var token = JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"];
      if (token) {
        var input = document.createElement("input");
        input.type = "hidden";
        input.name = "csrfmiddlewaretoken";
        input.value = token;
        form.appendChild(input);
      }
    } catch (e) { /* no token on the page: the server refuses the post, as it should */ }
  }, true);
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.hasAttribute("data-confirm") &&
        !window.confirm(form.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });

  // Deadlines count down in place, in seconds near the end and red in the last minute;
  // the server-rendered text (translated, in the data attributes) stands without JS.
  function tickDeadlines() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var deadline = Date.parse(el.getAttribute("data-deadline"));
      if (isNaN(deadline)) { return; }
      var seconds = Math.max(0, Math.floor((deadline - now) / 1000));
      // The words come from the page (translated there): data-text-min / data-text-sec /
      // data-text-over with "{n}" for the number (approvals/_deadline.html); an element
      // with the older data-left / data-passed ("{minutes}") still counts in minutes.
      var text;
      if (!el.hasAttribute("data-text-min") && el.hasAttribute("data-left")) {
        var minutes = Math.max(0, Math.round((deadline - now) / 60000));
        text = minutes > 0 ? el.getAttribute("data-left").replace("{minutes}", String(minutes))
                           : (el.getAttribute("data-passed") || "");
      } else if (seconds > 120) {
        text = (el.getAttribute("data-text-min") || "{n} min").replace("{n}", String(Math.ceil(seconds / 60)));
      } else if (seconds > 0) {
        text = (el.getAttribute("data-text-sec") || "{n} s").replace("{n}", String(seconds));
      } else {
        text = el.getAttribute("data-text-over") || "";
      }
      el.textContent = text;
      el.classList.toggle("deadline-urgent", seconds <= 60);
    });
  }
  setInterval(tickDeadlines, 1000);

  // The open count of a pushed queue goes into the nav badge and the tab title.
  function showPendingCount() {
    var queue = document.getElementById("approval-queue");
    if (!queue || !queue.hasAttribute("data-open")) { return; }
    var count = parseInt(queue.getAttribute("data-open"), 10) || 0;
    var title = document.title.replace(/^\(\d+\) /, "");
    document.title = count > 0 ? "(" + count + ") " + title : title;
    var badge = document.querySelector("[data-testid=pending-count]");
    if (badge) { badge.textContent = String(count); badge.hidden = count === 0; }
  }

  // Optional: a browser notification and a short sound for each new R2/R3 request. Off
  // until the approver turns it on (the browser asks for permission then); the choice is
  // stored on their preference, so it follows them.
  var seenRisky = null;
  function notifyToggle() { return document.querySelector("[data-notify-toggle]"); }
  function riskyIds() {
    var ids = {};
    document.querySelectorAll("#approval-queue article[data-risk=R2], #approval-queue article[data-risk=R3]").forEach(function (el) {
      ids[el.getAttribute("data-approval")] = el;
    });
    return ids;
  }
  function notifyNewRisky() {
    var current = riskyIds();
    var previous = seenRisky;
    seenRisky = current;
    var toggle = notifyToggle();
    if (previous === null || !toggle || toggle.getAttribute("data-notify") !== "on") { return; }
    var fresh = Object.keys(current).filter(function (id) { return !(id in previous); });
    if (!fresh.length) { return; }
    if (window.Notification && Notification.permission === "granted") {
      fresh.forEach(function (id) {
        var el = current[id];
        new Notification(el.getAttribute("data-risk") + " · " + el.getAttribute("data-tool"), {tag: "aero-" + id});
      });
    }
    var sound = toggle.getAttribute("data-notify-sound");
    if (sound) {
      try {
        var played = new Audio(sound).play();
        if (played && played.catch) { played.catch(function () { /* autoplay refused: the notification is enough */ }); }
      } catch (e) { /* no audio: the notification is enough */ }
    }
  }
  function setUpNotifyToggle() {
    var toggle = notifyToggle();
    var enable = toggle && toggle.querySelector("[data-notify-enable]");
    if (!enable || !window.Notification || Notification.permission !== "default") { return; }
    // Ask for the permission on the approver's click, then store the choice.
    var asked = false;
    toggle.addEventListener("submit", function (event) {
      if (asked || event.submitter !== enable) { return; }
      event.preventDefault();
      asked = true;
      var send = function () { toggle.requestSubmit(enable); };
      Promise.resolve(Notification.requestPermission()).then(send, send);
    });
  }

  // A request whose sign-in ran out gets a 401 (aero/drafts.py), never the sign-in page
  // inside the form's target: say so next to the form, whose text stays as typed.
  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail.xhr;
    if (!xhr || xhr.status !== 401) { return; }
    var form = evt.detail.elt.closest("form") || evt.detail.elt;
    var note = form.parentNode && form.parentNode.querySelector(".signed-out");
    if (!note) {
      note = document.createElement("p");
      note.className = "error signed-out";
      note.setAttribute("role", "alert");
      note.setAttribute("data-testid", "signed-out");
      form.parentNode.insertBefore(note, form);
    }
    note.textContent = document.body.getAttribute("data-signed-out") || "Signed out.";
    var link = document.createElement("a");
    link.href = document.body.getAttribute("data-login-url") || "/";
    link.textContent = document.body.getAttribute("data-sign-in") || "Sign in";
    note.appendChild(document.createTextNode(" "));
    note.appendChild(link);
  });

  function afterSwap() {
    tickDeadlines();
    showPendingCount();
    notifyNewRisky();
  }
  document.addEventListener("DOMContentLoaded", function () {
    seenRisky = riskyIds();
    setUpNotifyToggle();
    tickDeadlines();
  });
  document.addEventListener("htmx:afterSettle", afterSwap);
  document.addEventListener("htmx:wsAfterMessage", afterSwap);

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", install);
  } else {
    install();
  }
})();
