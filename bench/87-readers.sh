#!/usr/bin/env bash
# The server's resident memory while clients read one large settled job. nginx serves a 1 MB JSON file on loopback;
# the release server, with default flags, runs one job, a `list` of N (default 55) fetches of it: an answer of about
# N MB, under the default `--max-job-bytes 64MiB`. Each case runs on a fresh server and SQLite file:
#   (a) READERS (default 8) clients GET the settled job at once, each reading 10 KB/s (`curl --limit-rate`);
#   (b) READERS clients long-poll it (`?wait=30`) from its submission on, each reading 10 KB/s once answered;
#   (c) one connection sends PIPELINED (default 40) GETs of the settled job in one write and reads nothing;
#   (d) READERS clients GET its nodes with their results (`/nodes?include=result`, about twice the answer) at once,
#       each reading 10 KB/s.
# HOLD s (default 6) into that: the RSS (VmRSS) and the peak since the server started (VmHWM, the job's own run
# included), from /proc/<pid>/status. Target: the peak <= 256 MiB. Each case runs RUNS times (default 5): median
# (min–max). N, READERS, PIPELINED, HOLD, RUNS and CONFIG (release, or debug for a quick check) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-55}
READERS=${READERS:-8}
PIPELINED=${PIPELINED:-40}
HOLD=${HOLD:-6}
RUNS=${RUNS:-5}
CONFIG=${CONFIG:-release}
TARGET_MIB=256
FILE_BYTES=1000000

require curl jq python3 nginx
bench_setup

build_jobserver "$CONFIG"

serve_json_file "$FILE_BYTES"
list_job "$N" >"$tmp/job.json"

# settle BASE ID: waits (bounded: 120 s) until the job is settled, reading its node list, which carries no results.
settle() {
  local state
  for _ in $(seq 1 240); do
    state=$(curl -sS "$1/v1/jobs/$2/nodes" | jq -r '.nodes[0].state')
    case "$state" in pending|running) sleep 0.5 ;; *) break ;; esac
  done
  [ "$state" = succeeded ] || { echo "job $2 ended $state" >&2; exit 1; }
}

# scenario CASE: one run of case a, b, c or d; appends the RSS and the peak in MiB to m_rss and m_hwm.
scenario() {
  local which="$1" port server base location id readers=() rss hwm size
  port=$(free_port)
  rm -rf "$tmp/db"
  "$bin/jobserver" serve --host 127.0.0.1 --port "$port" --db "$tmp/db/jobs.sqlite" 2>"$tmp/server-$which.log" &
  server=$!
  pids+=("$server")
  base="http://127.0.0.1:$port"
  wait_for "$base/healthz"
  location=$(curl -sS -o /dev/null -w '%header{location}' -H 'Content-Type: application/json' \
    --data-binary @"$tmp/job.json" "$base/v1/jobs")
  id=${location##*/}
  [ -n "$id" ] || { echo "the job was refused" >&2; exit 1; }
  case "$which" in
    a|c|d) settle "$base" "$id" ;;
  esac
  case "$which" in
    a|b|d)
      local path=""
      [ "$which" = b ] && path="?wait=30"
      [ "$which" = d ] && path="/nodes?include=result"
      for _ in $(seq 1 "$READERS"); do
        curl -sS --limit-rate 10k --max-time $((HOLD + 5)) -o /dev/null "$base/v1/jobs/$id$path" 2>/dev/null &
        readers+=($!)
        pids+=("$!")
      done
      ;;
    c)
      python3 - "$port" "$id" "$PIPELINED" "$((HOLD + 2))" <<'PY' &
import socket, sys, time
port, job, count, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(f"GET /v1/jobs/{job} HTTP/1.1\r\nHost: bench\r\n\r\n".encode() * count)
time.sleep(hold)  # reads nothing
PY
      readers+=($!)
      pids+=("$!")
      ;;
  esac
  sleep "$HOLD"
  rss=$(kib VmRSS "$server")
  hwm=$(kib VmHWM "$server")
  kill "${readers[@]}" 2>/dev/null || true
  wait "${readers[@]}" 2>/dev/null || true
  size=$(curl -sS -o /dev/null -w '%{size_download}' "$base/v1/jobs/$id")
  kill "$server"
  wait "$server" 2>/dev/null || true
  echo "case $which: RSS $(mib "$rss") MiB, peak $(mib "$hwm") MiB; answer $size bytes" >&2
  m_rss+=("$(mib "$rss")")
  m_hwm+=("$(mib "$hwm")")
  answer_bytes=$size
}

rows=()
answer_bytes=0
for which in a b c d; do
  m_rss=()
  m_hwm=()
  for _ in $(seq 1 "$RUNS"); do scenario "$which"; done
  peak=$(printf '%s\n' "${m_hwm[@]}" | median)
  verdict=$(awk -v a="$peak" -v t="$TARGET_MIB" 'BEGIN{print (a <= t) ? "met" : "missed"}')
  case "$which" in
    a) label="$READERS clients GET the settled job at once, reading 10 KB/s" ;;
    b) label="$READERS clients long-poll it from its submission, reading 10 KB/s" ;;
    c) label="one connection pipelines $PIPELINED GETs of it, reading nothing" ;;
    d) label="$READERS clients GET its nodes with results at once, reading 10 KB/s" ;;
  esac
  rows+=("| ($which) $label | $(spread "${m_rss[@]}") | **$(spread "${m_hwm[@]}")** | $verdict |")
done

cat <<MD
## Memory while clients read a large job

nginx $(nginx_version) serves a JSON file of $FILE_BYTES bytes on 127.0.0.1. The jobserver ($CONFIG, default flags) runs
one job, a \`list\` of $N fetches of it (each URL its own), whose answer (\`GET /v1/jobs/{id}\`) is $answer_bytes
bytes; then clients read it as the rows say, each case on a fresh server and SQLite file. RSS in MiB from
\`/proc/<pid>/status\` $HOLD s into the reads (\`VmRSS\`), and the peak since the server started (\`VmHWM\`, the job's
own run included). A settled job too large for the settled-job cache (an eighth of \`--settled-cache-bytes\`) has
its answer made once for the reads under way and shared while any connection still sends it, and so have its nodes
with their results (\`/nodes?include=result\`, about twice the answer: the list's result holds its children's); made
from the store, either is written to a temporary file beside the SQLite file and sent from there; a long-poll's is
made in memory. A connection reads no further request while a mebibyte of its answers is unsent. $RUNS runs each: median (min–max); the target is
checked on the median peak.

| case | RSS | peak | target ≤ $TARGET_MIB MiB |
|---|---:|---:|---|
$(printf '%s\n' "${rows[@]}")
MD
