#!/bin/bash
# usage: cpu.sh N cmd...   prints wall ms/run and busy CPU ms/run (from /proc/stat)
n=$1; shift
busy() { read -r _ u n s i w q sq _ </proc/stat; echo $((u + n + s + q + sq)); }
"$(dirname "$0")/../../../benches/quiet.sh"
a=$(busy); t0=$(date +%s%N)
for ((k=0;k<n;k++)); do "$@" >/dev/null; done
t1=$(date +%s%N); sleep 0.5; b=$(busy)
hz=$(getconf CLK_TCK)
echo "wall $(( (t1-t0)/n/1000 )) us/run; busy $(( (b-a)*1000000/hz/n )) us/run (incl 0.5s tail)"
