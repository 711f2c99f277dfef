// One job: its metadata, input, result or error, progress, the node tree (live), a node's details
// and the actions cancel, delete and (when the server has the route) retry.
import { request, getJSON, routeExists } from "./api.js";
import { watchJob, isSettled } from "./live.js";
import { NodeTree } from "./tree.js";
import { el, formatTime, formatMs, pretty, progressBar, stateBadge } from "./util.js";

// The node list is read again at most this often while versions arrive, and never more than a
// quarter of the time, so a busy 10,000-node job does not have the page (and the server) reading
// its whole tree at every change.
const NODE_REFRESH_MS = 400;

/** Whether this server can retry a job (POST /v1/jobs/{id}/retry); the one place the UI decides it. */
export const canRetry = () => routeExists("POST", "/v1/jobs/{id}/retry");

export function jobView(main, ctx, id) {
  performance.clearMarks("job-view-start");
  performance.clearMeasures("job-view");
  performance.mark("job-view-start");
  const enc = encodeURIComponent(id);
  const header = el("div.job-header");
  const summary = el("div.job-summary");
  const sections = el("div.job-sections");
  const detail = el("aside.node-detail", {}, el("p.muted", { text: "Click a node to see its result, request and body." }));
  const tree = new NodeTree((node) => showNode(node).catch(ctx.report));
  const treeInfo = el("span.muted");
  main.replaceChildren(
    el(
      "section.job",
      { id: "job-view", dataset: { jobId: id } },
      header,
      summary,
      el("div.job-body", {}, el("div.tree-panel", {}, el("h2", {}, "Nodes ", treeInfo), tree.element), detail),
      sections,
    ),
  );

  let job = null;
  let retryAvailable = false;
  let painted = false;

  function renderJob() {
    const actions = el("div.actions");
    if (!isSettled(job.state)) actions.append(el("button#cancel-job.danger", { text: "Cancel", onclick: cancel }));
    if (retryAvailable && (job.state === "failed" || job.state === "cancelled"))
      actions.append(el("button#retry-job", { text: "Retry", onclick: retry }));
    if (isSettled(job.state)) actions.append(el("button#delete-job.danger", { text: "Delete", onclick: remove }));
    header.replaceChildren(
      el("div", {}, el("a", { href: "#/", text: "← jobs" })),
      el("h1", {}, job.name || "(no name)", " ", el("span#job-state", { dataset: { state: job.state } }, stateBadge(job.state))),
      actions,
    );
    const p = job.progress;
    summary.replaceChildren(
      progressBar(p),
      el("p.counts-line", {
        id: "job-progress",
        text: `${p.done}/${p.total} done (${p.percent}%) · ${p.running} running · ${p.pending} pending · ${p.succeeded} succeeded · ${p.failed} failed · ${p.cancelled} cancelled · ${p.skipped} skipped`,
      }),
      el(
        "table.kv",
        {},
        [
          ["id", job.id],
          ["created", formatTime(job.created_at)],
          ["started", formatTime(job.started_at)],
          ["finished", formatTime(job.finished_at)],
          ["version", job.version],
        ].map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td.mono", { text: String(v) }))),
      ),
    );
    const block = (title, value, cls = "") => el(`details.block${cls}`, { open: true }, el("summary", { text: title }), el("pre", { text: pretty(value) }));
    const present = (value) => value !== null && value !== undefined;
    // replaceChildren would write a null as the text "null".
    sections.replaceChildren(
      ...[
        present(job.error) && block("Error", job.error, ".error"),
        present(job.result) && block("Result", job.result),
        present(job.input) && block("Input", job.input),
        present(job.metadata) && block("Metadata", job.metadata),
      ].filter(Boolean),
    );
  }

  let nodesTimer = 0;
  let refreshMs = NODE_REFRESH_MS;
  let selected = null;
  let nodesLoading = false;
  let nodesAgain = false;
  async function loadNodes() {
    if (nodesLoading) {
      nodesAgain = true;
      return;
    }
    nodesLoading = true;
    const began = performance.now();
    try {
      const { nodes } = await getJSON(`/v1/jobs/${enc}/nodes`);
      if (!ctx.alive()) return;
      tree.setNodes(nodes);
      treeInfo.textContent = `(${nodes.length})`;
      refreshMs = Math.max(NODE_REFRESH_MS, 3 * (performance.now() - began));
      // The node shown in the panel is shown again when its state moved.
      const shown = selected && nodes.find((n) => n.id === selected.id);
      if (shown && shown.state !== selected.state) showNode(shown).catch(ctx.report);
      if (!painted) {
        painted = true;
        // The first frame with the tree in it: what the browser test measures.
        requestAnimationFrame(() =>
          setTimeout(() => {
            performance.mark("job-view-painted");
            performance.measure("job-view", "job-view-start", "job-view-painted");
            document.body.dataset.jobViewPainted = "1";
          }, 0),
        );
      }
    } finally {
      nodesLoading = false;
      if (nodesAgain && ctx.alive()) {
        nodesAgain = false;
        scheduleNodes();
      }
    }
  }
  function scheduleNodes() {
    if (nodesTimer) return;
    nodesTimer = setTimeout(() => {
      nodesTimer = 0;
      loadNodes().catch(ctx.report);
    }, refreshMs);
  }
  ctx.onLeave(() => clearTimeout(nodesTimer));

  async function showNode(node) {
    selected = { id: node.id, state: node.state };
    const full = await getJSON(`/v1/jobs/${enc}/nodes/${encodeURIComponent(node.id)}`);
    selected.state = full.state;
    const out = el("pre#node-output");
    const show = (value) => {
      out.textContent = typeof value === "string" ? value : pretty(value);
    };
    const tabs = el("div.tabs");
    const tab = (label, action) => tabs.append(el("button", { text: label, dataset: { tab: label }, onclick: () => Promise.resolve(action()).catch(ctx.report) }));
    tab("Result", () => show(full.error ? { error: full.error, result: full.result ?? null } : full.result ?? null));
    if (full.request !== undefined) tab("Request", () => show(full.request));
    if (full.type === "fetch")
      tab("Raw body", async () => {
        const r = await request("GET", `/v1/jobs/${enc}/nodes/${encodeURIComponent(node.id)}/body`, { as: "text", accept: [200, 204, 404, 409] });
        if (r.status === 200) show(r.body);
        else if (r.status === 204) show("(empty body)");
        else show(`(no body: ${(() => { try { return JSON.parse(r.body).error.message; } catch { return r.status; } })()})`);
      });
    tab("Node", () => show(full));
    detail.replaceChildren(
      el("h2", {}, full.id, " ", stateBadge(full.state)),
      el(
        "table.kv",
        {},
        [
          ["type", full.type],
          ["parent", full.parent ?? "—"],
          ["attempts", full.attempts],
          ["status", full.status ?? "—"],
          ["elapsed", formatMs(full.elapsed_ms)],
          ["started", formatTime(full.started_at)],
          ["finished", formatTime(full.finished_at)],
          ["recovered", full.recovered ? "yes" : "no"],
        ].map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: String(v) }))),
      ),
      tabs,
      out,
    );
    show(full.error ? { error: full.error, result: full.result ?? null } : full.result ?? null);
  }

  async function cancel() {
    if (!confirm(`Cancel job ${job.name || job.id}?`)) return;
    const { body } = await request("POST", `/v1/jobs/${enc}/cancel`, { accept: [200, 202, 409] });
    if (body && body.version) update(body);
  }
  async function remove() {
    if (!confirm(`Delete job ${job.name || job.id}?`)) return;
    await request("DELETE", `/v1/jobs/${enc}`);
    location.hash = "#/";
  }
  async function retry() {
    const { body } = await request("POST", `/v1/jobs/${enc}/retry`);
    if (body && body.id && body.id !== id) location.hash = `#/jobs/${body.id}`;
    else if (body && body.version) start(body);
  }

  function update(next) {
    if (job && next.version < job.version) return;
    job = next;
    renderJob();
    scheduleNodes();
  }

  let stopWatch = () => {};
  function start(first) {
    stopWatch();
    job = first;
    renderJob();
    // A settled job changes no more (a retry restarts the watch with the job it answers).
    if (!isSettled(first.state)) stopWatch = watchJob(id, first.version, update, ctx.report);
  }
  ctx.onLeave(() => stopWatch());

  (async () => {
    const [first] = await Promise.all([getJSON(`/v1/jobs/${enc}`), loadNodes()]);
    if (!ctx.alive()) return;
    start(first);
    retryAvailable = await canRetry();
    if (ctx.alive() && retryAvailable) renderJob();
  })().catch((error) => {
    if (error.status === 404 && ctx.alive())
      main.replaceChildren(el("section.job", {}, el("p", {}, el("a", { href: "#/", text: "← jobs" })), el("h1", { text: `No job ${id}` }), el("p.muted", { text: "It may have been deleted, or removed after the retention period." })));
    else ctx.report(error);
  });
}
