#!/usr/bin/env bash
# The composition example of the HLDeferred README as a job: log in, then
# fetch two things with a fail-fast DeferredList (fireOnFirstError: YES).
#
#   requestMyStuff = [requestLogin then: ^{ DeferredList([stuff1, stuff2], fireOnFirstError) }]
#
# as   sequence [ login, list(fire_on_first_error) [ stuff1, stuff2 ] ]
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
start_server

# my_stuff STUFF1_PATH STUFF2_PATH: the job body.
my_stuff() {
  cat <<EOF
{ "name": "my-stuff",
  "graph": { "type": "sequence", "children": [
    { "id": "login", "type": "fetch", "method": "POST", "url": "$UPSTREAM/echo",
      "json": { "user": "demo", "password": "secret" }, "expect": "json" },
    { "id": "stuffs", "type": "list", "fire_on_first_error": true, "children": [
      { "id": "stuff1", "type": "fetch", "url": "$UPSTREAM$1" },
      { "id": "stuff2", "type": "fetch", "url": "$UPSTREAM$2" } ] } ] } }
EOF
}

# ------------------------------------------------------------------ success
step "success: login, then both stuffs; the result is [login, [stuff1, stuff2]]"
submit "$(my_stuff /json /text)"
ok="$JOB_ID"
wait_settled "$ok" 20
expect_jq .state succeeded
expect_jq .error null
expect_jq '.result | length' 2
expect_jq '.result[0].status' 200
expect_jq '.result[0].body_encoding' json
expect_jq '.result[1] | length' 2
expect_jq '.result[1][0].status' 200
expect_jq '.result[1][0].url' "$UPSTREAM/json"
expect_jq '.result[1][1].status' 200
expect_jq '.result[1][1].body_encoding' text
expect_jq '.progress.succeeded' 5
api GET "/v1/jobs/$ok/nodes"
expect_status 200
expect_jq '[.nodes[].id] | join(" ")' "root login stuffs stuff1 stuff2"
expect_jq '[.nodes[].state] | unique | join(",")' succeeded

step "the login happened before the stuffs started"
login_end="$(node_field "$ok" login .finished_at)"
s1_start="$(node_field "$ok" stuff1 .started_at)"
s2_start="$(node_field "$ok" stuff2 .started_at)"
# RFC 3339 UTC with milliseconds compares correctly as text.
[[ ! "$s1_start" < "$login_end" ]] || fail "stuff1 started ($s1_start) before login finished ($login_end)"
[[ ! "$s2_start" < "$login_end" ]] || fail "stuff2 started ($s2_start) before login finished ($login_end)"

step "the login request carried its JSON body"
api GET "/v1/jobs/$ok/nodes/login"
expect_status 200
expect_jq_true '.result.body | tostring | contains("secret")' "the upstream echo saw the login body"

# ------------------------------------------------------------------ failure
step "failure: stuff2 answers 503 → the list fails fast with stuff2's error, stuff1 is cancelled"
ustats_reset
submit "$(my_stuff /delay/5000 /status/503)"
bad="$JOB_ID"
wait_settled "$bad" 20
expect_jq .state failed
expect_jq .error.kind http_status
expect_jq .error.status 503
expect_jq .error.node stuff2
expect_jq .result null
expect_node "$bad" login .state succeeded
expect_node "$bad" stuffs .state failed
expect_node "$bad" stuffs .error.kind http_status
expect_node "$bad" stuffs .error.node stuff2
expect_node "$bad" stuff2 .state failed
expect_node "$bad" stuff2 .status 503
expect_node "$bad" stuff2 .error.kind http_status
expect_node "$bad" stuff2 .error.status 503
# Cancelled, not succeeded: the list fired on the first error without waiting for it.
expect_node "$bad" stuff1 .state cancelled
expect_node "$bad" root .state failed
expect_node "$bad" root .error.node stuff2
fetch_job "$bad"
expect_jq '.progress.failed' 3
expect_jq '.progress.cancelled' 1
expect_jq '.progress.succeeded' 1
step "the cancelled sibling's transfer was aborted"
wait_upstream '(.disconnects | length) >= 1'

step "failure of the login: the list never starts"
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[
          {\"id\":\"login\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/status/401\"},
          {\"id\":\"stuffs\",\"type\":\"list\",\"fire_on_first_error\":true,\"children\":[
            {\"id\":\"stuff1\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},
            {\"id\":\"stuff2\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/text\"}]}]}}"
nologin="$JOB_ID"
wait_settled "$nologin" 20
expect_jq .state failed
expect_jq .error.node login
expect_jq .error.status 401
expect_node "$nologin" stuffs .state skipped
expect_node "$nologin" stuff1 .started_at null

log "ok"
