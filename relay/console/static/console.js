// outbox-relay console: the only script. It refreshes a running bulk
// action's progress in place; without it the page reloads itself
// (<noscript> refresh). Nothing else needs JavaScript.
(function () {
  "use strict";
  var bar = document.getElementById("progress");
  if (!bar) { return; }
  var job = bar.getAttribute("data-job");
  function tick() {
    fetch("/api/v1/actions/" + encodeURIComponent(job), { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (j) {
        document.getElementById("job-changed").textContent = String(j.changed);
        document.getElementById("job-skipped").textContent = String(j.skipped);
        document.getElementById("job-status").textContent = j.state;
        var state = document.getElementById("job-state");
        state.setAttribute("data-state", j.state);
        state.className = "job " + j.state;
        bar.value = j.state === "running" && j.expected > 0
          ? Math.min(100, Math.floor((j.changed + j.skipped) * 100 / j.expected)) : 100;
        if (j.state === "running") { setTimeout(tick, 500); } else { location.reload(); }
      })
      .catch(function () { setTimeout(tick, 2000); });
  }
  setTimeout(tick, 500);
})();
