#!/usr/bin/env bash
# Bytes stored against bytes fetched: two jobs, each a `list` of N fetches (default 9,000) of a JSON file from nginx
# (BODIES, default 1 KiB and 4 KiB), and the same two jobs with the fetches nested 3 lists deep. Each layout runs on a fresh SQLite file; the
# server is stopped (which checkpoints the WAL into the file) and the file measured, after `PRAGMA
# wal_checkpoint(TRUNCATE)` with the sqlite3 CLI should a WAL be left. "Overhead" is what the jobs add to the empty
# store beyond the bytes fetched, per node. Target: stored ≤ 1.5 × fetched + a fixed per-node overhead, whatever the
# depth, i.e. the overhead per node about the same flat and nested. RUNS runs (default 3): median (min–max).
# N, BODIES, RUNS and CONFIG (release, or debug for a quick check) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-9000}
RUNS=${RUNS:-3}
CONFIG=${CONFIG:-release}
BODIES=${BODIES:-1024 4096}

require curl jq python3 nginx sqlite3
bench_setup

build_jobserver "$CONFIG"

mkdir -p "$tmp/www"
for body in $BODIES; do
  python3 -c 'import sys; n = int(sys.argv[2]); open(sys.argv[1], "w").write("{\"data\":\"" + "x" * (n - 11) + "\"}")' \
    "$tmp/www/data-$body.json" "$body"
  chmod 644 "$tmp/www/data-$body.json"
done
start_nginx "$tmp/www"
wait_for "http://127.0.0.1:$nginx_port/data-${BODIES%% *}.json" || { tail -5 "$tmp/logs/error.log" >&2; exit 1; }

# job-flat.json and job-nested.json for a body size: the same N URLs, as one list, or as lists of lists of lists of
# about ∛N each.
make_jobs() {
python3 - "$N" "$nginx_port" "$tmp" "$1" <<'PY'
import json, math, sys
n, port, tmp, body = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
fetches = [{"type": "fetch", "url": f"http://127.0.0.1:{port}/data-{body}.json?i={i}"} for i in range(1, n + 1)]
k = max(2, math.ceil(n ** (1 / 3)))
def chunk(items):
    return [{"type": "list", "children": items[i:i + k]} for i in range(0, len(items), k)]
nested = chunk(chunk(fetches))
json.dump({"graph": {"type": "list", "children": fetches}}, open(f"{tmp}/job-flat.json", "w"))
json.dump({"graph": {"type": "list", "children": nested}}, open(f"{tmp}/job-nested.json", "w"))
lists = 1 + len(nested) + sum(len(c["children"]) for c in nested)
open(f"{tmp}/nodes-flat", "w").write(str(n + 1))
open(f"{tmp}/nodes-nested", "w").write(str(n + lists))
PY
}

# Starts a server on a fresh file, runs `jobs` jobs of layout $1 (none for the empty store), stops it; sets `size`
# to the file's bytes. (Not in a subshell, so that the exit trap knows the server.)
measure() {
  local layout="$1" jobs="$2" port base server id state
  rm -rf "$tmp/db"
  port=$(free_port)
  "$bin/jobserver" serve --host 127.0.0.1 --port "$port" --db "$tmp/db/jobs.sqlite" \
    --max-per-host 64 --max-concurrent-fetches 64 --max-nodes $(( 2 * N + 10 )) --max-request-bytes 64MiB \
    2>"$tmp/server.log" &
  server=$!
  pids+=("$server")
  base="http://127.0.0.1:$port"
  wait_for "$base/healthz"
  for _ in $(seq 1 "$jobs"); do
    id=$(curl -sS -H 'Content-Type: application/json' --data-binary @"$tmp/job-$layout.json" "$base/v1/jobs" | jq -r .id)
    state=running
    # Bounded: each long-poll waits at most 60 s.
    for _ in $(seq 1 10); do
      state=$(curl -sS "$base/v1/jobs/$id?wait=60" | jq -r .state)
      [ "$state" = pending ] || [ "$state" = running ] || break
    done
    [ "$state" = succeeded ] || { echo "a $layout job ended $state" >&2; tail -5 "$tmp/server.log" >&2; exit 1; }
  done
  kill "$server"
  wait "$server" 2>/dev/null || true
  if [ -e "$tmp/db/jobs.sqlite-wal" ]; then sqlite3 "$tmp/db/jobs.sqlite" 'PRAGMA wal_checkpoint(TRUNCATE);' >/dev/null; fi
  local wal=0
  [ -e "$tmp/db/jobs.sqlite-wal" ] && wal=$(stat -c %s "$tmp/db/jobs.sqlite-wal")
  size=$(( $(stat -c %s "$tmp/db/jobs.sqlite") + wal ))
}

make_jobs "${BODIES%% *}"
measure flat 0
empty=$size
rows=()
for body in $BODIES; do
make_jobs "$body"
fetched=$(( 2 * N * body ))
for layout in flat nested; do
  nodes=$(( 2 * $(cat "$tmp/nodes-$layout") ))
  sizes=()
  for run in $(seq 1 "$RUNS"); do
    measure "$layout" 2
    sizes+=("$size")
    echo "$body B, $layout run $run: ${sizes[-1]} bytes for $fetched fetched ($nodes nodes)" >&2
  done
  stored=$(printf '%s\n' "${sizes[@]}" | median)
  ratio=$(awk -v s="$stored" -v f="$fetched" 'BEGIN{printf "%.2f", s/f}')
  # What the jobs add beyond the fetched bytes, per node; and beyond 1.5 × the fetched bytes.
  over=$(awk -v s="$stored" -v e="$empty" -v f="$fetched" -v n="$nodes" 'BEGIN{printf "%.0f", (s-e-f)/n}')
  over15=$(awk -v s="$stored" -v e="$empty" -v f="$fetched" -v n="$nodes" 'BEGIN{printf "%.0f", (s-e-1.5*f)/n}')
  rows+=("| $body | $layout | $nodes | $(awk -v f="$fetched" 'BEGIN{printf "%.1f", f/1e6}') | $(awk -v s="$stored" 'BEGIN{printf "%.1f", s/1e6}') ($(printf '%s\n' "${sizes[@]}" | awk '{printf "%.1f\n", $1/1e6}' | range)) | **$ratio** | $over | $over15 |")
done
done

cat <<MD
## Bytes stored for the bytes fetched

Two jobs, each a \`list\` of $N fetches of a JSON file of $(echo $BODIES | sed 's/ / or /g') bytes from nginx $(nginx_version) on 127.0.0.1
(\`/data-<bytes>.json?i=1…$N\`), stored by one jobserver ($CONFIG) on a fresh SQLite file; "nested" is the same two jobs
with the fetches in lists of lists of lists of about ∛$N. The file is measured after the server stopped (its WAL
checkpointed); the empty store is $(awk -v e="$empty" 'BEGIN{printf "%.1f", e/1e3}') kB. $RUNS runs per layout: median (min–max) MB.
"Per node" columns: bytes the jobs add to the empty store beyond the fetched bytes (and beyond 1.5 × them), per node
(fetches and lists). Target: stored ≤ 1.5 × fetched + a fixed per-node overhead, whatever the depth.

| body, B | layout | nodes | fetched MB | stored MB | stored / fetched | per node beyond fetched, B | per node beyond 1.5 × fetched, B |
|---:|---|---:|---:|---|---:|---:|---:|
$(printf '%s\n' "${rows[@]}")
MD
