// ralph-dev dashboard: draws the state document (GET /api/v1/state) and keeps it current
// from the server-sent event stream (/api/v1/events). Issue titles, questions and pane
// text are data: they only ever go into the page as text (textContent), never as HTML.
"use strict";

const COLUMNS = [
  ["held", "Needs you / held"], ["ready", "Ready"], ["running", "Running"],
  ["blocked", "Blocked"], ["waiting", "Waiting"], ["done", "Done"],
];
const PANE_LINES = 40;
const PANE_EVERY_MS = 3000;
const EVENTS_KEPT = 200;
const STALE_AFTER_MS = 10000;

let lastDocumentAt = 0;

const timeFormat = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short",
});
const dateTimeFormat = new Intl.DateTimeFormat(undefined, {
  month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", timeZoneName: "short",
});

function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const today = new Date().toDateString() === date.toDateString();
  return (today ? timeFormat : dateTimeFormat).format(date);
}

function timeEl(iso) {
  return el("time", { datetime: iso }, when(iso));
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 120) return `${Math.round(seconds)}s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)}m`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)}h`;
  return `${(seconds / 86400).toFixed(1)}d`;
}

function fact(text, tone) {
  return el("li", { "data-tone": tone }, text);
}

const clockFormat = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit", minute: "2-digit", hourCycle: "h23",
});
const dayClockFormat = new Intl.DateTimeFormat(undefined, {
  month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hourCycle: "h23",
});

function pauseFact(pause) {
  // a limit by its reset as HH:MM (the date when not today) in this browser's zone
  const lifts = pause.lifts ? new Date(pause.lifts) : null;
  const today = lifts && new Date().toDateString() === lifts.toDateString();
  const text = lifts ? `usage limit until ${(today ? clockFormat : dayClockFormat).format(lifts)}`
                     : pause.headline;
  return el("li", { "data-tone": "bad", "data-pause": pause.kind, title: pause.cause }, text);
}

function laneFact(lane) {
  // the merge lane: the verify running beside the loop, what waits, what went back
  const run = lane.run;
  let text = "merges: idle";
  let tone = null;
  if (run && run.kind === "trunk") {
    text = `verifying trunk (${run.state})`;
  } else if (run && run.state === "running") {
    text = `verifying ${run.batch.join(", ")}` + (run.since ? ` since ${when(run.since)}` : "")
      + (run.step ? ` (${run.step})` : "");
  } else if (run && run.state === "failed") {
    text = `${run.batch.join(", ")} failed the verify`;
    tone = "bad";
  } else if (run && run.why) {
    text = `last batch: ${run.why}`;
  }
  if (lane.waiting.length) text += `; waiting: ${lane.waiting.join(", ")}`;
  const back = lane.sent_back[0];
  const title = back ? `last sent back: ${back.issue}: ${back.why || ""}` : lane.mode;
  return el("li", { "data-tone": tone, "data-lane": run ? run.state : "idle", title }, text);
}

function renderFacts(doc) {
  const facts = (doc.pauses || []).map(pauseFact);
  facts.push(fact(doc.daemon.running ? "daemon running" : "daemon stopped",
                  doc.daemon.running ? "good" : "bad"));
  const ctl = doc.controller;
  facts.push(fact(ctl.healthy ? `controller ok (tick ${ctl.tick ?? "?"})`
                              : `controller: ${ctl.why}`, ctl.healthy ? "good" : "bad"));
  const trunk = doc.trunk;
  facts.push(fact(`trunk ${trunk.name} ${trunk.head ? trunk.head.slice(0, 8) : "?"}: ${trunk.colour}`,
                  trunk.colour === "red" ? "bad" : trunk.colour === "green" ? "good" : null));
  const lane = doc.lane;
  if (lane) facts.push(laneFact(lane));
  const usage = doc.tracker.usage;
  if (!doc.tracker.ok) facts.push(fact(`tracker: ${doc.tracker.error}`, "bad"));
  else if (usage && usage.requests_this_hour !== undefined) {
    facts.push(fact(`tracker ${usage.requests_this_hour} req / ${usage.complexity_this_hour ?? "?"} complexity this hour`));
  } else facts.push(fact(`tracker ${doc.tracker.kind}`));
  const counts = doc.issues;
  facts.push(fact(`${counts.done}/${counts.total} done`));
  if (doc.host) {  // [host] max_workers: every project's workers on this host
    const parts = Object.entries(doc.host.projects).map(([name, load]) => `${name} ${load.used}`);
    facts.push(fact(`host ${doc.host.used}/${doc.host.max_workers} workers (${parts.join(", ")})`));
  }
  if (doc.account) {  // the account's usage windows, as the model API last stated them
    for (const w of doc.account.windows) {
      facts.push(fact(`${w.label} window ${Math.round(w.used * 100)}% used, resets ${when(w.resets_at)}`,
                      w.used >= 1 - doc.account.reserve ? "bad" : null));
    }
    if (doc.account.pacing) facts.push(fact(`pacing until ${when(doc.account.pacing.until)}: ${doc.account.pacing.why}`, "bad"));
  }
  if (doc.costs.known) {
    const tokens = Object.entries(doc.costs.tokens || {}).map(([k, v]) => `${k} ${v}`).join(", ");
    const cost = doc.costs.cost_usd !== null ? `$${doc.costs.cost_usd.toFixed(2)} ` : "";
    facts.push(fact(`live workers: ${cost}${tokens}`));
  }
  document.getElementById("facts").replaceChildren(...facts);
}

function renderNeeds(doc) {
  const section = document.getElementById("needs-you");
  const items = doc.needs_you.map((need) => el("li", { "data-kind": need.kind, "data-issue": need.issue },
    need.issue ? el("strong", {}, `${need.issue} `) : null,
    need.title ? `${need.title} ` : null,
    need.since ? el("span", { class: "more" }, `(since ${when(need.since)})`) : null,
    need.issue ? el("div", { class: "question" }, need.message) : need.message));
  document.getElementById("needs-list").replaceChildren(...items);
  section.hidden = items.length === 0;
}

function waitNote(wait) {
  // what the controller's last plan said it waits on: a retry's due time, a free slot…
  const until = wait.until ? ` (until ${new Date(wait.until).toLocaleTimeString()})` : "";
  const error = wait.last_error ? `; last: ${wait.last_error}` : "";
  return `${wait.why}${until}${error}`;
}

function cardNote(column, item) {
  if (column === "held") return item.question || item.why;
  if (item.wait && column !== "blocked") return waitNote(item.wait);
  if (column === "blocked") return `blocked by ${item.blocked_by}`;
  if (column === "waiting") return item.why;
  if (column === "running") return item.has_worker ? "worker running" : "no live worker";
  if (column === "done") return item.state;
  return item.priority ? `priority ${item.priority}` : null;
}

function renderBoard(doc) {
  const columns = COLUMNS.map(([name, title]) => {
    const items = doc.board[name] || [];
    const count = doc.issues[name] ?? items.length;
    const cards = items.map((item) => el("div", {
      class: "card", "data-issue": item.identifier, "data-column": name,
      "data-needs-you": name === "held" ? String(item.needs_you) : null,
    }, el("div", { class: "id" }, item.identifier), el("div", { class: "title" }, item.title),
       cardNote(name, item) ? el("div", { class: "note" }, cardNote(name, item)) : null));
    const more = count > items.length ? el("div", { class: "more" }, `… ${count - items.length} more`) : null;
    return el("div", { class: "column", "data-column": name },
      el("h3", {}, `${title} (${count})`), cards, more);
  });
  document.getElementById("board").replaceChildren(...columns);
}

const panes = new Map(); // issue -> <pre>, kept across redraws so text does not flicker

function renderWorkers(doc) {
  const box = document.getElementById("workers");
  if (!doc.workers.length) {
    box.replaceChildren(el("p", { class: "empty" }, "no workers"));
    panes.clear();
    return;
  }
  const seen = new Set();
  const cards = doc.workers.map((w) => {
    seen.add(w.issue);
    let pane = panes.get(w.issue);
    if (!pane) {
      pane = el("pre", { class: "pane", "data-issue": w.issue }, "…");
      panes.set(w.issue, pane);
    }
    const cost = w.cost_usd !== null ? ` · $${w.cost_usd.toFixed(2)}` : "";
    const tokens = w.tokens ? ` · ${Object.values(w.tokens).reduce((a, b) => a + b, 0)} tokens` : "";
    return el("div", { class: "worker", "data-issue": w.issue, "data-state": w.state },
      el("div", {}, el("strong", {}, w.issue), " ", w.title || ""),
      el("div", { class: "meta" },
        `${w.role || "?"} · ${w.state}${w.agent_state ? ` (${w.agent_state})` : ""} · attempt ${w.attempt ?? "-"}` +
        (w.host ? ` · on ${w.host} (node ${w.node.slice(0, 8)})` : "") +
        ` · up ${duration(w.age_s)} · idle ${duration(w.idle_s)}${tokens}${cost}`),
      pane);
  });
  for (const issue of [...panes.keys()]) if (!seen.has(issue)) panes.delete(issue);
  box.replaceChildren(...cards);
}

function renderMerges(doc) {
  const items = doc.merges.map((m) => el("li", { "data-commit": m.commit },
    timeEl(m.time), el("strong", {}, m.title),
    el("div", { class: "stat" }, `${m.commit.slice(0, 8)} · ${m.files_changed} file(s) `,
      el("span", { class: "added" }, `+${m.added}`), " ", el("span", { class: "removed" }, `-${m.removed}`)),
    m.files.length ? el("div", { class: "files" }, m.files.join(", ")) : null));
  const list = document.getElementById("merges");
  list.replaceChildren(...(items.length ? items : [el("li", { class: "empty" },
    doc.trunk.error ? `trunk cannot be read: ${doc.trunk.error}` : "no changes on trunk yet")]));
}

const eventKeys = new Set();

function eventItem(event) {
  const { time, event: name, issue, reason, ...rest } = event;
  const extra = Object.entries(rest).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
  return el("li", { "data-event": name, "data-issue": issue },
    timeEl(time), el("span", { class: "name" }, name), issue ? `${issue} ` : "", reason || "",
    extra ? el("div", { class: "files" }, extra) : null);
}

function addEvents(events) {
  const list = document.getElementById("events");
  for (const event of events) {
    const key = JSON.stringify(event);
    if (eventKeys.has(key)) continue;
    eventKeys.add(key);
    const item = eventItem(event);
    item.dataset.key = key;
    list.prepend(item);
  }
  while (list.children.length > EVENTS_KEPT) {
    eventKeys.delete(list.lastChild.dataset.key);
    list.lastChild.remove();
  }
}

function render(doc) {
  lastDocumentAt = Date.now();
  document.title = `${doc.needs_you.length ? `(${doc.needs_you.length}) ` : ""}ralph-dev ${doc.project}`;
  document.getElementById("project").textContent = `ralph-dev · ${doc.project}`;
  document.body.dataset.generatedAt = doc.generated_at;
  renderFacts(doc);
  renderNeeds(doc);
  renderBoard(doc);
  renderWorkers(doc);
  renderMerges(doc);
  addEvents(doc.events);
}

function setConnection(state, text) {
  const node = document.getElementById("connection");
  node.dataset.state = state;
  node.textContent = text;
}

async function fetchState() {
  try {
    const response = await fetch("/api/v1/state", { credentials: "same-origin" });
    if (response.ok) render(await response.json());
  } catch (error) {
    setConnection("lost", "daemon unreachable");
  }
}

async function refreshPanes() {
  for (const [issue, pane] of panes) {
    try {
      const response = await fetch(`/api/v1/workers/${encodeURIComponent(issue)}/pane?lines=${PANE_LINES}`,
                                   { credentials: "same-origin" });
      if (!response.ok) continue;
      const data = await response.json();
      const atBottom = pane.scrollHeight - pane.scrollTop - pane.clientHeight < 8;
      if (pane.textContent !== data.text) pane.textContent = data.text || "(empty)";
      if (atBottom) pane.scrollTop = pane.scrollHeight;
    } catch (error) { /* the next round tries again */ }
  }
}

function connect() {
  const stream = new EventSource("/api/v1/events");
  stream.addEventListener("open", () => setConnection("live", "live"));
  stream.addEventListener("state", (message) => render(JSON.parse(message.data)));
  stream.addEventListener("ralph", (message) => addEvents([JSON.parse(message.data)]));
  stream.addEventListener("error", () => setConnection("lost", "reconnecting…"));
}

function start() {
  document.getElementById("zone").textContent = Intl.DateTimeFormat().resolvedOptions().timeZone;
  connect();
  fetchState();
  setInterval(refreshPanes, PANE_EVERY_MS);
  setInterval(() => { if (Date.now() - lastDocumentAt > STALE_AFTER_MS) fetchState(); }, STALE_AFTER_MS);
}

document.addEventListener("DOMContentLoaded", start);
