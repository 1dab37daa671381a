#!/usr/bin/env python3
# offcpu.py SCRIPT LOG: idle CPU time of the random agent's rounds and of the raw rounds around
# them, by the task that slept before each idle period and its kernel stack. SCRIPT: `perf
# script -F cpu,time,trace,ip,sym` of `perf record -e sched:sched_switch -a -g`; LOG: the bench's
# `--log engine::env=debug` stderr; sw.off beside: CLOCK_REALTIME - CLOCK_MONOTONIC at the start.
import re,sys,collections,datetime,os
# perf script of sched_switch with -g, clock realtime; log of engine::env=debug
log=sys.argv[2]
OFF=float(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),'sw.off')).read().split()[0])
def ts(s):  # 2026-12-07T00:44:17.740928Z -> epoch seconds
    return datetime.datetime.strptime(s[:26],'%Y-%m-%dT%H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()
steps=[]
for l in open(log):
    l=re.sub(r'\x1b\[[0-9;]*m','',l)
    m=re.match(r'(\S+Z)\s+DEBUG engine::env: env step step=\d+ action=(\w+)',l)
    if m: steps.append((ts(m.group(1)),m.group(2)))
# random windows: Index actions before the first non-true Command action
first_oracle=None
for l in open(log):
    l=re.sub(r'\x1b\[[0-9;]*m','',l)
    m=re.match(r'(\S+Z)\s+DEBUG engine::env: env step step=\d+ action=Command\("(.*?)"\)',l)
    if m and m.group(2)!='true': first_oracle=ts(m.group(1)); break
idx=[t for t,a in steps if a=='Index' and (first_oracle is None or t<first_oracle)]
wins=[]
for t in idx:
    if wins and t-wins[-1][1]<0.3: wins[-1][1]=t
    else: wins.append([t,t])
wins=[w for w in wins if w[1]-w[0]>0.5]
print('random rounds (first to last step of either worker, s):',[(round(b-a,2)) for a,b in wins])
# Each raw round, and the random round trimmed alike: 1.85 s from 0.05 s after its first step,
# so that neither holds the tail where one worker plays its last episode alone.
rounds=wins
wins=[[a+0.05,a+1.9] for a,b in rounds]
# raw windows: the 1.5 s before each random window (minus setup) and after
raw=[]
for a,b in rounds:
    raw.append([a-1.9,a-0.25]); raw.append([b+0.25,b+1.9])
def which(t):
    for a,b in wins:
        if a<=t<=b: return 'random'
    for a,b in raw:
        if a<=t<=b: return 'raw'
    return None
# parse perf script
ev=[]; cur=None
for line in open(sys.argv[1]):
    if line and not line[0].isspace():
        m=re.search(r'\[(\d+)\]\s+([\d.]+):\s+prev_comm=(.*?) prev_pid=(\d+) .*?prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)',line)
        if m:
            cur={'cpu':int(m.group(1)),'t':float(m.group(2))+OFF,'prev':m.group(3),'ppid':int(m.group(4)),'st':m.group(5),'next':m.group(6),'npid':int(m.group(7)),'stack':[]}
            ev.append(cur)
        else: cur=None
    elif cur is not None and line.strip():
        p=line.strip().split(None,1)
        if len(p)>1: cur['stack'].append(p[1].split('+')[0])
ev.sort(key=lambda e:e['t'])
open_idle={}
acc={'random':collections.Counter(),'raw':collections.Counter()}
tot={'random':0.0,'raw':0.0}
span={'random':sum(b-a for a,b in wins),'raw':sum(b-a for a,b in raw)}
skip={'__schedule','schedule','__traceiter_sched_switch','schedule_hrtimeout_range','schedule_timeout','__schedule_bug'}
switches={'random':0,'raw':0}
for e in ev:
    c=e['cpu']
    ph=which(e['t'])
    if ph: switches[ph]+=1
    if e['ppid']==0 and c in open_idle:
        t0,key=open_idle.pop(c)
        ph=which(t0)
        if ph: acc[ph][key]+=e['t']-t0; tot[ph]+=e['t']-t0
    if e['npid']==0:
        fr=[f for f in e['stack'] if f not in skip and not f.startswith('schedule') and not f.startswith('__schedule')][:3]
        comm=re.sub(r'\d+','N',e['prev'])
        open_idle[c]=(e['t'],comm+' '+e['st']+' | '+' < '.join(fr))
for ph in ('raw','random'):
    print('== %s: idle %.1f ms over %.2f s (x2 CPUs): %.1f%%; %.0f context switches a second'%(ph,1e3*tot[ph],span[ph],100*tot[ph]/(2*span[ph]),switches[ph]/span[ph]))
    for k,v in acc[ph].most_common(14): print('   %7.1f ms  %s'%(1e3*v,k[:170]))
