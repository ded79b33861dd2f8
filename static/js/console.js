/*
 * Small page behaviours that would otherwise be inline script, which the console's
 * Content-Security-Policy forbids. Loaded on every page, logged in or not.
 *
 * <a data-back href="/fallback/">: goes back in the tab's history when there is any,
 * else follows its href.
 */
(function () {
  "use strict";

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a[data-back]");
    if (!link || event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    if (window.history.length > 1) {
      event.preventDefault();
      window.history.back();
    }
  });
})();
