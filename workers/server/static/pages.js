// The smaller pages: workers and queues, schedules, dead letters, the start form.
"use strict";

(() => {
  const { api, el, time, duration, ago, json, badge, showError, flash } = D;
  const page = document.body.dataset.page;

  function empty(body, cols, text) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: cols, class: "muted" }, text)));
  }

  function list(items) {
    return el("span", { class: "small" }, (items || []).join(", "));
  }

  // A worker's activity threads; those held by abandoned attempts (Python cannot stop a
  // thread) in orange, with what holds them, as `durable workers` says it.
  function threads(w) {
    if (!w.threads) return "";
    if (!w.threads_held) return `${w.threads}`;
    return el("div", { title: (w.stuck || []).join("\n") },
      el("span", { class: "warn" }, w.threads_note || `${w.threads_held}/${w.threads} held`, w.starved ? ": it runs no activity, restart it" : ""),
      ...(w.stuck || []).slice(0, 3).map((s) => el("div", { class: "muted small" }, s)));
  }

  async function workers() {
    const data = await api("GET", "/api/v1/workers");
    const problem = document.getElementById("problem");  // Redis refusing writes: nothing moves
    problem.hidden = !data.problem;
    problem.textContent = data.problem || "";
    document.getElementById("retention").textContent = data.retention || "?";  // `durable workers` says it
    const warnings = document.getElementById("warnings");  // Redis set up to lose durable's data
    const said = data.warnings || [];
    warnings.hidden = !said.length;
    warnings.replaceChildren(...said.map((w) => el("div", {}, "Warning: " + w)));
    const qbody = document.querySelector("#queues tbody");
    const backlog = data.backlog || {};
    const qrows = Object.entries(data.queues).map(([name, q]) => {
      const b = backlog[name] || {};
      const lag = b.lag_ms === null || b.lag_ms === undefined ? "empty" : duration(b.lag_ms);
      const served = q.workers.length > 0;
      return el("tr", { class: b.lag_ms > 60000 || !served ? "is-blocked" : "" }, el("td", {}, el("b", {}, name)),
        el("td", {}, q.current_build ? el("span", {}, q.current_build, q.current_build_live ? "" : el("span", { class: "bad" }, " (no live worker)")) : "unversioned"),
        el("td", {}, q.new_runs_to.length ? list(q.new_runs_to) : el("span", { class: "bad" }, "no live worker takes them")), el("td", {}, served ? String(q.workers.length) : el("span", { class: "bad" }, "none serves it")),
        el("td", { class: "num" }, String(b.workflow_tasks ?? "")), el("td", { class: "num" }, String(b.activity_tasks ?? "")),
        el("td", { title: b.oldest_ms ? time(b.oldest_ms) : "" }, lag));
    });
    if (qrows.length) qbody.replaceChildren(...qrows); else empty(qbody, 7, "no queue is served: start a worker");
    const wbody = document.querySelector("#workers tbody");
    const wrows = data.workers.map((w) => el("tr", { class: w.heartbeat_age_s > 6 ? "is-blocked" : "" },
      el("td", { class: "small" }, w.name), el("td", {}, `${w.host} / ${w.pid}`),
      el("td", {}, w.build_id || "unversioned", w.compatible.length ? el("div", { class: "muted small" }, "also: " + w.compatible.join(", ")) : ""),
      el("td", {}, list(w.queues)), el("td", {}, list(w.workflows)), el("td", {}, list(w.activities.filter((a) => !a.startsWith("durable.")))),
      el("td", {}, threads(w)), el("td", { class: "small" }, time(w.started)), el("td", {}, `${w.heartbeat_age_s} s ago`,
        w.stopping_since ? el("div", {}, el("span", { class: "badge stopping", title: "it takes no new task: it finishes its running activities, then leaves" }, "stopping"))
          : w.draining_since ? el("div", {}, el("span", { class: "badge draining", title: "it starts no new run: it finishes the runs pinned to its build, then stops" }, `draining: ${w.pinned_left} left`)) : "",
        w.deciding_note ? el("div", { class: "warn small" }, "stalled: " + w.deciding_note) : ""),
      el("td", { class: "buttons" }, w.stopping_since || w.draining_since ? ""
        : el("button", { type: "button", onclick: () => drain(w) }, "Drain…"))));
    if (wrows.length) wbody.replaceChildren(...wrows); else empty(wbody, 10, "no live worker");
  }

  // As `durable drain NAME`: the worker reads the ask at its next heartbeat (2 s).
  async function drain(w) {
    const pinned = w.build_id ? `the runs pinned to build ${w.build_id}, then stops` : "nothing (unversioned: nothing is pinned to it), so it stops";
    if (!(await D.confirm(`Drain worker ${w.name}`, `It starts no new run and finishes ${pinned}.`))) return;
    try {
      await api("POST", `/api/v1/workers/${encodeURIComponent(w.name)}/drain`);
      flash(`worker ${w.name}: asked to drain (it says so within its next heartbeat)`, "ok");
      await workers();
    } catch (err) {
      showError(err, `drain ${w.name}`);
    }
  }

  function when(spec) {
    if (spec.cron) return `cron ${spec.cron} (${spec.timezone})`;
    if (spec.every) return `every ${duration(spec.every * 1000)}`;
    return "";
  }

  // Each schedule action: what its dialog asks and says, and the body it sends.
  const NOTE = { fields: [{ name: "note", label: "Note (shown by describe)" }], says: "", body: (v) => ({ note: v.note }) };
  const SCHEDULE_ACTIONS = {
    pause: NOTE,
    unpause: NOTE,
    trigger: {
      fields: [{ name: "overlap", label: "Overlap policy (optional: the schedule's own)", placeholder: "skip, buffer_one, allow_all…" }],
      says: "Start one run of it now.",
      body: (v) => (v.overlap ? { overlap: v.overlap } : {}),
    },
    delete: { fields: [], says: "It starts no more runs; the runs it started go on.", body: () => ({}) },
  };

  async function scheduleAction(id, action) {
    const what = SCHEDULE_ACTIONS[action];
    const values = await D.confirm(`${action[0].toUpperCase()}${action.slice(1)} schedule ${id}`, what.says, what.fields);
    if (!values) return;
    const body = what.body(values);
    try {
      const out = await api("POST", `/api/v1/schedules/${encodeURIComponent(id)}/${action}`, body);
      if (out.outcome === "skipped") flash(`schedule ${id}: skipped, ${out.reason}`, "warn");
      else if (out.workflow_id) flash(el("span", {}, out.outcome === "buffered" ? "buffered " : "started ", D.runLink(out.workflow_id)), "ok");
      else flash(`schedule ${id}: ${action}d`, "ok");
      await schedules();
    } catch (err) {
      showError(err, `${action} ${id}`);
    }
  }

  // The API's state word (active, paused, ended (end_at passed), done (max_runs reached)), as
  // `durable schedule list` says it: an ended schedule showed "running".
  function scheduleState(s) {
    const state = s.state || (s.paused ? "paused" : "active");
    return el("span", { class: "badge schedule-state " + state.split(" ")[0], title: state }, state);
  }

  async function schedules() {
    const data = await api("GET", "/api/v1/schedules");
    const body = document.querySelector("#schedules tbody");
    const rows = data.schedules.map((s) => el("tr", { "data-id": s.id },
      el("td", {}, el("b", {}, s.id), s.note ? el("div", { class: "muted small" }, s.note) : ""),
      el("td", {}, s.spec.workflow, el("div", { class: "muted small" }, "args " + JSON.stringify(s.spec.args))),
      el("td", {}, when(s.spec), el("div", { class: "muted small" }, `overlap ${s.spec.overlap}`)),
      el("td", { class: "small" }, s.paused ? el("span", { class: "muted" }, "paused") : (s.next_times || []).slice(0, 3).map((t) => el("div", {}, time(Date.parse(t)))),
        s.overdue ? el("div", { class: "warn overdue" }, "overdue: " + s.overdue) : "",
        s.held_up ? el("div", { class: "warn held-up" }, "held up: " + s.held_up) : ""),
      el("td", {}, scheduleState(s), el("div", { class: "muted small" }, `${s.started} started, ${s.running.length} running`),
        // An open run that does not move holds every later time (skipped or buffered): say why.
        ...s.running.slice(0, 3).map((w) => el("div", { class: "small" }, D.runLink(typeof w === "string" ? w : w.workflow_id || JSON.stringify(w)),
          w.status ? ` (${w.status})` : "", w.blocked ? el("div", { class: "bad blocked-run" }, "blocked: " + w.blocked) : ""))),
      el("td", { class: "small" }, (s.recent_actions || []).slice(0, 4).map((a) => el("div", {}, `${time(a.ts)} ${a.action}`,
        a.workflow_id ? el("span", {}, " ", D.runLink(a.workflow_id), a.status ? ` (${a.status})` : "") : "",
        a.reason ? el("span", { class: "muted action-reason" }, ": " + a.reason) : ""))),
      el("td", { class: "buttons" },
        s.paused ? el("button", { type: "button", onclick: () => scheduleAction(s.id, "unpause") }, "Unpause…")
          : el("button", { type: "button", onclick: () => scheduleAction(s.id, "pause") }, "Pause…"),
        el("button", { type: "button", onclick: () => scheduleAction(s.id, "trigger") }, "Trigger…"),
        el("button", { type: "button", class: "danger", onclick: () => scheduleAction(s.id, "delete") }, "Delete…"))));
    if (rows.length) body.replaceChildren(...rows); else empty(body, 7, "no schedules (create them with durable schedule create)");
  }

  const CLOSED = new Set(["completed", "failed", "cancelled", "terminated", "continued"]);

  async function deadLetters() {
    const data = await api("GET", "/api/v1/dead-letters");
    const body = document.querySelector("#dead tbody");
    const rows = data.dead_letters.map((d) => {
      const parkedAt = Number(String(d.id || "").split("-")[0]) || null;
      const task = Object.fromEntries(Object.entries(d.task || {}).map(([k, v]) => [k, D.bytesText(v)]));
      return el("tr", {}, el("td", { class: "small" }, time(parkedAt), el("div", { class: "muted" }, ago(parkedAt))),
        el("td", {}, d.kind),
        el("td", { class: "small" }, d.workflow_id ? D.runLink(d.workflow_id) : "", el("div", { class: "muted" }, d.run || "")),
        // A run closed since (terminated, say): nothing to repair; the letter only tells what happened.
        CLOSED.has(d.run_status) ? el("td", { class: "muted" }, `run ${d.run_status} since: nothing to repair — `, d.reason) : el("td", { class: "bad" }, d.reason),
        el("td", { class: "small" }, `partition ${d.partition}`, el("div", { class: "muted" }, `${d.stream} ${d.entry}`),
          el("details", {}, el("summary", {}, "task"), el("pre", { class: "json" }, json(task)))));
    });
    if (rows.length) body.replaceChildren(...rows); else empty(body, 5, "nothing is parked");
  }

  function startForm() {
    const form = document.getElementById("start");
    api("GET", "/api/v1/workers").then((data) => {
      const types = new Set(data.workers.flatMap((w) => w.workflows));
      document.getElementById("types").replaceChildren(...[...types].sort().map((t) => el("option", { value: t })));
    }).catch(() => {});
    // A custom validity blocks every later submit: the fixed text must clear it.
    form.elements.args.addEventListener("input", () => form.elements.args.setCustomValidity(""));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      let args;
      try {
        args = JSON.parse(form.elements.args.value || "[]");
        if (!Array.isArray(args)) throw new Error("not an array");
      } catch (err) {
        form.elements.args.setCustomValidity("a JSON array, e.g. [1, \"two\"]: " + err.message);
        form.elements.args.reportValidity();
        return;
      }
      form.elements.args.setCustomValidity("");
      const body = { type: form.elements.type.value.trim(), args };
      if (form.elements.id.value.trim()) body.id = form.elements.id.value.trim();
      if (form.elements.queue.value.trim()) body.queue = form.elements.queue.value.trim();
      const ok = await D.confirm(`Start ${body.type}`, `Arguments ${JSON.stringify(args)}${body.id ? ", id " + body.id : ""}.`);
      if (!ok) return;
      try {
        const out = await api("POST", "/api/v1/workflows", body);
        if (out.warning) flash(out.warning, "warn");
        flash(el("span", {}, "started ", D.runLink(out.workflow_id)), "ok");
      } catch (err) {
        showError(err, "start");
      }
    });
  }

  const loaders = { workers, schedules, "dead-letters": deadLetters };
  if (page === "start") startForm();
  const load = loaders[page];
  if (load) {
    load().catch((err) => showError(err, page));
    D.live(load, 3000);
  }
})();
