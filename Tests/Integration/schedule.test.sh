#!/usr/bin/env bash
# API.md §8: `not_before` (a job waits in the store for its time, across a kill -9), concurrency keys (at most
# `concurrency_limit` jobs of a key at once, in submission order: the upstream records when each request began and
# ended), and retry (succeeded nodes keep their results; the others run again; `attempt` counts).
source "$(dirname "$0")/lib.sh"

start_upstream
start_server

# Epoch milliseconds as RFC 3339 UTC with milliseconds.
rfc3339_ms() { python3 -c 'import sys,datetime; t=int(sys.argv[1]); print(datetime.datetime.fromtimestamp(t/1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.")+"%03dZ" % (t%1000))' "$1"; }
now_ms() { python3 -c 'import time; print(int(time.time()*1000))'; }
ms_of() { python3 -c 'import sys,datetime; print(int(datetime.datetime.fromisoformat(sys.argv[1].replace("Z","+00:00")).timestamp()*1000))' "$1"; }

# ---------------------------------------------------------------- validation
step "not_before, concurrency_key and concurrency_limit are checked, with JSON Pointers"
api POST /v1/jobs "{\"not_before\": \"tomorrow\", \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\"}}"
expect_api_error 422 invalid_graph
expect_jq .error.path /not_before
far="$(rfc3339_ms $(($(now_ms) + 367 * 86400000)))"
api POST /v1/jobs "{\"not_before\": \"$far\", \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\"}}"
expect_api_error 422 invalid_graph
expect_jq .error.path /not_before
api POST /v1/jobs "{\"concurrency_key\": \"k\", \"concurrency_limit\": 0, \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\"}}"
expect_api_error 422 invalid_graph
expect_jq .error.path /concurrency_limit
long_key="$(printf 'k%.0s' $(seq 201))"
api POST /v1/jobs "{\"concurrency_key\": \"$long_key\", \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\"}}"
expect_api_error 422 invalid_graph
expect_jq .error.path /concurrency_key

# ---------------------------------------------------------------- not_before
step "a job with not_before 2 s ahead waits pending, survives a kill -9, and starts after its time"
ustats_reset
due_ms=$(($(now_ms) + 2000))
due="$(rfc3339_ms "$due_ms")"
submit "{\"not_before\": \"$due\", \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/span/late?tag=a\"}}"
scheduled="$JOB_ID"
expect_jq .state pending
expect_jq .not_before "$due"
expect_jq .progress.pending 1
expect_jq .attempt 1
# A second one, cancelled while it waits, must never run.
submit "{\"not_before\": \"$due\", \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/span/late?tag=cancelled\"}}"
to_cancel="$JOB_ID"
api POST "/v1/jobs/$to_cancel/cancel"
expect_status 202
expect_jq .state cancelled
api DELETE "/v1/jobs/$scheduled"
expect_api_error 409 conflict
api GET /metrics
grep -q '^jobserver_jobs_scheduled 1$' <<<"$RESP" || fail "expected jobserver_jobs_scheduled 1"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
start_server_on "$SERVER_DB"
wait_settled "$scheduled" 20
expect_jq .state succeeded
started="$(jget .started_at)"
[ "$(ms_of "$started")" -ge "$due_ms" ] || fail "the job started at $started, before its not_before $due"
RESP="$(ustats .)"
span_start="$(jq -r '.spans.late[0].start' <<<"$RESP")"
python3 -c "import sys; s=float(sys.argv[1])*1000; sys.exit(0 if s >= int(sys.argv[2]) else 1)" "$span_start" "$due_ms" ||
  fail "the upstream saw the request at $span_start, before $due_ms"
expect_jq '.spans.late | length' 1
fetch_job "$to_cancel"
expect_jq .state cancelled
api DELETE "/v1/jobs/$to_cancel"
expect_status 204

# ---------------------------------------------------------------- concurrency keys
# run_keyed KEY LIMIT: ten jobs of that key, each one fetch of 150 ms; waits for all.
run_keyed() {
  local key="$1" limit="$2" i ids=() positions=""
  for i in $(seq 0 9); do
    submit "{\"concurrency_key\": \"$key\", \"concurrency_limit\": $limit, \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/span/$key?tag=$i&delay_ms=150\"}}"
    ids+=("$JOB_ID")
  done
  # The last one waits behind the others while they run.
  fetch_job "${ids[9]}"
  if [ "$(jget .state)" = pending ]; then
    positions="$(jget .queue_position)"
    [ "$positions" != null ] || fail "a job waiting for its key shows no queue_position"
  fi
  for i in $(seq 0 9); do
    wait_settled "${ids[$i]}" 30
    expect_jq .state succeeded
    expect_jq .concurrency_key "$key"
    expect_jq 'has("queue_position")' false
  done
}

step "ten jobs of one key with limit 1 never overlap and start in submission order"
ustats_reset
run_keyed serial 1
RESP="$(ustats .)"
expect_jq '.spans.serial | length' 10
expect_jq '[.spans.serial[].tag] | join(",")' "0,1,2,3,4,5,6,7,8,9"
expect_jq_true '[.spans.serial as $s | range(1; 10) | $s[.].start >= $s[. - 1].end] | all' "two jobs of a key with limit 1 overlapped"

step "with limit 3 never more than 3 at once"
ustats_reset
run_keyed three 3
RESP="$(ustats .)"
expect_jq '.spans.three | length' 10
# The most spans open at once: at each start, the spans begun before it and not yet ended.
expect_jq_true '[.spans.three as $s | $s[] | .start as $t | [$s[] | select(.start <= $t and .end > $t)] | length] | max <= 3' \
  "more than 3 jobs of a key with limit 3 ran at once"
expect_jq_true '[.spans.three as $s | $s[] | .start as $t | [$s[] | select(.start <= $t and .end > $t)] | length] | max >= 2' \
  "jobs of a key with limit 3 never ran side by side"

# ---------------------------------------------------------------- retry
step "retry: the failed second fetch runs again, the first is not made again, attempt is 2"
ustats_reset
key="r$RANDOM"
submit "{\"graph\": {\"type\": \"sequence\", \"children\": [
  {\"id\": \"one\", \"type\": \"fetch\", \"url\": \"$UPSTREAM/count/$key-1\"},
  {\"id\": \"two\", \"type\": \"fetch\", \"url\": \"$UPSTREAM/count/$key-2?fail=1\"},
  {\"id\": \"three\", \"type\": \"fetch\", \"url\": \"$UPSTREAM/count/$key-3\"}]}}"
job="$JOB_ID"
wait_settled "$job"
expect_jq .state failed
version="$(jget .version)"
api POST "/v1/jobs/$job/retry"
expect_status 202
expect_jq .attempt 2
expect_jq_true ".version > $version" "version did not grow at the retry"
wait_settled "$job"
expect_jq .state succeeded
expect_jq .attempt 2
[ "$(upstream_count "$key-1")" = 1 ] || fail "the first fetch was made again"
[ "$(upstream_count "$key-2")" = 2 ] || fail "the second fetch was not made twice"
[ "$(upstream_count "$key-3")" = 1 ] || fail "the third fetch was not made once"
api GET "/v1/jobs/$job/nodes?include=result"
expect_jq '.nodes[1].result.body.count' 1
expect_jq '.nodes[2].result.body.count' 2
api POST "/v1/jobs/$job/retry"
expect_api_error 409 conflict
api POST /v1/jobs/01JNOSUCHJOB0000000000000/retry
expect_api_error 404 not_found

step "retry of a job cancelled while waiting for its time waits for it again"
submit "{\"not_before\": \"$(rfc3339_ms $(($(now_ms) + 60000)))\", \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\"}}"
job="$JOB_ID"
api POST "/v1/jobs/$job/retry"
expect_api_error 409 conflict
api POST "/v1/jobs/$job/cancel"
expect_status 202
api POST "/v1/jobs/$job/retry"
expect_status 202
expect_jq .state pending
expect_jq .attempt 2
api POST "/v1/jobs/$job/cancel"
expect_status 202

log "ok"
