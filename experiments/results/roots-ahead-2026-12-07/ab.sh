#!/usr/bin/env bash
# ab.sh BASE_TARGET_DIR [LAST [FIRST]]: `engine bench sandbox --json` of the base build (the
# release target directory of main e89166d, with its engine-core, engine and envfactory-init)
# and of this checkout's release build, alternated (which goes first alternates too), pairs
# FIRST..LAST (default 1..5), into runs/{base,new}-N.json. Each run times bwrap itself, so
# each ratio is of one run. Run from anywhere on an otherwise idle machine; needs root and
# bwrap.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=$1/engine-core
new=$(cd "$here/../../.." && pwd)/target/release/engine-core
for i in $(seq "${3:-1}" "${2:-5}"); do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for lab in $order; do
    if [ "$lab" = base ]; then E=$base; else E=$new; fi
    "$E" bench sandbox --json > "$here/runs/$lab-$i.json"
  done
done
