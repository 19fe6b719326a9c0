// The console page: wires the form controls to an AckgateClient and polls the admin routes.
import { AckgateClient } from "./ackgate.js";

/** Rows the events table keeps (the newest first); older ones are dropped. */
const MAX_EVENT_ROWS = 500;

const $ = (id) => document.getElementById(id);
let client = null;

function log(line) {
  const now = new Date().toISOString().slice(11, 23);
  $("log").textContent = `${now} ${line}\n` + $("log").textContent.slice(0, 20000);
}

function setStatus(state, text) {
  $("status").textContent = text;
  $("status").className = `status ${state}`;
}

function setConnected(on, text) {
  $("status").textContent = text;
  $("status").className = `status ${on ? "on" : "off"}`;
  $("connect").disabled = on;
  $("disconnect").disabled = !on;
  $("subscribe").disabled = !on;
}

/** Where the admin token is kept: this tab's sessionStorage (gone when the tab closes). */
const TOKEN_KEY = "ackgate.console.adminToken";

/** The admin token saved (Save in the bar at the top), kept in this tab's sessionStorage. */
let adminToken = "";
try {
  adminToken = sessionStorage.getItem(TOKEN_KEY) ?? "";
} catch {
  // Storage refused (a sandboxed frame): the token lives in this page only.
}

/** The headers of every admin request (and of publishing): the saved admin token, if any. */
function adminHeaders() {
  return adminToken ? { Authorization: `Bearer ${adminToken}` } : {};
}

/**
 * What the last admin answer said of the token: "ok", "needed" (401: none sent) or "wrong"
 * (403). Anything but "ok" shows the banner at the top and empties the admin tables.
 */
let tokenState = "ok";

function showTokenState() {
  $("admin-token-state").textContent = adminToken ? "saved for this tab" : "none saved";
  const banner = $("admin-banner");
  banner.hidden = tokenState === "ok";
  banner.className = `banner ${tokenState}`;
  banner.textContent =
    tokenState === "needed"
      ? "Admin token needed: this gateway has auth.admin_token set, and its admin routes (the sessions, offsets and dead-letter tables) and publishing answer 401 without it. Enter it above and press Save."
      : tokenState === "wrong"
        ? "Admin token wrong: the gateway answers 403 to the one saved. Enter its auth.admin_token above and press Save."
        : "";
}

/** Notes an admin answer's status: 401 and 403 raise the banner, any other status clears it. */
function noteAdminStatus(status) {
  const state = status === 401 ? "needed" : status === 403 ? "wrong" : "ok";
  if (state !== tokenState) {
    tokenState = state;
    showTokenState();
  }
}

$("admin-token-form").onsubmit = (e) => {
  e.preventDefault();
  adminToken = $("admin-token").value.trim();
  try {
    if (adminToken) sessionStorage.setItem(TOKEN_KEY, adminToken);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {}
  log(adminToken ? "admin token saved for this tab" : "admin token forgotten");
  showTokenState();
  refreshAdmin();
};
$("admin-token-forget").onclick = () => {
  $("admin-token").value = "";
  $("admin-token-form").requestSubmit();
};
$("admin-token").value = adminToken;
showTokenState();

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function settle(row, state) {
  row.className = state;
  row.dataset.state = state;
  row.querySelector("td.state").textContent = state;
  for (const button of row.querySelectorAll("button")) button.disabled = true;
}

function showEvent(event) {
  const row = document.createElement("tr");
  row.dataset.deliveryId = event.delivery_id;
  row.dataset.state = "in flight";
  row.dataset.partition = event.partition;
  row.dataset.offset = event.offset;
  const payload = event.payload !== undefined ? JSON.stringify(event.payload) : `base64:${event.payload_base64}`;
  const attempt = event.redrive ? `${event.attempt} (redrive)` : String(event.attempt);
  for (const value of [event.delivery_id, event.topic, event.partition, event.offset, attempt]) row.append(cell(String(value)));
  row.append(cell(payload, "payload"), cell("in flight", "state"));
  const actions = document.createElement("td");
  const button = (label, action) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = `small ${label}`;
    b.textContent = label;
    b.onclick = action;
    actions.append(b);
  };
  button("ack", async () => {
    try {
      const ok = await client.ack(event.delivery_id, { confirm: true });
      settle(row, "acked");
      log(`ack_ok committed=${JSON.stringify(ok.committed)}`);
    } catch (e) {
      log(`ack failed: ${e.message}`);
    }
  });
  button("nack", () => {
    client.nack(event.delivery_id);
    settle(row, "nacked");
  });
  button("term", () => {
    client.term(event.delivery_id, "terminated from the console");
    settle(row, "termed");
  });
  row.append(actions);
  const body = $("events").tBodies[0];
  body.prepend(row);
  // A busy topic must not grow the page without bound: the newest rows stay.
  while (body.rows.length > MAX_EVENT_ROWS) body.deleteRow(-1);
  if ($("auto-ack").checked) actions.querySelector("button.ack").click();
}

$("connect-form").onsubmit = async (e) => {
  e.preventDefault();
  const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
  try {
    client = makeClient(wsUrl);
  } catch (err) {
    // The client checks the id before it connects (the gateway would refuse it with 400).
    setConnected(false, "invalid client id");
    log(err.message);
    return;
  }
  try {
    const welcome = await client.connect();
    setConnected(true, `connected as ${welcome.client_id}`);
    $("session-info").textContent = `session ${welcome.session_id} on ${welcome.instance}, ack_timeout_ms ${welcome.ack_timeout_ms}, max_in_flight ${welcome.max_in_flight}`;
    log(`welcome ${JSON.stringify(welcome)}`);
  } catch (err) {
    setConnected(false, "connection failed");
    log(err.message);
  }
};

/** The console's client for the form's settings (throws on an invalid client id). */
function makeClient(wsUrl) {
  return new AckgateClient(wsUrl, {
    clientId: $("client-id").value.trim(),
    // A session of its own, as an operator expects of a console: connecting (here or in another
    // tab) with a client id in use takes that session over.
    tabs: "own",
    token: $("token").value.trim() || undefined,
    peers: $("peers").value.split(",").map((u) => u.trim()).filter(Boolean),
    onEvent: showEvent,
    onError: (frame) => log(`error ${frame.code}: ${frame.message}`),
    onClose: ({ code, reason, final }) => {
      log(`socket closed ${code} ${reason}${final ? "" : " (reconnecting)"}`);
      if (final) setConnected(false, `closed ${code}`);
      else setStatus("reconnecting", `reconnecting after ${code}`);
    },
    onReconnect: ({ attempt, delayMs, url, welcome, error }) => {
      if (welcome) {
        setConnected(true, `connected as ${welcome.client_id} on ${welcome.instance} (reconnect ${attempt})`);
        $("session-info").textContent = `session ${welcome.session_id} on ${welcome.instance}`;
        log(`reconnected to ${url} (attempt ${attempt}): ${JSON.stringify(welcome)}`);
      } else if (error) {
        log(`reconnect attempt ${attempt} to ${url} failed: ${error}`);
      } else {
        setStatus("reconnecting", `reconnecting (attempt ${attempt}) to ${url}`);
        log(`reconnect attempt ${attempt} after ${delayMs} ms: ${url}`);
      }
    },
  });
}

$("disconnect").onclick = () => client?.close();

$("subscribe-form").onsubmit = async (e) => {
  e.preventDefault();
  const from = $("from").value || undefined;
  try {
    const subscribed = await client.subscribe($("topic").value.trim(), { from });
    log(`subscribed ${subscribed.topic} ${JSON.stringify(subscribed.partitions)}`);
    $("session-info").dataset.subscribed = subscribed.topic;
  } catch (err) {
    log(`subscribe failed: ${err.message}`);
  }
};

$("publish-form").onsubmit = async (e) => {
  e.preventDefault();
  let payload;
  try {
    payload = JSON.parse($("publish-payload").value);
  } catch (err) {
    $("publish-result").textContent = `payload is not JSON: ${err.message}`;
    return;
  }
  const body = { payload };
  if ($("publish-key").value.trim()) body.key = $("publish-key").value.trim();
  const topic = encodeURIComponent($("publish-topic").value.trim());
  const response = await fetch(`/topics/${topic}/events`, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...adminHeaders() },
    body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401 || response.status === 403) noteAdminStatus(response.status);
  $("publish-result").textContent = response.ok ? `published: ${JSON.stringify(answer.offsets)}` : `${response.status} ${answer.error?.code}: ${answer.error?.message}`;
};

/**
 * Fills table `id` with `rows`: each of `columns` is a function of a row giving the cell's text
 * (or a node, e.g. buttons), or `[function, className]`. An empty list shows `empty` in the
 * table's foot instead.
 */
function fillTable(id, rows, columns, empty = "none") {
  const body = $(id).tBodies[0];
  body.replaceChildren(
    ...rows.map((row) => {
      const tr = document.createElement("tr");
      for (const column of columns) {
        const [value, className] = typeof column === "function" ? [column] : column;
        const content = value(row);
        if (content instanceof Node) {
          const td = cell("", className);
          td.append(content);
          tr.append(td);
        } else {
          tr.append(cell(String(content ?? ""), className));
        }
      }
      return tr;
    }),
  );
  setNote(id, rows.length ? "" : empty);
}

/** A line in table `id`'s foot, across every column: why it has no rows ("" hides it). */
function setNote(id, text, isError = false) {
  const table = $(id);
  const foot = table.tFoot ?? table.createTFoot();
  const td = foot.rows[0]?.cells[0] ?? foot.insertRow().insertCell();
  td.className = isError ? "note error" : "note";
  td.colSpan = table.tHead.rows[0].cells.length;
  td.textContent = text;
  foot.hidden = !text;
}

/** Table `id` without rows, for a reason (an error, or no admin token). */
function emptyTable(id, text, isError) {
  $(id).tBodies[0].replaceChildren();
  setNote(id, text, isError);
}

const when = (ms) => (ms ? new Date(ms).toISOString() : "");

/** How long ago `ms` (epoch ms) was, for a person: "3 s ago", "5 min ago"; null is "never". */
function ago(ms) {
  if (!ms) return "never";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 120) return `${s} s ago`;
  if (s < 7200) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

/** A time cell: relative, with the exact time as its tooltip. */
function agoCell(ms) {
  const span = document.createElement("span");
  span.textContent = ago(ms);
  if (ms) span.title = when(ms);
  return span;
}

/** A small button of class `className` running `action`. */
function actionButton(label, className, title, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = `small ${className}`;
  b.textContent = label;
  b.title = title;
  b.onclick = () => action(b);
  return b;
}

function actions(...buttons) {
  const span = document.createElement("span");
  span.className = "actions";
  span.append(...buttons);
  return span;
}

/** The admin routes' answer to a request: its status and JSON body; notes a 401 or 403. */
async function adminCall(method, path, body) {
  const headers = { ...adminHeaders() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  noteAdminStatus(response.status);
  return { status: response.status, ok: response.ok, answer: await response.json().catch(() => ({})) };
}

const errorText = ({ status, answer }) => `${status} ${answer.error?.code ?? ""}: ${answer.error?.message ?? ""}`;

/** The answer's count (`redriven`, `deleted`) here plus the peers' (with ?scope=cluster). */
const counted = (answer, field) => (answer[field] ?? 0) + (answer.peers ?? []).reduce((n, p) => n + (p.answer?.[field] ?? 0), 0);

/** The outcome of an action on table `id`, under it and in the log. */
function result(id, text, isError = false) {
  const p = $(`${id}-result`);
  p.textContent = `${new Date().toISOString().slice(11, 19)} ${text}`;
  p.className = isError ? "result error" : "result";
  log(text);
}

/** `?scope=cluster` for an action when the box asks for the whole cluster. */
const actionScope = () => ($("cluster-scope").checked ? "?scope=cluster" : "");

/** Rows per page of the searchable admin tables (the box above them; 50 by default). */
function pageSize() {
  const n = Number($("page-size").value);
  return Number.isInteger(n) && n >= 1 && n <= 1000 ? n : 50;
}

/**
 * A searchable, paged admin list: table `id` from `path`, filtered by the search form above it
 * (client_id and topic, each exact), a page of `pageSize()` rows; Next asks for the page after
 * the answer's `next`, First for the first again.
 */
function pagedList(id, path) {
  const list = { id, filters: {}, after: "", next: "", page: 1 };
  list.path = () => {
    const query = new URLSearchParams(list.filters);
    query.set("limit", String(pageSize()));
    if (list.after) query.set("after", list.after);
    if ($("cluster-scope").checked) query.set("scope", "cluster");
    return `${path}?${query}`;
  };
  list.turn = (after, page) => {
    Object.assign(list, { after, page, next: "" });
    showPaging(list);
    refreshAdmin();
  };
  $(`${id}-search`).addEventListener("submit", (e) => {
    e.preventDefault();
    list.filters = {};
    const clientId = $(`${id}-client-id`).value.trim();
    const topic = $(`${id}-topic`).value.trim();
    if (clientId) list.filters.client_id = clientId;
    if (topic) list.filters.topic = topic;
    list.turn("", 1);
  });
  $(`${id}-first`).onclick = () => list.turn("", 1);
  $(`${id}-next`).onclick = () => list.next && list.turn(list.next, list.page + 1);
  showPaging(list);
  return list;
}

function showPaging(list, more = "") {
  const filters = Object.entries(list.filters).map(([k, v]) => `${k}=${v}`);
  $(`${list.id}-page`).textContent = [`page ${list.page}`, ...filters, more].filter(Boolean).join(", ");
  $(`${list.id}-first`).disabled = list.page === 1 && !list.after;
  $(`${list.id}-next`).disabled = !list.next;
}

/** Fills a paged list from its answer (`rows` of it), or says why it is empty. */
function fillPage(list, answer, rows, columns, what) {
  list.next = answer.next ?? "";
  // A whole-cluster answer pages each instance apart (next_by_instance): not paged here.
  const more = answer.next_by_instance && Object.keys(answer.next_by_instance).length ? "more on some instances (page them without the whole cluster)" : "";
  showPaging(list, more);
  // The instance column only when rows have one (the whole cluster, or ?scope=local).
  $(list.id).classList.toggle("no-instance", !rows.some((r) => r.instance));
  const filtered = Object.keys(list.filters).length ? ` matching ${Object.entries(list.filters).map(([k, v]) => `${k}=${v}`).join(", ")}` : "";
  fillTable(list.id, rows, columns, list.page > 1 ? `no more ${what}${filtered} (First goes back)` : `no ${what}${filtered}`);
}

const sessionsList = pagedList("sessions", "/admin/sessions");
const offsetsList = pagedList("offsets", "/admin/offsets");
const deadLettersList = pagedList("dead-letters", "/admin/dead-letters");

$("page-size").addEventListener("change", () => {
  for (const list of [sessionsList, offsetsList, deadLettersList]) Object.assign(list, { after: "", page: 1, next: "" });
  refreshAdmin();
});

async function disconnectSession(s) {
  if (!confirm(`Disconnect session ${s.session_id} of ${s.client_id}? It is closed with 4002; the client may reconnect.`)) return;
  const answer = await adminCall("DELETE", `/admin/sessions/${encodeURIComponent(s.session_id)}`);
  if (answer.ok) result("sessions", `disconnected session ${s.session_id} of ${s.client_id}`);
  else if (answer.status === 404 && s.instance) result("sessions", `${errorText(answer)} (a session of instance ${s.instance}: disconnect it from that instance's console)`, true);
  else result("sessions", `disconnecting ${s.session_id}: ${errorText(answer)}`, true);
  refreshAdmin();
}

const SESSION_COLUMNS = [
  (s) => s.session_id,
  (s) => s.client_id,
  (s) => s.transport,
  (s) => [...s.subscriptions, ...(s.groups || []).map((g) => `${g.topic} (group ${g.group})`)].join(", "),
  [(s) => s.in_flight, "in-flight"],
  (s) => s.delivered,
  (s) => s.acked,
  (s) => s.redelivered,
  [(s) => agoCell(s.last_ack_at), "last-ack"],
  [(s) => (s.window_full ? Object.assign(document.createElement("strong"), { textContent: "full" }) : "no"), "window-full"],
  [(s) => agoCell(s.connected_at), "connected"],
  [(s) => s.instance ?? "", "instance"],
  (s) => actions(actionButton("Disconnect", "disconnect", `close session ${s.session_id} (4002)`, () => disconnectSession(s))),
];

/** Sets one partition's committed offset (the client must be offline: 409 while it is live). */
async function resetOffset(o) {
  const asked = prompt(
    `Reset ${o.client_id}'s offset on ${o.topic} partition ${o.partition} (committed ${o.committed}, log end ${o.log_end ?? "unknown"}).\n` +
      `The next event delivered: an offset from 0 to the log end, "end" (the log end: skip the backlog), or a time such as 2026-01-31T12:00Z.`,
    o.log_end == null ? String(o.committed) : "end",
  );
  if (asked === null || !asked.trim()) return;
  const text = asked.trim();
  let body;
  if (text === "end") {
    if (o.log_end == null) return result("offsets", `${o.key}: the log end is unknown (the log did not answer); give an offset`, true);
    body = { offset: o.log_end };
  } else if (/^\d+$/.test(text)) {
    body = { offset: Number(text) };
  } else if (!Number.isNaN(Date.parse(text))) {
    body = { time: Date.parse(text) };
  } else {
    return result("offsets", `${o.key}: "${text}" is no offset, "end" or time`, true);
  }
  const path = `/admin/offsets/${encodeURIComponent(o.topic)}/${encodeURIComponent(o.client_id)}/${o.partition}${actionScope()}`;
  const answer = await adminCall("PUT", path, body);
  if (answer.ok) result("offsets", `reset ${o.key} from ${o.committed} to ${answer.answer.committed}`);
  else if (answer.status === 409) result("offsets", `not reset, ${o.client_id} is connected: ${errorText(answer)}. Disconnect its sessions (Sessions table), then reset before it reconnects.`, true);
  else result("offsets", `resetting ${o.key}: ${errorText(answer)}`, true);
  refreshAdmin();
}

const OFFSET_COLUMNS = [
  (o) => o.key,
  [(o) => o.committed, "committed"],
  (o) => o.last_acked ?? "",
  [(o) => o.log_end ?? "?", "log-end"],
  [(o) => o.lag ?? "?", "lag"],
  [(o) => agoCell(o.updated_at), "updated"],
  [(o) => o.instance ?? "", "instance"],
  // A group's floor ($ + its name) is reset through /admin/groups.
  (o) => (o.client_id.startsWith("$") ? "" : actions(actionButton("Reset", "reset", `set ${o.key}'s committed offset`, () => resetOffset(o)))),
];

/** Redrives (delivers again) or deletes the one dead letter `d`: its partition and offset. */
async function deadLetterAction(d, action) {
  const what = `${d.topic}/${d.client_id} partition ${d.partition} offset ${d.offset}`;
  if (action === "delete" && !confirm(`Delete the dead letter ${what} for good?`)) return;
  const body = { topic: d.topic, client_id: d.client_id, partition: d.partition, offset: d.offset };
  const answer = await adminCall("POST", `/admin/dead-letters/${action}${actionScope()}`, body);
  if (!answer.ok) result("dead-letters", `${action} ${what}: ${errorText(answer)}`, true);
  else if (action === "redrive") result("dead-letters", `redriven ${counted(answer.answer, "redriven")}: ${what} (${d.client_id} gets it now if connected here, else at its next subscribe; its ack removes the dead letter)`);
  else result("dead-letters", `deleted ${counted(answer.answer, "deleted")}: ${what}`);
  refreshAdmin();
}

const DEAD_LETTER_COLUMNS = [
  (d) => d.topic,
  (d) => d.client_id,
  (d) => d.partition,
  [(d) => d.offset, "offset"],
  (d) => d.attempts,
  (d) => d.reason,
  (d) => agoCell(d.at),
  [(d) => d.instance ?? "", "instance"],
  (d) =>
    actions(
      actionButton("Redrive", "redrive", `deliver this dead letter (offset ${d.offset}) to ${d.client_id} again`, () => deadLetterAction(d, "redrive")),
      actionButton("Delete", "delete", `remove this dead letter (offset ${d.offset}) for good`, () => deadLetterAction(d, "delete")),
    ),
];

/** The page of topics shown: the topics, or one page of a lite parent's lite topics. */
const topicsPage = { parent: "", after: "", next: "" };

function topicsPath() {
  if (!topicsPage.parent) return "/topics";
  const query = new URLSearchParams({ parent: topicsPage.parent, limit: "100" });
  if (topicsPage.after) query.set("after", topicsPage.after);
  return `/topics?${query}`;
}

function fillTopics(answer) {
  const rows = answer.topics.flatMap((t) => t.partitions.map((p) => ({ topic: t.name, ...p })));
  fillTable("topics", rows, [(r) => r.topic, (r) => r.partition, (r) => r.log_start, (r) => r.log_end, (r) => r.pull_offset ?? ""], "no topics");
  topicsPage.next = answer.next ?? "";
  $("lite-next").hidden = !topicsPage.next;
}

$("lite-form").addEventListener("submit", (e) => {
  e.preventDefault();
  Object.assign(topicsPage, { parent: $("lite-parent").value.trim(), after: "", next: "" });
  $("lite-next").hidden = true;
  refreshAdmin();
});
$("lite-next").onclick = () => {
  topicsPage.after = topicsPage.next;
  refreshAdmin();
};

/** The topics table, apart from the admin tables: a name that is no lite parent stops only it. */
async function refreshTopics() {
  const path = topicsPath();
  // An answer to a page no longer asked for (the parent or page changed meanwhile) is dropped.
  const current = () => path === topicsPath();
  try {
    const response = await fetch(path);
    const body = await response.json().catch(() => ({}));
    if (!current()) return;
    if (!response.ok) throw new Error(`${path}: ${response.status} ${body.error?.code ?? ""}: ${body.error?.message ?? ""}`);
    fillTopics(body);
    $("topics-error").textContent = "";
  } catch (err) {
    if (!current()) return;
    fillTopics({ topics: [] });
    $("topics-error").textContent = err.message;
  }
}

/** An unpaged admin list's path, asked of the whole cluster when the box says so. */
function scoped(path) {
  return $("cluster-scope").checked ? `${path}?scope=cluster` : path;
}
$("cluster-scope").addEventListener("change", () => {
  for (const list of [sessionsList, offsetsList, deadLettersList]) Object.assign(list, { after: "", page: 1, next: "" });
  refreshAdmin();
});

/**
 * Loads one admin table: `path()` asked now, `fill(answer)` with a 200, else the table says why
 * it is empty ("admin token needed" on a 401 or 403). An answer to a path no longer asked for (a
 * search or page turned meanwhile) is dropped. Resolves to the peers that did not answer.
 */
async function loadTable(id, path, fill) {
  const asked = path();
  try {
    const answer = await adminCall("GET", asked);
    if (asked !== path()) return [];
    if (answer.status === 401 || answer.status === 403) {
      emptyTable(id, answer.status === 401 ? "admin token needed" : "admin token needed (the one saved is wrong)", true);
    } else if (!answer.ok) {
      emptyTable(id, `${asked}: ${errorText(answer)}`, true);
    } else {
      fill(answer.answer);
      return answer.answer.unreachable ?? [];
    }
  } catch (err) {
    if (asked === path()) emptyTable(id, `${asked}: ${err.message} (is the gateway up?)`, true);
  }
  return [];
}

async function refreshOnce() {
  const unreachable = await Promise.all([
    refreshTopics().then(() => []),
    loadTable("sessions", sessionsList.path, (a) => fillPage(sessionsList, a, a.sessions, SESSION_COLUMNS, "sessions")),
    loadTable("offsets", offsetsList.path, (a) => fillPage(offsetsList, a, a.offsets, OFFSET_COLUMNS, "offsets")),
    loadTable("dead-letters", deadLettersList.path, (a) => fillPage(deadLettersList, a, a.dead_letters, DEAD_LETTER_COLUMNS, "dead letters")),
    loadTable("groups", () => scoped("/admin/groups"), (a) =>
      fillTable("groups", a.groups, [
        (g) => g.topic, (g) => g.group, (g) => g.order,
        (g) => g.members.map((m) => `${m.client_id} (${m.in_flight} in flight, ${m.keys} keys)`).join(", "),
        (g) => g.in_flight, (g) => g.waiting,
      ], "no shared subscriptions"),
    ),
    loadTable("gaps", () => scoped("/admin/gaps"), (a) =>
      fillTable("gaps", a.gaps, [(g) => g.topic, (g) => g.client_id, (g) => g.partition, (g) => g.from, (g) => g.to, (g) => when(g.at)], "no gaps"),
    ),
  ]);
  // With the whole cluster: the peers that did not answer (their rows are missing).
  const silent = [...new Set(unreachable.flat())];
  $("admin-error").textContent = silent.length ? `not answering: ${silent.join(", ")}` : "";
}

/** One refresh at a time: asked during one, another follows it (so an action's effect shows). */
let refreshing = null;
let refreshAgain = false;

function refreshAdmin() {
  if (refreshing) {
    refreshAgain = true;
    return refreshing;
  }
  refreshing = (async () => {
    do {
      refreshAgain = false;
      await refreshOnce();
    } while (refreshAgain);
  })().finally(() => (refreshing = null));
  return refreshing;
}

refreshAdmin();
setInterval(refreshAdmin, 2000);
