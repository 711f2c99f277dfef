#!/usr/bin/env bash
# A tour of every route of API.md §2 as a client uses them: submit, poll,
# long-poll, list, nodes, one node, raw body, cancel, delete, Idempotency-Key.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
start_server

ts_re='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{3}Z$'

# ------------------------------------------------------------------ submit
step "submit: 201, Location, the job object of §1.4"
submit "{\"name\":\"tour\",\"metadata\":{\"requested_by\":\"tour\",\"n\":[1,2.50,{\"x\":null}]},
         \"graph\":{\"type\":\"list\",\"children\":[
           {\"id\":\"fast\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},
           {\"id\":\"slow\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/1500\"}]}}"
first="$JOB_ID"
expect_header Location "^/v1/jobs/$first\$"
expect_jq .id "$first"
expect_jq .name tour
expect_jq '.metadata' '{"requested_by":"tour","n":[1,2.5,{"x":null}]}'
grep -q '2\.50' <<<"$RESP" || fail "metadata not echoed unchanged: the number literal 2.50 was rewritten"
expect_jq_true '.state == "pending" or .state == "running"' "a new job is pending or running"
expect_jq '.progress.total' 3
expect_jq '.progress | .pending + .running + .succeeded + .failed + .cancelled + .skipped' 3
expect_jq '.result' null
expect_jq '.error' null
expect_jq '.finished_at' null
expect_jq_true '.version >= 1' "version starts at 1 or more"
expect_jq_true ".created_at | test(\"$ts_re\")" "created_at is RFC 3339 UTC with milliseconds"
expect_jq '[keys[]] | sort | join(",")' \
  "attempt,created_at,error,finished_at,id,metadata,name,progress,result,started_at,state,version"
expect_jq '.progress | keys | sort | join(",")' \
  "cancelled,done,failed,pending,percent,running,skipped,succeeded,total"

# ------------------------------------------------------------------ poll
step "poll: GET /v1/jobs/{id}"
fetch_job "$first"
expect_jq .id "$first"
version="$(jget .version)"

step "long-poll with since: answers as soon as the version moves, not after wait"
t0="$(millis)"
api GET "/v1/jobs/$first?wait=20&since=$version"
t1="$(millis)"
expect_status 200
expect_jq_true ".version > $version" "the long-poll answered with a newer version"
# Before its own wait=20 ran out: woken by the change, not by its timer.
[ $((t1 - t0)) -lt 20000 ] || fail "long-poll with since took $((t1 - t0)) ms: it did not answer on the change"

step "long-poll without since: answers once the job is settled"
t0="$(millis)"
api GET "/v1/jobs/$first?wait=20"
t1="$(millis)"
expect_status 200
expect_jq .state succeeded
[ $((t1 - t0)) -lt 20000 ] || fail "long-poll without since took $((t1 - t0)) ms: it did not answer on the change"
expect_jq '.progress.done' 3
expect_jq '.progress.succeeded' 3
expect_jq '.progress.percent' 100
expect_jq_true ".started_at | test(\"$ts_re\")" "started_at is set"
expect_jq_true ".finished_at | test(\"$ts_re\")" "finished_at is set"
expect_jq '.result | length' 2
expect_jq '.result[0].status' 200
expect_jq '.result[1].status' 200
expect_jq '.error' null
final_version="$(jget .version)"

step "long-poll on a settled job with since=current version: waits S seconds, answers unchanged"
t0="$(millis)"
api GET "/v1/jobs/$first?wait=1&since=$final_version"
t1="$(millis)"
expect_status 200
expect_jq .version "$final_version"
[ $((t1 - t0)) -ge 900 ] || fail "wait=1 answered after $((t1 - t0)) ms, before the wait was over"

step "wait=0 answers at once"
t0="$(millis)"
api GET "/v1/jobs/$first?wait=0&since=$final_version"
t1="$(millis)"
expect_status 200
# Before the shortest wait there is (1 s) could have run out: it did not wait.
[ $((t1 - t0)) -lt 1000 ] || fail "wait=0 took $((t1 - t0)) ms"

# ------------------------------------------------------------------ list
step "list: newest first, without result"
ids=("$first")
for n in 1 2 3 4; do
  submit "{\"name\":\"list-$n\",\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/text\"}}"
  ids+=("$JOB_ID")
done
for id in "${ids[@]}"; do wait_settled "$id" 20; done
api GET /v1/jobs
expect_status 200
expect_jq '.jobs | length' 5
expect_jq '[.jobs[].id] | join(" ")' "${ids[4]} ${ids[3]} ${ids[2]} ${ids[1]} ${ids[0]}"
expect_jq '[.jobs[] | has("result")] | any' false
expect_jq '.next_cursor' null
expect_jq_true '[.jobs[].id] == ([.jobs[].id] | sort | reverse)' "ids sort by creation time"

step "list: state filter"
submit "{\"name\":\"hanging\",\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"}}"
hanging="$JOB_ID"
wait_state "$hanging" running
api GET '/v1/jobs?state=running'
expect_status 200
expect_jq '[.jobs[].id] | join(" ")' "$hanging"
api GET '/v1/jobs?state=succeeded'
expect_status 200
expect_jq '.jobs | length' 5
expect_jq '[.jobs[].state] | unique | join(",")' succeeded
api GET '/v1/jobs?state=skipped'
expect_status 200
expect_jq '.jobs' '[]'

step "list: limit and cursor pagination walk every job once, in order"
api GET /v1/jobs
all_ids="$(jget '[.jobs[].id] | join(" ")')"
collected=""
path='/v1/jobs?limit=2'
for ((page = 0; page < 10; page++)); do
  api GET "$path"
  expect_status 200
  expect_jq_true '.jobs | length <= 2' "limit=2 gives at most 2 jobs"
  collected="$collected $(jget '[.jobs[].id] | join(" ")')"
  cursor="$(jget .next_cursor)"
  [ "$cursor" = null ] && break
  path="/v1/jobs?limit=2&cursor=$(jq -rn --arg c "$cursor" '$c | @uri')"
done
[ "$cursor" = null ] || fail "pagination did not end within 10 pages"
collected="$(echo "$collected" | xargs)"
[ "$collected" = "$all_ids" ] || fail "pages gave '$collected', the full list is '$all_ids'"
api GET '/v1/jobs?limit=1&state=succeeded'
expect_status 200
expect_jq '.jobs | length' 1
expect_jq '.jobs[0].id' "${ids[4]}"
expect_jq_true '.next_cursor | type == "string"' "a next_cursor while more jobs follow"

# ------------------------------------------------------------------ nodes
step "nodes: tree order, parents, fields; result only with include=result"
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[
          {\"id\":\"a\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},
          {\"type\":\"list\",\"children\":[
             {\"type\":\"fetch\",\"url\":\"$UPSTREAM/text\"},
             {\"type\":\"fetch\",\"url\":\"$UPSTREAM/bytes/10\"}]}]}}"
tree="$JOB_ID"
wait_settled "$tree" 20
expect_jq .state succeeded
api GET "/v1/jobs/$tree/nodes"
expect_status 200
expect_jq '[.nodes[].id] | join(" ")' "root a root.1 root.1.0 root.1.1"
expect_jq '[.nodes[].parent]' '[null,"root","root","root.1","root.1"]'
expect_jq '[.nodes[].type] | join(" ")' "sequence fetch list fetch fetch"
expect_jq '[.nodes[].state] | unique | join(",")' succeeded
expect_jq '[.nodes[].status]' '[null,200,null,200,200]'
expect_jq '[.nodes[] | select(.type == "fetch") | .attempts]' '[1,1,1]'
expect_jq '[.nodes[].recovered] | any' false
expect_jq '[.nodes[].error] | unique' '[null]'
expect_jq '[.nodes[] | has("result")] | any' false
expect_jq '.nodes[0] | keys | sort | join(",")' \
  "attempts,elapsed_ms,error,finished_at,id,parent,recovered,started_at,state,status,type"
expect_jq_true "[.nodes[] | .started_at, .finished_at | test(\"$ts_re\")] | all" "every node has both times"
expect_jq_true '[.nodes[].elapsed_ms | type == "number" and . >= 0] | all' "elapsed_ms are numbers"
api GET "/v1/jobs/$tree/nodes?include=result"
expect_status 200
expect_jq '[.nodes[] | has("result")] | all' true
expect_jq '.nodes[1].result.status' 200
expect_jq '.nodes[2].result | length' 2

step "one node, with its result (§1.2 fetch result)"
api GET "/v1/jobs/$tree/nodes/a"
expect_status 200
expect_jq .id a
expect_jq .parent root
expect_jq .state succeeded
expect_jq '.result.status' 200
expect_jq '.result.body_encoding' json
expect_jq_true '.result.headers["content-type"] | startswith("application/json")' "lowercase content-type header"
expect_jq_true '[.result.headers | keys[] | . == ascii_downcase] | all' "header keys are lowercase"
expect_jq_true '.result.bytes > 0 and (.result.elapsed_ms | type == "number")' "bytes and elapsed_ms"
expect_jq '.result.url' "$UPSTREAM/json"
expect_jq '.result | keys | sort | join(",")' "body,body_encoding,bytes,elapsed_ms,headers,http_version,status,url"
direct_json="$(curl -sS --max-time 5 "$UPSTREAM/json")"
expect_jq '.result.body' "$(jq -c . <<<"$direct_json")"
api GET "/v1/jobs/$tree/nodes/root.1.0"
expect_status 200
expect_jq '.result.body_encoding' text
api GET "/v1/jobs/$tree/nodes/root.1.1"
expect_status 200
expect_jq '.result.body_encoding' base64
expect_jq '.result.bytes' 10
expect_jq '.result.body | @base64d | length' 10

step "raw body, with the upstream's content type"
curl -sS --max-time 5 -D "$TMP/direct.h" -o "$TMP/direct.text" "$UPSTREAM/text"
direct_ct="$(tr -d '\r' <"$TMP/direct.h" | awk 'tolower($1) == "content-type:" { sub(/^[^:]*:[ \t]*/, ""); print }')"
code="$(curl -sS --max-time 5 -o "$TMP/body.text" -D "$TMP/body.h" -w '%{http_code}' "$BASE/v1/jobs/$tree/nodes/root.1.0/body")"
[ "$code" = 200 ] || fail "GET …/nodes/root.1.0/body answered $code"
body_ct="$(tr -d '\r' <"$TMP/body.h" | awk 'tolower($1) == "content-type:" { sub(/^[^:]*:[ \t]*/, ""); print }')"
[ "$body_ct" = "$direct_ct" ] || fail "raw body content type '$body_ct', upstream sent '$direct_ct'"
cmp -s "$TMP/direct.text" "$TMP/body.text" || fail "raw body differs from what the upstream sends for /text"
code="$(curl -sS --max-time 5 -o "$TMP/body.bin" -w '%{http_code}' "$BASE/v1/jobs/$tree/nodes/root.1.1/body")"
[ "$code" = 200 ] || fail "GET …/nodes/root.1.1/body answered $code"
[ "$(wc -c <"$TMP/body.bin")" -eq 10 ] || fail "raw body of /bytes/10 is $(wc -c <"$TMP/body.bin") bytes"
code="$(curl -sS --max-time 5 -o "$TMP/body.json" -w '%{http_code}' "$BASE/v1/jobs/$tree/nodes/a/body")"
[ "$code" = 200 ] || fail "GET …/nodes/a/body answered $code"
[ "$(cat "$TMP/body.json")" = "$direct_json" ] || fail "raw body of /json is not the upstream's bytes"

# ------------------------------------------------------------------ cancel
step "cancel a running job: 202, transfers aborted, every node cancelled"
ustats_reset
submit "{\"graph\":{\"type\":\"list\",\"children\":[
          {\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"},
          {\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"},
          {\"type\":\"sequence\",\"children\":[
             {\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"},
             {\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}]}]}}"
doomed="$JOB_ID"
wait_nodes_state "$doomed" running root.0 root.1 root.2.0
wait_upstream '.max_active >= 3'
api POST "/v1/jobs/$doomed/cancel"
expect_status 202
expect_jq .id "$doomed"
wait_settled "$doomed" 10
expect_jq .state cancelled
expect_jq .error.kind cancelled
api GET "/v1/jobs/$doomed/nodes"
expect_status 200
expect_jq '[.nodes[].state] | unique | join(",")' cancelled
expect_jq '[.nodes[].error.kind] | unique | join(",")' cancelled
expect_jq '.nodes[] | select(.id == "root.2.1") | .started_at' null
fetch_job "$doomed"
expect_jq '.progress.cancelled' 6
wait_upstream '(.disconnects | length) >= 3'

step "cancel again: 200"
api POST "/v1/jobs/$doomed/cancel"
expect_status 200
expect_jq .state cancelled

step "cancel a succeeded job: 409"
api POST "/v1/jobs/$first/cancel"
expect_api_error 409 conflict
fetch_job "$first"
expect_jq .state succeeded

# ------------------------------------------------------------------ delete
step "delete: 409 while running, 204 once settled, 404 after"
api DELETE "/v1/jobs/$hanging"
expect_api_error 409 conflict
api POST "/v1/jobs/$hanging/cancel"
expect_status 202
wait_settled "$hanging" 10
api DELETE "/v1/jobs/$hanging"
expect_status 204
[ -z "$RESP" ] || fail "204 with a body: $RESP"
api GET "/v1/jobs/$hanging"
expect_api_error 404 not_found
api GET "/v1/jobs/$hanging/nodes"
expect_api_error 404 not_found
api DELETE "/v1/jobs/$hanging"
expect_api_error 404 not_found
api DELETE "/v1/jobs/$first"
expect_status 204
api GET /v1/jobs
expect_jq "[.jobs[].id | select(. == \"$first\" or . == \"$hanging\")] | length" 0

# ------------------------------------------------------------------ idempotency
step "Idempotency-Key: same key and body → 200 and the same job; other bytes, even only other whitespace → 409"
key="tour-$(millis)"
body="{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
api POST /v1/jobs "$body" -H "Idempotency-Key: $key"
expect_status 201
idem="$(jget .id)"
api POST /v1/jobs "$body" -H "Idempotency-Key: $key"
expect_status 200
expect_jq .id "$idem"
api POST /v1/jobs "{\"graph\": {\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}" -H "Idempotency-Key: $key"
expect_api_error 409 conflict
api POST /v1/jobs "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/text\"}}" -H "Idempotency-Key: $key"
expect_api_error 409 conflict
api POST /v1/jobs "$body" -H "Idempotency-Key: other-$key"
expect_status 201
[ "$(jget .id)" != "$idem" ] || fail "another key gave the same job"
api GET "/v1/jobs?limit=500"
expect_jq "[.jobs[].id | select(. == \"$idem\")] | length" 1

step "HEAD works where GET does"
api HEAD "/v1/jobs/$idem"
expect_status 200
expect_header Date '.'
api HEAD /v1/jobs
expect_status 200

log "ok"
