#!/usr/bin/env bash
# Wait until the machine is quiet: two 200 ms windows in a row with the CPUs busy less than
# 10% of one CPU (from /proc/stat), at most 10 s. What a previous command left running
# (a network namespace's cleanup in the kernel, a daemon's teardown) then does not weigh on
# the next one's timings. Exit 0 either way; a note on stderr when it did not go quiet.
busy() {
  # user nice system (idle iowait) irq softirq: summed in bash (awk may print large sums in
  # exponent form)
  local _ u n s i w q sq
  read -r _ u n s i w q sq _ </proc/stat
  echo $((u + n + s + q + sq))
}
hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
quiet=0
for _ in $(seq 50); do
  a=$(busy)
  sleep 0.2
  b=$(busy)
  # 10% of one CPU over 0.2 s is 0.02 s, hz/50 ticks
  if [ $(((b - a) * 50)) -lt "$hz" ]; then
    quiet=$((quiet + 1))
    [ "$quiet" -ge 2 ] && exit 0
  else
    quiet=0
  fi
done
echo "quiet.sh: the machine did not go quiet in 10 s; timing anyway" >&2
exit 0
