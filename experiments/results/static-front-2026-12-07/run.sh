#!/usr/bin/env bash
# run.sh [ROUNDS]: ROUNDS rounds (default 6) on an otherwise idle machine, each
#   1. benches/compare.sh 60: the one-shot made by the process itself, served asked by the
#      glibc-linked front of `cargo build` and by the static front of engine/front/install.sh,
#      bwrap and host `sh -c true`, hyperfine back to back (runs/compare-N.json);
#   2. loop.py: the same three served/bwrap commands in a plain loop, 4 blocks of 50 each,
#      rotated, with the whole machine's busy CPU per run from /proc/stat (runs/loop-N.json).
# Then `python3 summ.py`.
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
