#!/usr/bin/env bash
# The dashboard in a real browser (Debian's chromium and chromium-driver, Selenium from PyPI in a venv under
# .build/uivenv) against two real servers, one with --token, and the upstream fixture. The steps are in
# ui_browser.py. Screenshots land in .build/ui-screenshots/; UI_SCREENSHOTS_TO_DOCS=1 also copies them to
# docs/screenshots/ for the README.
# The servers are the release build (unless JOBSERVER_BIN names another), as users run them: the first paints the
# test bounds include the server's answers, and the debug build took 510 ms to list the 10,000 nodes that the
# release build lists in 12.
if [ -z "${JOBSERVER_BIN:-}" ]; then
  (cd "$(dirname "$0")/../.." && swift build -c release --product jobserver >&2) || {
    echo "FAIL ui.test: the release build of jobserver failed" >&2
    exit 1
  }
  JOBSERVER_BIN=.build/release/jobserver
fi
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

for tool in chromium chromedriver sqlite3; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/ensure-deps.sh test installs it)"
done
venv=.build/uivenv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import selenium' 2>/dev/null; then
  log "creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check selenium
fi

start_upstream
# 100,000 settled jobs stored before the dashboard is opened: one real job, copied in SQLite under older ids (a
# prefix below every id the server gives now), each with its node, so that any of them opens.
start_server
submit "{\"name\":\"stored\",\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
wait_settled "$JOB_ID"
stop_server "$SERVER_PID"
t0="$(millis)"
# The columns are read from the schema, so that a new column is copied too; only the copy's identity changes.
columns() { # TABLE COLUMN=EXPRESSION... -> the table's columns as a SELECT list, with the given ones replaced
  local table="$1"; shift
  sqlite3 "$SERVER_DB" "SELECT name FROM pragma_table_info('$table') ORDER BY cid" | while read -r c; do
    local expr="$table.$c"
    for r in "$@"; do [ "${r%%=*}" = "$c" ] && expr="${r#*=}"; done
    printf '%s\n' "$expr"
  done | paste -sd, -
}
copy_id="'01M0' || printf('%022d', n.i)"
job_select="$(columns jobs "id=$copy_id" "name='stored-' || n.i" "created_at=jobs.created_at - 100000 + n.i" "idempotency_key=NULL")"
node_select="$(columns nodes "job_id=$copy_id")"
sqlite3 "$SERVER_DB" <<SQL || fail "seeding 100,000 jobs failed"
PRAGMA journal_mode = WAL;
BEGIN;
CREATE TEMP TABLE n AS WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 100000) SELECT i FROM c;
INSERT INTO jobs SELECT $job_select FROM jobs, n WHERE jobs.id = '$JOB_ID';
INSERT INTO nodes SELECT $node_select FROM nodes, n WHERE nodes.job_id = '$JOB_ID';
COMMIT;
SQL
log "stored 100,000 more jobs in $(( $(millis) - t0 )) ms"
start_server_on "$SERVER_DB"
plain="$BASE"
token="ui-test-token-$RANDOM"
start_server --token "$token"
shots="$REPO_ROOT/.build/ui-screenshots"
rm -rf "$shots"
# Chromium keeps its profile and crash dumps under HOME: the temp dir, so nothing is left behind.
HOME="$TMP" "$venv/bin/python" Tests/Integration/ui_browser.py "$plain" "$BASE" "$token" "$UPSTREAM" "$shots" \
  || fail "the browser test failed (screenshots in $shots)"
if [ "${UI_SCREENSHOTS_TO_DOCS:-0}" = 1 ]; then
  mkdir -p docs/screenshots
  for view in jobs job submit-error overview job-10000 token; do cp "$shots/$view.png" docs/screenshots/; done
  log "copied screenshots to docs/screenshots/"
fi
log "PASS"
