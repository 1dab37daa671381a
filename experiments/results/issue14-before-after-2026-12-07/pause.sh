#!/usr/bin/env bash
# pause.sh OLD_ENGINE_CORE [PAIRS]: what the benchmark's pause did to its ratios. OLD_ENGINE_CORE
# is the engine program of main c2e897e, whose `engine bench sandbox` timed bwrap after a 25 ms
# pause and its creates without one; this checkout's release build times each of them after
# the same pause. PAIRS alternated pairs (default 4) of `bench sandbox --json`, into
# runs/pause-{old,fixed}-N.json. Run from anywhere; needs root and bwrap.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
old=$1
fixed=$(cd "$here/../../.." && pwd)/target/release/engine-core
for i in $(seq "${2:-4}"); do
  if [ $((i % 2)) = 1 ]; then order="old fixed"; else order="fixed old"; fi
  for lab in $order; do
    if [ "$lab" = old ]; then E=$old; else E=$fixed; fi
    "$E" bench sandbox --json > "$here/runs/pause-$lab-$i.json"
  done
done
