// Reads the Prometheus text of GET /metrics into {name: [{labels, value}]}.
import { request } from "./api.js";

export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const pair of (m[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    (out[m[1]] ||= []).push({ labels, value: Number(m[4]) });
  }
  return out;
}

export async function fetchMetrics() {
  const { body } = await request("GET", "/metrics", { as: "text" });
  return parseMetrics(body);
}

/** {label value: number} of one family by one label. */
export function byLabel(metrics, name, label) {
  const out = {};
  for (const s of metrics[name] || []) out[s.labels[label] ?? ""] = s.value;
  return out;
}

export const single = (metrics, name) => (metrics[name] && metrics[name][0] ? metrics[name][0].value : 0);

/** The q-quantile (0…1) of a histogram in seconds, from its cumulative buckets (upper bound of the bucket). */
export function quantile(metrics, name, q) {
  const buckets = (metrics[`${name}_bucket`] || [])
    .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), n: s.value }))
    .sort((a, b) => a.le - b.le);
  const total = buckets.length ? buckets[buckets.length - 1].n : 0;
  if (!total) return null;
  for (const b of buckets) if (b.n >= q * total) return b.le;
  return null;
}
