#!/usr/bin/env bash
# schemathesis against a running server: every answer conforms to openapi.yaml
# and none is a 5xx. Fetches of generated jobs are refused before connecting
# (--deny-cidr 0.0.0.0/0), so nothing leaves the machine.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

start_server --deny-cidr 0.0.0.0/0,::/0
step "schemathesis against $BASE"
scripts/schemathesis.sh "$BASE" || fail "schemathesis found answers that do not conform to openapi.yaml"
step "the server still answers"
api GET /healthz
expect_status 200
log ok
