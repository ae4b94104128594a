// The runs list: filters (kept in the page's URL), counts per status, cursor paging, live refresh.
"use strict";

(() => {
  const { FOUND_ON_READ, api, qs, el, time, duration, badge, flash, showError } = D;
  const form = document.getElementById("filters");
  const body = document.querySelector("#runs tbody");
  const FIELDS = ["status", "type", "id_prefix", "since", "until", "where", "limit"];
  let cursors = [""]; // cursors[i]: the `before` of page i (page 0: newest)
  let next = null;

  function filters() {
    const out = {};
    for (const name of FIELDS) {
      let v = form.elements[name].value.trim();
      if (v && (name === "since" || name === "until")) v = String(new Date(v).getTime());
      out[name] = v;
    }
    return out;
  }

  // The URL holds the filters, so a filtered list can be bookmarked and shared.
  function loadFromUrl() {
    const q = new URLSearchParams(location.search);
    for (const name of FIELDS) {
      if (!q.has(name)) continue;
      let v = q.get(name);
      if ((name === "since" || name === "until") && /^\d+$/.test(v)) {
        const d = new Date(Number(v));
        v = new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
      }
      form.elements[name].value = v;
    }
  }

  function saveToUrl() {
    history.replaceState(null, "", location.pathname + qs(filters()));
  }

  async function loadCounts() {
    const where = form.elements.where.value.trim();
    const box = document.getElementById("counts");
    try {
      const data = await api("GET", "/api/v1/workflow-counts" + qs({ where }));
      const chips = [el("span", { class: "chip total" }, "all ", el("b", {}, String(data.total)))];
      for (const [status, n] of Object.entries(data.counts)) {
        if (!n) continue;
        chips.push(el("button", {
          type: "button", class: "chip " + status, "data-status": status,
          onclick: () => { form.elements.status.value = status; reset(); },
        }, status + " ", el("b", {}, String(n))));
      }
      box.replaceChildren(...chips);
    } catch (err) {
      box.replaceChildren(el("span", { class: "muted" }, "counts unavailable: " + err.message));
    }
  }

  function row(r) {
    const took = r.closed ? duration(r.closed - r.created) : r.created ? duration(Date.now() - r.created) + " so far" : "";
    const tr = el("tr", { class: r.blocked ? "is-blocked" : "", "data-id": r.workflow_id },
      el("td", { class: "id" }, D.runLink(r.workflow_id, null, r.run_id),
        r.parent && r.parent.wid ? el("span", { class: "muted small" }, " ← ", D.runLink(r.parent.wid)) : null),
      el("td", {}, r.type || ""),
      el("td", {}, badge(r.status, r.blocked)),
      el("td", { title: String(r.created) }, time(r.created)),
      el("td", {}, time(r.closed)),
      el("td", {}, took),
      el("td", { class: "small" }, r.build_id || ""));
    const rows = [tr];
    if (r.blocked) {
      rows.push(el("tr", { class: "blocked-reason" },
        el("td", { colspan: 7 }, el("b", {}, (r.blocked_kind || "blocked") + ": "), r.blocked,
          // Found on read (no worker can move it): the reason says what to start or restart.
          FOUND_ON_READ.has(r.blocked_kind) ? "" : el("span", { class: "muted" }, " — open the run to repair it"))));
    }
    return rows;
  }

  // Why no run can move whatever its row says (Redis refusing writes at maxmemory): the
  // server's own sentence, with what to do.
  function showProblem(problem) {
    const box = document.getElementById("problem");
    box.hidden = !problem;
    box.textContent = problem || "";
  }

  async function loadPage() {
    const page = cursors.length - 1;
    const params = { ...filters(), before: cursors[page] };
    let data;
    try {
      data = await api("GET", "/api/v1/workflows" + qs(params));
    } catch (err) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 7, class: "error" }, `${err.code}: ${err.message}`)));
      throw err;
    }
    next = data.next;
    showProblem(data.problem);
    const rows = data.workflows.flatMap(row);
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no runs match"))]));
    document.getElementById("newer").disabled = page === 0;
    document.getElementById("older").disabled = !next;
    document.getElementById("page-info").textContent =
      `page ${page + 1} · ${data.workflows.length} run(s)` + (data.scanned > data.workflows.length ? ` · ${data.scanned} scanned` : "");
  }

  // Cancel or terminate every open run the Where filter selects (POST /api/v1/batch/ACTION,
  // as `durable terminate --where`): counted and confirmed first, 1,000 runs per call.
  const batch = document.getElementById("batch");
  function showBatch() {
    batch.hidden = !form.elements.where.value.trim();
  }

  // The runs the list shows, as one search expression (docs/search.md: `type`, `status` and
  // `started` are built-in attributes), so that a batch acts on those and no others. Null,
  // said why, for filters no expression holds.
  function shownWhere() {
    const f = filters();
    const quote = (v) => "'" + v.replaceAll("'", "''") + "'";
    if (f.id_prefix) return { why: "clear the Id prefix filter first: a batch selects runs by a search expression, which cannot say it" };
    if (f.status === "blocked") return { why: "a batch cannot select blocked runs by their status: choose a status word, or narrow the Where filter" };
    const parts = [f.type && `type = ${quote(f.type)}`, f.status && `status = ${quote(f.status)}`,
      f.since && `started >= ${f.since}`, f.until && `started <= ${f.until}`].filter(Boolean);
    return { where: parts.length ? `(${f.where}) and ${parts.join(" and ")}` : f.where };
  }

  async function runBatch(action) {
    const title = action === "cancel" ? "Cancel matching runs" : "Terminate matching runs";
    const { where, why } = shownWhere();
    if (!where) {
      flash(`${title}: ${why}`, "warn");
      return;
    }
    try {
      const counted = await api("GET", "/api/v1/workflow-counts" + qs({ where }));
      const open = ["pending", "running", "suspended", "cancelling"].reduce((n, s) => n + (counted.counts[s] || 0), 0);
      if (!open) {
        flash(`no open run matches ${where}`, "info");
        return;
      }
      const what = action === "cancel" ? "Each gets CancelledError where it waits, and may compensate." : "Each is closed now: no more workflow code runs.";
      const values = await D.confirm(title, `${open} open run(s) match ${where}. ${what}`, [{ name: "reason", label: "Reason (recorded)" }]);
      if (!values) return;
      // Each call goes on after the last run of the one before (`next`): a cancelled run stays
      // open until a worker applies it, so without it the same runs would be selected again.
      let done = 0, closed = 0, refused = 0, blocked = 0, before = null;
      do {
        const out = await api("POST", `/api/v1/batch/${action}`, { where, reason: values.reason, ...(before ? { before } : {}) });
        done += out.done.length;
        closed += out.closed.length;
        refused += Object.keys(out.refused).length;
        blocked += Object.keys(out.blocked || {}).length;
        before = out.more ? out.next : null;
      } while (before);
      const tail = (closed ? `, ${closed} closed meanwhile` : "") + (refused ? `, ${refused} refused` : "") +
        (blocked ? `; ${blocked} of them are blocked: the cancel takes effect once they move again (Terminate ends them now)` : "");
      flash(`${title}: ${done} run(s)${tail}`, refused || blocked ? "warn" : "ok");
      await refresh();
    } catch (err) {
      showError(err, title);
    }
  }
  for (const b of batch.querySelectorAll("button")) b.addEventListener("click", () => runBatch(b.dataset.action));

  function reset() {
    cursors = [""];
    showBatch();
    saveToUrl();
    refresh().catch((err) => showError(err, "runs"));
  }

  async function refresh() {
    await Promise.all([loadCounts(), loadPage()]);
  }

  form.addEventListener("submit", (ev) => { ev.preventDefault(); reset(); });
  form.addEventListener("reset", () => setTimeout(reset, 0));
  form.elements.status.addEventListener("change", reset);
  document.getElementById("older").addEventListener("click", () => {
    if (!next) return;
    cursors.push(next);
    loadPage().catch((err) => showError(err, "runs"));
  });
  document.getElementById("newer").addEventListener("click", () => {
    if (cursors.length > 1) cursors.pop();
    loadPage().catch((err) => showError(err, "runs"));
  });

  loadFromUrl();
  showBatch();
  refresh().catch((err) => showError(err, "runs"));
  D.live(refresh, 3000);
})();
