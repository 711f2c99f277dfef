// The jobs list: newest first, by state (the server's filter) and by name (within the page shown),
// paged with the server's cursors, with the counts by state from /metrics; refreshed every 2 s.
import { getJSON } from "./api.js";
import { fetchMetrics, byLabel } from "./metrics.js";
import { el, formatTime, progressBar, stateBadge } from "./util.js";

const STATES = ["pending", "running", "succeeded", "failed", "cancelled"];

export function jobsView(main, ctx, params) {
  const state = params.get("state") || "";
  const name = params.get("name") || "";
  // The cursors of the pages before this one, so "newer" can go back.
  const cursors = [];
  let cursor = "";

  const counts = el("div.counts");
  const stateSelect = el(
    "select#state-filter",
    { "aria-label": "state", onchange: () => go({ state: stateSelect.value }) },
    el("option", { value: "", text: "all states" }),
    STATES.concat("skipped").map((s) => el("option", { value: s, text: s, selected: s === state })),
  );
  const nameInput = el("input#name-filter", { type: "search", placeholder: "name contains…", value: name, "aria-label": "name" });
  nameInput.addEventListener("input", () => renderRows());
  const rows = el("tbody");
  const newer = el("button", { text: "← newer", disabled: true, onclick: () => page(cursors.pop() ?? "", false) });
  const older = el("button", { text: "older →", disabled: true });
  const info = el("span.muted");
  let jobs = [];
  let next = null;
  let painted = false;

  main.replaceChildren(
    el(
      "section.jobs",
      {},
      el("div.toolbar", {}, el("h1", { text: "Jobs" }), counts),
      el("div.filters", {}, stateSelect, nameInput, el("a.button", { href: "#/submit", text: "Submit a job" })),
      el(
        "table.list",
        { id: "jobs-table" },
        el("thead", {}, el("tr", {}, ["Name", "State", "Progress", "Nodes", "Created", "ID"].map((h) => el("th", { text: h })))),
        rows,
      ),
      el("div.pager", {}, newer, info, older),
    ),
  );

  function go(changes) {
    const p = new URLSearchParams({ state, name: nameInput.value, ...changes });
    for (const [k, v] of [...p]) if (!v) p.delete(k);
    location.hash = `#/${p.toString() ? "?" + p : ""}`;
  }

  function renderRows() {
    const needle = nameInput.value.trim().toLowerCase();
    const shown = needle ? jobs.filter((j) => (j.name || "").toLowerCase().includes(needle)) : jobs;
    rows.replaceChildren(
      ...shown.map((job) =>
        el(
          "tr",
          { dataset: { jobId: job.id, state: job.state } },
          el("td", {}, el("a", { href: `#/jobs/${job.id}`, text: job.name || "(no name)" })),
          el("td", {}, stateBadge(job.state)),
          el("td.progress-cell", {}, progressBar(job.progress)),
          el("td", { text: `${job.progress.done}/${job.progress.total}` }),
          el("td", { text: formatTime(job.created_at) }),
          el("td.mono", { text: job.id }),
        ),
      ),
    );
    if (!shown.length) rows.append(el("tr", {}, el("td.muted", { colspan: 6, text: jobs.length ? "no job of this page has that name" : "no jobs" })));
    info.textContent = `page ${cursors.length + 1} · ${shown.length} shown`;
  }

  async function load() {
    const q = new URLSearchParams({ limit: "50" });
    if (state) q.set("state", state);
    if (cursor) q.set("cursor", cursor);
    const body = await getJSON(`/v1/jobs?${q}`);
    jobs = body.jobs;
    next = body.next_cursor;
    older.disabled = !next;
    newer.disabled = cursors.length === 0;
    renderRows();
    if (!painted) {
      painted = true;
      // The first frame with the list in it: what the browser test measures.
      requestAnimationFrame(() => setTimeout(() => performance.mark("jobs-view-painted"), 0));
    }
  }

  async function loadCounts() {
    const byState = byLabel(await fetchMetrics(), "jobserver_jobs", "state");
    counts.replaceChildren(
      ...STATES.map((s) =>
        el(
          `a.count.state-${s}${s === state ? ".active" : ""}`,
          { href: s === state ? "#/" : `#/?state=${s}`, dataset: { state: s }, title: `show ${s} jobs` },
          `${s} `,
          el("b", { text: String(byState[s] ?? 0) }),
        ),
      ),
    );
  }

  function page(to, forward) {
    if (forward) cursors.push(cursor);
    cursor = to;
    load().catch(ctx.report);
  }
  older.addEventListener("click", () => next && page(next, true));

  ctx.every(2000, () => Promise.all([load(), loadCounts()]));
}
