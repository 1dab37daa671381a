#!/usr/bin/env bash
# run.sh BASE_DIR [ROUNDS]: issue 14's figures before and after, in the same runs. BASE_DIR holds
# a release build of main as it was when the issue was filed (718b372: `git worktree add
# /tmp/base14 718b372 && cargo build --release --bins` there, so BASE_DIR is
# /tmp/base14/target/release); this checkout's release build and static front are the after.
# ROUNDS rounds (default 4) on an otherwise idle machine, each
#   1. hyperfine, 60 runs of each, back to back, the machine let go quiet before each series
#      (benches/quiet.sh): the base's `engine sandbox exec -- /bin/true` (a whole process, as
#      the issue timed it), this build's `--no-daemon` one-shot, its one-shot served by a
#      daemon of this build, asked by `cargo build`'s front and by the static front
#      (engine/front/install.sh), bwrap --unshare-all (read-only host root, /proc, /dev) and
#      host `sh -c true` (runs/oneshot-N.json);
#   2. `engine bench sandbox --json` of each build, which goes first alternating
#      (runs/{base,new}-sandbox-N.json);
#   3. `engine bench env --task archive-logs --workers 2 --seconds 8 --iterations 3 --json` of
#      each build, alternating the same way (runs/{base,new}-env-N.json).
# Both builds share one state directory of their own ($ENVFACTORY_STATE; at the end its instance
# cache's tmpfs is unmounted and the directory removed).
# Then `python3 summ.py > summary.txt` (pause.sh and pause-bwrap.sh, run after it, add sections 4
# and 5: run summ.py again). Needs root, hyperfine, bwrap, rustup (musl target).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=$(cd "$1" && pwd)
rounds=${2:-4}
cd "$here/../../.."
cargo build --release -q --bin engine --bin engine-core --bin envfactory-init
engine/front/install.sh target/static > /dev/null
new=$PWD/target/release
mkdir -p "$here/runs"
{ echo "new $(git describe --always --dirty) diff $(git diff HEAD | sha256sum | cut -c1-16) $(sha256sum "$new/engine-core" | cut -c1-16)"
  echo "base $(git -C "$base" rev-parse HEAD 2>/dev/null || echo '?') $(sha256sum "$base/engine" | cut -c1-16)"
  uname -r; nproc; } > "$here/runs/builds"
export ENVFACTORY_STATE=/var/lib/envfactory-issue14-ab
mkdir -p "$ENVFACTORY_STATE"
sockdir=$(mktemp -d /tmp/envfactory-ab14-XXXXXX)
sock=$sockdir/exec.sock
"$new/engine" sandbox daemon --socket "$sock" 2>"$sockdir/daemon.log" &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; rm -rf "$sockdir"; "$new/engine-core" reap >/dev/null 2>&1 || true; umount "$ENVFACTORY_STATE/instances" 2>/dev/null || true; rm -rf "$ENVFACTORY_STATE"' EXIT
for _ in $(seq 300); do
  ENVFACTORY_EXEC_SOCKET=$sock "$new/engine" sandbox exec -- /bin/true 2>/dev/null && break
  sleep 0.1
done
export ENVFACTORY_EXEC_SOCKET=$sock
for i in $(seq "$rounds"); do
  hyperfine -N --setup "$PWD/benches/quiet.sh" --warmup 5 --runs 60 \
    -n "base: engine sandbox exec" "$base/engine sandbox exec -- /bin/true" \
    -n "new: engine sandbox exec --no-daemon" "$new/engine sandbox exec --no-daemon -- /bin/true" \
    -n "new: served, cargo build's front" "$new/engine sandbox exec -- /bin/true" \
    -n "new: served, static front" "$PWD/target/static/engine sandbox exec -- /bin/true" \
    -n "bwrap --unshare-all" "bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev /bin/true" \
    -n "host sh -c true" "sh -c true" \
    --export-json "$here/runs/oneshot-$i.json" > "$here/runs/oneshot-$i.txt" 2>&1
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for part in sandbox env; do
    for lab in $order; do
      if [ "$lab" = base ]; then E=$base/engine; else E=$new/engine-core; fi
      if [ "$part" = sandbox ]; then
        "$E" bench sandbox --json > "$here/runs/$lab-sandbox-$i.json" 2>> "$here/runs/$lab.err"
      else
        "$E" bench env --task archive-logs --workers 2 --seconds 8 --iterations 3 --json \
          > "$here/runs/$lab-env-$i.json" 2>> "$here/runs/$lab.err"
      fi
      echo "$part $lab $i $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/runs/log"
    done
  done
done
python3 "$here/summ.py" > "$here/summary.txt"
