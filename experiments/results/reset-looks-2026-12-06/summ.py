import json,glob,os,sys,statistics as st
d=sys.argv[1] if len(sys.argv)>1 else '/tmp/ab2/out'
rows=[]
for f in sorted(glob.glob(d+'/*.json')):
    try: j=json.load(open(f))
    except Exception: continue
    name=os.path.basename(f)[:-5]
    task,pair,build=name.rsplit('-',2)
    t={x['agent']:x for x in j['throughput'] if x['workers']==2}
    r=t['random']; raw=t['raw-exec']; rawe=t['raw-exec-episodes']
    rows.append((task,pair,build,j['random_vs_raw'][0]['ratio'],j['random_vs_raw_episodes'][0]['ratio'],r['steps_per_s'],raw['steps_per_s'],r['engine_cpu_us_per_step'],rawe['engine_cpu_us_per_step'],r['init_cpu_us_per_step'],rawe['init_cpu_us_per_step'],j['env_step_true']['median']-j['exec_warm_true']['median'],r['reset_ms_per_episode']))
print('task pair build | rand/raw rand/rawE | rand_sps raw_sps | engCPU rand rawE | initCPU rand rawE | env_true_ms | reset_ms')
for x in rows: print('%s %s %s | %.3f %.3f | %.0f %.0f | %.0f %.0f | %.0f %.0f | %.3f | %.2f'%x)
