#!/usr/bin/env bash
# Every error of the API itself (API.md §3) with its status and code, the
# query rules of §5, the HTTP/1.1 rules of §5 — and the server still serves
# after all of it.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
start_server --max-request-bytes 65536 --max-nodes 50 --max-depth 8
main_pid="$SERVER_PID"
main_base="$BASE"
main_port="$SERVER_PORT"
main_log="$SERVER_LOG"
use_main() { BASE="$main_base"; SERVER_PORT="$main_port"; SERVER_LOG="$main_log"; AUTH_TOKEN=""; }

submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
done_id="$JOB_ID"
wait_settled "$done_id" 20
expect_jq .state succeeded

# ------------------------------------------------------------------ 400
step "400 malformed_json: a body that is not JSON"
for body in '{"graph":' 'not json' '{"graph":{"type":"fetch","url":"http://x/"}} trailing' $'\xff\xfe'; do
  api POST /v1/jobs "$body"
  expect_api_error 400 malformed_json
done

step "400 bad_request: query parameters out of range or malformed are never clamped"
for q in "/v1/jobs/$done_id?wait=61" "/v1/jobs/$done_id?wait=-1" "/v1/jobs/$done_id?wait=1.5" \
         "/v1/jobs/$done_id?wait=abc" "/v1/jobs/$done_id?wait=" \
         "/v1/jobs/$done_id?wait=1&since=abc" "/v1/jobs/$done_id?since=abc" "/v1/jobs/$done_id?wait=1&since=-1" \
         '/v1/jobs?limit=0' '/v1/jobs?limit=501' '/v1/jobs?limit=abc' '/v1/jobs?limit=-5' \
         '/v1/jobs?state=bogus' '/v1/jobs?state=RUNNING' \
         '/v1/jobs?cursor=garbage' '/v1/jobs?cursor=%21%21garbage%21%21' \
         "/v1/jobs/$done_id/nodes?include=bogus"; do
  api GET "$q"
  expect_api_error 400 bad_request
done

step "the limits themselves are accepted"
for q in "/v1/jobs/$done_id?wait=0" '/v1/jobs?limit=1' '/v1/jobs?limit=500' '/v1/jobs?state=pending' \
         "/v1/jobs/$done_id?wait=0&since=0" "/v1/jobs/$done_id/nodes?include=result"; do
  api GET "$q"
  expect_status 200
done

step "400 bad_request: an Idempotency-Key over 200 characters"
api POST /v1/jobs "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}" \
  -H "Idempotency-Key: $(printf 'k%.0s' {1..201})"
expect_api_error 400 bad_request

# ------------------------------------------------------------------ 404
step "404 not_found: unknown route, job, node"
for p in /nope /v1 /v1/job "/v1/jobs/$done_id/bogus" "/v1/jobs/$done_id/nodes/root/body/x"; do
  api GET "$p"
  expect_api_error 404 not_found
done
api GET /v1/jobs/01JEXAMPLE0000000000000000
expect_api_error 404 not_found
api POST /v1/jobs/01JEXAMPLE0000000000000000/cancel
expect_api_error 404 not_found
api DELETE /v1/jobs/01JEXAMPLE0000000000000000
expect_api_error 404 not_found
api GET "/v1/jobs/$done_id/nodes/no-such-node"
expect_api_error 404 not_found
api GET "/v1/jobs/$done_id/nodes/no-such-node/body"
expect_api_error 404 not_found
submit "{\"graph\":{\"type\":\"list\",\"children\":[{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}]}}"
list_id="$JOB_ID"
wait_settled "$list_id" 20
api GET "/v1/jobs/$list_id/nodes/root/body"
expect_api_error 404 not_found

# ------------------------------------------------------------------ 405
step "405 method_not_allowed with Allow"
api PUT /v1/jobs '{}'
expect_api_error 405 method_not_allowed
expect_header Allow 'GET'
expect_header Allow 'POST'
api PATCH "/v1/jobs/$done_id" '{}'
expect_api_error 405 method_not_allowed
expect_header Allow 'GET'
expect_header Allow 'DELETE'
api GET "/v1/jobs/$done_id/cancel"
expect_api_error 405 method_not_allowed
expect_header Allow 'POST'
api DELETE /healthz
expect_api_error 405 method_not_allowed
expect_header Allow 'GET'
api POST /metrics '{}'
expect_api_error 405 method_not_allowed

# ------------------------------------------------------------------ 409
step "409 conflict: cancel a succeeded job, delete a running one, reuse an Idempotency-Key"
api POST "/v1/jobs/$done_id/cancel"
expect_api_error 409 conflict
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"}}"
hang_id="$JOB_ID"
api DELETE "/v1/jobs/$hang_id"
expect_api_error 409 conflict
api POST "/v1/jobs/$hang_id/cancel"
expect_status 202
wait_settled "$hang_id" 10
key="errors-$(millis)"
api POST /v1/jobs "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}" -H "Idempotency-Key: $key"
expect_status 201
api POST /v1/jobs "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/text\"}}" -H "Idempotency-Key: $key"
expect_api_error 409 conflict

# ------------------------------------------------------------------ 413, 415
step "413 payload_too_large: a body over --max-request-bytes"
big="{\"name\":\"x\",\"metadata\":{\"pad\":\"$(head -c 100000 /dev/zero | tr '\0' a)\"},\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
printf '%s' "$big" >"$TMP/big.json"
api POST /v1/jobs "@$TMP/big.json"
expect_api_error 413 payload_too_large
api POST /v1/jobs "@$TMP/big.json" -H 'Expect:'
expect_status 413 000
if [ "$STATUS" = 000 ]; then
  log "the server closed the connection while the oversized body was still being sent (allowed)"
fi

step "415 unsupported_media_type: a body that is not application/json"
body="{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
api POST /v1/jobs "$body" -H 'Content-Type: text/plain'
expect_api_error 415 unsupported_media_type
api POST /v1/jobs "$body" -H 'Content-Type: application/x-www-form-urlencoded'
expect_api_error 415 unsupported_media_type
api POST /v1/jobs "$body" -H 'Content-Type: application/json; charset=utf-8'
expect_status 201

# ------------------------------------------------------------------ 422
step "422 invalid_graph with the JSON Pointer of the problem"
api GET '/v1/jobs?limit=500'
jobs_before="$(jget '.jobs | length')"

# bad_graph BODY PATH_REGEX
bad_graph() {
  api POST /v1/jobs "$1"
  expect_api_error 422 invalid_graph
  local path
  path="$(jget '.error.path')"
  [[ "$path" =~ $2 ]] || fail "422 path '$path' does not match /$2/ for $1"
}
f() { printf '{"type":"fetch","url":"%s/json"%s}' "$UPSTREAM" "${1:+,$1}"; }

bad_graph "{\"graph\":{\"type\":\"list\",\"children\":[$(f),$(f),{\"type\":\"fetch\",\"url\":\"ftp://example.com/x\"}]}}" '^/graph/children/2/url$'
bad_graph "{\"graph\":{\"type\":\"list\",\"children\":[$(f),$(f),{\"type\":\"fetch\",\"url\":\"file:///etc/passwd\"}]}}" '^/graph/children/2/url$'
bad_graph "{\"graph\":{\"type\":\"bogus\"}}" '^/graph/type$'
bad_graph "{\"graph\":{\"type\":\"list\",\"children\":[$(f '"id":"x"'),$(f '"id":"x"')]}}" '^/graph/children/1/id$'
bad_graph "{\"graph\":$(f '"retries":"3"')}" '^/graph/retries$'
bad_graph "{\"graph\":$(f '"retries":11')}" '^/graph/retries$'
bad_graph "{\"graph\":$(f '"bogus":1')}" '^/graph/bogus$'
bad_graph "{\"graph\":$(f '"method":"FETCH"')}" '^/graph/method$'
bad_graph "{\"graph\":$(f '"expect":"xml"')}" '^/graph/expect$'
bad_graph "{\"graph\":$(f '"headers":{"X-A":1}')}" '^/graph/headers/X-A$'
bad_graph "{\"graph\":$(f '"id":"a b"')}" '^/graph/id$'
bad_graph "{\"graph\":$(f '"timeout_ms":-5')}" '^/graph/timeout_ms$'
bad_graph "{\"graph\":{\"type\":\"fetch\",\"url\":\"/json\"}}" '^/graph/url$'
bad_graph "{\"graph\":{\"type\":\"fetch\"}}" '^/graph(/url)?$'
bad_graph "{\"graph\":{\"type\":\"list\",\"children\":[]}}" '^/graph/children$'
bad_graph "{\"graph\":{\"type\":\"sequence\",\"children\":[{\"type\":\"list\",\"children\":[$(f),$(f '"max_bytes":"big"')]}]}}" '^/graph/children/0/children/1/max_bytes$'
bad_graph "{\"graph\":[]}" '^/graph$'
bad_graph "{}" '^(/graph)?$|^null$'
bad_graph "{\"graph\":$(f),\"name\":\"$(printf 'n%.0s' {1..201})\"}" '^/name$'
bad_graph "{\"graph\":$(f),\"deadline_ms\":-1}" '^/deadline_ms$'
bad_graph "{\"graph\":$(f),\"metadata\":[1]}" '^/metadata$'
bad_graph "{\"graph\":$(f),\"metadata\":{\"pad\":\"$(head -c 17000 /dev/zero | tr '\0' a)\"}}" '^/metadata'
bad_graph "{\"graph\":$(f),\"extra\":true}" '^/extra$'
bad_graph '[]' '.*'
bad_graph "{\"graph\":$(f "\"body\":\"x\",\"json\":{}")}" '^/graph'

step "422: too many nodes (--max-nodes 50), too deep (--max-depth 8)"
children="$(f)"
for ((i = 1; i < 60; i++)); do children="$children,$(f)"; done
bad_graph "{\"graph\":{\"type\":\"list\",\"children\":[$children]}}" '^/graph'
deep="$(f)"
for ((i = 0; i < 10; i++)); do deep="{\"type\":\"sequence\",\"children\":[$deep]}"; done
bad_graph "{\"graph\":$deep}" '^/graph'

step "no half-written job was left by any refused submission"
api GET '/v1/jobs?limit=500'
expect_status 200
expect_jq '.jobs | length' "$jobs_before"

# ------------------------------------------------------------------ 431, 414, HTTP rules
step "431 headers_too_large: a 17 KiB header"
api GET /v1/jobs '' -H "X-Big: $(head -c 17408 /dev/zero | tr '\0' a)"
expect_api_error 431 headers_too_large

step "414: a request target over the limit"
api GET "/v1/jobs?pad=$(head -c 70000 /dev/zero | tr '\0' a)"
expect_status 414

step "400: a request without Host"
api GET /healthz '' -H 'Host:'
expect_status 400
raw_status $'GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n'
expect_status 400

step "400: two Host headers"
raw_status $'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: example.com\r\nConnection: close\r\n\r\n'
expect_status 400

step "400: whitespace between a header name and its colon"
raw_status $'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Foo : bar\r\nConnection: close\r\n\r\n'
expect_status 400

step "400: not HTTP at all"
raw_status $'HELLO\r\n\r\n'
expect_status 400

step "absolute-form targets are accepted"
raw_status "GET http://127.0.0.1:$SERVER_PORT/healthz HTTP/1.1"$'\r\n'"Host: 127.0.0.1:$SERVER_PORT"$'\r\nConnection: close\r\n\r\n'
expect_status 200

step "HEAD works wherever GET does; every answer carries Date"
for p in /healthz /v1/jobs "/v1/jobs/$done_id" "/v1/jobs/$done_id/nodes" "/v1/jobs/$done_id/nodes/root" \
         "/v1/jobs/$done_id/nodes/root/body" /metrics /openapi.yaml; do
  api GET "$p"
  expect_status 200
  expect_header Date '[0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT'
  api HEAD "$p"
  expect_status 200
done
api GET /nope
expect_header Date 'GMT'

# ------------------------------------------------------------------ 401
step "401 unauthorized: a server with --token"
start_server --token s3cret-token
tok_pid="$SERVER_PID"
api GET /v1/jobs
expect_api_error 401 unauthorized
api POST /v1/jobs "{\"graph\":$(f)}"
expect_api_error 401 unauthorized
api GET /metrics
expect_api_error 401 unauthorized
api GET /v1/jobs '' -H 'Authorization: Bearer wrong'
expect_api_error 401 unauthorized
api GET /v1/jobs '' -H 'Authorization: Basic czNjcmV0LXRva2Vu'
expect_api_error 401 unauthorized
api GET /healthz
expect_status 200
AUTH_TOKEN=s3cret-token
api GET /v1/jobs
expect_status 200
submit "{\"graph\":$(f)}"
stop_server "$tok_pid" 15
use_main

# ------------------------------------------------------------------ 429
step "429 too_many_jobs with Retry-After: a server with --max-active-jobs 1"
start_server --max-active-jobs 1
busy_pid="$SERVER_PID"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"}}"
busy="$JOB_ID"
api POST /v1/jobs "{\"graph\":$(f)}"
expect_api_error 429 too_many_jobs
expect_header Retry-After '^[0-9]+$'
api POST "/v1/jobs/$busy/cancel"
expect_status 202
wait_settled "$busy" 10
submit "{\"graph\":$(f)}"
stop_server "$busy_pid" 15
use_main

# ------------------------------------------------------------------ still alive
step "after all of it, the first server still answers"
kill -0 "$main_pid" 2>/dev/null || fail "the server died"
api GET /healthz
expect_status 200
expect_jq .status ok
fetch_job "$done_id"
expect_jq .state succeeded

log "ok"
