#!/usr/bin/env bash
# A paginated fetch (API.md §7.2) against its reference in the same run: one job
# walking a $PAGES-page `Link` pagination served by nginx, against one
# `curl` process fetching the same $PAGES URLs one after another (one
# connection, kept alive). $RUNS runs each, alternating; median and min–max.
# Prints a markdown section on stdout; progress goes to stderr.
# PAGES, PER (items per page), RUNS and JOBSERVER_BIN (skips the release build) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

PAGES=${PAGES:-100}
PER=${PER:-20}
RUNS=${RUNS:-5}

if [ -n "${JOBSERVER_BIN:-}" ]; then
    BIN=$JOBSERVER_BIN
    build="$BIN"
else
    swift build -c release --product jobserver >&2
    BIN=$(swift build -c release --show-bin-path)/jobserver
    build="release build"
fi

bench_setup

# The pages: static files served by nginx, each with the Link header of a paged API.
mkdir -p "$tmp/www/p" "$tmp/logs" "$tmp/client_body" "$tmp/proxy" "$tmp/fastcgi" "$tmp/uwsgi" "$tmp/scgi"
chmod 755 "$tmp" "$tmp/www" "$tmp/www/p"
nginx_port=$(free_port)
up="http://127.0.0.1:$nginx_port"
locations=""
for k in $(seq 1 "$PAGES"); do
    python3 -c "import json,sys; k,n=int(sys.argv[1]),int(sys.argv[2]); print(json.dumps([{'id': (k-1)*n+i+1, 'name': 'item %d' % ((k-1)*n+i+1)} for i in range(n)]))" \
        "$k" "$PER" >"$tmp/www/p/$k.json"
    chmod 644 "$tmp/www/p/$k.json"
    if [ "$k" -lt "$PAGES" ]; then
        locations+="        location = /p/$k.json { add_header Link '<$up/p/$((k + 1)).json>; rel=\"next\", <$up/p/$PAGES.json>; rel=\"last\"'; }
"
    fi
done
cat >"$tmp/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 100000;
    client_body_temp_path $tmp/client_body;
    proxy_temp_path $tmp/proxy;
    fastcgi_temp_path $tmp/fastcgi;
    uwsgi_temp_path $tmp/uwsgi;
    scgi_temp_path $tmp/scgi;
    types { application/json json; }
    default_type application/json;
    server {
        listen 127.0.0.1:$nginx_port;
        root $tmp/www;
$locations    }
}
CONF
nginx -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/logs/error.log" >&2 &
pids+=($!)
wait_for "$up/p/1.json"

server_port=$(free_port)
"$BIN" serve --host 127.0.0.1 --port "$server_port" --db "$tmp/jobs.sqlite" 2>>"$tmp/server.log" &
pids+=($!)
base="http://127.0.0.1:$server_port"
wait_for "$base/healthz"

ms() { date +%s%N; }
walk_ms=()
after_ms=()
node_ms=()
curl_ms=()
for run in $(seq 1 "$RUNS"); do
    first="$up/p/1.json"
    urls=()
    for k in $(seq 1 "$PAGES"); do urls+=("$up/p/$k.json"); done

    body="{\"graph\": {\"id\": \"walk\", \"type\": \"fetch\", \"url\": \"$first\",
      \"paginate\": {\"next\": \"link\", \"items\": \"/body\", \"max_pages\": 1000}}}"
    start=$(ms)
    id=$(curl -fsS -H 'Content-Type: application/json' --data-binary "$body" "$base/v1/jobs" | jq -r .id)
    created=$(ms)
    job=$(curl -fsS "$base/v1/jobs/$id?wait=60")
    end=$(ms)
    after_ms+=("$(( (end - created) / 1000 ))")
    [ "$(jq -r .state <<<"$job")" = succeeded ] || { echo "walk failed: $job" >&2; exit 1; }
    [ "$(jq '.result.items | length' <<<"$job")" = $((PAGES * PER)) ] || { echo "walk lost items" >&2; exit 1; }
    walk_ms+=("$(( (end - start) / 1000 ))")
    node_ms+=("$(curl -fsS "$base/v1/jobs/$id/nodes/walk" | jq '.elapsed_ms * 1000')")

    start=$(ms)
    curl -fsS "${urls[@]}" >/dev/null
    end=$(ms)
    curl_ms+=("$(( (end - start) / 1000 ))")
    echo "run $run: submit to answer ${walk_ms[-1]} us, 201 to answer ${after_ms[-1]} us (node ${node_ms[-1]} us), curl ${curl_ms[-1]} us" >&2
done

# stats LIST…: "median (min–max)" in ms, one decimal.
stats() { python3 -c 'import statistics,sys; v=[int(x)/1000 for x in sys.argv[1:]]; print(f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})")' "$@"; }
median() { python3 -c 'import statistics,sys; print(statistics.median(int(x) for x in sys.argv[1:]))' "$@"; }
ratio=$(python3 -c "print(f'{$(median "${after_ms[@]}") / $(median "${curl_ms[@]}"):.2f}')")
whole_ratio=$(python3 -c "print(f'{$(median "${walk_ms[@]}") / $(median "${curl_ms[@]}"):.2f}')")
node_ratio=$(python3 -c "print(f'{$(median "${node_ms[@]}") / $(median "${curl_ms[@]}"):.2f}')")
verdict() { python3 -c "print('met' if $1 else 'missed')"; }
cat <<MD
## Paginated fetch

Every jobserver here runs at the default log level (\`info\`, its log to a file), with the flags named below.

One job whose fetch walks a $PAGES-page \`Link\` pagination (\`"paginate": {"next": "link", "items": "/body"}\`,
$PER items a page, static files served by nginx $(nginx_version) with a \`Link\` header each), against one
\`curl $(curl --version | head -1 | cut -d' ' -f2)\` process fetching the same $PAGES URLs one after another on one kept-alive connection.
$RUNS runs each, alternating; median (min–max) in ms; jobserver: $build.

| | ms |
|---|---:|
| \`curl\` with the $PAGES URLs | $(stats "${curl_ms[@]}") |
| jobserver, the \`201\` to the answer of \`GET /v1/jobs/{id}?wait=60\` (the job settled) | $(stats "${after_ms[@]}") |
| jobserver, the node's \`elapsed_ms\` (first page started to last page done) | $(stats "${node_ms[@]}") |
| jobserver, \`POST /v1/jobs\` sent to the settled answer (adds the durable submit, see the engine section) | $(stats "${walk_ms[@]}") |

Ratio, \`201\` to settled answer: **$ratio** (target ≤ 1.2: $(verdict "$ratio <= 1.2")); the node alone: $node_ratio;
with the submission: $whole_ratio.
MD
