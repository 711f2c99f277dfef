#!/usr/bin/env bash
# The `map` node (API.md §7.1): fetch ids, then a map fetching each one;
# every map 422 with its path; too_many_items and too_many_failures from real
# runs; and `kill -9` while a map of 1,000 copies is half done: after the
# restart the settled copies are not fetched again (upstream counters) and the
# job ends with the same result as an uninterrupted run.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
start_server

# ids_then_users N MAP_FIELDS USER_QUERY: a sequence that fetches N ids, then
# maps each to /users/<id> (the body kept with select).
ids_then_users() {
  cat <<EOF
{"graph": {"type": "sequence", "children": [
  {"id": "ids", "type": "fetch", "url": "$UPSTREAM/ids?n=$1", "select": "/body/ids"},
  {"id": "users", "type": "map", "items": {"\$ref": "/nodes/ids/result"}$2,
   "template": {"type": "fetch", "url": {"\$concat": ["$UPSTREAM/users/", {"\$ref": "/item"}]},
                "query": {$3}, "select": "/body"}}]}}
EOF
}

# ------------------------------------------------------------------ ids → map
step "fetch ids, then a map fetching each with fire_on_first_error"
submit "$(ids_then_users 5 ', "concurrency": 2, "fire_on_first_error": true' '')"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq '.result[1] | map(.name) | join(",")' "user-1,user-2,user-3,user-4,user-5"
expect_jq '.result[1][4]' '{"id":5,"name":"user-5"}'
expect_jq .progress.total 8
expect_node "$JOB_ID" users.2 .parent users
expect_node "$JOB_ID" users.2 .state succeeded
[ "$(ustats '.counters["users/3"]')" = 1 ] || fail "users/3 fetched $(ustats '.counters["users/3"]') times"

step "the same map fails with the first copy's error under fire_on_first_error"
submit "$(ids_then_users 4 ', "concurrency": 1, "fire_on_first_error": true' '"fail": "2"')"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind http_status
expect_jq .error.node users.1
expect_node "$JOB_ID" users.3 .state cancelled

step "an empty array succeeds with []"
submit "$(ids_then_users 0 '' '')"
wait_settled "$JOB_ID" 20
expect_jq '.result[1]' '[]'

# ------------------------------------------------------------------ error kinds
step "too_many_items: more items than max_items, no copy fetched"
ustats_reset
submit "$(ids_then_users 3 ', "max_items": 2' '')"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind too_many_items
expect_jq .error.node users
expect_jq .progress.total 3
[ "$(ustats '.counters["users/1"] // 0')" = 0 ] || fail "a copy was fetched although the map had too many items"

step "too_many_failures: the rest cancelled as for an early fire"
submit "$(ids_then_users 6 ', "concurrency": 1, "tolerated_failures": 1' '"fail": "2,3"')"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind too_many_failures
expect_jq '[.error.errors[].node] | join(",")' "users.1,users.2"
expect_node "$JOB_ID" users.5 .state cancelled
[ "$(ustats '.counters["users/6"] // 0')" = 0 ] || fail "a copy after too_many_failures was fetched"

step "ref_type: items that are not an array"
submit "{\"input\": {\"ids\": 7}, \"graph\": {\"type\": \"map\", \"items\": {\"\$ref\": \"/input/ids\"},
  \"template\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\"}}}"
wait_settled "$JOB_ID" 20
expect_jq .error.kind ref_type

# ------------------------------------------------------------------ 422s
step "every map refusal answers 422 with the path of its problem"
leaf="\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\""
while IFS='|' read -r path graph; do
  api POST /v1/jobs "{\"graph\": $graph}"
  expect_api_error 422 invalid_graph
  expect_jq .error.path "$path"
done <<EOF
/graph/items|{"type": "map", "template": {$leaf}}
/graph/template|{"type": "map", "items": []}
/graph/items|{"type": "map", "items": "1,2", "template": {$leaf}}
/graph/template|{"type": "map", "items": [], "template": [1]}
/graph/template/url|{"type": "map", "items": [], "template": {"type": "fetch", "url": "ftp://h/"}}
/graph/max_items|{"type": "map", "items": [], "max_items": 10001, "template": {$leaf}}
/graph/tolerated_failures|{"type": "map", "items": [], "tolerated_failures": -1, "template": {$leaf}}
/graph/concurrency|{"type": "map", "items": [], "concurrency": 0, "template": {$leaf}}
/graph/cancel_remaining|{"type": "map", "items": [], "cancel_remaining": "no", "template": {$leaf}}
/graph/children|{"type": "map", "items": [], "children": [{$leaf}], "template": {$leaf}}
/graph/json|{$leaf, "json": {"\$ref": "/item"}}
/graph/items|{"type": "map", "items": {"\$ref": "/index"}, "template": {$leaf}}
/graph/children/1/id|{"type": "sequence", "children": [{"id": "m", "type": "map", "items": [], "template": {$leaf}}, {"id": "m.3", $leaf}]}
/graph/template/children/0/id|{"type": "map", "items": [], "template": {"type": "list", "children": [{"id": "0", $leaf}]}}
/graph/children/1/json|{"type": "sequence", "children": [{"type": "map", "items": [], "template": {"id": "t", $leaf}}, {$leaf, "json": {"\$ref": "/nodes/t/result"}}]}
/graph/template/children/1/json|{"type": "map", "items": [], "template": {"type": "list", "children": [{"id": "a", $leaf}, {$leaf, "json": {"\$ref": "/nodes/a/result"}}]}}
/graph/children/0/items|{"type": "sequence", "children": [{"type": "map", "items": {"\$ref": "/nodes/z/result"}, "template": {$leaf}}, {"id": "z", $leaf}]}
EOF

# ------------------------------------------------------------------ kill -9
step "kill -9 while a map of 1,000 copies is half done; the restart fetches no settled copy again"
ustats_reset
big="$(ids_then_users 1000 ', "concurrency": 16' '"delay_ms": "20"')"
submit "$big"
job="$JOB_ID"
wait_job "$job" '.progress.succeeded >= 450' 30
[ "$(jget .progress.total)" = 1003 ] || fail "the map's copies do not count in progress.total"
api GET "/v1/jobs/$job/nodes"
jq -r '.nodes[] | select((.id | startswith("users.")) and .state == "succeeded") | .id' <<<"$RESP" >"$TMP/settled"
settled=$(wc -l <"$TMP/settled")
[ "$settled" -ge 400 ] && [ "$settled" -lt 1000 ] || fail "expected the map half done, $settled copies settled"
# The upstream is paused until the server is killed: no copy settles meanwhile but those whose answers were already
# on their way, at most one per copy in flight, so what the kill finds uncommitted does not grow with the time the
# two requests below take on a slow machine (1,051 fetches in one run at 20 ms a fetch).
kill -STOP "$UPSTREAM_PID"
# The engine's writes trail its state by a batch: a node's response body is read from the store, so it is
# answered once the store has committed everything handed to it before, the states listed above among them.
api GET "/v1/jobs/$job/nodes/$(head -1 "$TMP/settled")/body"
expect_status 200
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
kill -CONT "$UPSTREAM_PID"
log "killed with $settled of 1000 copies settled"
start_server_on "$SERVER_DB"
wait_settled "$job" 40
expect_jq .state succeeded
expect_jq .progress.total 1003
resumed="$RESP"
ustats '.counters' >"$TMP/counters"
# users.<k> fetches /users/<k+1>: count the settled copies whose counter is not 1.
refetched=$(jq -R -s --slurpfile c "$TMP/counters" \
  '[split("\n")[] | select(length > 0) | ("users/" + ((ltrimstr("users.") | tonumber) + 1 | tostring))
    | select(($c[0][.] // 0) != 1)] | length' "$TMP/settled")
[ "$refetched" = 0 ] || fail "$refetched copies settled before the kill were fetched again"
total=$(jq '[to_entries[] | select(.key | startswith("users/")) | .value] | add' "$TMP/counters")
# Fetched twice at most: the copies in flight at the kill (16 per host), and the few that settled in the last
# moment before it, whose state was not committed yet (at most one per copy in flight, with the upstream paused).
[ "$total" -ge 1000 ] && [ "$total" -le 1048 ] || fail "expected 1000 to 1048 user fetches, got $total"
log "$total user fetches for 1000 copies"

step "the interrupted job's result is the uninterrupted run's"
submit "$big"
wait_settled "$JOB_ID" 40
expect_jq .state succeeded
[ "$(jq -c .result <<<"$RESP")" = "$(jq -c .result <<<"$resumed")" ] || fail "results differ after the restart"
expect_jq '.result[1] | length' 1000

log "ok"
