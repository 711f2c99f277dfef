#!/usr/bin/env bash
# Graceful shutdown and resume (API.md §4, §5): on SIGTERM an open long-poll
# gets a complete answer, no 201 is given any more, /healthz says 503, the
# server exits 0 within --shutdown-grace; started again on the same database,
# running jobs resume: settled nodes keep their results, idempotent fetches in
# flight run again, a non-idempotent one fails with kind interrupted.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

grace_s=2
start_upstream
start_server --shutdown-grace "${grace_s}s"
first_pid="$SERVER_PID"
db="$SERVER_DB"
k="shut$(millis)"

step "a running job with an idempotent fetch in flight, and one with a POST in flight"
submit "{\"name\":\"resumable\",\"graph\":{\"type\":\"sequence\",\"children\":[
          {\"id\":\"first\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/count/$k\"},
          {\"id\":\"slow\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/6000\"},
          {\"id\":\"last\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/text\"}]}}"
resumable="$JOB_ID"
submit "{\"name\":\"not-idempotent\",\"graph\":{\"id\":\"post\",\"type\":\"fetch\",\"method\":\"POST\",
          \"url\":\"$UPSTREAM/delay/6000\",\"body\":\"x\"}}"
posting="$JOB_ID"
wait_nodes_state "$resumable" running slow
wait_nodes_state "$posting" running post
expect_node "$resumable" first .state succeeded
first_result="$(node_field "$resumable" first .result)"
[ "$(upstream_count "$k")" = 1 ] || fail "the first fetch was sent $(upstream_count "$k") times"

step "an open long-poll on the running job"
fetch_job "$resumable"
version="$(jget .version)"
curl -sS --max-time 40 --trace-ascii "$TMP/poll.trace" -o "$TMP/poll.body" -w '%{http_code}' \
  "$BASE/v1/jobs/$resumable?wait=30&since=$version" >"$TMP/poll.status" 2>"$TMP/poll.err" &
poll_pid=$!
STARTED_PIDS+=("$poll_pid")
# The poll must wait in the server before the signal. Only /metrics tells (jobserver_long_polls_waiting), and
# nothing announces it: it is read once curl has sent the request (the server takes a request in as it arrives),
# and read again at once, a bounded number of times, should it have been read before that.
next_line "$TMP/poll.trace" 0 10 "$poll_pid" '^=> Send header' >/dev/null \
  || fail "curl did not send the long-poll: $(cat "$TMP/poll.err")"
waiting=0
for ((i = 0; i < 50 && waiting < 1; i++)); do
  api GET /metrics
  expect_status 200
  waiting="$(awk '$1 == "jobserver_long_polls_waiting" { print $2 }' <<<"$RESP")"
done
[ "${waiting:-0}" -ge 1 ] || fail "the long-poll is not waiting in the server (jobserver_long_polls_waiting ${waiting:-missing})"
kill -0 "$poll_pid" 2>/dev/null || fail "the long-poll answered before any change: $(cat "$TMP/poll.status")"

step "SIGTERM"
from="$(file_size "$SERVER_LOG")"
t0="$(millis)"
kill -TERM "$first_pid"

step "from the moment shutdown begins: /healthz 503, no 201"
next_line "$SERVER_LOG" "$from" 10 "$first_pid" '"msg":"shutting down"' >/dev/null \
  || fail "the server did not log 'shutting down' within 10 s of SIGTERM"
health() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$BASE/healthz" 2>/dev/null || true; }
code="$(health)"
if [ "$code" = 200 ]; then
  # Asked between the line and the shutdown it announces: shutdown answers open long-polls once it refuses new
  # work, so after that answer it must hold.
  wait_gone "$poll_pid" 10 || fail "the long-poll is still open 10 s after SIGTERM"
  code="$(health)"
fi
case "$code" in
  503)
    api POST /v1/jobs "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
    expect_status 503 000
    if [ "$STATUS" = 503 ]; then expect_jq .error.code shutting_down; fi
    ;;
  000 | "") log "the server stopped listening before /healthz could be asked (allowed)" ;;
  *) fail "/healthz answered $code once shutdown had begun" ;;
esac

step "the server exits 0 within the grace period"
limit_ms=$(( (grace_s + 3) * 1000 ))
wait_gone "$first_pid" $((grace_s + 3)) || fail "the server still runs $limit_ms ms after SIGTERM (grace ${grace_s}s)"
rc=0
wait "$first_pid" || rc=$?
t1="$(millis)"
[ "$rc" = 0 ] || fail "the server exited with status $rc after SIGTERM"
log "exited 0 after $((t1 - t0)) ms"

step "the long-poll got a complete answer"
wait_gone "$poll_pid" 10 || fail "the long-poll is still open after the server exited"
poll_rc=0
wait "$poll_pid" || poll_rc=$?
[ "$poll_rc" = 0 ] || fail "the long-poll failed (curl $poll_rc): $(cat "$TMP/poll.err")"
[ "$(cat "$TMP/poll.status")" = 200 ] || fail "the long-poll answered $(cat "$TMP/poll.status")"
RESP="$(cat "$TMP/poll.body")"
LAST_REQUEST="GET /v1/jobs/$resumable?wait=30&since=$version (during shutdown)"
expect_jq .id "$resumable"
expect_jq_true '.version >= '"$version" "a job object"

step "restart on the same database: the job resumes and settles"
start_server_on "$db" --shutdown-grace "${grace_s}s"
fetch_job "$resumable"
expect_jq .name resumable
wait_settled "$resumable" 30
expect_jq .state succeeded
expect_jq '.result | length' 3
expect_node "$resumable" first .state succeeded
expect_node "$resumable" first .attempts 1
expect_node "$resumable" first .result "$first_result"
[ "$(upstream_count "$k")" = 1 ] || fail "the settled first fetch ran again after the restart"
expect_node "$resumable" slow .state succeeded
expect_node "$resumable" last .state succeeded

step "the non-idempotent fetch that was in flight failed with kind interrupted"
wait_settled "$posting" 30
expect_jq .state failed
expect_jq .error.kind interrupted
expect_node "$posting" post .error.kind interrupted

step "a second graceful stop, idle: exit 0"
stop_server "$SERVER_PID" $((grace_s + 5))
[ "$SERVER_EXIT" = 0 ] || fail "the idle server's exit after SIGTERM: $SERVER_EXIT"

log "ok"
