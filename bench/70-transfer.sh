#!/usr/bin/env bash
# The transfer layer (API.md §9), two measurements; prints a markdown section on stdout.
#  1. 1,000 HTTPS fetches of the local TLS fixture (Tests/Fixtures/upstream.py with a CA made by
#     Tests/Fixtures/make-tls.sh): the Fetcher (bench/FetchBench, 64 at a time, FETCHBENCH_CA_FILE)
#     against `curl --parallel --parallel-max 64 --cacert` over the same URLs. Target: <= 1.25x curl.
#  2. 1,000 identical GETs in one job (a list of 1,000 fetches of one slow URL) through jobserver,
#     with "coalesce": true and without: requests the upstream saw, and wall time from submit to settled.
#  3. 10,000 distinct cache:"use" responses of about 1 KB with --cache-bytes 1MiB: the largest
#     jobserver_cache_bytes seen while they are stored (sampled every 50 ms), and what is left.
#  4. --host-rate 127.0.0.1=20/s, 200 fetches across 10 jobs: the most arrivals upstream in any 1 s, and
#     the wall time (about 10 s).
# Each side runs RUNS times (default 5): median and min–max. N, CONCURRENCY, RUNS, DELAY_MS (the slow URL's
# delay, default 50), CACHE_N, RATE_N and CONFIG (release, or debug for a quick check) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-1000}
CONCURRENCY=${CONCURRENCY:-64}
RUNS=${RUNS:-5}
DELAY_MS=${DELAY_MS:-50}
CONFIG=${CONFIG:-release}
CACHE_N=${CACHE_N:-10000}
RATE_N=${RATE_N:-200}

require curl jq python3 openssl
bench_setup

echo "building FetchBench and jobserver ($CONFIG)" >&2
swift build -c "$CONFIG" --product FetchBench >&2
swift build -c "$CONFIG" --product jobserver >&2
bin=$(swift build -c "$CONFIG" --show-bin-path)

# start_fixture [ARGS...]: upstream.py on a free port; prints the port.
start_fixture() {
  local out="$tmp/fixture-$RANDOM.out" port=""
  : >"$out"
  python3 Tests/Fixtures/upstream.py --port 0 "$@" >"$out" 2>/dev/null &
  pids+=("$!")
  for _ in $(seq 1 100); do
    port=$(sed -n '1s/^listening \([0-9]*\)$/\1/p' "$out")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "the fixture did not start" >&2; exit 1; }
  echo "$port"
}


# ------------------------------------------------------------------ 1. HTTPS fan-out
bash Tests/Fixtures/make-tls.sh "$tmp/tls" >&2
tls_port=$(start_fixture --tls-cert "$tmp/tls/server.pem" --tls-key "$tmp/tls/server.key")
: >"$tmp/urls.txt"
: >"$tmp/curl.conf"
for i in $(seq 1 "$N"); do
  url="https://127.0.0.1:$tls_port/json?i=$i"
  echo "$url" >>"$tmp/urls.txt"
  printf 'url = "%s"\noutput = "/dev/null"\n' "$url" >>"$tmp/curl.conf"
done
# The same fan-out as one jobserver job: a list of the N fetches, through --ca-file, as many at once as curl.
python3 - "$tmp/urls.txt" >"$tmp/fanout.json" <<'PY'
import json, sys
urls = [line.strip() for line in open(sys.argv[1]) if line.strip()]
print(json.dumps({"graph": {"type": "list", "children": [{"type": "fetch", "url": u} for u in urls]}}))
PY
fan_port=$(free_port)
"$bin/jobserver" serve --host 127.0.0.1 --port "$fan_port" --db "$tmp/fan/jobs.sqlite" \
  --ca-file "$tmp/tls/ca.pem" --max-per-host "$CONCURRENCY" --max-concurrent-fetches "$CONCURRENCY" \
  --max-nodes $(( N + 10 )) --max-request-bytes 16MiB 2>"$tmp/fan-server.log" &
pids+=("$!")
fan_base="http://127.0.0.1:$fan_port"
wait_for "$fan_base/healthz"
# fan_job: ms from sending the POST to the settled answer of one job of the N fetches.
fan_job() {
  local start id state
  start=$(date +%s%N)
  id=$(curl -sS -H 'Content-Type: application/json' --data-binary @"$tmp/fanout.json" "$fan_base/v1/jobs" | tee "$tmp/fan-answer.json" | jq -r .id)
  state=running
  for _ in 1 2 3 4; do
    state=$(curl -sS "$fan_base/v1/jobs/$id?wait=60" | jq -r .state)
    [ "$state" = pending ] || [ "$state" = running ] || break
  done
  [ "$state" = succeeded ] || { echo "the fan-out job ended $state: $(head -c 300 "$tmp/fan-answer.json")" >&2; exit 1; }
  ms_since "$start"
}

curl_times=()
fetch_times=()
job_times=()
for run in $(seq 1 "$RUNS"); do
  start=$(date +%s%N)
  curl --parallel --parallel-max "$CONCURRENCY" -sS --no-progress-meter --cacert "$tmp/tls/ca.pem" -K "$tmp/curl.conf"
  curl_times+=("$(ms_since "$start")")
  start=$(date +%s%N)
  FETCHBENCH_CA_FILE="$tmp/tls/ca.pem" "$bin/FetchBench" "$tmp/urls.txt" "$CONCURRENCY" >/dev/null
  fetch_times+=("$(ms_since "$start")")
  job_times+=("$(fan_job)")
  echo "https run $run: curl ${curl_times[-1]} ms, Fetcher ${fetch_times[-1]} ms, job ${job_times[-1]} ms" >&2
done
curl_ms=$(printf '%s\n' "${curl_times[@]}" | median)
fetch_ms=$(printf '%s\n' "${fetch_times[@]}" | median)
ratio=$(awk -v f="$fetch_ms" -v c="$curl_ms" 'BEGIN{printf "%.2f", f/c}')
verdict=$(awk -v r="$ratio" 'BEGIN{print (r <= 1.25) ? "met" : "missed"}')
job_ms=$(printf '%s\n' "${job_times[@]}" | median)
job_ratio=$(awk -v f="$job_ms" -v c="$curl_ms" 'BEGIN{printf "%.2f", f/c}')
job_verdict=$(awk -v r="$job_ratio" 'BEGIN{print (r <= 1.25) ? "met" : "missed"}')

# ------------------------------------------------------------------ 2. coalescing
port=$(start_fixture)
upstream="http://127.0.0.1:$port"
server_port=$(free_port)
"$bin/jobserver" serve --host 127.0.0.1 --port "$server_port" --db "$tmp/db/jobs.sqlite" \
  --max-nodes $(( (N > CACHE_N ? N : CACHE_N) + 10 )) --max-request-bytes 16MiB --cache-bytes 1MiB 2>"$tmp/server.log" &
pids+=("$!")
base="http://127.0.0.1:$server_port"
wait_for "$base/healthz"

# one_job COALESCE KEY: a list of N fetches of one slow URL; prints "ms requests".
one_job() {
  python3 - "$N" "$upstream/count/$2?delay_ms=$DELAY_MS" "$1" >"$tmp/job.json" <<'PY'
import json, sys
n, url, coalesce = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "true"
print(json.dumps({"graph": {"type": "list", "children": [{"type": "fetch", "url": url, "coalesce": coalesce}] * n}}))
PY
  local start id state
  start=$(date +%s%N)
  id=$(curl -sS -H 'Content-Type: application/json' --data-binary @"$tmp/job.json" "$base/v1/jobs" | jq -r .id)
  for _ in $(seq 1 60); do
    state=$(curl -sS "$base/v1/jobs/$id?wait=10" | jq -r .state)
    [ "$state" = succeeded ] && break
    [ "$state" = failed ] || [ "$state" = cancelled ] && { echo "job $id $state" >&2; exit 1; }
  done
  [ "$state" = succeeded ] || { echo "job $id did not finish" >&2; exit 1; }
  echo "$(ms_since "$start") $(curl -sS "$upstream/stats" | jq --arg k "$2" '.counters[$k]')"
}

co_times=(); co_requests=(); plain_times=(); plain_requests=()
for run in $(seq 1 "$RUNS"); do
  read -r ms requests < <(one_job true "co$run")
  co_times+=("$ms"); co_requests+=("$requests")
  read -r ms requests < <(one_job false "plain$run")
  plain_times+=("$ms"); plain_requests+=("$requests")
  echo "coalesce run $run: coalesced ${co_times[-1]} ms / ${co_requests[-1]} requests," \
       "uncoalesced ${plain_times[-1]} ms / ${plain_requests[-1]} requests" >&2
done

# ------------------------------------------------------------------ 3. cache bound
metric() { curl -sS "$base/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
python3 - "$CACHE_N" "$upstream" >"$tmp/cache.json" <<'PY'
import json, sys
n, up = int(sys.argv[1]), sys.argv[2]
kids = [{"type": "fetch", "url": f"{up}/cache/d{i}?cc=max-age=600&size=1000", "cache": "use"} for i in range(n)]
print(json.dumps({"graph": {"type": "list", "children": kids}}))
PY
start=$(date +%s%N)
cache_id=$(curl -sS -H 'Content-Type: application/json' --data-binary @"$tmp/cache.json" "$base/v1/jobs" | jq -r .id)
max_bytes=0
for _ in $(seq 1 6000); do
  bytes=$(metric jobserver_cache_bytes)
  [ "${bytes%.*}" -gt "$max_bytes" ] && max_bytes=${bytes%.*}
  state=$(curl -sS "$base/v1/jobs/$cache_id" | jq -r .state)
  [ "$state" = running ] || [ "$state" = pending ] || break
  sleep 0.05
done
cache_ms=$(ms_since "$start")
[ "$state" = succeeded ] || { echo "the cache job ended $state" >&2; exit 1; }
cache_entries=$(metric jobserver_cache_entries)
cache_final=$(metric jobserver_cache_bytes)
echo "cache: $CACHE_N responses in $cache_ms ms, at most $max_bytes bytes, $cache_entries entries left" >&2

# ------------------------------------------------------------------ 4. host rate
rate_port=$(free_port)
"$bin/jobserver" serve --host 127.0.0.1 --port "$rate_port" --db "$tmp/db2/jobs.sqlite" \
  --host-rate 127.0.0.1=20/s 2>>"$tmp/server.log" &
pids+=("$!")
wait_for "http://127.0.0.1:$rate_port/healthz"
curl -sS -X POST "$upstream/stats/reset" >/dev/null
per_job=$(( (RATE_N + 9) / 10 ))
start=$(date +%s%N)
rate_ids=()
for j in $(seq 0 9); do
  body=$(python3 -c "import json,sys; print(json.dumps({'graph': {'type': 'list', 'children': [{'type': 'fetch', 'url': '$upstream/rate/j$j-%d' % k} for k in range($per_job)]}}))")
  rate_ids+=("$(curl -sS -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$rate_port/v1/jobs" | jq -r .id)")
done
for id in "${rate_ids[@]}"; do
  for _ in $(seq 1 20); do
    [ "$(curl -sS "http://127.0.0.1:$rate_port/v1/jobs/$id?wait=10" | jq -r .state)" = succeeded ] && break
  done
done
rate_ms=$(ms_since "$start")
rate_max=$(curl -sS "$upstream/stats" | python3 -c '
import json, sys
a = sorted(t for v in json.load(sys.stdin)["arrivals"].values() for t in v)
print(max((sum(1 for u in a[i:] if u < t + 1.0) for i, t in enumerate(a)), default=0), len(a))')
read -r rate_window rate_seen <<<"$rate_max"
echo "rate: $rate_seen fetches in $rate_ms ms, at most $rate_window in any 1 s" >&2

cat <<MD
## Transfer layer: HTTPS fan-out and coalescing

Every jobserver here runs at the default log level (\`info\`, its log to a file), with the flags named below.

**$N HTTPS fetches, $CONCURRENCY at a time**, of \`/json?i=1…$N\` from the TLS fixture
(\`Tests/Fixtures/upstream.py --tls-cert\`, HTTP/1.1 by ALPN, a P-256 certificate from a CA made by
\`make-tls.sh\`). Wall time of the whole process, $RUNS runs each, curl then FetchBench then one jobserver job
($CONFIG, \`--ca-file ca.pem --max-per-host $CONCURRENCY\`): a \`list\` of the $N fetches, from sending the \`POST\`
to its settled answer (\`?wait=60\`), so the durable submission and every state change are in it.

| client | wall ms (median) | min–max |
|---|---|---|
| \`curl --parallel --parallel-max $CONCURRENCY --cacert ca.pem\` (reference) | $curl_ms | $(printf '%s\n' "${curl_times[@]}" | range) |
| Fetcher (\`FETCHBENCH_CA_FILE=ca.pem FetchBench\`) | $fetch_ms | $(printf '%s\n' "${fetch_times[@]}" | range) |
| one jobserver job of the $N fetches | $job_ms | $(printf '%s\n' "${job_times[@]}" | range) |

Ratio job / curl: **$job_ratio** (target ≤ 1.25: $job_verdict); Fetcher alone / curl: $ratio ($verdict). The Python fixture (a thread per
connection) serves both sides the same way.

**$N identical GETs in one job** (a \`list\` of $N fetches of \`/count/K?delay_ms=$DELAY_MS\`) through
jobserver ($CONFIG, default \`--max-per-host 16\`), from submit to settled:

| fetches | requests upstream (median, min–max) | wall ms (median) | min–max |
|---|---|---|---|
| \`"coalesce": true\` | $(printf '%s\n' "${co_requests[@]}" | median), $(printf '%s\n' "${co_requests[@]}" | range) | $(printf '%s\n' "${co_times[@]}" | median) | $(printf '%s\n' "${co_times[@]}" | range) |
| without | $(printf '%s\n' "${plain_requests[@]}" | median), $(printf '%s\n' "${plain_requests[@]}" | range) | $(printf '%s\n' "${plain_times[@]}" | median) | $(printf '%s\n' "${plain_times[@]}" | range) |

**The cache's bound**: one job of $CACHE_N \`cache: "use"\` fetches of distinct ~1 KB responses
(\`max-age=600\`) with \`--cache-bytes 1MiB\` (1048576): the largest \`jobserver_cache_bytes\` seen,
sampled every 50 ms while they were stored, was **$max_bytes**; $cache_entries responses
($cache_final bytes) were left, the least recently used evicted. The job took $cache_ms ms.

**\`--host-rate 127.0.0.1=20/s\`**: $rate_seen fetches across 10 jobs took $rate_ms ms; the upstream saw
at most **$rate_window** requests in any 1 s.
MD
