#!/usr/bin/env bash
# The per-job response byte budget (--max-job-bytes): the fetch whose bytes take the job over it fails with
# too_large and a message naming the budget and the flag, the fetches before it keep their results, fetches in
# parallel never hold more than the budget together, a restarted job counts its stored results, and 0 lets
# everything through. The server's budget (--max-response-memory), which every job's draws on, bounds what all jobs
# in memory hold together.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
budget=1048576
size=307200 # 300 KiB: three fit in 1 MiB, a fourth does not

fetch() { printf '{"type":"fetch","url":"%s%s"}' "$UPSTREAM" "$1"; }
big() { fetch "/bytes/$size${1:-}"; }

start_server --max-job-bytes 1MiB

step "sequence: the fourth 300 KiB fetch crosses the 1 MiB budget and fails too_large; the three before keep their results"
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[$(big),$(big),$(big),$(big),$(big)]}}"
wait_settled "$JOB_ID"
expect_jq .state failed
expect_jq .error.kind too_large
expect_jq .error.node root.3
expect_jq_true ".error.message | contains(\"budget of $budget bytes\") and contains(\"--max-job-bytes\")"
api GET "/v1/jobs/$JOB_ID/nodes?include=result"
expect_status 200
expect_jq '[.nodes[1:][].state] | join(",")' succeeded,succeeded,succeeded,failed,skipped
expect_jq '[.nodes[1,2,3].result.bytes] | unique' "[$size]"
expect_jq '.nodes[4].error.kind' too_large

step "the same with chunked bodies (no Content-Length): counted as the bytes arrive"
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[$(big '?chunked=1'),$(big '?chunked=1'),$(big '?chunked=1'),$(big '?chunked=1')]}}"
wait_settled "$JOB_ID"
expect_jq .state failed
expect_jq .error.node root.3
expect_jq_true ".error.message | contains(\"budget of $budget bytes\")"

step "a list of 6 in parallel: what succeeds fits in the budget, every other fetch is too_large"
submit "{\"graph\":{\"type\":\"list\",\"consume_errors\":true,\"children\":[$(big '?chunked=1'),$(big),$(big '?chunked=1'),$(big),$(big '?chunked=1'),$(big)]}}"
wait_settled "$JOB_ID"
api GET "/v1/jobs/$JOB_ID/nodes?include=result"
expect_status 200
ok="$(jq '[.nodes[1:][] | select(.state == "succeeded")] | length' <<<"$RESP")"
[ "$ok" -ge 1 ] && [ $((ok * size)) -le "$budget" ] || fail "$ok fetches of $size bytes succeeded under a $budget-byte budget"
expect_jq '[.nodes[1:][] | select(.state != "succeeded") | .error.kind] | unique' '["too_large"]'

step "after kill -9, the stored results count: the job resumes with 600 KiB held, and its third 300 KiB fetch crosses"
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[$(big),$(big),$(fetch /delay/3000),$(big),$(big)]}}"
job="$JOB_ID"
wait_nodes_state "$job" running root.2
db="$SERVER_DB"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
start_server_on "$db" --max-job-bytes 1MiB
wait_settled "$job"
expect_jq .state failed
expect_jq .error.node root.4
expect_jq_true ".error.message | contains(\"budget of $budget bytes\")"

step "--max-job-bytes 0: no budget, every fetch succeeds"
stop_server "$SERVER_PID"
start_server --max-job-bytes 0
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[$(big),$(big),$(big),$(big),$(big)]}}"
wait_settled "$JOB_ID"
expect_jq .state succeeded
expect_jq '[.result[].bytes] | unique' "[$size]"

step "coalesced fetches: a joiner's shared answer counts against its own job when it is handed over"
one="$(curl -sS --max-time 5 "$UPSTREAM/delay/400" | wc -c)"
stop_server "$SERVER_PID"
start_server --max-job-bytes $((one + one / 2))
shared='{"type":"fetch","url":"'"$UPSTREAM"'/delay/400","coalesce":true}'
submit "{\"graph\":{\"type\":\"list\",\"consume_errors\":true,\"children\":[$shared,$shared,$shared]}}"
wait_settled "$JOB_ID"
api GET "/v1/jobs/$JOB_ID/nodes?include=result"
expect_status 200
expect_jq '[.nodes[1:][] | select(.state == "succeeded")] | length' 1
expect_jq '[.nodes[1:][] | select(.state == "failed") | .error.kind] | join(",")' too_large,too_large

step "pages count too: the page that takes the job over its budget fails the node too_large, naming the budget"
page="$(curl -sS --max-time 5 "$UPSTREAM/pages/link?n=5&per=2&key=bp&page=1" | wc -c)"
stop_server "$SERVER_PID"
start_server --max-job-bytes $((page * 5 / 2))
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/pages/link?n=5&per=2&key=bp\",\"paginate\":{\"next\":\"link\",\"items\":\"/body\"}}}"
wait_settled "$JOB_ID"
expect_jq .state failed
expect_jq .error.kind too_large
expect_jq_true ".error.message | contains(\"budget of $((page * 5 / 2)) bytes\") and contains(\"page=3\")"

step "--max-response-memory: the jobs in memory hold it together; past it a fetch fails too_large naming the flag, and a job's bytes come back when it leaves memory"
memory() {
  api GET /metrics
  awk '$1 == "jobserver_response_memory_bytes" {print $2}' <<<"$RESP"
}
stop_server "$SERVER_PID"
start_server --max-job-bytes 0 --max-response-memory 1MiB
submit "{\"graph\":{\"type\":\"list\",\"children\":[$(big),$(big),$(big),$(fetch /delay/3000)]}}"
holder="$JOB_ID"
wait_nodes_state "$holder" succeeded root.0 root.1 root.2
[ "$(memory)" = $((3 * size)) ] || fail "the holder's 3 fetches are not what the server counts: $(memory)"
submit "{\"graph\":$(big)}"
wait_settled "$JOB_ID"
expect_jq .state failed
expect_jq .error.kind too_large
expect_jq_true ".error.message | contains(\"the server's $budget bytes\") and contains(\"--max-response-memory\")"
wait_settled "$holder"
expect_jq .state succeeded
# A settled job leaves memory once the store has committed its last states. A node's response body is read from
# the store, so it is answered after a commit of everything handed to the store before: that of both jobs' ends.
api GET "/v1/jobs/$holder/nodes/root.0/body"
expect_status 200
[ "$(memory)" = 0 ] || fail "the settled jobs still count $(memory) bytes against the server"
submit "{\"graph\":{\"type\":\"list\",\"children\":[$(big),$(big),$(big)]}}"
wait_settled "$JOB_ID"
expect_jq .state succeeded

step "the flag is refused when it is not a size"
out="$("$JOBSERVER_BIN" serve --max-job-bytes lots 2>&1 || true)"
grep -q -- '--max-job-bytes' <<<"$out" || fail "a bad --max-job-bytes was not named: $out"

log "PASS"
