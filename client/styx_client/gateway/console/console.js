// The styx-py console: a page of the gateway, reading its /v1 API (no library, no other host).
// Views by URL fragment: #/cluster, #/invocations?status=&operator=&after=, #/invocation/ID,
// #/entity?operator=&key=&key_type=, #/effects?owner=. A bearer token, when the gateway has one, comes from the
// fragment (?token=…, never sent to the server, then removed from the address bar) or a prompt,
// and is kept in this tab's sessionStorage.
"use strict";

const TOKEN_KEY = "styx-console-token";
const REFRESH_MS = 2000;
let timer = null;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/cluster";
  const [path, query] = raw.split("?", 2);
  const params = new URLSearchParams(query || "");
  if (params.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", "#" + path + (rest ? "?" + rest : ""));
  }
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params };
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "http_error";
  }
}

async function api(path) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, { headers });
  const body = await response.json().catch(() => null);
  if (response.status === 401) {
    const entered = prompt("This gateway needs its bearer token:");
    if (entered) {
      sessionStorage.setItem(TOKEN_KEY, entered.trim());
      return api(path);
    }
  }
  if (!response.ok && response.status !== 202) throw new ApiError(response.status, body);
  return { status: response.status, body };
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined));
}

function failed(err) {
  return h("p", { class: "error", "data-error": err.code || "error" }, `${err.code || "error"}: ${err.message}`);
}

function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

function fields(rows) {
  return h("dl", { class: "fields" }, rows.filter((r) => r).map(([k, v, name]) =>
    [h("dt", {}, k), h("dd", { "data-field": name || k }, v === null || v === undefined ? "–" : v)]));
}

function table(head, rows, attrs) {
  return h("div", { class: "scroll" }, h("table", attrs || {},
    h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))), h("tbody", {}, rows)));
}

function invocationHref(rid) { return "#/invocation/" + encodeURIComponent(rid); }
function entityHref(operator, key) {
  const q = new URLSearchParams({ operator, key: String(key), key_type: typeof key === "number" ? "int" : "str" });
  return "#/entity?" + q.toString();
}

// ---- charts: inline SVG, no library ---------------------------------------------------------------
function chart(title, samples, field, unit) {
  const w = 320, hgt = 90, pad = 4;
  const points = samples.map((s) => s[field]).map((v) => (v === null ? null : Number(v)));
  const values = points.filter((v) => v !== null);
  const max = Math.max(1e-9, ...values);
  const last = values.length ? values[values.length - 1] : null;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${hgt}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", title);
  if (points.length > 1) {
    const step = (w - 2 * pad) / (points.length - 1);
    let d = "";
    points.forEach((v, i) => {
      if (v === null) return;
      const x = pad + i * step, y = hgt - pad - (v / max) * (hgt - 2 * pad);
      d += (d ? " L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
    });
    const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
    path.setAttribute("d", d);
    svg.append(path);
  }
  const now = last === null ? "–" : `${last.toFixed(last < 10 ? 2 : 0)} ${unit}`;
  return h("figure", { class: "chart", "data-chart": field },
    h("figcaption", {}, title, h("span", { class: "now" }, now)), svg,
    h("small", { class: "muted" }, values.length ? `max ${max.toFixed(max < 10 ? 2 : 0)} · last ${samples.length * 2} s` : "no samples yet"));
}

// ---- views ----------------------------------------------------------------------------------------
function badge(state, ready) {
  const health = document.getElementById("health");
  health.textContent = state;
  health.className = "badge " + (ready ? "ok" : "bad");
}

async function clusterView() {
  const { body } = await api("/v1/cluster");
  const s = body.status || {};
  badge(s.state || body.summary.state, body.summary.ready);
  const workers = (s.workers || []).map((w) =>
    h("tr", { "data-worker": w.node_id, "data-partitions": (w.partitions || []).join(",") }, h("td", {}, w.node_id), h("td", {}, w.address),
      h("td", { "data-field": "partitions" }, (w.partitions || []).join(", ")),
      h("td", {}, w.txn_per_s), h("td", {}, w.last_heartbeat_s_ago + " s")));
  const versions = (s.versions || []).map((v) =>
    h("tr", {}, h("td", {}, v.version), h("td", {}, v.graph), h("td", {}, v.first_epoch)));
  const list = (v) => (Array.isArray(v) && v.length ? v.join(", ") : "–");
  const moves = (s.shape_changes || []).map((e) => h("tr", {}, h("td", {}, e.change), h("td", {}, list(e.added)),
    h("td", {}, list(e.removed)), h("td", {}, e.moved ?? "–"), h("td", {}, list(e.workers))));
  const rec = s.last_recovery, move = s.last_move, snap = s.last_snapshot;
  const secs = (v) => (v === null || v === undefined ? "(still running)" : `${v} s`);
  return [
    h("h1", {}, "Cluster"),
    fields([
      ["state", s.state || body.summary.state, "state"], ["ready", String(body.summary.ready), "ready"],
      ["graph", s.graph], ["version", s.version], ["epoch", s.epoch, "epoch"], ["generation", s.generation],
      ["epochs/s", s.epochs_per_s], ["txn/s", s.txn_per_s], ["abort rate", s.abort_rate],
      s.degraded ? ["degraded", s.degraded] : null,
      (s.warnings || []).length ? ["warnings", s.warnings.join("; ")] : null,
    ]),
    h("section", { class: "charts" },
      chart("Epochs per second", body.history, "epochs_per_s", "/s"),
      chart("Epoch latency", body.history, "epoch_ms", "ms"),
      chart("Committed per second", body.history, "committed_per_s", "/s"),
      chart("Aborted per second", body.history, "aborted_per_s", "/s")),
    h("h2", {}, `Workers (${workers.length})`),
    table(["worker", "address", "partitions", "txn/s", "heartbeat"], workers, { id: "workers" }),
    h("h2", {}, "Recoveries and reshapes"),
    fields([
      ["recoveries", s.recoveries, "recoveries"], ["failed workers", (s.failed_workers || []).join(", ") || "none"],
      ["last recovery", rec ? `generation ${rec.generation} from snapshot ${rec.snapshot_epoch}: detected in ${secs(rec.detect_s)}, ` +
        `restored in ${secs(rec.restore_s)}, replayed ${rec.replay_epochs} epochs in ${secs(rec.replay_s)}` : "none", "last-recovery"],
      ["last move", move ? `generation ${move.generation}, after epoch ${move.after_epoch}: partitions moved in ${secs(move.move_s)}` : "none", "last-move"],
      ["last snapshot", snap ? `epoch ${snap.epoch}: ${snap.objects} objects, ${snap.bytes} bytes` : "none", "last-snapshot"],
      ["desired workers", s.desired_workers],
    ]),
    moves.length ? table(["shape change", "added", "removed", "partitions moved", "workers after"], moves, { id: "shape-changes" }) : null,
    h("h2", {}, "Code versions"),
    table(["version", "graph", "first epoch"], versions),
    h("h2", {}, "Operators"),
    table(["operator", "partitions", "functions", "state function"], body.summary.operators.map((o) =>
      h("tr", { "data-operator": o.name }, h("td", {}, o.name), h("td", {}, o.partitions),
        h("td", {}, o.functions.join(", ")), h("td", {}, o.state_function || "–")))),
    h("p", {}, h("a", { href: "#/invocations", id: "to-invocations" }, `Recent invocations (${body.gateway.recent} of ${body.gateway.window} kept)`)),
  ];
}

async function invocationsView(params) {
  const q = new URLSearchParams();
  for (const k of ["status", "operator", "after", "limit", "scope"]) if (params.get(k)) q.set(k, params.get(k));
  const { body } = await api("/v1/invocations?" + q.toString());
  const cluster = body.scope === "cluster";
  const { body: summary } = await api("/v1/operators");
  const go = (event) => {
    event.preventDefault();
    const f = new FormData(event.target), next = new URLSearchParams();
    for (const [k, v] of f.entries()) if (v) next.set(k, v);
    location.hash = "#/invocations?" + next.toString();
  };
  const select = (name, options) => h("select", { name }, h("option", { value: "" }, `any ${name}`),
    options.map((o) => h("option", o === params.get(name) ? { value: o, selected: "" } : { value: o }, o)));
  const rows = body.invocations.map((i) =>
    h("tr", { "data-request-id": i.request_id, "data-status": i.status },
      h("td", {}, h("a", { href: invocationHref(i.request_id) }, i.request_id)),
      h("td", {}, h("span", { class: "status " + i.status }, i.status)),
      h("td", {}, i.operator), h("td", {}, String(i.key)), h("td", {}, i.function),
      h("td", {}, i.epoch ?? "–"), h("td", {}, i.tid ?? "–"),
      h("td", {}, i.latency_ms === null ? "–" : i.latency_ms.toFixed(1) + " ms")));
  let older = null;
  if (body.next_after) {
    const next = new URLSearchParams(q);
    next.set("after", body.next_after);
    older = h("a", { href: "#/invocations?" + next.toString(), id: "older" }, "older →");
  }
  return [
    h("h1", {}, "Recent invocations"),
    h("form", { class: "filters", onsubmit: go },
      select("status", ["pending", "committed", "aborted", "failed", "error"]),
      select("operator", summary.operators.map((o) => o.name)),
      h("select", { name: "scope" }, [["", "this gateway"], ["cluster", "the whole cluster"]].map(([v, label]) =>
        h("option", (params.get("scope") || "") === v ? { value: v, selected: "" } : { value: v }, label))),
      h("button", { type: "submit" }, "Filter")),
    h("p", { class: "muted", id: "scope-note" }, cluster
      ? `${body.invocations.length} shown · the newest of ${body.retained} recent transactions the workers retain` + (body.complete ? "" : " (some workers did not answer)")
      : `${body.invocations.length} shown · this gateway keeps its last ${body.window} (${body.retained} now)`),
    table(["request id", "status", "operator", "key", "function", "epoch", "tid", "latency"], rows, { id: "invocations" }),
    older,
  ];
}

async function invocationView(rid) {
  const { status, body } = await api("/v1/invocations/" + encodeURIComponent(rid) + "/view");
  if (status === 202) return [h("h1", {}, rid), h("p", { "data-field": "status" }, "pending: no reply yet")];
  const entity = body.operator !== null
    ? h("a", { href: entityHref(body.operator, body.key), id: "to-entity" }, `${body.operator}/${body.key}`) : null;
  return [
    h("h1", {}, "Invocation ", h("code", { id: "request-id" }, body.request_id)),
    fields([
      ["status", h("span", { class: "status " + body.status }, body.status), "status"],
      ["entity", entity, "entity"], ["function", body.function, "function"],
      ["arguments", body.args === null ? null : JSON.stringify(body.args), "args"],
      ["epoch", body.epoch, "epoch"], ["phase", body.phase === null ? null : `${body.phase} (${body.phase === 0 ? "lock-free" : "fallback"})`, "phase"],
      ["tid", body.tid, "tid"], ["latency", body.latency_ms === null ? null : body.latency_ms.toFixed(1) + " ms"],
      ["submitted", body.submitted_at === null ? null : new Date(body.submitted_at * 1000).toISOString()],
      body.error ? ["error", `${body.error_type || ""}: ${body.error}`, "error"] : null,
      body.code ? ["answer", `${body.http_status} ${body.code}`] : null,
      ["seen by", body.source === "gateway" ? "this gateway (call and reply)" : "the cluster's reply tables (reply only)"],
    ]),
    h("h2", {}, "Reply"), h("div", { id: "reply" }, json(body.result)),
    callGraph(body),
  ];
}

function callGraph(body) {
  if (body.calls === null || body.calls === undefined) return null;
  const partial = body.graph_complete ? null : h("p", { class: "muted" }, "some workers did not answer: the graph may miss invocations");
  const calls = body.calls.map((c) =>
    h("tr", { "data-path": c.path.join("."), "data-status": c.status },
      h("td", { style: `padding-left: ${0.5 + 1.5 * c.path.length}em` }, c.path.length ? c.path.join(".") : "root"),
      h("td", {}, h("a", { href: entityHref(c.operator, c.key) }, `${c.operator}/${c.key}`)),
      h("td", {}, c.function), h("td", {}, c.status), h("td", {}, c.wrote ? "wrote" : "read")));
  const entities = body.entities.map((e) =>
    h("li", { "data-entity": `${e.operator}/${e.key}`, "data-wrote": String(e.wrote) },
      h("a", { href: entityHref(e.operator, e.key) }, `${e.operator}/${e.key}`), e.wrote ? " (written)" : " (read)"));
  return [
    h("h2", {}, `Call graph (${calls.length})`), partial,
    calls.length ? table(["call", "entity", "function", "status", "state"], calls, { id: "calls" })
      : h("p", { class: "muted" }, "no worker retains this transaction's invocations any more"),
    h("h2", {}, "Entities touched"), h("ul", { id: "entities" }, entities),
  ];
}

async function effectsView(params) {
  const { body } = await api("/v1/cluster");
  const workers = (body.status || {}).workers || [];
  const owners = workers.flatMap((w) => (w.pending_owners || []).map((o) => [o, w.node_id]));
  const rows = workers.map((w) =>
    h("tr", { "data-effects-worker": w.node_id, "data-timers": w.timers_pending ?? 0, "data-calls": w.external_calls_pending ?? 0 },
      h("td", {}, w.node_id), h("td", { "data-field": "calls-pending" }, w.external_calls_pending ?? 0),
      h("td", {}, w.external_calls_running ?? 0), h("td", { "data-field": "timers-pending" }, w.timers_pending ?? 0)));
  const out = [
    h("h1", {}, "Pending timers and external calls"),
    h("p", { class: "muted" }, "Counts as each worker's last heartbeat said; the entities listed are the first 20 per worker."),
    table(["worker", "calls pending", "calls running", "timers pending"], rows, { id: "effect-counts" }),
    h("h2", {}, `Entities with some pending (${owners.length})`),
    owners.length ? h("ul", { id: "owners" }, owners.map(([o, w]) => h("li", { "data-owner": o },
      h("a", { href: "#/effects?owner=" + encodeURIComponent(o) }, o), h("span", { class: "muted" }, ` on ${w}`))))
      : h("p", { class: "muted", id: "owners-none" }, "none"),
  ];
  const q = new URLSearchParams();
  for (const k of ["owner", "operator", "key", "key_type"]) if (params.get(k)) q.set(k, params.get(k));
  if (!q.has("owner") && !q.has("key")) return out;
  try {
    const { body: p } = await api("/v1/effects?" + q.toString());
    const calls = p.calls.map((c) => h("tr", { "data-call": c.id }, h("td", {}, h("code", {}, c.id)),
      h("td", {}, `${c.service}.${c.function}`), h("td", {}, JSON.stringify(c.args)), h("td", {}, c.then || "–")));
    const timers = p.timers.map((t) => h("tr", { "data-timer": t.id }, h("td", {}, h("code", {}, t.id)),
      h("td", {}, new Date(t.due_ms).toISOString()), h("td", {}, `${t.due_in_s} s`), h("td", {}, t.target), h("td", {}, JSON.stringify(t.args))));
    out.push(h("h2", {}, h("span", { id: "owner" }, p.owner)),
      h("h3", {}, `External calls (${calls.length})`),
      table(["idempotency key", "call", "arguments", "continuation"], calls, { id: "pending-calls" }),
      h("h3", {}, `Timers (${timers.length})`),
      table(["timer", "due", "in", "calls", "arguments"], timers, { id: "pending-timers" }));
  } catch (err) {
    out.push(failed(err));
  }
  return out;
}

async function entityView(params) {
  const { body: summary } = await api("/v1/operators");
  const operator = params.get("operator") || "", key = params.get("key") || "", keyType = params.get("key_type") || "str";
  const go = (event) => {
    event.preventDefault();
    const f = new FormData(event.target);
    location.hash = "#/entity?" + new URLSearchParams([...f.entries()]).toString();
  };
  const form = h("form", { class: "filters", onsubmit: go },
    h("select", { name: "operator" }, summary.operators.map((o) =>
      h("option", o.name === operator ? { value: o.name, selected: "" } : { value: o.name }, o.name))),
    h("input", { name: "key", value: key, placeholder: "key", required: "" }),
    h("select", { name: "key_type" }, ["str", "int"].map((t) => h("option", t === keyType ? { value: t, selected: "" } : { value: t }, t))),
    h("button", { type: "submit" }, "Get"));
  const out = [h("h1", {}, "Entities"), form];
  if (!operator || !key) return out;
  try {
    const path = `/v1/state/${encodeURIComponent(operator)}/${encodeURIComponent(key)}?key_type=${keyType}`;
    const { body } = await api(path);
    out.push(h("h2", {}, h("span", { id: "entity" }, `${body.operator}/${body.key}`)),
      fields([["function", body.function], ["read at epoch", body.epoch, "epoch"], ["tid", body.tid], ["consistency", body.consistency]]),
      h("div", { id: "value", "data-value": JSON.stringify(body.value) }, json(body.value)));
    if (summary.operators.some((o) => o.name === "styx.timers")) {
      const q = new URLSearchParams({ operator, key, key_type: keyType });
      out.push(h("p", {}, h("a", { href: "#/effects?" + q.toString(), id: "to-effects" }, "its pending timers and external calls")));
    }
  } catch (err) {
    out.push(failed(err));
  }
  return out;
}

async function render() {
  clearTimeout(timer);
  const { parts, params } = parseHash();
  const known = { invocations: true, invocation: parts.length > 1, entity: true, effects: true };
  const view = known[parts[0]] ? parts[0] : "cluster";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === (view === "invocation" ? "invocations" : view));
  try {
    if (view === "cluster") {
      show(...await clusterView());
      timer = setTimeout(render, REFRESH_MS);  // the cluster view follows the cluster
    } else {
      api("/v1/operators").then(({ body }) => badge(body.state, body.ready), () => {});
      if (view === "invocations") show(...await invocationsView(params));
      else if (view === "invocation") show(...await invocationView(parts[1]));
      else if (view === "effects") show(...await effectsView(params));
      else show(...await entityView(params));
    }
    document.body.dataset.view = view;
    document.body.dataset.shown = location.hash;  // what the page shows now (tests wait for it)
  } catch (err) {
    show(failed(err));
  }
}

window.addEventListener("hashchange", render);
render();
