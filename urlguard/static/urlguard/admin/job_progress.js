// Polls a job's status URL and moves its progress bar; reloads the page when the
// job finishes so the server renders the result. No framework, no CDN.
"use strict";
(function () {
  function watch(box) {
    var url = box.getAttribute("data-status-url");
    if (!url) { return; }
    var bar = box.querySelector("progress");
    var text = box.querySelector(".job-progress-text");
    var message = box.querySelector(".job-message");
    function poll() {
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (s) {
          if (bar) { bar.max = Math.max(s.total, 1); bar.value = s.done; }
          if (text) { text.textContent = s.done.toLocaleString("en-US") + " / " + s.total.toLocaleString("en-US"); }
          if (message && s.message) { message.textContent = s.message; }
          if (s.finished) { window.location.reload(); } else { setTimeout(poll, 1000); }
        })
        .catch(function () { setTimeout(poll, 3000); });
    }
    setTimeout(poll, 500);
  }
  function watchNodes(table) {
    // The dashboard after "Sync now"/"Rebuild": refresh until every node has caught up.
    var url = table.getAttribute("data-status-url");
    var tries = 0;
    function poll() {
      fetch(url, {credentials: "same-origin"}).then(function (r) { return r.json(); })
        .then(function (s) {
          var behind = s.nodes.some(function (n) { return n.lag > 0; });
          s.nodes.forEach(function (n) {
            var row = table.querySelector('tr[data-node="' + CSS.escape(n.node) + '"]');
            if (!row) { return; }
            row.querySelector(".applied").textContent = "#" + n.applied_seq;
            row.querySelector(".lag").textContent = n.lag;
          });
          if (behind && ++tries < 60) { setTimeout(poll, 1000); }
        });
    }
    poll();
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(".job-progress[data-status-url]").forEach(watch);
    var nodes = document.querySelector("#nodes table[data-status-url]");
    if (nodes && /[?&]watch=1/.test(window.location.search)) { watchNodes(nodes); }
    var all = document.getElementById("select-all-hits");
    if (all) {
      all.checked = true;
      all.addEventListener("change", function () {
        document.querySelectorAll('#rescan-hits input[name="link"]').forEach(function (c) {
          c.checked = all.checked;
        });
      });
    }
  });
})();
