#!/bin/bash
# A/B: engine bench env, old and new binaries alternated. Usage: ab_env.sh OLD NEW ROUNDS TASK
OLD=$1; NEW=$2; N=${3:-3}; TASK=${4:-archive-logs}
export ENVFACTORY_STATE=/tmp/abstate; mkdir -p $ENVFACTORY_STATE
for i in $(seq 1 $N); do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    echo "round $i $b load $(cut -d' ' -f1 /proc/loadavg)"
    $bin bench env --task $TASK --workers 2 --seconds 5 --iterations 5 --json > /tmp/ab-$TASK-$b-$i.json 2>/dev/null
  done
done
python3 - "$TASK" "$N" <<'PY'
import json,sys,statistics as st
task,n=sys.argv[1],int(sys.argv[2])
for b in ['old','new']:
    rows=[]
    for i in range(1,n+1):
        j=json.load(open(f'/tmp/ab-{task}-{b}-{i}.json'))
        t={(x['agent'],x['workers']):x['steps_per_s'] for x in j['throughput']}
        rows.append((t[('raw-exec',2)],t[('random',2)],t[('oracle',2)],j['exec_sh_true']['median'],j['host_sh_true']['median'],j['reset']['median']))
    for r in rows: print(b,'raw %.0f random %.0f oracle %.0f random/raw %.3f floor %.2f host %.2f reset %.2f'%(r[0],r[1],r[2],r[1]/r[0],r[3],r[4],r[5]))
    print(b,'median random/raw %.3f, random %.0f, oracle %.0f'%(st.median(r[1]/r[0] for r in rows),st.median(r[1] for r in rows),st.median(r[2] for r in rows)))
PY
