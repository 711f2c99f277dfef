#!/usr/bin/env bash
# Makes a throwaway CA and two server certificates signed by it, for the HTTPS tests:
#   ca.pem                     the CA (trust it with --ca-file)
#   server.pem / server.key    SAN IP:127.0.0.1, DNS:localhost
#   wrong.pem / wrong.key      SAN DNS:wrong.example only: a host name mismatch on 127.0.0.1
# Usage: Tests/Fixtures/make-tls.sh DIR   (DIR is created; keys are P-256, valid 2 days)
set -euo pipefail
dir=${1:?usage: make-tls.sh DIR}
mkdir -p "$dir"
cd "$dir"
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${curve[@]}" -keyout ca.key -out ca.pem -days 2 -subj "/CN=jobserver test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
for name in server wrong; do
    if [[ $name == server ]]; then san="IP:127.0.0.1,DNS:localhost"; else san="DNS:wrong.example"; fi
    openssl req "${curve[@]}" -keyout "$name.key" -out "$name.csr" -subj "/CN=$name" 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$san" >"$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$name.pem" -days 2 \
        -extfile "$name.ext" 2>/dev/null
done
