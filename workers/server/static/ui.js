// durable UI: what every page shares. Plain JavaScript, no build step, no dependency.
// Every value shown comes from /api/v1 and is put in the page as text (never as HTML).
"use strict";

const D = (() => {
  const TOKEN_KEY = "durable.token";
  // Blocked kinds found on read (not recorded): the run moves on by itself once the cause is gone,
  // so the pages offer no repair for them.
  const FOUND_ON_READ = new Set(["no_live_worker", "starved_queue", "redis_out_of_memory", "redis_cannot_persist", "data_lost", "history_full"]);

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // One API call: the bearer token when there is one; POSTs carry the header the server's
  // CSRF rule asks for (a cross-site form cannot set it).
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    const init = { method, headers, credentials: "same-origin" };
    if (method !== "GET") {
      headers["X-Durable-Request"] = "1";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body || {});
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (err) {
      throw new ApiError(0, "unreachable", "the server cannot be reached: " + err.message);
    }
    let data = null;
    try {
      data = await resp.json();
    } catch (err) {
      data = null;
    }
    if (!resp.ok) {
      const e = (data && data.error) || { code: "http_" + resp.status, message: resp.statusText };
      throw new ApiError(resp.status, e.code, e.message);
    }
    return data;
  }

  function qs(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v !== undefined && v !== null && v !== "") q.set(k, v);
    }
    const s = q.toString();
    return s ? "?" + s : "";
  }

  // el("a", {href: "/x", class: "y"}, "text", child...)
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  function pad(n, w = 2) {
    return String(n).padStart(w, "0");
  }

  // Times are shown in the browser's zone, to the second (ms in titles).
  // Past year 9999 (a timer set for ages): said as the CLI says it, not as year 33715.
  const LAST_SHOWN_MS = Date.UTC(9999, 11, 31, 23, 59, 59);

  function time(ms) {
    if (ms === null || ms === undefined || ms === "") return "";
    if (Number(ms) > LAST_SHOWN_MS) return "after 9999-12-31";
    const d = new Date(Number(ms));
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function duration(ms) {
    if (ms === null || ms === undefined || isNaN(ms)) return "";
    ms = Math.max(0, Math.round(ms));
    if (ms < 1000) return ms + " ms";
    const s = ms / 1000;
    if (s < 60) return (s < 10 ? s.toFixed(2) : s.toFixed(1)) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h} h ${m % 60} min`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  }

  function ago(ms) {
    return ms ? duration(Date.now() - Number(ms)) + " ago" : "";
  }

  function json(value) {
    return JSON.stringify(value, null, 2);
  }

  // A status badge; a blocked run shows "blocked" with its status beside it.
  function badge(status, blocked) {
    if (blocked) return el("span", { class: "badge blocked", title: blocked }, "blocked · " + status);
    return el("span", { class: "badge " + status }, status || "?");
  }

  function flash(message, kind = "info") {
    const box = document.getElementById("flash");
    const item = el("div", { class: "msg " + kind }, message,
      el("button", { class: "close", type: "button", "aria-label": "close", onclick: () => item.remove() }, "×"));
    box.append(item);
    // Not a pile that outlives the incident: errors stay longer, and only the last few stay.
    setTimeout(() => item.remove(), kind === "error" ? 30000 : 8000);
    while (box.children.length > 3) box.firstElementChild.remove();
    return item;
  }

  function showError(err, what) {
    const code = err.code ? `${err.code}: ` : "";
    flash(`${what ? what + " — " : ""}${code}${err.message}`, "error");
  }

  // A confirmation dialog with optional fields; resolves to the fields' values, or null.
  // fields: [{name, label, value, kind: "text"|"json"|"checkbox"|"textarea", placeholder}]
  function confirm(title, text, fields = [], role = "operator") {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-role").textContent =
      role === "read" ? "Needs a read token." : "Needs the operator role.";
    const box = document.getElementById("confirm-fields");
    box.replaceChildren();
    const inputs = {};
    for (const f of fields) {
      let input;
      if (f.kind === "checkbox") {
        input = el("input", { type: "checkbox", name: f.name });
        input.checked = !!f.value;
        box.append(el("label", { class: "check" }, input, " " + f.label));
      } else {
        input = f.kind === "json" || f.kind === "textarea"
          ? el("textarea", { name: f.name, rows: 3, placeholder: f.placeholder || "" })
          : el("input", { name: f.name, placeholder: f.placeholder || "" });
        input.value = f.value === undefined ? "" : f.value;
        box.append(el("label", {}, f.label, input));
      }
      inputs[f.name] = [f, input];
    }
    return new Promise((resolve) => {
      const yes = document.getElementById("confirm-yes");
      const no = document.getElementById("confirm-no");
      const done = (value) => {
        yes.removeEventListener("click", onYes);
        no.removeEventListener("click", onNo);
        dialog.close();
        resolve(value);
      };
      const onNo = (ev) => { ev.preventDefault(); done(null); };
      const onYes = (ev) => {
        ev.preventDefault();
        const out = {};
        for (const [name, [f, input]] of Object.entries(inputs)) {
          if (f.kind === "checkbox") out[name] = input.checked;
          else if (f.kind === "json") {
            try {
              out[name] = input.value.trim() ? JSON.parse(input.value) : [];
            } catch (err) {
              input.setCustomValidity("not valid JSON: " + err.message);
              input.reportValidity();
              return;
            }
            if (f.array && !Array.isArray(out[name])) {
              input.setCustomValidity("a JSON array, e.g. [1, \"two\"]");
              input.reportValidity();
              return;
            }
            input.setCustomValidity("");
          } else out[name] = input.value.trim();
        }
        done(out);
      };
      yes.addEventListener("click", onYes);
      no.addEventListener("click", onNo);
      dialog.addEventListener("cancel", () => done(null), { once: true });
      dialog.showModal();
    });
  }

  // Re-run fn every `ms` while the page's "live" box is ticked and the tab is visible.
  // A refresh that failed leaves the page as of its last success: said in a banner (cleared
  // by the next success), or a run page would show a stale status as if it were current.
  function stale(err) {
    let banner = document.getElementById("stale");
    if (!err) { if (banner) banner.remove(); return; }
    if (!banner) {
      banner = el("div", { id: "stale", class: "msg error", role: "status" });
      document.getElementById("flash").before(banner);
      banner.dataset.since = new Date().toLocaleTimeString();
    }
    const code = err.code ? `${err.code}: ` : "";
    banner.textContent = `Not refreshed since ${banner.dataset.since}: ${code}${err.message}. ` +
      "What the page shows may be out of date; it tries again every few seconds.";
  }

  function live(fn, ms = 3000) {
    const box = document.getElementById("live");
    let timer = null;
    const tick = async () => {
      if ((!box || box.checked) && !document.hidden && !document.getElementById("confirm").open) {
        try { await fn(); stale(null); } catch (err) { stale(err); }
      }
      timer = setTimeout(tick, ms);
    };
    timer = setTimeout(tick, ms);
    return () => clearTimeout(timer);
  }

  function setupToken() {
    const form = document.getElementById("token-form");
    const input = document.getElementById("token");
    const state = document.getElementById("token-state");
    const auth = document.body.dataset.auth === "on";
    const show = () => {
      const has = !!token();
      state.textContent = has ? "token set" : auth ? "no token: paste one" : "open (loopback)";
      state.className = has ? "ok" : auth ? "warn" : "muted";
      input.value = "";
      // A token the server does not know said "token set" until a call failed.
      if (has && auth) {
        fetch("/api/v1/workers", { headers: { Authorization: "Bearer " + token() } }).then((resp) => {
          if (resp.status !== 401) return;
          state.textContent = "token not accepted: paste another";
          state.className = "bad";
        }).catch(() => {});
      }
    };
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      show();
      location.reload();
    });
    document.getElementById("token-forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      show();
      location.reload();
    });
    if (!auth) form.classList.add("quiet");
    show();
  }

  // Payload values as the API renders them: {"$bytes": base64} shown decoded when it is text.
  function bytesText(value) {
    if (value && typeof value === "object" && "$bytes" in value) {
      try {
        const s = atob(value["$bytes"]);
        return /^[\x20-\x7e]*$/.test(s) ? s : value["$bytes"];
      } catch (err) {
        return value["$bytes"];
      }
    }
    return value;
  }

  // A run page's link; with ``runId``, of that run of the id (not necessarily its current one).
  function runLink(id, text, runId) {
    const pin = runId ? "?run_id=" + encodeURIComponent(runId) : "";
    return el("a", { href: "/workflows/" + encodeURIComponent(id) + pin }, text || id);
  }

  document.addEventListener("DOMContentLoaded", setupToken);
  return { FOUND_ON_READ, LAST_SHOWN_MS, api, qs, el, time, duration, ago, json, badge, flash, showError, confirm, live, token, bytesText, runLink, ApiError };
})();
