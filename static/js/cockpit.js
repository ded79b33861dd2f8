/*
 * Periodic refresh for the consumers and history pages: an element with
 * data-cockpit-every="SECONDS" is sent htmx's "live-refresh" that often, except while the
 * operator is typing in it or has changed a form in it (their text is not wiped), or while the
 * tab is hidden. The element refreshes itself with its own hx-get (static/js/live.js does the
 * same for ZooKeeper changes).
 */
(function () {
  "use strict";

  function busy(el) {
    var active = document.activeElement;
    if (active && active !== document.body && el.contains(active) &&
        /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) {
      return true;
    }
    var fields = el.querySelectorAll("input[type=text], input:not([type]), textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function tick() {
    if (!window.htmx || document.hidden) return;
    document.querySelectorAll("[data-cockpit-every]").forEach(function (el) {
      var every = 1000 * (parseFloat(el.getAttribute("data-cockpit-every")) || 5);
      var last = parseFloat(el.getAttribute("data-cockpit-last") || "0");
      var now = Date.now();
      if (!last) {
        el.setAttribute("data-cockpit-last", String(now));
        return;
      }
      if (now - last < every || busy(el)) return;
      el.setAttribute("data-cockpit-last", String(now));
      window.htmx.trigger(el, "live-refresh");
    });
  }

  setInterval(tick, 1000);
})();
