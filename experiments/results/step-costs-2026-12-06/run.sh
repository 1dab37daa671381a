#!/usr/bin/env bash
# A/B: base against new, alternated (README.md says which builds). Usage: run.sh OUT_DIR, with
# the builds at /tmp/ab/base and /tmp/ab/new (engine and envfactory-init side by side).
set -u
out=${1:-/tmp/ab/out}; mkdir -p "$out"
for pair in 1 2 3; do
  for task in archive-logs fix-permissions; do
    for build in base new; do
      /tmp/ab/$build/engine bench env --task $task --workers 2 --seconds 8 --iterations 5 --json \
        > "$out/$task-$pair-$build.json" 2> "$out/$task-$pair-$build.err"
    done
  done
  for build in base new; do
    /tmp/ab/$build/engine bench sandbox --iterations 50 --json \
      > "$out/sandbox-$pair-$build.json" 2> "$out/sandbox-$pair-$build.err"
  done
done
echo done
