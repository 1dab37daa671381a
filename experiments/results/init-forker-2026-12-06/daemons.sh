# Sourced by served.sh, cpuab.sh and perfcomm.sh: a daemon of each build (/tmp/ab/base and
# /tmp/ab/new, engine and envfactory-init side by side), each on its own socket
# /tmp/ab/sock-BUILD/exec.sock, stopped when the script exits. Sets `here` (this directory)
# and `quiet` (the repository's benches/quiet.sh).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
quiet=$here/../../../benches/quiet.sh
pids=()
for b in base new; do
  d=/tmp/ab/sock-$b; rm -rf $d; mkdir -p $d
  /tmp/ab/$b/engine sandbox daemon --socket $d/exec.sock 2>$d/daemon.log &
  pids+=($!)
done
trap 'kill ${pids[@]}; wait' EXIT
sleep 3
