#!/usr/bin/env bash
# The request path's futures whose state before the first poll is large: each move of such a
# future copies that many bytes (perf/future_sizes.py says why). Builds sortie-io once with the
# nightly compiler's -Zprint-type-sizes in its own target directory (a few minutes the first
# time) and lists them. MIN=bytes (default 512), MATCH=regex of names (default: the request
# path's modules). See perf/README.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
MIN=${MIN:-512}
MATCH=${MATCH:-}
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "future_sizes.sh: needs the nightly toolchain for -Zprint-type-sizes:" \
    "rustup toolchain install nightly --profile minimal" >&2
  exit 1
fi
out=$root/target/type-sizes
mkdir -p "$out"
(cd "$root" && CARGO_TARGET_DIR=$out/build cargo +nightly rustc -p sortie-io --release --lib \
  -- -Zprint-type-sizes >"$out/sizes.txt")
python3 "$here/future_sizes.py" "$out/sizes.txt" --min "$MIN" ${MATCH:+--match "$MATCH"}
