#!/usr/bin/env bash
# 1,000 fetches of a 1 KiB JSON file from nginx on loopback: the Fetcher
# (bench/FetchBench, 64 at a time) against `curl --parallel --parallel-max 64`
# over the same URLs, in the same run. Prints a markdown section on stdout.
# Target: Fetcher wall time <= 1.25x curl's. Each side runs RUNS times (default 5);
# the median is reported.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-1000}
CONCURRENCY=${CONCURRENCY:-64}
RUNS=${RUNS:-5}

command -v nginx >/dev/null || { echo "nginx is required (apt-get install nginx-light)" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl is required" >&2; exit 1; }

tmp=$(mktemp -d)
nginx_pid=
cleanup() {
  if [ -n "$nginx_pid" ]; then kill "$nginx_pid" 2>/dev/null || true; wait "$nginx_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

echo "building FetchBench (release)" >&2
swift build -c release --product FetchBench >&2
bench_bin=$(swift build -c release --show-bin-path)/FetchBench

mkdir -p "$tmp/www"
python3 - "$tmp/www/data.json" <<'PY'
import sys
# A JSON object of exactly 1024 bytes.
body = '{"data":"' + "x" * (1024 - 11) + '"}'
assert len(body) == 1024
open(sys.argv[1], "w").write(body)
PY
chmod 644 "$tmp/www/data.json"
start_nginx "$tmp/www"
port=$nginx_port
wait_for "http://127.0.0.1:$port/data.json" || { tail -5 "$tmp/logs/error.log" >&2; exit 1; }

: >"$tmp/urls.txt"
: >"$tmp/curl.conf"
for i in $(seq 1 "$N"); do
  url="http://127.0.0.1:$port/data.json?i=$i"
  echo "$url" >>"$tmp/urls.txt"
  printf 'url = "%s"\noutput = "/dev/null"\n' "$url" >>"$tmp/curl.conf"
done


curl_cmd=(curl --parallel --parallel-max "$CONCURRENCY" -s --no-progress-meter -K "$tmp/curl.conf")
fetch_cmd=("$bench_bin" "$tmp/urls.txt" "$CONCURRENCY")
curl_times=()
fetch_times=()
inner_times=()
for run in $(seq 1 "$RUNS"); do
  start=$(date +%s%N)
  "${curl_cmd[@]}"
  end=$(date +%s%N)
  curl_times+=("$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", (b-a)/1e6}')")
  start=$(date +%s%N)
  inner=$("${fetch_cmd[@]}")
  end=$(date +%s%N)
  fetch_times+=("$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", (b-a)/1e6}')")
  inner_times+=("$inner")
  echo "run $run: curl ${curl_times[-1]} ms, Fetcher ${fetch_times[-1]} ms (process) / $inner ms (transfers)" >&2
done
curl_ms=$(printf '%s\n' "${curl_times[@]}" | median)
fetch_ms=$(printf '%s\n' "${fetch_times[@]}" | median)
inner_ms=$(printf '%s\n' "${inner_times[@]}" | median)
ratio=$(awk -v f="$fetch_ms" -v c="$curl_ms" 'BEGIN{printf "%.2f", f/c}')
verdict=$(awk -v r="$ratio" 'BEGIN{print (r <= 1.25) ? "met" : "missed"}')

cat <<MD
## Fetcher: $N fetches of a 1 KiB JSON file, $CONCURRENCY at a time

nginx $(nginx_version) on 127.0.0.1 (\`worker_processes auto\`, \`access_log off\`,
\`keepalive_requests 100000\`); both clients fetch the same $N URLs
(\`/data.json?i=1…$N\`). Wall time of the whole process, median of $RUNS runs, each run
curl then FetchBench.

| client | wall ms (median) | runs (ms) |
|---|---|---|
| \`curl --parallel --parallel-max $CONCURRENCY\` (reference) | $curl_ms | ${curl_times[*]} |
| Fetcher (\`FetchBench\`, release) | $fetch_ms | ${fetch_times[*]} |

Ratio Fetcher / curl: **$ratio** (target ≤ 1.25: $verdict). Of the Fetcher's
process time, the transfers themselves (first \`start\` to last completion, as
FetchBench prints it) took $inner_ms ms (median; runs: ${inner_times[*]}); the rest is
process start-up and exit.

Commands:

\`\`\`
curl --parallel --parallel-max $CONCURRENCY -s -K urls.conf   # url = "…" / output = "/dev/null" per URL
.build/release/FetchBench urls.txt $CONCURRENCY            # one URL per line
\`\`\`
MD
