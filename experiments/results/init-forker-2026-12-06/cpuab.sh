#!/usr/bin/env bash
set -u
n=${1:-200}; rounds=${2:-8}
pids=()
for b in base new; do
  d=/tmp/ab/sock-$b; rm -rf $d; mkdir -p $d
  /tmp/ab/$b/engine sandbox daemon --socket $d/exec.sock 2>$d/daemon.log &
  pids+=($!)
done
trap 'kill ${pids[@]}; wait' EXIT
sleep 3
for r in $(seq $rounds); do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do
    echo "$r $b $(ENVFACTORY_EXEC_SOCKET=/tmp/ab/sock-$b/exec.sock /tmp/cpu.sh $n /tmp/ab/$b/engine sandbox exec -- /bin/true)"
  done
done
