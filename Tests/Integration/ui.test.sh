#!/usr/bin/env bash
# The dashboard in a real browser (Debian's chromium and chromium-driver, Selenium from PyPI in a venv under
# .build/uivenv) against two real servers, one with --token, and the upstream fixture. The steps are in
# ui_browser.py. Screenshots land in .build/ui-screenshots/; UI_SCREENSHOTS_TO_DOCS=1 also copies them to
# docs/screenshots/ for the README.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

for tool in chromium chromedriver; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/ensure-deps.sh test installs it)"
done
venv=.build/uivenv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import selenium' 2>/dev/null; then
  log "creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check selenium
fi

start_upstream
start_server
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
