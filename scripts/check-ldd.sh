#!/usr/bin/env bash
# Checks that every shared library BINARY needs at run time is provided by the
# runtime image of the Dockerfile: by a package its runtime stage installs, or
# by a dependency of one (dependency closure from apt-cache), or by the base
# image's libc6.
#
# Usage: scripts/check-ldd.sh BINARY [DOCKERFILE]
#
# The package list is read from the runtime stage's (the last FROM's)
# `apt-get install` line, so the Dockerfile and this check cannot drift.
# Each library `ldd` resolves is mapped to its owning package with `dpkg -S`;
# so run this on a Debian bookworm system (this machine, or the build stage of
# the Dockerfile) that has the libraries installed.
#
# Why libc6 is assumed: it is Essential in every Debian image. Everything else
# (libstdc++6, libgcc-s1 for the static Swift runtime; libcurl4's and
# libsqlite3-0's own dependencies) must come from the installed list's closure,
# which is why the Dockerfile names libstdc++6 although bookworm-slim already
# has it (apt depends on it).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BINARY [DOCKERFILE]" >&2
  exit 2
fi
binary="$1"
dockerfile="${2:-$(dirname "$0")/../Dockerfile}"
base_packages=(libc6)

for tool in ldd dpkg-query apt-cache awk; do
  command -v "$tool" >/dev/null || { echo "check-ldd: $tool not found" >&2; exit 2; }
done
[ -f "$binary" ] || { echo "check-ldd: $binary: no such file" >&2; exit 2; }
[ -f "$dockerfile" ] || { echo "check-ldd: $dockerfile: no such file" >&2; exit 2; }

# The runtime stage's packages: words after `apt-get install` in the last
# stage, across `\` continuations, up to `&&`, `;` or the end of the RUN;
# options (-y, --no-install-recommends) skipped.
mapfile -t runtime_packages < <(awk '
  /^[[:space:]]*FROM[[:space:]]/ { text = ""; next }
  { line = $0; sub(/\\[[:space:]]*$/, "", line); text = text " " line }
  END {
    n = split(text, w, /[[:space:]]+/)
    on = 0
    for (i = 1; i <= n; i++) {
      if (w[i] == "install" && w[i-1] == "apt-get") { on = 1; continue }
      if (!on) continue
      if (w[i] == "&&" || w[i] ~ /;$/ || w[i] ~ /^(RUN|COPY|ENV|USER)$/) {
        if (w[i] ~ /;$/ && w[i] !~ /^-/) { sub(/;$/, "", w[i]); if (w[i] != "") print w[i] }
        on = 0; exit
      }
      if (w[i] ~ /^-/ || w[i] == "") continue
      print w[i]
    }
  }' "$dockerfile")
if [ ${#runtime_packages[@]} -eq 0 ]; then
  echo "check-ldd: no \`apt-get install\` package list found in the runtime stage of $dockerfile" >&2
  exit 2
fi
echo "check-ldd: runtime packages (from $dockerfile): ${runtime_packages[*]}"

# Dependency closure of the runtime packages (Depends and Pre-Depends only;
# every alternative of an `a | b` dependency is followed, a slight over-
# approximation that only matters for packages no library comes from).
closure_file="$(mktemp)"
trap 'rm -f "$closure_file" "$closure_file.raw" "$closure_file.err"' EXIT
if ! apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances "${runtime_packages[@]}" >"$closure_file.raw" 2>"$closure_file.err"; then
  echo "check-ldd: apt-cache depends failed (run apt-get update?):" >&2
  cat "$closure_file.err" >&2
  rm -f "$closure_file.raw" "$closure_file.err"
  exit 2
fi
{ grep -v '^[[:space:]]' "$closure_file.raw" | grep -v '^<' | sed 's/:.*$//'
  printf '%s\n' "${runtime_packages[@]}" "${base_packages[@]}"
} | sort -u >"$closure_file"
rm -f "$closure_file.raw" "$closure_file.err"

# The package owning a library file; dpkg may know it under /lib or /usr/lib
# (merged /usr), or only by the symlink's target.
owner_of() {
  local path="$1" real candidates=() c out
  real="$(readlink -f "$path" 2>/dev/null || echo "$path")"
  for c in "$path" "$real"; do
    candidates+=("$c")
    case "$c" in
      /usr/*) candidates+=("${c#/usr}") ;;
      *) candidates+=("/usr$c") ;;
    esac
  done
  for c in "${candidates[@]}"; do
    if out="$(dpkg-query -S "$c" 2>/dev/null)"; then
      # "libc6:amd64: /lib/…" or "libc6:amd64, libc6:i386: /…" → first owner
      out="${out%%: /*}"
      out="${out%%,*}"
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}

ldd_out="$(ldd "$binary" 2>&1)" || {
  echo "check-ldd: ldd $binary failed: $ldd_out" >&2
  exit 1
}
if grep -q 'not a dynamic executable' <<<"$ldd_out"; then
  echo "check-ldd: $binary is static: nothing to check"
  exit 0
fi

bad=0
checked=0
while IFS= read -r line; do
  line="${line#"${line%%[![:space:]]*}"}"
  [ -n "$line" ] || continue
  name="${line%% *}"
  case "$line" in
    linux-vdso.so.*|linux-gate.so.*) continue ;;  # provided by the kernel
    *"=> not found"*)
      echo "check-ldd: MISSING $name: not found on this system" >&2
      bad=1; continue ;;
    *" => "*) path="${line#* => }"; path="${path%% (*}" ;;
    /*) path="${line%% (*}"; name="$(basename "$path")" ;;
    *) continue ;;
  esac
  checked=$((checked + 1))
  if ! pkg="$(owner_of "$path")"; then
    echo "check-ldd: UNOWNED $name ($path): no Debian package owns it" >&2
    bad=1; continue
  fi
  if grep -qxF "$pkg" "$closure_file"; then
    echo "  ok  $name  ($pkg)"
  else
    echo "check-ldd: NOT IN IMAGE $name ($path) comes from $pkg, which the runtime stage does not install" >&2
    bad=1
  fi
done <<<"$ldd_out"

if [ "$bad" -ne 0 ]; then
  echo "check-ldd: FAIL: $binary needs libraries the runtime image lacks" >&2
  exit 1
fi
echo "check-ldd: OK: all $checked libraries of $binary are in the runtime image"
