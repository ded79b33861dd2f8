/*
 * Small page behaviours that would otherwise be inline script, which the console's
 * Content-Security-Policy forbids. Loaded on every page, logged in or not.
 *
 * <a data-back href="/fallback/">: goes back in the tab's history when there is any,
 * else follows its href.
 * "/" anywhere but in a field focuses the header's search box (#header-q).
 * #toggle-admin-moves (overview): shows or hides the diagrams' dashed operator moves, by a
 * class on <html> that live refreshes do not touch; the choice is kept in localStorage.
 * <span data-countdown="ISO time">: the time left until then (a maintenance window's end),
 * ticking each second, "ended" once it has passed; the server's words stay until then.
 * #zk-banner: an answer that shows the outages already shown (its poll every 20 s, the banner
 * sent with each 503 while the database is away) leaves the banner as it is, so that its
 * role="alert" notice is said once an outage, not again at every poll.
 * Keyboard focus across htmx swaps: a swap that replaces the focused element (an action's
 * button in the row or panel it swaps, a live refresh of a table) would drop the focus on
 * <body>, the top of the page. The focus goes back to the same control if the new content has
 * it, else to the nearest of its former containers with an id still on the page (focusable
 * for the purpose, tabindex="-1"): the action's row, the job's actions, the table.
 * Escape in an open long message (<details class="msg">) closes it, the focus on its summary.
 */
(function () {
  "use strict";

  var ADMIN_MOVES_KEY = "mrt-console.hide-admin-moves";

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a[data-back]");
    if (!link || event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    if (window.history.length > 1) {
      event.preventDefault();
      window.history.back();
    }
  });

  function typing(target) {
    if (!target || !target.tagName) return false;
    var tag = target.tagName.toLowerCase();
    if (tag === "input") {
      // A checkbox, radio or button takes no "/": the search still answers there.
      return !/^(button|submit|reset|checkbox|radio|image|hidden|range|color)$/i.test(target.type);
    }
    return tag === "textarea" || tag === "select" || target.isContentEditable;
  }

  // What a banner says is down: "zookeeper", "database", in page order ("" when nothing is).
  function outagesShown(root) {
    var found = [];
    var notices = root ? root.querySelectorAll(".banner-down") : [];
    for (var i = 0; i < notices.length; i++) {
      found.push(notices[i].getAttribute("data-outage") || "zookeeper");
    }
    return found.join(" ");
  }

  function keepBannerIfSame(incoming, detail) {
    var current = document.getElementById("zk-banner");
    if (!current || !incoming) return;
    var shown = outagesShown(current);
    if (shown && shown === outagesShown(incoming)) detail.shouldSwap = false;
  }

  // The poll's own answer (it swaps #zk-banner whole).
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (!target || target.id !== "zk-banner" || !event.detail.serverResponse) return;
    var answer = document.createElement("template");
    answer.innerHTML = event.detail.serverResponse;
    keepBannerIfSame(answer.content.getElementById("zk-banner"), event.detail);
  });
  // The banner sent out of band with another request's 503.
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target;
    if (!target || target.id !== "zk-banner" || !event.detail.fragment) return;
    var fragment = event.detail.fragment;
    var incoming = fragment.getElementById ? fragment.getElementById("zk-banner") : null;
    keepBannerIfSame(incoming || fragment, event.detail);
  });

  // ---- keyboard focus across htmx swaps ------------------------------------------------------

  var FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";
  var focusKept = null;

  // What tells a control from its neighbours when its element is new: tag, name, type,
  // target and words.
  function signature(el) {
    return [
      el.tagName,
      el.getAttribute("name") || "",
      el.getAttribute("type") || "",
      el.getAttribute("href") || "",
      (el.textContent || "").trim(),
    ].join("\u0001");
  }

  function canFocus(el) {
    return !!el && !el.disabled && el.getClientRects().length > 0 && !el.closest("[inert]");
  }

  function alike(region, sig) {
    return Array.prototype.filter.call(region.querySelectorAll(FOCUSABLE), function (c) {
      return signature(c) === sig;
    });
  }

  function noteFocus(region) {
    var active = document.activeElement;
    if (!region || !active || active === document.body || !region.contains(active)) return;
    var sig = signature(active);
    var places = [];
    for (var el = active.parentElement; el && el !== document.body; el = el.parentElement) {
      if (el.id) places.push({ id: el.id, nth: alike(el, sig).indexOf(active) });
    }
    focusKept = { id: active.id, sig: sig, places: places };
  }

  function restoreFocus() {
    var kept = focusKept;
    focusKept = null;
    var active = document.activeElement;
    if (!kept || (active && active !== document.body && document.contains(active))) return;
    var same = kept.id ? document.getElementById(kept.id) : null;
    if (canFocus(same)) {
      same.focus({ preventScroll: true });
      return;
    }
    for (var i = 0; i < kept.places.length; i++) {
      var region = document.getElementById(kept.places[i].id);
      if (!region) continue;
      var found = alike(region, kept.sig).filter(canFocus);
      var control = found[Math.max(kept.places[i].nth, 0)] || found[0];
      if (control) {
        control.focus({ preventScroll: true });
        return;
      }
      if (!region.matches(FOCUSABLE)) region.setAttribute("tabindex", "-1");
      if (canFocus(region)) {
        region.focus();
        return;
      }
    }
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    if (event.detail.shouldSwap) noteFocus(event.detail.target);
  });
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    if (event.detail.shouldSwap !== false) noteFocus(event.detail.target);
  });
  document.addEventListener("htmx:afterSettle", restoreFocus);

  // ---- Escape closes a long message ----------------------------------------------------------

  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape" || event.defaultPrevented) return;
    var open = event.target.closest && event.target.closest("details.msg[open]");
    if (!open) return;
    event.preventDefault();
    open.open = false;
    var summary = open.querySelector("summary");
    if (summary) summary.focus();
  });

  document.addEventListener("keydown", function (event) {
    if (event.key !== "/" || event.metaKey || event.ctrlKey || event.altKey) return;
    if (event.defaultPrevented || typing(event.target)) return;
    var box = document.getElementById("header-q");
    if (!box) return;
    event.preventDefault();
    box.focus();
    box.select();
  });

  function stored() {
    try {
      return window.localStorage.getItem(ADMIN_MOVES_KEY) === "1";
    } catch (e) {
      return false;
    }
  }

  function setHidden(hidden) {
    document.documentElement.classList.toggle("hide-admin-moves", hidden);
    try {
      window.localStorage.setItem(ADMIN_MOVES_KEY, hidden ? "1" : "0");
    } catch (e) {
      /* storage refused: the choice lasts for this page only */
    }
  }

  function setUpToggle() {
    var box = document.getElementById("toggle-admin-moves");
    if (!box) return;
    var hidden = stored();
    box.checked = !hidden;
    document.documentElement.classList.toggle("hide-admin-moves", hidden);
    box.addEventListener("change", function () {
      setHidden(!box.checked);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setUpToggle);
  } else {
    setUpToggle();
  }

  function left(ms) {
    var s = Math.floor(ms / 1000);
    var d = Math.floor(s / 86400);
    var h = Math.floor((s % 86400) / 3600);
    var m = Math.floor((s % 3600) / 60);
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    return (d ? d + " d " : "") + h + ":" + two(m) + ":" + two(s % 60);
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var end = Date.parse(el.getAttribute("data-countdown"));
      if (isNaN(end)) return;
      el.textContent = end > now ? "in " + left(end - now) : "ended";
    });
  }
  window.setInterval(tick, 1000);
})();
