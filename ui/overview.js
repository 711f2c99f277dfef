// The overview: jobs and nodes by state, fetches in flight and queued, fetch outcomes and latency, from /metrics.
import { fetchMetrics, byLabel, single, quantile } from "./metrics.js";
import { el } from "./util.js";

const STATES = ["pending", "running", "succeeded", "failed", "cancelled", "skipped"];

export function overviewView(main, ctx) {
  const box = el("section.overview", {}, el("h1", { text: "Overview" }), el("p.muted", { text: "loading…" }));
  main.replaceChildren(box);
  const refresh = async () => {
    const m = await fetchMetrics();
    const jobs = byLabel(m, "jobserver_jobs", "state");
    const nodes = byLabel(m, "jobserver_nodes", "state");
    const outcomes = byLabel(m, "jobserver_fetches_total", "outcome");
    const count = single(m, "jobserver_fetch_duration_seconds_count");
    const sum = single(m, "jobserver_fetch_duration_seconds_sum");
    const ms = (s) => (s === null ? "—" : s === Infinity ? "> largest bucket" : `≤ ${Math.round(s * 1000)} ms`);
    const table = (title, rows) =>
      el("div.card", {}, el("h2", { text: title }), el("table.kv", {}, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: String(v) })))));
    box.replaceChildren(
      el("h1", { text: "Overview" }),
      el(
        "div.cards",
        {},
        table("Jobs by state", STATES.map((s) => [s, jobs[s] ?? 0])),
        table("Nodes of active jobs", STATES.map((s) => [s, nodes[s] ?? 0])),
        table("Fetches", [
          ["in flight", single(m, "jobserver_fetches_in_flight")],
          ["queued", single(m, "jobserver_fetch_queue_depth")],
          ...Object.entries(outcomes).map(([k, v]) => [`total ${k}`, v]),
        ]),
        table("Fetch latency", [
          ["attempts", count],
          ["mean", count ? `${Math.round((sum / count) * 1000)} ms` : "—"],
          ["p50", ms(quantile(m, "jobserver_fetch_duration_seconds", 0.5))],
          ["p95", ms(quantile(m, "jobserver_fetch_duration_seconds", 0.95))],
          ["p99", ms(quantile(m, "jobserver_fetch_duration_seconds", 0.99))],
        ]),
      ),
    );
  };
  ctx.every(5000, refresh);
}
