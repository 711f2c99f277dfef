#!/usr/bin/env bash
# Jobs that wait for their `not_before` (API.md §8), release build:
#  (a) resident memory per job waiting in the store: N jobs submitted with not_before about an hour ahead, then N
#      more; the RSS growth for the second N divided by N (what one more waiting job costs), the growth for the
#      first N, and the threads of the server before and after;
#  (b) start lateness: N jobs submitted with not_before 1–60 s after their own submission (uniformly at
#      random), each a list of one fetch of the upstream fixture; once all have settled, started_at − not_before over
#      every job, p50 / p99 / max, and how many started early (must be 0).
# Sizes: SCHED_JOBS (default 100000), SCHED_MIN_S / SCHED_MAX_S (default 1 / 60); (b) runs SCHED_RUNS times
# (default 5), each on a fresh store, and reports the median and min–max of each figure.
# Prints a markdown section on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

JOBS=${SCHED_JOBS:-100000}
MIN_S=${SCHED_MIN_S:-1}
MAX_S=${SCHED_MAX_S:-60}
CLIENTS=${SCHED_CLIENTS:-16}
RUNS=${SCHED_RUNS:-5}

swift build -c release --product jobserver >&2
BIN=$(swift build -c release --show-bin-path)/jobserver

bench_setup

start_upstream

# start_server DB: sets server_pid and server_port.
start_server() {
    local db=$1
    server_port=$(free_port)
    "$BIN" serve --host 127.0.0.1 --port "$server_port" --db "$db" \
        --max-active-jobs 1000000 2>>"$tmp/server.log" &
    server_pid=$!
    pids+=("$server_pid")
    wait_for "http://127.0.0.1:$server_port/healthz"
}

threads_of() { awk '/^Threads:/ {print $2}' "/proc/$1/status"; }

# submit MODE [COUNT]: posts COUNT jobs (default $JOBS) from $CLIENTS connections; MODE `far` puts not_before an
# hour ahead (plus up to a minute), `near` MIN_S–MAX_S seconds after each job's own submission. Prints seconds taken.
submit() {
    python3 - "$server_port" "$up_port" "${2:-$JOBS}" "$CLIENTS" "$1" "$MIN_S" "$MAX_S" <<'PY'
import datetime, http.client, json, random, sys, threading, time
port, up, n, clients, mode, lo, hi = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], float(sys.argv[6]), float(sys.argv[7])
def rfc3339(ms):
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (ms % 1000)
lock = threading.Lock()
left = [n]
errors = []
def worker(seed):
    rnd = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while True:
        with lock:
            if left[0] == 0: return
            left[0] -= 1
        now = int(time.time() * 1000)
        ahead = 3600_000 + rnd.randint(0, 59_999) if mode == "far" else int(rnd.uniform(lo, hi) * 1000)
        # A list root goes running the moment the job begins, so `started_at` is when the job was started, not
        # when its fetch got a transfer slot (which is the fetch queue's and the upstream fixture's pace).
        body = json.dumps({"not_before": rfc3339(now + ahead),
                           "graph": {"type": "list", "children": [
                               {"type": "fetch", "url": "http://127.0.0.1:%s/json" % up}]}})
        conn.request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
        r = conn.getresponse(); r.read()
        if r.status != 201:
            with lock: errors.append(r.status)
start = time.time()
ts = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
for t in ts: t.start()
for t in ts: t.join()
if errors: sys.exit("submissions refused: %d (first %s)" % (len(errors), errors[0]))
print("%.1f" % (time.time() - start))
PY
}

metric() { curl -fsS "http://127.0.0.1:$server_port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# ---- (a) memory per waiting job
# RSS is read three times: at start, after JOBS jobs and after JOBS more. The first JOBS also pay for what any load
# costs once and then no more (threads, the allocator's arenas, the writer's page cache of at most 16 MiB, which
# fills within them); the second JOBS pay only for themselves, so their growth is the memory a waiting job costs.
start_server "$tmp/a.sqlite"
sleep 1
rss_before=$(rss_kib "$server_pid")
threads_before=$(threads_of "$server_pid")
echo "submitting $JOBS jobs an hour ahead, twice" >&2
far_s=$(submit far)
sleep 2
rss_first=$(rss_kib "$server_pid")
far_second_s=$(submit far)
sleep 2
rss_after=$(rss_kib "$server_pid")
threads_after=$(threads_of "$server_pid")
scheduled=$(metric jobserver_jobs_scheduled)
per_job=$(python3 -c "print(round(($rss_after - $rss_first) * 1024 / $JOBS))")
per_job_first=$(python3 -c "print(round(($rss_first - $rss_before) * 1024 / $JOBS))")
kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true

# ---- (b) lateness, RUNS times, each on a fresh store
# lateness_run N: one run; appends its stats (one JSON line) to $tmp/runs.
lateness_run() {
    start_server "$tmp/b$1.sqlite"
    echo "run $1 of $RUNS: submitting $JOBS jobs ${MIN_S}-${MAX_S} s ahead" >&2
    local near_s
    near_s=$(submit near)
    # All settle by MAX_S after the last submission; a bounded wait past it.
    local limit=$((${MAX_S%.*} + 120)) left
    for _ in $(seq 1 "$limit"); do
        left=$(( $(metric 'jobserver_jobs{state="pending"}') + $(metric 'jobserver_jobs{state="running"}') ))
        [ "$left" -eq 0 ] && break
        sleep 1
    done
    local rss_end
    rss_end=$(rss_kib "$server_pid")
    python3 - "$server_port" "$near_s" "$rss_end" >>"$tmp/runs" <<'PY'
import datetime, json, sys, urllib.request
port, near_s, rss_end = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
def ms(t): return datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1000
late, states, cursor = [], {}, None
for _ in range(100000):
    url = "http://127.0.0.1:%s/v1/jobs?limit=500" % port + ("&cursor=" + cursor if cursor else "")
    page = json.load(urllib.request.urlopen(url, timeout=60))
    for job in page["jobs"]:
        states[job["state"]] = states.get(job["state"], 0) + 1
        if job.get("started_at") and job.get("not_before"):
            late.append(ms(job["started_at"]) - ms(job["not_before"]))
    cursor = page["next_cursor"]
    if not cursor: break
late.sort()
def pct(p): return late[min(len(late) - 1, int(len(late) * p))] if late else float("nan")
print(json.dumps({"n": len(late), "p50": pct(0.5), "p99": pct(0.99), "max": late[-1] if late else None,
                  "early": sum(1 for x in late if x < 0), "states": states, "submit_s": near_s,
                  "rss_end_mib": rss_end // 1024}))
PY
    tail -1 "$tmp/runs" >&2
    kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true
    rm -f "$tmp/b$1.sqlite"*
}
for run in $(seq 1 "$RUNS"); do lateness_run "$run"; done
# The median and min–max over the runs of each figure, and the sums that must hold in every run.
stats=$(python3 - "$tmp/runs" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def span(key, fmt="%d"):
    xs = sorted(r[key] for r in runs)
    return (fmt % statistics.median(xs)) + " (" + (fmt % xs[0]) + "–" + (fmt % xs[-1]) + ")"
states = {}
for r in runs:
    for k, v in r["states"].items(): states[k] = states.get(k, 0) + v
print(json.dumps({"runs": len(runs), "n": sum(r["n"] for r in runs), "p50": span("p50"), "p99": span("p99"),
                  "max": span("max"), "early": sum(r["early"] for r in runs), "submit_s": span("submit_s", "%.1f"),
                  "rss_end": span("rss_end_mib"), "each": ", ".join("%d" % r["p99"] for r in runs),
                  "states": ", ".join("%s %d" % kv for kv in sorted(states.items()))}))
PY
)
j() { jq -r "$1" <<<"$stats"; }
started=$(j .n)
states=$(j .states)
p50=$(j .p50)
p99=$(j .p99)
max=$(j .max)
early=$(j .early)
cat <<MD
## Jobs waiting for \`not_before\`: memory and start lateness

Every jobserver here runs at the default log level (\`info\`, its log to a file), with the flags named below.

(a) $JOBS jobs submitted with \`not_before\` an hour ahead (in ${far_s} s, $CLIENTS connections), then $JOBS more (in
${far_second_s} s): they wait as rows in the store, not in memory, under one timer. $scheduled counted by
\`jobserver_jobs_scheduled\`. The first $JOBS also grow what grows once: threads, the allocator's arenas, and the
store writer's page cache (at most 16 MiB); the growth for the second $JOBS is what waiting jobs cost.
(b) $RUNS runs, each of $JOBS jobs on a fresh store, each job with \`not_before\` ${MIN_S}–${MAX_S} s after its own
submission (submitting took $(j .submit_s) s; median and min–max),
each a list of one fetch of the local upstream; lateness is \`started_at − not_before\` of every job once all
settled (\`started_at\` is when the job began: its list root goes running at once; the fetch then waits for a transfer slot like any other). Release build, loopback.
Commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- Sources bench || echo " (with local changes)").

| measure | value |
|---|---|
| RSS per waiting job (a): growth for the second $JOBS / $JOBS | $per_job bytes ($(( (rss_after - rss_first) / 1024 )) MiB) |
| RSS growth for the first $JOBS (a) / $JOBS | $per_job_first bytes ($(( (rss_first - rss_before) / 1024 )) MiB) |
| server threads before / after submitting (a) | $threads_before / $threads_after |
| jobs started (b), all runs | $started of $((JOBS * RUNS)) ($states) |
| start lateness p50 (b), median (min–max) | $p50 ms |
| start lateness p99 (b), median (min–max) | $p99 ms (runs: $(j .each)) |
| start lateness max (b), median (min–max) | $max ms |
| started before not_before (b), all runs | $early |
| RSS after (b), all settled, median (min–max) | $(j .rss_end) MiB |

Command: \`SCHED_JOBS=$JOBS SCHED_MIN_S=$MIN_S SCHED_MAX_S=$MAX_S SCHED_RUNS=$RUNS bench/60-schedule.sh\`.
MD
