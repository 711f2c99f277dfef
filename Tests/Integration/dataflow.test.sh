#!/usr/bin/env bash
# Data flow between nodes (API.md §6): a job's input, $ref / $concat / $literal,
# query, select, the request shown on a node, the error kinds ref_unresolved,
# ref_type and invalid_url from real runs, and every 422 of §6.2 with its path.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

start_upstream
start_server

# ------------------------------------------------------------------ login → token
step "log in, then use the token: the contract's example against the fixture"
read -r -d '' body <<EOF || true
{"input": {"user": "ann"},
 "graph": {"type": "sequence", "children": [
   {"id": "login", "type": "fetch", "method": "POST", "url": "$UPSTREAM/login",
    "json": {"user": {"\$ref": "/input/user"}}, "select": "/body"},
   {"id": "me", "type": "fetch", "url": "$UPSTREAM/me",
    "headers": {"Authorization": {"\$concat": ["Bearer ", {"\$ref": "/nodes/login/result/token"}]}}}
 ]}}
EOF
submit "$body"
login_job="$JOB_ID"
expect_jq .input.user ann
wait_settled "$login_job" 20
expect_jq .state succeeded
expect_jq .input '{"user":"ann"}'
expect_jq '.result[0]' '{"token":"tok-ann","user":"ann"}'
expect_jq '.result[1].status' 200
expect_jq '.result[1].body.user' ann
expect_node "$login_job" login .result.token tok-ann

step "a fetch shows the request it sent, credentials masked"
api GET "/v1/jobs/$login_job/nodes/me"
expect_status 200
expect_jq .request.method GET
expect_jq .request.url "$UPSTREAM/me"
expect_jq .request.headers.Authorization '***'
api GET "/v1/jobs/$login_job/nodes/login"
expect_jq .request.method POST
expect_jq '.request.headers["Content-Type"]' application/json
expect_jq_true '.request | has("body") | not' "the body is not shown"
api GET "/v1/jobs/$login_job/nodes"
expect_jq '[.nodes[] | select(.id == "me") | .request.headers.Authorization][0]' '***'
expect_jq '[.nodes[] | select(.id == "root") | has("request")][0]' false

step "without the token the same fetch is refused upstream (the token really was sent)"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/me\"}}"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.status 401

# ------------------------------------------------------------------ select, query, url parts
step "select narrows a result; query and url parts are encoded, in order"
read -r -d '' body <<EOF || true
{"input": {"path": "a b/../c?d#e", "q": "x&y=z", "n": 2.50},
 "graph": {"type": "sequence", "children": [
   {"id": "ids", "type": "fetch", "url": "$UPSTREAM/ids", "query": {"n": 4}, "select": "/body/ids"},
   {"id": "echo", "type": "fetch",
    "url": {"\$concat": ["$UPSTREAM/echo/", {"\$ref": "/input/path"}, "/", {"\$ref": "/nodes/ids/result/3"}]},
    "query": {"q": {"\$ref": "/input/q"}, "n": {"\$ref": "/input/n"}, "t": true,
              "missing": {"\$ref": "/input/none", "default": "d"}},
    "select": "/body"}
 ]}}
EOF
submit "$body"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq '.result[0]' '[1,2,3,4]'
expect_jq '.result[1].path' '/echo/a%20b%2F..%2Fc%3Fd%23e/4'
expect_jq '.result[1].query' 'q=x%26y%3Dz&n=2.50&t=true&missing=d'

step "a whole-value \$ref in json keeps the type; \$literal sends a \$ref object as is"
read -r -d '' body <<EOF || true
{"input": {"obj": {"a": [1, 2.0, null]}},
 "graph": {"type": "sequence", "children": [
   {"id": "first", "type": "fetch", "url": "$UPSTREAM/json"},
   {"id": "post", "type": "fetch", "method": "POST", "url": "$UPSTREAM/echo", "select": "/body/body",
    "json": {"v": {"\$ref": "/input/obj"}, "s": {"\$ref": "/nodes/first/status"},
             "st": {"\$ref": "/nodes/first/state"}, "lit": {"\$literal": {"\$ref": "/x"}}}}
 ]}}
EOF
submit "$body"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
# The echo's body is the JSON text sent: numbers as written.
expect_jq '.result[1]' '{"v":{"a":[1,2.0,null]},"s":200,"st":"succeeded","lit":{"$ref":"/x"}}'

# ------------------------------------------------------------------ new error kinds
step "ref_unresolved: nothing at the pointer, and no request made"
read -r -d '' body <<EOF || true
{"graph": {"type": "sequence", "children": [
   {"id": "a", "type": "fetch", "url": "$UPSTREAM/json"},
   {"id": "b", "type": "fetch", "url": {"\$concat": ["$UPSTREAM/count/never-", {"\$ref": "/nodes/a/result/body/nope"}]}}]}}
EOF
submit "$body"
wait_settled "$JOB_ID" 20
expect_jq .state failed
expect_jq .error.kind ref_unresolved
expect_jq .error.node b
expect_jq_true '.error.message | contains("/nodes/a/result/body/nope") and contains("\"nope\"")' \
  "the message names the pointer and the missing segment"
[ "$(ustats '[.counters | keys[] | select(startswith("never-"))] | length')" = 0 ] || fail "a request was made"

step "ref_unresolved from select"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\", \"select\": \"/body/missing\"}}"
wait_settled "$JOB_ID" 20
expect_jq .error.kind ref_unresolved
expect_jq_true '.error.message | contains("select \"/body/missing\"")'

step "ref_type: an object where a string is needed; CR LF in a header value"
submit "{\"input\": {\"o\": {}}, \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\", \"query\": {\"x\": {\"\$ref\": \"/input/o\"}}}}"
wait_settled "$JOB_ID" 20
expect_jq .error.kind ref_type
submit "{\"input\": {\"h\": \"a\\r\\nX-Evil: 1\"}, \"graph\": {\"type\": \"fetch\", \"url\": \"$UPSTREAM/json\", \"headers\": {\"X\": {\"\$ref\": \"/input/h\"}}}}"
wait_settled "$JOB_ID" 20
expect_jq .error.kind ref_type

step "invalid_url: the finished url is checked like a submitted one"
submit "{\"input\": {\"scheme\": \"ftp\"}, \"graph\": {\"type\": \"fetch\", \"url\": {\"\$concat\": [{\"\$ref\": \"/input/scheme\"}, \"://127.0.0.1/x\"]}}}"
wait_settled "$JOB_ID" 20
expect_jq .error.kind invalid_url
expect_jq_true '.error.message | contains("scheme must be http or https")'

step "a recover value applies to a node that failed on a reference"
submit "{\"graph\": {\"type\": \"fetch\", \"url\": {\"\$concat\": [\"$UPSTREAM/x/\", {\"\$ref\": \"/input/x\"}]}, \"recover\": {\"fallback\": true}}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
expect_jq .result '{"fallback":true}'

# ------------------------------------------------------------------ 422s of §6.2
step "422 with the JSON Pointer of the expression"
# expect_422 BODY PATH MESSAGE_FRAGMENT
expect_422() {
  api POST /v1/jobs "$1"
  expect_api_error 422 invalid_graph
  expect_jq .error.path "$2"
  expect_jq_true ".error.message | contains(\"$3\")" "message mentions: $3"
}
f="\"type\": \"fetch\", \"url\": \"http://127.0.0.1:9/\""
seq_of() { echo "{\"graph\": {\"id\": \"s\", \"type\": \"sequence\", \"children\": [{\"id\": \"a\", $f}, $1, {\"id\": \"later\", $f}]}}"; }
expect_422 "{\"graph\": {$f, \"timeout_ms\": {\"\$ref\": \"/input/t\"}}}" /graph/timeout_ms "cannot stand here"
expect_422 "{\"graph\": {$f, \"id\": {\"\$ref\": \"/input/t\"}}}" /graph/id "cannot stand here"
expect_422 "{\"graph\": {$f, \"headers\": {\"\$ref\": \"/input/h\"}}}" /graph/headers "cannot stand here"
expect_422 "{\"graph\": {$f, \"json\": {\"\$ref\": \"input/x\"}}}" /graph/json "not a valid JSON Pointer"
expect_422 "{\"graph\": {$f, \"json\": {\"\$ref\": \"/other\"}}}" /graph/json "must start with /input or /nodes"
expect_422 "{\"graph\": {$f, \"json\": {\"\$ref\": \"/item/id\"}}}" /graph/json "outside a map template"
expect_422 "{\"graph\": {$f, \"json\": {\"\$ref\": \"/index\"}}}" /graph/json "outside a map template"
expect_422 "$(seq_of "{\"id\": \"b\", $f, \"json\": {\"\$ref\": \"/nodes/ghost/result\"}}")" \
  /graph/children/1/json 'reads node \"ghost\", which is not a node of this job'
expect_422 "$(seq_of "{\"id\": \"b\", $f, \"json\": {\"\$ref\": \"/nodes/b/result\"}}")" \
  /graph/children/1/json 'reads node \"b\", which is this node itself'
expect_422 "$(seq_of "{\"id\": \"b\", $f, \"json\": {\"\$ref\": \"/nodes/later/result\"}}")" \
  /graph/children/1/json 'which comes after node \"b\" in the sequence \"s\"'
expect_422 "$(seq_of "{\"id\": \"b\", $f, \"json\": {\"\$ref\": \"/nodes/s/result\"}}")" \
  /graph/children/1/json 'reads node \"s\", which contains node \"b\"'
expect_422 "$(seq_of "{\"id\": \"L\", \"type\": \"list\", \"children\": [{\"id\": \"p\", $f}, {\"id\": \"q\", $f, \"headers\": {\"A\": {\"\$concat\": [\"x\", {\"\$ref\": \"/nodes/p/status\"}]}}}]}")" \
  '/graph/children/1/children/1/headers/A/$concat/1' 'runs alongside node \"q\" in the list \"L\"'
expect_422 "$(seq_of "{\"id\": \"L\", \"type\": \"list\", \"recover\": {\"\$ref\": \"/nodes/p/error\"}, \"children\": [{\"id\": \"p\", $f}]}")" \
  /graph/children/1/recover 'reads node \"p\", which is inside node \"L\"'
expect_422 "{\"graph\": {$f, \"select\": \"body\"}}" /graph/select "must be a JSON Pointer"
expect_422 "{\"graph\": {$f, \"query\": {\"a\": [1]}}}" /graph/query/a "must be a string, number, boolean or expression"
big="$(head -c 70000 /dev/zero | tr '\0' x)"
expect_422 "{\"input\": \"$big\", \"graph\": {$f}}" /input "64 KiB"

# ------------------------------------------------------------------ restart
step "a fetch in flight at kill -9 sends the same request after the restart"
key="slow-$RANDOM"
read -r -d '' body <<EOF || true
{"input": {"x": "a/b"},
 "graph": {"type": "sequence", "children": [
   {"id": "login", "type": "fetch", "method": "POST", "url": "$UPSTREAM/login", "json": {"user": "bo"}, "select": "/body"},
   {"id": "slow", "type": "fetch", "url": {"\$concat": ["$UPSTREAM/count/$key?delay_ms=3000&x=", {"\$ref": "/input/x"}]},
    "headers": {"Authorization": {"\$concat": ["Bearer ", {"\$ref": "/nodes/login/result/token"}]}}}]}}
EOF
submit "$body"
slow_job="$JOB_ID"
wait_nodes_state "$slow_job" running slow
before="$(node_field "$slow_job" slow .request)"
[ "$(jq -r .url <<<"$before")" = "$UPSTREAM/count/$key?delay_ms=3000&x=a%2Fb" ] || fail "request before the kill: $before"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
start_server_on "$SERVER_DB"
wait_settled "$slow_job" 30
expect_jq .state succeeded
after="$(node_field "$slow_job" slow .request)"
[ "$before" = "$after" ] || fail "the request changed across the restart: $before then $after"
[ "$(upstream_count "$key")" -ge 2 ] || fail "the fetch did not run again after the restart"

log "all data-flow checks passed"
