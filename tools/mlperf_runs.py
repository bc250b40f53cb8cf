#!/usr/bin/env python3
"""Transcribe MLPerf Training LLM-pretraining results (GPT-3 175B, Llama 3.1 405B, Llama 3.1 8B) on NVIDIA
H100/H200/B200/GB200/B300/GB300 into ddplan's published-runs format (kind: runs).

Reads the local git mirrors of mlcommons/training_results_v4.0, v4.1, v5.0, v5.1 (the `fetch` tool's copies under
/work/.mirror) at the commits below, and writes /tmp/mlperf/mlperf_runs.yaml (plus /tmp/mlperf/scan.tsv: every
candidate result directory and what became of it).

For each results/<system>/<benchmark>/ directory of the three benchmarks:
  * systems/<system>.json: GPU model, nodes x GPUs a node -> ddplan hardware name (h100-sxm, h200, b200, gb200,
    b300, gb300); other accelerators (TPU, Gaudi, AMD Instinct) are left out (no ddplan spec / out of scope).
  * result_*.txt (MLLOG): global_batch_size, max_sequence_length, opt_base_learning_rate, warmup steps, and the
    per-step training time in tracked_stats ("train_step_timing in s" in v4.x, "train_step_time" in v5.x);
    step time = median over a file's logged values, then the median over the files of the system.
  * benchmarks/<benchmark>/implementations/*/config_*.sh of the same submitter: each config is sourced by bash
    (env -i, in a scratch copy of its folder, so its `source config_common*.sh` lines resolve) and the one whose
    GPU count, global batch (MINIBS x dp), learning rate and warm-up match the MLLOG is the config of the run.
"""
from __future__ import annotations

import hashlib
import math
import json
import os
import copy
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

OUT = Path(os.environ.get("MLPERF_OUT", "/tmp/mlperf"))  # where the YAML and scan.tsv go
MIRROR = os.environ.get("MLPERF_MIRROR", "/work/.mirror/mlcommons+training_results_v{v}/repo")  # bare git mirrors
COMMITS = {
    "4.0": "6fe954378efe4a1a1bd665550b18ff8f26018def",
    "4.1": "b87b9e396f771345d4ef122ba33456304f15228d",
    "5.0": "0fdc28f013256aea84fa36fdaf1e0fa46094b18c",
    "5.1": "441d65f4445cd59687466533fd9f55399136e7a4",
}
BENCH = {"gpt3", "llama31_405b", "llama31_8b"}


def git(v: str, *args: str) -> str:
    return subprocess.run(["git", "-C", MIRROR.format(v=v), *args], capture_output=True, text=True,
                          check=True).stdout


def show(v: str, path: str) -> str:
    return git(v, "show", f"{COMMITS[v]}:{path}")


# ---------------------------------------------------------------- hardware
def hardware_of(gpu: str) -> str | None:
    g = gpu.upper()
    if "GB300" in g:
        return "gb300"
    if "B300" in g:
        return "b300"
    if "GB200" in g:
        return "gb200"
    if "B200" in g:
        return "b200"
    if "H200" in g:
        return "h200"
    if "H100" in g and "SXM" in g:
        return "h100-sxm"
    return None


# ---------------------------------------------------------------- MLLOG
def parse_result(text: str) -> dict:
    out: dict = {"steps": [], "blocks": []}
    block_t0 = None
    for line in text.splitlines():
        i = line.find(":::MLLOG ")
        if i < 0:
            continue
        try:
            e = json.loads(line[i + 9:])
        except json.JSONDecodeError:
            continue
        k, val = e.get("key"), e.get("value")
        if k in ("global_batch_size", "max_sequence_length", "opt_base_learning_rate", "submission_platform",
                 "opt_learning_rate_warmup_steps", "gradient_accumulation_steps") and k not in out:
            out[k] = val
        elif k == "tracked_stats" and isinstance(val, dict):
            for name in ("train_step_timing in s", "train_step_time"):
                if name in val:
                    out["steps"].append(float(val[name]))
        elif k == "block_start":
            block_t0 = e["time_ms"]
        elif k == "block_stop" and block_t0 is not None:
            out["blocks"].append((e["time_ms"] - block_t0) / 1000.0)
            block_t0 = None
    return out


# ---------------------------------------------------------------- configs
BENCH_DIRS = {"gpt3": ("gpt3",), "llama31_405b": ("llama31_405b", "llama3_405b"),
              "llama31_8b": ("llama31_8b", "llama3_8b")}
_cfg_cache: dict = {}
_files_cache: dict = {}


def config_env(v: str, files: list[str], path: str) -> dict:
    """The environment config `path` leaves when sourced by bash (env -i) in a scratch copy of its folder. A
    config_*.sh it sources that its folder lacks is taken from another folder of the same submitter and benchmark
    that has it (recorded under __borrowed__), else from NVIDIA's reference implementation of the benchmark, which
    the NeMo submissions copy (__borrowed_nvidia__), or left missing (__missing__)."""
    if path in _cfg_cache:
        return _cfg_cache[path]
    folder = os.path.dirname(path)
    sub, _, bench = path.split("/")[:3]
    tmp = Path(tempfile.mkdtemp(prefix="mlperf_cfg_"))
    for f in files:
        if os.path.dirname(f) == folder and os.path.basename(f).startswith("config_") and f.endswith(".sh"):
            (tmp / os.path.basename(f)).write_text(show(v, f))
    text = (tmp / os.path.basename(path)).read_text()
    borrowed, nvidia, missing = [], [], []
    wanted = set(re.findall(r"source \$\(dirname \$\{BASH_SOURCE\[0\]\}\)/(\S+)", text))
    for w in sorted(wanted):
        if (tmp / w).exists():
            continue
        other = sorted(f for f in files if f.startswith(f"{sub}/benchmarks/{bench}/") and os.path.basename(f) == w)
        ref = sorted(f for f in files if f.startswith(f"NVIDIA/benchmarks/{bench}/") and os.path.basename(f) == w)
        if other:
            (tmp / w).write_text(show(v, other[0]))
            borrowed.append(other[0])
        elif ref:
            (tmp / w).write_text(show(v, ref[0]))
            nvidia.append(ref[0])
        else:
            missing.append(w)
    r = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c",
                        f'cd "{tmp}"; source "./{os.path.basename(path)}" >/dev/null 2>&1; env -0'],
                       capture_output=True, text=True)
    env = dict(x.split("=", 1) for x in r.stdout.split("\0") if "=" in x)
    env["__borrowed__"], env["__borrowed_nvidia__"], env["__missing__"] = borrowed, nvidia, missing
    env["__defaults__"], env["__conf__"] = conf_defaults(v, files, path)
    _cfg_cache[path] = env
    return env


def truthy(x) -> bool:
    return str(x).strip().lower() in ("1", "true", "yes")


def ival(env: dict, k: str, default: int) -> int:
    x = env.get(k)
    if x in (None, "", "null", "None"):
        return default
    return int(x)


def layout_of(env: dict, gpus: int) -> dict:
    """tp, pp, cp, vp, dp, micro-batch and global batch (MINIBS x dp, as the NeMo conf computes it)."""
    d = env.get("__defaults__", {})
    def k(name, default):
        return ival(env, name, ival(d, name, default)) if env.get(name) not in ("null",) else default
    tp, pp = k("TENSOR_MODEL_PARALLEL", 1), k("PIPELINE_MODEL_PARALLEL", 1)
    cp = k("CONTEXT_PARALLEL", 1) if "CONTEXT_PARALLEL" in env or "CONTEXT_PARALLEL" in d else 1
    dp = gpus // (tp * pp * cp)
    vp = k("INTERLEAVED_PIPELINE", 1) if pp > 1 else 1
    return dict(tp=tp, pp=pp, cp=cp, vp=vp, dp=dp, mbs=k("MICRO_BATCH_SIZE", 1), gbs=ival(env, "MINIBS", 0) * dp)


def conf_defaults(v: str, files: list[str], cfgpath: str) -> tuple[dict, list[str]]:
    """The defaults the NeMo conf yamls beside a config give its environment knobs: ${oc.env:NAME,DEFAULT}."""
    folder = os.path.dirname(cfgpath)
    sub, _, bench = cfgpath.split("/")[:3]
    yamls = sorted(f for f in files if f.startswith(folder + "/conf/") and f.endswith(".yaml")
                   and "/tp_overlap/" not in f and "/data_prefix/" not in f and "/nccl/" not in f)
    if not yamls:  # a folder with configs only: the conf of another folder of the same submitter and benchmark
        yamls = sorted(f for f in files if f.startswith(f"{sub}/benchmarks/{bench}/") and "/conf/" in f
                       and f.endswith(("custom.yaml",)))
    out: dict = {}
    for y in yamls:
        for name, default in re.findall(r"oc\.env:([A-Z0-9_]+),([^}$]*)\}", show(v, y)):
            out.setdefault(name, default.strip())
    return out, yamls


GPU_TOKEN = re.compile(r"^(?:DGX)?(GB300|GB200|B300|B200|H200|H100|A100)", re.I)
GPU_ANY = re.compile(r"GB300|GB200|B300|B200|H200|H100|A100", re.I)
HW_TOKEN = {"h100-sxm": "H100", "h200": "H200", "b200": "B200", "gb200": "GB200", "b300": "B300", "gb300": "GB300"}


def match_config(v: str, submitter: str, system: str, bench: str, hw: str, gpus: int, res: dict,
                 files: list[str]) -> list[dict]:
    """Configs of the submitter's benchmark folders whose GPU count, global batch, LR and warm-up match the log,
    each with a tier: 3 the file name carries the system's name, 2 its folder is the system's (or the file's system
    token is part of the system name), 1 a generic config of the system's GPU (DGXB200_..., GB200_...). A config
    named for another GPU counts only from the system's own folder, and only where no config of the system's GPU
    matches (other_gpu: Supermicro's B300 run kept NVIDIA's DGXB200 file name)."""
    out = []
    sys_core = re.sub(r"^\d+x", "", system).lower()
    for f in files:
        p = f.split("/")
        if len(p) < 4 or p[0] != submitter or p[1] != "benchmarks" or p[2] not in BENCH_DIRS[bench]:
            continue
        name = p[-1]
        if not re.match(r"config_.*\.sh$", name) or re.match(r"config_(common|mounts|hpg)", name):
            continue
        stem = name[len("config_"):-3]
        token = stem.split("_")[0]
        g = GPU_TOKEN.match(token)
        inner = GPU_ANY.findall(token)
        other_gpu = bool((g and g.group(1).upper() != HW_TOKEN[hw]) or
                         (not g and inner and inner[0].upper() != HW_TOKEN[hw]))
        if other_gpu and p[-2] != system:
            continue  # another GPU's config
        env = config_env(v, files, f)
        nodes, gpn = ival(env, "DGXNNODES", 0), ival(env, "DGXNGPU", 8)
        if nodes * gpn != gpus:
            continue
        lay = layout_of(env, gpus)
        if lay["gbs"] != res.get("global_batch_size"):
            continue
        hp_ok = 0  # the log's learning rate and warm-up as the config sets them (where it sets them)
        if env.get("LR") and res.get("opt_base_learning_rate") is not None:
            hp_ok += abs(float(env["LR"]) - float(res["opt_base_learning_rate"])) < 1e-12
        else:
            hp_ok += 1
        if env.get("WARMUP_STEPS") and res.get("opt_learning_rate_warmup_steps") is not None:
            hp_ok += int(float(env["WARMUP_STEPS"])) == int(float(res["opt_learning_rate_warmup_steps"]))
        else:
            hp_ok += 1
        folder = p[-2]
        parts = [x.lower() for x in stem.split("_") if len(x) >= 5 and not GPU_TOKEN.match(x)]
        if sys_core in name.lower():
            tier = 3
        elif folder == system or system.startswith(folder) or any(x in system.lower() for x in parts):
            tier = 2
        elif g:
            tier = 1
        elif inner:
            tier = 0  # the submitter's own name for a config of this GPU (SMCH100_...)
        else:
            continue  # another system's own config
        out.append(dict(path=f, env=env, layout=lay, tier=tier, hp_ok=hp_ok, fp4=truthy(env.get("FP4")),
                        other_gpu=other_gpu))
    mine = [c for c in out if not c["other_gpu"]]
    return mine or out


# ---------------------------------------------------------------- scan
def scan():
    rows = []
    for v in COMMITS:
        files = git(v, "ls-tree", "-r", "--name-only", COMMITS[v]).split("\n")
        dirs: dict = {}
        for f in files:
            p = f.split("/")
            if len(p) == 5 and p[1] == "results" and p[3] in BENCH and p[4].startswith("result_"):
                dirs.setdefault((p[0], p[2], p[3]), []).append(f)
        for (sub, system, bench), rfiles in sorted(dirs.items()):
            row = dict(version=v, submitter=sub, system=system, bench=bench, result_dir=f"{sub}/results/{system}/{bench}",
                       n_files=len(rfiles))
            rows.append(row)
            try:
                sj = json.loads(show(v, f"{sub}/systems/{system}.json"))
            except Exception:  # noqa: BLE001
                row["status"] = "left out: no systems json"
                continue
            row["gpu_name"] = sj.get("accelerator_model_name", "")
            row["gpus"] = int(sj["number_of_nodes"]) * int(sj["accelerators_per_node"])
            row["host_networking"] = sj.get("host_networking", "")
            hw = hardware_of(row["gpu_name"])
            row["hardware"] = hw
            if sub.startswith("smc-") and "power" in sub:
                row["status"] = "left out: power-measurement relisting (smc-ac-power / smc-dc-power)"
                continue
            if hw is None and "MI355X" in row["gpu_name"].upper():
                row["status"] = (f"left out: {row['gpu_name']} has a ddplan spec (mi355x), but the run is AMD's "
                                 "PyTorch implementation, outside this NVIDIA/NeMo transcription")
                continue
            if hw is None:
                row["status"] = f"left out: no ddplan hardware spec for {row['gpu_name']!r}"
                continue
            parsed = [parse_result(show(v, f)) for f in sorted(rfiles)]
            row["hash"] = hashlib.sha1("".join(sorted(show(v, f) for f in rfiles)).encode()).hexdigest()
            p0 = parsed[0]
            row.update(gbs=p0.get("global_batch_size"), seq=p0.get("max_sequence_length"),
                       lr=p0.get("opt_base_learning_rate"), warmup=p0.get("opt_learning_rate_warmup_steps"),
                       platform=p0.get("submission_platform"))
            per_file = [statistics.median(p["steps"]) for p in parsed if p["steps"]]
            row["files_with_steps"] = len(per_file)
            row["per_file_median_s"] = per_file
            row["n_step_logs"] = sum(len(p["steps"]) for p in parsed)
            if per_file:
                row["step_s"] = statistics.median(per_file)
            cands = match_config(v, sub, system, bench, hw, row["gpus"], p0, files)
            row["cands"] = cands
            if not per_file:
                row["status"] = "left out: no per-step time in the MLLOG (no tracked_stats step timing)"
                continue
            if not cands:
                row["status"] = "left out: no config matches GPU count and global batch"
                continue
            top = max((c["tier"], c["hp_ok"]) for c in cands)
            best = [c for c in cands if (c["tier"], c["hp_ok"]) == top]
            row["config_tier"], row["config_hp_ok"] = top
            kinds = {c["fp4"] for c in best}
            row["precision_by"] = "config"
            if kinds == {True}:
                row["status"] = "left out: NVFP4 run (the matching config is an fp4 one)"
                continue
            if kinds == {True, False}:
                row["status"] = "ambiguous"  # settled below from the step times of unambiguous runs
            fp8 = [c for c in best if not c["fp4"]]
            layouts = {json.dumps({k: c["layout"][k] for k in ("tp", "pp", "cp", "vp", "mbs", "gbs")}) for c in fp8}
            if len(layouts) > 1:
                row["status"] = "left out: several configs match with different layouts"
                continue
            row["config"] = fp8[0]
            row["config_alternatives"] = [c["path"] for c in fp8[1:]]
            row["fp4_alternatives"] = [c["path"] for c in best if c["fp4"]]
            row.setdefault("status", "included")
            if row["status"] != "ambiguous":
                row["status"] = "included"
    # fp8 or NVFP4 where both kinds of config match equally: GPU-seconds per sequence against the runs of the same
    # benchmark and GPU whose precision is unambiguous (the same GPU count and batch first), nearest in log ratio
    def cost(r):
        return r["step_s"] * r["gpus"] / r["gbs"]
    known = [r for r in rows if r.get("step_s") and (r.get("status") == "included" or "NVFP4" in r.get("status", ""))]
    for r in rows:
        if r.get("status") != "ambiguous":
            continue
        same = [k for k in known if k["bench"] == r["bench"] and k["hardware"] == r["hardware"]]
        exact = [k for k in same if k["gpus"] == r["gpus"] and k["gbs"] == r["gbs"]]
        pool = exact if {("NVFP4" in k["status"]) for k in exact} == {True, False} else same
        ref = {}
        for fp4 in (False, True):
            xs = [cost(k) for k in pool if ("NVFP4" in k["status"]) == fp4]
            if xs:
                ref[fp4] = statistics.median(xs)
        c = cost(r)
        if set(ref) != {False, True}:  # nothing of both kinds to compare with: the precision cannot be told
            r["status"] = ("left out: fp8 and fp4 configs of this layout both match, and no unambiguous "
                           f"{r['hardware']} {r['bench']} run of both kinds tells which ran")
            continue
        pick = min(ref, key=lambda fp4: abs(math.log(c / ref[fp4])))
        r["precision_by"] = (f"step time: {c:.4f} GPU-s per sequence against unambiguous {r['hardware']} "
                             f"{'runs of the same GPU count and batch' if pool is exact else 'runs'}: fp8 median "
                             f"{ref.get(False, float('nan')):.4f}, NVFP4 median {ref.get(True, float('nan')):.4f}")
        if pick:
            r["status"] = ("left out: NVFP4 run (fp8 and fp4 configs of this layout both match; the step time "
                           "sides with NVFP4: " + r["precision_by"] + ")")
        else:
            r["status"] = "included"
    # relistings: result logs identical to an earlier row's
    seen: dict = {}
    for row in rows:
        if "hash" not in row:
            continue
        if row["hash"] in seen and row.get("status") == "included":
            row["status"] = f"left out: relisting (result logs identical to {seen[row['hash']]})"
        seen.setdefault(row["hash"], f"v{row['version']} {row['result_dir']}")
    return rows


# ---------------------------------------------------------------- runs
MODEL = {
    "gpt3": dict(base="gpt3-175b", name="GPT-3 175B (MLPerf gpt3)", vocab=50257,
                 arch=dict(num_layers=96, d_model=12288, num_heads=96, num_kv_heads=96, head_dim=128,
                           mlp_hidden_dim=49152, max_seq_len=2048, dropout={"hidden": 0.0, "attention": 0.0})),
    "llama31_405b": dict(base="llama-3-70b", name="Llama 3.1 405B (MLPerf llama31_405b, Mixtral tokenizer)",
                         vocab=32000,
                         arch=dict(num_layers=126, d_model=16384, num_heads=128, num_kv_heads=8, head_dim=128,
                                   mlp_hidden_dim=53248, max_seq_len=8192)),
    "llama31_8b": dict(base="llama-3-8b", name="Llama 3.1 8B (MLPerf llama31_8b)", vocab=128256, arch={}),
}
ATTN = {"h100-sxm": "fa3", "h200": "fa3", "b200": "cudnn", "gb200": "cudnn", "b300": "cudnn", "gb300": "cudnn"}


def padded(vocab: int, tp: int) -> int:
    m = 128 * tp  # NeMo: make_vocab_size_divisible_by 128, times tp
    return -(-vocab // m) * m


def knob(env: dict, name: str, default=None):
    x = env.get(name)
    if x is None:
        x = env.get("__defaults__", {}).get(name)
    return default if x in (None, "", "null", "None") else x


def platform_words(r: dict) -> str:
    """The MLLOG's submission_platform, marked where it names another GPU than the systems json (NVIDIA's GB300
    logs say GB200)."""
    plat = str(r.get("platform"))
    named = GPU_ANY.findall(plat)
    if named and named[0].upper() != HW_TOKEN[r["hardware"]]:
        return f"{plat}, sic: the systems json has {r['gpu_name']}"
    return plat


def run_entry(r: dict) -> dict:
    v, c = r["version"], r["config"]
    env, lay = c["env"], c["layout"]
    hw, bench = r["hardware"], r["bench"]
    m = MODEL[bench]
    tp = lay["tp"]
    assumed, unpriced = [], []
    vocab = padded(m["vocab"], tp)
    arch = copy.deepcopy(m["arch"])  # its own dicts: a shared one would be a YAML alias in the dataset
    if vocab != 128256 or bench != "llama31_8b":
        arch["vocab_size"] = vocab
    field = "train_step_timing in s" if v.startswith("4.") else "train_step_time"
    per = ", ".join(f"{x:.4g}" for x in r["per_file_median_s"])
    assumed.append(f"step time: the median over the {r['files_with_steps']} result files of each file's median "
                   f"tracked_stats '{field}' ({r['n_step_logs']} values in all; per-file medians {per} s); the "
                   f"time of a training step as NeMo's timer logs it, evaluation and the untimed warm-up excluded")
    if bench == "gpt3":
        assumed.append(f"vocab: the MLPerf C4 SentencePiece tokenizer (c4_en_301_5Mexp2_spm) taken as 50,257 entries "
                       f"(not in the config; Google's MaxText gpt3-175b config in v4.1 pads it to 50,304), padded by "
                       f"NeMo to a multiple of 128 x tp {tp}: {vocab:,}")
        assumed.append("tied input/output embeddings and learned positions: NeMo megatron_gpt_config defaults "
                       "(share_embeddings_and_output_weights, learned_absolute), not overridden in conf/custom.yaml; "
                       "normalization layernorm1p priced as layernorm; dropout 0 is stated (hidden_dropout, "
                       "attention_dropout 0.0 in conf/custom.yaml)")
    elif bench == "llama31_405b":
        assumed.append(f"vocab: the Mixtral 8x22B tokenizer (the README: the benchmark replaces Llama's tokenizer "
                       f"with it) taken as 32,000 entries, padded by NeMo to a multiple of 128 x tp {tp}: {vocab:,}; "
                       f"shapes of Llama31Config405B (126 layers: OVERWRITTEN_NUM_LAYERS default)")
    else:
        assumed.append("vocab: Llama 3.1's 128,256 (the README's llama-3-1-8b tokenizer), a multiple of 128 x tp "
                       f"{tp}: no padding; shapes of NeMo Llama31Config8B (= the llama-3-8b built-in)")
    rec = knob(env, "FP8_RECIPE")
    if rec == "tensorwise":  # Megatron-Core's tensorwise is Transformer Engine's current scaling (fp8_utils.py)
        fp8_recipe = "current"
        src_ = "stated (FP8_RECIPE" if env.get("FP8_RECIPE") else "the conf yaml's default for FP8_RECIPE ("
        assumed.append(f"fp8 recipe current: {src_} tensorwise: Transformer Engine current scaling, "
                       f"Float8CurrentScaling)")
    elif rec == "delayed":
        fp8_recipe = rec
        src_ = "stated (FP8_RECIPE)" if env.get("FP8_RECIPE") else "the conf yaml's default for FP8_RECIPE"
        assumed.append(f"fp8 recipe {rec}: {src_}")
    elif rec is None:
        fp8_recipe = "delayed"
        assumed.append(f"fp8 recipe delayed: NeMo's Transformer Engine DelayedScaling (no FP8_RECIPE knob in this "
                       f"implementation; amax history {knob(env, 'FP8_AMAX_HISTORY', '1')}, "
                       f"{knob(env, 'FP8_AMAX_ALGO', 'most_recent')})")
    else:
        fp8_recipe = None
        assumed.append(f"fp8 recipe {rec!r} has no ddplan equivalent: the model spec's default")
    attention = ATTN[hw]
    assumed.append(f"attention: Transformer Engine's cuDNN fused attention (NVTE_FUSED_ATTN), priced as {attention}")
    assumed.append("dtypes: bf16 weights with fp32 masters in the distributed optimizer (USE_DIST_OPTIMIZER: zero 1), "
                   "gradients reduced in bf16 (" + ("pretrain.py: grad_reduce_in_fp32=False" if v.startswith("5.")
                   else "conf/optim/distributed_fused_adam.yaml grad_sync_dtype bf16") + ")")
    sj = r.get("host_networking") or "not stated"
    assumed.append(f"network: the {hw} spec's default (systems json host_networking: {sj})")
    if env["__borrowed__"]:
        assumed.append("the config's folder lacks files it sources; taken from the same submitter's: "
                       + ", ".join(env["__borrowed__"]))
    if env["__borrowed_nvidia__"]:
        assumed.append("the config's folder lacks files it sources, and so do the submitter's others; taken from "
                       "NVIDIA's reference implementation of the benchmark: " + ", ".join(env["__borrowed_nvidia__"]))
    if env["__missing__"]:
        assumed.append("files the config sources that the submission does not include (their settings unknown): "
                       + ", ".join(env["__missing__"]))
    if r["precision_by"] != "config":
        assumed.append("fp8 rather than NVFP4: an fp8 and an fp4 config of this layout both match the log; " +
                       r["precision_by"])
    if c["other_gpu"]:
        assumed.append(f"config: the one in the system's own folder, though its name is another GPU's "
                       f"({os.path.basename(c['path'])}): its GPU count, global batch, learning rate and warm-up match "
                       f"the log")
    if c["tier"] <= 1:
        assumed.append("config: the submitter's generic config of this GPU count and batch (the name does not "
                       "carry the system's)" + (f"; identical candidates: {', '.join(r['config_alternatives'])}"
                                                if r["config_alternatives"] else ""))
    sp = tp > 1 and truthy(knob(env, "SEQ_PARALLEL", "True"))
    tpo = tp > 1 and truthy(knob(env, "TP_COMM_OVERLAP", "False"))
    opg = truthy(knob(env, "OVERLAP_PARAM_GATHER", knob(env, "OVERLAP_PARAM_SYNC", "True")))
    gran = knob(env, "ACT_CKPT_GRANULARITY")
    recompute = {None: "none", "selective": "selective", "full": "full"}[gran]
    layout = dict(gpus=r["gpus"], tp=tp, pp=lay["pp"])
    if lay["pp"] > 1 and lay["vp"] > 1:
        layout["vp"] = lay["vp"]
    if lay["cp"] > 1:
        layout["cp"] = lay["cp"]
    layout["zero"] = 1 if truthy(knob(env, "USE_DIST_OPTIMIZER", "True")) else 0
    layout.update(micro_batch=lay["mbs"], global_batch_sequences=r["gbs"], recompute=recompute, attention=attention,
                  sequence_parallel=sp, tp_comm_overlap=tpo, overlap_param_gather=opg)
    # fp8 weights kept and gathered in fp8 by the distributed optimizer: pretrain.py passes FP8_PARAMS (or
    # FP8_PARAM_GATHER) as both MegatronMixedPrecision's fp8_params and the optimizer's fp8_param_gather
    fp8_weights = truthy(knob(env, "FP8_PARAMS")) or truthy(knob(env, "FP8_PARAM_GATHER"))
    if fp8_weights and truthy(knob(env, "FP8")) and layout["zero"] == 1 and fp8_recipe in ("delayed", "current"):
        layout["fp8_params"] = True
    # what the config turns on that ddplan does not price
    for k, what in [("FULL_CUDA_GRAPH", "full-iteration CUDA graph"), ("MCORE_CUDA_GRAPH", "Megatron-Core CUDA graphs"),
                    ("LAYER_CUDA_GRAPH", "per-layer CUDA graphs"),
                    ("FP8_PARAM_GATHER", "fp8 weights, all-gathered in fp8 (fp8_param_gather)"),
                    ("FP8_PARAMS", "fp8 weights (fp8_params)"), ("FP8_DPA", "fp8 attention (fp8_dot_product_attention)"),
                    ("DEFER_EMBEDDING_WGRAD_COMPUTE", "deferred embedding wgrad"),
                    ("ASYM_PP_EMBED", "embedding counted as a layer in the pipeline split"),
                    ("ASYM_PP_LOSS", "loss counted as a layer in the pipeline split"),
                    ("OVERLAP_PARAM_GATHER_WITH_OPTIM_STEP", "param gather overlapped with the optimizer step"),
                    ("TP_PP_DP_MAPPING", "tp-pp-dp rank order"), ("USE_TE_OPS", "Transformer Engine op fuser"),
                    ("FUSED_QKV_ROPE", "fused QKV + RoPE"), ("SHARP", "SHARP in-network reductions")]:
        if truthy(knob(env, k)) and not (k in ("FP8_PARAM_GATHER", "FP8_PARAMS") and layout.get("fp8_params")):
            unpriced.append(what)
    if truthy(knob(env, "FP8_HYBRID")):
        unpriced.append("fp8 HYBRID format (E4M3 forward, E5M2 gradients)")
    # the loss: Transformer Engine's (CE_FUSION_IMPL te, as the nemo profile's performance scripts run it), else
    # Megatron-Core's native fused vocab-parallel loss (cross_entropy_loss_fusion, the conf yaml's default True)
    impl = knob(env, "CE_FUSION_IMPL")
    cross_entropy = "te" if impl == "te" else "vocab-parallel"
    assumed.append(f"loss: {cross_entropy} (" + (f"CE_FUSION_IMPL {impl}" if impl else
                                                 "no CE_FUSION_IMPL te: Megatron-Core's native fused cross entropy, "
                                                 "cross_entropy_loss_fusion True in conf/custom.yaml, or its unfused "
                                                 "one, both priced as vocab-parallel") + ")")
    rid = re.sub(r"[^A-Za-z0-9_.+-]+", "-", f"mlperf{v}-{r['submitter']}-{r['system']}-{bench}").lower()[:120]
    entry = {
        "id": rid,
        "source": {
            "name": "mlperf-training",
            "ref": f"mlcommons/training_results_v{v}",
            "where": f"{r['result_dir']}/result_*.txt ({r['n_files']} files, MLLOG) + {c['path']}",
            "commit": COMMITS[v],
            "checked": (f"MLLOG global_batch_size {r['gbs']} = MINIBS {env.get('MINIBS')} x dp {lay['dp']} of the config, "
                        f"max_sequence_length {r['seq']}; systems/{r['system']}.json: {r['gpus']} x {r['gpu_name']}"),
        },
        "model": {"base": m["base"], "name": m["name"], "architecture": arch, "seq_len": int(r["seq"]),
                  "grads": "param", "weights": "master"},
        "hardware": hw,
        "precision": "fp8" if truthy(knob(env, "FP8")) else "bf16",
        "framework": "nemo",
        "cross_entropy": cross_entropy,
        "layout": layout,
        "measured": {"step_time_s": round(r["step_s"], 4)},
        "assumed": assumed,
        "notes": (f"MLPerf Training v{v} closed division, {r['submitter']} '{r['system']}' "
                  f"({platform_words(r)}); config {os.path.basename(c['path'])}. Set in the config, not priced by "
                  f"ddplan: " + ("; ".join(unpriced) if unpriced else "nothing noted") + "."),
    }
    if entry["precision"] == "fp8" and fp8_recipe:
        entry["fp8_recipe"] = fp8_recipe
    if not entry["model"]["architecture"]:
        del entry["model"]["architecture"]
    return entry


ORDER = {"gpt3": 0, "llama31_405b": 1, "llama31_8b": 2}


def write(rows: list[dict]) -> None:
    inc = sorted((r for r in rows if r.get("status") == "included"),
                 key=lambda r: (ORDER[r["bench"]], r["hardware"], r["version"], r["gpus"], r["system"]))
    runs = [run_entry(r) for r in inc]
    left = [r for r in rows if r.get("status") != "included"]
    header = (OUT / "header.txt").read_text() if (OUT / "header.txt").exists() else ""
    lines = ["# " + x if x else "#" for x in header.rstrip("\n").split("\n")] if header else []
    lines += ["#", "# Left out (result directory: why):"]
    for r in left:
        lines.append(f"# - v{r['version']} {r['result_dir']}: {r['status'].removeprefix('left out: ')}")
    body = yaml.safe_dump({"kind": "runs", "description": "MLPerf Training LLM pretraining results (GPT-3 175B, "
                           "Llama 3.1 405B and 8B) on NVIDIA H100/H200/B200/GB200/B300/GB300, transcribed from the "
                           "MLLOGs and configs (see header)", "runs": runs}, sort_keys=False, width=118,
                          allow_unicode=True)
    (OUT / "mlperf_runs.yaml").write_text("\n".join(lines) + "\n" + body)
    with open(OUT / "scan.tsv", "w") as f:
        f.write("version\tresult_dir\thardware\tgpus\tgbs\tstep_s\tconfig\tstatus\n")
        for r in rows:
            f.write("\t".join(str(x) for x in (r["version"], r["result_dir"], r.get("hardware"), r.get("gpus"),
                                               r.get("gbs"), r.get("step_s"), (r.get("config") or {}).get("path"),
                                               r.get("status"))) + "\n")
    print(f"wrote {len(runs)} runs, {len(left)} left out")


if __name__ == "__main__":
    rows = scan()
    write(rows)
