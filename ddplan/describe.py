"""What `ddplan specs` shows: one line per built-in, and the figures derived from one spec."""

from __future__ import annotations

import difflib
from pathlib import Path

from ddplan import flops, params, registry, run, specfile, units
from ddplan.errors import SpecError
from ddplan.frameworks import APPLIES, FrameworkProfile
from ddplan.hf import config_path
from ddplan.specs import HardwareSpec, ModelSpec, nanochat_depth

Derived = list[tuple[str, float | int | str, str, str]]  # (figure, value, unit, where it comes from)


def list_rows() -> list[dict[str, str]]:
    rows = []
    for name in registry.builtin_names("hardware"):
        hw = registry.load_hardware(name)
        rows.append({"kind": "hardware", "name": hw.name, "aliases": ", ".join(hw.aliases),
                     "summary": f"{hw.display_name}: {hw.peak.bf16_tflops.value:g} bf16 TFLOP/s dense, "
                                f"{hw.memory.usable_gib.value:g} GiB, {hw.memory.hbm_tbyte_per_s.value:g} TB/s, "
                                f"${hw.price.usd_per_gpu_hour:.2f}/GPU-h"})  # provider, date: `specs show`
    for name in registry.builtin_names("models"):
        m = registry.load_model(name)
        a = m.architecture
        rows.append({"kind": "model", "name": m.name, "aliases": ", ".join(m.aliases),
                     "summary": f"{params.total_params(a) / 1e6:,.0f}M params"
                                + (f" ({params.active_params(a) / 1e6:,.0f}M active, {a.moe.num_experts} experts, "
                                   f"top {a.moe.top_k})" if a.moe else "")
                                + f", {a.num_layers} layers x {a.d_model}, "
                                f"{a.num_heads} heads ({a.num_kv_heads} kv), vocab {a.vocab_size}"})
    rows.append({"kind": "model", "name": "nanochat-dN", "aliases": "dN",
                 "summary": "any nanochat depth N, by nanochat's depth rule (e.g. d12, d30)"})
    for name in registry.builtin_names("frameworks"):  # --framework: a stack's defaults (frameworks/NAME.yaml)
        f = registry.load_framework(name)
        rows.append({"kind": "framework", "name": f.name, "aliases": ", ".join(f.aliases),
                     "summary": f"{f.repo}@{f.commit[:7]} ({f.commit_date}): sets {', '.join(f.applies) or '-'}; "
                                f"not priced yet: {', '.join(f.unpriced) or '-'}"
                                + (f"; cannot run: {', '.join(f.lacks)}" if f.lacks else "")})
    return rows


def load_any(name: str) -> HardwareSpec | ModelSpec | FrameworkProfile:
    """A spec of any kind by name or path (a path's `kind:` key decides): hardware, model or framework profile; a
    Hugging Face config.json, or a folder holding one, is a model, as `--model` reads it (ddplan.hf)."""
    if config_path(name) is not None:
        return registry.load_model(name)
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.exists():
            raise SpecError("no such file", file=name)
        data = specfile.read_yaml(path)  # a folder, an unreadable or malformed file: one line naming it
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind == "hardware":
            return registry.load_hardware(name)
        if kind == "model":
            return registry.load_model(name)
        if kind == "framework":
            return registry.load_framework(name)
        raise SpecError("need `kind: hardware`, `kind: model` or `kind: framework`", file=name, field="kind")
    key = name.lower()
    models, hardware = registry._builtins("models"), registry._builtins("hardware")
    if key in models or nanochat_depth(key) is not None:
        return registry.load_model(name)
    if key in hardware:
        return registry.load_hardware(name)
    frameworks = registry._builtins("frameworks")
    if key in frameworks:
        return registry.load_framework(name)
    close = difflib.get_close_matches(key, [*models, *hardware, *frameworks], n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise SpecError(f"unknown spec {name!r}; {hint}see `ddplan specs list` (or give a path to a YAML file)",
                    field="NAME")


def describe(name: str) -> tuple[HardwareSpec | ModelSpec | FrameworkProfile, Derived]:
    spec = load_any(name)
    if isinstance(spec, FrameworkProfile):
        return spec, framework_figures(spec)
    return spec, (hardware_figures(spec) if isinstance(spec, HardwareSpec) else model_figures(spec))


def framework_figures(f: FrameworkProfile) -> Derived:
    """What a profile does to a run: each field it sets (its flag) and each thing ddplan does not price yet,
    with where the stack says so."""
    out: Derived = [(f"sets {'.'.join(APPLIES[k])}", str(item.value), "-", item.where) for k, item in f.applies.items()]
    out += [(f"not priced: {k}", str(item.value), "-", item.where) for k, item in f.unpriced.items()]
    return out


def hardware_figures(hw: HardwareSpec) -> Derived:
    best = hw.efficiency.gemm.best
    peak = hw.peak.bf16_tflops.value
    out: Derived = [
        ("best bf16 GEMM", best.value * peak, "TFLOP/s",
         f"efficiency.gemm.best {best.value:.3f} ({best.basis}) x dense peak {peak:g}"),
        ("achievable HBM bandwidth", hw.efficiency.hbm.value * hw.memory.hbm_tbyte_per_s.value, "TB/s",
         f"efficiency.hbm {hw.efficiency.hbm.value:.3f} ({hw.efficiency.hbm.basis}) x peak"),
        ("usable memory", hw.memory.usable_bytes / units.GB, "GB", "usable_gib x 2^30 / 1e9"),
        ("node NIC bandwidth", hw.inter_node.node_bytes_per_s / units.GB, "GB/s",
         f"{hw.inter_node.nics_per_node} NICs x {hw.inter_node.nic_gbit_per_s.value:g} Gbit/s / 8"),
        ("ridge point (bf16 GEMM / HBM)", best.value * peak * units.TFLOPS
         / (hw.efficiency.hbm.value * hw.memory.hbm_bytes_per_s), "FLOP/byte",
         "ops below this arithmetic intensity are memory-bound"),
    ]
    if hw.price.billing == "per_node":
        out.append(("node price", hw.price.usd_per_gpu_hour * hw.gpus_per_node, "USD/h", "billed per node"))
    return out


def model_figures(m: ModelSpec) -> Derived:
    a = m.architecture
    counts = params.param_counts(a)
    out: Derived = [(f"params: {g}", n, "params", "ddplan.params.param_counts") for g, n in counts.items() if n]
    out += [
        ("params: total", params.total_params(a), "params", "sum of the groups"),
        *([("params: active", params.active_params(a), "params",
            f"total less the routed experts a token skips ({a.moe.top_k} of {a.moe.num_experts} used)")]
          if a.moe else []),
        ("params: scaling (nanochat)", params.scaling_params(a), "params", "transformer matrices + lm_head"),
        ("params: non-embedding", params.non_embedding_params(a), "params", "total - wte - wpe - value embeddings"),
        ("windows per layer", _windows_text(a.windows(m.recipe.seq_len)), "tokens",
         f"pattern {a.window_pattern!r} tiled, last layer full"),
    ]
    t = m.recipe.seq_len
    names = {"nanochat": "6N + 12 h q min(window, T) per layer (nanochat gpt.py estimate_flops)",
             "palm": "6N + 12 L H Q T (PaLM arXiv 2204.02311 App. B)",
             "exact": "6N + exact causal/windowed attention pairs",
             "korthikanti": "72 B L s h^2 (1 + s/6h + V/12hL) / (B s) (arXiv 2205.05198 Eq. 7; GPT layer)",
             "megatron_hfu": "96 B s l h^2 (1 + s/6h + V/16lh) / (B s), full recompute (arXiv 2104.04473 Eq. 3)"}
    for conv, source in names.items():
        if a.moe is None or conv not in ("korthikanti", "megatron_hfu"):  # dense GPT formulas
            out.append((f"FLOPs/token: {conv}", flops.flops_per_token(a, t, conv), "FLOP", source))
    tokens = m.recipe.total_batch_tokens
    out.append(("steps (recipe budget)", run.steps_for(m, m.recipe.budget, tokens), "steps",
                f"{m.recipe.budget.model_dump(exclude_none=True)} at {tokens:,} tokens/step"))
    return out


def _windows_text(windows: list[int]) -> str:
    """Run-length text of per-layer windows, e.g. '512 x3, 2048, 512 x3, 2048'."""
    runs: list[list[int]] = []
    for w in windows:
        if runs and runs[-1][0] == w:
            runs[-1][1] += 1
        else:
            runs.append([w, 1])
    return ", ".join(f"{w} x{n}" if n > 1 else f"{w}" for w, n in runs)
