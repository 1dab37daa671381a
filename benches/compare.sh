#!/usr/bin/env bash
# Whole-process start, side by side in one run: `engine sandbox exec -- /bin/true`, made by
# the process itself and served by `engine sandbox daemon` (asked by `cargo build`'s front and
# by the static front of engine/front/install.sh), against bubblewrap
# (`--unshare-all`, read-only host root, /proc, /dev) and Docker when installed. Each
# command's runs follow one another (hyperfine), so the daemon's work after each request
# (the next sandbox made ahead, the last one torn down) overlaps the next run. Before each
# command's series the machine is let go quiet (benches/quiet.sh): what the previous series
# left to the kernel (dozens of network namespaces to clean up, after a one-shot or bwrap)
# is not charged to the next command.
# Needs root and hyperfine; installs hyperfine and bubblewrap from Debian if missing.
# Usage: benches/compare.sh [RUNS]   (prints hyperfine's table and writes out/compare.json)
set -euo pipefail
runs=${1:-40}
cd "$(dirname "$0")/.."
need=()
command -v hyperfine >/dev/null || need+=(hyperfine)
command -v bwrap >/dev/null || need+=(bubblewrap)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release -q --bin engine --bin engine-core --bin envfactory-init
engine=${CARGO_TARGET_DIR:-target}/release/engine
# The static front (engine/front/install.sh: musl, beside hard links of the same engine
# program), timed beside `cargo build`'s glibc-linked one when rustup can add the musl target.
static=${CARGO_TARGET_DIR:-target}/static
mkdir -p out
if command -v rustup >/dev/null && engine/front/install.sh "$static" >out/static-front.log 2>&1; then
  static_engine=$static/engine
else
  static_engine=
  echo "compare.sh: no static front (engine/front/install.sh failed, out/static-front.log): its row is left out" >&2
fi
# The one-shot served by a daemon of this build, on a socket of its own (stopped at exit).
sockdir=$(mktemp -d /tmp/envfactory-compare-XXXXXX)
sock=$sockdir/exec.sock
"$engine" sandbox daemon --socket "$sock" 2>"$sockdir/daemon.log" &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; rm -rf "$sockdir"' EXIT
ready=0
for _ in $(seq 300); do
  if ENVFACTORY_EXEC_SOCKET=$sock "$engine" sandbox exec -- /bin/true 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "compare.sh: the one-shot daemon did not answer in 30 s:" >&2
  cat "$sockdir/daemon.log" >&2
  exit 1
fi
export ENVFACTORY_EXEC_SOCKET=$sock
cmds=(
  "$engine sandbox exec --no-daemon -- /bin/true"
  "$engine sandbox exec -- /bin/true"
  "bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev /bin/true"
  "sh -c true"
)
names=("engine sandbox exec" "engine sandbox exec (daemon)" "bwrap --unshare-all" "host sh -c true")
if [ -n "$static_engine" ]; then
  cmds+=("$static_engine sandbox exec -- /bin/true")
  names+=("engine sandbox exec (daemon, static front)")
fi
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  img=$(docker images -q | head -n 1)
  if [ -n "$img" ]; then
    cmds+=("docker run --rm --network=none $img /bin/true")
    names+=("docker run")
  fi
fi
args=()
for i in "${!cmds[@]}"; do args+=(-n "${names[$i]}" "${cmds[$i]}"); done
hyperfine -N --setup "$PWD/benches/quiet.sh" --warmup 5 --runs "$runs" --export-json out/compare.json "${args[@]}"
