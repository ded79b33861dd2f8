/*
 * Live console: ZooKeeper changes pushed over a websocket, applied with htmx.
 *
 * Elements that show queue state say which topics they show: data-live="jobs:state:Failed ...",
 * with extra page-wide topics in <body data-live-topics="...">. This script keeps one websocket
 * to /ws/live/ (under the console's URL prefix: <body data-live-socket>) subscribed to all of
 * them (again after every htmx swap). When topic T changes, every element with data-live~="T"
 * is sent the htmx event "live-refresh"; each element then refreshes itself with its own
 * hx-get / hx-select / hx-target / hx-trigger="live-refresh".
 *
 * An element the operator is working in is never replaced under their hands: while it holds a
 * focused text field or select, an open <dialog>, a checked selection box or a form that differs
 * from what was loaded, the refresh waits and is retried when they are done. Meanwhile the
 * element carries data-live-paused="why", which the stylesheet shows above it, so that nobody
 * takes a held view for the current one.
 *
 * A dropped socket reconnects with exponential back-off and jitter (capped at 30 s). The back-off
 * starts again from one second only once a socket has stayed live for STABLE_MS: a server that
 * opens sockets and closes them at once (its channel layer, Redis, unreachable: code 4503) is
 * asked less and less often, not every second. A socket counts as live when the server says
 * "hello"; the first hello after a drop catches the page up with one refresh of its live part
 * (pages have one), since changes may have been missed meanwhile; a socket that never got that
 * far refreshes nothing. ZooKeeper outages reported by the server show the #zk-banner; when
 * ZooKeeper is back the page catches up.
 */
(function () {
  "use strict";

  // Where the page says (under the console's URL prefix, if it is served under one).
  var PATH = document.body.getAttribute("data-live-socket") || "/ws/live/";
  var MAX_DELAY = 30000;
  var STABLE_MS = 30000;
  var RETRY_BUSY_MS = 2000;
  // Why a refresh waits, as the note above a held element says it ("loading" shows nothing).
  var PAUSED_BECAUSE = {
    focus: "you are typing here",
    dialog: "a dialog is open",
    selection: "rows are ticked",
    editing: "a form here is being edited",
  };
  var CLOSE_UNAUTHENTICATED = 4401;
  var CLOSE_FORBIDDEN = 4403;
  var CLOSE_LAYER_DOWN = 4503;

  var socket = null;
  var attempt = 0;
  var everLive = false; // a socket of this page has been live: a later one must catch up
  var reconnectTimer = null;
  var stableTimer = null;
  var stopped = false;
  var pending = new Set(); // ids (or elements without id) waiting for their refresh
  var queued = new Set(); // elements to refresh in the next flush (one refresh per burst)
  var flushTimer = null;
  var retryTimer = null;

  var subscribed = new Set(); // topics the current socket is subscribed to
  var confirmed = new Set(); // topics the server said it watches (its "subscribed" reply)
  var detailsOpen = new Map(); // <details> id -> open, kept across a refresh of its element

  function words(value) {
    return (value || "").split(/\s+/).filter(Boolean);
  }

  // What the page shows: the topics on <body> and those of every element listening for one.
  // Pages whose content changes (a refreshed table with other rows) change their topics too.
  function topics() {
    var all = new Set(words(document.body.getAttribute("data-live-topics")));
    document.querySelectorAll("[data-live]").forEach(function (el) {
      words(el.getAttribute("data-live")).forEach(function (t) {
        all.add(t);
      });
    });
    return all;
  }

  function syncTopics() {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    var wanted = topics();
    var add = Array.from(wanted).filter(function (t) {
      return !subscribed.has(t);
    });
    var drop = Array.from(subscribed).filter(function (t) {
      return !wanted.has(t);
    });
    if (add.length || drop.length) {
      send({ subscribe: add, unsubscribe: drop });
      subscribed = wanted;
    }
  }

  // ---- status: a small indicator and the ZooKeeper banner --------------------------------

  function indicator() {
    var el = document.getElementById("live-status");
    if (!el) {
      el = document.createElement("div");
      el.id = "live-status";
      el.setAttribute("role", "status");
      el.setAttribute("aria-live", "polite");
      // In the header, beside the user's name: a badge fixed over the page covered the last
      // columns of wide tables.
      var place = document.querySelector("header.top .who");
      el.style.cssText =
        "font:12px/1.4 system-ui,sans-serif;padding:.15rem .5rem;border-radius:1rem;" +
        "background:#eee;color:#333;margin-right:.6rem;display:inline-block";
      if (place) {
        place.insertBefore(el, place.firstChild);
      } else {
        el.style.position = "fixed";
        el.style.right = ".6rem";
        el.style.bottom = ".6rem";
        document.body.appendChild(el);
      }
    }
    return el;
  }

  function setStatus(state, text) {
    var el = indicator();
    el.setAttribute("data-state", state);
    el.textContent = text;
    el.style.background =
      state === "live" ? "#d9f2dc" : state === "offline" ? "#f7d4d4" : "#fbeec9";
    document.body.setAttribute("data-live-state", state);
  }

  // The corner indicator, always in sight, also says when part of the page is held back.
  function notePaused() {
    if (document.body.getAttribute("data-live-state") !== "live") return;
    indicator().textContent = pending.size ? "live \u00b7 updates paused" : "live";
  }

  function banner() {
    var el = document.getElementById("zk-banner");
    if (!el) {
      el = document.createElement("div");
      el.id = "zk-banner";
      var main = document.getElementById("main");
      document.body.insertBefore(el, main || document.body.firstChild);
    }
    return el;
  }

  function zkDown() {
    var el = banner();
    if (el.querySelector("[data-live-banner], .banner-down")) return;
    var p = document.createElement("p");
    p.className = "banner banner-down";
    p.setAttribute("role", "alert");
    p.setAttribute("data-live-banner", "");
    p.innerHTML =
      "<strong>\u26a0 ZooKeeper is unreachable.</strong> What you see may be out of date and " +
      "actions will fail until it is back; this page catches up by itself when it is.";
    el.hidden = false;
    el.appendChild(p);
  }

  function zkUp() {
    var el = banner();
    var p = el.querySelector("[data-live-banner]");
    if (p) p.remove();
    // The server-rendered notice (if any) refreshes itself when it listens for live-refresh.
    if (window.htmx && el.hasAttribute("hx-get")) window.htmx.trigger(el, "live-refresh");
  }

  // ---- refreshing elements -----------------------------------------------------------------

  function isTyping(el) {
    var tag = el.tagName;
    if (tag === "TEXTAREA" || tag === "SELECT" || el.isContentEditable) return true;
    if (tag !== "INPUT") return false;
    return !/^(button|submit|reset|checkbox|radio|image|hidden|range|color)$/i.test(el.type);
  }

  function formIsDirty(form) {
    for (var i = 0; i < form.elements.length; i++) {
      var c = form.elements[i];
      if (c.type === "checkbox" || c.type === "radio") {
        if (c.checked !== c.defaultChecked) return true;
      } else if (c.tagName === "SELECT") {
        for (var j = 0; j < c.options.length; j++) {
          if (c.options[j].selected !== c.options[j].defaultSelected) return true;
        }
      } else if ("defaultValue" in c && c.type !== "hidden" && c.value !== c.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function targetOf(el) {
    var spec = el.getAttribute("hx-target");
    if (spec && /^[#.]/.test(spec)) return document.querySelector(spec) || el;
    return el;
  }

  // Why an element must not be replaced right now; "" when it may.
  function busy(el) {
    var areas = [el];
    var target = targetOf(el);
    if (target !== el) areas.push(target);
    for (var i = 0; i < areas.length; i++) {
      var area = areas[i];
      var active = document.activeElement;
      if (active && active !== document.body && area.contains(active) && isTyping(active)) {
        return "focus";
      }
      if (area.querySelector("dialog[open]")) return "dialog";
      var boxes = area.querySelectorAll('input[type="checkbox"]');
      for (var b = 0; b < boxes.length; b++) {
        // Checked by the operator, not by the page: a selection for a bulk action.
        if (boxes[b].checked && !boxes[b].defaultChecked) return "selection";
      }
      var forms = area.tagName === "FORM" ? [area] : area.querySelectorAll("form");
      for (var k = 0; k < forms.length; k++) {
        if (formIsDirty(forms[k])) return "editing";
      }
      if (area.classList.contains("htmx-request")) return "loading";
    }
    return "";
  }

  function keyOf(el) {
    return el.id ? "#" + el.id : el;
  }

  function resolve(key) {
    if (typeof key === "string") return document.getElementById(key.slice(1));
    return document.contains(key) ? key : null;
  }

  function refresh(el) {
    if (!window.htmx) return;
    var why = busy(el);
    if (document.hidden || why) {
      if (PAUSED_BECAUSE[why]) el.setAttribute("data-live-paused", PAUSED_BECAUSE[why]);
      pending.add(keyOf(el));
      notePaused();
      scheduleRetry();
      return;
    }
    pending.delete(keyOf(el));
    notePaused();
    // The refresh is under way: the note goes (the swapped-in element has none either).
    el.removeAttribute("data-live-paused");
    // An operator's opened or closed <details> stays as they left it.
    var details = el.tagName === "DETAILS" ? [el] : [];
    details = details.concat(Array.from(el.querySelectorAll("details[id]")));
    details.forEach(function (d) {
      if (d.id) detailsOpen.set(d.id, d.open);
    });
    window.htmx.trigger(el, "live-refresh");
  }

  function flush() {
    flushTimer = null;
    var els = Array.from(queued);
    queued.clear();
    els.forEach(function (el) {
      if (document.contains(el)) refresh(el);
    });
  }

  function queue(els) {
    els.forEach(function (el) {
      queued.add(el);
    });
    // Several topics often change together (a move empties one state and fills another):
    // gather them so that an element listening to both refreshes once.
    if (!flushTimer) flushTimer = setTimeout(flush, 30);
  }

  function elementsFor(topic) {
    var safe = topic.replace(/["\\]/g, "");
    return Array.from(document.querySelectorAll('[data-live~="' + safe + '"]'));
  }

  function refreshTopic(topic) {
    queue(elementsFor(topic));
  }

  function refreshAll() {
    queue(Array.from(document.querySelectorAll("[data-live]")));
  }

  function retryPending() {
    retryTimer = null;
    var keys = Array.from(pending);
    pending.clear();
    var els = [];
    keys.forEach(function (key) {
      var el = resolve(key);
      if (el) els.push(el);
    });
    queue(els);
  }

  function scheduleRetry() {
    if (!retryTimer) retryTimer = setTimeout(retryPending, RETRY_BUSY_MS);
  }

  function retrySoon() {
    if (pending.size) {
      clearTimeout(retryTimer);
      retryTimer = setTimeout(retryPending, 50);
    }
  }

  // The operator finished: focus left, a dialog closed, a request ended, the tab came back.
  document.addEventListener("focusout", retrySoon);
  document.addEventListener("close", retrySoon, true);
  document.addEventListener("change", retrySoon);
  document.addEventListener("htmx:afterSettle", function () {
    detailsOpen.forEach(function (open, id) {
      var d = document.getElementById(id);
      if (d && d.tagName === "DETAILS") d.open = open;
    });
    detailsOpen.clear();
    retrySoon();
    syncTopics();
  });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      retrySoon();
      if (!socket && !reconnectTimer && !stopped) connect();
    }
  });

  // ---- the socket ---------------------------------------------------------------------------

  function url() {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + PATH;
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function onMessage(event) {
    var message;
    try {
      message = JSON.parse(event.data);
    } catch (e) {
      return;
    }
    switch (message.kind) {
      case "hello":
        live();
        if (message.zk === "down") zkDown();
        break;
      case "subscribed":
        confirmed = new Set(message.topics || []);
        break;
      case "changed":
        refreshTopic(message.topic);
        break;
      case "zk-down":
        zkDown();
        setStatus("reconnecting", "live \u00b7 ZooKeeper down");
        break;
      case "zk-up":
        zkUp();
        setStatus("live", "live");
        refreshAll();
        break;
      case "error":
        if (window.console) console.warn("live:", message.error, message.topic || "");
        break;
    }
  }

  function connect() {
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    if (stopped) return;
    var ws;
    try {
      ws = new WebSocket(url());
    } catch (e) {
      scheduleReconnect("reconnecting\u2026");
      return;
    }
    socket = ws;
    ws.onmessage = onMessage;
    ws.onclose = function (event) {
      if (socket === ws) socket = null;
      clearTimeout(stableTimer);
      stableTimer = null;
      if (event.code === CLOSE_UNAUTHENTICATED || event.code === CLOSE_FORBIDDEN) {
        stopped = true;
        setStatus("offline", "not live: sign in again");
        return;
      }
      scheduleReconnect(
        event.code === CLOSE_LAYER_DOWN
          ? "live updates unavailable, retrying\u2026"
          : "reconnecting\u2026"
      );
    };
  }

  // The server said hello: this socket is live.
  function live() {
    setStatus("live", "live");
    subscribed = new Set();
    confirmed = new Set();
    syncTopics();
    if (everLive) refreshAll();
    everLive = true;
    clearTimeout(stableTimer);
    stableTimer = setTimeout(function () {
      stableTimer = null;
      attempt = 0;
    }, STABLE_MS);
  }

  function scheduleReconnect(why) {
    if (reconnectTimer || stopped) return;
    var delay = Math.min(MAX_DELAY, 1000 * Math.pow(2, attempt));
    attempt += 1;
    delay = delay / 2 + Math.random() * (delay / 2); // jitter: tabs do not all come back at once
    setStatus("reconnecting", why);
    reconnectTimer = setTimeout(connect, delay);
  }

  // The network is back: one attempt now (the back-off goes on growing if it fails).
  window.addEventListener("online", function () {
    if (!socket && !stopped) connect();
  });

  // For tests and the curious: state() is "live", "reconnecting" or "offline".
  window.mrtLive = {
    state: function () {
      return document.body.getAttribute("data-live-state") || "connecting";
    },
    // True once the server has said it watches every topic the page shows: a change made
    // after that reaches the page. ("live" alone is said before the subscription is sent.)
    following: function () {
      if (document.body.getAttribute("data-live-state") !== "live") return false;
      return Array.from(topics()).every(function (t) {
        return confirmed.has(t);
      });
    },
    refreshAll: refreshAll,
    pending: function () {
      return pending.size; // refreshes waiting for the operator
    },
  };

  function start() {
    if (!("WebSocket" in window)) return;
    setStatus("connecting", "connecting\u2026");
    connect();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
