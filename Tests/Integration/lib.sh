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

# Stops one process we started: SIGTERM, up to $2 seconds, then SIGKILL.
_stop_pid() {
  local pid="$1" grace="${2:-5}" i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

_cleanup() {
  local rc=$? pid
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

# Starts the fixture upstream on a port of its choosing; its first stdout line
# is `listening <port>`. Sets UPSTREAM and UPSTREAM_PID.
start_upstream() {
  local out="$TMP/upstream.out" port="" i
  [ -f "$UPSTREAM_SCRIPT" ] || fail "fixture $UPSTREAM_SCRIPT is missing"
  # Made here: the background job opens it only when it gets to run.
  : >"$out"
  python3 "$UPSTREAM_SCRIPT" --port 0 >"$out" 2>"$TMP/upstream.err" &
  UPSTREAM_PID=$!
  STARTED_PIDS+=("$UPSTREAM_PID")
  for ((i = 0; i < 100; i++)); do
    port="$(sed -n '1s/^listening \([0-9][0-9]*\).*$/\1/p' "$out")"
    [ -n "$port" ] && break
    kill -0 "$UPSTREAM_PID" 2>/dev/null || fail "upstream fixture exited: $(cat "$TMP/upstream.err")"
    sleep 0.1
  done
  [ -n "$port" ] || fail "upstream fixture did not print 'listening <port>' within 10 s"
  UPSTREAM="http://127.0.0.1:$port"
  log "upstream at $UPSTREAM"
}

# start_server_on DB [FLAGS...]: starts jobserver on a free loopback port with
# that database and waits (up to 20 s) for /healthz. Sets BASE, SERVER_PID,
# SERVER_PORT, SERVER_DB, SERVER_LOG, SERVER_ARGS.
start_server_on() {
  local db="$1" attempt i code
  shift
  SERVER_SEQ=$((SERVER_SEQ + 1))
  SERVER_DB="$db"
  SERVER_LOG="$TMP/server-$SERVER_SEQ.log"
  SERVER_ARGS=("$@")
  # The port is chosen, released, then bound by the server: retry on a lost race.
  for attempt in 1 2 3; do
    SERVER_PORT="$(free_port)"
    BASE="http://127.0.0.1:$SERVER_PORT"
    "$JOBSERVER_BIN" serve --host 127.0.0.1 --port "$SERVER_PORT" --db "$db" "$@" \
      >>"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    STARTED_PIDS+=("$SERVER_PID")
    for ((i = 0; i < 200; i++)); do
      code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$BASE/healthz" 2>/dev/null || true)"
      [ "$code" = 200 ] && { log "server $SERVER_SEQ at $BASE (pid $SERVER_PID)"; return 0; }
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      fail "server did not answer 200 on /healthz within 20 s"
    fi
    wait "$SERVER_PID" 2>/dev/null || true
    log "server exited at start (attempt $attempt), retrying on another port"
  done
  fail "server would not start: $JOBSERVER_BIN serve --port $SERVER_PORT --db $db $*"
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
  local pid="$1" limit="${2:-15}" i
  SERVER_EXIT=""
  kill -TERM "$pid" 2>/dev/null || { SERVER_EXIT="gone"; return 0; }
  for ((i = 0; i < limit * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
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

# wait_state ID STATE [SECONDS]: follows the job's versions with long-polls
# until its state is STATE (default limit 15 s).
wait_state() {
  local id="$1" want="$2" limit="${3:-15}" deadline version state i
  deadline=$((SECONDS + limit))
  fetch_job "$id"
  for ((i = 0; i < 200; i++)); do
    state="$(jget .state)"
    [ "$state" = "$want" ] && return 0
    is_settled "$state" && fail "job $id settled as $state while waiting for $want"
    [ "$SECONDS" -lt "$deadline" ] || break
    version="$(jget .version)"
    api GET "/v1/jobs/$id?wait=2&since=$version"
    expect_status 200
  done
  fail "job $id not $want within ${limit}s (state $state)"
}

# wait_nodes_state ID STATE NODE...: polls the node list (every 0.1 s, up to
# 15 s) until each named node is in STATE.
wait_nodes_state() {
  local id="$1" want="$2" i n ok
  shift 2
  for ((i = 0; i < 150; i++)); do
    api GET "/v1/jobs/$id/nodes"
    expect_status 200
    ok=1
    for n in "$@"; do
      [ "$(jq -r --arg n "$n" '.nodes[] | select(.id == $n) | .state' <<<"$RESP")" = "$want" ] || { ok=0; break; }
    done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
  fail "nodes $* of job $id not all $want within 15 s"
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

# wait_upstream FILTER [SECONDS]: polls /stats until FILTER is true (default 5 s).
wait_upstream() {
  local filter="$1" limit="${2:-5}" i
  for ((i = 0; i < limit * 10; i++)); do
    [ "$(ustats "$filter")" = true ] && return 0
    sleep 0.1
  done
  fail "upstream /stats never satisfied $filter within ${limit}s: $(ustats .)"
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

# start_node N PORT [FLAGS...]: server N on $url (needs TTL) (its pid in $TMP/node-N.pid, PGAPPNAME server-N, --lease-ttl
# $TTL, its log in $TMP/node-N.log) on PORT; waits (at most 20 s) for /healthz.
start_node() {
  local n="$1" port="$2" i pid
  shift 2
  PGAPPNAME="server-$n" "$JOBSERVER_BIN" serve --host 127.0.0.1 --port "$port" --db "$url" --lease-ttl "$TTL" \
    --log-level warning "$@" >>"$TMP/node-$n.log" 2>&1 &
  pid=$!
  echo "$pid" >"$TMP/node-$n.pid"
  for ((i = 0; i < 200; i++)); do
    curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$port/healthz" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { echo "server $n exited: $(tail -3 "$TMP/node-$n.log")" >&2; return 1; }
    sleep 0.1
  done
  echo "server $n did not answer /healthz" >&2
  return 1
}
