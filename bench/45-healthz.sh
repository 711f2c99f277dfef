#!/usr/bin/env bash
# /healthz latency on a store of BENCH_JOBS settled jobs (default 200000) while 4
# clients scrape /metrics as fast as they can and one reads a large job
# (BENCH_BIG_MB of result, default 30) over and over; /healthz is measured alone,
# under the scrapes, and under both. Prints a markdown section on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

DURATION=${BENCH_DURATION:-15s}
JOBS=${BENCH_JOBS:-200000}
BIG_MB=${BENCH_BIG_MB:-30}
swift build -c release --product jobserver >&2
BIN=$(swift build -c release --show-bin-path)/jobserver

bench_setup
db="$tmp/jobs.sqlite"
port=$(free_port)

# The server makes the schema; then it stops and the rows are written directly, in one transaction.
"$BIN" serve --host 127.0.0.1 --port "$port" --db "$db" 2>>"$tmp/server.log" &
first=$!
pids+=("$first")
wait_for "http://127.0.0.1:$port/healthz"
kill -TERM "$first"
wait "$first" || true

now=$(date +%s%3N)
fill_start=$(date +%s%3N)
sqlite3 "$db" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $JOBS)
INSERT INTO jobs (id, name, state, created_at, started_at, finished_at, deadline_ms, version,
    p_total, p_pending, p_running, p_succeeded, p_failed, p_cancelled, p_skipped, error, metadata, result, request)
SELECT printf('00BENCH%019d', i), 'bench', CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END,
    $now - 1000, $now - 1000, $now - 500, NULL, 3,
    1, 0, 0, CASE WHEN i % 10 = 0 THEN 0 ELSE 1 END, CASE WHEN i % 10 = 0 THEN 1 ELSE 0 END, 0, 0,
    CASE WHEN i % 10 = 0 THEN '{"kind":"http_status","message":"HTTP 500","node":"root","status":500}' END,
    NULL, CASE WHEN i % 10 = 0 THEN NULL ELSE '{"status":200,"body":{"ok":true}}' END,
    '{"graph":{"type":"fetch","url":"http://127.0.0.1:9/"}}'
FROM n;
INSERT INTO nodes (job_id, position, id, parent, type, state, attempts, started_at, finished_at, elapsed_ms,
    status, recovered, error, result)
SELECT id, 0, 'root', NULL, 'fetch', state, 1, started_at, finished_at, 500, 200, 0, error, result FROM jobs;
INSERT INTO jobs (id, name, state, created_at, started_at, finished_at, deadline_ms, version,
    p_total, p_pending, p_running, p_succeeded, p_failed, p_cancelled, p_skipped, error, metadata, result, request)
VALUES ('00BIG', 'big', 'succeeded', $now, $now, $now, NULL, 3, 1, 0, 0, 1, 0, 0, 0, NULL, NULL,
    '{"status":200,"body":"' || hex(zeroblob($BIG_MB * 524288)) || '"}',
    '{"graph":{"type":"fetch","url":"http://127.0.0.1:9/"}}');
COMMIT;
SQL
fill_ms=$(( $(date +%s%3N) - fill_start ))
stored=$(sqlite3 "$db" "SELECT count(*) FROM jobs")
echo "stored $stored jobs in $fill_ms ms" >&2

start_ns=$(date +%s%N)
"$BIN" serve --host 127.0.0.1 --port "$port" --db "$db" --retention 0 2>>"$tmp/server.log" &
pids+=($!)
wait_for "http://127.0.0.1:$port/healthz"
startup_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
big_bytes=$(curl -fsS "http://127.0.0.1:$port/v1/jobs/00BIG" | wc -c)
jobs_metric=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '/^jobserver_jobs\{state="(succeeded|failed)"\}/ {s += $2} END {print s}')
echo "metrics count $jobs_metric settled jobs; the big job is $big_bytes bytes" >&2

# percentile P from wrk --latency output, in ms.
pct() {
    awk -v p="$1%" '$1 == p {v = $2; if (v ~ /us$/) {sub("us", "", v); v /= 1000} else if (v ~ /ms$/) {sub("ms", "", v)} else if (v ~ /s$/) {sub("s", "", v); v *= 1000}; printf "%.2f", v}'
}

quiet=$(wrk -t1 -c1 -d"$DURATION" --latency "http://127.0.0.1:$port/healthz")
echo "$quiet" >&2

# 4 connections scraping /metrics back to back.
wrk -t1 -c4 -d"$DURATION" "http://127.0.0.1:$port/metrics" >"$tmp/metrics-only.out" &
load=$!
pids+=("$load")
scraped=$(wrk -t1 -c1 -d"$DURATION" --latency "http://127.0.0.1:$port/healthz")
echo "$scraped" >&2
wait "$load" || true
cat "$tmp/metrics-only.out" >&2
scrapes_only=$(rps <"$tmp/metrics-only.out")

# The same, and one client reading the big job back to back.
wrk -t1 -c4 -d"$DURATION" "http://127.0.0.1:$port/metrics" >"$tmp/metrics.out" &
load=$!
pids+=("$load")
(
    end=$(( $(date +%s) + ${DURATION%s} ))
    n=0
    while [ "$(date +%s)" -lt "$end" ]; do
        curl -fsS -o /dev/null "http://127.0.0.1:$port/v1/jobs/00BIG" && n=$((n + 1))
    done
    echo "$n" >"$tmp/big.count"
) &
big=$!
pids+=("$big")
loaded=$(wrk -t1 -c1 -d"$DURATION" --latency "http://127.0.0.1:$port/healthz")
echo "$loaded" >&2
wait "$load" "$big" || true
cat "$tmp/metrics.out" >&2
scrapes=$(rps <"$tmp/metrics.out")
big_reads=$(cat "$tmp/big.count" 2>/dev/null || echo 0)

q50=$(echo "$quiet" | pct 50); q99=$(echo "$quiet" | pct 99)
m50=$(echo "$scraped" | pct 50); m99=$(echo "$scraped" | pct 99)
l50=$(echo "$loaded" | pct 50); l99=$(echo "$loaded" | pct 99)
met=$(python3 -c "print('met' if max($m50, $m99, $l50, $l99) <= 5 else 'not met')")

cat <<MD
## /healthz under /metrics scrapes and a large read

A store of $stored jobs (written directly with the sqlite3 CLI in one transaction, $fill_ms ms), one of them
with a $big_bytes-byte answer; the server (\`--retention 0\`, so that the stored jobs are kept, otherwise default flags
and log level, its log to a file) started on it in $startup_ms ms (exec to the first \`/healthz\` 200; counting
jobs by state once) and \`/metrics\` counted $jobs_metric settled jobs. \`/healthz\` latency with
\`wrk -t1 -c1 -d$DURATION --latency\`: alone; while \`wrk -t1 -c4\` scrapes \`/metrics\` back to back
($scrapes_only scrapes/s); and while it does ($scrapes scrapes/s) and one client reads the large job back to back
with curl ($big_reads reads).

| /healthz | p50 ms | p99 ms |
|---|---:|---:|
| alone | $q50 | $q99 |
| with 4 clients on /metrics | $m50 | $m99 |
| with 4 clients on /metrics and the large read | $l50 | $l99 |

Target: p50 and p99 ≤ 5 ms under load: $met.
MD
