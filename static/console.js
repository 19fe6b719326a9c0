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

function adminHeaders() {
  const token = $("admin-token").value.trim();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

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
  const answer = await response.json();
  $("publish-result").textContent = response.ok ? `published: ${JSON.stringify(answer.offsets)}` : `${response.status} ${answer.error.code}: ${answer.error.message}`;
};

function fillTable(id, rows, columns) {
  const body = $(id).tBodies[0];
  body.replaceChildren(
    ...rows.map((row) => {
      const tr = document.createElement("tr");
      for (const column of columns) tr.append(cell(column(row)));
      return tr;
    }),
  );
}

const when = (ms) => (ms ? new Date(ms).toISOString() : "");

/** Asks the gateway to deliver `client_id`'s dead letters on `topic` again (up to 1000). */
async function redrive(topic, clientId) {
  const response = await fetch("/admin/dead-letters/redrive", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...adminHeaders() },
    body: JSON.stringify({ topic, client_id: clientId, limit: 1000 }),
  });
  const answer = await response.json();
  if (response.ok) log(`redrive ${topic} for ${clientId}: ${answer.redriven} dead letters${answer.next ? " (more remain: redrive again)" : ""}`);
  else log(`redrive failed: ${response.status} ${answer.error.code}: ${answer.error.message}`);
  refreshAdmin();
}

function fillDeadLetters(deadLetters) {
  fillTable("dead-letters", deadLetters, [
    (d) => d.topic, (d) => d.client_id, (d) => d.partition, (d) => d.offset, (d) => d.attempts, (d) => d.reason, (d) => when(d.at),
  ]);
  const rows = $("dead-letters").tBodies[0].rows;
  deadLetters.forEach((d, i) => {
    const td = document.createElement("td");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "small redrive";
    b.textContent = "redrive";
    b.title = `deliver ${d.client_id}'s dead letters on ${d.topic} again`;
    b.onclick = () => redrive(d.topic, d.client_id);
    td.append(b);
    rows[i].append(td);
  });
}

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
  fillTable("topics", rows, [(r) => r.topic, (r) => r.partition, (r) => r.log_start, (r) => r.log_end, (r) => r.pull_offset ?? ""]);
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

/** An admin list's path, asked of the whole cluster when the box says so. */
function scoped(path) {
  return $("cluster-scope").checked ? `${path}?scope=cluster` : path;
}
$("cluster-scope").addEventListener("change", () => refreshAdmin());

async function refreshAdmin() {
  refreshTopics();
  try {
    const answers = await Promise.all(
      ["/admin/sessions", "/admin/offsets", "/admin/dead-letters", "/admin/gaps", "/admin/groups"].map(async (path) => {
        path = scoped(path);
        const response = await fetch(path, { headers: adminHeaders() });
        const body = await response.json();
        if (!response.ok) throw new Error(`${path}: ${response.status} ${body.error.code}`);
        return body;
      }),
    );
    const [sessions, offsets, deadLetters, gaps, groups] = answers;
    fillTable("sessions", sessions.sessions, [
      (s) => s.session_id, (s) => s.client_id, (s) => s.transport,
      (s) => [...s.subscriptions, ...(s.groups || []).map((g) => `${g.topic} (group ${g.group})`)].join(", "), (s) => s.in_flight,
      (s) => s.delivered, (s) => s.acked, (s) => s.redelivered, (s) => s.window_full, (s) => s.instance ?? "",
    ]);
    fillTable("offsets", offsets.offsets, [
      (o) => o.key, (o) => o.committed, (o) => o.last_acked ?? "", (o) => when(o.updated_at), (o) => o.instance ?? "",
    ]);
    fillDeadLetters(deadLetters.dead_letters);
    fillTable("groups", groups.groups, [
      (g) => g.topic, (g) => g.group, (g) => g.order,
      (g) => g.members.map((m) => `${m.client_id} (${m.in_flight} in flight, ${m.keys} keys)`).join(", "),
      (g) => g.in_flight, (g) => g.waiting,
    ]);
    fillTable("gaps", gaps.gaps, [(g) => g.topic, (g) => g.client_id, (g) => g.partition, (g) => g.from, (g) => g.to, (g) => when(g.at)]);
    // With the whole cluster: the peers that did not answer (their rows are missing).
    const unreachable = [...new Set(answers.flatMap((a) => a.unreachable ?? []))];
    $("admin-error").textContent = unreachable.length ? `not answering: ${unreachable.join(", ")}` : "";
  } catch (err) {
    $("admin-error").textContent = `${err.message} (set the admin token above)`;
  }
}

refreshAdmin();
setInterval(refreshAdmin, 2000);
