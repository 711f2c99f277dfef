#!/usr/bin/env bash
# HTTP server throughput: HTTPBenchServer vs nginx serving the same 300-byte JSON, measured with wrk
# in the same run. Prints a markdown section on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

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

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_for() {
    for _ in $(seq 1 100); do
        curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "not answering: $1" >&2
    return 1
}

# wrk's "Requests/sec:" line, as a plain number.
rps() { awk '/^Requests\/sec:/ {print $2}'; }

# The same 300 bytes the bench server sends.
mkdir -p "$tmp/www/bench" "$tmp/logs" "$tmp/client_body" "$tmp/proxy" "$tmp/fastcgi" "$tmp/uwsgi" "$tmp/scgi"
python3 - "$tmp/www/bench/json" <<'PY'
import sys
head = '{"id":"01JEXAMPLE7K3M2Q9R8T6V5W4X","state":"succeeded","progress":{"total":3,"done":3,"percent":100.0},"padding":"'
tail = '"}'
open(sys.argv[1], "w").write(head + "x" * (300 - len(head) - len(tail)) + tail)
PY
# mktemp -d is 0700; nginx workers drop root privileges and must be able to read the file.
chmod 755 "$tmp" "$tmp/www" "$tmp/www/bench"
chmod 644 "$tmp/www/bench/json"

nginx_port=$(free_port)
cat >"$tmp/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    default_type application/json;
    client_body_temp_path $tmp/client_body;
    proxy_temp_path $tmp/proxy;
    fastcgi_temp_path $tmp/fastcgi;
    uwsgi_temp_path $tmp/uwsgi;
    scgi_temp_path $tmp/scgi;
    keepalive_requests 100000;
    server {
        listen 127.0.0.1:$nginx_port;
        root $tmp/www;
        location = /bench/json { default_type application/json; }
    }
}
CONF
nginx -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/logs/error.log" >&2 &
nginx_pid=$!
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
