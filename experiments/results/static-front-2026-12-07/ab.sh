#!/bin/sh
# ab.sh BASE_DIR NEW_DIR [PAIRS]: no regression of the rest of the engine by this change (its
# sandbox-crate edits are on the reset and namespace paths): the env target and the sandbox
# figures of two builds' engine programs, alternated (which goes first alternates too), PAIRS
# times (default 4): `bench env --task archive-logs --workers 2 --seconds 8 --iterations 3`
# and `bench sandbox`, into ab/{base,new}-N.json and ab/{base,new}-sandbox-N.json.
# Run from the repository root.
set -e
D=$(dirname "$0")/ab
mkdir -p "$D"
for i in $(seq 1 "${3:-4}"); do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for lab in $order; do
    if [ "$lab" = base ]; then E=$1/engine-core; else E=$2/engine-core; fi
    "$E" bench env --task archive-logs --workers 2 --seconds 8 --iterations 3 --json > "$D/$lab-$i.json" 2> "$D/$lab-$i.err"
    "$E" bench sandbox --json > "$D/$lab-sandbox-$i.json" 2>> "$D/$lab-$i.err"
  done
done
