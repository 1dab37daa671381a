#!/usr/bin/env python3
"""ab_summ.py DIR WORKERS: per figure, base and new runs of ab.sh and the paired new/base ratio
(geometric mean, 95% t-interval over the pairs)."""
import json,glob,statistics as st,math,sys,os
d=sys.argv[1]
W=int(sys.argv[2]) if len(sys.argv)>2 else 2
T={2:12.706,3:4.303,4:3.182,5:2.776,6:2.571,7:2.447,8:2.365,9:2.306,10:2.262}
def get(b,i):
    return json.load(open(f'{d}/{b}-{i}.json'))
n=len(glob.glob(f'{d}/base-*.json'))
def ci(xs):
    m=st.mean(xs); h=T.get(len(xs),2)*st.stdev(xs)/math.sqrt(len(xs)) if len(xs)>1 else 0
    return '%.3f ± %.3f'%(m,h)
def row(name, f, fmt='%.3f'):
    b=[f(get('base',i)) for i in range(1,n+1)]; w=[f(get('new',i)) for i in range(1,n+1)]
    r=[y/x for x,y in zip(b,w)]
    gm=math.exp(st.mean(math.log(x) for x in r)); s=st.stdev([math.log(x) for x in r]) if n>1 else 0
    h=T.get(n,2)*s/math.sqrt(n)
    print('%-44s base %s | new %s | new/base %.3f [%.3f, %.3f]'%(name,' '.join(fmt%x for x in b),' '.join(fmt%x for x in w),gm,gm*math.exp(-h),gm*math.exp(h)))
def tp(agent,key):
    return lambda j: next(t[key] for t in j['throughput'] if t['agent']==agent and t['workers']==W)
row('random / raw-exec', lambda j: j['random_vs_raw'][0]['ratio'])
row('random / raw-exec-episodes', lambda j: j['random_vs_raw_episodes'][0]['ratio'])
row('reset (ms, idle median)', lambda j: j['reset']['median'])
for a in ('raw-exec','random','catalogue','oracle'):
    row(a+' steps/s', tp(a,'steps_per_s'),'%.0f')
    row(a+' reset ms/episode', tp(a,'reset_ms_per_episode'),'%.2f')
    row(a+' engine us/step', tp(a,'engine_cpu_us_per_step'),'%.0f')
    row(a+' init us/step', tp(a,'init_cpu_us_per_step'),'%.0f')
    row(a+' idle share', tp(a,'idle_cpu_share'),'%.3f')
