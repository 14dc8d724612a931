#!/usr/bin/env bash
# Installs what the tests and the fuzz smoke run need that is not a crate, when it is missing.
set -euo pipefail
if ! command -v cargo-fuzz >/dev/null 2>&1 && cargo +nightly --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked
fi
# The black-box tests drive one case through curl (Expect: 100-continue as a real client sends it).
if ! command -v curl >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq curl
fi
# The OpenAPI conformance test runs schemathesis and an OpenAPI validator (PyPI).
if ! command -v st >/dev/null 2>&1 || ! command -v openapi-spec-validator >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check schemathesis==4.32.5 openapi-spec-validator
fi
# The HTTP/2 egress tests and perf/h2.sh use nginx over TLS as a real HTTP/2 upstream.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  apt-get update -qq && apt-get install -y -qq nginx
fi
# The test suite builds feature `fingerprints`: BoringSSL (btls-sys) is compiled from source with
# cmake, make and a C++ compiler, and its bindings are generated with libclang.
if ! command -v cmake >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1 \
    || ! command -v g++ >/dev/null 2>&1 || ! dpkg -s libclang-dev >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq cmake make g++ libclang-dev
fi
# The fingerprint tests cross-check JA4 with curl_cffi's impersonating libcurl (PyPI wheel).
if ! python3 -c "import curl_cffi" >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check 'curl_cffi==0.16.3'
fi
# The forward-proxy tests drive the proxy with Python requests (proxies=).
if ! python3 -c "import requests" >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check requests
fi
# The dashboard's browser tests drive Debian's Chromium through Playwright for Python (using that
# executable: Playwright's own browser download is never needed).
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq chromium
fi
if ! python3 -c 'import playwright.sync_api' >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check 'playwright==1.65.2'
fi
# The receipt tests and perf/receipts.sh run the S3 backend against a real S3-compatible server.
if ! command -v s3s-fs >/dev/null 2>&1; then
  cargo install s3s-fs@0.14.1 --features binary --locked
fi
# The upstream proxy tests run real proxies on loopback: squid (HTTP CONNECT with basic_ncsa_auth)
# and dante (SOCKS5); the squid fixture hashes its passwords with openssl.
if ! command -v squid >/dev/null 2>&1 && [ ! -x /usr/sbin/squid ]; then
  apt-get update -qq && apt-get install -y -qq squid
fi
if [ ! -x /usr/sbin/danted ]; then
  apt-get update -qq && apt-get install -y -qq dante-server
fi
if ! command -v openssl >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq openssl
fi
# The record store and shared-store tests start a private PostgreSQL cluster (initdb and postgres
# from Debian's package, in /usr/lib/postgresql/<version>/bin).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq postgresql
fi
# The persistence tests fill a tmpfs (mount, umount) and make SQLite's log immutable (chattr).
if ! command -v chattr >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq e2fsprogs
fi
if ! command -v mount >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq mount
fi
# The systemd tests pass sockets with systemd-socket-activate and check the packaged units with
# systemd-analyze (neither needs systemd running as PID 1).
if ! command -v systemd-socket-activate >/dev/null 2>&1 || ! command -v systemd-analyze >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq systemd
fi
# CI builds the Debian package (scripts/check-deb.sh).
if ! command -v cargo-deb >/dev/null 2>&1; then
  cargo install cargo-deb --locked
fi
