#!/bin/sh
# ab.sh DIR BASE NEW [PAIRS]: alternated pairs of `engine bench env --workers 2 --seconds 8`
# of two engine-core binaries (the order alternates), into DIR/{base,new}N.json.
dir=$1 base=$2 new=$3 pairs=${4:-5}
mkdir -p "$dir"
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do
    bin=$base; [ "$b" = new ] && bin=$new
    "$bin" bench env --task archive-logs --workers 2 --seconds 8 --iterations 3 --json > "$dir/$b$i.json" 2> "$dir/$b$i.err"
    echo "$b $i $(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$dir/log"
  done
done
echo done >> "$dir/log"
