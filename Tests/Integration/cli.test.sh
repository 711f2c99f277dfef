#!/usr/bin/env bash
# The command-line client (jobserver submit|get|jobs|cancel|watch) against a real server and upstream:
# exit status for each outcome, --follow on a pseudo-terminal (script) and piped, --token.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
command -v script >/dev/null || fail "script (bsdutils) is required"

start_upstream
start_server
export JOBSERVER_URL="$BASE"
cli() { "$JOBSERVER_BIN" "$@"; }

# run_cli EXPECTED_STATUS ARGS...: runs the client, stdout in $TMP/out, stderr in $TMP/err.
run_cli() {
  local want="$1" got=0
  shift
  cli "$@" >"$TMP/out" 2>"$TMP/err" </dev/null || got=$?
  [ "$got" = "$want" ] || fail "jobserver $* exited $got, expected $want; stderr: $(cat "$TMP/err"); stdout: $(head -c 500 "$TMP/out")"
}
# one_line_reason: stderr is exactly one line.
one_line_reason() {
  [ "$(wc -l <"$TMP/err")" = 1 ] || fail "expected a one-line reason on stderr, got: $(cat "$TMP/err")"
}

ok_job="{\"name\":\"cli-ok\",\"graph\":{\"type\":\"list\",\"children\":[
  {\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/700\"},{\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/1400\"},
  {\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}]}}"
printf '%s' "$ok_job" >"$TMP/ok.json"

step "submit FILE: prints the job and exits 0"
run_cli 0 submit "$TMP/ok.json"
first_id="$(jq -r .id "$TMP/out")"
[ -n "$first_id" ] && [ "$first_id" != null ] || fail "submit printed no job: $(cat "$TMP/out")"

step "submit --wait: 0 when the job succeeds"
run_cli 0 submit "$TMP/ok.json" --wait

step "submit - --wait: 1 when it fails, with the job's error on stderr"
printf '{"graph":{"type":"fetch","url":"%s/status/500"}}' "$UPSTREAM" >"$TMP/fail.json"
rc=0
cli submit - --wait <"$TMP/fail.json" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || fail "a failed job exited $rc, expected 1: $(cat "$TMP/err")"
grep -q 'http_status' "$TMP/err" || fail "no error kind on stderr: $(cat "$TMP/err")"

step "watch: 3 when the job is cancelled meanwhile"
printf '{"graph":{"type":"fetch","url":"%s/delay/20000"}}' "$UPSTREAM" >"$TMP/slow.json"
run_cli 0 submit "$TMP/slow.json"
slow_id="$(jq -r .id "$TMP/out")"
cli watch "$slow_id" >"$TMP/watch.out" 2>"$TMP/watch.err" &
watch_pid=$!
STARTED_PIDS+=("$watch_pid")
wait_state "$slow_id" running
run_cli 0 cancel "$slow_id"
[ "$(jq -r .id "$TMP/out")" = "$slow_id" ] || fail "cancel printed $(cat "$TMP/out")"
rc=0
wait "$watch_pid" || rc=$?
[ "$rc" = 3 ] || fail "watch of a cancelled job exited $rc, expected 3: $(cat "$TMP/watch.err")"
grep -q '^cancelled ' "$TMP/watch.out" || fail "watch's last line is not the cancelled state: $(cat "$TMP/watch.out")"

step "cancel of a settled job: 2 with the API's reason"
run_cli 2 cancel "$first_id"
one_line_reason
grep -q '409 conflict' "$TMP/err" || fail "no 409 in: $(cat "$TMP/err")"

step "get ID: the job; get of an unknown id: 2"
run_cli 0 get "$first_id"
[ "$(jq -r .state "$TMP/out")" = succeeded ] || fail "get printed $(cat "$TMP/out")"
run_cli 2 get 01NOSUCHJOB0000000000000000
one_line_reason
grep -q '404 not_found' "$TMP/err" || fail "no 404 in: $(cat "$TMP/err")"

step "jobs [--state S]: one line per job, newest first"
run_cli 0 jobs
[ "$(wc -l <"$TMP/out")" -ge 4 ] || fail "jobs printed $(cat "$TMP/out")"
run_cli 0 jobs --state failed
[ "$(wc -l <"$TMP/out")" = 1 ] && grep -q ' failed ' "$TMP/out" || fail "jobs --state failed printed $(cat "$TMP/out")"
run_cli 2 jobs --state nonsense
one_line_reason

step "usage and connection errors: 2 with a one-line reason"
run_cli 2 submit
one_line_reason
run_cli 2 get
one_line_reason
run_cli 2 jobs --bogus
one_line_reason
run_cli 2 submit "$TMP/does-not-exist.json"
one_line_reason
run_cli 2 get x --server http://127.0.0.1:1
one_line_reason
grep -qi 'connect' "$TMP/err" || fail "no connection reason: $(cat "$TMP/err")"
JOBSERVER_URL=ftp://x run_cli 2 jobs
one_line_reason
printf '{"graph":{"type":"fetch","url":"ftp://example.test/"}}' >"$TMP/bad.json"
run_cli 2 submit "$TMP/bad.json"
one_line_reason
grep -q '422 invalid_graph.*(at /graph/url)' "$TMP/err" || fail "the 422's path is not named: $(cat "$TMP/err")"

step "--follow piped: one line per change, the last one the final state, no terminal codes"
run_cli 0 submit "$TMP/ok.json" --follow
lines="$(wc -l <"$TMP/out")"
[ "$lines" -ge 2 ] || fail "--follow printed $lines line(s): $(cat "$TMP/out")"
[ "$(sort "$TMP/out" | uniq -d | wc -l)" = 0 ] || fail "--follow printed a line twice in a row: $(cat "$TMP/out")"
tail -n 1 "$TMP/out" | grep -Eq '^succeeded 4/4 running 0 pending 0 succeeded 4 ' || fail "last line: $(tail -n 1 "$TMP/out")"
grep -q $'\r\|\x1b' "$TMP/out" && fail "piped output has terminal codes"

step "--follow on a terminal: a progress bar redrawn in place"
rc=0
script -qec "$JOBSERVER_BIN submit $TMP/ok.json --follow" /dev/null >"$TMP/tty.out" 2>&1 </dev/null || rc=$?
[ "$rc" = 0 ] || fail "--follow under script exited $rc: $(cat -v "$TMP/tty.out")"
redraws="$(grep -o $'\r\x1b\\[2K\\[' "$TMP/tty.out" | wc -l)"
[ "$redraws" -ge 2 ] || fail "expected the line redrawn in place, got: $(cat -v "$TMP/tty.out")"
grep -q '\[########################\] 100% 4/4 succeeded' "$TMP/tty.out" \
  || fail "no full bar at the end: $(cat -v "$TMP/tty.out")"

step "watch under a terminal exits with the job's state: 1 for a failed job"
run_cli 0 submit "$TMP/fail.json"
fail_id="$(jq -r .id "$TMP/out")"
rc=0
script -qec "$JOBSERVER_BIN watch $fail_id" /dev/null >"$TMP/tty.out" 2>&1 </dev/null || rc=$?
[ "$rc" = 1 ] || fail "watch of a failed job under script exited $rc"

step "--token: 2 without it, 0 with --token or JOBSERVER_TOKEN"
token="cli-token-$RANDOM"
start_server --token "$token"
JOBSERVER_URL="$BASE" run_cli 2 jobs
grep -q '401 unauthorized' "$TMP/err" || fail "no 401 in: $(cat "$TMP/err")"
JOBSERVER_URL="$BASE" run_cli 0 jobs --token "$token"
JOBSERVER_URL="$BASE" JOBSERVER_TOKEN="$token" run_cli 0 submit "$TMP/ok.json" --wait

step "the server's own command line is unchanged"
run_cli 0 --help
grep -q -- '--shutdown-grace' "$TMP/out" || fail "--help lost the server's options"
run_cli 2 serve --no-such-flag
log "PASS"
