#!/usr/bin/env bash
# The Docker image's runtime stage is enough: the release binary, built the way
# the Dockerfile builds it, needs no library beyond glibc and the packages that
# stage installs. (No Docker engine runs here, so the image itself is not built.)
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "[image.test] -- swift build -c release --static-swift-stdlib --product jobserver"
swift build -c release --static-swift-stdlib --product jobserver >/dev/null
bin="$(swift build -c release --static-swift-stdlib --show-bin-path)/jobserver"
scripts/check-ldd.sh "$bin" Dockerfile
echo "[image.test] -- the binary starts and prints its usage"
"$bin" --help >/dev/null
echo "[image.test] ok"
