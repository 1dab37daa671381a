#!/usr/bin/env bash
# A/B: base against new, alternated, engine bench env --workers 2 (README.md says which builds).
# Usage: run.sh OUT_DIR, with the builds at /tmp/base/engine and /tmp/new/engine (each with its
# envfactory-init beside it).
set -u
out=${1:-/tmp/ab2/out}; mkdir -p $out
for pair in 1 2 3; do
  for task in archive-logs fix-permissions; do
    for build in base new; do
      if [ $build = base ]; then e=/tmp/base/engine; else e=/tmp/new/engine; fi
      $e bench env --task $task --workers 2 --seconds 8 --iterations 5 --json > $out/$task-$pair-$build.json 2>$out/$task-$pair-$build.err
    done
  done
done
echo done
