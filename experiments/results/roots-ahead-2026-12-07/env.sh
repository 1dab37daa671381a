#!/usr/bin/env bash
# env.sh BASE_TARGET_DIR [PAIRS]: `engine bench env --task archive-logs --workers 2 --seconds 8
# --iterations 3 --json` of the base build and of this checkout's release build, alternated,
# PAIRS pairs (default 2), into runs/env-{base,new}-N.json: that a step costs what it did.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=$1/engine-core
new=$(cd "$here/../../.." && pwd)/target/release/engine-core
for i in $(seq "${2:-2}"); do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for lab in $order; do
    if [ "$lab" = base ]; then E=$base; else E=$new; fi
    "$E" bench env --task archive-logs --workers 2 --seconds 8 --iterations 3 --json \
      > "$here/runs/env-$lab-$i.json"
  done
done
