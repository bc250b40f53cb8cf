"""`ddplan import`: a run as a training stack states it (torchtitan TOML, Megatron-LM arguments, a Megatron-Bridge
ConfigContainer, a NeMo config, a nanochat command line), turned into ddplan's run configuration (ddplan/runconfig.py)
with its framework set.

Each reader maps the options that change a step's cost to run-config fields; what the file does not say is left
to the framework's profile (frameworks/*.yaml), which `table`/`memory`/`plan --config` apply; a field the file does
not give and no profile sets (GPUs, hardware) is written with an `# assumed:` comment naming why. Options a reader
does not map are named in warnings: cost-relevant ones one by one, the rest (learning rates, data paths, logging)
counted. Sources, each read from the code at the commit named:
- torchtitan: torchtitan/config/job_config.py@238fa99 (2026-02-23, the last commit with TOML job files; the
  TOML presets under torchtitan/models/*/train_configs/) and the llama3 flavors in
  torchtitan/models/llama3/__init__.py@238fa99;
- Megatron-LM: megatron/training/arguments.py@d98e8a6 (2026-08-22) and the launch scripts under examples/;
- Megatron-Bridge: src/megatron/bridge/training/config.py@067f987 (2026-08-22), the ConfigContainer its runs print
  ("Task Configuration") and save as run_config.yaml, read as the Megatron-LM arguments its fields stand for;
- NeMo: the NeMo-Framework-Launcher training configs (launcher_scripts/conf/training/*@26e42fa, 2025-04-18),
  NeMo 1.x's megatron_gpt_config.yaml schema, which runs Megatron-Core (profile megatron-core);
- nanochat: scripts/base_train.py@92d63d4 argument parser (2026-07-03) and runs/speedrun.sh.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddplan import units
from ddplan.errors import DdplanError, SpecError
from ddplan.registry import builtin_names, load_hardware, load_model
from ddplan.files import atomic_write
from ddplan.runconfig import RunConfig, field_paths, flow
from ddplan.runfields import RECOMPUTE_MODULES, recompute_policy
from ddplan.specs import MOMENTS
from ddplan.specfile import read_text, read_yaml, validate

FORMATS = ("torchtitan", "megatron", "megatron-bridge", "nemo", "nanochat")
PROFILE = {"torchtitan": "torchtitan", "megatron": "megatron-core", "megatron-bridge": "megatron-bridge",
           "nemo": "megatron-core", "nanochat": "nanochat"}
ASSUMED_HARDWARE = "h100-sxm"  # where the file names no GPU (marked assumed)


@dataclass
class Imported:
    """A run read from a stack's file: run-config fields by path, why each assumed one was assumed, what was not
    read, and a Hugging Face style config.json of the architecture where no built-in model is it."""

    source: str
    format: str
    fields: dict[tuple[str, ...], Any] = field(default_factory=dict)
    assumed: dict[tuple[str, ...], str] = field(default_factory=dict)
    notes: dict[tuple[str, ...], str] = field(default_factory=dict)  # where a stated field came from, when not plain
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # options that do not change a step's cost
    architecture: dict | None = None  # config.json contents, when the model is not a built-in
    gpus_given: int | None = None  # import --gpus: wins over the file
    model_given: str | None = None  # import --model: the readers do not build (or check) an architecture
    # Transformer Engine picks the attention kernel (Megatron-Core's attention_backend auto or fused): resolved to the
    # hardware's nearest priced kernel once the hardware is known (te_attention)
    te_attention: bool = False

    def set(self, path: tuple[str, ...] | str, value: Any, note: str | None = None) -> None:
        key = (path,) if isinstance(path, str) else path
        self.fields[key] = value
        if note:
            self.notes[key] = note

    def assume(self, path: tuple[str, ...] | str, value: Any, why: str) -> None:
        key = (path,) if isinstance(path, str) else path
        self.fields[key] = value
        self.assumed[key] = why


def detect(path: Path, text: str) -> str:
    """Which stack's file this is, from its name and contents; one clear error when it is none of them."""
    if path.suffix == ".toml":
        return "torchtitan"
    if BRIDGE_MARK in text:
        return "megatron-bridge"  # its run_config.yaml, or a training log's Task Configuration block
    if path.suffix in (".yaml", ".yml") and re.search(r"^trainer:\s*$", text, re.M) and re.search(r"^model:\s*$",
                                                                                                   text, re.M):
        return "nemo"
    if path.suffix in (".yaml", ".yml") and re.search(r"^MODEL_ARGS:\s*$", text, re.M):
        return "megatron"  # Megatron-LM's argument map (its functional tests' model_config.yaml)
    if "base_train" in text:
        return "nanochat"
    if re.search(r"--(num-layers|tensor-model-parallel-size|hidden-size)\b", text):
        return "megatron"
    raise SpecError("not a torchtitan job TOML, a Megatron-Bridge run configuration (run_config.yaml or a log's Task "
                    "Configuration), a NeMo training YAML (trainer: and model:), Megatron-LM arguments "
                    "(--num-layers ...) or a nanochat base_train command line; name the format with --from "
                    f"({', '.join(FORMATS)})", file=str(path))


def read(path: Path, fmt: str | None = None, *, gpus: int | None = None, hardware: str | None = None,
         model: str | None = None) -> Imported:
    """The run a stack's file states. gpus, hardware, model: what the caller knows that the file may not say (they
    win over the file)."""
    text = read_text(path, "a training config")
    fmt = fmt or detect(path, text)
    out = Imported(source=str(path), format=fmt, gpus_given=gpus, model_given=model)
    out.set("framework", PROFILE[fmt])
    {"torchtitan": _torchtitan, "megatron": _megatron, "megatron-bridge": _bridge, "nemo": _nemo,
     "nanochat": _nanochat}[fmt](text, path, out)
    if model:
        out.set("model", model, "given to import")
        out.architecture = None
    if hardware:
        out.fields[("hardware",)] = hardware
        out.assumed.pop(("hardware",), None)
    if ("hardware",) not in out.fields:
        out.assume("hardware", ASSUMED_HARDWARE, "the file names no GPU (import --hardware, or edit)")
    if out.te_attention and ("attention",) not in out.fields:
        te_attention(out)
    return out


# Transformer Engine's fused attention as ddplan prices it, nearest first: cuDNN where a GPU spec has its measured
# sweep (B200, GB200), else FlashAttention-3 (Hopper) or -2 (the flash-type kernels its measured rates come from)
TE_ATTENTION = ("cudnn", "fa3", "fa2")


def te_attention(out: Imported) -> None:
    """The attention kernel of a run whose Transformer Engine picks it (Megatron-Core's attention_backend auto, its
    default, or fused: cuDNN's FusedAttention on sm90 and newer, megatron/core/transformer/transformer_config.py
    @d98e8a6 L151-155): the first of TE_ATTENTION the hardware spec lists, marked assumed (a proxy where the spec has
    no cuDNN figure). Left unset where the hardware is not a built-in, or lists none of them (each kernel then gets its
    row)."""
    try:
        hw = load_hardware(str(out.fields[("hardware",)]))
    except DdplanError:
        return
    listed = {a.name for a in hw.attention}
    name = next((k for k in TE_ATTENTION if k in listed), None)
    if name is not None:
        out.assume("attention", name, f"Transformer Engine picks the kernel (attention_backend auto/fused: cuDNN fused "
                                      f"attention on Hopper and newer); priced as {hw.name}'s {name}")


# ----------------------------------------------------------------------------------------------------------------
# the model: a built-in when one has these dimensions, else a config.json of them


def _builtin_like(arch: dict) -> str | None:
    """The built-in model whose architecture has every dimension in `arch` (layers, width, heads, MLP, vocabulary,
    dropout), or None."""
    for name in builtin_names("models"):
        a = load_model(name).architecture
        have = {"num_layers": a.num_layers, "d_model": a.d_model, "num_heads": a.num_heads,
                "num_kv_heads": a.num_kv_heads, "mlp_hidden_dim": a.mlp_hidden_dim, "vocab_size": a.vocab_size,
                "mlp": a.mlp, "tied_embeddings": a.tied_embeddings,
                "moe": (a.moe.num_experts, a.moe.top_k, a.moe.expert_hidden_dim, a.moe.shared_experts)
                if a.moe else False,
                "dropout": (a.dropout.hidden, a.dropout.attention) if a.dropout else (0.0, 0.0)}
        # Megatron pads the vocabulary (padded_vocab): the built-in may hold the tokenizer's own size
        same = {k: v for k, v in arch.items() if k in have and k != "vocab_size"}
        if all(have[k] == v for k, v in same.items()) and have["vocab_size"] in (
                arch.get("vocab_size"), arch.get("vocab_unpadded", arch.get("vocab_size"))):
            return name
    return None


def _hf_config(arch: dict, name: str) -> dict:
    """A Hugging Face config.json of these dimensions (ddplan.hf reads it): Llama's layout for SwiGLU, GPT-2's for
    GELU with learned positions, GPT-NeoX's for GELU with rotary ones."""
    hidden, attention = arch.get("dropout", (0.0, 0.0))
    common = {"_name_or_path": name, "hidden_size": arch["d_model"], "num_hidden_layers": arch["num_layers"],
              "num_attention_heads": arch["num_heads"], "vocab_size": arch["vocab_size"],
              "max_position_embeddings": arch["max_seq_len"], "tie_word_embeddings": arch["tied_embeddings"]}
    if arch.get("moe"):  # SwiGLU experts: Qwen3-MoE's layout with q/k norms, Mixtral's without
        experts, top_k, hidden_e, _ = arch["moe"]
        cfg = {"model_type": "qwen3_moe" if arch.get("qk_norm") else "mixtral", **common,
               "num_key_value_heads": arch["num_kv_heads"], "num_experts_per_tok": top_k,
               "attention_dropout": attention, "hidden_dropout": hidden}
        if arch.get("qk_norm"):
            cfg.update(num_experts=experts, moe_intermediate_size=hidden_e, intermediate_size=arch["mlp_hidden_dim"],
                       head_dim=arch["head_dim"])
        else:
            cfg.update(num_local_experts=experts, intermediate_size=hidden_e)
        return cfg
    if arch["mlp"] == "swiglu":
        cfg = {"model_type": "llama", **common, "num_key_value_heads": arch["num_kv_heads"],
               "intermediate_size": arch["mlp_hidden_dim"], "hidden_act": "silu",
               "attention_bias": arch.get("bias", False), "mlp_bias": arch.get("bias", False),
               "attention_dropout": attention, "hidden_dropout": hidden}
        if arch["d_model"] // arch["num_heads"] != arch.get("head_dim", arch["d_model"] // arch["num_heads"]):
            cfg["head_dim"] = arch["head_dim"]
        return cfg
    if arch["num_kv_heads"] != arch["num_heads"]:
        raise SpecError(f"{arch['num_kv_heads']} KV groups for {arch['num_heads']} heads with a {arch['mlp']} MLP: "
                        f"no config.json layout ddplan reads holds both; give import --model (a model YAML: "
                        f"`ddplan specs show gpt3-22b` prints one to edit)", field="--num-query-groups")
    if arch.get("position") == "learned":
        return {"_name_or_path": name, "model_type": "gpt2", "n_layer": arch["num_layers"], "n_embd": arch["d_model"],
                "n_head": arch["num_heads"], "n_positions": arch["max_seq_len"], "vocab_size": arch["vocab_size"],
                "n_inner": arch["mlp_hidden_dim"], "tie_word_embeddings": arch["tied_embeddings"],
                "resid_pdrop": hidden, "attn_pdrop": attention}
    return {"model_type": "gpt_neox", **common, "intermediate_size": arch["mlp_hidden_dim"],
            "use_parallel_residual": False, "hidden_dropout": hidden, "attention_dropout": attention}


def _model(out: Imported, arch: dict, name: str, how: str) -> None:
    if out.model_given:  # import --model states it: the file's architecture is not needed
        return
    builtin = _builtin_like(arch)
    if builtin:
        pad = arch.get("vocab_unpadded", arch["vocab_size"])
        padded = (f"; Megatron pads the vocabulary of {pad:,} to {arch['vocab_size']:,}, priced at the built-in's"
                  if pad != arch["vocab_size"] else "")
        out.set("model", builtin, f"the built-in with the file's dimensions ({how}){padded}")
    else:
        out.architecture = _hf_config(arch, name)
        out.set("model", None, f"no built-in has the file's dimensions ({how}): written as a config.json beside")


def _degrees(out: Imported, gpus: int | None, per_replica: int, stated: str, assumed: str = "") -> None:
    """GPUs in total: import --gpus, else what the file says, else `assumed`'s count or one node of 8 (assumed);
    checked against the model-parallel size per_replica."""
    if out.gpus_given:
        if out.gpus_given % per_replica:
            raise SpecError(f"--gpus {out.gpus_given}: the file's model-parallel size {per_replica} does not divide it",
                            file=out.source, field="--gpus")
        out.set("gpus", out.gpus_given, "given to import")
        return
    if gpus and gpus % per_replica == 0:
        out.set("gpus", gpus, stated)
        return
    if gpus:
        out.warnings.append(f"{stated} gives {gpus} GPUs, which the model-parallel size {per_replica} does not "
                            f"divide: {per_replica} assumed (data-parallel 1)")
        out.assume("gpus", per_replica, f"{stated} ({gpus}) cannot hold a model replica of {per_replica} GPUs")
        return
    m = re.match(r"(\d+) ", assumed)
    if m and int(m.group(1)) % per_replica == 0:
        out.assume("gpus", int(m.group(1)), assumed)
        return
    n = per_replica * max(1, 8 // per_replica) if per_replica <= 8 else per_replica
    out.assume("gpus", n, (assumed + "; " if assumed else "") + "the file does not say how many GPUs: one node of 8 "
               "(or one model replica); import --gpus, or edit")


# ----------------------------------------------------------------------------------------------------------------
# torchtitan

# torchtitan/models/llama3/__init__.py@238fa99 llama3_args: dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier,
# multiple_of; vocab 128,256 (the Llama 3 tokenizer)
TITAN_LLAMA3 = {"8B": (4096, 32, 32, 8, 1.3, 1024), "70B": (8192, 80, 64, 8, 1.3, 4096),
                "405B": (16384, 126, 128, 8, 1.2, 4096)}


def titan_ffn(dim: int, multiplier: float, multiple_of: int) -> int:
    """torchtitan's (and Meta's Llama 3) FeedForward hidden size: 2/3 of 4 dim, times ffn_dim_multiplier, rounded up
    to multiple_of. Ref: torchtitan/models/llama3/model/model.py@238fa99 FeedForward.__init__ (8B: 14,336; 70B:
    28,672; 405B: 53,248, as Meta's configs)."""
    hidden = int(multiplier * int(2 * 4 * dim / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


TITAN_READ = {
    "model": {"name", "flavor", "converters", "norm_type"},
    "training": {"local_batch_size", "batch_size", "global_batch_size", "seq_len", "steps", "mixed_precision_param",
                 "mixed_precision_reduce", "compile", "data_parallel_replicate_degree", "data_parallel_shard_degree",
                 "tensor_parallel_degree"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "enable_async_tensor_parallel", "fsdp_reshard_after_forward",
                    "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers"},
    "activation_checkpoint": {"mode", "selective_ac_option", "early_stop"},
    "compile": {"enable", "components"},
    "float8": {"enable_fsdp_float8_all_gather", "recipe_name", "precompute_float8_dynamic_scale_for_fsdp",
               "filter_fqns", "enable_float8_linear"},
    # before [parallelism] (torchtitan 2025-02) the pipeline and context degrees, async TP and the schedule lived here
    "experimental": {"pipeline_parallel_degree", "context_parallel_degree", "enable_async_tensor_parallel",
                     "pipeline_parallel_schedule", "pipeline_parallel_microbatches", "pipeline_parallel_split_points",
                     "custom_import", "custom_args_module", "custom_model_path"},
}
TITAN_NOT_COST = ("job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "validation",
                  "comm", "fault_tolerance", "memory_estimation", "dataloader")


def _titan_norm(out: Imported, norm_type: Any, path: Path) -> None:
    """[model] norm_type, which torchtitan read until 5078e92 (2025-04-17): "rmsnorm" was its own RMSNorm in torch
    ops, float32, one kernel an op, until nn.RMSNorm replaced it (3b39d7a, 2025-03-19; on the torches of that spring
    torch's composite rms_norm, op by op too), with the rotary embedding in complex float32 throughout: fusions
    decomposed (ddplan.anatomy.decomposed_rmsnorm_bytes). "fused_rmsnorm" (until 37c4b81, 2025-02-06) was one Triton
    kernel each way, the rotary embedding and SwiGLU still op by op: fused-norm. The LayerNorm types are not the Llama
    block ddplan prices: said. Read lowercased, as build_norm did. Absent (a later TOML): the profile's."""
    if norm_type is None:
        return
    if isinstance(norm_type, str):
        norm_type = norm_type.lower()
    if norm_type == "rmsnorm":
        out.set("fusions", "decomposed", "model.norm_type 'rmsnorm': torchtitan's RMSNorm in float32 torch ops "
                "(models/norms.py@989718967 L39-64) and complex RoPE, each op a kernel when not compiled")
    elif norm_type == "fused_rmsnorm":
        out.set("fusions", "fused-norm", "model.norm_type 'fused_rmsnorm': one Triton kernel each way "
                "(torchtitan/models/norms.py@eef8bb2b1 FusedRMSNorm); the complex RoPE and SwiGLU op by op")
    elif norm_type in ("layernorm", "np_layernorm"):
        out.warnings.append(f"model.norm_type {norm_type!r}: priced as the flavor's RMSNorm (ddplan prices the Llama "
                            f"block with RMSNorm; torch's fused LayerNorm moves the same bytes)")
    else:
        raise SpecError(f"must be one of rmsnorm, fused_rmsnorm, layernorm, np_layernorm, got {norm_type!r}",
                        file=str(path), field="model.norm_type")


def _toml(text: str, path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"not valid TOML: {e}", file=str(path)) from None


# torch.distributed.pipelining's schedules (get_schedule_class) as ddplan prices them, for the looped ones (more than one
# stage a rank): Interleaved1F1B is Megatron's interleaving; ZBVZeroBubble the zero-bubble paper's ZB-V ("requires
# exactly two stages per rank", torch schedules.py ScheduleZBVZeroBubble); the others are priced as the nearest:
# LoopedBFS and InterleavedZeroBubble (ZB-1p over several chunks) as interleaved 1F1B, DualPipeV (two chunks in a V)
# as ZB-V; each said
TITAN_SCHEDULES = {"Interleaved1F1B": ("interleaved", ""), "ZBVZeroBubble": ("zb-v", ""),
                   "LoopedBFS": ("interleaved", "its breadth-first order is priced as interleaved 1F1B's"),
                   "InterleavedZeroBubble": ("interleaved", "its weight-gradient passes filling the bubble are not "
                                             "priced: interleaved 1F1B's bubble, an upper bound"),
                   "DualPipeV": ("zb-v", "priced as ZB-V (two chunks a stage in a V); its forward-backward overlap is "
                                 "not priced")}


TITAN_SCHEDULE_NAMES = {name.lower(): name for name in ("1F1B", "GPipe", *TITAN_SCHEDULES)}


def _titan_schedule(out: Imported, schedule: str, where: str, pp: int, par: dict, layers: int | None,
                    path: Path) -> None:
    """A torchtitan looped pipeline schedule as a run file states it: its chunks a stage (vp) and ddplan's schedule
    (TITAN_SCHEDULES). Its chunks: pipeline_parallel_layers_per_stage's stages, ceil((layers + first_less +
    last_less) / layers_per_stage) over pp, where given and the model's layers are known (refused in one line where
    torchtitan refuses them: not a multiple of pp, or under 2 a rank), else torchtitan's default of 2 a rank for a
    looped schedule (torchtitan/distributed/pipeline_parallel.py@b5bcd76 L219-263, @238fa99 L75-114;
    first/last_stage_less_layers default 1: config/configs.py@b5bcd76 L197-209)."""
    if schedule not in TITAN_SCHEDULES:
        raise SpecError(f"{schedule!r} is not a schedule ddplan reads of torch.distributed.pipelining's (1F1B, GPipe, "
                        f"{', '.join(TITAN_SCHEDULES)})", file=str(path), field=where)
    kind, caveat = TITAN_SCHEDULES[schedule]

    def whole(key: str, default: int, least: int) -> int:
        value = par.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise SpecError(f"must be a whole number >= {least}, got {value!r}", file=str(path),
                            field=f"parallelism.{key}")
        return value

    chunks, why = 2, "torchtitan's default of 2 stages a rank for a looped schedule"
    if par.get("pipeline_parallel_layers_per_stage") is not None and layers:
        per_stage = whole("pipeline_parallel_layers_per_stage", 1, 1)
        stages = -(-(layers + whole("pipeline_parallel_first_stage_less_layers", 1, 0)
                     + whole("pipeline_parallel_last_stage_less_layers", 1, 0)) // per_stage)
        if stages % pp or stages // pp < 2 or (kind == "zb-v" and stages // pp != 2):
            need = "exactly 2 a rank" if kind == "zb-v" else "a multiple of pp, at least 2 a rank"
            raise SpecError(f"{per_stage} gives {stages} stages, which torchtitan refuses for {schedule!r} at pp {pp}: "
                            f"{need}", file=str(path), field="parallelism.pipeline_parallel_layers_per_stage")
        chunks, why = stages // pp, f"pipeline_parallel_layers_per_stage {per_stage}: {stages} stages over pp {pp}"
    elif kind == "zb-v":
        why = "two stages a rank (torch ScheduleZBVZeroBubble, ScheduleDualPipeV)"
    out.set(("layout", "vp"), chunks, why)
    out.set(("layout", "schedule"), kind, f"{where} {schedule!r}")
    if caveat:
        out.warnings.append(f"{where} {schedule!r}: {caveat}")


def _torchtitan(text: str, path: Path, out: Imported) -> None:
    """A torchtitan job TOML (JobConfig: [model], [training], [parallelism], [activation_checkpoint], [compile],
    [quantize.linear.float8] or the older [float8])."""
    cfg = _toml(text, path)
    if not isinstance(cfg.get("model"), dict) and not isinstance(cfg.get("training"), dict):
        raise SpecError("no [model] or [training] table: not a torchtitan job config", file=str(path))

    def get(section: str, key: str, default: Any = None) -> Any:
        table = cfg.get(section, {})
        return table.get(key, default) if isinstance(table, dict) else default

    def flag(value: Any, field: str) -> tuple[bool, str]:
        """A TOML boolean and where it came from; anything else is one line naming the field."""
        if not isinstance(value, bool):
            raise SpecError(f"must be true or false, got {value!r}", file=str(path), field=field)
        return value, field

    training, par, exp = cfg.get("training", {}), cfg.get("parallelism", {}), cfg.get("experimental", {})
    # a TOML is torchtitan before its 2026-02-23 config refactor (9810191): its loss was one eager cross entropy on
    # the float logits (the profile's chunked loss came 2026-06-26, 9530a87), stated so the profile's does not stand in
    out.set("cross_entropy", "eager", "a job TOML: torchtitan before 2026-02-23, one cross entropy on the float logits "
            "(the chunked loss came 2026-06-26)")
    for name, table in (("training", training), ("parallelism", par), ("model", cfg.get("model", {})),
                        ("activation_checkpoint", cfg.get("activation_checkpoint", {})), ("experimental", exp),
                        ("compile", cfg.get("compile", {}))):
        if not isinstance(table, dict):
            raise SpecError(f"must be a table ([{name}]), got {table!r}", file=str(path), field=name)
    name, flavor = get("model", "name", "llama3"), str(get("model", "flavor", "debugmodel"))
    layers = None  # the model's blocks, where the flavor gives them (a looped schedule's chunks may need them)
    if name == "llama3" and flavor in TITAN_LLAMA3:
        dim, layers, heads, kv, mult, multiple = TITAN_LLAMA3[flavor]
        arch = {"num_layers": layers, "d_model": dim, "num_heads": heads, "num_kv_heads": kv,
                "mlp_hidden_dim": titan_ffn(dim, mult, multiple), "vocab_size": 128256, "mlp": "swiglu",
                "tied_embeddings": False, "moe": False, "dropout": (0.0, 0.0), "max_seq_len": 131072,
                "position": "rope"}
        _model(out, arch, f"llama3-{flavor.lower()}", f"[model] name {name!r}, flavor {flavor!r}")
        # the TOML era's flavors ran SDPA; FlexAttention (the torchtitan profile's, a later default) was a flavor of
        # its own (8B_flex): stated, so the profile's flex does not stand in for it
        out.set("attention", "sdpa-fused", f"flavor {flavor!r}: attn_type 'sdpa' (torchtitan/models/llama3/model/"
                "args.py@238fa99 L45; the _flex flavors were FlexAttention)")
    elif not out.model_given:
        raise SpecError(f"[model] name {name!r}, flavor {flavor!r}: import reads llama3 flavors "
                        f"{', '.join(TITAN_LLAMA3)}; for another model give import --model NAME (a built-in, a "
                        f"model YAML or a config.json)", file=str(path), field="model")

    _titan_norm(out, get("model", "norm_type"), path)

    # parallelism: the older releases kept the data and tensor degrees in [training], the pipeline and context ones,
    # async TP and the schedule in [experimental] (config_manager.py@cca0702 L286-365, before [parallelism] came)
    def parallel(key: str, default: Any = None) -> tuple[Any, str]:
        return next(((t[key], f"{name}.{key}") for name, t in (("parallelism", par), ("training", training),
                                                                ("experimental", exp)) if key in t),
                    (default, f"parallelism.{key}"))

    def degree(key: str, default: int = 1) -> int:
        value, where = parallel(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
            raise SpecError(f"must be a positive whole number (or -1 for the shard degree), got {value!r}",
                            file=str(path), field=where)
        return value

    replicate, shard = degree("data_parallel_replicate_degree"), degree("data_parallel_shard_degree", -1)
    tp, pp, cp = degree("tensor_parallel_degree"), degree("pipeline_parallel_degree"), degree("context_parallel_degree")
    ep, etp = degree("expert_parallel_degree"), degree("expert_tensor_parallel_degree")
    for key, value in (("tp", tp), ("pp", pp), ("cp", cp)):
        out.set(("layout", key), value)
    if ep > 1:
        out.set(("layout", "ep"), ep)
    if etp > 1:
        out.set(("layout", "etp"), etp)
    per_replica = tp * pp * cp
    if shard == -1:  # torchtitan: the shard degree is whatever the world size leaves
        _degrees(out, None, per_replica * replicate, "", _note_gpus(text))
        shard = out.fields[("gpus",)] // (per_replica * replicate)
    else:
        world = replicate * shard * per_replica
        if out.gpus_given and out.gpus_given != world:
            raise SpecError(f"--gpus {out.gpus_given}: the file's [parallelism] degrees multiply to {world} GPUs",
                            file=out.source, field="--gpus")
        out.set("gpus", world, "the product of the [parallelism] degrees")
    hw = _note_hardware(text)
    if hw:
        out.assume("hardware", hw[0], hw[1])
    if shard > 1:
        out.set(("layout", "zero"), 3, "data_parallel_shard_degree > 1: FSDP2 shards parameters, gradients and "
                                       "optimizer states")
        if replicate > 1:
            out.set(("layout", "shard_group"), shard, "HSDP: sharded over data_parallel_shard_degree ranks")
    else:
        out.set(("layout", "zero"), 0, "no shard degree: replicated (DDP)")
    async_tp, where = flag(*parallel("enable_async_tensor_parallel", False))
    # [compile] enable (torchtitan 08b8b24, 2025-08-20, on), training.compile before it
    compiled = (flag(cfg["compile"]["enable"], "compile.enable")[0] if "enable" in cfg.get("compile", {})
                else flag(training.get("compile", False), "training.compile")[0])
    components = get("compile", "components", ["model", "loss"])
    if async_tp and not (compiled and "model" in components):
        # Inductor's micro-pipelined TP: torchtitan refuses the job (parallelize_llama.py@cca0702 L53-58: "Async TP
        # requires --training.compile"; tensor_parallel.py@238fa99 L20-23: 'model' in compile.components too)
        raise SpecError("true needs the model compiled (torchtitan raises 'Async TP requires ...compile'): turn "
                        "compile on for the model, or async TP off", file=str(path), field=where)
    if async_tp:
        out.set(("layout", "tp_comm_overlap"), True)
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if reshard in ("always", "never"):
        out.set(("layout", "reshard_after_forward"), reshard == "always")
    elif pp > 1 and shard > 1:  # "default" reshards only without a pipeline (torchtitan/distributed/fsdp.py L112-136)
        out.set(("layout", "reshard_after_forward"), False,
                "fsdp_reshard_after_forward 'default' with pipeline parallelism: not resharded")
    schedule, where = parallel("pipeline_parallel_schedule", "1F1B")
    # torch's get_schedule_class matches names whatever their case (older presets wrote "1f1b", "gpipe")
    schedule = TITAN_SCHEDULE_NAMES.get(str(schedule).lower(), schedule)
    if pp > 1 and schedule not in ("1F1B", "GPipe"):
        _titan_schedule(out, schedule, where, pp, par, layers, path)

    local, local_field = next(((training[k], f"training.{k}") for k in ("local_batch_size", "batch_size")
                               if k in training), (8, "training.local_batch_size"))
    if not isinstance(local, int) or isinstance(local, bool) or local < 1:
        raise SpecError(f"must be a whole number >= 1, got {local!r}", file=str(path), field=local_field)
    seq = training.get("seq_len", 2048)
    dp = replicate * shard
    older_pipeline = parallel("pipeline_parallel_degree")[1].startswith("experimental.")
    for key in ("pipeline_parallel_degree", "context_parallel_degree"):
        if key in par and key in exp and par[key] != exp[key]:
            out.warnings.append(f"parallelism.{key} {par[key]!r} and experimental.{key} {exp[key]!r}: the first read "
                                f"(torchtitan's newer table)")
    if pp > 1 and older_pipeline:
        # the older pipeline: the local batch split into experimental.pipeline_parallel_microbatches, by default as
        # many as stages: pp, times 2 a rank for a looped schedule without split points (pipelining_utils.py@cca0702
        # L28-40, L85-89)
        splits = exp.get("pipeline_parallel_split_points")
        stages = (len(splits) + 1 if isinstance(splits, list) and splits
                  else pp * (1 if schedule in ("1F1B", "GPipe") else 2))
        count = exp.get("pipeline_parallel_microbatches", stages)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1 or local % count:
            field = ("experimental.pipeline_parallel_microbatches" if "pipeline_parallel_microbatches" in exp
                     else local_field)
            raise SpecError(f"{local_field} {local} must split into {count!r} micro-batches (experimental."
                            f"pipeline_parallel_microbatches, by default one a stage: {stages})", file=str(path),
                            field=field)
        out.set(("batch", "device"), local // count, f"{local_field} {local} / {count} micro-batches "
                + ("(experimental.pipeline_parallel_microbatches)" if "pipeline_parallel_microbatches" in exp
                   else f"(torchtitan's older default: one a stage, {stages})"))
    elif pp > 1:  # the pipeline runs the local batch as micro-batches of pipeline_parallel_microbatch_size
        micro = par.get("pipeline_parallel_microbatch_size", 1)
        out.set(("batch", "device"), micro, f"parallelism.pipeline_parallel_microbatch_size (local batch {local})")
    else:
        out.set(("batch", "device"), local)
    global_batch = training.get("global_batch_size", -1)
    if global_batch in (-1, None) and ("gpus",) in out.assumed:  # the local batch on every data-parallel rank
        out.assume(("batch", "total_tokens"), local * dp * seq,
                   f"{local * dp} sequences of {seq} tokens: local_batch_size {local} on each of the {dp} "
                   f"data-parallel ranks the assumed GPU count gives")
    else:
        global_batch = local * dp if global_batch in (-1, None) else global_batch
        out.set(("batch", "total_tokens"), global_batch * seq, f"{global_batch} sequences of {seq} tokens")
    out.set("seq_len", seq)
    out.set(("budget", "steps"), training.get("steps", 10000))
    precision = training.get("mixed_precision_param", "bfloat16")
    out.set(("precision", "dtype"), {"bfloat16": "bf16", "float32": "fp32"}.get(precision, precision))
    reduce = training.get("mixed_precision_reduce", "float32")
    # FSDP2 keeps fp32 sharded parameters: a reduce in the compute dtype (mixed_precision_param) is ddplan's
    # `compute`, the gradients kept in fp32; another dtype than these two ddplan cannot state
    if reduce == "float32":
        out.set(("precision", "grads"), "fp32")
    elif reduce == precision:
        out.set(("precision", "grads"), "compute",
                f"training.mixed_precision_reduce {reduce}: reduced in the compute dtype, kept in fp32")
    else:
        out.set(("precision", "grads"), "fp32")
        out.warnings.append(f"training.mixed_precision_reduce {reduce} is neither float32 nor the compute dtype "
                            f"({precision}): priced as an fp32 reduce")

    ac = cfg.get("activation_checkpoint", {})
    mode, option = ac.get("mode", "selective"), str(ac.get("selective_ac_option", "2"))
    if mode == "selective" and option == "op":
        out.set("recompute", "per-op", "activation_checkpoint selective, op: SelectiveAC")
    elif mode in ("none", "full"):
        out.set("recompute", mode)
    elif mode == "selective" and option.isdigit():  # every K-th block checkpointed whole (torchtitan's layer SAC)
        k = int(option)
        out.set("recompute", "full" if k <= 1 else f"every:{k}",
                f"activation_checkpoint selective, selective_ac_option {option!r}"
                + (": every block (0 and 1 mean all)" if k <= 1 else f": every {k}th block checkpointed whole"))
    else:
        out.warnings.append(f"activation_checkpoint mode {mode!r} is not modelled: priced as full recompute")
        out.set("recompute", "full")
    # torchtitan's checkpoint wrapper takes activation_checkpoint.early_stop (default False since 25413d2,
    # 2025-08-29: a block re-runs whole, as the profile states). Before that commit it wrapped blocks with torch's
    # default, which stops early (parallelize_llama.py@cca0702 L234: ptd_checkpoint_wrapper(module,
    # preserve_rng_state=False)); a TOML with `training.compile` (moved to [compile] by 08b8b24, 2025-08-20) is from then
    early = flag(ac.get("early_stop", "compile" in training), "activation_checkpoint.early_stop")[0]
    if "early_stop" in ac:
        why = "activation_checkpoint.early_stop" + (" true: torch's early stop" if early else " false: a checkpointed "
                                                    "block re-runs whole")
    elif early:
        why = ("training.compile: a TOML before torchtitan 08b8b24 (2025-08-20), whose checkpoint wrapper kept torch's "
               "early stop (activation_checkpoint.early_stop came with 25413d2, 2025-08-29)")
    else:
        why = ("no activation_checkpoint.early_stop: false, torchtitan's default since 25413d2 (2025-08-29; a job from "
               "before it stopped early: state true)")
    out.set("recompute_early_stop", early, why)

    out.set("compiled", compiled)
    converters = get("model", "converters", []) or []
    if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
        raise SpecError(f"must be a list of names, got {converters!r}", file=str(path), field="model.converters")

    def quantize(kind: str) -> dict:
        """[quantize.linear.KIND] (or, for float8, the older [float8]), checked to be tables."""
        node: Any = cfg
        parts = ("quantize", "linear", kind)
        for i, part in enumerate(parts):
            node = node.get(part, {})
            if not isinstance(node, dict):
                raise SpecError(f"must be a table, got {node!r}", file=str(path), field=".".join(parts[:i + 1]))
        if not node and kind == "float8":
            node = cfg.get("float8", {})
            if not isinstance(node, dict):
                raise SpecError(f"must be a table, got {node!r}", file=str(path), field="float8")
        return node

    # before the converters (57387af, 2025-02-15) [float8] enable_float8_linear swapped the linears for torchao's
    # Float8Linear, dynamic tensorwise scaling the only kind (torchtitan/float8.py@cca0702 L72)
    fp8 = [c for c in converters if "float8" in c]
    if not fp8 and flag(quantize("float8").get("enable_float8_linear", False), "float8.enable_float8_linear")[0]:
        fp8 = ["float8"]
    mx = [c for c in converters if c.endswith("linear.mx") or c == "mx"]
    if fp8 and mx:
        out.warnings.append(f"model.converters {mx + fp8}: both float8 and mx; priced as float8 (ddplan prices one "
                            f"fp8 recipe a run)")
    if fp8:
        f8 = quantize("float8")
        out.set(("precision", "fp8"), True)
        recipe = f8.get("recipe_name") or "tensorwise"
        if recipe not in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
            out.warnings.append(f"float8 recipe_name {recipe!r}: priced as tensorwise scaling")
            recipe = "tensorwise"
        out.set(("precision", "fp8_recipe"), recipe)
        if f8.get("enable_fsdp_float8_all_gather") is True and shard > 1:  # torchtitan: only with FSDP sharding
            out.set(("precision", "fp8_all_gather"), True)
    if mx and not fp8:  # the TOML era's MXLinearConverter (quantize.linear.mx: torchao's prototype MXLinear)
        name = quantize("mx").get("recipe_name", "mxfp8_cublas")
        out.set(("precision", "fp8"), True)
        out.set(("precision", "fp8_recipe"), "mxfp8_torchao")
        out.warnings.append(f"mx recipe_name {name!r}: priced as torchao's MXFP8Linear (mxfp8_torchao: every cast "
                            f"from the saved 16-bit tensors), what torchtitan's MXFP8 converter builds today")
    other = [c for c in converters if "float8" not in c and c not in mx]
    if other:
        out.warnings.append(f"model.converters {other}: not modelled (priced without them)")

    for section, table in cfg.items():
        if section in TITAN_NOT_COST:
            out.ignored.append(f"[{section}]")
        elif section == "quantize":
            continue
        elif isinstance(table, dict):
            unread = sorted(k for k in table if k not in TITAN_READ.get(section, ()) and not _titan_not_cost(k))
            out.warnings.extend(f"{section}.{k} is not read" for k in unread)
            out.ignored.extend(f"{section}.{k}" for k in table if _titan_not_cost(k))


def _titan_not_cost(key: str) -> bool:
    return key in ("hf_assets_path", "tokenizer_path", "dataset", "dataset_path", "max_norm", "seed",
                   "deterministic", "gc_freq", "description", "print_config", "enable_cpu_offload")


def _note_gpus(text: str) -> str:
    """A torchtitan preset's own note of its world size ("NOTE: this toml config is a preset for 64 A100 GPUs"),
    as `N GPUs: why`, or ''."""
    m = re.search(r"#.*?preset for (\d+)\s+(\w+)\s+GPUs", text)
    if m:
        return (f"{m.group(1)} GPUs: data_parallel_shard_degree -1 takes the world size, which the file gives only "
                f"in its note 'a preset for {m.group(1)} {m.group(2)} GPUs'; import --gpus, or edit")
    return ""


def _note_hardware(text: str) -> tuple[str, str] | None:
    m = re.search(r"#.*?preset for \d+\s+(\w+)\s+GPUs", text)
    names = {"A100": "a100-sxm-80gb", "H100": "h100-sxm", "H200": "h200", "MI300X": "mi300x", "B200": "b200",
             "GB200": "gb200", "B300": "b300", "GB300": "gb300"}
    if m and m.group(1).upper() in names:
        part = " (the 80 GB part)" if m.group(1).upper() == "A100" else ""
        return names[m.group(1).upper()], f"the file's note names {m.group(1)} GPUs{part}; import --hardware, or edit"
    return None


# ----------------------------------------------------------------------------------------------------------------
# Megatron-LM arguments (and NeMo, which states the same settings in YAML)

MEGATRON_NOT_COST = re.compile(
    r"^--(lr|min-lr|decoupled|adam|weight-decay|clip-grad|init-method|data(?!-parallel)|split|vocab-file|merge-file|tokenizer|"
    r"save|load|log|tensorboard|eval|wandb|seed|exit|mock-data|num-workers|no-mmap|no-create|tiktoken|"
    r"lr-|attention-dropout|hidden-dropout|rotary|apply-layernorm|use-mcore|manual-gc|empty-unused|"
    r"cross-entropy|calculate-per-token|distributed-timeout|ckpt|finetune|no-load|dist-ckpt|"
    r"step-batch-size-schedule|rampup|use-checkpoint|timing|profile|masked-softmax|bias-gelu|bias-dropout|"
    r"no-bias|no-masked|no-gradient|no-async|norm-epsilon|layernorm-epsilon|kv-channels|max-position|"
    r"position-embedding|swiglu|normalization|untie|disable-bias|group-query|num-query-groups|attention-backend|"
    r"use-flash-attn|fp8-amax|fp8-margin|fp8-interval|recompute-method|recompute-num-layers|recompute-modules|"
    r"te-rng-tracker|moe-aux-loss-coeff|moe-z-loss|qk-layernorm|moe-router-topk|"
    r"moe-ffn-hidden-size|moe-layer-freq|num-experts|distributed-backend|async-save|use-persistent-ckpt-worker|"
    r"zero-bubble-pipeline-timers|zero-bubble-adaptive-memory)")


def _shell_args(text: str) -> tuple[list[str], dict[str, str]]:
    """The arguments a launch script passes (or an argument file lists): its simple assignments expanded (VAR=x,
    ${1:-x}, arrays), comments and line continuations removed. Not a shell: conditionals are read as if taken."""
    text = re.sub(r"\\\n", " ", text)
    env: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    tokens: list[str] = []

    def expand(s: str) -> str:
        s = re.sub(r"\$\{(\w+)\[@\]\}", lambda m: " ".join(arrays.get(m.group(1), [])), s)
        s = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), s)
        s = re.sub(r"\$\(\(\s*\$?(\w+)\s*\*\s*\$?(\w+)\s*\)\)", lambda m: _product(env, m.group(1), m.group(2)), s)
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), s)

    lines = iter(text.splitlines())
    for raw in lines:
        line = _uncomment(raw) if not raw.lstrip().startswith("#!") else ""
        if not line:
            continue
        m = re.match(r"^(?:export\s+)?(\w+)(\+?)=\($", line) or re.match(r"^(?:export\s+)?(\w+)(\+?)=\((.*)\)$", line)
        if m:
            body = [m.group(3)] if m.lastindex == 3 else []
            if m.lastindex != 3:
                for more in lines:
                    item = _uncomment(more)
                    if item.endswith(")") and not item.endswith("$(") and item.count("(") < item.count(")"):
                        body.append(item[:-1])  # `--hidden-size 64 )`: the array closes on its last item
                        break
                    body.append(item)
            items = [w for part in body for piece in _split(expand(part)) for w in _split(piece)]
            arrays[m.group(1)] = (arrays.get(m.group(1), []) if m.group(2) else []) + items
            continue
        m = re.match(r"^(?:export\s+)?(\w+)=(.*)$", line)
        if m:
            words = [w for piece in _split(expand(m.group(2))) for w in _split(piece)]
            env[m.group(1)] = " ".join(words)
            if any(w.startswith("--") for w in words):  # a string of arguments (MODEL_OPTIONS="--num-layers ...")
                tokens += words
            continue
        tokens += [w for piece in _split(expand(line)) for w in _split(piece)]
    return tokens, env


def _uncomment(line: str) -> str:
    """A shell line without its comment: a # outside quotes that starts a word (`--name "run#3"` keeps its #)."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def _product(env: dict[str, str], a: str, b: str) -> str:
    x, y = env.get(a, a), env.get(b, b)
    return str(int(x) * int(y)) if x.isdigit() and y.isdigit() else f"{x}*{y}"


def _split(s: str) -> list[str]:
    try:
        return shlex.split(s)
    except ValueError:
        return s.split()


# Megatron-LM flags that take a list (nargs='+'): their values, space-separated, up to the next flag
LIST_FLAGS = ("--recompute-modules",)


def _flags(tokens: list[str]) -> dict[str, str | bool]:
    """--name value / --name=value / --name (a switch: True), the last given winning; a LIST_FLAGS flag takes every
    value up to the next flag, space-separated."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.startswith("--") and len(t) > 2:
            if "=" in t:
                k, v = t.split("=", 1)
                out[k] = v
            elif t in LIST_FLAGS and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                values = []
                while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                    values.append(tokens[i + 1])
                    i += 1
                out[t] = " ".join(values)
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                out[t] = tokens[i + 1]
                i += 1
            else:
                out[t] = True
        i += 1
    return out


GPT2_VOCAB = 50257  # the GPT-2 BPE vocabulary (Radford et al. 2019), Megatron's GPT2BPETokenizer


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron's padded vocabulary: rounded up to a multiple of make_vocab_size_divisible_by x tp.
    Ref: megatron/training/tokenizer/tokenizer.py@d98e8a6 _vocab_size_with_padding (50,257 -> 51,200 at tp 8)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def _number(value: Any, path: Path, flag: str, kind: type = float) -> float:
    """A number the file gives (a dropout, a ratio, -1 for "never"), or one error line naming the field."""
    try:
        return kind(str(value))
    except ValueError:
        raise SpecError(f"must be a {'whole number' if kind is int else 'number'}, got {value!r}", file=str(path),
                        field=flag) from None


def _int(value: Any, path: Path, flag: str) -> int:
    try:
        n = int(str(value))
    except ValueError:
        raise SpecError(f"must be a whole number, got {value!r}", file=str(path), field=flag) from None
    if n <= 0:
        raise SpecError(f"must be positive, got {n}", file=str(path), field=flag)
    return n


def _zero_bubble_args(arg, pp: int, out: Imported) -> None:
    """The Zero Bubble fork of Megatron-LM's schedule flags (sail-sg/zero-bubble-pipeline-parallelism
    megatron/arguments.py@6574e0ea L192-216, L1118-1145) as ddplan's schedule: --zero-bubble-v-schedule is ZB-V (two
    chunks a stage, "args.virtual_pipeline_model_parallel_size = 2"); --enable-zero-bubble is the paper's ZB-1p or
    ZB-2p by --zero-bubble-max-pending-backward ("when number of stages are 8, setting to 16 will use zb2p and
    setting to 8 will use zb1p"): at least 2 pp is zb-h2, else zb-h1; "auto" (its default, an adaptive memory limit)
    is priced as zb-h1 (the larger bubble) and said. --enable-optimizer-post-validation is read and changes nothing:
    ddplan prices no synchronisation before the optimizer step, the one it removes."""
    arg("--enable-optimizer-post-validation")
    if arg("--zero-bubble-v-schedule"):  # it turns --enable-zero-bubble on, and its own memory limit
        arg("--enable-zero-bubble")
        arg("--zero-bubble-max-pending-backward")
        out.set(("layout", "schedule"), "zb-v", "--zero-bubble-v-schedule")
        out.set(("layout", "vp"), 2, "ZB-V: two chunks a stage")
        return
    if not arg("--enable-zero-bubble") or pp < 2:
        arg("--zero-bubble-max-pending-backward")
        return
    pending = str(arg("--zero-bubble-max-pending-backward", "auto"))
    if pending.isdigit():
        schedule = "zb-h2" if int(pending) >= 2 * pp else "zb-h1"
        out.set(("layout", "schedule"), schedule, f"--enable-zero-bubble, --zero-bubble-max-pending-backward {pending} "
                                                  f"at pp {pp} (ZB-{'2p' if schedule == 'zb-h2' else '1p'})")
    else:
        out.set(("layout", "schedule"), "zb-h1", "--enable-zero-bubble with an adaptive memory limit")
        out.warnings.append(f"--zero-bubble-max-pending-backward {pending}: an adaptive memory limit, priced as ZB-1p "
                            f"(zb-h1, the larger bubble of the two)")


def _megatron(text: str, path: Path, out: Imported, tokens: list[str] | None = None) -> None:
    """Megatron-LM's pretrain_gpt.py arguments, in a launch script, an argument file, or a YAML map of them
    (MODEL_ARGS: {--num-layers: 32, --bf16: true, ...}, as its functional tests' model_config.yaml); or `tokens`, the
    arguments another reader translated (_bridge)."""
    if tokens is None:
        tokens = _shell_args(text)[0] if path.suffix not in (".yaml", ".yml") else _yaml_args(path)
    a = _flags(tokens)
    read: set[str] = set()

    def arg(name: str, default: Any = None) -> Any:
        read.add(name)
        return a.get(name, default)

    def num(name: str, default: int | None = None) -> int | None:
        v = arg(name)
        return default if v is None else _int(v, path, name)

    for needed in ("--num-layers", "--hidden-size", "--num-attention-heads"):
        if needed not in a:
            raise SpecError(f"{needed} is not given: Megatron-LM arguments state the model", file=str(path),
                            field=needed)
    tp, pp, cp = num("--tensor-model-parallel-size", 1), num("--pipeline-model-parallel-size", 1), \
        num("--context-parallel-size", 1)
    ep, etp = num("--expert-model-parallel-size", 1), num("--expert-tensor-parallel-size")
    if ep > 1:
        out.set(("layout", "ep"), ep)
    if etp:
        out.set(("layout", "etp"), etp)
    d, layers, heads = num("--hidden-size"), num("--num-layers"), num("--num-attention-heads")
    groups = num("--num-query-groups", heads) if arg("--group-query-attention") else heads
    read.add("--num-query-groups")
    swiglu = bool(arg("--swiglu"))
    # megatron/training/arguments.py@d98e8a6 L1327: with --swiglu the default width is 2/3 of 4h, to a multiple of 64
    ffn = num("--ffn-hidden-size", int((4 * d * 2 / 3) / 64) * 64 if swiglu else 4 * d)
    seq = num("--seq-length")
    vocab = num("--vocab-size")
    if vocab is None:
        tokenizer = arg("--tokenizer-type", "GPT2BPETokenizer")
        if tokenizer != "GPT2BPETokenizer" and not out.model_given:
            raise SpecError(f"--tokenizer-type {tokenizer}: the vocabulary size is not in the arguments; give "
                            f"--vocab-size in the file or import --model", file=str(path), field="--vocab-size")
        vocab = GPT2_VOCAB
    unpadded, vocab = vocab, padded_vocab(vocab, num("--make-vocab-size-divisible-by", 128), tp)
    hidden_drop = _number(arg("--hidden-dropout", 0.1), path, "--hidden-dropout")
    attn_drop = _number(arg("--attention-dropout", 0.1), path, "--attention-dropout")
    position = arg("--position-embedding-type", "rope" if arg("--use-rotary-position-embeddings") else
                   "learned_absolute")
    arch = {"num_layers": layers, "d_model": d, "num_heads": heads, "num_kv_heads": groups, "mlp_hidden_dim": ffn,
            "vocab_size": vocab, "vocab_unpadded": unpadded, "mlp": "swiglu" if swiglu else "gelu",
            "tied_embeddings": not arg("--untie-embeddings-and-output-weights"), "moe": _megatron_moe(arg, num, path) if not out.model_given else False,
            "qk_norm": bool(arg("--qk-layernorm")),
            "dropout": (hidden_drop, attn_drop), "max_seq_len": num("--max-position-embeddings", seq) or seq,
            "position": "rope" if position == "rope" else "learned", "bias": not arg("--disable-bias-linear"),
            "head_dim": num("--kv-channels", d // heads)}
    _model(out, arch, path.stem, "--num-layers, --hidden-size, --num-attention-heads, ...")
    if seq is None:
        raise SpecError("--seq-length is not given", file=str(path), field="--seq-length")
    out.set("seq_len", seq)
    out.set(("layout", "tp"), tp)
    out.set(("layout", "pp"), pp)
    out.set(("layout", "cp"), cp)
    vp = num("--virtual-pipeline-model-parallel-size")
    per_vp = num("--num-layers-per-virtual-pipeline-stage")
    if vp is None and per_vp:
        vp = layers // (pp * per_vp)
    if vp:
        out.set(("layout", "vp"), vp)
    _zero_bubble_args(arg, pp, out)
    for flag, key in (("--sequence-parallel", "sequence_parallel"), ("--tp-comm-overlap", "tp_comm_overlap"),
                      ("--overlap-param-gather", "overlap_param_gather")):
        if arg(flag) and key != "overlap_param_gather" and tp == 1:
            # megatron/training/arguments.py@d98e8a6 L1433-1439: sequence parallelism is turned off at tp 1
            out.ignored.append(f"{flag} (off at tensor-parallel size 1, as Megatron-LM turns it off)")
        elif arg(flag):
            out.set(("layout", key), True)
    read.add("--overlap-grad-reduce")
    if arg("--overlap-grad-reduce"):  # else the megatron-core profile's: reduced after backward (its default)
        out.set(("layout", "overlap_grad_reduce"), True)
        if not (arg("--use-megatron-fsdp") or arg("--use-custom-fsdp")):  # Megatron-FSDP reduces a unit at a time
            _megatron_buckets(arg, num, out)
    if arg("--use-megatron-fsdp") or arg("--use-custom-fsdp"):
        out.set(("layout", "zero"), 3, "Megatron-FSDP")
    elif arg("--use-distributed-optimizer"):
        out.set(("layout", "zero"), 1, "--use-distributed-optimizer shards the optimizer states")
    nodes = num("--nnodes", 1)
    per_node = num("--nproc_per_node") or num("--nproc-per-node")
    _degrees(out, per_node * nodes if per_node else None, tp * pp * cp,
             f"torchrun --nproc_per_node {per_node} --nnodes {nodes}" if per_node else "")
    micro, global_batch = num("--micro-batch-size", 1), num("--global-batch-size")
    out.set(("batch", "device"), micro)
    if global_batch:
        out.set(("batch", "total_tokens"), global_batch * seq, f"--global-batch-size {global_batch} x {seq}")
    else:  # Megatron's default: one micro-batch a data-parallel rank (arguments.py: micro-batch x dp)
        dp = out.fields[("gpus",)] // (tp * pp * cp)
        why = f"no --global-batch-size: Megatron's default, --micro-batch-size {micro} x data-parallel {dp} x {seq}"
        if ("gpus",) in out.assumed:
            out.assume(("batch", "total_tokens"), micro * dp * seq, why + " (from the assumed GPU count)")
        else:
            out.set(("batch", "total_tokens"), micro * dp * seq, why)
    steps, samples = num("--train-iters"), num("--train-samples")
    if steps:
        out.set(("budget", "steps"), steps)
    elif samples:
        out.set(("budget", "tokens"), float(samples * seq), f"--train-samples {samples} x {seq}")
    dtype = "bf16" if arg("--bf16") else "fp16" if arg("--fp16") else "fp32"
    out.set(("precision", "dtype"), dtype)
    if arg("--grad-reduce-in-bf16"):
        out.set(("precision", "grads"), "param", "--grad-reduce-in-bf16: gradients kept and reduced in bf16")
    fmt = arg("--fp8-format")
    if fmt:
        out.set(("precision", "fp8"), True)
        recipe = arg("--fp8-recipe", "delayed")
        if recipe == "tensorwise":  # Transformer Engine's Float8CurrentScaling (megatron/core/fp8_utils.py L777-779)
            out.set(("precision", "fp8_recipe"), "current", "--fp8-recipe tensorwise: Transformer Engine current scaling")
        elif recipe == "mxfp8":  # Transformer Engine's MXFP8BlockScaling
            out.set(("precision", "fp8_recipe"), "mxfp8")
        else:
            if recipe != "delayed":
                out.warnings.append(f"--fp8-recipe {recipe}: priced as delayed scaling")
            out.set(("precision", "fp8_recipe"), "delayed")
        if arg("--fp8-param-gather") and out.fields.get(("layout", "zero")) in (1, 3):  # dist. optimizer, M-FSDP
            out.set(("precision", "fp8_params"), True, "--fp8-param-gather: fp8 weights kept and gathered in fp8")
        elif arg("--fp8-param-gather"):
            out.warnings.append("--fp8-param-gather without the distributed optimizer or Megatron-FSDP is not "
                                "priced: the weights are priced 16-bit in memory and gathers")
    if arg("--use-precision-aware-optimizer"):
        _precision_aware(out, dtype, arg("--exp-avg-dtype", "fp32"), arg("--exp-avg-sq-dtype", "fp32"),
                         arg("--main-params-dtype", "fp32"), arg("--main-grads-dtype", "fp32"),
                         arg("--fp8-recipe", "delayed") if fmt else None,  # as given: blockwise keeps them whole
                         out.fields.get(("layout", "zero")) == 3 or bool(arg("--fp8-param-gather")), path)
    granularity = arg("--recompute-granularity")
    if arg("--recompute-activations") or granularity == "selective":
        modules = arg("--recompute-modules")
        if modules is True:  # the flag with no module after it (Megatron's nargs '+' refuses it too)
            raise SpecError("--recompute-modules needs at least one module (e.g. --recompute-modules core_attn mlp)",
                            file=str(path), field="--recompute-modules")
        _recompute_modules(out, modules, "--recompute-modules")
    elif granularity == "full":
        _full_recompute(out, arg("--recompute-method"), arg("--recompute-num-layers"), "--recompute-method",
                        "--recompute-num-layers", str(path))
    if arg("--optimizer", "adam") != "adam":
        out.warnings.append(f"--optimizer {arg('--optimizer')}: priced as Adam (the model spec's optimizer)")
    # --cpu-offloading-num-layers N > 0 turns CPU offloading on by itself (megatron/training/arguments.py@d98e8a6 L1950)
    _activation_offload(out, arg("--cpu-offloading") or arg("--cpu-offloading-num-layers"),
                        arg("--cpu-offloading-num-layers"),
                        arg("--cpu-offloading-activations", True), arg("--cpu-offloading-weights", False),
                        "--cpu-offloading-num-layers", str(path))
    # the loss: Transformer Engine's in-place kernel under --cross-entropy-loss-fusion --cross-entropy-fusion-impl te
    # (megatron/core/models/common/language_module/language_module.py@d98e8a6 L174); the native fused one keeps the
    # fp32 copy the megatron-core profile's vocab-parallel prices (fusions/fused_cross_entropy.py L82, L119)
    if arg("--cross-entropy-loss-fusion") and arg("--cross-entropy-fusion-impl", "native") == "te":
        out.set("cross_entropy", "te", "--cross-entropy-fusion-impl te: Transformer Engine's parallel cross entropy")
    backend = arg("--attention-backend")
    if backend == "unfused":
        out.set("attention", "megatron-unfused")
    elif arg("--use-flash-attn") or backend == "flash":
        out.set("attention", "fa2")
    elif backend in (None, "auto", "fused"):  # Megatron-Core's default, auto: Transformer Engine chooses (read())
        out.te_attention = True
    _unread(out, a, read | {"--nnodes", "--nproc_per_node", "--nproc-per-node", "--node_rank", "--master_addr",
                            "--master_port", "--standalone"}, MEGATRON_NOT_COST)


def _yaml_args(path: Path) -> list[str]:
    """A YAML map's MODEL_ARGS as a command line: `--flag: value` -> --flag value, `--switch: true` -> --switch,
    false -> left out."""
    cfg = read_yaml(path)
    args = cfg.get("MODEL_ARGS") if isinstance(cfg, dict) else None
    if not isinstance(args, dict):
        raise SpecError("no MODEL_ARGS mapping of Megatron-LM arguments", file=str(path), field="MODEL_ARGS")
    tokens: list[str] = []
    for key, value in args.items():
        if value is False or value is None:
            continue
        tokens += [str(key)] if value is True else [str(key), str(value)]
    return tokens


# ----------------------------------------------------------------------------------------------------------------
# Megatron-Bridge: the ConfigContainer every run prints ("------- Task Configuration -------") and saves beside its
# checkpoints (run_config.yaml, megatron/bridge/training/utils/checkpoint_utils.py@067f987 L34), dumped by
# dump_dataclass_to_yaml (utils/yaml_utils.py): sections of plain YAML, torch dtypes as {_target_: torch.bfloat16},
# enums as {_target_: ...AttnBackend, _args_: [5]} (megatron/training/config/yaml_utils.py@d98e8a64 L97-172).

BRIDGE_MARK = "_target_: megatron.bridge.training.config.ConfigContainer"
# Megatron-FSDP's sharding strategies as ZeRO stages (megatron/core/distributed/distributed_data_parallel_config.py
# @d98e8a64: no_shard, optim, optim_grads, optim_grads_params)
MFSDP_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
# Megatron-Bridge fields -> the Megatron-LM argument that states the same setting (the fields are Megatron-Core's
# TransformerConfig, DistributedDataParallelConfig and OptimizerConfig, the arguments' own destinations:
# megatron/training/arguments.py@d98e8a64 core_transformer_config_from_args); values pass through, True is the switch
BRIDGE_ARGS = {
    "model": ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
              "position_embedding_type", "qk_layernorm", "hidden_dropout", "attention_dropout",
              "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
              "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
              "sequence_parallel", "tp_comm_overlap", "num_moe_experts:num_experts", "moe_router_topk",
              "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
              "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
              "cpu_offloading", "cpu_offloading_num_layers", "cpu_offloading_activations", "cpu_offloading_weights",
              "cross_entropy_loss_fusion", "cross_entropy_fusion_impl"),
    "train": ("micro_batch_size", "global_batch_size", "train_iters"),
    "ddp": ("use_distributed_optimizer", "use_megatron_fsdp", "overlap_grad_reduce", "overlap_param_gather",
            "bucket_size:ddp_bucket_size", "num_buckets:ddp_num_buckets"),
    "optimizer": ("optimizer", "use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype",
                  "main_grads_dtype", "main_params_dtype", "overlap_param_gather_with_optimizer_step"),
    "mixed_precision": ("fp8:fp8_format", "fp8_recipe", "fp8_param_gather"),
}
# each Megatron-LM flag a dump's field is read as, back to the field (errors name the field)
BRIDGE_FIELDS = {"--" + (arg or name).replace("_", "-"): f"{section}.{name}" for section, names in BRIDGE_ARGS.items()
                 for name, _, arg in (n.partition(":") for n in names)}
BRIDGE_FIELDS.update({"--seq-length": "dataset.sequence_length", "--vocab-size": "model.vocab_size"})
# fields a dump sets to 0 for "none": left out, as Megatron-LM's own unset
ZERO_UNSET = {"cpu_offloading_num_layers", "recompute_num_layers", "moe_shared_expert_intermediate_size",
              "virtual_pipeline_model_parallel_size"}
# set in a dump, priced otherwise or not at all: said, never silently dropped
BRIDGE_UNPRICED = {
    ("model", "mtp_num_layers"): "multi-token prediction layers are not priced",
    ("model", "pipeline_model_parallel_layout"): "an explicit pipeline layout is not priced: layers split evenly, "
                                                 "the ends one fewer where pp x vp does not divide them",
    ("model", "num_layers_in_first_pipeline_stage"): "an uneven first stage is not priced",
    ("model", "num_layers_in_last_pipeline_stage"): "an uneven last stage is not priced",
    ("model", "fine_grained_activation_offloading"): "fine-grained activation offloading is not priced",
    ("model", "window_size"): "sliding-window attention is not read: full attention priced",
    ("optimizer", "optimizer_cpu_offload"): "the optimizer's CPU offload is not priced",
}


def _bridge_value(value: Any) -> Any:
    """A dumped value as Megatron-LM's argument would say it: a torch dtype's name (torch.bfloat16 -> bf16), an
    enum's name (AttnBackend, _args_ [5] -> auto), a list as its items, else the value."""
    if isinstance(value, dict) and "_target_" in value:
        target = str(value["_target_"])
        if target.startswith("torch.") and not value.get("_call_", False):
            # Megatron-LM keeps an fp8 optimizer state as uint8 (its --exp-avg-dtype fp8, arguments.py@d98e8a64)
            return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
                    "torch.float8_e4m3fn": "fp8", "torch.uint8": "fp8"}.get(target, target)
        if target.endswith("AttnBackend") and value.get("_args_"):
            return {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}.get(value["_args_"][0])
        return target
    return value


# Megatron-Bridge's mixed-precision recipes by name (src/megatron/bridge/training/mixed_precision.py@067f987 L184-386),
# as a ConfigContainer may name one instead of dumping it: (bf16, fp8 format, fp8 recipe, fp8 weights)
BRIDGE_PRECISIONS = {
    "bf16_mixed": (True, None, None, False), "fp16_mixed": (False, None, None, False),
    "bf16_with_fp8_delayed_scaling_mixed": (True, "hybrid", "delayed", True),
    "fp16_with_fp8_delayed_scaling_mixed": (False, "hybrid", "delayed", True),
    "bf16_with_mxfp8_mixed": (True, "e4m3", "mxfp8", True), "fp16_with_mxfp8_mixed": (False, "e4m3", "mxfp8", True),
    "bf16_with_fp8_current_scaling_mixed": (True, "hybrid", "tensorwise", True),
    "fp16_with_fp8_current_scaling_mixed": (False, "hybrid", "tensorwise", True),
    "bf16_with_fp8_subchannel_scaling_mixed": (True, "hybrid", "blockwise", False),
}


def _bridge_precision(name: str, path: Path) -> dict:
    """The mixed_precision section a named recipe stands for (BRIDGE_PRECISIONS); one error line for another."""
    if name not in BRIDGE_PRECISIONS:
        raise SpecError(f"mixed_precision {name!r}: import reads {', '.join(BRIDGE_PRECISIONS)}", file=str(path),
                        field="mixed_precision")
    bf16, fmt, recipe, weights = BRIDGE_PRECISIONS[name]
    return {"bf16": bf16, "fp16": not bf16, "fp8": fmt, "fp8_recipe": recipe, "fp8_param_gather": weights}


def _bridge_config(text: str, path: Path) -> dict:
    """The ConfigContainer of a run_config.yaml, or of the "Task Configuration" block a training log prints."""
    start = text.find(BRIDGE_MARK)
    if start < 0:
        raise SpecError("not a Megatron-Bridge run configuration: no line "
                        f"'{BRIDGE_MARK}' (a run_config.yaml, or the log block after '------- Task Configuration "
                        "-------')", file=str(path))
    block = text[start:]
    end = re.search(r"^-{10,}\s*$", block, re.M)  # the log's closing rule
    block = block[:end.start()] if end else block
    try:
        cfg = yaml.safe_load(block)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1} of the configuration)" if mark is not None else ""
        raise SpecError(f"the Megatron-Bridge configuration is not valid YAML{where}", file=str(path)) from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise SpecError("the Megatron-Bridge configuration has no model: mapping", file=str(path), field="model")
    return cfg


def _bridge(text: str, path: Path, out: Imported) -> None:
    """Megatron-Bridge's ConfigContainer, read as the Megatron-LM arguments its fields stand for (BRIDGE_ARGS), then
    the settings a dump states whose absence from those arguments would leave the megatron-bridge profile's value in
    place: sequence parallelism, the overlaps, the distributed optimizer, the gradients' dtype, the loss and recompute
    (a dump says each, so each is written)."""
    cfg = _bridge_config(text, path)
    names = ("model", "train", "ddp", "optimizer", "mixed_precision", "dataset", "comm_overlap", "tokenizer")
    for name in names:
        if cfg.get(name) is not None and not isinstance(cfg[name], dict) and name != "mixed_precision":
            raise SpecError(f"must be a mapping, got {cfg[name]!r}", file=str(path), field=name)
    sections = {name: cfg.get(name) if isinstance(cfg.get(name), dict) else {} for name in names}
    if isinstance(cfg.get("mixed_precision"), str):  # a recipe's name, as mixed_precision.py@067f987 names them
        sections["mixed_precision"] = _bridge_precision(cfg["mixed_precision"], path)
    model, ddp, mp, opt = sections["model"], sections["ddp"], sections["mixed_precision"], sections["optimizer"]
    if not mp.get("fp8") and model.get("fp8"):  # the model's own fp8 fields, where the mixed precision says none
        mp = sections["mixed_precision"] = {**mp, "fp8": model["fp8"], "fp8_recipe": model.get("fp8_recipe"),
                                            "fp8_param_gather": model.get("fp8_param", False)}
    if model.get("vocab_size") is None and sections["tokenizer"].get("vocab_size"):
        model = sections["model"] = {**model, "vocab_size": sections["tokenizer"]["vocab_size"]}
    if model.get("vocab_size") is None and not out.model_given:
        raise SpecError("null, and tokenizer.vocab_size too: the dump does not say the vocabulary; give import "
                        "--model", file=str(path), field="model.vocab_size")
    freq = model.get("moe_layer_freq")
    if isinstance(freq, list):  # a pattern: import reads every layer an MoE layer only
        if not freq or any(f != 1 for f in freq):
            raise SpecError(f"{freq[:8]}{'...' if len(freq) > 8 else ''}: import reads MoE models whose every layer "
                            f"is an MoE layer; give import --model", file=str(path), field="model.moe_layer_freq")
        model = sections["model"] = {**model, "moe_layer_freq": 1}
    if model.get("multi_latent_attention") or model.get("is_hybrid_model"):
        kind = "multi-latent attention" if model.get("multi_latent_attention") else "a hybrid (Mamba) model"
        raise SpecError(f"{kind}: ddplan has no such architecture", file=str(path),
                        field="model.multi_latent_attention" if model.get("multi_latent_attention")
                        else "model.is_hybrid_model")
    tokens: list[str] = []

    def give(flag: str, value: Any, zero_unset: bool = False) -> None:
        value = _bridge_value(value)
        if value is None or value is False or (zero_unset and value == 0):  # unset
            return
        if value is True:
            tokens.append(flag)
        elif isinstance(value, list):
            tokens.extend([flag, *map(str, value)])
        else:
            tokens.extend([flag, str(value)])

    skip = set()  # fields that mean nothing without another: Megatron-LM reads them only then
    if not mp.get("fp8"):
        skip |= {"fp8_recipe", "fp8_param_gather"}
    if not opt.get("use_precision_aware_optimizer"):
        skip |= {"exp_avg_dtype", "exp_avg_sq_dtype", "main_grads_dtype", "main_params_dtype"}
    if not model.get("num_moe_experts"):
        skip |= {"expert_model_parallel_size", "expert_tensor_parallel_size", "moe_router_topk", "moe_ffn_hidden_size",
                 "moe_shared_expert_intermediate_size", "moe_layer_freq"}
    if not model.get("recompute_granularity"):
        skip |= {"recompute_method", "recompute_num_layers", "recompute_modules"}
    if not model.get("cpu_offloading"):
        skip |= {"cpu_offloading_num_layers", "cpu_offloading_activations", "cpu_offloading_weights"}
    for section, names in BRIDGE_ARGS.items():
        for name in names:
            field, _, arg = name.partition(":")
            if field not in skip:
                give("--" + (arg or field).replace("_", "-"), sections[section].get(field), field in ZERO_UNSET)
    gpus = re.search(r"--nproc[_-]per[_-]node[= ](\d+)", text)
    if gpus:  # a log that keeps its torchrun line
        tokens += ["--nproc_per_node", gpus.group(1)]
        nodes = re.search(r"--nnodes[= ](\d+)", text)
        if nodes:
            tokens += ["--nnodes", nodes.group(1)]
    heads = model.get("num_attention_heads")
    if model.get("num_query_groups") not in (None, heads):
        tokens.append("--group-query-attention")
    if model.get("gated_linear_unit"):
        act = str(_bridge_value(model.get("activation_func")))
        if not act.endswith("silu"):
            raise SpecError(f"a gated MLP with {act}: ddplan prices SwiGLU (silu) gates only", file=str(path),
                            field="model.activation_func")
        tokens.append("--swiglu")
    if model.get("add_bias_linear") is False:
        tokens.append("--disable-bias-linear")
    if model.get("share_embeddings_and_output_weights") is False:
        tokens.append("--untie-embeddings-and-output-weights")
    give("--vocab-size", model.get("vocab_size"))
    give("--make-vocab-size-divisible-by", model.get("make_vocab_size_divisible_by", 128)
         if model.get("should_pad_vocab") else 1)
    data = sections["dataset"]
    seq = data.get("sequence_length") or data.get("seq_length") or model.get("seq_length")
    give("--seq-length", seq)  # the dataset's: what each sample holds (the model's seq_length is its limit)
    limit = model.get("seq_length")  # the model's longest sequence, where it is a number above the dataset's
    give("--max-position-embeddings", limit if type(limit) is int and type(seq) is int and limit > seq else seq)
    precision = "--bf16" if mp.get("bf16") or model.get("bf16") else "--fp16" if mp.get("fp16") or model.get(
        "fp16") else None
    if precision:
        tokens.append(precision)
    if precision == "--bf16" and ddp.get("grad_reduce_in_fp32") is False:
        tokens.append("--grad-reduce-in-bf16")
    if ddp.get("use_distributed_optimizer") is None and opt.get("use_distributed_optimizer"):
        tokens.append("--use-distributed-optimizer")
    if isinstance(sections["comm_overlap"], dict) and sections["comm_overlap"].get("tp_comm_overlap"):
        tokens.append("--tp-comm-overlap")
    give("--attention-backend", model.get("attention_backend"))
    try:
        _megatron("", path, out, tokens)
    except SpecError as e:  # say the dump's field, not the Megatron-LM flag it was read as
        where = BRIDGE_FIELDS.get(e.field or "", e.field)
        message = e.message.replace(e.field, where) if e.field else e.message
        if message.startswith(f"{where} is not given"):
            message = "missing or null: the run configuration states the model's dimensions"
        raise SpecError(message, file=str(path), field=where) from None
    tp = int(model.get("tensor_model_parallel_size") or 1)
    layout = {"sequence_parallel": bool(model.get("sequence_parallel")) and tp > 1,
              "tp_comm_overlap": ("--tp-comm-overlap" in tokens) and tp > 1,
              "overlap_grad_reduce": bool(ddp.get("overlap_grad_reduce")),
              "overlap_param_gather": bool(ddp.get("overlap_param_gather"))}
    for key, value in layout.items():
        out.fields.setdefault(("layout", key), value)
    out.fields.setdefault(("layout", "zero"), 0)  # no distributed optimizer, no Megatron-FSDP: plain DDP
    if (ddp.get("overlap_grad_reduce") and not ddp.get("use_megatron_fsdp") and ddp.get("bucket_size") is None
            and not cfg.get("comm_overlap") and ("layout", "grad_bucket") not in out.fields):
        # no bucket size and no CommOverlapConfig to set one: Megatron-Core's own default (dist_utils.py@2a75ac1
        # L315-316), not the profile's perf-recipe 134217728
        out.set(("layout", "grad_bucket"), "megatron", "ddp.bucket_size null, comm_overlap null")
    strategy = ddp.get("data_parallel_sharding_strategy")
    if ddp.get("use_megatron_fsdp") and strategy in MFSDP_ZERO:  # what Megatron-FSDP shards
        out.set(("layout", "zero"), MFSDP_ZERO[strategy], f"Megatron-FSDP, data_parallel_sharding_strategy {strategy}")
    if precision == "--bf16" and ddp.get("grad_reduce_in_fp32", True):
        out.set(("precision", "grads"), "fp32", "ddp.grad_reduce_in_fp32 true: fp32 main gradients")
    if not model.get("recompute_granularity"):
        out.fields.setdefault(("recompute",), "none")
    if ("cross_entropy",) not in out.fields:
        out.set("cross_entropy", "vocab-parallel", "model.cross_entropy_fusion_impl native (or no loss fusion): "
                                                   "Megatron-Core's vocab-parallel cross entropy")
    if opt.get("store_param_remainders") is False and out.fields.get(("precision", "weights")) == "remainder":
        out.set(("precision", "weights"), "master", "optimizer.store_param_remainders false: whole fp32 masters")
    if precision and ("precision", "weights") not in out.fields:  # else the profile's (its perf launcher's) remainders
        out.set(("precision", "weights"), "master", "16-bit weights with whole fp32 masters (no precision-aware "
                                                    "optimizer, or one that keeps them whole)")
    impl = str(model.get("cuda_graph_impl") or "none")
    if impl != "none" or model.get("enable_cuda_graph"):
        out.warnings.append(f"model.cuda_graph_impl {impl}: CUDA graphs are not priced")
    for (section, name), why in BRIDGE_UNPRICED.items():
        if sections[section].get(name) not in (None, False, 0, [], ""):
            out.warnings.append(f"{section}.{name}: {why}")


def _megatron_buckets(arg, num, out: Imported) -> None:
    """The gradient buckets Megatron-LM's arguments state (layout.grad_bucket), under --overlap-grad-reduce: one a model
    chunk with --overlap-param-gather-with-optimizer-step, which turns bucketing off (training.py@d98e8a6
    L2508-2510), else --ddp-bucket-size's parameters, else --ddp-num-buckets' share of them left to the megatron-core
    profile's default (said); none of them: the profile's."""
    if arg("--overlap-param-gather-with-optimizer-step"):
        out.set(("layout", "grad_bucket"), "chunk", "--overlap-param-gather-with-optimizer-step turns bucketing off")
    elif num("--ddp-bucket-size"):
        out.set(("layout", "grad_bucket"), str(num("--ddp-bucket-size")))
    elif num("--ddp-num-buckets"):
        out.ignored.append(f"--ddp-num-buckets {num('--ddp-num-buckets')} (a bucket count: priced at the profile's "
                           "bucket size; state --grad-bucket with the parameters a bucket)")


def _megatron_moe(arg, num, path: Path) -> tuple[int, int, int, int] | bool:
    """(experts, top-k, expert width, shared experts) of Megatron-LM's MoE arguments, or False for a dense model.
    Every layer is an MoE layer (--moe-layer-freq 1); another frequency is one clear error."""
    experts = num("--num-experts")
    if not experts:
        return False
    freq = arg("--moe-layer-freq", "1")
    if str(freq) != "1":
        raise SpecError(f"--moe-layer-freq {freq}: import reads MoE models whose every layer is an MoE layer; give "
                        f"import --model", file=str(path), field="--moe-layer-freq")
    if num("--moe-shared-expert-intermediate-size"):
        raise SpecError("--moe-shared-expert-intermediate-size: shared experts are not imported yet; give import "
                        "--model", file=str(path), field="--moe-shared-expert-intermediate-size")
    ffn = num("--ffn-hidden-size")
    return experts, num("--moe-router-topk", 2), num("--moe-ffn-hidden-size", ffn), 0


def _unread(out: Imported, given: dict, read: set[str], not_cost: re.Pattern) -> None:
    for k in given:
        if k in read:
            continue
        if not_cost.match(k):
            out.ignored.append(k)
        else:
            out.warnings.append(f"{k} is not read")


def _mapping(model: dict, key: str, path: Path) -> dict:
    """model.<key> of a NeMo config as a mapping ({} when absent), or one error line."""
    value = model.get(key) or {}
    if not isinstance(value, dict):
        raise SpecError(f"must be a mapping, got {value!r}", file=str(path), field=f"model.{key}")
    return value


def _nemo(text: str, path: Path, out: Imported) -> None:
    """A NeMo (1.x, Megatron-Core) training YAML as the NeMo-Framework-Launcher's conf/training files state it:
    trainer (nodes, devices, precision, steps) and model (the Megatron settings under their NeMo names)."""
    cfg = read_yaml(path)
    trainer, model = (cfg.get("trainer"), cfg.get("model")) if isinstance(cfg, dict) else (None, None)
    if not isinstance(trainer, dict) or not isinstance(model, dict):
        raise SpecError("no trainer: and model: mappings: not a NeMo training config", file=str(path))

    def num(section: dict, key: str, default: int | None = None, where: str = "model") -> int | None:
        v = section.get(key)
        ref = re.fullmatch(r"\$\{\.(\w+)\}", str(v)) if v is not None else None
        if ref:  # OmegaConf's relative reference to a sibling key (max_position_embeddings: ${.encoder_seq_length})
            v = section.get(ref.group(1))
        return default if v is None else _int(v, path, f"{where}.{key}")

    tp, pp = num(model, "tensor_model_parallel_size", 1), num(model, "pipeline_model_parallel_size", 1)
    cp = num(model, "context_parallel_size", 1)
    d, layers, heads = num(model, "hidden_size"), num(model, "num_layers"), num(model, "num_attention_heads")
    if not (d and layers and heads):
        raise SpecError("model.hidden_size, num_layers and num_attention_heads are needed", file=str(path),
                        field="model")
    seq = num(model, "encoder_seq_length") or num(model, "seq_length")
    if seq is None:
        raise SpecError("model.encoder_seq_length is not given", file=str(path), field="model.encoder_seq_length")
    tok = _mapping(model, "tokenizer", path)
    tok_type = str(tok.get("type", ""))
    vocab = (128256 if "Llama-3" in tok_type or "Llama-3" in tok_type.replace("llama-3", "Llama-3")
             else 32000 if "Llama-2" in tok_type else GPT2_VOCAB if "GPT2BPE" in tok_type else None)
    if vocab is None and not out.model_given:
        raise SpecError(f"tokenizer type {tok_type!r}: its vocabulary size is not known to import; give import "
                        f"--model", file=str(path), field="model.tokenizer.type")
    activation = str(model.get("activation", "gelu"))
    arch = {"num_layers": layers, "d_model": d, "num_heads": heads,
            "num_kv_heads": num(model, "num_query_groups") or heads,
            "mlp_hidden_dim": num(model, "ffn_hidden_size", 4 * d),
            "vocab_size": padded_vocab(vocab, num(model, "make_vocab_size_divisible_by", 128), tp) if vocab ==
            GPT2_VOCAB else vocab or 1,
            "mlp": "swiglu" if "swiglu" in activation else "gelu",
            "tied_embeddings": bool(model.get("share_embeddings_and_output_weights", True)), "moe": False,
            "dropout": (_number(model.get("hidden_dropout", 0.1), path, "model.hidden_dropout"),
                        _number(model.get("attention_dropout", 0.1), path, "model.attention_dropout")),
            "max_seq_len": num(model, "max_position_embeddings", seq),
            "position": "rope" if model.get("position_embedding_type") == "rope" else "learned",
            "bias": bool(model.get("bias", True))}
    if model.get("num_moe_experts"):
        raise SpecError("num_moe_experts: mixture-of-experts configs are not imported yet; give import --model",
                        file=str(path), field="model.num_moe_experts")
    run = cfg.get("run") if isinstance(cfg.get("run"), dict) else {}
    _model(out, arch, str(run.get("name") or path.stem), "model.num_layers, hidden_size, ...")
    out.set("seq_len", seq)
    for key, value in (("tp", tp), ("pp", pp), ("cp", cp)):
        out.set(("layout", key), value)
    vp = model.get("virtual_pipeline_model_parallel_size")
    if vp:
        out.set(("layout", "vp"), _int(vp, path, "model.virtual_pipeline_model_parallel_size"))
    if model.get("sequence_parallel"):
        out.set(("layout", "sequence_parallel"), True)
    if model.get("ub_tp_comm_overlap"):
        out.set(("layout", "tp_comm_overlap"), True)
    optim = _mapping(model, "optim", path)
    if optim.get("name") in ("distributed_fused_adam", "mcore_distributed_optim"):
        out.set(("layout", "zero"), 1, f"optim {optim.get('name')} shards the optimizer states")
    if optim.get("overlap_param_sync") is True:  # an unresolved "${...}" is not a yes
        out.set(("layout", "overlap_param_gather"), True)
    if isinstance(optim.get("overlap_grad_sync"), bool):  # distributed_fused_adam's; else the nemo profile's
        out.set(("layout", "overlap_grad_reduce"), optim["overlap_grad_sync"])  # (overlapped): "${...}" says nothing
    nodes, devices = num(trainer, "num_nodes", 1, "trainer"), num(trainer, "devices", None, "trainer")
    _degrees(out, nodes * devices if devices else None, tp * pp * cp,
             f"trainer.num_nodes {nodes} x devices {devices}")
    out.set(("batch", "device"), num(model, "micro_batch_size", 1))
    global_batch = num(model, "global_batch_size")
    if global_batch:
        out.set(("batch", "total_tokens"), global_batch * seq, f"model.global_batch_size {global_batch} x {seq}")
    steps = num(trainer, "max_steps", None, "trainer")
    if steps:
        out.set(("budget", "steps"), steps)
    precision = str(trainer.get("precision", "32"))
    out.set(("precision", "dtype"), "bf16" if "bf16" in precision else "fp16" if precision.startswith("16") else
            "fp32")
    if model.get("fp8"):
        out.set(("precision", "fp8"), True)
        out.set(("precision", "fp8_recipe"), "delayed")
    if "megatron_amp_O2" in model:  # O2: 16-bit weights, fp32 masters in the optimizer; without: fp32 weights, autocast
        o2 = bool(model["megatron_amp_O2"])
        out.set(("precision", "weights"), "master" if o2 else "fp32", f"model.megatron_amp_O2 {str(o2).lower()}")
    granularity = model.get("activations_checkpoint_granularity") or model.get("recompute_granularity")
    if granularity == "selective":
        modules = model.get("recompute_modules")
        if modules is not None and not (isinstance(modules, str) or isinstance(modules, list)
                                        and all(isinstance(m, str) for m in modules)):
            raise SpecError(f"must be a list of module names (e.g. [core_attn, mlp]), got {modules!r}",
                            file=str(path), field="model.recompute_modules")
        _recompute_modules(out, " ".join(modules) if isinstance(modules, list) else modules, "model.recompute_modules")
    elif granularity == "full":
        method_key = ("activations_checkpoint_method" if "activations_checkpoint_method" in model
                      else "recompute_method")
        layers_key = ("activations_checkpoint_num_layers" if "activations_checkpoint_num_layers" in model
                      else "recompute_num_layers")
        _full_recompute(out, model.get(method_key), model.get(layers_key), f"model.{method_key}",
                        f"model.{layers_key}", str(path))
    _activation_offload(out, model.get("cpu_offloading"), model.get("cpu_offloading_num_layers"),
                        model.get("cpu_offloading_activations", True), model.get("cpu_offloading_weights", False),
                        "model.cpu_offloading_num_layers", str(path))
    if model.get("mcore_gpt") is False:
        out.warnings.append("model.mcore_gpt false (NeMo's legacy model): priced as Megatron-Core")


def _precision_aware(out: Imported, dtype: str, exp_avg: str, exp_avg_sq: str, main_params: str, main_grads: str,
                     fp8_recipe: str | None, whole: bool, path: Path) -> None:
    """Megatron-Core's --use-precision-aware-optimizer as run fields (megatron/training/arguments.py@d98e8a64
    L3666-3685): the moments' dtype (--exp-avg-dtype, --exp-avg-sq-dtype: the wider where they differ), bf16 main
    gradients (--main-grads-dtype bf16), and the masters Transformer Engine's FusedAdam keeps as 16-bit remainders
    beside bf16 weights (store_param_remainders, True by default and not a flag: optimizer_config.py L192) where
    Megatron-Core leaves it the masters: fp32 main params, no fp8 or delayed scaling, not Megatron-FSDP
    (optimizer_config.py L400-411; optimizer/__init__.py L570-580), bf16 weights rather than fp8 ones
    (--fp8-param-gather: Transformer Engine's FusedAdam keeps remainders of bf16 weights only). whole: Megatron-FSDP
    or fp8 weights."""
    flag = "--use-precision-aware-optimizer"
    moments = max((exp_avg, exp_avg_sq), key=lambda d: units.BYTES_PER_DTYPE.get(d, 4))
    if moments not in MOMENTS:
        raise SpecError(f"--exp-avg-dtype/--exp-avg-sq-dtype {moments!r}: allowed {', '.join(MOMENTS[1:])}",
                        file=str(path), field="--exp-avg-dtype")
    if exp_avg != exp_avg_sq:
        out.warnings.append(f"--exp-avg-dtype {exp_avg} and --exp-avg-sq-dtype {exp_avg_sq}: both moments priced in "
                            f"{moments}")
    if moments != "fp32":
        out.set(("precision", "moments"), moments, f"{flag} --exp-avg-dtype {exp_avg} --exp-avg-sq-dtype {exp_avg_sq}")
    if main_grads == "bf16":
        out.set(("precision", "grads"), "param", f"{flag} --main-grads-dtype bf16: gradients kept in bf16")
    if main_params != "fp32":
        out.warnings.append(f"--main-params-dtype {main_params}: fp16 master weights are not priced; priced as fp32 "
                            f"masters (2 bytes a parameter more)")
    elif dtype == "bf16" and fp8_recipe in (None, "delayed") and not whole:
        out.set(("precision", "weights"), "remainder",
                f"{flag} on bf16 weights: Transformer Engine's FusedAdam keeps the fp32 masters' low 16 bits "
                f"(store_param_remainders, Megatron-Core's default)")


def _activation_offload(out, on, layers, activations, weights, field: str, file: str) -> None:
    """Megatron-Core's CPU offloading (--cpu-offloading, cpu_offloading_num_layers N; activations on, weights off by
    default: model_parallel_config.py@d98e8a6 L454-476) as ddplan's offload_activations N. Weights offloaded too are
    not priced (a warning); activations off offloads nothing."""
    if not on:
        return
    n = str(layers).strip() if layers is not None else "0"
    if not n.isdigit():
        raise SpecError(f"must be a whole number of layers, got {layers!r}", file=file, field=field)
    if activations and int(n):
        out.set(("layout", "offload_activations"), int(n), f"CPU offloading of {n} layers' activations")
    if weights:
        out.warnings.append("CPU offloading of weights is not priced: the weights are priced on the GPU")


def _full_recompute(out, method, layers, method_field: str, layers_field: str, file: str) -> None:
    """Megatron-Core's full recompute as ddplan's policy: the block method with N layers is `full:N` (the first N
    layers of each model chunk re-run whole, ddplan.runfields.recompute_layers); the uniform method (the default)
    re-runs every layer: `full`, which keeps each layer's input where uniform with N > 1 keeps one input per N
    layers (said in a warning: ddplan's activations are then above the stack's by those inputs)."""
    n = None if layers is None else str(layers).strip()
    if method == "block" and n is not None:
        if not n.isdigit() or int(n) < 1:
            raise SpecError(f"must be a whole number >= 1 with the block method, got {layers!r}", file=file,
                            field=layers_field)
        out.set("recompute", f"full:{int(n)}", f"{method_field} block, {layers_field} {n}")
        return
    out.set("recompute", "full")
    if n not in (None, "1"):
        out.warnings.append(f"{method_field} {method or 'uniform'} with {layers_field} {n} (one checkpoint per {n} "
                            f"layers): priced as full recompute, which keeps every layer's input")


def _recompute_modules(out, modules: str | None, where: str) -> None:
    """Megatron-Core's selective recompute of `modules` (space-separated; none given: its default, core_attn) as
    ddplan's policy (ddplan.runfields.recompute_policy: `selective` is selective:core_attn); modules ddplan does not
    model are named in a warning and left out. Ref: megatron/core/transformer/transformer_config.py@d98e8a64
    recompute_modules (default ["core_attn"])."""
    if not modules:
        out.set("recompute", "selective")
        return
    names = list(dict.fromkeys(modules.split()))  # Megatron takes a module named twice as once
    known = [m for m in names if m in RECOMPUTE_MODULES]
    unknown = [m for m in names if m not in RECOMPUTE_MODULES]
    if unknown:
        out.warnings.append(f"{where} {' '.join(unknown)}: not modelled (ddplan prices {', '.join(RECOMPUTE_MODULES)}); "
                            f"priced without recomputing {'it' if len(unknown) == 1 else 'them'}")
    policy = recompute_policy("selective:" + "+".join(known)) if known else "none"
    out.set("recompute", policy, f"{where} {modules}")


# ----------------------------------------------------------------------------------------------------------------
# nanochat

NANOCHAT_READ = {"--depth", "--max-seq-len", "--window-pattern", "--num-iterations", "--target-param-data-ratio",
                 "--device-batch-size", "--total-batch-size", "--fp8", "--fp8-recipe", "--eval-every",
                 "--eval-tokens", "--save-every"}
NANOCHAT_NOT_COST = re.compile(r"^--(run|device-type|embedding-lr|unembedding-lr|weight-decay|matrix-lr|scalar-lr|"
                               r"warmup-steps|warmdown-ratio|final-lr-frac|resume-from-step|core-metric|sample-every|"
                               r"model-tag|standalone|master|node_rank|rdzv)")


def _nanochat(text: str, path: Path, out: Imported) -> None:
    """A nanochat `scripts.base_train` command line (e.g. runs/speedrun.sh's torchrun line)."""
    line = next((ln for ln in re.sub(r"\\\n", " ", text).splitlines() if "base_train" in ln
                 and not ln.lstrip().startswith("#")), None)
    if line is None:
        raise SpecError("no scripts.base_train command line", file=str(path))
    tokens = _split(line.split("#", 1)[0])
    a = _flags(tokens)
    depth = _int(a.get("--depth", 20), path, "--depth")
    out.set("model", f"d{depth}", f"--depth {depth}")
    for flag in ("--aspect-ratio", "--head-dim"):
        if flag in a:
            out.warnings.append(f"{flag} {a[flag]}: the model is priced at nanochat's default (64 and 128)")
    nodes = _int(a.get("--nnodes", 1), path, "--nnodes")
    per_node = a.get("--nproc_per_node", a.get("--nproc-per-node"))
    if out.gpus_given:
        out.set("gpus", out.gpus_given, "given to import")
    elif per_node is None:
        out.assume("gpus", nodes, "torchrun gives no --nproc_per_node (one process a node)")
    else:
        out.set("gpus", _int(per_node, path, "--nproc_per_node") * nodes, "torchrun --nproc_per_node x --nnodes")
    for flag, key in (("--device-batch-size", ("batch", "device")), ("--total-batch-size", ("batch", "total_tokens")),
                      ("--max-seq-len", ("seq_len",)), ("--num-iterations", ("budget", "steps")),
                      ("--eval-tokens", ("outside", "eval_tokens"))):
        if flag in a and str(a[flag]) != "-1":
            out.set(key, _int(a[flag], path, flag))
    if "--num-iterations" not in a or str(a["--num-iterations"]) == "-1":
        ratio = _number(a.get("--target-param-data-ratio", 12), path, "--target-param-data-ratio")
        if ratio > 0:
            out.set(("budget", "param_data_ratio"), ratio)
    if "--window-pattern" in a:
        out.set("window", str(a["--window-pattern"]))
    if a.get("--fp8"):
        out.set(("precision", "fp8"), True)
        if a.get("--fp8-recipe", "tensorwise") != "tensorwise":
            out.warnings.append(f"--fp8-recipe {a['--fp8-recipe']}: priced as nanochat's tensorwise recipe")
        out.set(("precision", "fp8_recipe"), "nanochat")
    if "--eval-every" in a:
        every = _number(a["--eval-every"], path, "--eval-every", int)
        out.set(("outside", "eval_every"), max(0, every))
    if "--save-every" in a:
        out.set(("outside", "checkpoint_every"), max(0, _number(a["--save-every"], path, "--save-every", int)))
    if "--target-flops" in a and str(a["--target-flops"]) != "-1":
        out.warnings.append("--target-flops is not read: give the budget as --num-iterations or a data ratio")
    _unread(out, a, NANOCHAT_READ | {"--nnodes", "--nproc_per_node", "--nproc-per-node", "--target-flops",
                                     "--aspect-ratio", "--head-dim"}, NANOCHAT_NOT_COST)


# ----------------------------------------------------------------------------------------------------------------
# the run file


def to_run_yaml(imp: Imported, command: str) -> str:
    """The run configuration as a file: each field on its line, the assumed ones marked `# assumed: why`; the
    result is checked against the run-config schema (one error line if a value is out of its range)."""
    data: dict[str, Any] = {"kind": "run", "version": 1}
    order = {path: i for i, path in enumerate(field_paths())}
    for path, value in sorted(imp.fields.items(), key=lambda kv: order[kv[0]]):
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    validate(RunConfig, data, f"{imp.source}: (the run it gives)")
    lines = [f"# written by `{command}` from {imp.source} ({imp.format}); ddplan table/memory/plan --config",
             "# FILE price it. Fields marked `# assumed:` are not in the source file: check them. What no field",
             f"# states comes from the {PROFILE[imp.format]} profile (frameworks/), then ddplan's defaults."]
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            for sub, v in value.items():
                lines.append(_with_comment(f"  {sub}: {flow(v)}", imp, (key, sub)))
        else:
            lines.append(_with_comment(f"{key}: {flow(value)}", imp, (key,)))
    if imp.warnings:
        lines.append("# not priced as the file states (also printed as warnings):")
        lines += [f"#   {w}" for w in imp.warnings]
    return "\n".join(lines) + "\n"


def write(imp: Imported, target: Path, command: str) -> Path | None:
    """Write the run file at target (atomically), and, where the model is no built-in, its config.json beside it
    (target's name with .config.json), checked to read back as a model before the run file is written; returns
    the config.json's path or None."""
    extra = None
    if imp.architecture is not None:
        extra = target.with_name(target.name.rsplit(".", 1)[0] + ".config.json")
        imp.fields[("model",)] = extra.name
    text = to_run_yaml(imp, command)
    if extra is not None:
        import json

        atomic_write(extra, json.dumps(imp.architecture, indent=2) + "\n")
        try:
            load_model(str(extra))
        except DdplanError:
            extra.unlink()
            raise
    atomic_write(target, text)
    return extra


def _with_comment(line: str, imp: Imported, path: tuple[str, ...]) -> str:
    if path in imp.assumed:
        return f"{line}  # assumed: {imp.assumed[path]}"
    if path in imp.notes:
        return f"{line}  # {imp.notes[path]}"
    return line
