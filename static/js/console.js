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
    return tag === "input" || tag === "textarea" || tag === "select" || target.isContentEditable;
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
