#!/usr/bin/env bash
# Wait until the machine is quiet: two 200 ms windows in a row with the CPUs busy less than
# 10% of one CPU (from /proc/stat), at most 10 s. What a previous command left running
# (a network namespace's cleanup in the kernel, a daemon's teardown) then does not weigh on
# the next one's timings. Exit 0 either way; prints a note to stderr after 10 s.
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
hz=$(getconf CLK_TCK)
quiet=0
for _ in $(seq 50); do
  a=$(busy)
  sleep 0.2
  b=$(busy)
  # ticks over 0.2 s; 10% of one CPU is 0.02 s of ticks
  if [ $(( (b - a) * 100 )) -lt $(( hz * 2 )) ]; then
    quiet=$((quiet + 1))
    [ "$quiet" -ge 2 ] && exit 0
  else
    quiet=0
  fi
done
echo "quiet.sh: the machine did not go quiet in 10 s; timing anyway" >&2
exit 0
