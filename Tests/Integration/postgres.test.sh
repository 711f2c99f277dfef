#!/usr/bin/env bash
# The server on PostgreSQL (API.md §10, issue 12): a throwaway cluster from scripts/pg-cluster.sh, the server
# started with --db postgres://…; jobs submitted, read, long-polled, cancelled and deleted with curl; then
# kill -9 and a restart on the same database: once the dead server's leases expire (--lease-ttl 2s) the accepted
# jobs resume and finish, settled results are kept, cancels and deletes stay done. Also: a server that cannot
# reach its database exits non-zero with the reason. Several servers at once: Tests/Integration/scaleout.test.sh.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

use_pg_cluster

step "cluster"
start_pg_cluster
log "PostgreSQL at $url"

step "an unreachable database: exit non-zero with the reason"
dead_port="$(free_port)"
set +e
timeout 20 "$JOBSERVER_BIN" serve --host 127.0.0.1 --port 0 --db "postgres://jobserver@127.0.0.1:$dead_port/postgres" \
  >"$TMP/dead.log" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] && [ "$code" -ne 124 ] || fail "the server exited $code on an unreachable database"
grep -q "cannot connect to PostgreSQL" "$TMP/dead.log" || fail "no reason logged: $(tail -3 "$TMP/dead.log")"

start_upstream
start_server_on "$url" --lease-ttl 2s

step "submit, read, long-poll"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},\"metadata\":{\"n\":1}}"
done_id="$JOB_ID"
wait_settled "$done_id"
expect_jq .state succeeded
expect_jq .metadata.n 1
api GET "/v1/jobs/$done_id/nodes/root"
expect_status 200
expect_jq .state succeeded
done_result="$(jget .result)"
[ -n "$done_result" ] && [ "$done_result" != null ] || fail "no result stored"

step "idempotency key"
body="{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
api POST /v1/jobs "$body" -H 'Idempotency-Key: pg-key-1'
expect_status 201
keyed="$(jget .id)"
api POST /v1/jobs "$body" -H 'Idempotency-Key: pg-key-1'
expect_status 200 201
expect_jq .id "$keyed"

step "cancel and delete"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"}}"
cancel_id="$JOB_ID"
wait_state "$cancel_id" running
api POST "/v1/jobs/$cancel_id/cancel"
expect_status 202
wait_settled "$cancel_id"
expect_jq .state cancelled
api DELETE "/v1/jobs/$done_id"
expect_status 204
api GET "/v1/jobs/$done_id"
expect_status 404

step "a notify webhook, written by the outbox triggers: delivered on the second attempt"
: >"$TMP/hooks.log"
python3 Tests/Integration/webhook_receiver.py "$TMP/hooks.log" 127.0.0.1 >"$TMP/receiver.out" 2>&1 &
receiver_pid=$!
STARTED_PIDS+=("$receiver_pid")
await_listening "$TMP/receiver.out" "$receiver_pid"
receiver="$LISTENING_PORT"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},\"notify\":{\"url\":\"http://127.0.0.1:$receiver/fail/1\"}}"
hooked="$JOB_ID"
expect_jq .notify.state pending
wait_settled "$hooked"
wait_notify "$hooked" delivered 10
expect_jq .notify.attempts 2

step "listing"
api GET "/v1/jobs?state=cancelled"
expect_status 200
expect_jq '[.jobs[].id] | index("'"$cancel_id"'") != null' true

step "jobs in flight at kill -9"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
kept_id="$JOB_ID"
wait_settled "$kept_id"
kept_result="$(jget .result)"
slow=()
for i in 1 2 3; do
  submit "{\"graph\":{\"type\":\"sequence\",\"children\":[{\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/1500\"},{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}]}}"
  slow+=("$JOB_ID")
done
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true

step "restart on the same database: the jobs are taken over once the dead server's leases expire"
start_server_on "$url" --lease-ttl 2s
for id in "${slow[@]}"; do
  wait_settled "$id" 30
  expect_jq .state succeeded
done
fetch_job "$kept_id"
expect_jq .state succeeded
[ "$(jget .result)" = "$kept_result" ] || fail "the settled result changed across the restart"
fetch_job "$cancel_id"
expect_jq .state cancelled
api GET "/v1/jobs/$done_id"
expect_status 404
api GET /healthz
expect_status 200
log "ok"
