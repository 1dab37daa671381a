#!/bin/sh
# 4 runs of engine bench env on 1, 2 and 3 workers, into $OUT (default runs/) beside this script.
for i in 1 2 3 4; do
  ${ENGINE_CORE:-target/release/engine-core} bench env --task archive-logs --workers 1,2,3 --seconds 8 --iterations 5 --json > $(dirname "$0")/${OUT:-runs}/$i.json 2>$(dirname "$0")/${OUT:-runs}/$i.err
  echo "run $i done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $(dirname "$0")/${OUT:-runs}/log
done
