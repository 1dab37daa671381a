#!/usr/bin/env bash
# pause-bwrap.sh [ROUNDS]: what a pause before a process costs on this machine. hyperfine, 60
# runs each: bwrap back to back, and bwrap after `sleep 0.025` (hyperfine's --prepare, not
# timed); runs/pause-bwrap-N.json. Needs hyperfine and bwrap.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
b="bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev /bin/true"
for i in $(seq "${1:-3}"); do
  hyperfine -N --warmup 5 --runs 60 -n "back to back" "$b" \
    --export-json "$here/runs/pause-bwrap-b2b-$i.json" > /dev/null
  hyperfine -N --warmup 5 --runs 60 --prepare "sleep 0.025" -n "after 25 ms" "$b" \
    --export-json "$here/runs/pause-bwrap-paused-$i.json" > /dev/null
done
