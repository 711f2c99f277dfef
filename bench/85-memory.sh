#!/usr/bin/env bash
# The server's resident memory under big responses: nginx serves a 10 MB JSON file and a 1 MB one on loopback; the
# release server, with default flags (so `--max-job-bytes 64MiB`, `--max-response-memory 64MiB`,
# `--max-response-bytes 10MiB`), runs
#   (i)   one job, a `list` of N fetches of the 10 MB file,
#   (ii)  JOBS such jobs submitted at once,
#   (iii) one job, a `list` of N fetches of the 1 MB file,
#   (iv)  MANY such jobs submitted at once,
#   (v)   NODE_JOBS (default 20) jobs submitted at once, each a `list` of NODES (default 9,999, so 10,000 nodes: the
#         default `--max-nodes`) fetches of a TINY_BYTES (21) file: memory that goes with nodes, not with results,
#         bounded by `--max-active-nodes` (default 20,000, so two such jobs at a time; the others wait in the store);
#   (vi)  the same with `--max-active-nodes 0` (no bound),
#   (vii) one job of BIG_NODES (default 99,999) fetches of the TINY_BYTES file, with the `--max-nodes` and
#         `--max-request-bytes` it needs: a job larger than the node bound, which runs alone, its state changes
#         written as it runs (each time half the bound's worth have come),
# each on a fresh server and SQLite file. Measured from /proc/<pid>/status: the peak RSS until the jobs settled
# (VmHWM), the peak until the store has written them and they have left memory (the engine keeps a settled job
# until its last state is committed; `jobserver_nodes` on /metrics counts the nodes of the jobs in memory), the RSS
# SETTLE s after that (VmRSS), then the peak after one `GET` of each settled job (its whole answer); and each job's
# outcome: its state and how many fetches succeeded or failed with which kind. Target: RSS <= 256 MiB.
# Each case runs RUNS times (default 5): median (min–max). N (default 100), JOBS (default 4), MANY (default 16), BIG_NODES,
# BIG_BYTES (10000000), SMALL_BYTES (1000000), SETTLE (5 s) and CONFIG (release, or debug for a quick check) may be
# set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-100}
JOBS=${JOBS:-4}
MANY=${MANY:-16}
BIG_BYTES=${BIG_BYTES:-10000000}
SMALL_BYTES=${SMALL_BYTES:-1000000}
NODE_JOBS=${NODE_JOBS:-20}
NODES=${NODES:-9999}
BIG_NODES=${BIG_NODES:-99999}
TINY_BYTES=${TINY_BYTES:-21}
SETTLE=${SETTLE:-5}
RUNS=${RUNS:-5}
CONFIG=${CONFIG:-release}
TARGET_MIB=256

require curl jq python3 nginx
bench_setup

build_jobserver "$CONFIG"

mkdir -p "$tmp/www"
# Valid JSON of exactly the size asked: {"data":"xxx…"}.
python3 - "$tmp/www" "$BIG_BYTES" "$SMALL_BYTES" "$TINY_BYTES" <<'PY'
import sys
root, big, small, tiny = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for name, size in (("big.json", big), ("small.json", small), ("tiny.json", tiny)):
    with open(f"{root}/{name}", "w") as f:
        f.write('{"data":"' + "x" * (size - 11) + '"}')
PY
chmod 644 "$tmp/www/"*.json
start_nginx "$tmp/www"
wait_for "http://127.0.0.1:$nginx_port/small.json" || { tail -5 "$tmp/logs/error.log" >&2; exit 1; }

# job_body FILE COUNT: a list of COUNT fetches of FILE, each URL its own (no sharing between them).
job_body() {
  python3 - "$1" "$2" "$nginx_port" <<'PY'
import json, sys
name, n, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(json.dumps({"graph": {"type": "list", "children": [
    {"type": "fetch", "url": f"http://127.0.0.1:{port}/{name}?i={i}"} for i in range(1, n + 1)]}}))
PY
}

rows=()
# scenario LABEL FILE COUNT [FETCHES [FLAGS]]: COUNT jobs of FETCHES (default N) fetches of FILE at once on a fresh
# server started with FLAGS (default none); appends its figures to the arrays of the case (m_base, m_hwm, m_written,
# m_settled, m_get in MiB, m_run, m_write in ms, m_outcomes).
scenario() {
  local label="$1" file="$2" count="$3" fetches="${4:-$N}" flags="${5:-}"
  local port server base ids=() subs=() id k state outcomes start base_kib hwm_kib
  local written_kib settled_kib get_kib run_ms write_ms in_memory unsettled
  port=$(free_port)
  rm -rf "$tmp/db" "$tmp/outcomes-$label"
  # shellcheck disable=SC2086 # FLAGS is a list of words.
  "$bin/jobserver" serve --host 127.0.0.1 --port "$port" --db "$tmp/db/jobs.sqlite" $flags 2>"$tmp/server-$label.log" &
  server=$!
  pids+=("$server")
  base="http://127.0.0.1:$port"
  wait_for "$base/healthz"
  base_kib=$(kib VmRSS "$server")
  job_body "$file" "$fetches" >"$tmp/job.json"
  start=$(date +%s%N)
  for ((k = 0; k < count; k++)); do
    curl -sS -H 'Content-Type: application/json' --data-binary @"$tmp/job.json" "$base/v1/jobs" >"$tmp/answer-$k.json" &
    subs+=($!)
  done
  wait "${subs[@]}"
  for ((k = 0; k < count; k++)); do
    id=$(jq -r .id "$tmp/answer-$k.json")
    [ -n "$id" ] && [ "$id" != null ] || { echo "$label: submission $k refused: $(head -c 300 "$tmp/answer-$k.json")" >&2; exit 1; }
    ids+=("$id")
  done
  # Settled is read from the job list (no results, and no nodes: a node list of 100,000 is 15 MB), so that waiting
  # builds no big answer; bounded: 600 s.
  for _ in $(seq 1 1200); do
    unsettled=$(curl -sS "$base/v1/jobs?limit=500" | jq '[.jobs[] | select(.state == "pending" or .state == "running")] | length')
    [ "$unsettled" = 0 ] && break
    sleep 0.5
  done
  [ "$unsettled" = 0 ] || { echo "$label: $unsettled jobs not settled in 600 s" >&2; exit 1; }
  run_ms=$(ms_since "$start")
  hwm_kib=$(kib VmHWM "$server")
  start=$(date +%s%N)
  # Bounded: 600 s.
  for _ in $(seq 1 6000); do
    in_memory=$(curl -sS "$base/metrics" | awk '$1 ~ /^jobserver_nodes\{/ {n += $2} END {print n + 0}')
    [ "$in_memory" = 0 ] && break
    sleep 0.1
  done
  [ "$in_memory" = 0 ] || { echo "$label: jobs still in memory after 600 s" >&2; exit 1; }
  write_ms=$(ms_since "$start")
  written_kib=$(kib VmHWM "$server")
  sleep "$SETTLE"
  settled_kib=$(kib VmRSS "$server")
  for id in "${ids[@]}"; do
    curl -sS "$base/v1/jobs/$id/nodes" \
      | jq -r '[.nodes[0].state] + ([.nodes[1:][] | if .state == "succeeded" then "succeeded" else (.error.kind // .state) end]
               | group_by(.) | map("\(length) \(.[0])")) | "\(.[0]): \(.[1:] | join(", "))"' >>"$tmp/outcomes-$label"
    curl -sS -o /dev/null "$base/v1/jobs/$id"
  done
  get_kib=$(kib VmHWM "$server")
  outcomes=$(sort "$tmp/outcomes-$label" | uniq -c | awk '{c=$1; $1=""; sub(/^ /, ""); printf "%s%s", (NR>1 ? "; " : ""), (c>1 ? c " jobs " : "") $0}')
  kill "$server"
  wait "$server" 2>/dev/null || true
  echo "$label: start $(mib "$base_kib") MiB, peak $(mib "$hwm_kib") MiB until settled, $(mib "$written_kib") MiB until written, then $(mib "$settled_kib") MiB; peak with GETs $(mib "$get_kib") MiB; settled in $run_ms ms, written $write_ms ms later; $outcomes" >&2
  m_base+=("$(mib "$base_kib")"); m_hwm+=("$(mib "$hwm_kib")"); m_written+=("$(mib "$written_kib")")
  m_settled+=("$(mib "$settled_kib")"); m_get+=("$(mib "$get_kib")"); m_run+=("$run_ms"); m_write+=("$write_ms")
  m_outcomes+=("$outcomes")
}


# case_row LABEL FILE COUNT [FETCHES [FLAGS]]: the scenario RUNS times; adds a row. The target is checked on the median of the last
# peak, the highest.
case_row() {
  m_base=(); m_hwm=(); m_written=(); m_settled=(); m_get=(); m_run=(); m_write=(); m_outcomes=()
  for _ in $(seq 1 "$RUNS"); do scenario "$@"; done
  local get verdict outcomes
  get=$(printf '%s\n' "${m_get[@]}" | median)
  verdict=$(awk -v a="$get" -v t="$TARGET_MIB" 'BEGIN{print (a <= t) ? "met" : "missed"}')
  outcomes=$(printf '%s\n' "${m_outcomes[@]}" | sort | uniq -c | awk '{c=$1; $1=""; sub(/^ /, ""); printf "%s%s (%s run%s)", (NR>1 ? " / " : ""), $0, c, (c>1 ? "s" : "")}')
  rows+=("| $1 | $(spread "${m_base[@]}") | **$(spread "${m_hwm[@]}")** | **$(spread "${m_written[@]}")** | $(spread "${m_settled[@]}") | $(spread "${m_get[@]}") | $(spread "${m_run[@]}") | $(spread "${m_write[@]}") | $outcomes | $verdict |")
}

big_mb=$(awk -v b="$BIG_BYTES" 'BEGIN{printf "%g", b/1e6}')
small_mb=$(awk -v b="$SMALL_BYTES" 'BEGIN{printf "%g", b/1e6}')
case_row "1 job × $N × $big_mb MB" big.json 1
case_row "$JOBS jobs × $N × $big_mb MB" big.json "$JOBS"
case_row "1 job × $N × $small_mb MB" small.json 1
case_row "$MANY jobs × $N × $small_mb MB" small.json "$MANY"
case_row "$NODE_JOBS jobs × $NODES × $TINY_BYTES B" tiny.json "$NODE_JOBS" "$NODES"
case_row "$NODE_JOBS jobs × $NODES × $TINY_BYTES B, \`--max-active-nodes 0\`" tiny.json "$NODE_JOBS" "$NODES" "--max-active-nodes 0"
big_flags="--max-nodes $((BIG_NODES + 1)) --max-request-bytes 64MiB"
case_row "1 job × $BIG_NODES × $TINY_BYTES B, \`$big_flags\`" tiny.json 1 "$BIG_NODES" "$big_flags"

cat <<MD
## Memory under big responses

nginx $(nginx_version) serves JSON files of $BIG_BYTES, $SMALL_BYTES and $TINY_BYTES bytes on 127.0.0.1. The
jobserver ($CONFIG, default flags: \`--max-job-bytes 64MiB\`, \`--max-response-memory 64MiB\`, \`--max-response-bytes 10MiB\`, \`--max-active-nodes 20000\`) runs each case on a fresh
server and SQLite file: jobs that are a \`list\` of fetches of one file (each URL its own), submitted at once. The last
three rows are about memory that goes with nodes rather than results: with the default \`--max-active-nodes\`, two of
the $NODE_JOBS jobs of $((NODES + 1)) nodes are in memory at a time and the others wait in the store; the next row
has no bound; the last is one job larger than the bound, which runs alone, the store writing its state changes as it
runs (each time half the bound's worth have come).
RSS in MiB from \`/proc/<pid>/status\`: at start; the peak until all had settled (\`VmHWM\`, waiting on the job
list, which carries no results); the peak until the store had written them and they had left memory (the engine
keeps a settled job until its last state is committed; \`jobserver_nodes\` on \`/metrics\` counts the nodes in
memory); the RSS $SETTLE s after that (\`VmRSS\`); and the peak once each settled job was read whole with
\`GET /v1/jobs/{id}\`. Then ms from the submissions to settled, and from settled to out of memory. Outcome: the
job's state, then its fetches by outcome, with how many runs ended so. $RUNS runs each: median (min–max); the target is
checked on the median of the last peak, the highest.

| case | start | peak until settled | peak until written | after | peak with GET | ms to settle | ms to write | outcome | target ≤ $TARGET_MIB MiB |
|---|---:|---:|---:|---:|---:|---:|---:|---|---|
$(printf '%s\n' "${rows[@]}")
MD
