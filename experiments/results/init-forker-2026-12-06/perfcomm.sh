#!/usr/bin/env bash
# perf samples by comm for N served one-shots of base and new (daemons started here).
set -u
n=${1:-300}
source "$(dirname "$0")/daemons.sh"
for r in 1 2; do
for b in base new; do
  export ENVFACTORY_EXEC_SOCKET=/tmp/ab/sock-$b/exec.sock
  /tmp/ab/$b/engine sandbox exec -- /bin/true
  "$quiet"
  perf record -F 5000 -a -o /tmp/ab/perf-$b.data -- bash -c "for i in \$(seq $n); do /tmp/ab/$b/engine sandbox exec -- /bin/true; done; sleep 0.3" > /dev/null 2>&1
  echo "== $b round $r"
  perf report -i /tmp/ab/perf-$b.data --sort comm --stdio -F overhead,sample,comm 2>/dev/null | grep -v "^#" | grep -v "^$" | head -14 | awk -v n=$n '{printf "%-20s %7.1f us/run\n", $3, $2/5000/n*1e6}'
done
done
