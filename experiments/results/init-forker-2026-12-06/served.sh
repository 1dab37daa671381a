#!/usr/bin/env bash
# A/B of the served one-shot: base and new daemons side by side, hyperfine back to back.
# Usage: served.sh OUT ROUNDS RUNS
set -u
out=$1; rounds=${2:-3}; runs=${3:-60}
mkdir -p "$out"
source "$(dirname "$0")/daemons.sh"
for b in base new; do ENVFACTORY_EXEC_SOCKET=/tmp/ab/sock-$b/exec.sock /tmp/ab/$b/engine sandbox exec -- /bin/true || exit 1; done
for r in $(seq $rounds); do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  args=()
  for b in $order; do args+=(-n "served-$b" "env ENVFACTORY_EXEC_SOCKET=/tmp/ab/sock-$b/exec.sock /tmp/ab/$b/engine sandbox exec -- /bin/true"); done
  args+=(-n bwrap "bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev /bin/true")
  hyperfine -N --setup "$quiet" --warmup 5 --runs $runs --export-json $out/round-$r.json "${args[@]}" > $out/round-$r.txt 2>&1
  for b in $order; do
    ENVFACTORY_EXEC_SOCKET=/tmp/ab/sock-$b/exec.sock "$here/cpu.sh" 200 /tmp/ab/$b/engine sandbox exec -- /bin/true > $out/cpu-$r-$b.txt
  done
  "$here/cpu.sh" 200 bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev /bin/true > $out/cpu-$r-bwrap.txt
done
echo done
