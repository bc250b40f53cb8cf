"""Does it fit? Memory rows per ZeRO stage, the verdict, and what a measured peak is consistent with.

Pure functions over specs: rows are plain dicts (units in the keys), rendered by ddplan.render.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddplan.anatomy import build_anatomy
from ddplan.errors import LayoutError, UsageError
from ddplan.layout import NATIVE_ZERO, Layout, check_layout
from ddplan.memory import HEADROOM, MemoryAssumptions, MemoryBreakdown, memory_per_gpu
from ddplan.specs import HardwareSpec, ModelSpec
from ddplan.units import GB, GiB

TERM_COLUMNS = {
    "params": "params_gib", "gradients": "gradients_gib", "optimizer": "optimizer_gib",
    "activations": "activations_gib", "activation_transient": "transient_gib", "comm_buffers": "buffers_gib",
    "framework": "framework_gib", "allocator_slack": "allocator_gib",
}
DISTRIBUTION_NAMES = {"sharded_optimizer": "nanochat's sharded optimizer (ZeRO-1 memory)", "ddp": "DDP",
                      "zero1": "ZeRO-1", "zero2": "ZeRO-2", "fsdp": "FSDP (ZeRO-3)"}


@dataclass(frozen=True)
class Setup:
    """Everything memory depends on besides the specs."""

    layout: Layout
    window_pattern: str | None = None
    seq_len: int | None = None


def attention_mode(hw: HardwareSpec, name: str) -> tuple[str, str]:
    """(kind, window support) of a named attention implementation on this hardware."""
    try:
        impl = hw.attention_impl(name)
    except KeyError:
        allowed = ", ".join(a.name for a in hw.attention)
        raise UsageError(f"attention implementation {name!r} is not available on {hw.name}; allowed: {allowed}",
                         field="--attention") from None
    return impl.kind, impl.windows


def breakdown(spec: ModelSpec, hw: HardwareSpec, setup: Setup,
              assumptions: MemoryAssumptions = MemoryAssumptions()) -> MemoryBreakdown:
    layout = setup.layout
    kind, windows = attention_mode(hw, layout.attention)
    anatomy = build_anatomy(spec, batch=layout.micro_batch, seq_len=setup.seq_len, attention=kind,
                            windows=windows, recompute=layout.recompute, compiled=layout.compiled,
                            window_pattern=setup.window_pattern, tp=layout.tp)
    return memory_per_gpu(spec, layout, anatomy, hw.memory.usable_bytes, assumptions)


def zero_rows(spec: ModelSpec, hw: HardwareSpec, setup: Setup, stages: list[int],
              assumptions: MemoryAssumptions = MemoryAssumptions()) -> list[dict]:
    """One row per ZeRO stage: each term in GiB, total against usable memory, the native stage marked."""
    native = NATIVE_ZERO[spec.recipe.distribution]
    rows = []
    for z in stages:
        mb = breakdown(spec, hw, replace(setup, layout=replace(setup.layout, zero=z)), assumptions)
        row = {"zero": z, "setup": "native" if z == native else "what-if"}
        row.update({TERM_COLUMNS[k]: v / GiB for k, v in mb.terms.items()})
        row.update({"total_gib": mb.total / GiB, "usable_gib": mb.capacity / GiB,
                    "fits": mb.fits, "headroom_gib": mb.headroom / GiB})
        rows.append(row)
    return rows


def alternatives(spec: ModelSpec, hw: HardwareSpec, setup: Setup,
                 assumptions: MemoryAssumptions = MemoryAssumptions()) -> list[tuple[str, float, bool]]:
    """What else would fit, one change at a time: (description, total GiB, fits).

    Tried in order of cost to the user: a smaller micro-batch (more accumulation, same total batch),
    selective then full recompute, each other attention implementation, ZeRO-3, then tensor and
    pipeline parallelism inside the node.
    """
    out = []
    base = setup.layout

    limit = (1 - HEADROOM) * hw.memory.usable_bytes

    def total(layout: Layout) -> float:
        return breakdown(spec, hw, replace(setup, layout=layout), assumptions).total

    mb = base.micro_batch // 2
    while mb >= 1:
        t = total(replace(base, micro_batch=mb, grad_accum=base.grad_accum * base.micro_batch // mb))
        if t <= limit or mb == 1:
            out.append((f"device batch {mb} (accumulation x{base.micro_batch // mb})", t / GiB,
                        t <= limit))
            break
        mb //= 2
    for rc in ("selective", "full"):
        if rc != base.recompute:
            t = total(replace(base, recompute=rc))
            out.append((f"recompute {rc}", t / GiB, t <= limit))
    for impl in hw.attention:
        if impl.name != base.attention:
            t = total(replace(base, attention=impl.name))
            out.append((f"attention {impl.name}", t / GiB, t <= limit))
    if base.zero != 3 and base.dp > 1:
        t = total(replace(base, zero=3))
        other = "" if NATIVE_ZERO[spec.recipe.distribution] == 3 else " (needs another training setup)"
        out.append((f"ZeRO-3 / FSDP{other}", t / GiB, t <= limit))
    for axis in ("tp", "pp"):
        degree = 2
        while degree <= hw.gpus_per_node:
            try:
                layout = replace(base, **{axis: degree})
                check_layout(layout, spec)
            except LayoutError:
                break
            t = total(layout)
            if t <= limit:
                out.append((f"{axis}={degree}", t / GiB, True))
                break
            degree *= 2
    return out


def verdict(spec: ModelSpec, hw: HardwareSpec, rows: list[dict], alts: list[tuple[str, float, bool]]) -> list[str]:
    """Plain-words conclusion: the smallest setup that fits, with headroom, or what would."""
    native = next((r for r in rows if r["setup"] == "native"), None)
    fitting = [r for r in rows if r["fits"]]
    name = DISTRIBUTION_NAMES[spec.recipe.distribution]
    lines = []
    if native and native["fits"]:
        lines.append(f"Fits with the model's native setup ({name}, ZeRO-{native['zero']}): "
                     f"{native['total_gib']:.1f} of {native['usable_gib']:.1f} GiB, "
                     f"{native['headroom_gib']:.1f} GiB headroom.")
        more = [r for r in rows if r["zero"] > native["zero"]]
        if more and len({round(r["total_gib"], 2) for r in rows}) == 1:
            lines.append("ZeRO stages do not differ here: with one data-parallel rank there is nothing to shard.")
        elif more:
            saved = native["total_gib"] - min(r["total_gib"] for r in more)
            lines.append(f"Higher ZeRO stages would save up to {saved:.1f} GiB per GPU: not needed while "
                         f"memory is not the limit (they need another training setup and add communication).")
    elif fitting:
        best = min(fitting, key=lambda r: r["zero"])
        lines.append(f"The native setup ({name}) does not fit; ZeRO-{best['zero']} is the smallest stage that "
                     f"does: {best['total_gib']:.1f} of {best['usable_gib']:.1f} GiB.")
    else:
        lines.append("No ZeRO stage fits at this micro-batch.")
    if not (native and native["fits"]):
        ok = [a for a in alts if a[2]]
        for desc, gib, _ in ok:
            lines.append(f"Would fit: {desc}: {gib:.1f} GiB.")
        if not ok:
            lines.append("Nothing tried alone fits: combine a smaller device batch with recompute, or add GPUs "
                         "with TP/PP.")
    return lines


def consistent_with(spec: ModelSpec, hw: HardwareSpec, setup: Setup, measured_gb: float, tolerance: float = 0.10,
                    assumptions: MemoryAssumptions = MemoryAssumptions()) -> list[dict]:
    """Every (attention, recompute, compiled) combination, its predicted peak, and whether it matches.

    A measured peak (GB = 1e9 bytes, as rocm-smi / nvidia-smi style tools report in decimal or as
    torch.cuda.max_memory_reserved / 1e9) is consistent with a configuration when the prediction is
    within +-tolerance of it.
    """
    if measured_gb <= 0:
        raise UsageError(f"must be positive, got {measured_gb}", field="--measured-peak")
    out = []
    for impl in hw.attention:
        for rc in ("none", "selective", "full"):
            for compiled in (True, False):
                layout = replace(setup.layout, attention=impl.name, recompute=rc, compiled=compiled)
                t = breakdown(spec, hw, replace(setup, layout=layout), assumptions).total / GB
                err = (t - measured_gb) / measured_gb
                out.append({"attention": impl.name, "recompute": rc, "compiled": compiled, "predicted_gb": t,
                            "error_pct": 100 * err, "consistent": abs(err) <= tolerance})
    return sorted(out, key=lambda r: abs(r["error_pct"]))
