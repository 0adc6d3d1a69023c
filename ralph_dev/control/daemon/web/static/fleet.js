// ralph-dev fleet page: every configured project at once (GET /api/v1/fleet), what needs
// a person in any of them first. Everything from the documents goes into the page as
// text (textContent), never as HTML.
"use strict";

const EVERY_MS = 5000;

function money(value) {
  return value === null || value === undefined ? "unknown" : `$${Number(value).toFixed(2)}`;
}

function needs(fleet) {
  const list = document.getElementById("needs-list");
  const items = [];
  for (const doc of fleet.projects) {
    for (const need of doc.needs_you) {
      items.push(el("li", { "data-project": doc.project },
        el("strong", {}, doc.project), " ", need.issue ? `${need.issue}: ` : "", need.message));
    }
  }
  list.replaceChildren(...items);
  document.getElementById("needs-you").hidden = items.length === 0;
}

function project(doc) {
  const controller = doc.controller.alive
    ? (doc.controller.healthy ? "controller alive" : `controller unhealthy: ${doc.controller.why}`)
    : "controller not running";
  const counts = doc.issues;
  const facts = [
    doc.daemon.running ? "daemon running" : "daemon not running",
    controller,
    `trunk ${doc.trunk.name} ${doc.trunk.colour}`,
    `${doc.workers.length} worker(s)`,
    `issues: ${counts.ready} ready, ${counts.running} running, ${counts.waiting} waiting, `
      + `${counts.held} held, ${counts.done}/${counts.total} done`,
    `spend of live workers: ${money(doc.costs.cost_usd)}`,
    ...doc.pauses.map((pause) => `paused: ${pause.headline}`),
  ];
  const workers = doc.workers.map((w) => el("li", {}, `${w.issue} ${w.role} (${w.state})`));
  const waits = [];
  for (const column of Object.values(doc.board)) {
    for (const item of column) {
      if (item.wait) waits.push(el("li", {}, `${item.identifier} waits for ${item.wait.kind}: ${item.wait.why}`));
    }
  }
  return el("article", { class: "worker", "data-project": doc.project },
    el("h3", {}, doc.project, doc.needs_you.length ? ` (needs you: ${doc.needs_you.length})` : ""),
    el("ul", { class: "facts" }, facts.map((text) => el("li", {}, text))),
    workers.length ? el("ul", { class: "workers-of" }, workers) : null,
    waits.length ? el("ul", { class: "waits" }, waits) : null,
    doc.dashboard.url ? el("p", {}, "its dashboard: ", doc.dashboard.url) : null);
}

async function refresh() {
  const state = document.getElementById("connection");
  try {
    const answer = await fetch("/api/v1/fleet", { credentials: "same-origin" });
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    const fleet = await answer.json();
    needs(fleet);
    const projects = fleet.projects.map(project);
    document.getElementById("projects").replaceChildren(
      ...(projects.length ? projects : [el("p", { class: "empty" }, "no projects")]));
    document.getElementById("errors").replaceChildren(...Object.entries(fleet.errors || {})
      .map(([name, error]) => el("li", {}, `${name}: cannot be read: ${error}`)));
    document.body.dataset.generatedAt = new Date().toISOString();
    state.dataset.state = "live";
    state.textContent = "live";
  } catch (error) {
    state.dataset.state = "lost";
    state.textContent = `cannot reach the daemon (${error.message}); trying again`;
  }
}

refresh();
setInterval(refresh, EVERY_MS);
