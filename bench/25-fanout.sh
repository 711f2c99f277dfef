#!/usr/bin/env bash
# One job of N fetches against `curl --parallel --parallel-max 64` over the same N URLs, at N = 1,000, 10,000 and
# 100,000: a 1 KiB JSON file from nginx on loopback. The job is a `list` of the N fetches, timed from sending the
# POST to its settled answer by a client already running (bench/job_client.py), so its durable submission and every
# state change are in it, and again from the command line with two curl processes; the server runs with
# default flags but as many transfers at once as curl (`--max-per-host 64 --max-concurrent-fetches 64`) and the
# limits the size needs (`--max-nodes`, `--max-request-bytes`, and the memory bounds off: `--max-job-bytes 0
# --max-response-memory 0`, since 100,000 KiB is over the default 64MiB budgets, and `--max-active-nodes 0`: with the
# bound, a job of more nodes has its state changes written as its fetches run, docs/architecture.md). Each size runs RUNS
# times (default 5), curl then the job (twice), on one server with a fresh SQLite file per size: median and min–max.
# Target: job <= 1.1x curl.
# SIZES (default "1000 10000 100000"), RUNS and CONFIG (release, or debug for a quick check) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SIZES=${SIZES:-1000 10000 100000}
RUNS=${RUNS:-5}
CONFIG=${CONFIG:-release}
CONCURRENCY=64

require curl jq python3 nginx
bench_setup

build_jobserver "$CONFIG"

mkdir -p "$tmp/www"
python3 -c 'import sys; open(sys.argv[1], "w").write("{\"data\":\"" + "x" * 1013 + "\"}")' "$tmp/www/data.json"
chmod 644 "$tmp/www/data.json"
start_nginx "$tmp/www"
wait_for "http://127.0.0.1:$nginx_port/data.json" || { tail -5 "$tmp/logs/error.log" >&2; exit 1; }


ratio_of() {  # job times, then curl times: the ratio of the medians, then each run's
  local -n jobs=$1 curls=$2
  local i runs=()
  for i in "${!curls[@]}"; do runs+=("$(awk -v j="${jobs[$i]}" -v c="${curls[$i]}" 'BEGIN{printf "%.2f", j/c}')"); done
  echo "$(awk -v j="$(printf '%s\n' "${jobs[@]}" | median)" -v c="$(printf '%s\n' "${curls[@]}" | median)" \
    'BEGIN{printf "%.2f", j/c}') ($(printf '%s\n' "${runs[@]}" | range))"
}

# Waits until the server holds no job (the one before is written to the store and out of memory), then until it has
# had nothing to do for 200 ms (its CPU time in /proc/PID/stat still: the store's writer copies the WAL into the
# database after a job has left memory), and writes the dirty pages out (`sync`), so that neither side's run shares
# the machine or the disk with the writes of the run before it. Bounded: 600 s.
quiet() {
  local in_memory="" before after
  for _ in $(seq 1 6000); do
    in_memory=$(curl -sS "$base/metrics" | awk '$1 ~ /^jobserver_nodes\{/ {n += $2} END {print n + 0}')
    [ "$in_memory" = 0 ] && break
    sleep 0.1
  done
  [ "$in_memory" = 0 ] || { echo "jobs still in memory after 600 s" >&2; exit 1; }
  before=$(server_ticks)
  for _ in $(seq 1 3000); do
    sleep 0.2
    after=$(server_ticks)
    [ "$after" = "$before" ] && { sync; return 0; }
    before=$after
  done
  echo "the server still busy after 600 s" >&2
  exit 1
}

# The server's CPU time so far, in clock ticks (utime + stime).
server_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }

rows=()
for n in $SIZES; do
  python3 - "$n" "$nginx_port" "$tmp" <<'PY'
import json, sys
n, port, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
urls = [f"http://127.0.0.1:{port}/data.json?i={i}" for i in range(1, n + 1)]
with open(f"{tmp}/curl.conf", "w") as f:
    for u in urls:
        f.write(f'url = "{u}"\noutput = "/dev/null"\n')
with open(f"{tmp}/job.json", "w") as f:
    json.dump({"graph": {"type": "list", "children": [{"type": "fetch", "url": u} for u in urls]}}, f)
PY
  port=$(free_port)
  rm -rf "$tmp/db"
  "$bin/jobserver" serve --host 127.0.0.1 --port "$port" --db "$tmp/db/jobs.sqlite" \
    --max-per-host "$CONCURRENCY" --max-concurrent-fetches "$CONCURRENCY" \
    --max-nodes $(( n + 10 )) --max-request-bytes 64MiB --max-job-bytes 0 --max-response-memory 0 \
    --max-active-nodes 0 2>"$tmp/server-$n.log" &
  server=$!
  pids+=("$server")
  base="http://127.0.0.1:$port"
  wait_for "$base/healthz"
  # The job's side, as the target counts it: a client already running (bench/job_client.py) on one keep-alive
  # connection, timed from the POST's first byte to the settled answer's last.
  coproc client { python3 bench/job_client.py 127.0.0.1 "$port" "$tmp/job.json"; }
  pids+=("$client_PID")
  curl_times=()
  job_times=()
  cli_times=()
  for run in $(seq 1 "$RUNS"); do
    quiet
    # $EPOCHREALTIME: no process of the timer's own inside the curl process's time.
    start=${EPOCHREALTIME/./}
    curl --parallel --parallel-max "$CONCURRENCY" -sS --no-progress-meter -K "$tmp/curl.conf"
    end=${EPOCHREALTIME/./}
    curl_times+=("$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", (b-a)/1e3}')")
    quiet
    echo run >&"${client[1]}"
    read -r ms state <&"${client[0]}"
    [ "$state" = succeeded ] || { echo "the $n-fetch job ended $state" >&2; exit 1; }
    job_times+=("$ms")
    # The same job from the command line: two curl processes, the submission and the long-poll, each started on the
    # clock (curl's side starts one). The id comes from the Location header, and bash reads the state from the
    # settled answer's first bytes (the job's third member). The whole answer is received, as curl receives every
    # file, but not parsed: jq took 0.14 s of CPU on the 10 MB answer of 10,000 fetches and 1.1 s on the 100 MB one.
    quiet
    start=${EPOCHREALTIME/./}
    location=$(curl -sS -o "$tmp/answer.json" -w '%header{location}' -H 'Content-Type: application/json' \
      --data-binary @"$tmp/job.json" "$base/v1/jobs")
    id=${location##*/}
    state=running
    # Bounded: each long-poll waits at most 60 s.
    for _ in {1..10}; do
      curl -sS -o "$tmp/settled.json" "$base/v1/jobs/$id?wait=60"
      head=""
      IFS= read -r -d '' -n 4096 head <"$tmp/settled.json" || true
      state=""
      if [[ $head =~ \"state\":\"([a-z]+)\" ]]; then state=${BASH_REMATCH[1]}; fi
      [ "$state" = pending ] || [ "$state" = running ] || break
    done
    end=${EPOCHREALTIME/./}
    [ "$state" = succeeded ] || { echo "the $n-fetch job ended $state: $(head -c 300 "$tmp/answer.json")" >&2; exit 1; }
    cli_times+=("$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", (b-a)/1e3}')")
    echo "N=$n run $run: curl ${curl_times[-1]} ms, job ${job_times[-1]} ms, job by two curls ${cli_times[-1]} ms" >&2
  done
  exec {client[1]}>&-
  wait "$client_PID" 2>/dev/null || true
  kill "$server"
  wait "$server" 2>/dev/null || true
  ratio=$(ratio_of job_times curl_times)
  verdict=$(awk -v r="${ratio%% *}" 'BEGIN{print (r <= 1.1) ? "met" : "missed"}')
  rows+=("| $n | $(spread "${curl_times[@]}") | $(spread "${job_times[@]}") | **${ratio%% *}** ${ratio#* } | $verdict \
| $(spread "${cli_times[@]}") | $(ratio_of cli_times curl_times) |")
done

cat <<MD
## One job of N fetches against \`curl --parallel\`

A 1 KiB JSON file from nginx $(nginx_version) on 127.0.0.1, fetched N times (\`/data.json?i=1…N\`):
\`curl --parallel --parallel-max $CONCURRENCY\` over the N URLs, then one jobserver job ($CONFIG, a \`list\` of the N
fetches, \`--max-per-host $CONCURRENCY --max-concurrent-fetches $CONCURRENCY\` and the memory bounds off, \`--max-job-bytes 0
--max-response-memory 0 --max-active-nodes 0\`, otherwise default flags and log level)
from sending the \`POST\` to its settled answer (\`?wait=60\`), by a client already running on one keep-alive
connection (\`bench/job_client.py\`): the durable submission and every state change are in it. curl's time includes its
own process start; the last two columns time the same job from the command line, two curl processes (the submission
and the long-poll) each started on the clock. $RUNS runs per size, each curl, the job, then the job by two curls;
each on a quiet server (the job before written to the store and out of memory: \`jobserver_nodes\` on \`/metrics\` is 0;
then no CPU time used for 200 ms, and the dirty pages written out with \`sync\`);
median (min–max) of wall ms, and the ratio of the medians (min–max of the per-run ratios).

| N | curl ms | job ms | job / curl | target ≤ 1.1 | job by two curls, ms | two curls / curl |
|---:|---|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")
MD
