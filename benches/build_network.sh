#!/usr/bin/env bash
# The build network's cost (docs/harbor.md, "The build network"): the same download timed on
# the host and inside a Dockerfile `RUN` step through the build proxy, alternated ROUNDS
# times in one run; prints each round, the medians and their ratio (proxy / host).
#   benches/build_network.sh [URL]      (root; ENGINE, ROUNDS override)
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-target/release/engine}
ROUNDS=${ROUNDS:-5}
URL=${1:-https://files.pythonhosted.org/packages/3a/d0/edc009c27b406c4f9cbc79274d6e46d634d139075492ad055e3d68445925/numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -a tests/fixtures/harbor/harbor/hello-file "$work/task"
# One download, timed the same way on both sides: nanoseconds around curl, on stderr.
timed="t0=\$(date +%s%N); curl -sSf -o /dev/null '$URL'; t1=\$(date +%s%N); echo \"ns \$((t1 - t0))\" >&2"
host=() proxy=()
for i in $(seq "$ROUNDS"); do
  ns=$(sh -c "$timed" 2>&1 | sed -n 's/^ns //p')
  host+=("$ns")
  # A new instruction each round (no cached layer); the step fails on purpose so that no
  # layer is kept, and its error carries the time.
  printf 'FROM debian:bookworm\nRUN : round %s %s; %s; exit 3\n' "$i" "$$" "$timed" \
    > "$work/task/environment/Dockerfile"
  out=$("$ENGINE" harbor check --base host "$work/task" 2>&1 || true)
  ns=$(printf '%s\n' "$out" | grep -o 'ns [0-9]*' | head -1 | cut -d' ' -f2)
  [ -n "$ns" ] || { echo "no time in: $out" >&2; exit 1; }
  proxy+=("$ns")
  echo "round $i: host $((host[-1] / 1000000)) ms, build step through the proxy $((ns / 1000000)) ms"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
h=$(median "${host[@]}"); p=$(median "${proxy[@]}")
awk -v h="$h" -v p="$p" 'BEGIN {printf "median: host %.0f ms, proxy %.0f ms, ratio %.2f\n", h / 1e6, p / 1e6, p / h}'
