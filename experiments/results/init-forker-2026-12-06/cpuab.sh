#!/usr/bin/env bash
# Busy CPU per served one-shot (cpu.sh) of base and new, alternated. Usage: cpuab.sh N ROUNDS
set -u
n=${1:-200}; rounds=${2:-8}
source "$(dirname "$0")/daemons.sh"
for r in $(seq $rounds); do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do
    echo "$r $b $(ENVFACTORY_EXEC_SOCKET=/tmp/ab/sock-$b/exec.sock "$here/cpu.sh" $n /tmp/ab/$b/engine sandbox exec -- /bin/true)"
  done
done
