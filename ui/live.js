// Live updates of one job. Today: long-polls of GET /v1/jobs/{id}?wait=S&since=V (API.md §2).
// Everything that knows how updates arrive is in watchJob, so that it can move to the event
// stream (GET /v1/jobs/{id}/events) once the server has it, without touching the views.
import { request } from "./api.js";

const WAIT_SECONDS = 20;
const SETTLED = new Set(["succeeded", "failed", "cancelled", "skipped"]);

export const isSettled = (state) => SETTLED.has(state);

/**
 * Calls onJob(job) with every newer version of job `id` after `version`, until the job is settled
 * or the returned stop() is called. onError(error) is called on a failed request; the watch then
 * waits a little and goes on (it stops on a 404: the job was deleted).
 */
export function watchJob(id, version, onJob, onError = () => {}) {
  const controller = new AbortController();
  let stopped = false;
  let since = version;
  (async () => {
    let failures = 0;
    while (!stopped) {
      try {
        const path = `/v1/jobs/${encodeURIComponent(id)}?wait=${WAIT_SECONDS}&since=${since}`;
        const { body: job } = await request("GET", path, { signal: controller.signal });
        failures = 0;
        if (stopped) return;
        if (job.version > since) {
          since = job.version;
          onJob(job);
        }
        if (isSettled(job.state)) return;
      } catch (error) {
        if (stopped || error.name === "AbortError") return;
        onError(error);
        if (error.status === 404 || error.status === 401) return;
        failures += 1;
        await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 250 * 2 ** failures)));
      }
    }
  })();
  return () => {
    stopped = true;
    controller.abort();
  };
}
