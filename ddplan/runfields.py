"""The run configuration's fields, each declared once: where it sits in a run file, its flag, what it is, its
allowed range and unit, its --help panel, and how `table`, `memory` and `plan` take it.

Everything else is built from this list: the run file's schema (ddplan.runconfig.RunConfig), the planning
commands' flags (ddplan.cli.run_options: their names, help, panels, defaults and types), the ranges every given
number is checked against (ddplan.bounds.RANGES) and docs/reference.md's range table (a test compares them).
Adding a field here adds it to the file and gives each command that names it in its signature its flag.

Plain data, no pydantic: `ddplan --help` reads it without building the schema.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass, field
from typing import Any

from ddplan.specs import CROSS_ENTROPY, FP8_WEIGHT_CASTS, FUSIONS, GRADS, MOE_WEIGHTING, MOMENTS, WEIGHTS

COMMANDS = ("table", "memory", "plan")
# --help's panels, in their order (issue 38: table --help listed 52 options in one run); the output options
# (ddplan.cli.OUTPUT_OPTIONS) take the last
MODEL, LAYOUT, BATCH, MEASURED, OUTPUT = ("Model and hardware", "Layout", "Batch, budget and time outside steps",
                                          "Measurement", "Output")
PANELS = (MODEL, LAYOUT, BATCH, MEASURED, OUTPUT)
REQUIRED = ...  # a command's default that makes the flag required (plan's --model)


@dataclass(frozen=True)
class Range:
    """The values a number may take, in its unit: [low, high], or open at an end (price > 0, headroom < 1)."""

    low: float
    high: float
    unit: str
    low_open: bool = False
    high_open: bool = False


@dataclass(frozen=True)
class RunField:
    """One field of a run: its path in a run file and its flag (--NAME, or `flags`).

    kind: int, float, str or bool, or the tuple of the values allowed. many: the commands that take a
    comma-separated list of values (a row each in `table`, the choices `plan` searches); a run file may then give
    a list. default: the flag's value when neither the flag nor the file states it, for every command, unless
    `defaults` gives a command its own. helps: a command's own words where the field's do not read right there.
    """

    path: tuple[str, ...]
    help: str
    kind: Any
    panel: str
    name: str = ""  # the command's parameter: the path's last part unless given
    flags: tuple[str, ...] = ()  # the flag's names; a bool's "--x/--no-x"; default: --NAME
    range: Range | None = None
    default: Any = None
    defaults: dict[str, Any] = field(default_factory=dict)
    many: frozenset[str] = frozenset()
    helps: dict[str, str] = field(default_factory=dict)
    names_a_file: bool = False  # a name or a path: text however it is written; relative to the run file's folder
    # a text's grammar: value -> its one spelling, ValueError naming what is allowed (recompute_policy)
    check: Any = None
    # a framework option: the ddplan.layout.Options attribute it sets, applied to every layout it can apply to
    # (Options.for_layout); a run file's layout and a published run state it under its param, a profile may set it
    option: str = ""
    commands: frozenset[str] = frozenset(COMMANDS)  # the planning commands that take it (each gets its flag)

    @property
    def param(self) -> str:
        return self.name or self.path[-1]

    @property
    def decls(self) -> tuple[str, ...]:
        if self.flags:
            return self.flags
        flag = "--" + self.param.replace("_", "-")
        return (f"{flag}/--no-{flag[2:]}",) if self.kind is bool else (flag,)

    @property
    def flag(self) -> str:
        """The flag's main name: --tp, --compile."""
        return self.decls[0].split("/")[0]

    def default_for(self, command: str) -> Any:
        return self.defaults.get(command, self.default)

    def help_for(self, command: str) -> str:
        """The flag's help in `command`: its own words there, else the field's (and in table, where it takes
        several values, how)."""
        if command in self.helps:
            return self.helps[command]
        return self.help + (" Comma-separated: a row each." if command in self.many else "")


def _f(path: str, help: str, kind: Any, panel: str, **more: Any) -> RunField:
    return RunField(tuple(path.split(".")), help, kind, panel, **more)


TABLE, TABLE_PLAN, ALL = frozenset({"table"}), frozenset({"table", "plan"}), frozenset(COMMANDS)
TABLE_MEMORY, MEMORY, PLAN = frozenset({"table", "memory"}), frozenset({"memory"}), frozenset({"plan"})
# pipeline schedules as a run file and --schedule spell them (ddplan.pipeline.SCHEDULES, '_' for '-')
SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v")
RECOMPUTE = ("none", "selective", "per-op", "full")  # lightest first (plan searches in this order)
# Megatron-Core's --recompute-modules (its selective recompute's choices, the ones a dense or MoE GPT block has):
# `selective:` and the modules joined by '+', e.g. selective:layernorm+moe (selective alone is core_attn, Megatron's
# default). Ref: NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py@d98e8a6 L560-575, L1940-1960
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts")
RECOMPUTE_HINT = ("none, selective, per-op, full, full:N (the first N layers of each pipeline chunk), every:K (every "
                  "K-th layer), or selective:MODULE+MODULE (" + ", ".join(RECOMPUTE_MODULES) + ")")


def recompute_modules(policy: str) -> frozenset[str] | None:
    """The Megatron modules a `selective:a+b` recompute policy re-runs (None for another policy). Raises
    ValueError for an unknown or repeated module, or no module."""
    head, colon, rest = policy.partition(":")
    if not colon or head != "selective":
        return None
    names = rest.split("+")
    bad = [n for n in names if n not in RECOMPUTE_MODULES]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"{policy!r}: {'unknown module ' + ', '.join(map(repr, bad)) if bad else 'a module twice'}")
    return frozenset(names)


@functools.lru_cache(maxsize=256)  # a search asks for each layout's policy: a few strings, many times
def recompute_layers(policy: str) -> tuple[str, int] | None:
    """Which whole layers a layer policy re-runs, None for another policy:

    - `full:N` -> ("first", N): Megatron-Core's --recompute-granularity full --recompute-method block
      --recompute-num-layers N (NeMo: activations_checkpoint_method block), the first N layers of each model chunk (a
      pipeline stage, or each of its virtual chunks) re-run whole, every other layer keeps all it saves. Ref:
      NVIDIA/Megatron-LM megatron/core/transformer/transformer_block.py@0034bda6 TransformerBlock._checkpointed_forward
      (method "block": `if l < self.config.recompute_num_layers` over the block's layers; a block is one model chunk,
      get_num_layers_to_build), the same test in later versions.
    - `every:K` -> ("every", K): torchtitan's layer-frequency selective AC (activation_checkpoint.mode "selective",
      selective_ac_option "K") up to its removal in 114151a (2026-03): every K-th block a rank builds is checkpointed
      whole, the K-th, 2K-th, ... (`_layer_sac_count % ac_freq == 0`, the count from 1). Ref: pytorch/torchtitan
      torchtitan/distributed/activation_checkpoint.py@1f02964 L24-48 _apply_layer_sac.

    Raises ValueError for an N or K that is not a whole number of at least 1."""
    head, colon, rest = policy.partition(":")
    if head not in ("full", "every") or not colon:
        return None
    if not rest.isdigit() or int(rest) < 1:
        what = "layers re-run per pipeline chunk" if head == "full" else "the K of every K-th layer re-run"
        raise ValueError(f"{policy!r}: {head}:{'N' if head == 'full' else 'K'} takes {what}, a whole number >= 1")
    return ("first" if head == "full" else "every", int(rest))


def recompute_policy(policy: str) -> str:
    """A recompute policy in its one spelling: a named one as is, `full:N` and `every:K` with N and K in digits
    (recompute_layers; every:1 is full),
    `selective:` with its modules in RECOMPUTE_MODULES' order, and `selective:core_attn` as `selective` (the same
    policy). Raises ValueError for
    anything else, naming what is allowed."""
    if policy in RECOMPUTE:
        return policy
    try:
        layers = recompute_layers(policy)
        if layers is not None:
            kind, n = layers
            return "full" if kind == "every" and n == 1 else f"{'full' if kind == 'first' else 'every'}:{n}"
        modules = recompute_modules(policy)
    except ValueError as e:
        raise ValueError(f"{e}; allowed: {RECOMPUTE_HINT}") from None
    if modules is None:
        raise ValueError(f"{policy!r} is not a recompute policy; allowed: {RECOMPUTE_HINT}")
    if modules == {"core_attn"}:
        return "selective"
    return "selective:" + "+".join(m for m in RECOMPUTE_MODULES if m in modules)
# A gradient-bucket rule (layout.grad_bucket): "group" ddplan's generic reduce, "megatron" Megatron-Core's default
# size, "chunk" one bucket a model chunk, or a whole number of parameters a bucket
GRAD_BUCKET_HINT = ("group (one collective a parameter group, the last 25 MiB exposed: torch DDP's bucket), megatron "
                    "(Megatron-Core's default, max(40M, 1M x dp x cp) parameters), chunk (one bucket a model chunk: "
                    "--overlap-param-gather-with-optimizer-step), or a number of parameters a bucket (e.g. 134217728, "
                    "NeMo's comm-overlap callback)")


def grad_bucket_rule(rule: str | int) -> str:
    """A gradient-bucket rule, as it is spelled: "group", "megatron", "chunk" or the parameters a bucket as digits
    without leading zeros (an integer in a YAML file as well). Raises ValueError for anything else, naming what is
    allowed."""
    text = "" if isinstance(rule, bool) else str(rule)
    if text in ("group", "megatron", "chunk"):
        return text
    if text.isdigit() and not text.startswith("0"):
        return text
    raise ValueError(f"{rule!r} is not a gradient-bucket rule; allowed: {GRAD_BUCKET_HINT}")


ZERO_STAGES = (0, 1, 2, 3)

# in the run file's order (--print-config and `ddplan import` write them so); --help groups them by panel
FIELDS: tuple[RunField, ...] = (
    _f("model", "Model: a built-in (d24, nanochat-d24, gpt2, llama-3-8b), any nanochat dN, a YAML path or a Hugging "
       "Face config.json (default with --calibration: the model it measured, priced as it ran there).", str, MODEL,
       flags=("--model", "-m"), names_a_file=True, defaults={"plan": REQUIRED},
       helps={"plan": "Model: a built-in (d24, nanochat-d24, gpt2, llama-3-8b), any nanochat dN, a YAML path or a "
                      "Hugging Face config.json."}),
    _f("framework", "A training stack's defaults (frameworks/: torchtitan, megatron-core, megatron-bridge, nemo, "
       "composer, nanochat, olmo-core, fms-fsdp, megatron-lm, megatron-deepspeed): the fields its profile states that "
       "ddplan prices, each with its source; a flag or run-file field "
       "wins, and a value the hardware or run cannot take (its attention kernel, fp8 items without fp8) is left out and "
       "said.", str,
       MODEL, names_a_file=True),
    _f("hardware", "GPU: a built-in (mi300x, h100-sxm, h200, b200, ...) or a YAML path. Default: the calibration's "
       "hardware, else mi300x (the canonical case).", str, MODEL, names_a_file=True, many=frozenset({"plan"}),
       helps={"plan": "One or more GPUs, comma-separated (built-in names or YAML paths; all: every built-in; "
                      "default: the calibration's, else mi300x)."}),
    _f("gpus", "GPUs in total: dp x tp x pp.", int, LAYOUT, range=Range(1, 1_000_000, "GPUs in total"),
       many=TABLE_PLAN, defaults={"table": "1,8", "memory": 1, "plan": "8"},
       helps={"table": "GPUs in total per row (dp x tp x pp), comma-separated; A-B doubles from A up to B (1-512: "
                       "1, 2, 4, ..., 512; mixes: 1,8-64).",
              "plan": "GPUs in total to search, comma-separated; A-B doubles from A up to B (8-64: 8, 16, 32, 64; "
                      "1-512: every power of two to 512; mixes: 1,8-64)."}),
    _f("layout.tp", "Tensor-parallel degree.", int, LAYOUT,
       range=Range(1, 1024, "tensor-parallel degree"), many=TABLE, default=1, defaults={"table": "1"},
       commands=TABLE_MEMORY),
    _f("layout.pp", "Pipeline-parallel degree.", int, LAYOUT,
       range=Range(1, 1024, "pipeline stages"), many=TABLE, default=1, defaults={"table": "1"}, commands=TABLE_MEMORY),
    _f("layout.vp", "Interleaved chunks per pipeline stage (1: 1F1B).", int, LAYOUT,
       range=Range(1, 64, "chunks per pipeline stage"), many=TABLE, default=1, defaults={"table": "1"},
       commands=TABLE_MEMORY),
    _f("layout.schedule", "Pipeline schedule (pp > 1): 1f1b, interleaved (--vp chunks a stage, 2 unless given), or a "
       "zero-bubble schedule of Qi et "
       "al. (arXiv 2401.10241), which splits backward into input and weight gradients and fills the bubble with the "
       "latter: zb-h1 (1F1B's memory; the paper's ZB-1p), zb-h2 (up to 2p - 1 micro-batches' activations; the "
       "paper's ZB-2p, priced as an upper bound) or zb-v (two chunks a stage in a V, 1F1B's memory; torch "
       "ScheduleZBVZeroBubble, torchtitan's ZBVZeroBubble). Default: 1f1b, interleaved when vp > 1.",
       SCHEDULES, LAYOUT, many=PLAN,
       helps={"plan": "Pipeline schedules to search at pp > 1, comma-separated, of 1f1b, interleaved (2 chunks a "
                      "stage), zb-h1, zb-h2 and zb-v (default: 1f1b and interleaved, or those the --framework stack "
                      "offers)."}),
    _f("layout.cp", "Context-parallel degree: each sequence split over cp GPUs (ring attention).",
       int, LAYOUT, range=Range(1, 1024, "context-parallel degree"), many=TABLE_PLAN, default=1,
       defaults={"table": "1", "plan": None},
       helps={"plan": "Context-parallel degrees to search, comma-separated (default: 1, and each power of two up to "
                      "16 leaving a GPU at least 4,096 tokens of a sequence)."}),
    _f("layout.ep", "Expert-parallel degree (mixture-of-experts models): routed experts split over ep of the "
       "data-parallel GPUs.", int, LAYOUT,
       range=Range(1, 4096, "expert-parallel degree"), many=TABLE_PLAN, default=1,
       defaults={"table": "1", "plan": None},
       helps={"plan": "Expert-parallel degrees to search, comma-separated (default: every number that divides both "
                      "the experts and the data-parallel GPUs; mixture-of-experts models only)."}),
    _f("layout.etp", "Expert tensor parallelism of a mixture of experts: 1 keeps each expert whole on a GPU, ep then "
       "spanning the tensor-parallel GPUs too (Megatron-Core --expert-tensor-parallel-size 1); default: the experts "
       "split over tp like the dense MLP.", int, LAYOUT),  # 1 only: ddplan.inputs.expert_tp says so
    _f("layout.zero", "ZeRO stage 0-3 (3 = FSDP; default: the model's native data-parallel setup).", ZERO_STAGES, LAYOUT, many=ALL, defaults={"memory": "0,1,2,3"},
       helps={"memory": "ZeRO stages to show, comma-separated; one stage: the verdict is about it (default: the "
                        "model's native stage).",
              "plan": "ZeRO stages 0-3 to search among, comma-separated (default: all four)."}),
    _f("layout.shard_group", "ZeRO-3 hybrid sharding: shard over this many data-parallel ranks (8: one node at tp 1) "
       "and replicate across the rest (torch HSDP).", int, LAYOUT,
       range=Range(2, 1_000_000, "data-parallel ranks a ZeRO-3 shard spans"), option="shard_group"),
    _f("layout.sequence_parallel", "Megatron sequence parallelism on layouts with tp: norms and saved activations "
       "split over tp too.", bool, LAYOUT, default=False, option="sequence_parallel"),
    _f("layout.tp_comm_overlap", "Layouts with tp overlap their communication with the layers' GEMMs (Megatron-Core "
       "--tp-comm-overlap; needs --sequence-parallel).", bool, LAYOUT, default=False, option="tp_overlap",
       commands=ALL),
    _f("layout.replica_reduce_once", "ZeRO-3 hybrid sharding: all-reduce the gradient shards across the replicas once "
       "a step, after the last micro-batch (torch FSDP2 set_requires_all_reduce(False) on the others, as OLMo-core "
       "does), not after every micro-batch (FSDP2's default).", bool, LAYOUT, default=False,
       option="replica_reduce_once"),
    _f("layout.reshard_after_forward", "ZeRO-3: free gathered parameters after forward and gather them again in "
       "backward (torch FSDP's default).", bool, LAYOUT, default=True, option="reshard_after_forward"),
    _f("layout.reshard_under_pipeline", "ZeRO-3 with pp > 1: free gathered parameters after forward as "
       "--reshard-after-forward says; --no-reshard-under-pipeline keeps them under a pipeline, as torchtitan's "
       "default policy does (its profile states it).", bool, LAYOUT, default=True, option="reshard_under_pipeline"),
    _f("layout.fsdp2", "ZeRO-3 runs as torch FSDP2 (fully_shard, per-parameter shards; torchtitan, OLMo-core): each "
       "all-gather's output is copied out into the parameters and each micro-batch's gradients into the "
       "reduce-scatter buffer, on the compute stream; priced as memory traffic. Flat-parameter FSDP (FSDP1, "
       "Composer) gathers in place.", bool, LAYOUT, default=False, option="fsdp2"),
    _f("layout.overlap_param_gather", "ZeRO-1/2: overlap the parameter all-gather after the optimizer step with the "
       "next forward (Megatron-Core distributed optimizer).", bool, LAYOUT, default=False,
       option="overlap_param_gather"),
    _f("layout.overlap_grad_reduce", "ZeRO 0-2: reduce the gradients bucket by bucket during the last backward (torch "
       "DDP, Megatron-Core --overlap-grad-reduce, NeMo); --no-overlap-grad-reduce: after it, exposed (Megatron-LM's "
       "default). ZeRO-3 always overlaps.", bool, LAYOUT, default=True, option="overlap_grad_reduce",
       commands=ALL),
    _f("layout.grad_bucket", "ZeRO 0-2 with --overlap-grad-reduce: how the gradients are bucketed, each bucket "
       "one collective paying its own latency, the last exposed after backward and the first parameter gather "
       "before forward: megatron (Megatron-Core's default, max(40M, 1M x dp x cp) parameters a bucket), chunk (one "
       "bucket a model chunk, as Megatron-Core runs under --overlap-param-gather-with-optimizer-step: nothing "
       "overlaps with vp 1), the parameters a bucket (NeMo's comm-overlap callback: 134217728; chunks after the "
       "first one bucket each, as Megatron-Core runs them), or group (the default: one collective a parameter "
       "group, the last 25 MiB exposed, torch DDP's bucket).", str, LAYOUT, default="group", check=grad_bucket_rule,
       option="grad_bucket"),
    _f("layout.offload_optimizer", "ZeRO-1/2/3: optimizer states and fp32 masters in host memory, Adam on the CPU, "
       "gradients and parameters over the host link (ZeRO-Offload, without its delayed update); needs the hardware "
       "spec's host figures.", bool, LAYOUT, default=False, option="offload_optimizer"),
    _f("layout.offload_activations", "Activation offload: the first N layers' saved activations copied to host memory "
       "in forward and back for backward (Megatron-Core --cpu-offloading-num-layers, NeMo activation_offload_layers; "
       "pp 1, fewer than the model's layers); the copies cost what exceeds the pass they run under. Needs the "
       "hardware spec's host link.", int, LAYOUT, default=0,
       range=Range(0, 100_000, "layers whose activations go to the host (0: none)"), option="offload_activations"),
    _f("layout.cp_comm", "Context parallelism's exchange: ring (KV blocks passed on under attention, Megatron-Core "
       "p2p) or all-gather (torchtitan's default; not overlapped).", ("ring", "all-gather"), LAYOUT, default="ring",
       option="cp_comm"),
    _f("layout.tp_across_nodes", "Allow tensor parallelism beyond one node (kept inside a node by default).", bool,
       LAYOUT, default=False, commands=PLAN),
    _f("precision.dtype", "Compute dtype: bf16, fp16 or fp32 (fp32: everything in fp32, as `ddplan calibrate` runs "
       "on a CPU; default: the model spec's).", str, MODEL),
    _f("precision.grads", "Gradient dtype: param (each parameter's own, e.g. bf16 gradients reduced in bf16, "
       "Megatron's --grad-reduce-in-bf16), fp32 (fp32 gradients, Megatron's default) or compute (reduced in the "
       "compute dtype, kept in the parameter's: FSDP MixedPrecision reduce_dtype=bfloat16 over fp32 weights); "
       "default: the model spec's.",
       GRADS, MODEL),
    _f("precision.weights", "How the weights are kept: fp32 (fp32 weights, cast to the compute dtype each forward: "
       "torch autocast, FSDP mixed precision) or master (16-bit weights, an fp32 master copy in the optimizer: "
       "Megatron-LM, DeepSpeed) or remainder (bf16 weights and, in the optimizer, only the 16 bits of their fp32 "
       "master that bf16 lacks: Transformer Engine's FusedAdam as Megatron-Core's --use-precision-aware-optimizer "
       "runs it, without fp8 or with delayed fp8, on the distributed optimizer's rows, ZeRO-1/2; other rows keep "
       "whole masters); default: the model spec's.", WEIGHTS, MODEL),
    _f("precision.moments", "Dtype of AdamW's two moments: fp32, bf16, fp16, fp8 (Megatron-Core's "
       "--use-precision-aware-optimizer with --exp-avg-dtype and --exp-avg-sq-dtype) or param (each parameter's "
       "own, torch's default); default: the model spec's (fp32; nanochat: param).", MOMENTS, MODEL),
    _f("precision.fp8", "Run eligible GEMMs in fp8: every dim a multiple of 16, the smaller weight dim >= 128, not "
       "the router and not the LM head unless the model's fp8 path converts it (nanochat's does); refused where the "
       "model's fp8 format does not run on the hardware.", bool, LAYOUT, default=False),
    _f("precision.fp8_recipe", "With --fp8, how the casts run: tensorwise (torchao Float8Linear, dynamic scaling), "
       "rowwise (torchao's row-wise recipe), rowwise_with_gw_hp (the same, its weight-gradient GEMM in 16 bits), "
       "delayed (Transformer Engine DelayedScaling), current (Transformer Engine Float8CurrentScaling: "
       "Megatron-Core's --fp8-recipe tensorwise), nanochat (nanochat/fp8.py), mxfp8 (Transformer Engine "
       "MXFP8BlockScaling, Blackwell and later; torchtitan's is mxfp8_torchao) or mxfp8_torchao (torchao's "
       "MXFP8Linear). Default: the --framework profile's, else the model's (nanochat: nanochat; others: "
       "tensorwise).", str, LAYOUT),
    _f("precision.fp8_all_gather", "With --fp8 (tensorwise) and ZeRO-3: all-gather the fp8 GEMMs' weights in fp8, "
       "1 byte an element (torchao enable_fsdp_float8_all_gather).", bool, LAYOUT, default=False,
       helps={"memory": "ZeRO-3 with fp8 GEMMs: their weights gathered in fp8, 1 byte an element (torchao "
                        "enable_fsdp_float8_all_gather); implies --fp8."}, option="fp8_all_gather"),
    _f("precision.fp8_params", "With --fp8 (delayed, current or mxfp8), --weights master and ZeRO-1 or 2 (the "
       "distributed optimizer) or 3 (Megatron-FSDP): keep the fp8 GEMMs' weights in fp8, all-gathered at 1 byte an "
       "element and never cast; in memory the fp8 data and, on Hopper or under MXFP8, its transpose: 2 bytes, 1 on "
       "Blackwell and under Megatron-FSDP but for MXFP8 (Megatron-Core --fp8-param-gather).", bool, LAYOUT,
       default=False,
       helps={"memory": "ZeRO-1/2/3 with fp8 GEMMs: their weights kept in fp8 and, on Hopper or under MXFP8, "
                        "its transpose, 2 bytes an element (1 on Blackwell and under Megatron-FSDP), gathered at 1 "
                        "(Megatron-Core --fp8-param-gather); implies --fp8."}, option="fp8_params"),
    _f("recompute", "Activation recompute: none, selective (Megatron's: the attention core), per-op (torchtitan's "
       "selective AC), full, full:N (Megatron-Core's block method: the first N layers of each pipeline chunk re-run "
       "whole, the rest keep everything; its --recompute-num-layers N), every:K (torchtitan's layer selective AC: "
       "every K-th layer re-run whole; its selective_ac_option K), or Megatron-Core's modules as "
       "selective:MODULE+MODULE (its --recompute-modules: core_attn, layernorm, mlp, moe, moe_act, shared_experts; "
       "e.g. selective:layernorm+moe).", str, LAYOUT,
       many=TABLE_PLAN, default="none", defaults={"plan": None}, check=recompute_policy,
       helps={"plan": "Recompute policies to search among: none, selective, per-op, full, full:N, every:K, "
                      "selective:MODULE+MODULE, comma-separated (default: none, selective, full; plan keeps the least "
                      "that fits)."}),
    _f("recompute_early_stop", "Recompute stops early, as torch's non-reentrant checkpoint does by default: a "
       "checkpointed region's last op (a block's second MLP GEMM under full recompute) is not re-run, nothing saved "
       "needing it. --no-recompute-early-stop: the region re-runs whole, as Megatron's, DeepSpeed's and Transformer "
       "Engine's reentrant checkpoints and torchtitan's (early_stop=False) do; the megatron, nemo, "
       "megatron-deepspeed and torchtitan profiles state it.", bool, LAYOUT, default=True,
       option="recompute_early_stop", commands=ALL),
    _f("attention", "Attention implementation (default: every one on the hardware; see `ddplan specs show "
       "HARDWARE`).", str, LAYOUT, many=TABLE_PLAN,
       helps={"memory": "Attention implementation (default: the hardware's default; see `ddplan specs show "
                        "HARDWARE`).",
              "plan": "Attention implementations to search among, comma-separated; over several hardware each takes "
                      "those it has (default: every one on each hardware)."}),
    _f("window", "Window pattern of S (short) and L (long) layers, e.g. L or SSSL (default: the model's, and L "
       "when it differs).", str, LAYOUT, many=TABLE, flags=("--window", "--window-pattern"),
       helps={"memory": "Window pattern of S (short) and L (long) layers, e.g. L or SSSL (default: the model's)."},
       commands=TABLE_MEMORY),
    _f("cross_entropy", "The loss kernel: eager (torch's cross entropy on fp32 logits: two vocab-wide fp32 "
       "gradients in backward) or vocab-parallel (Megatron's: the fp32 copy of the logits is the saved softmax and "
       "takes the gradient in place) or fused (a fused kernel, flash-attention's as llm-foundry's MPT runs it: keeps the "
       "16-bit logits and a log-sum-exp, writes a 16-bit gradient) or te (Transformer Engine's parallel cross "
       "entropy, Megatron-Core --cross-entropy-fusion-impl te: keeps the 16-bit logits, writes the gradient into them "
       "in place) or chunked (torchtitan's chunked loss: the head and an eager cross entropy on 1/8 of the tokens at "
       "a time, each chunk's backward at once); default: the model spec's (eager).",
       CROSS_ENTROPY, MODEL),
    _f("moe_weighting", "Mixture of experts: where each routed copy is multiplied by its routing probability: combine "
       "(on the experts' outputs at the un-permute, which saves them: HF transformers, Megatron-Core before "
       "Megatron-LM !2668) or activation (inside the experts' fused weighted SwiGLU, which saves only its input and "
       "the probabilities: Megatron-Core since April 2025); default: the model spec's (combine).",
       MOE_WEIGHTING, MODEL),
    _f("fusions", "How a block's norms, rotary embedding and SwiGLU run: eager (torch's ops: a learnable RMSNorm keeps "
       "its normalised input too, SwiGLU keeps silu(g)), transformer-engine (Megatron-Core's Transformer Engine "
       "layer spec: fused norms, RoPE and SwiGLU keep their inputs only), decomposed (each torch op its own kernel "
       "when not compiled, as the Llama reference code writes them: RMSNorm in float32, RoPE in complex float32; "
       "torchtitan before 2025-03-19) or fused-norm (the same but torch's fused RMSNorm kernel: torchtitan since); "
       "default: the model spec's (eager).",
       FUSIONS, MODEL),
    _f("fp8_weight_casts", "With --fp8, how often a GEMM's weight is cast to fp8: micro-batch (every micro-batch: "
       "torchao, nanochat, Composer's Transformer Engine) or step (once a step, the copy cached for its other "
       "micro-batches: Megatron-Core's Transformer Engine modules; with the delayed and current recipes only); "
       "default: the model spec's (micro-batch).",
       FP8_WEIGHT_CASTS, MODEL),
    _f("seq_len", "Sequence length in tokens (default: the recipe's; at most the model's max_seq_len).", int, MODEL,
       range=Range(1, 10**8, "tokens")),
    _f("compiled", "torch.compile'd model (changes what is saved for backward; default: the recipe's).", bool,
       LAYOUT, flags=("--compile/--no-compile",), commands=TABLE_MEMORY),
    _f("moe_imbalance", "Mixture of experts, dropless routing under expert parallelism: the busiest expert-parallel "
       "rank's routed rows over the mean, which the step waits for (1: forced balance, Megatron-Core "
       "--moe-router-force-load-balancing); default the model's, else 1.52 (fitted: "
       "validation/moe_routing.yaml).", float, MODEL,
       range=Range(1, 64, "busiest expert-parallel rank's routed rows over the mean")),
    _f("batch.device", "Sequences per GPU per micro-batch (default: the recipe's, made smaller until it fits).",
       int, LAYOUT, name="device_batch_size", range=Range(1, 65_536, "sequences per GPU per micro-batch"),
       many=TABLE, helps={"memory": "Sequences per GPU per micro-batch (default: the recipe's)."},
       commands=TABLE_MEMORY),
    _f("batch.total_tokens", "Tokens per optimizer step (default: the recipe's).", int, BATCH,
       name="total_batch_size", range=Range(1, 10**12, "tokens per step"), commands=TABLE_PLAN),
    _f("budget.steps", "Optimizer steps (overrides the recipe's budget).", int, BATCH,
       range=Range(1, 10**9, "optimizer steps"), commands=TABLE_PLAN),
    _f("budget.tokens", "Training tokens (overrides the recipe's budget).", float, BATCH,
       range=Range(1, 10**16, "training tokens"), commands=TABLE_PLAN),
    _f("budget.param_data_ratio", "Tokens per parameter (overrides the recipe's budget).", float, BATCH,
       range=Range(1e-3, 1e6, "tokens per parameter"), commands=TABLE_PLAN),
    _f("outside.startup_min", "Minutes outside steps at start (launch, compile warm-up).", float, BATCH,
       range=Range(0, 100_000, "minutes"), default=5.0, commands=TABLE_PLAN),
    _f("outside.eval_every", "Evaluate every N steps (0: never; default: the recipe's).", int, BATCH,
       range=Range(0, 10**9, "steps (0: never)"), commands=TABLE_PLAN),
    _f("outside.eval_tokens", "Tokens per evaluation (default: the recipe's).", int, BATCH,
       range=Range(1, 10**15, "tokens"), commands=TABLE_PLAN),
    _f("outside.checkpoint_every", "Checkpoint every N steps (0: at the end only).", int, BATCH,
       range=Range(0, 10**9, "steps (0: at the end only)"), default=0, commands=TABLE_PLAN),
    _f("outside.interruptions_per_gpu_hour", "Job interruptions a GPU-hour (default: Llama 3's 1.97e-5 on more than "
       "one node, 0 on one; 0: none).", float, BATCH, name="interruptions",
       flags=("--interruptions-per-gpu-hour",), range=Range(0, 1, "job interruptions a GPU-hour (0: none)"),
       commands=TABLE_PLAN),
    _f("outside.restart_min", "Minutes to restart after an interruption (reschedule, reload the checkpoint, warm "
       "up).", float, BATCH, range=Range(0, 100_000, "minutes"), default=10.0, commands=TABLE_PLAN),
    _f("price_usd_per_gpu_hour", "USD per GPU-hour (default: the hardware spec's first price).", float, MODEL,
       name="price", range=Range(0, 10_000, "USD per GPU-hour", low_open=True),
       helps={"plan": "USD per GPU-hour (default: each hardware spec's first price)."}, commands=TABLE_PLAN),
    _f("headroom", "Fraction of usable memory a layout must leave free.", float, LAYOUT,
       range=Range(0, 1, "fraction of usable memory", high_open=True), default=0.05),
    _f("calibration", "A calibration file (from `ddplan calibrate`, or written by hand): its measurements replace "
       "assumptions.", str, MODEL, names_a_file=True,
       helps={"memory": "A calibration file: its measured step of this model (without --model, its first step) "
                        "sets the GPUs, layout, micro-batch, window and compile mode not given, and its peak memory "
                        "(if any) is used as --measured-peak when no flag moves the shape away from it."}),
    _f("measured.step_time_s", "A step time you measured, seconds; ddplan fits one knob to it and derives the other "
       "rows.", float, MEASURED, name="measured_step_time", range=Range(0, 10**6, "seconds", low_open=True),
       commands=TABLE),
    _f("measured.gpus", "GPUs in total of the measured run (default: the first of --gpus).", int, MEASURED,
       name="measured_gpus", range=Range(1, 1_000_000, "GPUs in total"), commands=TABLE),
    _f("measured.tp", "Tensor-parallel degree of the measured run (default: the first of --tp).", int, MEASURED,
       name="measured_tp", range=Range(1, 1024, "tensor-parallel degree"), commands=TABLE),
    _f("measured.pp", "Pipeline-parallel degree of the measured run (default: the first of --pp).", int, MEASURED,
       name="measured_pp", range=Range(1, 1024, "pipeline stages"), commands=TABLE),
    _f("measured.attention", "Attention of the measured run (default: the first of --attention, else the "
       "hardware's default).", str, MEASURED, name="measured_attention", commands=TABLE),
    _f("measured.window", "Window pattern of the measured run (default: the first of --window).", str, MEASURED,
       name="measured_window", commands=TABLE),
    _f("measured.fit", "Which efficiency the measurement calibrates; auto picks the one whose range moves the "
       "measured row most.", ("auto", "gemm", "attention", "compute"), MEASURED, default="auto", commands=TABLE),
    _f("measured.peak_gb", "A measured peak in GB (1e9 bytes): say which attention and recompute setups it is "
       "consistent with.", float, MEASURED, name="measured_peak", range=Range(0, 10**6, "GB", low_open=True),
       commands=MEMORY),
    _f("measured.peak_kind", "What the measured peak counts: device (nvidia-smi, rocm-smi: everything), reserved "
       "(torch.cuda.max_memory_reserved: no context) or allocated (max_memory_allocated: tensors only; a "
       "calibration's step).", ("device", "reserved", "allocated"), MEASURED, name="measured_peak_kind",
       default="device", commands=MEMORY),
    _f("plan.objective", "Rank by wall-clock or by cost.", ("time", "cost"), BATCH, default="time", commands=PLAN),
    _f("plan.deadline_h", "Hours: the cheapest layout that finishes in time.", float, BATCH, name="deadline",
       range=Range(0, 10**7, "hours", low_open=True), commands=PLAN),
    _f("plan.budget_usd", "USD: the fastest layout within the budget.", float, BATCH, name="budget",
       range=Range(0, 10**13, "USD", low_open=True), commands=PLAN),
    _f("plan.top", "How many layouts to list (table, markdown, json; csv lists all).", int, OUTPUT,
       range=Range(1, 10**6, "layouts"), default=10, commands=PLAN),
)
BY_PARAM: dict[str, RunField] = {f.param: f for f in FIELDS}
OPTION_FIELDS: tuple[RunField, ...] = tuple(f for f in FIELDS if f.option)
# what a framework profile says of fp8 applies only when fp8 is on (a flag given without --fp8 is an error instead):
# the recipe, and the options that gather or keep the fp8 GEMMs' weights in fp8 (NeMo keeps them: fp8_params)
PROFILE_FP8_ONLY = frozenset({"fp8_recipe", "fp8_all_gather", "fp8_params"})
BY_PATH: dict[tuple[str, ...], RunField] = {f.path: f for f in FIELDS}

