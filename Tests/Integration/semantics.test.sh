#!/usr/bin/env bash
# How nodes settle (API.md §1.2, §1.3, §5): plain lists, fire_on_first_result,
# all_failed, sequences, timeout_ms, deadline_ms, recover, retries, max_bytes,
# expect modes, redirects.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
start_server

# run_job GRAPH [EXTRA_TOP_LEVEL_JSON_MEMBERS]: submits {"graph": GRAPH, …},
# waits until settled (RESP holds the job), sets JOB_ID.
run_job() {
  local extra="${2:-}"
  submit "{\"graph\":$1${extra:+,$extra}}"
  wait_settled "$JOB_ID" "${RUN_JOB_LIMIT:-20}"
}

fetch() { # fetch PATH [EXTRA_MEMBERS]: a fetch node's JSON
  printf '{"type":"fetch","url":"%s%s"%s}' "$UPSTREAM" "$1" "${2:+,$2}"
}

# ------------------------------------------------------------------ plain list
step "plain list: an array in child order, failed children as {\"error\":…}; the list succeeds"
run_job "{\"type\":\"list\",\"children\":[$(fetch /json),$(fetch /status/404),$(fetch /hang '"timeout_ms":300')]}"
expect_jq .state succeeded
expect_jq '.result | length' 3
expect_jq '.result[0].status' 200
expect_jq '.result[1] | keys | join(",")' error
expect_jq '.result[1].error.kind' http_status
expect_jq '.result[1].error.status' 404
expect_jq '.result[1].error.node' root.1
expect_jq '.result[2].error.kind' timeout
expect_jq '.result[2].error.node' root.2
plain="$JOB_ID"
expect_node "$plain" root.1 .state failed
expect_node "$plain" root.2 .state failed

step "consume_errors: failed children stand as null"
run_job "{\"type\":\"list\",\"consume_errors\":true,\"children\":[$(fetch /json),$(fetch /status/500),$(fetch /text)]}"
expect_jq .state succeeded
expect_jq '.result[1]' null
expect_jq '.result[0].status' 200
expect_jq '.result[2].body_encoding' text

# ------------------------------------------------------------------ first result
step "fire_on_first_result: the first success itself; the slower sibling is cancelled"
ustats_reset
# The 500 comes first, the 300 ms delay second: a failure does not fire the list.
run_job "{\"type\":\"list\",\"fire_on_first_result\":true,\"children\":[$(fetch /delay/5000),$(fetch /status/500),$(fetch /delay/300)]}"
expect_jq .state succeeded
expect_jq '.result.status' 200
expect_jq '.result.url' "$UPSTREAM/delay/300"
# Cancelled, not succeeded: the list did not wait for the slow child.
expect_node "$JOB_ID" root.0 .state cancelled
expect_node "$JOB_ID" root.1 .state failed
expect_node "$JOB_ID" root.2 .state succeeded
wait_upstream '(.disconnects | length) >= 1'

step "fire_on_first_result with cancel_remaining false: the others run to the end"
run_job "{\"type\":\"list\",\"fire_on_first_result\":true,\"cancel_remaining\":false,\"children\":[$(fetch /json),$(fetch /delay/300)]}"
expect_jq .state succeeded
expect_jq '.result.url' "$UPSTREAM/json"
keep="$JOB_ID"
wait_nodes_state "$keep" succeeded root.1
expect_node "$keep" root.1 .state succeeded

step "fire_on_first_result, every child fails: all_failed with each error in child order"
run_job "{\"type\":\"list\",\"fire_on_first_result\":true,\"children\":[$(fetch /status/500),$(fetch /status/404),$(fetch /invalid-json '"expect":"json"')]}"
expect_jq .state failed
expect_jq .error.kind all_failed
expect_jq '.error.errors | length' 3
expect_jq '[.error.errors[].kind] | join(",")' http_status,http_status,invalid_json
expect_jq '[.error.errors[].status]' '[500,404,null]'
expect_jq '[.error.errors[].node] | join(",")' root.0,root.1,root.2

step "fire_on_first_error with every child succeeding: the array"
run_job "{\"type\":\"list\",\"fire_on_first_error\":true,\"children\":[$(fetch /json),$(fetch /text)]}"
expect_jq .state succeeded
expect_jq '.result | length' 2

step "concurrency 1: children run one at a time"
ustats_reset
run_job "{\"type\":\"list\",\"concurrency\":1,\"children\":[$(fetch /delay/200),$(fetch /delay/200),$(fetch /delay/200)]}"
expect_jq .state succeeded
[ "$(ustats .max_active)" = 1 ] || fail "concurrency 1, but the upstream saw $(ustats .max_active) at once"

# ------------------------------------------------------------------ sequence
step "sequence: the first failure fails it; the children after it are skipped"
run_job "{\"type\":\"sequence\",\"children\":[$(fetch /json),$(fetch /status/500),$(fetch /json),$(fetch /text)]}"
expect_jq .state failed
expect_jq .error.kind http_status
expect_jq .error.status 500
expect_jq .error.node root.1
seq="$JOB_ID"
api GET "/v1/jobs/$seq/nodes"
expect_status 200
expect_jq '[.nodes[].state] | join(",")' failed,succeeded,failed,skipped,skipped
expect_jq '[.nodes[3,4].started_at] | unique' '[null]'
fetch_job "$seq"
expect_jq .progress.skipped 2

step "sequence with continue_on_error: failed children stand in the array"
run_job "{\"type\":\"sequence\",\"continue_on_error\":true,\"children\":[$(fetch /json),$(fetch /status/500),$(fetch /text)]}"
expect_jq .state succeeded
expect_jq '.result[0].status' 200
expect_jq '.result[1].error.status' 500
expect_jq '.result[2].status' 200

step "sequence: child n+1 starts after child n settled"
ustats_reset
run_job "{\"type\":\"sequence\",\"children\":[$(fetch /delay/150),$(fetch /delay/150),$(fetch /delay/150)]}"
expect_jq .state succeeded
[ "$(ustats .max_active)" = 1 ] || fail "a sequence ran $(ustats .max_active) children at once"

# ------------------------------------------------------------------ timeout
step "timeout_ms: the node fails with timeout; running and pending descendants are cancelled (not skipped)"
t0="$(millis)"
run_job "{\"type\":\"list\",\"timeout_ms\":700,\"children\":[
          $(fetch /hang),
          {\"type\":\"sequence\",\"children\":[$(fetch /delay/50),$(fetch /hang),$(fetch /json)]}]}"
t1="$(millis)"
expect_jq .state failed
expect_jq .error.kind timeout
expect_jq .error.node root
# Its children hang: only the timeout can have settled it, and not before its time.
[ $((t1 - t0)) -ge 700 ] || fail "timeout_ms 700 settled after $((t1 - t0)) ms"
to="$JOB_ID"
api GET "/v1/jobs/$to/nodes"
expect_status 200
expect_jq '[.nodes[] | "\(.id)=\(.state)"] | join(" ")' \
  "root=failed root.0=cancelled root.1=cancelled root.1.0=succeeded root.1.1=cancelled root.1.2=cancelled"

step "deadline_ms: the job fails with timeout; its running nodes are cancelled"
t0="$(millis)"
run_job "{\"type\":\"list\",\"children\":[$(fetch /hang),$(fetch /hang)]}" '"deadline_ms":600'
t1="$(millis)"
expect_jq .state failed
expect_jq .error.kind timeout
[ $((t1 - t0)) -ge 600 ] || fail "deadline_ms 600 settled after $((t1 - t0)) ms"
expect_node "$JOB_ID" root.0 .state cancelled
expect_node "$JOB_ID" root.1 .state cancelled

# ------------------------------------------------------------------ recover
step "recover: a failed node succeeds with the recover value and says recovered"
run_job "{\"type\":\"list\",\"children\":[$(fetch /status/500 '"recover":{"fallback":true}'),$(fetch /json '"recover":"unused"')]}"
expect_jq .state succeeded
expect_jq '.result[0]' '{"fallback":true}'
expect_jq '.result[1].status' 200
rec="$JOB_ID"
expect_node "$rec" root.0 .state succeeded
expect_node "$rec" root.0 .recovered true
expect_node "$rec" root.0 .result '{"fallback":true}'
expect_node "$rec" root.1 .recovered false

step "recover on the root: the job succeeds"
run_job "$(fetch /status/503 '"recover":"fallback"')"
expect_jq .state succeeded
expect_jq .result fallback
expect_jq .error null
expect_node "$JOB_ID" root .recovered true

step "recover does not apply to a cancelled node"
run_job "{\"type\":\"list\",\"fire_on_first_result\":true,\"children\":[$(fetch /json),$(fetch /hang '"recover":"nope"')]}"
expect_jq .state succeeded
expect_node "$JOB_ID" root.1 .state cancelled
expect_node "$JOB_ID" root.1 .recovered false

step "recover on a timed-out list"
run_job "{\"type\":\"list\",\"timeout_ms\":300,\"recover\":[],\"children\":[$(fetch /hang)]}"
expect_jq .state succeeded
expect_jq .result '[]'
expect_node "$JOB_ID" root .recovered true
expect_node "$JOB_ID" root.0 .state cancelled

# ------------------------------------------------------------------ retries
k="r$(millis)"
step "retries: a GET is retried after 5xx until it succeeds"
run_job "$(fetch "/count/$k-a?fail=2" '"retries":2,"retry_backoff_ms":10')"
expect_jq .state succeeded
expect_node "$JOB_ID" root .attempts 3
[ "$(upstream_count "$k-a")" = 3 ] || fail "upstream saw $(upstream_count "$k-a") requests for 2 failures + 1 success"

step "retries exhausted: the last failure stands"
run_job "$(fetch "/count/$k-b?fail=5" '"retries":1,"retry_backoff_ms":10')"
expect_jq .state failed
expect_jq .error.kind http_status
expect_jq_true '.error.status >= 500' "a 5xx status"
expect_node "$JOB_ID" root .attempts 2
[ "$(upstream_count "$k-b")" = 2 ] || fail "upstream saw $(upstream_count "$k-b") requests for retries 1"

step "a POST is not retried unless idempotent"
run_job "$(fetch "/count/$k-c?fail=1" '"method":"POST","retries":3,"retry_backoff_ms":10')"
expect_jq .state failed
expect_node "$JOB_ID" root .attempts 1
[ "$(upstream_count "$k-c")" = 1 ] || fail "a non-idempotent POST was sent $(upstream_count "$k-c") times"
run_job "$(fetch "/count/$k-d?fail=1" '"method":"POST","idempotent":true,"retries":3,"retry_backoff_ms":10')"
expect_jq .state succeeded
expect_node "$JOB_ID" root .attempts 2
[ "$(upstream_count "$k-d")" = 2 ] || fail "an idempotent POST was sent $(upstream_count "$k-d") times"

step "a 4xx other than 429 is not retried"
run_job "$(fetch /status/404 '"retries":3,"retry_backoff_ms":10')"
expect_jq .state failed
expect_node "$JOB_ID" root .attempts 1

step "accept_status: a listed status counts as success"
run_job "$(fetch /status/404 '"accept_status":[404]')"
expect_jq .state succeeded
expect_jq .result.status 404

# ------------------------------------------------------------------ max_bytes
step "max_bytes: exactly max_bytes succeeds, one byte more fails with too_large"
run_job "$(fetch /bytes/1000 '"max_bytes":1000')"
expect_jq .state succeeded
expect_jq .result.bytes 1000
run_job "$(fetch /bytes/1001 '"max_bytes":1000')"
expect_jq .state failed
expect_jq .error.kind too_large
run_job "$(fetch '/json?size=5000' '"max_bytes":100')"
expect_jq .state failed
expect_jq .error.kind too_large

# ------------------------------------------------------------------ expect
step "expect modes"
run_job "$(fetch /json '"expect":"json"')"
expect_jq .result.body_encoding json
expect_jq_true '.result.body | type == "object" or type == "array"' "a parsed JSON body"
run_job "$(fetch /json '"expect":"text"')"
expect_jq .result.body_encoding text
expect_jq_true '.result.body | type == "string"' "the JSON as text"
run_job "$(fetch /text '"expect":"bytes"')"
expect_jq .result.body_encoding base64
direct="$(curl -sS --max-time 5 "$UPSTREAM/text")"
expect_jq '.result.body | @base64d' "$direct"
run_job "$(fetch /text)"
expect_jq .result.body_encoding text
expect_jq .result.body "$direct"
run_job "$(fetch /bytes/64)"
expect_jq .result.body_encoding base64
run_job "$(fetch /invalid-json '"expect":"json"')"
expect_jq .state failed
expect_jq .error.kind invalid_json
run_job "$(fetch /invalid-json '"expect":"text"')"
expect_jq .state succeeded
expect_jq .result.body_encoding text

# ------------------------------------------------------------------ redirects
step "redirects: exactly 5 are followed, the 6th fails; follow_redirects false stops at the first"
run_job "$(fetch /redirect/5)"
expect_jq .state succeeded
expect_jq .result.status 200
run_job "$(fetch /redirect/6)"
expect_jq .state failed
run_job "$(fetch /redirect/1 '"follow_redirects":false,"accept_status":[301,302,303,307,308]')"
expect_jq .state succeeded
expect_jq_true '.result.status >= 301 and .result.status <= 308' "the redirect itself"

# ------------------------------------------------------------------ transport errors
step "a connection reset fails the fetch (not an http_status)"
run_job "$(fetch /reset)"
expect_jq .state failed
expect_jq_true '.error.kind != "http_status" and .error.kind != "internal"' "a transport error kind"

step "a refused connection fails with kind connect"
dead_port="$(free_port)"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"http://127.0.0.1:$dead_port/\"}}"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind connect

log "ok"
