#!/usr/bin/env bash
# GET /v1/jobs/{id} of a settled job against nginx serving the same bytes as a
# static file, wrk -t2 -c64, taking turns, BENCH_RUNS times (default 5).
# Prints a markdown section on stdout: every run's ratio, their median and range.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

DURATION=${BENCH_DURATION:-10s}
RUNS=${BENCH_RUNS:-5}
if [ -n "${JOBSERVER_BIN:-}" ]; then
    BIN=$JOBSERVER_BIN
else
    swift build -c release --product jobserver >&2
    BIN=$(swift build -c release --show-bin-path)/jobserver
fi

bench_setup

server_port=$(free_port)
# Default flags and log level: a line per request, to a file, as nginx's access log below.
"$BIN" serve --host 127.0.0.1 --port "$server_port" --db "$tmp/jobs.sqlite" 2>"$tmp/server.log" &
pids+=($!)
wait_for "http://127.0.0.1:$server_port/healthz"
# A settled job: a list of three fetches refused by a closed port.
id=$(curl -fsS -H 'Content-Type: application/json' \
    --data '{"name":"bench","graph":{"type":"list","children":[{"type":"fetch","url":"http://127.0.0.1:9/a"},{"type":"fetch","url":"http://127.0.0.1:9/b"},{"type":"fetch","url":"http://127.0.0.1:9/c"}]}}' \
    "http://127.0.0.1:$server_port/v1/jobs" | jq -r .id)
curl -fsS -o /dev/null "http://127.0.0.1:$server_port/v1/jobs/$id?wait=10"

mkdir -p "$tmp/www"
curl -fsS -o "$tmp/www/job.json" "http://127.0.0.1:$server_port/v1/jobs/$id"
chmod 644 "$tmp/www/job.json"
bytes=$(stat -c %s "$tmp/www/job.json")
start_nginx "$tmp/www" "$tmp/logs/access.log"
pids+=("$nginx_pid")
wait_for "http://127.0.0.1:$nginx_port/job.json"
# Both answer the same bytes.
cmp -s "$tmp/www/job.json" <(curl -fsS "http://127.0.0.1:$server_port/v1/jobs/$id") || { echo "answers differ" >&2; exit 1; }
cmp -s "$tmp/www/job.json" <(curl -fsS "http://127.0.0.1:$nginx_port/job.json") || { echo "nginx answers other bytes" >&2; exit 1; }

rows=""
ratios=()
# Each run alternates the two in SLICES slices of DURATION/SLICES each, so that a change in the machine's load
# during a run falls on both alike; a server's figure is the mean of its slices.
seconds=${DURATION%s}
SLICES=${BENCH_SLICES:-5}
slice=$(( seconds / SLICES > 0 ? seconds / SLICES : 1 ))
mean() { python3 -c "import sys; r=[float(x) for x in sys.argv[1:]]; print(f'{sum(r)/len(r):.2f}')" "$@"; }
# CPU time (user + system, in clock ticks) of every thread of the given processes: with the machine shared, CPU per
# request tells the two servers' costs apart where requests/s also measures what else runs.
ticks() {
    local total=0 p f
    for p in "$@"; do
        for f in /proc/"$p"/task/*/stat; do total=$((total + $(awk '{print $14 + $15}' "$f" 2>/dev/null || echo 0))); done
    done
    echo "$total"
}
requests() { awk '/requests in/ {print $1}'; }
hz=$(getconf CLK_TCK)
server_pid=${pids[0]}
nginx_workers=$(pgrep -P "$nginx_pid" | tr '\n' ' ')
for run in $(seq 1 "$RUNS"); do
    nginx_slices=()
    server_slices=()
    nginx_ticks=0; nginx_requests=0; server_ticks=0; server_requests=0
    for _ in $(seq 1 "$SLICES"); do
        before=$(ticks $nginx_workers)
        out=$(wrk -t2 -c64 -d"${slice}s" "http://127.0.0.1:$nginx_port/job.json")
        nginx_ticks=$((nginx_ticks + $(ticks $nginx_workers) - before))
        echo "$out" >&2
        nginx_slices+=("$(echo "$out" | rps)")
        nginx_requests=$((nginx_requests + $(echo "$out" | requests)))
        before=$(ticks "$server_pid")
        out=$(wrk -t2 -c64 -d"${slice}s" "http://127.0.0.1:$server_port/v1/jobs/$id")
        server_ticks=$((server_ticks + $(ticks "$server_pid") - before))
        echo "$out" >&2
        server_slices+=("$(echo "$out" | rps)")
        server_requests=$((server_requests + $(echo "$out" | requests)))
    done
    nginx_rps=$(mean "${nginx_slices[@]}")
    server_rps=$(mean "${server_slices[@]}")
    ratio=$(python3 -c "print(f'{$server_rps / $nginx_rps:.2f}')")
    nginx_us=$(python3 -c "print(f'{$nginx_ticks * 1e6 / $hz / max(1, $nginx_requests):.1f}')")
    server_us=$(python3 -c "print(f'{$server_ticks * 1e6 / $hz / max(1, $server_requests):.1f}')")
    echo "run $run: nginx $nginx_rps ($nginx_us us CPU each), jobserver $server_rps ($server_us us), ratio $ratio" >&2
    ratios+=("$ratio")
    rows+="| $run | $nginx_rps | $nginx_us | $server_rps | $server_us | $ratio |"$'\n'
done
# Stopped gently: the cleanup's kill -9 of the master would leave its workers running.
kill -TERM "$nginx_pid" 2>/dev/null || true
wait "$nginx_pid" 2>/dev/null || true
read -r median low high < <(python3 -c "import statistics,sys; r=[float(x) for x in sys.argv[1:]]; print(f'{statistics.median(r):.2f} {min(r):.2f} {max(r):.2f}')" "${ratios[@]}")
met=$(python3 -c "print('met' if $median >= 1.0 else 'not met')")

cat <<MD
## GET of a settled job against nginx

\`GET /v1/jobs/{id}\` of a settled three-node job ($bytes bytes of JSON, answered from the settled-job cache with its
\`ETag\`) against nginx $(nginx_version) serving the same bytes as a static file (\`worker_processes auto\`), each as users
run it: jobserver with default flags and log level, nginx with its access log, each writing a line per request to a
file. \`wrk -t2 -c64\`, $RUNS runs one after the other; in each run the two take turns in $SLICES
slices of ${slice}s (${seconds}s each in all) and a figure is the mean of its slices. CPU per request is the
server's user and system time over its requests (all of nginx's workers; every thread of jobserver).

| run | nginx, static file (requests/s) | nginx CPU µs/request | jobserver \`GET /v1/jobs/{id}\` (requests/s) | jobserver CPU µs/request | ratio (requests/s) |
|---|---:|---:|---:|---:|---:|
$rows
Ratio to nginx: **$median** median, $low–$high over $RUNS runs (target ≥ 1.0: $met).
MD
