#!/usr/bin/env bash
# A/B: base (d4dbc2a) against new, alternated, engine bench env --workers 2.
set -u
out=/tmp/ab/out; mkdir -p $out
for task in archive-logs fix-permissions; do
  for pair in 1 2 3; do
    for build in base new; do
      if [ $build = base ]; then e=/tmp/base-target/release/engine; else e=/work/main/target/release/engine; fi
      $e bench env --task $task --workers 2 --seconds 8 --iterations 5 --json > $out/$task-$pair-$build.json 2>$out/$task-$pair-$build.err
    done
  done
done
echo done
