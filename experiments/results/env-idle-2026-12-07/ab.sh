#!/bin/sh
# ab.sh OUT WORKERS: 3 alternated pairs of `engine bench env --workers WORKERS --seconds 8`,
# base (binaries in $BASE, default /tmp/base14) and new (in $NEW, default /tmp/new14), each a
# directory with engine-core and envfactory-init of one build.
out=$1; w=${2:-2}; mkdir -p "$out"
for i in 1 2 3; do
  for b in base new; do
    [ $i = 2 ] && { [ $b = base ] && b=new || b=base; }
    dir=$BASE; [ $b = new ] && dir=$NEW
    "${dir:-/tmp/${b}14}/engine-core" bench env --task archive-logs --workers "$w" --seconds 8 \
      --iterations 5 --json > "$out/$b-$i.json" 2> "$out/$b-$i.err"
    echo "$b $i done $(date +%T)" >> "$out/log"
  done
done
