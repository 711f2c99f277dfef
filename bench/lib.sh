# Shared helpers for the bench/NN-*.sh scripts: sourced, not run.
# Each script sets `tmp` (a temp dir) before calling start_nginx, or calls
# bench_setup, which makes it.

# bench_setup: a temp dir in $tmp, and a trap that kills every process whose
# PID is in $pids and removes $tmp, whatever way the script ends.
bench_setup() {
    tmp=$(mktemp -d)
    pids=()
    trap _bench_cleanup EXIT INT TERM
}

_bench_cleanup() {
    # Children first, with the parent stopped: nginx's workers outlive a master killed with -9, and a running
    # master starts a new worker for each one killed.
    for p in "${pids[@]}"; do
        kill -STOP "$p" 2>/dev/null || true
        pkill -9 -P "$p" 2>/dev/null || true
        kill -9 "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_for URL: until it answers 2xx, at most 10 s.
wait_for() {
    for _ in $(seq 1 200); do
        curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "not answering: $1" >&2
    return 1
}

# wrk's "Requests/sec:" line, as a plain number.
rps() { awk '/^Requests\/sec:/ {print $2}'; }

# start_nginx ROOT [ACCESS_LOG]: serves ROOT on a free loopback port in the background;
# sets nginx_port and nginx_pid. Files under ROOT must be world-readable
# (nginx's workers drop root's privileges). Without ACCESS_LOG nginx keeps no access log (an upstream fixture);
# with a path, it writes one there in its default format, a line per request, as nginx does out of the box.
start_nginx() {
    local root=$1 access_log="access_log off;"
    [ -n "${2:-}" ] && access_log="access_log $2;"
    mkdir -p "$tmp/logs" "$tmp/client_body" "$tmp/proxy" "$tmp/fastcgi" "$tmp/uwsgi" "$tmp/scgi"
    chmod 755 "$tmp" "$root"
    nginx_port=$(free_port)
    cat >"$tmp/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/logs/error.log warn;
events { worker_connections 4096; }
http {
    $access_log
    keepalive_requests 100000;
    keepalive_timeout 60s;
    client_body_temp_path $tmp/client_body;
    proxy_temp_path $tmp/proxy;
    fastcgi_temp_path $tmp/fastcgi;
    uwsgi_temp_path $tmp/uwsgi;
    scgi_temp_path $tmp/scgi;
    types { application/json json; }
    default_type application/json;
    server {
        listen 127.0.0.1:$nginx_port;
        root $root;
    }
}
CONF
    nginx -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/logs/error.log" >&2 &
    nginx_pid=$!
    # Stopped by bench_setup's trap with the rest, whose wait would otherwise wait for it forever.
    pids+=("$nginx_pid")
}

nginx_version() { nginx -v 2>&1 | sed 's|.*/||'; }

# serve_json_file BYTES: nginx (start_nginx) serving $tmp/www/data.json, a JSON object of BYTES bytes, once it answers.
serve_json_file() {
    mkdir -p "$tmp/www"
    python3 -c 'import sys; open(sys.argv[1], "w").write("{\"data\":\"" + "x" * (int(sys.argv[2]) - 11) + "\"}")' \
      "$tmp/www/data.json" "$1"
    chmod 644 "$tmp/www/data.json"
    start_nginx "$tmp/www"
    wait_for "http://127.0.0.1:$nginx_port/data.json" || { tail -5 "$tmp/logs/error.log" >&2; exit 1; }
}

# list_job N: the body of a job of one `list` of N fetches of serve_json_file's file, each URL its own (`?i=1…N`).
list_job() {
    python3 - "$1" "$nginx_port" <<'PY'
import json, sys
n, port = int(sys.argv[1]), sys.argv[2]
print(json.dumps({"graph": {"type": "list", "children": [
    {"type": "fetch", "url": f"http://127.0.0.1:{port}/data.json?i={i}"} for i in range(1, n + 1)]}}))
PY
}

# rss_kib PID: resident set size in KiB.
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# start_upstream: the fixture upstream (Tests/Fixtures/upstream.py) on a free loopback port, stopped on exit;
# sets up_port.
start_upstream() {
    python3 Tests/Fixtures/upstream.py --port 0 >"$tmp/upstream.out" 2>/dev/null &
    pids+=($!)
    for _ in $(seq 1 100); do [ -s "$tmp/upstream.out" ] && break; sleep 0.05; done
    up_port=$(awk '/^listening/ {print $2}' "$tmp/upstream.out")
}

# start_postgres: a throwaway PostgreSQL cluster (scripts/pg-cluster.sh), stopped on exit; sets pgdir and url.
# After bench_setup, whose cleanup it keeps.
start_postgres() {
    # Under /tmp itself: as root the cluster runs as `nobody`, who cannot enter $tmp.
    pgdir=$(mktemp -d /tmp/jobserver-pg-bench.XXXXXX)
    trap 'bash scripts/pg-cluster.sh stop "$pgdir" >/dev/null 2>&1 || true; _bench_cleanup' EXIT INT TERM
    url=$(bash scripts/pg-cluster.sh start "$pgdir" | tail -1)
    echo "PostgreSQL at $url" >&2
}

# median / range: of the numbers on stdin, one a line: the median (one decimal), and "min–max".
# require TOOL…: stops the bench unless every tool is installed.
require() {
  local tool
  for tool in "$@"; do command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }; done
}

# build_jobserver CONFIG: builds the jobserver product (release, or debug for a quick check); sets `bin` to its folder.
build_jobserver() {
  echo "building jobserver ($1)" >&2
  swift build -c "$1" --product jobserver >&2
  bin=$(swift build -c "$1" --show-bin-path)
}

median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f", m}'; }
range() { sort -n | awk 'NR==1{lo=$1} {hi=$1} END {printf "%s–%s", lo, hi}'; }
# spread VALUES…: "median (min–max)".
spread() { echo "$(printf '%s\n' "$@" | median) ($(printf '%s\n' "$@" | range))"; }

# kib FIELD PID: a field of /proc/PID/status (VmRSS, VmHWM), in KiB; mib KIB: the same in MiB, rounded.
kib() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$2/status"; }
mib() { awk -v k="$1" 'BEGIN{printf "%.0f", k/1024}'; }

# ms_since NS: milliseconds (one decimal) since NS, a `date +%s%N`.
ms_since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b-a)/1e6}'; }
