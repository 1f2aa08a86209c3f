// rigbase console: progressive enhancement only. Every page works without this file (docs/console.md);
// with it, a job's log follows itself and the parts of a page marked data-live (a region's grids, a job's
// state and workers) keep up with the fleet. No inline script:
// the console's Content-Security-Policy allows scripts from this origin only.
(function () {
  "use strict";

  var FOLLOW_EVERY_MS = 1000; // as `provision job logs --follow` asks
  var GRIDS_EVERY_MS = 5000;

  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = value; }
    return el;
  }

  function json(answer) {
    var type = answer.headers.get("content-type") || "";
    if (!answer.ok || type.indexOf("application/json") !== 0) {
      // a session that ended answers with the sign-in page: stop, the next click shows it
      throw new Error("live updates stopped (" + answer.status + "): reload the page");
    }
    return answer.json();
  }

  // A job's log: ask for what came after the offset shown until the answer says it is complete.
  function followLog(pre) {
    var url = pre.getAttribute("data-log-url");
    var offset = Number(pre.getAttribute("data-offset") || "0");
    if (pre.getAttribute("data-complete") === "yes") { return; }
    pre.setAttribute("aria-busy", "true");

    function step() {
      fetch(url + "&offset=" + offset, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(json)
        .then(function (page) {
          if (page.data) {
            var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
            pre.appendChild(document.createTextNode(page.data));
            if (atEnd) { pre.scrollTop = pre.scrollHeight; }
          }
          offset = page.next_offset;
          pre.setAttribute("data-offset", String(offset));
          var state = text("job-state", page.job_state);
          if (state) { state.className = "state s-" + page.job_state; }
          if (page.complete) {
            pre.setAttribute("data-complete", "yes");
            pre.removeAttribute("aria-busy");
            text("log-status", "The whole log is here.");
            return;
          }
          window.setTimeout(step, FOLLOW_EVERY_MS);
        })
        .catch(function (err) {
          pre.removeAttribute("aria-busy");
          text("log-status", String(err.message || err));
        });
    }
    step();
  }

  // The parts marked data-live: fetch the page again and swap each part's content, unless the operator
  // is working inside that part (focus or the pointer in it), so nothing typed or clicked is lost.
  function refreshGrids(live) {
    function busy(el) {
      // a click lands on what the pointer is over: never swap it out from under the mouse
      return el.contains(document.activeElement) || el.matches(":hover");
    }
    function step() {
      fetch(window.location.pathname + window.location.search, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (answer) {
          var type = answer.headers.get("content-type") || "";
          if (!answer.ok || answer.redirected || type.indexOf("text/html") !== 0) {
            throw new Error("live updates stopped (" + answer.status + "): reload the page");
          }
          return answer.text();
        })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html");
          live.forEach(function (el) {
            var id = el.getAttribute("data-live");
            var now = fresh.querySelector('[data-live="' + id + '"]');
            if (now && !busy(el) && now.innerHTML !== el.innerHTML) {
              el.replaceChildren.apply(el, Array.prototype.slice.call(document.importNode(now, true).childNodes));
            }
          });
          var stamp = document.getElementById("live-status");
          if (stamp) { stamp.textContent = "Updated " + new Date().toLocaleTimeString(); }
          window.setTimeout(step, GRIDS_EVERY_MS);
        })
        .catch(function (err) { text("live-status", String(err.message || err)); });
    }
    window.setTimeout(step, GRIDS_EVERY_MS);
  }

  // A job's charts (uPlot, served from this origin): drawn from /jobs/{id}/charts and redrawn while the
  // job runs. Each chart's data stays readable as window.rigbaseCharts[name].data (the browser test reads it).
  var CHARTS_EVERY_MS = 10000;
  var PALETTE = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7ea4", "#57606a"];
  window.rigbaseCharts = {};

  function drawCharts(figures) {
    if (typeof window.uPlot !== "function") { return; }
    var url = figures[0].getAttribute("data-chart-url");
    function step() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(json)
        .then(function (all) {
          figures.forEach(function (figure) {
            var name = figure.getAttribute("data-chart");
            var chart = all[name];
            var existing = window.rigbaseCharts[name];
            if (!chart || !chart.data[0].length) { return; }
            if (existing && existing.series.length === chart.labels.length + 1) {
              existing.setData(chart.data);
              return;
            }
            if (existing) { existing.destroy(); }
            var series = [{ label: figure.getAttribute("data-x") === "time" ? "time" : "step" }];
            chart.labels.forEach(function (label, i) {
              series.push({ label: label, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: true });
            });
            var width = Math.max(260, Math.min(figure.clientWidth || 720, 960));
            window.rigbaseCharts[name] = new window.uPlot({
              width: width,
              height: 240,
              series: series,
              scales: { x: { time: figure.getAttribute("data-x") === "time" } },
            }, chart.data, figure);
            figure.setAttribute("data-points", String(chart.data[0].length));
          });
          var state = document.getElementById("job-state");
          var ended = state && ["succeeded", "failed", "stopped"].indexOf(state.textContent) >= 0;
          if (!ended) { window.setTimeout(step, CHARTS_EVERY_MS); }
        })
        .catch(function () { /* the tables beside the charts still say it */ });
    }
    step();
  }

  var figures = Array.prototype.slice.call(document.querySelectorAll("figure[data-chart-url]"));
  if (figures.length) { drawCharts(figures); }
  document.querySelectorAll("pre[data-log-url]").forEach(followLog);
  var live = Array.prototype.slice.call(document.querySelectorAll("[data-live]"));
  if (live.length) { refreshGrids(live); }
})();
