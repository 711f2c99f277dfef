#!/usr/bin/env bash
# Paginated fetches (API.md §7.2): a 3-page Link pagination, each `next` kind,
# truncated at max_pages, cross_origin from a real request, retries per page,
# max_bytes over the sum of pages, a 422 per bad field with its path, and
# kill -9 while a paginate node is on its 3rd page: after the restart it starts
# again from the first page and ends with the same result as an uninterrupted run.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
start_server
MAIN_BASE="$BASE"

ids() { jq -nc "[range(1; $1 + 1) | {id: .}]"; }

# ------------------------------------------------------------------ link
step "a 3-page Link pagination gathers every page's items, in order"
submit "{\"graph\": {\"id\": \"orders\", \"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/link?n=3&per=2&key=l3\",
  \"paginate\": {\"next\": \"link\", \"items\": \"/body\"}}}"
link_job="$JOB_ID"
wait_settled "$link_job" 20
expect_jq .state succeeded
expect_jq .result.items "$(ids 6)"
expect_jq .result.pages 3
expect_jq .result.truncated false
expect_jq .result.last.status 200
expect_jq .result.last.url "$UPSTREAM/pages/link?page=3&key=l3&n=3&per=2"
expect_jq '.result.last.headers["content-type"]' application/json
expect_jq '.result | keys_unsorted' '["items","pages","truncated","last"]'
api GET "/v1/jobs/$link_job/nodes/orders"
expect_jq .pages 3
expect_jq .attempts 3
expect_jq .status 200
expect_jq .request.url "$UPSTREAM/pages/link?n=3&per=2&key=l3"
[ "$(ustats '[.counters["l3:1"], .counters["l3:2"], .counters["l3:3"]]')" = "[1,1,1]" ] || fail "each page once"

step "without items the result holds each page's whole result"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/link?n=2&per=1&key=l2\", \"paginate\": {\"next\": \"link\"}}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq '.result | keys_unsorted' '["pages","truncated","results"]'
expect_jq .result.pages 2
expect_jq '[.result.results[].body]' '[[{"id":1}],[{"id":2}]]'
expect_jq '.result.results[0].status' 200

# ------------------------------------------------------------------ the other kinds
step "next URL in the body, relative to the page"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/url?n=3&per=2\",
  \"paginate\": {\"next\": {\"url\": \"/body/next\"}, \"items\": \"/body/items\"}}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result.items "$(ids 6)"
expect_jq .result.pages 3

step "cursor set as a query parameter of the first URL"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/cursor?n=4&per=1\",
  \"paginate\": {\"next\": {\"cursor\": \"/body/next_cursor\", \"param\": \"cursor\"}, \"items\": \"/body/data/items\"}}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result.items "$(ids 4)"
expect_jq .result.pages 4
expect_jq .result.last.url "$UPSTREAM/pages/cursor?n=4&per=1&cursor=c4"

step "page numbers counted up until an empty page; select narrows the result"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/number?n=3&per=2\",
  \"paginate\": {\"next\": {\"page\": \"page\", \"start\": 1}, \"items\": \"/body/items\"}, \"select\": \"/items\"}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result "$(ids 6)"
expect_node "$JOB_ID" root .pages 4

# ------------------------------------------------------------------ stops and failures
step "max_pages stops the walk without an error: truncated"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/link?n=5&per=1&key=tr\",
  \"paginate\": {\"next\": \"link\", \"items\": \"/body\", \"max_pages\": 2}}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result.truncated true
expect_jq .result.pages 2
expect_jq .result.items "$(ids 2)"
[ "$(ustats '.counters["tr:3"] // 0')" = 0 ] || fail "page 3 was fetched past max_pages"

step "a next URL on another origin fails with kind cross_origin, unless same_origin is false"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/cross?n=2&per=1\",
  \"paginate\": {\"next\": \"link\", \"items\": \"/body\"}}}"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind cross_origin
expect_jq_true '.error.message | contains("http://localhost:")' "the message names the other origin"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/cross?n=2&per=1\",
  \"paginate\": {\"next\": \"link\", \"items\": \"/body\", \"same_origin\": false}}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result.items "$(ids 2)"
expect_jq_true '.result.last.url | startswith("http://localhost:")'

step "each page gets the node's retries and counts in attempts"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/link?n=3&per=1&fail=2&key=rt\", \"retries\": 2,
  \"retry_backoff_ms\": 10, \"paginate\": {\"next\": \"link\", \"items\": \"/body\"}}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result.items "$(ids 3)"
expect_node "$JOB_ID" root .attempts 4

step "max_bytes bounds the sum of all pages"
# Each page of per=2 is 19 bytes: two pages fit in 40, three do not.
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/link?n=3&per=2&key=mb\", \"max_bytes\": 40,
  \"paginate\": {\"next\": \"link\", \"items\": \"/body\"}}}"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind too_large
expect_jq_true '.error.message | contains("max_bytes bounds the sum")'

step "every page is checked against --deny-cidr: a next page on a denied address fails before connecting"
main_db="$SERVER_DB"
main_pid="$SERVER_PID"
main_port="$SERVER_PORT"
start_server --deny-cidr 127.0.0.2/32
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/url?n=2&per=1&next_host=127.0.0.2&key=dn\",
  \"paginate\": {\"next\": {\"url\": \"/body/next\"}, \"items\": \"/body/items\", \"same_origin\": false}}}"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind connect
expect_jq_true '.error.message | contains("127.0.0.2") and contains("denied")' "the message says the address is denied"
expect_node "$JOB_ID" root .pages 1
stop_server "$SERVER_PID"
SERVER_PID="$main_pid"
SERVER_DB="$main_db"
SERVER_PORT="$main_port"
BASE="$MAIN_BASE"

# ------------------------------------------------------------------ 422s
step "422 with the JSON Pointer of every bad paginate field"
expect_422() {
  api POST /v1/jobs "$1"
  expect_api_error 422 invalid_graph
  expect_jq .error.path "$2"
  expect_jq_true ".error.message | contains(\"$3\")" "message mentions: $3"
}
f="\"type\": \"fetch\", \"url\": \"http://127.0.0.1:9/\""
expect_422 "{\"graph\": {$f, \"method\": \"POST\", \"paginate\": {\"next\": \"link\"}}}" /graph/paginate "only for GET and HEAD"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": \"link\", \"max_pages\": 0}}}" /graph/paginate/max_pages "from 1 to 1000"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": \"link\", \"max_pages\": 1001}}}" /graph/paginate/max_pages "from 1 to 1000"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": \"link\", \"items\": \"body\"}}}" /graph/paginate/items "JSON Pointer"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": {\"url\": \"next\"}}}}" /graph/paginate/next/url "JSON Pointer"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": \"offset\"}}}" /graph/paginate/next "unknown next kind"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": {\"offset\": \"/x\"}}}}" /graph/paginate/next "unknown next kind"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": {\"cursor\": \"/c\", \"param\": \"\"}}}}" /graph/paginate/next/param "query parameter name"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": {\"page\": \"p\"}}}}" /graph/paginate/next "needs items"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": {\"page\": \"p\", \"start\": -1}, \"items\": \"/body\"}}}" /graph/paginate/next/start "from 0"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": \"link\", \"same_origin\": \"yes\"}}}" /graph/paginate/same_origin "boolean"
expect_422 "{\"graph\": {$f, \"paginate\": {\"next\": \"link\", \"limit\": 3}}}" /graph/paginate/limit "unknown field"
expect_422 "{\"graph\": {$f, \"paginate\": {}}}" /graph/paginate/next "is required"
expect_422 "{\"graph\": {$f, \"paginate\": \"link\"}}" /graph/paginate "must be an object"
expect_422 "{\"graph\": {\"type\": \"list\", \"children\": [{$f}], \"paginate\": {\"next\": \"link\"}}}" /graph/paginate "unknown field"

# ------------------------------------------------------------------ kill -9 on page 3
step "kill -9 while on the 3rd page; after the restart the walk starts again and ends the same"
ustats_reset
submit "{\"graph\": {\"id\": \"walk\", \"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/link?n=4&per=2&key=k9&slow=3&slow_ms=2500\",
  \"paginate\": {\"next\": \"link\", \"items\": \"/body\"}}}"
k9_job="$JOB_ID"
wait_upstream '(.counters["k9:3"] // 0) >= 1' 15
api GET "/v1/jobs/$k9_job/nodes/walk"
expect_jq .state running
expect_jq .pages 2
expect_node "$k9_job" walk .pages 2
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
start_server_on "$SERVER_DB"
wait_settled "$k9_job" 30
expect_jq .state succeeded
expect_jq .result.items "$(ids 8)"
expect_jq .result.pages 4
expect_jq .result.truncated false
k9_result="$(jget '.result | del(.last.headers.date)')"
[ "$(ustats '.counters["k9:1"]')" = 2 ] || fail "page 1 was not fetched again after the restart"
# The same walk, uninterrupted, gives the same result.
submit "{\"graph\": {\"id\": \"walk\", \"type\": \"fetch\", \"url\": \"$UPSTREAM/pages/link?n=4&per=2&key=k9&slow=3&slow_ms=2500\",
  \"paginate\": {\"next\": \"link\", \"items\": \"/body\"}}}"
wait_settled "$JOB_ID" 30
[ "$(jget '.result | del(.last.headers.date)')" = "$k9_result" ] || fail "the interrupted run's result differs"

log "all paginate checks passed"
