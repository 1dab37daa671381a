#!/bin/sh
# The 2-worker target in both forms of run, alternated, on one build: form A
# (`--workers 2 --iterations 3`, as ../env-reset-2026-12-07/ab.sh) and form B
# (`--workers 1,2,3 --iterations 5`, as ../env-reset-2026-12-07/run.sh), PAIRS times each,
# into runs/A-N.json and runs/B-N.json (stderr beside each), a line per run in runs/log.
# Run from the repository root: experiments/results/env-target-2026-12-07/run.sh [PAIRS]
set -e
D=$(dirname "$0")/runs
E=${ENGINE_CORE:-target/release/engine-core}
mkdir -p "$D"
for i in $(seq 1 "${1:-6}"); do
  for f in A B; do
    if [ "$f" = A ]; then w=2 it=3; else w=1,2,3 it=5; fi
    "$E" bench env --task archive-logs --workers $w --seconds 8 --iterations $it --json > "$D/$f-$i.json" 2> "$D/$f-$i.err"
    echo "$f-$i done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) $(git describe --always --dirty) $(sha256sum "$E" | cut -c1-12)" >> "$D/log"
  done
done
