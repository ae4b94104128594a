// The timeline picture of a run: one lane per step (activity, timer, child, signal or hook wait),
// bars on a time axis, drawn as inline SVG from the history and the recorded attempts.
"use strict";

const Timeline = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const MAX_LANES = 150; // a 10,000-event history: the first lanes drawn, the rest counted
  const LANE = 22;
  const LABEL = 230;
  const AXIS = 26;

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Steps out of the history: {key, kind, label, start, end, state, segments, link}
  function steps(events, info) {
    const byKey = new Map();
    const order = [];
    const open = (key, step) => {
      byKey.set(key, step);
      order.push(step);
      return step;
    };
    const close = (key, ts, state) => {
      const step = byKey.get(key);
      if (step && step.end === null) {
        step.end = ts;
        step.state = state;
      }
      return step;
    };
    const signalWaits = new Map(); // signal name -> open wait steps
    const signals = [];
    for (const e of events) {
      const d = e.data || {};
      switch (e.type) {
        case "ActivityScheduled":
          open("a:" + d.id, { kind: "activity", label: `${d.name} #${d.id}`, start: e.ts, end: null, state: "open", id: d.id, segments: [] });
          break;
        case "ActivityCompleted": close("a:" + d.id, e.ts, "completed"); break;
        case "ActivityFailed": close("a:" + d.id, e.ts, "failed"); break;
        case "ActivityCancelled": close("a:" + d.id, e.ts, "cancelled"); break;
        case "TimerStarted": {
          // A signal wait's deadline is a timer with the wait's id: drawn with the wait.
          if (byKey.has("w:" + d.id)) break;
          open("t:" + d.id, { kind: "timer", label: `timer #${d.id}`, start: e.ts, end: null, due: d.fire_at, state: "open" });
          break;
        }
        case "TimerFired":
          close("t:" + d.id, e.ts, "fired");
          close("w:" + d.id, e.ts, "timed out");
          break;
        case "TimerCancelled": close("t:" + d.id, e.ts, "cancelled"); break;
        case "SignalWaitStarted": {
          const step = open("w:" + d.id, { kind: "wait", label: `signal ${d.name}`, start: e.ts, end: null, due: d.deadline, state: "open", name: d.name });
          if (!signalWaits.has(d.name)) signalWaits.set(d.name, []);
          signalWaits.get(d.name).push(step);
          break;
        }
        case "SignalReceived": {
          signals.push({ ts: e.ts, name: d.name });
          const waiting = (signalWaits.get(d.name) || []).filter((s) => s.end === null);
          if (waiting.length) { waiting[0].end = e.ts; waiting[0].state = "received"; }
          break;
        }
        case "HookCreated":
          open("h:" + d.id, { kind: "wait", label: `hook ${d.name || d.id}`, start: e.ts, end: null, state: "open" });
          break;
        case "HookResumed": close("h:" + d.id, e.ts, "resumed"); break;
        case "ChildStarted":
          open("c:" + d.id, { kind: "child", label: `child ${d.workflow_type} ${d.workflow_id}`, start: e.ts, end: null, state: "open", link: d.workflow_id });
          break;
        case "ChildCompleted": close("c:" + d.id, e.ts, "completed"); break;
        case "ChildFailed": close("c:" + d.id, e.ts, d.status || "failed"); break;
        default: break;
      }
    }
    return { steps: order, signals };
  }

  function attach(stepList, attempts) {
    const byId = new Map(stepList.filter((s) => s.kind === "activity").map((s) => [s.id, s]));
    for (const a of attempts || []) {
      const step = byId.get(a.act);
      const rec = a.record || {};
      if (!step || !rec.started_ms) continue;
      step.segments.push({
        start: rec.started_ms, end: rec.started_ms + (rec.duration_ms || 0), outcome: a.outcome,
        attempt: a.attempt, error: rec.error || "",
      });
    }
  }

  function niceStep(span, px) {
    const want = span / Math.max(1, px / 110);
    const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5, 72e5, 144e5, 216e5, 432e5, 864e5];
    return steps.find((s) => s >= want) || 864e5 * Math.ceil(want / 864e5);
  }

  function draw(container, events, info, attempts) {
    container.replaceChildren();
    if (!events.length) return;
    const { steps: all, signals } = steps(events, info);
    attach(all, attempts);
    const openRun = !info.closed;
    const t0 = events[0].ts;
    const now = Date.now();
    const tEnd = Math.max(info.closed || now, ...events.map((e) => e.ts), t0 + 1);
    const shown = all.slice(0, MAX_LANES);
    const width = Math.max(640, container.clientWidth || 1000);
    const plot = width - LABEL - 16;
    const x = (t) => LABEL + ((Math.min(Math.max(t, t0), tEnd) - t0) / (tEnd - t0)) * plot;
    const lanes = 1 + shown.length + (signals.length ? 1 : 0);
    const height = AXIS + lanes * LANE + 8;
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "tl", role: "img", "aria-label": "timeline of the run" });

    // Axis: time since the run started.
    const step = niceStep(tEnd - t0, plot);
    for (let t = 0; t <= tEnd - t0; t += step) {
      const px = x(t0 + t);
      root.append(svg("line", { x1: px, x2: px, y1: AXIS - 4, y2: height, class: "grid" }));
      root.append(svg("text", { x: px + 2, y: AXIS - 8, class: "tick" }, "+" + D.duration(t)));
    }
    let y = AXIS;
    const lane = (label, cls, href) => {
      const text = svg("text", { x: 4, y: y + 15, class: "lane " + (cls || "") }, label.length > 34 ? label.slice(0, 33) + "…" : label);
      const g = svg(href ? "a" : "g", href ? { href } : {});
      g.append(svg("title", {}, label), text);
      root.append(g);
      root.append(svg("line", { x1: 0, x2: width, y1: y + LANE, y2: y + LANE, class: "sep" }));
    };
    const bar = (start, end, cls, title) => {
      const x1 = x(start);
      const w = Math.max(3, x(end) - x1);
      const r = svg("rect", { x: x1, y: y + 4, width: w, height: LANE - 8, rx: 2, class: "bar " + cls });
      r.append(svg("title", {}, title));
      root.append(r);
      return r;
    };

    // The run itself.
    lane(`${info.type || "run"} (${info.status})`, "run");
    bar(t0, info.closed || tEnd, "run " + info.status + (openRun ? " open" : ""), `${info.status}: ${D.duration((info.closed || now) - t0)}`);
    y += LANE;

    for (const s of shown) {
      const end = s.end === null ? tEnd : s.end;
      const current = s.end === null && openRun;
      lane(s.label, s.kind, s.link ? "/workflows/" + encodeURIComponent(s.link) : null);
      const took = D.duration(end - s.start);
      if (s.kind === "activity") {
        // A thin line for the whole step (queued, backoff), a bar per attempt.
        const span = svg("rect", { x: x(s.start), y: y + LANE / 2 - 1, width: Math.max(1, x(end) - x(s.start)), height: 2, class: "span" + (current ? " current" : "") });
        span.append(svg("title", {}, `${s.label}: ${s.state}, ${took}`));
        root.append(span);
        for (const seg of s.segments) {
          const cls = seg.outcome === "completed" ? "activity" : seg.outcome === "retry" ? "retry" : seg.outcome === "failed" ? "failed" : "attempt";
          bar(seg.start, seg.end, cls, `attempt ${seg.attempt}: ${seg.outcome}${seg.error ? " — " + seg.error : ""} (${D.duration(seg.end - seg.start)})`);
        }
        if (!s.segments.length || current) bar(s.segments.length ? s.segments[s.segments.length - 1].end : s.start, end,
          (current ? "current " : "") + (s.state === "failed" ? "failed" : "activity"), `${s.label}: ${s.state}, ${took}`);
      } else {
        const cls = s.kind + (current ? " current" : "") + (s.state === "failed" || s.state === "timed out" ? " failed" : "");
        bar(s.start, end, cls, `${s.label}: ${current ? "waiting" : s.state}, ${took}${s.due ? ", due " + D.time(s.due) : ""}`);
      }
      y += LANE;
    }
    if (signals.length) {
      lane("signals received", "signal");
      for (const sig of signals) {
        const px = x(sig.ts);
        const m = svg("path", { d: `M${px} ${y + 4} l5 7 l-5 7 l-5 -7 z`, class: "mark" });
        m.append(svg("title", {}, `signal ${sig.name} at ${D.time(sig.ts)}`));
        root.append(m);
      }
      y += LANE;
    }
    container.append(root);
    if (all.length > shown.length) {
      container.append(D.el("p", { class: "muted" }, `${all.length - shown.length} more steps not drawn (the history table lists every event)`));
    }
  }

  return { draw, steps };
})();
