// One run: facts, input and outcome, the timeline, pending steps, attempts, children, history,
// and the operator's actions (each behind a confirmation).
"use strict";

(() => {
  const { FOUND_ON_READ, LAST_SHOWN_MS, api, el, time, duration, json, badge, showError, flash } = D;
  const root = document.getElementById("run");
  const wid = root.dataset.workflowId;
  const base = "/api/v1/workflows/" + encodeURIComponent(wid);
  // A run of the id other than its current one (an earlier run: a failure before a restart, a
  // continue-as-new chain): `?run_id=` in the page's URL, as the runs list links each row.
  const pinned = new URLSearchParams(location.search).get("run_id");
  const ofRun = pinned ? "run_id=" + encodeURIComponent(pinned) : "";
  let current = null;  // the id's current run id, when this page shows another one
  const HISTORY_PAGE = 10000;
  const TABLE_CHUNK = 300;
  let info = null;

  // When a wait ends, and how far off (not for a date past year 9999: "after 9999-12-31").
  function deadline(ms) {
    if (ms > LAST_SHOWN_MS) return time(ms);
    // Overdue (no worker fired it yet): how long ago, as describe says it; not "in 0 ms".
    const left = ms - Date.now();
    return left >= 0 ? `${time(ms)} (in ${duration(left)})` : `${time(ms)} (${duration(-left)} ago, overdue)`;
  }
  let events = [];
  let runId = null;
  let shownRows = 0;

  async function loadHistory() {
    // A new run of the id (continue-as-new, a restart) starts the history over.
    if (info.run_id !== runId) {
      events = [];
      runId = info.run_id;
      shownRows = 0;
      document.querySelector("#history tbody").replaceChildren();
    }
    let after = events.length ? events[events.length - 1].seq : 0;
    for (;;) {
      const page = await api("GET", `${base}/history?after=${after}&limit=${HISTORY_PAGE}${ofRun ? "&" + ofRun : ""}`);
      events.push(...page.events);
      if (!page.next_after) break;
      after = page.next_after;
    }
  }

  function facts() {
    const started = events[0] && events[0].data;
    const parent = started && started.parent;
    const items = [
      ["Type", info.type],
      ["Run id", info.run_id],
      ["Started", time(info.created)],
      ["Closed", info.closed ? time(info.closed) : "open"],
      ["Took", duration((info.closed || Date.now()) - info.created) + (info.closed ? "" : " so far")],
      ["Queue", info.queue || "default"],
      ["Build", info.build_id || "unversioned"],
      ["History", `${info.history.events} events` + (info.history.bytes ? `, ${info.history.bytes} bytes` : "") + (info.history.near_limit ? " (near its limit)" : "")],
    ];
    if (parent && parent.wid) items.push(["Parent", D.runLink(parent.wid)]);
    if (info.schedule_id) items.push(["Schedule", info.schedule_id]);
    if (info.cancel_requested) items.push(["Cancel", "requested"]);
    // Where its pending workflow task is: a run moves when a worker decides it.
    if (info.workflow_task) items.push(["Workflow task", el("span", { id: "workflow-task" }, info.workflow_task)]);
    const sa = info.search_attributes || {};
    if (Object.keys(sa).length) items.push(["Attributes", Object.entries(sa).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ")]);
    const memo = info.memo || {};
    if (Object.keys(memo).length) items.push(["Memo", JSON.stringify(memo)]);
    document.getElementById("facts").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    document.getElementById("run-status").replaceChildren(badge(info.status, info.blocked));
    document.getElementById("input").textContent = started ? cut(json(started.args), "/history") : "";
    const out = info.outcome;
    const title = document.getElementById("outcome-title");
    const pre = document.getElementById("outcome");
    pre.className = "json";
    if (!out) {
      title.textContent = "Result";
      pre.textContent = "(open: no result yet)";
      pre.classList.add("muted");
    } else if (out.error) {
      title.textContent = out.status === "failed" ? "Failure" : `Outcome (${out.status})`;
      pre.textContent = cut(json(out.error));
      pre.classList.add("bad");
    } else {
      title.textContent = "Result";
      pre.textContent = cut(json(out.result));
    }
    const blocked = document.getElementById("blocked");
    blocked.hidden = !info.blocked;
    if (info.blocked) {
      const fix = info.blocked_kind === "no_live_worker"
        ? "Start a worker that serves it: the run moves on by itself (no repair needed)."
        : FOUND_ON_READ.has(info.blocked_kind)
          ? "Do what the reason says: the run moves on by itself once it is done (no repair needed)."
          : "Fix the cause (deploy the code, start a worker of the build), then Repair re-queues the run.";
      blocked.replaceChildren(el("b", {}, `Blocked (${info.blocked_kind}): `), info.blocked, el("div", { class: "muted" }, fix));
    }
    document.title = `${wid} · ${info.status} · durable`;
  }

  function pending() {
    const rows = (info.pending || []).map((p) => {
      const rest = { ...p };
      // An activity's `state` says where its attempt is in words (the fields it is made of are left out).
      for (const k of ["kind", "id", "name", "deadline", "attempt", "started", "worker", "worker_alive", "state"]) delete rest[k];
      // Nor what is empty, or said in `state` already (why its queue does not move, say).
      for (const [k, v] of Object.entries(rest)) if (v === null || v === "" || (typeof v === "string" && (p.state || "").includes(v))) delete rest[k];
      const details = [p.state, Object.keys(rest).length ? JSON.stringify(rest) : ""].filter(Boolean).join(" ");
      // A closed run's rows are what it waited on as it closed: no deadline of theirs is coming.
      return el("tr", { class: info.closed ? "" : "current" }, el("td", {}, p.kind), el("td", {}, p.id || ""), el("td", {}, p.name || ""),
        el("td", {}, p.deadline ? (info.closed ? time(p.deadline) : deadline(p.deadline)) : ""),
        el("td", { class: "small" }, details));
    });
    // Signals received that no await_signal took yet: where one sent under a misspelt name shows.
    for (const [name, count] of Object.entries((!info.closed && info.signals_buffered) || {})) {
      rows.push(el("tr", { class: "received" }, el("td", {}, "signal received"), el("td", {}, ""), el("td", {}, name),
        el("td", {}, ""), el("td", { class: "small" }, `x${count}, not awaited yet`)));
    }
    // Signals in the inbox that no decision took yet (no worker has run it since).
    for (const [name, count] of Object.entries((!info.closed && info.signals_undecided) || {})) {
      rows.push(el("tr", { class: "received" }, el("td", {}, "signal received"), el("td", {}, ""), el("td", {}, name),
        el("td", {}, ""), el("td", { class: "small" }, `x${count}, not yet decided`)));
    }
    // Updates delivered that no decision took yet: their callers wait (an update's 202 said so).
    for (const u of (!info.closed && info.updates_undecided) || []) {
      rows.push(el("tr", { class: "received" }, el("td", {}, "update received"), el("td", {}, u.id), el("td", {}, u.name),
        el("td", {}, ""), el("td", { class: "small" }, "not yet decided")));
    }
    document.querySelector("#pending-title").textContent = info.closed && rows.length ? "Pending when it closed (nothing waits now)" : "Pending";
    const body = document.querySelector("#pending tbody");
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, info.closed ? "closed: nothing pending" : "nothing pending"))]));
  }

  function attempts() {
    const names = new Map(events.filter((e) => e.type === "ActivityScheduled").map((e) => [e.data.id, e.data.name]));
    const rows = [];
    for (const a of info.attempts || []) {
      const rec = a.record || {};
      const err = rec.error || a.reason || "";
      const errCell = el("td", { class: "error-cell" }, err ? el("span", { class: "bad" }, err) : "");
      if (rec.traceback) errCell.append(el("details", {}, el("summary", {}, "traceback"), el("pre", { class: "tb" }, rec.traceback)));
      if (rec.final) errCell.append(el("div", { class: "muted small" }, rec.final));
      if (rec.retry_in_s) errCell.append(el("div", { class: "muted small" }, `retried in ${rec.retry_in_s} s`));
      rows.push(el("tr", { class: "outcome-" + a.outcome },
        el("td", {}, `${names.get(a.act) || a.kind} #${a.act}`), el("td", {}, String(a.attempt || "")),
        el("td", {}, el("span", { class: "badge " + (a.outcome === "retry" ? "retry" : a.outcome) }, a.outcome || a.kind)),
        el("td", {}, time(rec.started_ms || a.ts)), el("td", {}, rec.duration_ms !== undefined ? duration(rec.duration_ms) : ""), errCell));
    }
    for (const d of info.dropped || []) {
      rows.push(el("tr", { class: "outcome-failed" }, el("td", {}, ["input dropped", d.input, d.name, d.id ? `(id ${d.id})` : ""].filter(Boolean).join(" ") + (d.preview ? `: ${d.preview}` : "")), el("td", {}, ""), el("td", {}, el("span", { class: "badge failed" }, "dropped")),
        el("td", {}, time(d.ts)), el("td", {}, ""), el("td", { class: "bad" }, d.reason || "")));
    }
    const body = document.querySelector("#attempts tbody");
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no activity attempts recorded"))]));
  }

  function children() {
    const rows = [];
    const parent = events[0] && events[0].data && events[0].data.parent;
    if (parent && parent.wid) rows.push(el("tr", {}, el("td", {}, "parent"), el("td", {}, D.runLink(parent.wid)), el("td", {}, ""), el("td", { class: "small" }, `child #${parent.cid}, on parent close: ${parent.policy}`)));
    const ends = new Map();
    for (const e of events) {
      if (e.type === "ChildCompleted") ends.set(e.data.id, "completed");
      if (e.type === "ChildFailed") ends.set(e.data.id, e.data.status || "failed");
    }
    // A child whose outcome this run's history does not hold (still open; or this run closed
    // first, so it never will): its own status, as describe reads it.
    const now = new Map((info.pending || []).filter((p) => p.kind === "child").map((p) => [p.workflow_id, p.child_status]));
    for (const e of events.filter((ev) => ev.type === "ChildStarted")) {
      const outcome = ends.get(e.data.id) || now.get(e.data.workflow_id);
      const open = !outcome || ["pending", "running", "suspended", "cancelling"].includes(outcome);
      rows.push(el("tr", {}, el("td", {}, "child #" + e.data.id), el("td", {}, D.runLink(e.data.workflow_id)), el("td", {}, e.data.workflow_type),
        el("td", {}, open ? el("span", { class: "badge running" }, outcome || "open") : badge(outcome))));
    }
    document.querySelector("#children tbody").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no parent, no children"))]));
  }

  // At most DATA_CHARS of a payload in the page: a run of 73 events with 1.5 MB results made a
  // 70 MB page that took 27 s to show. The API (``route``) has it all.
  const DATA_CHARS = 100000;
  function cut(text, route = "") {
    if (text.length <= DATA_CHARS) return text;
    const more = Math.round((text.length - DATA_CHARS) / 1024);
    return text.slice(0, DATA_CHARS) + `\n... ${more} KB more: GET /api/v1/workflows/${encodeURIComponent(wid)}${route} has it all`;
  }

  function summary(e) {
    const d = e.data || {};
    const parts = [];
    for (const k of ["name", "id", "workflow_type", "workflow_id", "status", "change_id", "version"]) {
      if (d[k] !== undefined && d[k] !== null && d[k] !== "") parts.push(`${k}=${typeof d[k] === "string" ? d[k] : JSON.stringify(d[k])}`);
    }
    if (d.fire_at) parts.push("fires " + time(d.fire_at));
    if (d.error) parts.push("error: " + (d.error.message || JSON.stringify(d.error)));
    return parts.join(" ");
  }

  // An event's data, written into the page only when its row is opened (see cut).
  function eventData(e) {
    const pre = el("pre", { class: "json" });
    return el("details", { ontoggle: (ev) => {
      if (ev.target.open && !pre.textContent) pre.textContent = cut(json(e.data), "/history");
    } }, el("summary", {}, summary(e) || "data"), pre);
  }

  // The history table, in chunks: a 10,000-event run does not make 10,000 rows at once.
  function historyRows(upTo) {
    const body = document.querySelector("#history tbody");
    const t0 = events.length ? events[0].ts : 0;
    const rows = [];
    for (; shownRows < Math.min(upTo, events.length); shownRows++) {
      const e = events[shownRows];
      const fail = /^(Workflow(Failed|Terminated|Cancelled|TimeoutFired)|ActivityFailed|ChildFailed|UpdateRejected)$/.test(e.type);
      rows.push(el("tr", { class: fail ? "is-failed" : "" }, el("td", {}, String(e.seq)), el("td", { class: "small" }, time(e.ts)),
        el("td", { class: "small" }, "+" + duration(e.ts - t0)), el("td", { class: "ev" }, e.type),
        el("td", {}, eventData(e))));
    }
    body.append(...rows);
    const more = document.getElementById("history-more");
    more.hidden = shownRows >= events.length;
    more.textContent = `Show more events (${events.length - shownRows} left)`;
    document.getElementById("history-size").textContent = `${events.length} events`;
  }

  async function refresh() {
    const before = info ? `${info.run_id}:${info.seq}:${info.status}:${info.blocked}` : "";
    info = await api("GET", ofRun ? `${base}?${ofRun}` : base);
    if (pinned && current === null) {
      const now = await api("GET", base);
      current = now.run_id;
      earlier(now);
    }
    const changed = before !== `${info.run_id}:${info.seq}:${info.status}:${info.blocked}`;
    if (changed) await loadHistory();
    facts();
    pending();
    attempts();
    children();
    historyRows(Math.max(shownRows, TABLE_CHUNK));
    Timeline.draw(document.getElementById("timeline"), events, info, info.attempts);
    const closed = !!info.closed;
    const other = pinned && current && current !== info.run_id;  // actions go to the current run
    for (const b of document.querySelectorAll("#actions button")) {
      const act = b.dataset.action;
      b.disabled = other || (closed && act !== "query");
    }
  }

  // Say that this is not the id's current run, and link to it.
  function earlier(now) {
    if (now.run_id === pinned) return;
    const note = document.getElementById("earlier");
    note.hidden = false;
    note.replaceChildren(`An earlier run of ${wid} (run ${pinned}); the current run is ${now.run_id} (${now.status}): `,
      D.runLink(wid, "open it"), ". The actions act on the current run: open it to use them.");
  }

  const ACTIONS = {
    signal: { title: "Send a signal", fields: [{ name: "name", label: "Signal name" }, { name: "args", label: "Arguments (JSON array)", kind: "json", array: true, value: "[]" }], path: (v) => `/signal/${encodeURIComponent(v.name)}`, body: (v) => ({ args: v.args }) },
    query: { title: "Call a query", role: "read", fields: [{ name: "name", label: "Query name" }, { name: "args", label: "Arguments (JSON array)", kind: "json", array: true, value: "[]" }], path: (v) => `/query/${encodeURIComponent(v.name)}`, body: (v) => ({ args: v.args }) },
    update: { title: "Send an update", fields: [{ name: "name", label: "Update name" }, { name: "args", label: "Arguments (JSON array)", kind: "json", array: true, value: "[]" }, { name: "update_id", label: "Update id (optional: an update sent before, to go on waiting for it)" }], path: (v) => `/update/${encodeURIComponent(v.name)}`, body: (v) => ({ args: v.args, ...(v.update_id ? { update_id: v.update_id } : {}) }) },
    cancel: { title: "Cancel the run", text: "The workflow gets CancelledError where it waits, and may compensate.", fields: [{ name: "reason", label: "Reason (recorded)" }], path: () => "/cancel", body: (v) => ({ reason: v.reason }) },
    terminate: { title: "Terminate the run", text: "Closed now: no more workflow code runs, nothing is compensated.", fields: [{ name: "reason", label: "Reason (recorded)" }], path: () => "/terminate", body: (v) => ({ reason: v.reason }) },
    repair: { title: "Repair the run", text: "Re-queue a blocked run (after fixing its cause).", fields: [{ name: "drop_input", label: "Drop the input that blocks it", kind: "checkbox" }, { name: "build_id", label: "Move it to build (optional)" }, { name: "unversioned", label: "Move it to unversioned workers", kind: "checkbox" }], path: () => "/repair", body: (v) => ({ drop_input: v.drop_input, unversioned: v.unversioned, ...(v.build_id ? { build_id: v.build_id } : {}) }) },
  };

  async function act(name) {
    const a = ACTIONS[name];
    const text = `${a.text ? a.text + " " : ""}Workflow ${wid}.`;
    const values = await D.confirm(a.title, text, a.fields, a.role || "operator");
    if (!values) return;
    if ("name" in values && !values.name) {
      flash(`${name}: a name is needed`, "error");
      return;
    }
    try {
      const out = await api("POST", base + a.path(values), a.body(values));
      if ("result" in out) flash(`${name} ${values.name}: ${JSON.stringify(out.result)}`, "ok");
      else if (out.pending) flash(`${name} ${values.name} (${out.update_id}) has no outcome yet: ${out.message}`, "error");
      else if (out.note) flash(`${a.title}: ${out.note}`, "warn");  // done, but to no effect yet
      else flash(`${a.title}: done`, "ok");
      await refresh();
    } catch (err) {
      showError(err, a.title);
    }
  }

  for (const b of document.querySelectorAll("#actions button")) b.addEventListener("click", () => act(b.dataset.action));
  document.getElementById("history-more").addEventListener("click", () => historyRows(shownRows + TABLE_CHUNK * 3));
  refresh().catch((err) => {
    showError(err, "run");
    if (err.status === 404) document.getElementById("facts").replaceChildren(el("dd", { class: "bad" }, `no workflow ${wid}`));
  });
  D.live(refresh, 2000);
  window.addEventListener("resize", () => info && Timeline.draw(document.getElementById("timeline"), events, info, info.attempts));
})();
