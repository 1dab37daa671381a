#!/usr/bin/env bash
# A/B: base against new, alternated (README.md says which builds).
# Usage: run.sh OUT_DIR [NEW_DIR] [FIRST_PAIR] [LAST_PAIR], with the base build at /tmp/ab/base
# and the new one at NEW_DIR (default /tmp/ab/new), engine and envfactory-init side by side.
set -u
out=${1:-/tmp/ab/out}; new=${2:-/tmp/ab/new}; first=${3:-1}; last=${4:-3}
mkdir -p "$out"
for pair in $(seq "$first" "$last"); do
  for task in archive-logs fix-permissions; do
    for build in base new; do
      if [ $build = base ]; then dir=/tmp/ab/base; else dir=$new; fi
      "$dir/engine" bench env --task $task --workers 2 --seconds 8 --iterations 5 --json \
        > "$out/$task-$pair-$build.json" 2> "$out/$task-$pair-$build.err"
    done
  done
  for build in base new; do
    if [ $build = base ]; then dir=/tmp/ab/base; else dir=$new; fi
    "$dir/engine" bench sandbox --iterations 50 --json \
      > "$out/sandbox-$pair-$build.json" 2> "$out/sandbox-$pair-$build.err"
  done
done
echo done
