#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (a release build) and checks what it installs: the
# binary, the systemd units, the commented default configuration as a conffile, and the
# maintainer scripts that create the sortie user. Prints the package's path.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb >/dev/null 2>&1 \
  || { echo "cargo-deb is missing: cargo install cargo-deb --locked (scripts/ci-deps.sh does)" >&2; exit 1; }
deb=$(cargo deb -p sortie --quiet 2>/dev/null | tail -n 1)
[ -f "$deb" ] || { echo "cargo deb produced no package" >&2; exit 1; }
listing=$(dpkg-deb -c "$deb")
for path in ./usr/bin/sortie ./etc/sortie/sortie.toml \
    ./lib/systemd/system/sortie.service ./lib/systemd/system/sortie-control.service \
    ./lib/systemd/system/sortie-worker.service ./lib/systemd/system/sortie-api.socket \
    ./lib/systemd/system/sortie-admin.socket ./lib/systemd/system/sortie-proxy.socket \
    ./usr/share/doc/sortie/README.md; do
  grep -q " $path\$" <<<"$listing" || { echo "missing from $deb: $path" >&2; echo "$listing" >&2; exit 1; }
done
control=$(mktemp -d)
trap 'rm -rf "$control"' EXIT
dpkg-deb -e "$deb" "$control"
grep -qx /etc/sortie/sortie.toml "$control/conffiles" \
  || { echo "/etc/sortie/sortie.toml is not a conffile" >&2; exit 1; }
grep -q "adduser --system" "$control/postinst" \
  || { echo "postinst does not create the sortie user" >&2; exit 1; }
# The packaged configuration is valid as shipped.
tmp=$(mktemp -d)
dpkg-deb -x "$deb" "$tmp"
"$tmp/usr/bin/sortie" check-config "$tmp/etc/sortie/sortie.toml"
rm -rf "$tmp"
echo "$deb"
