import json,glob,statistics as st,sys
d0=sys.argv[1] if len(sys.argv)>1 else '/tmp/ab/out'
rows={}
for f in sorted(glob.glob(d0+'/*.json')):
    try: d=json.load(open(f))
    except Exception as e: continue
    name=f.split('/')[-1][:-5]
    # TASK-PAIR-BUILD (the alternated pairs) or TASK-HHMMSS (final/: the committed build)
    parts=name.rsplit('-',2)
    if parts[-1] in ('base','new'):
        task,pair,build=parts
    else:
        task,build=name.rsplit('-',1)[0],'final'
    rv=d['random_vs_raw'][0]['ratio']
    rve=d.get('random_vs_raw_episodes',[{}])
    rve=rve[0].get('ratio') if rve else None
    es=d['env_step_true']['median']; ew=d['exec_warm_true']['median']
    tp={t['agent']:t for t in d['throughput'] if t['workers']==2}
    rows.setdefault((task,build),[]).append((rv,rve,es-ew,tp['random']['steps_per_s'],tp['raw-exec']['steps_per_s'],tp['catalogue']['steps_per_s']))
    print(name,'random/raw %.3f'%rv, ('eps %.3f'%rve) if rve else '', 'env adds %.3f ms'%(es-ew), 'random %.0f raw %.0f cat %.0f'%(tp['random']['steps_per_s'],tp['raw-exec']['steps_per_s'],tp['catalogue']['steps_per_s']))
for k,v in sorted(rows.items()):
    print(k,'median random/raw %.3f'%st.median([x[0] for x in v]),'env adds %.3f'%st.median([x[2] for x in v]))
