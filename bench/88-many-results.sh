#!/usr/bin/env bash
# The server's resident memory around one job of many small results: the job of bench/25-fanout.sh's last row, a
# `list` of N (default 100,000) fetches of a 1 KiB JSON file from nginx on loopback, run with the limits that size
# needs (`--max-nodes`, `--max-request-bytes 64MiB`, and `--max-job-bytes 0 --max-response-memory 0`: N KiB is over
# the default 64MiB budgets), otherwise default flags. Each run, on a fresh SQLite file:
#   1. the job runs and its settled answer is read (`?wait=60`); once it has left memory (`jobserver_nodes` 0 on
#      /metrics): the peak since the server started (VmHWM), and the RSS (VmRSS) SETTLE s (default 12: memory freed in
#      bulk is given back once the server has gone 10 s without freeing more) later;
#   2. a new server on the same file reads it back from the store (`GET /v1/jobs/{id}`): the time, then the peak and
#      the RSS SETTLE s later;
#   3. then its nodes with their results (`/nodes?include=result`): the same.
# Then the last run's file gets READERS - 1 (default 3) more such jobs, and each run a new server has READERS clients
# read them at once, one job each (the answers, then on another new server the node lists): the time until the last
# is read, and the peak.
# RUNS runs (default 5): median (min–max). N, SETTLE, READERS, RUNS and CONFIG (release, or debug for a quick check)
# may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-100000}
SETTLE=${SETTLE:-12}
RUNS=${RUNS:-5}
CONFIG=${CONFIG:-release}
TARGET_MIB=256

require curl python3 nginx
bench_setup

build_jobserver "$CONFIG"

serve_json_file 1024
list_job "$N" >"$tmp/job.json"

# serve: starts the server on the run's SQLite file; sets server and base.
serve() {
  local port
  port=$(free_port)
  "$bin/jobserver" serve --host 127.0.0.1 --port "$port" --db "$tmp/db/jobs.sqlite" \
    --max-nodes $((N + 10)) --max-request-bytes 64MiB --max-job-bytes 0 --max-response-memory 0 \
    2>>"$tmp/server.log" &
  server=$!
  pids+=("$server")
  base="http://127.0.0.1:$port"
  wait_for "$base/healthz"
}

# quiet: waits (bounded: 600 s) until the server holds no job: the job is written and out of memory.
quiet() {
  for _ in $(seq 1 6000); do
    [ "$(curl -sS "$base/metrics" | awk '$1 ~ /^jobserver_nodes\{/ {n += $2} END {print n + 0}')" = 0 ] && return 0
    sleep 0.1
  done
  echo "the job still in memory after 600 s" >&2
  exit 1
}

# read_back PATH TIMES PEAKS AFTER: reads PATH whole to /dev/null; appends to the three arrays its milliseconds, the
# peak and the RSS SETTLE s later (MiB).
read_back() {
  local -n times=$2 peaks=$3 after=$4
  times+=("$(curl -sS -o /dev/null -w '%{time_total}' "$base$1" | awk '{printf "%.0f", $1 * 1000}')")
  sleep "$SETTLE"
  peaks+=("$(mib "$(kib VmHWM "$server")")")
  after+=("$(mib "$(kib VmRSS "$server")")")
}

run_peak=() run_after=() job_ms=() job_peak=() job_after=() nodes_ms=() nodes_peak=() nodes_after=()
for run in $(seq 1 "$RUNS"); do
  rm -rf "$tmp/db"
  serve
  location=$(curl -sS -o /dev/null -w '%header{location}' -H 'Content-Type: application/json' \
    --data-binary @"$tmp/job.json" "$base/v1/jobs")
  id=${location##*/}
  [ -n "$id" ] || { echo "the job was refused" >&2; exit 1; }
  curl -sS -o "$tmp/answer.json" "$base/v1/jobs/$id?wait=60"
  state=$(head -c 4096 "$tmp/answer.json" | grep -o '"state":"[a-z]*"' | head -1)
  rm -f "$tmp/answer.json"
  [ "$state" = '"state":"succeeded"' ] || { echo "the job ended $state" >&2; exit 1; }
  quiet
  sleep "$SETTLE"
  run_peak+=("$(mib "$(kib VmHWM "$server")")")
  run_after+=("$(mib "$(kib VmRSS "$server")")")
  kill "$server"
  wait "$server" 2>/dev/null || true
  serve
  read_back "/v1/jobs/$id" job_ms job_peak job_after
  read_back "/v1/jobs/$id/nodes?include=result" nodes_ms nodes_peak nodes_after
  answer=$(curl -sS -o /dev/null -w '%{size_download}' "$base/v1/jobs/$id")
  kill "$server"
  wait "$server" 2>/dev/null || true
  echo "run $run: job peak ${run_peak[-1]} MiB, ${run_after[-1]} MiB after; read back ${job_ms[-1]} ms, peak ${job_peak[-1]}, ${job_after[-1]} after; nodes ${nodes_ms[-1]} ms, peak ${nodes_peak[-1]}, ${nodes_after[-1]} after" >&2
done

# Readers of different large jobs at once: the last run's file gets READERS - 1 more runs of the job; then, each run
# on a new server, READERS clients read the READERS jobs' answers at once (one job each), and then their node lists.
READERS=${READERS:-4}
ids=("$id")
serve
for _ in $(seq 2 "$READERS"); do
  location=$(curl -sS -o /dev/null -w '%header{location}' -H 'Content-Type: application/json' \
    --data-binary @"$tmp/job.json" "$base/v1/jobs")
  ids+=("${location##*/}")
  curl -sS -o "$tmp/answer.json" "$base/v1/jobs/${ids[-1]}?wait=60"
  state=$(head -c 4096 "$tmp/answer.json" | grep -o '"state":"[a-z]*"' | head -1)
  rm -f "$tmp/answer.json"
  [ "$state" = '"state":"succeeded"' ] || { echo "job ${#ids[@]} ended $state" >&2; exit 1; }
  quiet
done
kill "$server"
wait "$server" 2>/dev/null || true

# read_all SUFFIX TIMES PEAKS: on a new server, one curl per job at once, each reading /v1/jobs/{id}SUFFIX to
# /dev/null; appends the milliseconds until the last is read, and the server's peak (MiB).
read_all() {
  local -n times=$2 peaks=$3
  local start end reader readers=()
  serve
  start=${EPOCHREALTIME/./}
  for reader in "${ids[@]}"; do
    curl -sS -o /dev/null "$base/v1/jobs/$reader$1" &
    readers+=("$!")
  done
  wait "${readers[@]}"
  end=${EPOCHREALTIME/./}
  times+=("$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.0f", (b-a)/1e3}')")
  peaks+=("$(mib "$(kib VmHWM "$server")")")
  kill "$server"
  wait "$server" 2>/dev/null || true
}

many_job_ms=() many_job_peak=() many_nodes_ms=() many_nodes_peak=()
for run in $(seq 1 "$RUNS"); do
  read_all "" many_job_ms many_job_peak
  read_all "/nodes?include=result" many_nodes_ms many_nodes_peak
  echo "run $run: $READERS readers of $READERS jobs ${many_job_ms[-1]} ms, peak ${many_job_peak[-1]}; of their nodes ${many_nodes_ms[-1]} ms, peak ${many_nodes_peak[-1]}" >&2
done

verdict() { awk -v a="$(printf '%s\n' "$@" | median)" -v t="$TARGET_MIB" 'BEGIN{print (a <= t) ? "met" : "missed"}'; }

cat <<MD
## Memory around a job of many small results

nginx $(nginx_version) serves a JSON file of 1,024 bytes on 127.0.0.1. The jobserver ($CONFIG; \`--max-nodes $((N + 10))
--max-request-bytes 64MiB --max-job-bytes 0 --max-response-memory 0\`, otherwise default flags) runs one job, a
\`list\` of $N fetches of it (each URL its own; bench 25's job), whose answer is $answer bytes. Each run on a fresh
SQLite file: the job runs and its settled answer is read; once it has left memory, the peak since the server started
(\`VmHWM\`) and the RSS (\`VmRSS\`) $SETTLE s later. Then a new server on the same file reads the job back from the store,
then its nodes with their results: the milliseconds each read takes (curl, to /dev/null), and the server's peak and RSS
$SETTLE s after each. Last, the file holds $READERS such jobs, and each run a new server has $READERS clients read them at
once, one job each: their answers, then (on another new server) their nodes with results; the milliseconds until the
last is read, and the server's peak. $RUNS runs: median (min–max), MiB.

| what | time, ms | peak | RSS after | target ≤ $TARGET_MIB MiB (peak / after) |
|---|---:|---:|---:|---|
| the job runs, is read once and leaves memory | | $(spread "${run_peak[@]}") | $(spread "${run_after[@]}") | $(verdict "${run_peak[@]}") / $(verdict "${run_after[@]}") |
| a new server reads it from the store (\`GET /v1/jobs/{id}\`) | $(spread "${job_ms[@]}") | $(spread "${job_peak[@]}") | $(spread "${job_after[@]}") | $(verdict "${job_peak[@]}") / $(verdict "${job_after[@]}") |
| then its nodes with results | $(spread "${nodes_ms[@]}") | $(spread "${nodes_peak[@]}") | $(spread "${nodes_after[@]}") | $(verdict "${nodes_peak[@]}") / $(verdict "${nodes_after[@]}") |
| $READERS clients at once read $READERS such jobs from the store, one each | $(spread "${many_job_ms[@]}") | $(spread "${many_job_peak[@]}") | | $(verdict "${many_job_peak[@]}") / — |
| … their nodes with results | $(spread "${many_nodes_ms[@]}") | $(spread "${many_nodes_peak[@]}") | | $(verdict "${many_nodes_peak[@]}") / — |
MD
