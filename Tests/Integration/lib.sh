# shellcheck shell=bash
# Globals (BASE, SERVER_*, JOB_ID, …) are read by the scripts that source this.
# shellcheck disable=SC2034
# Helpers for the curl-driven integration scripts (Tests/Integration/*.test.sh).
# Sourced, never run. Builds nothing: it runs $JOBSERVER_BIN (default
# .build/debug/jobserver) and the fixture upstream Tests/Fixtures/upstream.py,
# both on 127.0.0.1 only, in a temp dir removed on exit.
#
#   source "$(dirname "$0")/lib.sh"
#   start_upstream              # sets UPSTREAM=http://127.0.0.1:PORT
#   start_server [FLAGS...]     # sets BASE, SERVER_PID, SERVER_DB, SERVER_LOG
#   api POST /v1/jobs "$json"   # sets STATUS, RESP; headers in $HDRS
#   expect_status 201
#   expect_jq .state running
#
# Every wait is bounded in time and in count; every failure prints what was
# expected, the last request and its answer, and the tail of the server log.

set -euo pipefail
# A failing command inside $(…) fails the assignment, and so the script.
shopt -s inherit_errexit

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REPO_ROOT="$(pwd)"
TEST_NAME="$(basename "$0" .sh)"
JOBSERVER_BIN="${JOBSERVER_BIN:-.build/debug/jobserver}"
case "$JOBSERVER_BIN" in /*) ;; *) JOBSERVER_BIN="$REPO_ROOT/$JOBSERVER_BIN" ;; esac
UPSTREAM_SCRIPT="${UPSTREAM_SCRIPT:-Tests/Fixtures/upstream.py}"
# A long-poll may take up to 60 s; no single request may take longer than this.
API_MAX_TIME="${API_MAX_TIME:-70}"

for tool in curl jq python3; do
  command -v "$tool" >/dev/null || { echo "FAIL $TEST_NAME: $tool is required" >&2; exit 1; }
done
if [ ! -x "$JOBSERVER_BIN" ]; then
  echo "FAIL $TEST_NAME: $JOBSERVER_BIN is not an executable (build it first, or set JOBSERVER_BIN)" >&2
  exit 1
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/jobserver-it.XXXXXX")"
HDRS="$TMP/last.headers"
STATUS=""
RESP=""
LAST_REQUEST=""
AUTH_TOKEN=""
UPSTREAM=""
UPSTREAM_PID=""
BASE=""
SERVER_PID=""
SERVER_DB=""
SERVER_LOG=""
SERVER_PORT=""
SERVER_ARGS=()
STARTED_PIDS=()
SERVER_SEQ=0

# ---------------------------------------------------------------- reporting

log() { printf '[%s] %s\n' "$TEST_NAME" "$*"; }
step() { printf '[%s] -- %s\n' "$TEST_NAME" "$*"; }

# Prints the failure with context and exits 1 (the EXIT trap cleans up).
fail() {
  {
    printf 'FAIL %s: %s\n' "$TEST_NAME" "$*"
    if [ -n "$LAST_REQUEST" ]; then
      printf '  last request: %s -> %s\n' "$LAST_REQUEST" "$STATUS"
      printf '  last answer:  %.2000s\n' "$RESP"
    fi
    if [ -n "$SERVER_LOG" ] && [ -f "$SERVER_LOG" ]; then
      printf '  server log (%s), last lines:\n' "$SERVER_LOG"
      tail -n 25 "$SERVER_LOG" | sed 's/^/    /'
    fi
  } >&2
  exit 1
}

# ---------------------------------------------------------------- processes

# wait_gone PID SECONDS: waits until process PID has ended, at most SECONDS; status 1 if it still runs then.
# Woken by the process's pidfd (Linux 5.3, Python 3.9), so it works for any process, our child or not; a child
# is still to be reaped with `wait`.
wait_gone() {
  python3 - "$1" "$2" <<'PY'
import os, select, sys
try:
    pidfd = os.pidfd_open(int(sys.argv[1]))
except ProcessLookupError:
    sys.exit(0)
sys.exit(0 if select.select([pidfd], [], [], float(sys.argv[2]))[0] else 1)
PY
}

# Stops one process we started: SIGTERM, up to $2 seconds for it to end, then SIGKILL.
_stop_pid() {
  local pid="$1" grace="${2:-5}"
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  wait_gone "$pid" "$grace" || kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

_cleanup() {
  local rc=$? pid
  if [ -n "$FOLLOW_PID" ]; then kill "$FOLLOW_PID" 2>/dev/null || true; fi
  for pid in "${STARTED_PIDS[@]+"${STARTED_PIDS[@]}"}"; do
    _stop_pid "$pid" 5
  done
  if [ "${KEEP_TMP:-0}" = 1 ] || { [ "$rc" -ne 0 ] && [ "${KEEP_TMP_ON_FAILURE:-0}" = 1 ]; }; then
    echo "[$TEST_NAME] kept $TMP" >&2
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap _cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A TCP port free on 127.0.0.1 right now (the kernel's choice).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# file_size FILE: its size in bytes, 0 if it does not exist.
file_size() {
  stat -c %s "$1" 2>/dev/null || echo 0
}

# follow FILE FROM SECONDS PID COMMAND [ARGS...]: runs COMMAND (in this shell: a function may set variables) with
# FILE on its standard input, from byte FROM (0: the start) on, then each write to it as it happens (GNU tail -F,
# woken by inotify: nothing polls), until COMMAND exits; COMMAND's status is follow's. The input ends after
# SECONDS (at least 1), or once process PID (if not empty) has ended and the file is read to its end. FILE need
# not exist yet.
FOLLOW_PID=""
follow() {
  local file="$1" from="$2" limit="$3" pid="$4" input status=0
  shift 4
  [ "$limit" -ge 1 ] || limit=1
  exec {input}< <(exec timeout "$limit" tail -c +"$((from + 1))" -F ${pid:+--pid="$pid"} -- "$file" 2>/dev/null)
  FOLLOW_PID=$!
  "$@" <&"$input" || status=$?
  exec {input}<&-
  kill "$FOLLOW_PID" 2>/dev/null || true
  FOLLOW_PID=""
  return "$status"
}

# next_line FILE FROM SECONDS PID REGEX [COUNT]: prints the first COUNT (default 1) lines of FILE past byte FROM
# that match REGEX (grep -E), as soon as they are written; status 1 if fewer did within SECONDS, or before process
# PID (if not empty) ended.
next_line() {
  local count="${6:-1}" lines
  lines="$(follow "$1" "$2" "$3" "$4" grep -E -m "$count" -- "$5")" || return 1
  [ "$(grep -c '' <<<"$lines")" -ge "$count" ] || return 1
  printf '%s\n' "$lines"
}

# until_logged REGEX SECONDS COMMAND [ARGS...]: runs COMMAND, then again after each new line of the server's log
# ($SERVER_LOG) that matches REGEX (grep -E), until it succeeds; status 1 if it has not within SECONDS (or the
# server ended). For a state the server logs a line about when it changes.
until_logged() {
  local regex="$1" limit="$2" from
  shift 2
  from="$(file_size "$SERVER_LOG")"
  "$@" </dev/null && return 0
  follow "$SERVER_LOG" "$from" "$limit" "$SERVER_PID" _run_on_lines "$regex" "$@"
}
_run_on_lines() {
  local regex="$1" line
  shift
  while IFS= read -r line; do
    if [[ $line =~ $regex ]] && "$@" </dev/null; then return 0; fi
  done
  return 1
}

# await_listening OUT PID: waits (at most 10 s) for process PID, whose stdout goes to OUT, to print its first line
# `listening <port>`; sets LISTENING_PORT. Fails if the process ends first.
LISTENING_PORT=""
await_listening() {
  local line
  line="$(next_line "$1" 0 10 "$2" '^listening [0-9]+')" \
    || fail "process $2 did not print 'listening <port>' within 10 s, or ended: $(head -c 2000 "$1")"
  line="${line#listening }"
  LISTENING_PORT="${line%% *}"
}

# Starts the fixture upstream on a port of its choosing; its first stdout line
# is `listening <port>`. Sets UPSTREAM and UPSTREAM_PID.
start_upstream() {
  local out="$TMP/upstream.out"
  [ -f "$UPSTREAM_SCRIPT" ] || fail "fixture $UPSTREAM_SCRIPT is missing"
  python3 "$UPSTREAM_SCRIPT" --port 0 >"$out" 2>"$TMP/upstream.err" &
  UPSTREAM_PID=$!
  STARTED_PIDS+=("$UPSTREAM_PID")
  await_listening "$out" "$UPSTREAM_PID"
  UPSTREAM="http://127.0.0.1:$LISTENING_PORT"
  log "upstream at $UPSTREAM"
}

# start_server_on DB [FLAGS...]: starts jobserver with that database on a loopback port the kernel picks (--port 0)
# and waits (up to 20 s) for its log line `listening`, which names the port. Sets BASE, SERVER_PID, SERVER_PORT,
# SERVER_DB, SERVER_LOG, SERVER_ARGS.
start_server_on() {
  local db="$1" line
  shift
  SERVER_SEQ=$((SERVER_SEQ + 1))
  SERVER_DB="$db"
  SERVER_LOG="$TMP/server-$SERVER_SEQ.log"
  SERVER_ARGS=("$@")
  "$JOBSERVER_BIN" serve --host 127.0.0.1 --port 0 --db "$db" "$@" >>"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  STARTED_PIDS+=("$SERVER_PID")
  if ! line="$(next_line "$SERVER_LOG" 0 20 "$SERVER_PID" '"msg":"listening"')"; then
    kill -0 "$SERVER_PID" 2>/dev/null && fail "server did not log that it listens within 20 s"
    fail "server exited at start: $JOBSERVER_BIN serve --port 0 --db $db $*"
  fi
  SERVER_PORT="$(jq -r .port <<<"$line")"
  BASE="http://127.0.0.1:$SERVER_PORT"
  log "server $SERVER_SEQ at $BASE (pid $SERVER_PID)"
}

# start_server [FLAGS...]: like start_server_on, with a fresh database.
start_server() {
  local dir="$TMP/db-$((SERVER_SEQ + 1))"
  mkdir -p "$dir"
  start_server_on "$dir/jobserver.sqlite" "$@"
}

# stop_server PID [SECONDS]: SIGTERM, then waits up to SECONDS (default 15)
# for the exit. Sets SERVER_EXIT to its exit status (or "timeout": then it
# was killed).
SERVER_EXIT=""
stop_server() {
  local pid="$1" limit="${2:-15}"
  SERVER_EXIT=""
  kill -TERM "$pid" 2>/dev/null || { SERVER_EXIT="gone"; return 0; }
  if ! wait_gone "$pid" "$limit"; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    SERVER_EXIT="timeout"
    return 0
  fi
  SERVER_EXIT=0
  wait "$pid" 2>/dev/null || SERVER_EXIT=$?
}

# ---------------------------------------------------------------- requests

# api METHOD PATH [BODY [CURL_ARGS...]]
# Sends a request to $BASE (PATH may also be a full URL). A non-empty BODY is
# sent as application/json (an extra -H 'Content-Type: …' in CURL_ARGS wins
# over it). Sets STATUS (000 when no HTTP answer came), RESP, and $HDRS.
api() {
  local method="$1" path="$2" body="${3-}" url
  shift 2
  if [ $# -gt 0 ]; then shift; fi
  case "$path" in
    http://*|https://*) url="$path" ;;
    *) url="$BASE$path" ;;
  esac
  local args=(-sS -o "$TMP/last.body" -D "$HDRS" -w '%{http_code}' --max-time "$API_MAX_TIME")
  if [ "$method" = HEAD ]; then
    args+=(-I)
  else
    args+=(-X "$method")
  fi
  if [ -n "$AUTH_TOKEN" ]; then
    args+=(-H "Authorization: Bearer $AUTH_TOKEN")
  fi
  if [ -n "$body" ]; then
    local has_ct=0 a
    for a in "$@"; do
      case "${a,,}" in content-type:*) has_ct=1 ;; esac
    done
    [ "$has_ct" = 1 ] || args+=(-H 'Content-Type: application/json')
    args+=(--data-binary "$body")
  fi
  : >"$TMP/last.body"
  : >"$HDRS"
  LAST_REQUEST="$method $path"
  STATUS="$(curl "${args[@]}" "$@" "$url" 2>"$TMP/last.curlerr")" || true
  [ -n "$STATUS" ] || STATUS=000
  RESP="$(cat "$TMP/last.body")"
}

# expect_status CODE [CODE...]: the last answer's status is one of these.
expect_status() {
  local c
  for c in "$@"; do
    [ "$STATUS" = "$c" ] && return 0
  done
  fail "expected status $*, got $STATUS $(cat "$TMP/last.curlerr" 2>/dev/null)"
}

# jget FILTER: jq -r FILTER of the last answer (compact JSON for non-strings).
jget() {
  jq -rc "$1" <<<"$RESP" 2>/dev/null || fail "answer is not JSON (jq $1)"
}

# expect_jq FILTER EXPECTED: `jq -rc FILTER` of the last answer equals EXPECTED
# (strings raw, everything else compact JSON: 3, true, null, ["a","b"]).
expect_jq() {
  local got
  got="$(jq -rc "$1" <<<"$RESP" 2>/dev/null)" || fail "answer is not JSON, wanted $1 == $2"
  [ "$got" = "$2" ] || fail "expected $1 == $2, got $got"
}

# expect_jq_true FILTER [MESSAGE]: the filter yields true.
expect_jq_true() {
  local got
  got="$(jq -rc "$1" <<<"$RESP" 2>/dev/null)" || fail "answer is not JSON, wanted $1"
  [ "$got" = true ] || fail "${2:-expected $1 to be true}, got $got"
}

# header NAME: the last answer's header value (last occurrence, trimmed).
header() {
  local name="${1,,}"
  tr -d '\r' <"$HDRS" | awk -v n="$name" 'BEGIN{IGNORECASE=1} {
      i = index($0, ":"); if (i == 0) next
      if (tolower(substr($0, 1, i - 1)) == n) { v = substr($0, i + 1); sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v); last = v }
    } END { if (last != "") print last }'
}

# expect_header NAME REGEX: the header is present and matches (extended regex).
expect_header() {
  local v
  v="$(header "$1")"
  [ -n "$v" ] || fail "expected a $1 header"
  grep -Eq -- "$2" <<<"$v" || fail "expected $1 matching /$2/, got '$v'"
}

# expect_api_error STATUS CODE: an API error object with that code.
expect_api_error() {
  expect_status "$1"
  expect_jq '.error.code' "$2"
  expect_jq '.error.message | type' string
}

# ---------------------------------------------------------------- jobs

# submit BODY [CURL_ARGS...]: POST /v1/jobs, expects 201; sets JOB_ID.
JOB_ID=""
submit() {
  api POST /v1/jobs "$@"
  expect_status 201
  JOB_ID="$(jget .id)"
  if [ -z "$JOB_ID" ] || [ "$JOB_ID" = null ]; then fail "201 without an id"; fi
}

# fetch_job ID: GET /v1/jobs/ID, expects 200.
fetch_job() {
  api GET "/v1/jobs/$1"
  expect_status 200
}

is_settled() {
  case "$1" in succeeded|failed|cancelled|skipped) return 0 ;; *) return 1 ;; esac
}

# wait_settled ID [SECONDS]: long-polls (wait=5) until the job is settled, up
# to SECONDS (default 30). Leaves the settled job in RESP.
wait_settled() {
  local id="$1" limit="${2:-30}" deadline state i
  deadline=$((SECONDS + limit))
  for ((i = 0; i < limit + 5; i++)); do
    api GET "/v1/jobs/$id?wait=5"
    expect_status 200
    state="$(jget .state)"
    is_settled "$state" && return 0
    [ "$SECONDS" -lt "$deadline" ] || break
  done
  fail "job $id not settled within ${limit}s (state $state)"
}

# poll_seconds DEADLINE: the wait= of a long-poll that is to end by DEADLINE (a value of $SECONDS): 1 to 60.
poll_seconds() {
  local left=$(($1 - SECONDS))
  if ((left < 1)); then left=1; fi
  if ((left > 60)); then left=60; fi
  echo "$left"
}

# wait_job ID FILTER [SECONDS]: until FILTER (jq, on the job) is true, long-polling the job's next version
# between looks (default limit 15 s). Leaves the job in RESP.
wait_job() {
  local id="$1" filter="$2" limit="${3:-15}" deadline version i
  deadline=$((SECONDS + limit))
  fetch_job "$id"
  for ((i = 0; i <= limit * 100; i++)); do
    [ "$(jget "$filter")" = true ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || break
    version="$(jget .version)"
    api GET "/v1/jobs/$id?wait=$(poll_seconds "$deadline")&since=$version"
    expect_status 200
  done
  fail "job $id: $filter not true within ${limit}s (state $(jget .state))"
}

# wait_state ID STATE [SECONDS]: follows the job's versions with long-polls
# until its state is STATE (default limit 15 s); fails if it settles otherwise.
wait_state() {
  local id="$1" want="$2" state
  wait_job "$id" "(.state == \"$want\") or (.state | IN(\"succeeded\", \"failed\", \"cancelled\", \"skipped\"))" "${3:-15}"
  state="$(jget .state)"
  [ "$state" = "$want" ] || fail "job $id settled as $state while waiting for $want"
}

# wait_nodes ID FILTER [SECONDS]: until FILTER (jq, on the node list {"nodes": [...]}) is true, long-polling the
# job's next version between looks (default limit 15 s; 0: one look); status 1 if it is not true by then. Leaves
# the node list in RESP.
wait_nodes() {
  local id="$1" filter="$2" limit="${3:-15}" deadline version i
  if ((limit < 0)); then limit=0; fi
  deadline=$((SECONDS + limit))
  for ((i = 0; i <= limit * 100; i++)); do
    # The version before the nodes: a change after it, even one the node list already shows, ends the long-poll.
    fetch_job "$id"
    version="$(jget .version)"
    api GET "/v1/jobs/$id/nodes"
    expect_status 200
    [ "$(jget "$filter")" = true ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || return 1
    api GET "/v1/jobs/$id?wait=$(poll_seconds "$deadline")&since=$version"
    expect_status 200
  done
  return 1
}

# wait_nodes_state ID STATE NODE...: waits (up to 15 s) until each named node is in STATE.
wait_nodes_state() {
  local id="$1" want="$2" names
  shift 2
  names="$(printf '%s\n' "$@" | jq -R . | jq -sc .)"
  wait_nodes "$id" "$names as \$n | [.nodes[] | select(.id | IN(\$n[]))] | length == (\$n | length) and all(.state == \"$want\")" 15 \
    || fail "nodes $* of job $id not all $want within 15 s"
}

# wait_notify ID STATE [SECONDS]: waits (default 20 s) until the job's webhook delivery has ended (the server logs
# a line "webhook" naming the job once it recorded it delivered or failed), then expects notify.state STATE.
# Leaves the job in RESP.
wait_notify() {
  local id="$1" want="$2" limit="${3:-20}"
  until_logged "\"msg\":\"webhook\",\"job\":\"$id\"" "$limit" _notify_ended "$id" \
    || fail "job $id: notify.state is $(jget .notify.state), not $want, after ${limit}s"
  expect_jq .notify.state "$want"
}
_notify_ended() {
  fetch_job "$1"
  [ "$(jget .notify.state)" != pending ]
}

# node_field ID NODE FILTER: FILTER applied to one node from the node list
# (with results) of job ID, printed raw.
node_field() {
  local out auth=()
  if [ -n "$AUTH_TOKEN" ]; then auth=(-H "Authorization: Bearer $AUTH_TOKEN"); fi
  out="$(curl -sS --max-time 10 ${auth[@]+"${auth[@]}"} "$BASE/v1/jobs/$1/nodes?include=result")" \
    || fail "GET /v1/jobs/$1/nodes failed"
  jq -rc --arg n "$2" ".nodes[] | select(.id == \$n) | $3" <<<"$out" 2>/dev/null \
    || fail "node list of $1 is not JSON"
}

# expect_node ID NODE FILTER EXPECTED
expect_node() {
  local got
  got="$(node_field "$1" "$2" "$3")"
  [ "$got" = "$4" ] || fail "job $1 node $2: expected $3 == $4, got '${got}'"
}

# ---------------------------------------------------------------- upstream

# ustats FILTER: FILTER applied to the upstream's /stats.
ustats() {
  curl -sS --max-time 5 "$UPSTREAM/stats" | jq -rc "$1" 2>/dev/null || fail "upstream /stats failed"
}

ustats_reset() {
  curl -sS -o /dev/null --max-time 5 -X POST "$UPSTREAM/stats/reset" || fail "upstream POST /stats/reset failed"
}

# upstream_count KEY: how many requests /count/KEY has seen.
upstream_count() {
  ustats "(.counters[\"$1\"] // 0) | if type == \"object\" then (.count // .requests // 0) else . end"
}

# wait_upstream FILTER [SECONDS]: until FILTER (jq, on the upstream's /stats) is true (default limit 5 s),
# long-polling /stats for its next change (?after=<generation>) between looks.
wait_upstream() {
  local filter="$1" limit="${2:-5}" deadline stats i
  deadline=$((SECONDS + limit))
  stats="$(curl -sS --max-time 5 "$UPSTREAM/stats")" || fail "upstream /stats failed"
  for ((i = 0; i <= limit * 100; i++)); do
    [ "$(jq -rc "$filter" <<<"$stats" 2>/dev/null)" = true ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || break
    stats="$(curl -sS --max-time 40 "$UPSTREAM/stats?after=$(jq .generation <<<"$stats")&wait=$(poll_seconds "$deadline")")" \
      || fail "upstream /stats failed"
  done
  fail "upstream /stats never satisfied $filter within ${limit}s: $stats"
}

# ---------------------------------------------------------------- raw HTTP

# raw_http BYTES: sends BYTES (printf format already applied) to the server
# over a plain TCP connection and prints what comes back within 5 s.
raw_http() {
  python3 - "$SERVER_PORT" "$1" <<'PY'
import socket, sys, time
port, data = int(sys.argv[1]), sys.argv[2].encode("latin-1")
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(data)
out = b""
deadline = time.monotonic() + 5
try:
    while time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
        # One complete answer is enough: headers, then Content-Length bytes.
        head, sep, rest = out.partition(b"\r\n\r\n")
        if sep:
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip() or 0)
            if len(rest) >= length:
                break
except socket.timeout:
    pass
sys.stdout.write(out.decode("latin-1"))
PY
}

# raw_status BYTES: the status code of the answer to raw_http BYTES (000 if none).
raw_status() {
  local out
  out="$(raw_http "$1" || true)"
  RESP="${out#*$'\r\n\r\n'}"
  LAST_REQUEST="raw: $(printf '%.60s' "${1%%$'\r'*}")"
  STATUS="$(sed -n '1s/^HTTP\/1\.[01] \([0-9][0-9][0-9]\).*$/\1/p' <<<"$out")"
  [ -n "$STATUS" ] || STATUS=000
  printf '%s' "$out" >"$TMP/last.raw"
  tr -d '\r' <<<"${out%%$'\r\n\r\n'*}" >"$HDRS"
}

# millis: wall-clock milliseconds, for timing checks.
millis() { date +%s%3N; }

# Scripts on PostgreSQL (postgres.test.sh, scaleout*.test.sh).
# use_pg_cluster: a folder for a throwaway cluster in PGDIR, and an exit trap that stops the servers (the
# node-N.pid files of start_node, then STARTED_PIDS) before the cluster (a server whose database went away first
# would wait for it), then runs lib.sh's cleanup with the script's status. A script may define
# pg_cleanup_first, run first. Nothing in the trap may end it early (set -e is off in it).
use_pg_cluster() {
  # Under /tmp itself: as root the cluster runs as `nobody`, who cannot enter $TMP.
  PGDIR="$(mktemp -d /tmp/jobserver-pg-it.XXXXXX)"
  trap _pg_cleanup EXIT
}
_pg_cleanup() {
  local rc=$? f pid
  set +e
  declare -F pg_cleanup_first >/dev/null && pg_cleanup_first
  for f in "$TMP"/node-*.pid; do [ -f "$f" ] && _stop_pid "$(cat "$f")" 5; done
  for pid in "${STARTED_PIDS[@]+"${STARTED_PIDS[@]}"}"; do _stop_pid "$pid" 5; done
  STARTED_PIDS=()
  bash scripts/pg-cluster.sh stop "$PGDIR" >/dev/null 2>&1
  (exit "$rc")
  _cleanup
}

# start_pg_cluster: the cluster in $PGDIR (scripts/pg-cluster.sh, fsync off); sets url, for psql_.
start_pg_cluster() {
  url="$(PG_FSYNC=off bash scripts/pg-cluster.sh start "$PGDIR" 2>"$TMP/pg.err" | tail -1)" \
    || fail "PostgreSQL did not start: $(cat "$TMP/pg.err")"
  [[ "$url" == postgres://* ]] || fail "pg-cluster printed no URL: $url $(cat "$TMP/pg.err")"
}
psql_() { psql "$url" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }

# start_node N PORT [FLAGS...]: server N on $url (needs TTL) on PORT (0: one the kernel picks), its pid in
# $TMP/node-N.pid, PGAPPNAME server-N, --lease-ttl $TTL, its log appended to $TMP/node-N.log; waits (at most 20 s)
# for its log line `listening` and sets NODE_PORT to the port it names. Status 1 (the reason on stderr) if the
# server ends first or does not listen in time.
NODE_PORT=""
start_node() {
  local n="$1" port="$2" log="$TMP/node-$1.log" from line pid
  shift 2
  from="$(file_size "$log")"
  PGAPPNAME="server-$n" "$JOBSERVER_BIN" serve --host 127.0.0.1 --port "$port" --db "$url" --lease-ttl "$TTL" \
    "$@" >>"$log" 2>&1 &
  pid=$!
  echo "$pid" >"$TMP/node-$n.pid"
  if ! line="$(next_line "$log" "$from" 20 "$pid" '"msg":"listening"')"; then
    echo "server $n did not log that it listens within 20 s, or ended: $(tail -3 "$log")" >&2
    return 1
  fi
  NODE_PORT="$(jq -r .port <<<"$line")"
}
