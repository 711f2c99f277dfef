#!/usr/bin/env bash
# The transfer layer (API.md §9): HTTPS through a CA made here, coalescing of
# identical fetches across 100 jobs (and cancelling them), the HTTP cache, and
# --host-rate as the upstream observes it; the 422s and the refused flags.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
TLS="$TMP/tls"
bash Tests/Fixtures/make-tls.sh "$TLS" || fail "make-tls.sh failed"

# start_tls_upstream CERT KEY: the fixture over HTTPS; sets TLS_PORT. Not in a command substitution: that subshell
# would record the fixture's pid where the EXIT trap never sees it, and leave the fixture running.
start_tls_upstream() {
  local out="$TMP/tls-upstream-$RANDOM.out" pid
  python3 "$UPSTREAM_SCRIPT" --port 0 --tls-cert "$1" --tls-key "$2" >"$out" 2>>"$TMP/upstream.err" &
  pid=$!
  STARTED_PIDS+=("$pid")
  await_listening "$out" "$pid"
  TLS_PORT="$LISTENING_PORT"
}
start_tls_upstream "$TLS/server.pem" "$TLS/server.key"
tls_port="$TLS_PORT"
start_tls_upstream "$TLS/wrong.pem" "$TLS/wrong.key"
wrong_port="$TLS_PORT"

# metric NAME: a sample's value from /metrics (0 when absent).
metric() {
  curl -sS --max-time 5 "$BASE/metrics" | awk -v n="$1" '$1 == n { print $2; found = 1 } END { if (!found) print 0 }'
}

# submit_many N BODY: submits N jobs with BODY, 10 at a time; their ids go to $TMP/ids.
submit_many() {
  seq "$1" | xargs -P 10 -I{} curl -sS --max-time 10 -H 'Content-Type: application/json' -d "$2" "$BASE/v1/jobs" \
    | jq -r .id >"$TMP/ids"
  [ "$(grep -c . "$TMP/ids")" = "$1" ] || fail "not all $1 jobs were created"
}

# wait_running IDS_FILE: long-polls every job of the file (10 at a time) until it runs; fails if one settles
# first, or does not run within 20 s.
wait_running() {
  python3 - "$BASE" "$1" <<'PY' || fail "not every job of $1 ran (above)"
import json, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
base, ids = sys.argv[1], open(sys.argv[2]).read().split()
deadline = time.monotonic() + 20
def run(id):
    url = base + "/v1/jobs/" + id
    for _ in range(1000):
        with urllib.request.urlopen(url, timeout=70) as answer:
            job = json.load(answer)
        left = deadline - time.monotonic()
        if job["state"] == "running":
            return None
        if job["state"] != "pending" or left <= 0:
            break
        url = base + "/v1/jobs/%s?wait=%d&since=%d" % (id, max(1, min(60, int(left))), job["version"])
    return "job %s is %s" % (id, job["state"])
with ThreadPoolExecutor(10) as pool:
    problems = [p for p in pool.map(run, ids) if p]
if problems:
    sys.exit("\n".join(problems[:10]))
PY
}

cancel_ids() {
  xargs -P 10 -I{} curl -sS -o /dev/null --max-time 10 -X POST "$BASE/v1/jobs/{}/cancel" <"$1"
}

start_server --ca-file "$TLS/ca.pem" --cache-bytes 16KiB

# ------------------------------------------------------------------ TLS
step "TLS: https through --ca-file, by address and by name; the result says which protocol"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"https://127.0.0.1:$tls_port/json\"}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result.body.ok true
expect_jq .result.http_version 1.1
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"https://localhost:$tls_port/text\"}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded

step "TLS: a certificate for another name fails with kind tls"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"https://127.0.0.1:$wrong_port/json\",\"retries\":2}}"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind tls

step "TLS: HTTP/2 when the upstream offers it (nginx in front of the same certificate)"
if command -v nginx >/dev/null; then
  h2_port="$(free_port)"
  mkdir -p "$TMP/nginx"
  cat >"$TMP/nginx/nginx.conf" <<EOF
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log;
events {}
http {
  access_log off;
  client_body_temp_path $TMP/nginx; proxy_temp_path $TMP/nginx; fastcgi_temp_path $TMP/nginx;
  uwsgi_temp_path $TMP/nginx; scgi_temp_path $TMP/nginx;
  server {
    listen 127.0.0.1:$h2_port ssl http2;
    ssl_certificate $TLS/server.pem;
    ssl_certificate_key $TLS/server.key;
    location / { default_type application/json; return 200 '{"h2":true}'; }
  }
}
EOF
  nginx -e "$TMP/nginx/error.log" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;' 2>>"$TMP/nginx/error.log" &
  nginx_pid=$!
  STARTED_PIDS+=("$nginx_pid")
  # nginx writes its pid file once it listens.
  next_line "$TMP/nginx/nginx.pid" 0 10 "$nginx_pid" '^[0-9]+$' >/dev/null \
    || fail "nginx did not start: $(tail -5 "$TMP/nginx/error.log")"
  submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"https://127.0.0.1:$h2_port/\"}}"
  wait_settled "$JOB_ID" 20
  expect_jq .state succeeded
  expect_jq .result.http_version 2
  expect_jq .result.body.h2 true
else
  log "nginx is not installed: HTTP/2 not checked"
fi

# ------------------------------------------------------------------ coalesce
step "coalesce: 100 jobs asking for the same slow URL make one request; every job gets the body"
ustats_reset
submit_many 100 "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/count/slow?delay_ms=4000\",\"coalesce\":true}}"
cp "$TMP/ids" "$TMP/slow-ids"
wait_settled "$(tail -1 "$TMP/slow-ids")" 30
# Every job, read 10 at a time with a long-poll each, checked in one pass.
xargs -P 10 -I{} curl -sS --max-time 40 "$BASE/v1/jobs/{}?wait=30" <"$TMP/slow-ids" >"$TMP/slow-jobs"
summary="$(jq -sc '{n: length, ok: map(select(.state == "succeeded" and .result.body.count == 1)) | length,
                    makers: map(select(.result.coalesced == false)) | length}' "$TMP/slow-jobs")"
[ "$summary" = '{"n":100,"ok":100,"makers":1}' ] || fail "jobs: $summary (want 100 succeeded with the body, 1 maker)"
[ "$(upstream_count slow)" = 1 ] || fail "the upstream saw $(upstream_count slow) requests, not 1"
[ "$(metric jobserver_coalesced_fetches_total)" = 99 ] || fail "coalesced fetches: $(metric jobserver_coalesced_fetches_total)"

step "coalesce: cancelling 99 of 100 sharers leaves the last one's transfer running"
ustats_reset
submit_many 100 "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/count/keep?delay_ms=4000\",\"coalesce\":true}}"
# A fetch joins the transfer in flight as it starts running: once every job runs, all 99 have joined.
wait_running "$TMP/ids"
[ "$(metric jobserver_coalesced_fetches_total)" -ge 198 ] || fail "coalesced fetches: $(metric jobserver_coalesced_fetches_total)"
head -99 "$TMP/ids" >"$TMP/cancel-ids"
last="$(tail -1 "$TMP/ids")"
cancel_ids "$TMP/cancel-ids"
fetch_job "$last"
expect_jq .state running
wait_settled "$last" 20
expect_jq .state succeeded
expect_jq .result.body.count 1
[ "$(ustats '.disconnects | length')" = 0 ] || fail "the transfer was aborted: $(ustats .disconnects)"
[ "$(upstream_count keep)" = 1 ] || fail "the upstream saw $(upstream_count keep) requests"
wait_settled "$(head -1 "$TMP/cancel-ids")" 10
expect_jq .state cancelled

step "coalesce: cancelling every sharer aborts the transfer (the upstream sees the disconnect)"
ustats_reset
submit_many 100 "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\",\"coalesce\":true}}"
wait_running "$TMP/ids"
[ "$(metric jobserver_coalesced_fetches_total)" -ge 297 ] || fail "coalesced fetches: $(metric jobserver_coalesced_fetches_total)"
cancel_ids "$TMP/ids"
wait_upstream '.disconnects | length == 1' 10
[ "$(ustats .requests)" = 1 ] || fail "the upstream saw $(ustats .requests) requests"

# ------------------------------------------------------------------ cache
# cache_fetch PATH: one cache:"use" job for $UPSTREAM$PATH, settled; its result in RESP.
cache_fetch() {
  submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM$1\",\"cache\":\"use\"}}"
  wait_settled "$JOB_ID" 20
  expect_jq .state succeeded
}

step "cache: max-age=2 is served without a request for 2 s, then revalidated with If-None-Match and reused on 304"
ustats_reset
started="$(millis)"
cache_fetch "/cache/ttl?cc=max-age=2"
expect_jq .result.cache miss
cache_fetch "/cache/ttl?cc=max-age=2"
[ $(($(millis) - started)) -lt 1900 ] || log "slow machine: the hit came late, checked anyway"
expect_jq .result.cache hit
expect_jq .result.body.count 1
[ "$(upstream_count ttl)" = 1 ] || fail "a hit made a request"
# The max-age must run out: a time that must pass, not a wait for an event.
sleep "$(python3 -c "print(max(0, 2.3 - ($(millis) - $started) / 1000))")"
cache_fetch "/cache/ttl?cc=max-age=2"
expect_jq .result.cache revalidated
expect_jq .result.status 200
expect_jq .result.body.count 1
[ "$(ustats '.counters["ttl:304"] // 0')" = 1 ] || fail "no conditional request answered 304: $(ustats .counters)"

step "cache: no-store is never stored"
cache_fetch "/cache/nostore?cc=no-store"
expect_jq .result.cache miss
cache_fetch "/cache/nostore?cc=no-store"
expect_jq .result.cache miss
[ "$(upstream_count nostore)" = 2 ] || fail "no-store was served from the cache"

step "cache: never past --cache-bytes (16 KiB) after 80 distinct 1 KB responses"
for batch in 0 1 2 3 4 5 6 7; do
  children=""
  for k in 0 1 2 3 4 5 6 7 8 9; do
    children+="${children:+,}{\"type\":\"fetch\",\"url\":\"$UPSTREAM/cache/lru$batch$k?cc=max-age=60&size=1000\",\"cache\":\"use\"}"
  done
  submit "{\"graph\":{\"type\":\"list\",\"children\":[$children]}}"
  wait_settled "$JOB_ID" 20
  expect_jq .state succeeded
  bytes="$(metric jobserver_cache_bytes)"
  [ "$bytes" -le 16384 ] || fail "the cache holds $bytes bytes"
done
[ "$(metric jobserver_cache_entries)" -lt 80 ] || fail "nothing was evicted"
cache_fetch "/cache/lru79?cc=max-age=60&size=1000"
expect_jq .result.cache hit
cache_fetch "/cache/lru00?cc=max-age=60&size=1000"
expect_jq .result.cache miss
[ "$(metric 'jobserver_cache_lookups_total{outcome="hit"}')" -ge 2 ] || fail "hits are not counted"

# ------------------------------------------------------------------ 422
step "422: coalesce or cache where they cannot apply, bad values"
api POST /v1/jobs "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\",\"method\":\"POST\",\"coalesce\":true}}"
expect_api_error 422 invalid_graph
expect_jq .error.path /graph/coalesce
api POST /v1/jobs "{\"graph\":{\"type\":\"list\",\"children\":[{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\",\"method\":\"HEAD\",\"cache\":\"use\"}]}}"
expect_api_error 422 invalid_graph
expect_jq .error.path /graph/children/0/cache
api POST /v1/jobs "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\",\"cache\":\"always\"}}"
expect_api_error 422 invalid_graph
expect_jq .error.path /graph/cache

# ------------------------------------------------------------------ rate
step "--host-rate 127.0.0.1=20/s: 60 fetches across 10 jobs, never more than 20 in any second upstream"
start_server --host-rate 127.0.0.1=20/s
ustats_reset
started="$(millis)"
for j in 0 1 2 3 4 5 6 7 8 9; do
  children=""
  for k in 0 1 2 3 4 5; do children+="${children:+,}{\"type\":\"fetch\",\"url\":\"$UPSTREAM/rate/j$j-$k\"}"; done
  submit "{\"graph\":{\"type\":\"list\",\"children\":[$children]}}"
  echo "$JOB_ID" >>"$TMP/rate-ids"
done
while read -r id; do
  wait_settled "$id" 30
  expect_jq .state succeeded
done <"$TMP/rate-ids"
elapsed=$(($(millis) - started))
worst="$(ustats '[.arrivals[][]] | sort as $a | [range(20; $a | length) | $a[.] - $a[. - 20]] | min')"
log "60 fetches in ${elapsed} ms; the shortest span of 21 arrivals: ${worst} s"
[ "$(ustats '[.arrivals[][]] | length')" = 60 ] || fail "the upstream saw $(ustats '[.arrivals[][]] | length') fetches"
python3 -c "import sys; sys.exit(0 if $worst >= 1.0 else 1)" || fail "21 arrivals within $worst s"
[ "$elapsed" -ge 2900 ] || fail "60 starts at 20/s took only $elapsed ms"
awk -v w="$(metric jobserver_rate_limit_wait_seconds_total)" 'BEGIN { exit !(w > 0) }' || fail "no rate-limit wait in /metrics"

step "TLS: without --ca-file the test CA is unknown: kind tls"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"https://127.0.0.1:$tls_port/json\"}}"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind tls

# ------------------------------------------------------------------ flags
step "bad transfer flags are refused at start with the reason"
for args in "--host-rate api.local" "--host-rate api.local=0/s" "--ca-file $TMP/missing.pem" "--ca-file $TLS/server.key" \
            "--cache-bytes lots"; do
  # shellcheck disable=SC2086
  if out="$(timeout 10 "$JOBSERVER_BIN" serve --port 0 --db "$TMP/flags.sqlite" $args 2>&1)"; then fail "started with $args"; fi
  grep -q -- "${args%% *}" <<<"$out" || fail "the refusal of $args does not name the flag: $out"
done

log "ok"
