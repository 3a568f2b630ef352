// Draws the GPU cards from the status JSON (embedded in the page, then polled): the only place they are drawn.
// Levels (names and lines) come from the JSON (gpu_exporter.verdict.levels), nothing is hard-coded here.
(function () {
  "use strict";
  var main = document.getElementById("gpus");
  var GIB = 1073741824;
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#x27;"}[c];
    });
  }
  function pct(r) { return r === null || r === undefined ? "n/a" : Math.round(r * 100) + "%"; }
  function level(u, levels) {
    if (u === null) return "unknown";
    for (var i = 0; i < levels.length; i++) if (u < levels[i].below) return levels[i].level;
    return "ok";
  }
  function run(r) {
    var parts = "", legend = [];
    r.phases.forEach(function (p) {
      parts += '<span class="ph ' + esc(p[0]) + '" style="width:' + (p[1] * 100).toFixed(1) + '%" title="' +
        esc(p[0]) + " " + pct(p[1]) + '"></span>';
      legend.push('<i class="ph ' + esc(p[0]) + '"></i>' + esc(p[0]) + " " + pct(p[1]));
    });
    var state = (r.live ? "" : " (finished or stopped)") + (r.since_start ? " since start" : "");
    return '<div class="run"><span class="label">run <b>' + esc(r.run) + "</b> rank " + esc(r.rank) + state +
      '</span><div class="bar phases">' + parts + '</div><span class="legend">' + legend.join(" ") + "</span></div>";
  }
  var SOURCES = {gpm: "GPM", dcgm: "DCGM"};
  function effective(g, smLow) {
    // Effective utilization (SM activity) beside busy: red below sm_active_low, green from it; never guessed.
    if (g.sm_active === null || g.sm_active === undefined) {
      return '<div class="row sm"><span class="label">effective</span><span class="sm-unknown">SM activity ' +
        "unknown</span> <small>(no GPM, no dcgm-exporter)</small></div>";
    }
    var pipes = [["tensor", g.tensor_active], ["DRAM", g.dram_active]].filter(function (p) {
      return p[1] !== null && p[1] !== undefined;
    }).map(function (p) { return p[0] + " " + pct(p[1]); }).join(", ");
    return '<div class="row sm"><span class="label">effective</span><div class="bar util ' +
      (g.sm_active < smLow ? "low" : "ok") + '"><span style="width:' + (g.sm_active * 100).toFixed(1) + '%"></span>' +
      '<i class="line low" style="left:' + (smLow * 100).toFixed(1) + '%" title="sm_active_low: ' + pct(smLow) +
      '"></i></div><b class="num">' + pct(g.sm_active) + '</b></div><div class="row sm-note"><small>SM activity (' +
      esc(SOURCES[g.sm_source] || g.sm_source) + ")" + (pipes ? "; " + pipes : "") + "</small></div>";
  }
  function gpuCard(g, levels, smLow) {
    var u = g.utilization;
    var bar = '<div class="bar util ' + level(u, levels) + '"><span style="width:' + ((u || 0) * 100).toFixed(1) +
      '%"></span>' + levels.map(function (l) {
        return '<i class="line ' + esc(l.level) + '" style="left:' + (l.below * 100).toFixed(1) + '%" title="' +
          esc(l.level) + ": " + pct(l.below) + '"></i>';
      }).join("") + "</div>";
    var memory = g.memory_used_bytes !== null && g.memory_total_bytes ?
      (g.memory_used_bytes / GIB).toFixed(1) + " of " + Math.round(g.memory_total_bytes / GIB) + " GiB (" +
      pct(g.memory_used_ratio) + ")" : "n/a";
    var procs = g.processes.map(function (p) {
      return "<li>pid " + esc(p.pid) + " <b>" + esc(p.name) + "</b> " + (p.memory_bytes / GIB).toFixed(1) + " GiB</li>";
    }).join("") || "<li class=none>no processes</li>";
    var runs = g.runs.map(run).join("") || '<p class="none">no training run reports here</p>';
    var v = g.verdict;
    return '<section class="gpu" data-uuid="' + esc(g.uuid) + '"><h2>GPU ' + esc(g.index) + " <small>" +
      esc(g.name) + " &middot; " + esc(g.uuid) + "</small></h2>" +
      '<div class="row"><span class="label">busy</span>' + bar + '<b class="num">' + pct(u) + "</b></div>" +
      effective(g, smLow) +
      '<div class="row"><span class="label">memory</span>' + memory + "</div>" +
      '<ul class="procs">' + procs + "</ul>" + runs +
      '<div class="verdict ' + esc(v.verdict) + (v.below_target ? " bad" : "") +
      (v.worth !== null && v.worth !== undefined ? " ineffective-use" : "") + '"><p class="title">' +
      esc(v.title) + (v.code ? ' <span class="code">' + esc(v.code) + "</span>" : "") + '</p><p class="reason">' +
      esc(v.reason) + "</p>" + (v.effective ? '<p class="effective">' + esc(v.effective) + "</p>" : "") +
      (v.remedy ? '<p class="remedy">' + esc(v.remedy) + "</p>" : "") +
      (v.runbook ? '<a href="' + esc(v.runbook) + '">runbook</a>' : "") + "</div></section>";
  }
  function step(v) { return v === null || v === undefined ? "" : Number(v.toPrecision(3)) + " s"; }
  function distributedRun(d) {
    var rows = d.ranks.map(function (r) {
      var phases = Object.keys(r.shares).map(function (p) { return [p, r.shares[p]]; })
        .filter(function (pv) { return pv[1] >= 0.005; })
        .sort(function (a, b) { return b[1] - a[1]; })
        .map(function (pv) { return esc(pv[0]) + " " + pct(pv[1]); }).join(", ");
      return "<tr" + (r.rank === d.straggler ? " class=straggler" : "") + "><td>" + esc(r.rank) + "</td><td>GPU " +
        esc(r.gpu) + (r.node ? " on " + esc(r.node) : "") + "</td><td>" + phases + "</td><td>" + step(r.step_seconds) + "</td><td>" +
        esc(r.verdict) + "</td></tr>";
    }).join("");
    var said = d.straggler === null ?
      "no straggler: no rank waits for another beyond the straggler threshold" :
      "straggler rank " + d.straggler + ": " + d.straggler_cause + (d.projected_step_seconds === null ? "" :
        "; the run's step takes " + step(d.step_seconds) + ", ~" + step(d.projected_step_seconds) + " if rank " +
        d.straggler + " kept up");
    return '<section class="ddp" data-run="' + esc(d.run) + '"><h2>Run ' + esc(d.run) + " <small>" +
      d.ranks_reporting + " of " + d.world_size + " ranks</small></h2><table><tr><th>rank</th><th>GPU</th>" +
      "<th>phases</th><th>step</th><th>verdict</th></tr>" + rows + "</table><p>" + esc(said) + "</p></section>";
  }
  function summary(doc) {
    var m = doc.measured_seconds;
    var basis = m > 0 ? "mean over the last " + Math.round(m) + " s" : "the exporter's last poll interval";
    return "Utilization: " + basis + " (up to " + Math.round(doc.window_seconds) + " s). Levels: " +
      doc.levels.map(function (l) { return l.level + " below " + pct(l.below); }).join(", ") +
      ". Busy: a kernel ran (NVML); effective: SM activity, likely ineffective below " +
      pct(doc.thresholds.sm_active_low) + ".";
  }
  function draw(doc) {
    main.innerHTML = doc.gpus.map(function (g) {
      return gpuCard(g, doc.levels, doc.thresholds.sm_active_low);
    }).join("");
    document.getElementById("runs").innerHTML = (doc.distributed_runs || []).map(distributedRun).join("");
    document.getElementById("summary").textContent = summary(doc);
  }
  function poll() {
    // location.origin carries no user:password (fetch refuses URLs with them); the browser still
    // sends the basic-auth credentials it used for the page, same origin.
    fetch(location.origin + main.dataset.status, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (doc) {
        draw(doc);
        document.getElementById("updated").textContent = "updated " + new Date(doc.generated_at * 1000)
          .toLocaleTimeString() + " (every " + main.dataset.poll / 1000 + " s)";
        document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
      })
      .catch(function (e) { document.getElementById("updated").textContent = "update failed: " + e.message; })
      .finally(function () { setTimeout(poll, Number(main.dataset.poll)); });
  }
  draw(JSON.parse(document.getElementById("status-doc").textContent));
  setTimeout(poll, Number(main.dataset.poll));
})();
