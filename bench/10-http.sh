#!/usr/bin/env bash
# HTTP server throughput: HTTPBenchServer vs nginx serving the same 300-byte JSON, measured with wrk
# in the same run. Prints a markdown section on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

DURATION=${BENCH_DURATION:-10s}
THREADS=2
CONNECTIONS=64

swift build -c release --product HTTPBenchServer >&2
BIN=$(swift build -c release --show-bin-path)/HTTPBenchServer

tmp=$(mktemp -d)
nginx_pid=""
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
    [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null && wait "$nginx_pid" 2>/dev/null || true
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# The same 300 bytes the bench server sends.
mkdir -p "$tmp/www/bench"
python3 - "$tmp/www/bench/json" <<'PY'
import sys
head = '{"id":"01JEXAMPLE7K3M2Q9R8T6V5W4X","state":"succeeded","progress":{"total":3,"done":3,"percent":100.0},"padding":"'
tail = '"}'
open(sys.argv[1], "w").write(head + "x" * (300 - len(head) - len(tail)) + tail)
PY
chmod 755 "$tmp/www/bench"
chmod 644 "$tmp/www/bench/json"
start_nginx "$tmp/www"
wait_for "http://127.0.0.1:$nginx_port/bench/json"

server_port=$(free_port)
"$BIN" "$server_port" >&2 &
server_pid=$!
wait_for "http://127.0.0.1:$server_port/healthz"

nginx_cmd="wrk -t$THREADS -c$CONNECTIONS -d$DURATION http://127.0.0.1:$nginx_port/bench/json"
server_cmd="wrk -t$THREADS -c$CONNECTIONS -d$DURATION http://127.0.0.1:$server_port/bench/json"

echo "running: $nginx_cmd" >&2
nginx_out=$($nginx_cmd)
echo "$nginx_out" >&2
echo "running: $server_cmd" >&2
server_out=$($server_cmd)
echo "$server_out" >&2

nginx_rps=$(echo "$nginx_out" | rps)
server_rps=$(echo "$server_out" | rps)
ratio=$(python3 -c "print(f'{float(\"$server_rps\") / float(\"$nginx_rps\"):.2f}')")

kill -TERM "$server_pid"
wait "$server_pid" && server_exit=0 || server_exit=$?
server_pid=""

cat <<MD
## HTTP server: requests/s against nginx

A fixed 300-byte JSON route, keep-alive, wrk with $THREADS threads and $CONNECTIONS connections for $DURATION,
nginx ($(nginx -v 2>&1 | sed 's/.*nginx\///'), \`worker_processes auto\`, \`access_log off\`, static file) and
\`HTTPBenchServer\` (HTTPServer, one event loop per core) measured one after the other in the same run.
Target: at least 0.5× nginx.

| server | requests/s | ratio to nginx |
|---|---:|---:|
| nginx | $nginx_rps | 1.00 |
| HTTPBenchServer | $server_rps | $ratio |

HTTPBenchServer exited with status $server_exit after SIGTERM.

Commands:

\`\`\`
nginx -p \$TMP -c \$TMP/nginx.conf
$nginx_cmd
${BIN#"$PWD"/} $server_port
$server_cmd
\`\`\`
MD
