// The inbox's keyboard shortcuts (j/k move, x select, a approve, r reject, Enter open) and its
// live updates: an EventSource on /events (a kube watch the server holds); each change reloads
// the inbox's table in place. Reading and deciding work without it.
(function () {
  "use strict";
  var current = 0;
  function rows() { return Array.prototype.slice.call(document.querySelectorAll("#inbox tr[data-approval]")); }
  function mark() {
    var all = rows();
    if (current >= all.length) { current = all.length - 1; }
    if (current < 0) { current = 0; }
    all.forEach(function (r, i) { r.classList.toggle("current", i === current); });
  }
  function press(action) {
    var form = document.getElementById("decide");
    var selected = form.querySelectorAll("input[name=sel]:checked");
    var row = rows()[current];
    var button = selected.length > 0
      ? form.querySelector("[data-action=" + action + "-selected]")
      : row && row.querySelector("[data-action=" + action + "]");
    if (!button) { return; }
    // A keystroke never decides unseen: the inbox shows no args, so the person confirms what
    // is decided (or opens a row with Enter to read its request first).
    var keys = selected.length > 0
      ? Array.prototype.map.call(selected, function (b) { return b.value; })
      : [row.getAttribute("data-approval")];
    var verb = action === "approve" ? "Approve" : "Reject";
    if (!window.confirm(verb + " " + keys.length + " request(s) whose args this list does not show?\n" + keys.join("\n") + "\n(Enter on a row opens its request.)")) { return; }
    button.click();
  }
  document.addEventListener("keydown", function (e) {
    var t = e.target.tagName;
    if (t === "INPUT" && e.target.type !== "checkbox" || t === "TEXTAREA" || t === "SELECT" || e.ctrlKey || e.metaKey || e.altKey) { return; }
    var all = rows();
    if (e.key === "j") { current += 1; mark(); }
    else if (e.key === "k") { current -= 1; mark(); }
    else if (e.key === "x") { var box = all[current] && all[current].querySelector("input[name=sel]"); if (box) { box.checked = !box.checked; } }
    else if (e.key === "a") { press("approve"); }
    else if (e.key === "r") { press("reject"); }
    else if (e.key === "Enter") { var link = all[current] && all[current].querySelector("a[data-link=detail]"); if (link) { link.click(); } }
    else { return; }
    e.preventDefault();
  });
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin" }).then(function (r) { return r.text(); }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.querySelector("#inbox tbody");
      var table = document.querySelector("#inbox tbody");
      if (!fresh || !table) { return; }
      var checked = {};
      document.querySelectorAll("input[name=sel]:checked").forEach(function (b) { checked[b.value] = true; });
      var key = rows()[current] && rows()[current].getAttribute("data-approval");
      table.replaceWith(fresh);
      document.querySelectorAll("input[name=sel]").forEach(function (b) { b.checked = !!checked[b.value]; });
      var idx = rows().findIndex(function (r) { return r.getAttribute("data-approval") === key; });
      if (idx >= 0) { current = idx; }
      mark();
    });
  }
  mark();
  if (window.EventSource) {
    var pending = null;
    var live = document.getElementById("live");
    var source = new EventSource("/events");
    source.addEventListener("ready", function () { if (live) { live.textContent = "Live: watching Approvals."; } });
    source.addEventListener("approval", function () {
      if (pending) { clearTimeout(pending); }
      pending = setTimeout(refresh, 200);
    });
    source.addEventListener("watch-error", function (e) { if (live) { live.textContent = "The watch failed: " + e.data; } });
  }
})();
