"""The run configuration: one training run stated in a file, read by `table`, `memory` and `plan --config FILE`.

A YAML file, `kind: run`, `version: 1`, grouped as a run is described (the seed's: examples/seed-d24-mi300x.yaml):

    kind: run
    version: 1
    model: d24                        # a built-in name, a model YAML, or a Hugging Face config.json
    hardware: mi300x
    gpus: [1, 8]                      # a list makes one row per value, as `--gpus 1,8` does
    layout: {tp: 1, pp: 1, zero: 1}
    precision: {dtype: bf16}
    attention: [sdpa-fused, flash-attn-ck]
    window: [L, SSSL]
    batch: {device: 32, total_tokens: 524288}
    measured: {step_time_s: 7.7, gpus: 1, attention: sdpa-fused, window: L}

Every field is optional and is exactly one command-line flag (FLAGS below): a field stated in the file is read as
if its flag were given, and a flag given on the command line wins over the file's field. A command reads the fields
it has flags for (`memory` prices one layout: a list there must hold one value; `plan` searches the layout degrees
itself) and no other. `--print-config` writes the configuration of a command line in this form.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ddplan.specs import Strict

def stated(description: str, **bounds: Any) -> Any:
    """A field of the run file: absent unless stated (then its flag's default applies), with what it is and its
    flag in the description, and the range `bounds` gives (gt, ge, lt, ...)."""
    return Field(default=None, description=description, **bounds)


Count = Annotated[int, Field(gt=0)]
IntList = list[Count] | Count
TextList = list[str] | str
Stage = Literal[0, 1, 2, 3]
RecomputePolicy = Literal["none", "selective", "per-op", "full"]
GPU_RANGES = r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$"  # as --gpus takes them: 1,8-64


class Layout(Strict):
    """How the GPUs split the model and the data (one row per value of each list, in `table`)."""

    tp: IntList | None = stated("tensor-parallel degrees (--tp)")
    pp: IntList | None = stated("pipeline-parallel degrees (--pp)")
    vp: IntList | None = stated("interleaved chunks per pipeline stage, 1: 1F1B (--vp)")
    cp: IntList | None = stated("context-parallel degrees (--cp)")
    ep: IntList | None = stated("expert-parallel degrees, mixtures of experts (--ep)")
    etp: int | None = stated("expert tensor-parallel degree (--etp)", ge=1)
    zero: list[Stage] | Stage | None = stated("ZeRO stages 0-3, 3 = FSDP (--zero; default: the "
                                              "model's native data-parallel setup)")
    shard_group: int | None = stated("GPUs a hybrid-sharded group spans (--shard-group)", ge=1)
    sequence_parallel: bool | None = stated("Megatron sequence parallelism (--sequence-parallel)")
    tp_comm_overlap: bool | None = stated("tensor-parallel communication overlapped "
                                          "(--tp-comm-overlap)")
    reshard_after_forward: bool | None = stated("FSDP frees gathered weights after "
                                                "forward (--reshard-after-forward)")
    overlap_param_gather: bool | None = stated("parameter all-gather overlapped "
                                               "(--overlap-param-gather)")
    offload_optimizer: bool | None = stated("optimizer states in host memory "
                                            "(--offload-optimizer)")
    cp_comm: str | None = stated("context-parallel communication (--cp-comm)")
    tp_across_nodes: bool | None = stated("plan: tensor parallelism beyond one node "
                                          "(--tp-across-nodes)")


class Precision(Strict):
    dtype: str | None = stated("compute dtype: bf16, fp16, fp32 (--dtype)")
    grads: str | None = stated("gradient dtype for reduction (--grads)")
    weights: str | None = stated("how the weights are kept: fp32, or master (16-bit with an fp32 copy in the "
                                 "optimizer) (--weights)")
    fp8: bool | None = stated("fp8 GEMMs (--fp8)")
    fp8_recipe: str | None = stated("how fp8 scales are kept (--fp8-recipe)")
    fp8_all_gather: bool | None = stated("weights all-gathered in fp8 (--fp8-all-gather)")


class Batch(Strict):
    device: IntList | None = stated("sequences per GPU per micro-batch (--device-batch-size)")
    total_tokens: int | None = stated("tokens per optimizer step (--total-batch-size)", gt=0)


class Budget(Strict):
    """How long the run trains: at most one of the three (the recipe's budget otherwise)."""

    steps: int | None = stated("optimizer steps (--steps)", gt=0)
    tokens: float | None = stated("training tokens (--tokens)", gt=0)
    param_data_ratio: float | None = stated("tokens per parameter (--param-data-ratio)", gt=0)


class Outside(Strict):
    """Time outside the training steps."""

    startup_min: float | None = stated("minutes at start: launch, warm-up "
                                       "(--startup-min)", ge=0)
    eval_every: int | None = stated("evaluate every N steps, 0: never (--eval-every)", ge=0)
    eval_tokens: int | None = stated("tokens per evaluation (--eval-tokens)", gt=0)
    checkpoint_every: int | None = stated("checkpoint every N steps, 0: at the end "
                                          "(--checkpoint-every)", ge=0)
    interruptions_per_gpu_hour: float | None = stated("job interruptions a GPU-hour "
                                                      "(--interruptions-per-gpu-hour)", ge=0)
    restart_min: float | None = stated("minutes to restart after an interruption "
                                       "(--restart-min)", ge=0)


class Measured(Strict):
    """A step measured on this run (table fits one efficiency to it; memory takes its peak)."""

    step_time_s: float | None = stated("seconds a step (--measured-step-time)", gt=0)
    gpus: int | None = stated("GPUs of the measured run (--measured-gpus)", gt=0)
    tp: int | None = stated("its tensor-parallel degree (--measured-tp)", gt=0)
    pp: int | None = stated("its pipeline-parallel degree (--measured-pp)", gt=0)
    attention: str | None = stated("its attention (--measured-attention)")
    window: str | None = stated("its window pattern (--measured-window)")
    fit: Literal["auto", "gemm", "attention", "compute"] | None = stated("the efficiency it calibrates (--fit)")
    peak_gb: float | None = stated("memory: measured peak per GPU, GB (10^9 bytes, "
                                   "as torch.cuda.max_memory_allocated / 1e9) "
                                   "(--measured-peak)", gt=0)


class Plan(Strict):
    """What `plan` optimises."""

    objective: Literal["time", "cost"] | None = stated("rank by wall-clock or cost "
                                                       "(--objective)")
    deadline_h: float | None = stated("hours: the cheapest layout in time (--deadline)", gt=0)
    budget_usd: float | None = stated("USD: the fastest layout within it (--budget)", gt=0)
    top: int | None = stated("rows shown (--top)", gt=0)


class RunConfig(Strict):
    """One training run: what `table`, `memory` and `plan` price. Every field optional (its flag's default)."""

    kind: Literal["run"]
    version: Literal[1] = 1
    model: str | None = stated("a built-in model, a model YAML or a config.json (--model)")
    framework: str | None = stated("the training stack, whose profile fills what the file does not state: "
                                   "torchtitan, ... (--framework; ddplan/frameworks.py)")
    hardware: TextList | None = stated("a built-in hardware or a hardware YAML; plan takes "
                                       "a list (or all) (--hardware)")
    gpus: IntList | Annotated[str, Field(pattern=GPU_RANGES)] | None = stated(
        "GPUs in total: a list, or ranges as the flag takes them ('1,8-64') (--gpus)")
    layout: Layout = Layout()
    precision: Precision = Precision()
    recompute: list[RecomputePolicy] | RecomputePolicy | None = stated("none, selective (Megatron's), "
                                                                       "full, per-op (torchtitan's) (--recompute)")
    attention: TextList | None = stated("attention implementations (--attention)")
    window: TextList | None = stated("window patterns of S and L, e.g. SSSL (--window)")
    seq_len: int | None = stated("sequence length, tokens (--seq-len)", gt=0)
    compiled: bool | None = stated("torch.compile'd model (--compile/--no-compile)")
    moe_imbalance: float | None = stated("busiest expert rank over the mean "
                                         "(--moe-imbalance)", ge=1)
    batch: Batch = Batch()
    budget: Budget = Budget()
    outside: Outside = Outside()
    price_usd_per_gpu_hour: float | None = stated("USD per GPU-hour (--price)", gt=0)
    headroom: float | None = stated("share of usable memory left free "
                                    "(--headroom)", ge=0, lt=1)
    calibration: str | None = stated("a calibration file (--calibration)")
    measured: Measured = Measured()
    plan: Plan = Plan()

    @model_validator(mode="after")
    def _one_budget(self) -> RunConfig:
        given = [k for k, v in self.budget.model_dump().items() if v is not None]
        if len(given) > 1:
            raise ValueError(f"budget: give at most one of steps, tokens, param_data_ratio (got {', '.join(given)})")
        return self


# field path in the file -> the command's parameter (its flag: the name with - for _)
FLAGS: dict[tuple[str, ...], str] = {
    ("model",): "model", ("framework",): "framework", ("hardware",): "hardware", ("gpus",): "gpus",
    **{("layout", k): k for k in Layout.model_fields},
    **{("precision", k): k for k in Precision.model_fields},
    ("recompute",): "recompute", ("attention",): "attention", ("window",): "window", ("seq_len",): "seq_len",
    ("compiled",): "compiled", ("moe_imbalance",): "moe_imbalance",
    ("batch", "device"): "device_batch_size", ("batch", "total_tokens"): "total_batch_size",
    **{("budget", k): k for k in Budget.model_fields},
    ("outside", "startup_min"): "startup_min", ("outside", "eval_every"): "eval_every",
    ("outside", "eval_tokens"): "eval_tokens", ("outside", "checkpoint_every"): "checkpoint_every",
    ("outside", "interruptions_per_gpu_hour"): "interruptions", ("outside", "restart_min"): "restart_min",
    ("price_usd_per_gpu_hour",): "price", ("headroom",): "headroom", ("calibration",): "calibration",
    ("measured", "step_time_s"): "measured_step_time", ("measured", "gpus"): "measured_gpus",
    ("measured", "tp"): "measured_tp", ("measured", "pp"): "measured_pp",
    ("measured", "attention"): "measured_attention", ("measured", "window"): "measured_window",
    ("measured", "fit"): "fit", ("measured", "peak_gb"): "measured_peak",
    ("plan", "objective"): "objective", ("plan", "deadline_h"): "deadline", ("plan", "budget_usd"): "budget",
    ("plan", "top"): "top",
}
# the parameters each command takes as a comma-separated list (one row each, or a search's choices); every other
# parameter takes one value, and a list in the file for it is an error unless its flag is given
LIST_PARAMS = {"table": frozenset({"gpus", "tp", "pp", "vp", "cp", "ep", "zero", "device_batch_size", "recompute",
                                   "attention", "window"}),
               "memory": frozenset({"zero"}),
               "plan": frozenset({"gpus", "ep", "cp", "hardware", "recompute", "zero", "attention"})}
# names or file paths: text even when written in digits (a file named 7); a relative path is the run file's folder's
NAMES = frozenset({"model", "hardware", "calibration", "framework"})
SECTIONS = {"layout": Layout, "precision": Precision, "batch": Batch, "budget": Budget, "outside": Outside,
            "measured": Measured, "plan": Plan}


def field_paths() -> list[tuple[str, ...]]:
    """Every leaf field of RunConfig, as a path (kind and version excepted)."""
    out = []
    for name in RunConfig.model_fields:
        if name in ("kind", "version"):
            continue
        out += [(name, k) for k in SECTIONS[name].model_fields] if name in SECTIONS else [(name,)]
    return out


def _get(config: RunConfig, path: tuple[str, ...]) -> Any:
    node: Any = config
    for part in path:
        node = getattr(node, part)
    return node


def _beside(source: str, value: Any) -> Any:
    """A relative file path in the run file (model: my-model.yaml) read from the run file's folder, as a reader
    of the file would (a built-in name, or a path that only exists from the working folder, as given)."""
    from pathlib import Path

    if isinstance(value, list):
        return [_beside(source, v) for v in value]
    if not isinstance(value, str) or Path(value).is_absolute():
        return value
    here = Path(source).expanduser().parent / value
    return str(here) if here.exists() and not Path(value).exists() else value


def as_flag_value(value: Any) -> Any:
    """A field's value as its flag takes it: a list joined with commas, anything else as is."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return value


def defaults_for(config: RunConfig, params: dict[str, bool], source: str
                 ) -> tuple[dict[str, Any], dict[str, tuple[str, str, list]], list[str]]:
    """(the command's parameter defaults the file states, as click's default_map: each stated field under its
    parameter's name, for the parameters this command has; the lists of several values given for a parameter of
    one value, by name: (file, field, values), an error unless the flag is given; the stated fields this command
    has no flag for, which it does not read). params: name -> whether it takes one value (memory's --gpus) rather
    than a comma-separated list (table's)."""
    out: dict[str, Any] = {}
    lists: dict[str, tuple[str, str, list]] = {}
    unread: list[str] = []
    for path, name in FLAGS.items():
        value = _get(config, path)
        if value is None:
            continue
        if name not in params:
            unread.append(".".join(path))
            continue
        if name in NAMES:
            value = _beside(source, value)
        if params[name] and isinstance(value, list):
            if len(value) != 1:
                lists[name] = (source, ".".join(path), value)
                continue
            value = value[0]
        out[name] = as_flag_value(value)
    return out, lists, unread


def from_params(params: dict[str, Any], stated: set[str]) -> RunConfig:
    """The run configuration of a command line: each parameter in `stated` (given on the command line or by a
    file) under its field; lists written as lists."""
    data: dict[str, Any] = {"kind": "run", "version": 1}
    for path, name in FLAGS.items():
        if name not in stated or params.get(name) is None:
            continue
        value = params[name]
        value = getattr(value, "value", value)  # an Enum choice
        if isinstance(value, str) and "," in value:
            items = [v.strip() for v in value.split(",")]
            numbers = all(v.isdigit() for v in items)
            value = [int(v) for v in items] if numbers else value if name == "gpus" else items
        elif isinstance(value, str) and value.strip().isdigit() and name not in NAMES:
            value = int(value)  # a list flag given one count: `--zero 1`
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return RunConfig.model_validate(data)


def flow(value: Any) -> str:
    """One value in YAML's flow style, on one line: d24, [1, 8], '1,8-64', {device: 32}."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text[:-3].strip() if text.endswith("\n...") or text.endswith("...") else text


def to_yaml(config: RunConfig) -> str:
    """The configuration as a file: the stated fields only, in the schema's order."""
    data = config.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    # a key a line, a section's few fields on its line: `batch: {device: 32, total_tokens: 524288}`
    lines = "".join(f"{k}: {flow(v)}\n" for k, v in data.items() if v != {})
    return ("# a ddplan run configuration: `ddplan table --config FILE` (or memory, plan) prices it; a flag given\n"
            "# with it wins over its field. Fields: ddplan/runconfig.py\n" + lines)
