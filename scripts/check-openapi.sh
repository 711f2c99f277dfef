#!/usr/bin/env bash
# Validates openapi.yaml (OpenAPI 3.1) with openapi-spec-validator.
# The Python tools live in a venv under .build/pyvenv, made on first use.
# Usage: scripts/check-openapi.sh [SPEC]   (default: openapi.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:-openapi.yaml}"
venv=.build/pyvenv

if [ ! -x "$venv/bin/openapi-spec-validator" ] || [ ! -x "$venv/bin/st" ]; then
  echo "check-openapi: creating $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check openapi-spec-validator schemathesis
fi

if [ ! -f "$spec" ]; then
  echo "check-openapi: $spec not found" >&2
  exit 1
fi

# Beyond the validator: the file must be YAML that parses to a mapping with
# openapi 3.1.x, and every $ref must resolve (the validator checks the latter
# only for the refs it walks).
"$venv/bin/python" - "$spec" <<'PY'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
if not isinstance(spec, dict) or not str(spec.get("openapi", "")).startswith("3.1."):
    sys.exit(f"{sys.argv[1]}: not an OpenAPI 3.1 document")
bad = []
def walk(node, where):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target = spec
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    bad.append(f"{where}: unresolved $ref {ref}")
                    break
                target = target[part]
        for k, v in node.items():
            walk(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk(v, f"{where}/{i}")
walk(spec, "")
if bad:
    sys.exit("\n".join(bad))
PY

"$venv/bin/openapi-spec-validator" "$spec"
