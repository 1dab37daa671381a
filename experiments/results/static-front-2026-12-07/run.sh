#!/usr/bin/env bash
# run.sh [ROUNDS]: ROUNDS rounds (default 6) on an otherwise idle machine, each
#   1. benches/compare.sh 60: the one-shot made by the process itself, served asked by the
#      glibc-linked front of `cargo build` and by the static front of engine/front/install.sh,
#      bwrap and host `sh -c true`, hyperfine back to back (runs/compare-N.json);
#   2. loop.py: the same three served/bwrap commands in a plain loop, 4 blocks of 50 each,
#      rotated, with the whole machine's busy CPU per run from /proc/stat (runs/loop-N.json).
# Then 3 hyperfine runs of the two fronts' own start (`engine __front-build`,
# runs/front-start-N.json), 4 alternated pairs of `engine bench sandbox --json` run through
# each front (bench-sandbox/), and `python3 summ.py`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
rounds=${1:-6}
mkdir -p "$here/runs"
git rev-parse HEAD > "$here/runs/commit"
for i in $(seq "$rounds"); do
  benches/compare.sh 60 > "$here/runs/compare-$i.txt" 2>&1
  cp out/compare.json "$here/runs/compare-$i.json"
  python3 "$here/loop.py" target/release/engine target/static/engine > "$here/runs/loop-$i.json"
done
for i in 1 2 3; do
  hyperfine -N --warmup 20 --runs 300 "target/static/engine __front-build" \
    "target/release/engine __front-build" --export-json "$here/runs/front-start-$i.json" >/dev/null
done
mkdir -p "$here/bench-sandbox"
for i in 1 2 3 4; do
  target/release/engine bench sandbox --json > "$here/bench-sandbox/glibc-$i.json"
  target/static/engine bench sandbox --json > "$here/bench-sandbox/static-$i.json"
done
python3 "$here/summ.py" > "$here/summary.txt"
