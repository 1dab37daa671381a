#!/usr/bin/env bash
# A/B of the front: one daemon, the same one-shot asked by the `engine` front and by the
# engine program itself (`engine-core`, the client every one-shot was before the front),
# beside bubblewrap; and both `--no-daemon` (the front hands over to the engine program).
# Each round is one hyperfine run, the order of front and engine program alternated; then
# the machine's busy CPU per served one-shot for both (cpu.sh). Binaries: BIN (default
# target/release) copied to a directory of their own.
# Usage: ab.sh OUT ROUNDS RUNS
set -u
out=$1; rounds=${2:-3}; runs=${3:-60}
here=$(cd "$(dirname "$0")" && pwd)
quiet=$here/../../../benches/quiet.sh
cpu=$here/../init-forker-2026-12-06/cpu.sh
bin=${BIN:-$here/../../../target/release}
d=$(mktemp -d /tmp/envfactory-front-ab-XXXXXX)
cp "$bin/engine" "$bin/engine-core" "$bin/envfactory-init" "$d/"
mkdir -p "$out"
"$d/engine" sandbox daemon --socket "$d/exec.sock" 2>"$d/daemon.log" &
daemon=$!
trap 'kill $daemon; wait $daemon; rm -rf "$d"' EXIT
export ENVFACTORY_EXEC_SOCKET=$d/exec.sock
for _ in $(seq 100); do "$d/engine" sandbox exec -- /bin/true 2>/dev/null && break; sleep 0.1; done
"$d/engine-core" sandbox exec -- /bin/true || exit 1
bwrap="bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev /bin/true"
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="engine engine-core"; else order="engine-core engine"; fi
  args=()
  for b in $order; do args+=(-n "served-$b" "$d/$b sandbox exec -- /bin/true"); done
  args+=(-n bwrap "$bwrap")
  for b in $order; do args+=(-n "own-$b" "$d/$b sandbox exec --no-daemon -- /bin/true"); done
  hyperfine -N --setup "$quiet" --warmup 5 --runs "$runs" --export-json "$out/round-$r.json" "${args[@]}" > "$out/round-$r.txt" 2>&1
  for b in $order; do
    "$cpu" 200 "$d/$b" sandbox exec -- /bin/true > "$out/cpu-$r-$b.txt"
  done
  "$cpu" 200 $bwrap > "$out/cpu-$r-bwrap.txt"
done
echo done
