# Lists Megatron-LM functional tests' measured peaks: run inside a Megatron-LM git checkout (read at d98e8a6); prints
# each golden_values_*.json's largest mem-max-allocated-bytes with the test's model_config.yaml arguments, as JSON.
# A research aid (not part of ddplan, not run by its tests); validation/memory_peaks.yaml holds the rows used.
import subprocess, json, yaml, sys, re
def sh(*a): return subprocess.run(a, capture_output=True, text=True).stdout
files = sh('git','ls-tree','-r','--name-only','HEAD','tests/functional_tests/test_cases').split('\n')
gold = [f for f in files if re.search(r'golden_values_(dev|lts)_dgx_(h100|a100)\.json$', f)]
rows=[]
keys=['--tensor-model-parallel-size','--pipeline-model-parallel-size','--context-parallel-size','--expert-model-parallel-size','--num-experts','--micro-batch-size','--global-batch-size','--seq-length','--num-layers','--hidden-size','--ffn-hidden-size','--num-attention-heads','--num-query-groups','--recompute-granularity','--recompute-method','--recompute-num-layers','--use-distributed-optimizer','--sequence-parallel','--bf16','--fp16','--fp8-format','--transformer-impl','--vocab-size','--tokenizer-type','--num-layers-per-virtual-pipeline-stage','--untie-embeddings-and-output-weights','--swiglu','--use-megatron-fsdp','--data-parallel-sharding-strategy','--use-torch-fsdp2','--attention-backend','--use-flash-attn','--mock-data','--vocab-file','--cpu-offloading','--optimizer-cpu-offload','--moe-router-topk','--position-embedding-type','--recompute-modules','--main-params-dtype','--exp-avg-dtype','--use-precision-aware-optimizer','--group-query-attention']
for g in gold:
    d = g.rsplit('/',1)[0]
    try:
        gv = json.loads(sh('git','show','HEAD:'+g))
    except Exception: continue
    if 'mem-max-allocated-bytes' not in gv: continue
    mm = gv['mem-max-allocated-bytes']
    if not isinstance(mm, dict): continue
    vals = mm.get('values',{})
    nums=[v for v in vals.values() if isinstance(v,(int,float)) and v==v]
    if not nums: continue
    cfg_txt = sh('git','show','HEAD:'+d+'/model_config.yaml')
    try: cfg = yaml.safe_load(cfg_txt)
    except Exception: cfg={}
    ma = (cfg or {}).get('MODEL_ARGS',{}) or {}
    r = {'dir':d.split('test_cases/')[1],'gold':g.rsplit('golden_values_',1)[1],'peak_max':max(nums),'peak_last':nums[-1] if nums else None,'nsteps':len(nums)}
    for k in keys:
        if k in ma: r[k]=ma[k]
    rows.append(r)
json.dump(rows, open('/tmp/mlm/rows.json','w'), indent=1, default=str)
print(len(rows))
