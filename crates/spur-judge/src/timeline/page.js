// Draws the timeline whose data sits in <script id="timeline-data"> as one SVG: hosts as
// lanes, faults shaded over the lanes they hit, calls as marks coloured by how they ended,
// then one row per SpurJob or node with its life and its deadlines as brackets.
// Self-contained: no library, no network.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("timeline-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const GUTTER = 190, LANE_H = 46, ROW_H = 24, AXIS_H = 28, FAULT_ROW_H = 22;
  const secs = (ms) => ms / 1000;
  const fmt = (ms) => secs(ms).toFixed(2) + " s";

  function el(name, attrs, parent, title) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (title) {
      const t = document.createElementNS(NS, "title");
      t.textContent = title;
      node.appendChild(t);
    }
    if (parent) parent.appendChild(node);
    return node;
  }

  function details(what, fields) {
    const panel = document.getElementById("details");
    panel.textContent = "";
    const head = document.createElement("b");
    head.textContent = what;
    panel.appendChild(head);
    for (const [k, v] of Object.entries(fields)) {
      const line = document.createElement("div");
      line.textContent = k + ": " + (typeof v === "object" ? JSON.stringify(v) : v);
      panel.appendChild(line);
    }
  }

  function clickable(node, what, fields) {
    node.classList.add("clickable");
    node.addEventListener("click", (e) => {
      e.stopPropagation();
      details(what, fields);
    });
  }

  // The rows below the lanes: every SpurJob, node or other object a deadline or a
  // violation names, SpurJobs first, each once.
  function objectRows() {
    const rows = [];
    const seen = new Set();
    const add = (name) => {
      if (!seen.has(name)) {
        seen.add(name);
        rows.push(name);
      }
    };
    for (const job of data.jobs) add("spurjob/" + job.name);
    const others = [];
    for (const d of data.deadlines) others.push(d.object);
    for (const v of data.violations) others.push(v.object);
    others.sort();
    for (const o of others) add(o);
    return rows;
  }

  function draw(pxPerSec) {
    const x = (ms) => GUTTER + secs(ms) * pxPerSec;
    const rows = objectRows();
    const lanesTop = AXIS_H + FAULT_ROW_H * Math.max(1, data.faults.length);
    const rowsTop = lanesTop + data.lanes.length * LANE_H + 18;
    // Room on the right for a missed deadline's text near the end of the run.
    const width = x(data.end_ms) + 480;
    const height = rowsTop + rows.length * ROW_H + 10;
    const svg = el("svg", { id: "timeline", width, height, viewBox: `0 0 ${width} ${height}` });

    // Time axis and grid.
    const step = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600].find((s) => s * pxPerSec >= 70) || 1200;
    const axis = el("g", { class: "axis" }, svg);
    for (let t = 0; t * 1000 <= data.end_ms; t += step) {
      el("line", { x1: x(t * 1000), x2: x(t * 1000), y1: AXIS_H - 6, y2: height, class: "grid" }, axis);
      const label = el("text", { x: x(t * 1000) + 2, y: AXIS_H - 10 }, axis);
      label.textContent = t + " s";
    }

    // Faults: a labelled bar each in the fault rows, and a shade over each lane it hit.
    const faults = el("g", { class: "faults" }, svg);
    data.faults.forEach((f, i) => {
      const y = AXIS_H + i * FAULT_ROW_H;
      const w = Math.max(3, x(f.to_ms) - x(f.from_ms));
      const title = `${f.name}: ${fmt(f.from_ms)} to ${fmt(f.to_ms)} on ${f.lanes.join(", ")}`;
      const bar = el("rect", { x: x(f.from_ms), y: y + 3, width: w, height: FAULT_ROW_H - 6, class: "fault-bar" }, faults, title);
      clickable(bar, "fault " + f.name, f);
      const label = el("text", { x: x(f.from_ms) + 4, y: y + FAULT_ROW_H - 7, class: "fault-label" }, faults);
      label.textContent = f.name;
    });

    // Lanes: spans (terms, down, frozen, cut) and calls.
    data.lanes.forEach((lane, li) => {
      const top = lanesTop + li * LANE_H;
      const g = el("g", { class: "lane " + lane.kind }, svg);
      g.dataset.lane = lane.name;
      el("rect", { x: 0, y: top, width, height: LANE_H, class: "lane-bg" }, g);
      const name = el("text", { x: 8, y: top + LANE_H / 2 + 4, class: "lane-name" }, g);
      name.textContent = lane.name;
      for (const s of data.spans.filter((s) => s.lane === lane.name)) {
        const w = Math.max(2, x(s.to_ms) - x(s.from_ms));
        const title = `${lane.name}: ${s.label}, ${fmt(s.from_ms)} to ${fmt(s.to_ms)}`;
        let attrs;
        if (s.kind === "leader" || s.kind === "lease") {
          attrs = { y: top + LANE_H - 9, height: 7 };
        } else if (s.kind === "cut") {
          attrs = { y: top + 2, height: 5 };
        } else {
          attrs = { y: top + 1, height: LANE_H - 2 };
        }
        const r = el("rect", { x: x(s.from_ms), width: w, class: "span " + s.kind, ...attrs }, g, title);
        clickable(r, s.kind + " on " + lane.name, s);
      }
      for (const c of data.calls.filter((c) => c.lane === lane.name)) {
        const w = Math.max(2, x(c.to_ms) - x(c.from_ms));
        const title = `${c.method} ${c.outcome} (${fmt(c.from_ms)} to ${fmt(c.to_ms)})${c.detail ? ": " + c.detail : ""}`;
        const r = el("rect", { x: x(c.from_ms), y: top + 12, width: w, height: 12, class: "call " + c.outcome }, g, title);
        clickable(r, "call " + c.method, c);
      }
    });

    // Each fault's shade over the lanes it hit, above what happened there (it lets
    // clicks through to the calls beneath).
    const shades = el("g", { class: "fault-shades" }, svg);
    for (const f of data.faults) {
      const w = Math.max(3, x(f.to_ms) - x(f.from_ms));
      for (const lane of f.lanes) {
        const li = data.lanes.findIndex((l) => l.name === lane);
        if (li < 0) continue;
        const shade = el("rect", { x: x(f.from_ms), y: lanesTop + li * LANE_H, width: w, height: LANE_H, class: "fault" }, shades);
        shade.dataset.fault = f.name;
      }
    }

    // One row per object: a SpurJob's life, then deadlines as brackets.
    const rowsG = el("g", { class: "objects" }, svg);
    const rowTop = (object) => rowsTop + rows.indexOf(object) * ROW_H;
    rows.forEach((object) => {
      const top = rowTop(object);
      const g = el("g", { class: "row" }, rowsG);
      g.dataset.object = object;
      el("rect", { x: 0, y: top, width, height: ROW_H, class: "row-bg" }, g);
      const label = el("text", { x: 8, y: top + 16, class: "row-name" }, g);
      label.textContent = object;
    });
    for (const job of data.jobs) {
      const top = rowTop("spurjob/" + job.name);
      const g = el("g", { class: "job" }, rowsG);
      const end = job.gone_ms ?? data.end_ms;
      el("line", { x1: x(job.created_ms), x2: x(end), y1: top + 12, y2: top + 12, class: "life" }, g);
      job.states.forEach(([from, state], i) => {
        if (!state) return;
        const to = i + 1 < job.states.length ? job.states[i + 1][0] : end;
        const r = el("rect", { x: x(from), y: top + 8, width: Math.max(2, x(to) - x(from)), height: 8, class: "state s-" + state.toLowerCase() }, g,
          `${job.name}: ${state} from ${fmt(from)}`);
        clickable(r, "SpurJob " + job.name, job);
      });
      const created = el("circle", { cx: x(job.created_ms), cy: top + 12, r: 3.5, class: "created" }, g, `${job.name} created at ${fmt(job.created_ms)}`);
      clickable(created, "SpurJob " + job.name, job);
      if (job.submitted_ms != null) {
        const sx = x(job.submitted_ms);
        el("path", { d: `M${sx} ${top + 6} l5 6 l-5 6 l-5 -6 z`, class: "submitted" }, g, `${job.name} submitted as job ${job.job_id} (seen at ${fmt(job.submitted_ms)})`);
      }
    }
    for (const d of data.deadlines) {
      const top = rowTop(d.object);
      const cls = "deadline " + (d.met ? "met" : "missed");
      const g = el("g", { class: cls }, rowsG);
      g.dataset.check = d.check;
      const x0 = x(d.from_ms), xDue = x(d.due_ms), xEnd = x(d.end_ms);
      const title = d.met
        ? `${d.check} deadline met: waited ${fmt(d.end_ms - d.from_ms)} of ${fmt(d.due_ms - d.from_ms)}`
        : (d.violation || `${d.check} deadline missed`);
      // The bracket spans the allowance (below the life line for the deadlines that
      // start a job's life, above it for those that end it); a missed one runs on, red,
      // to where it was judged.
      const below = d.check === "registration" || d.check === "submission";
      const base = below ? top + 22 : top + 2, tip = below ? -4 : 4;
      el("path", { d: `M${x0} ${base} v${tip} H${xDue} v${-tip}`, class: "bracket" }, g, title);
      if (d.met) {
        el("line", { x1: xEnd, x2: xEnd, y1: base, y2: base + 2 * tip, class: "met-at" }, g, title);
      } else {
        el("line", { x1: xDue, x2: Math.max(xDue, xEnd), y1: base + tip, y2: base + tip, class: "overrun" }, g, title);
        const t = el("text", { x: Math.max(xDue, xEnd) + 4, y: top + 16, class: "missed-text" }, g);
        t.textContent = d.violation || d.check + " missed";
      }
      clickable(g, `${d.check} deadline of ${d.object}`, d);
    }
    for (const v of data.violations) {
      if (data.deadlines.some((d) => !d.met && d.violation === v.text)) continue;
      const top = rowTop(v.object);
      const g = el("g", { class: "violation" }, rowsG);
      const vx = x(v.at_ms);
      el("path", { d: `M${vx - 5} ${top + 7} l10 10 m0 -10 l-10 10`, class: "cross" }, g, v.text);
      const t = el("text", { x: vx + 8, y: top + 15, class: "missed-text" }, g);
      t.textContent = v.text;
      clickable(g, "violation " + v.check, v);
    }
    return svg;
  }

  function render() {
    const zoom = Number(document.getElementById("zoom").value);
    const fit = Math.max(0.5, (window.innerWidth - GUTTER - 60) / Math.max(1, secs(data.end_ms)));
    const holder = document.getElementById("chart");
    holder.textContent = "";
    holder.appendChild(draw(fit * zoom));
  }

  document.getElementById("title").textContent = data.title;
  document.getElementById("replay").textContent = data.replay;
  document.getElementById("note").textContent = data.note;
  const list = document.getElementById("violations");
  if (data.violations.length === 0) {
    const li = document.createElement("li");
    li.textContent = "no violation: every check passed";
    li.className = "passed";
    list.appendChild(li);
  }
  for (const v of data.violations) {
    const li = document.createElement("li");
    li.textContent = v.text;
    list.appendChild(li);
  }
  document.getElementById("zoom").addEventListener("input", render);
  render();
})();
