"""A parallel layout: how one training step is split over GPUs, and the rules it must satisfy."""

from __future__ import annotations

from dataclasses import dataclass

from ddplan.errors import LayoutError
from ddplan.specs import ModelSpec

ZERO_STAGES = (0, 1, 2, 3)

# The ZeRO stage whose memory a model's native data-parallel setup matches.
NATIVE_ZERO = {"ddp": 0, "sharded_optimizer": 1, "zero1": 1, "zero2": 2, "fsdp": 3}


@dataclass(frozen=True)
class Layout:
    """Degrees of parallelism and per-GPU work for one training step.

    dp x tp x pp = num_gpus. micro_batch: sequences per GPU per forward/backward; grad_accum:
    micro-batches per optimizer step (per pipeline: pipeline micro-batches). zero: which model
    states are sharded over dp (0 none, 1 optimizer state, 2 + gradients, 3 + parameters).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1
    grad_accum: int = 1
    attention: str = "sdpa-fused"  # an implementation name from the hardware spec
    recompute: str = "none"
    compiled: bool = False
    pp_schedule: str = "1f1b"  # "1f1b" or "interleaved"
    pp_virtual_stages: int = 1

    def __post_init__(self) -> None:
        bad = {k: getattr(self, k) for k in ("dp", "tp", "pp", "micro_batch", "grad_accum", "pp_virtual_stages")
               if getattr(self, k) < 1}
        if bad:
            raise LayoutError("must be >= 1: " + ", ".join(f"{k}={v}" for k, v in bad.items()))
        if self.zero not in ZERO_STAGES:
            raise LayoutError(f"zero stage must be one of {ZERO_STAGES}, got {self.zero}")
        if self.pp_schedule not in ("1f1b", "interleaved"):
            raise LayoutError(f"pipeline schedule must be 1f1b or interleaved, got {self.pp_schedule!r}")
        if (self.pp_schedule == "interleaved") != (self.pp_virtual_stages > 1):
            raise LayoutError(f"interleaved schedules need pp_virtual_stages > 1 and 1f1b exactly 1; got "
                              f"{self.pp_schedule} with {self.pp_virtual_stages}")
        if self.recompute not in ("none", "selective", "full"):
            raise LayoutError(f"recompute must be none, selective or full, got {self.recompute!r}")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def sequences_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp


def check_layout(layout: Layout, spec: ModelSpec, total_batch_tokens: int | None = None) -> None:
    """Raise LayoutError naming every factor that does not divide (heads by tp, layers by pp, batch by dp)."""
    a = spec.architecture
    problems = []
    if a.num_heads % layout.tp or a.num_kv_heads % layout.tp:
        problems.append(f"tp={layout.tp} must divide num_heads={a.num_heads} and num_kv_heads={a.num_kv_heads}")
    if a.num_layers % (layout.pp * layout.pp_virtual_stages):
        problems.append(f"pp x virtual stages = {layout.pp * layout.pp_virtual_stages} must divide "
                        f"num_layers={a.num_layers}")
    if spec.recipe.world_size_rule == "power_of_two" and layout.num_gpus & (layout.num_gpus - 1):
        problems.append(f"{spec.name} needs a power-of-two world size, got {layout.num_gpus}")
    if total_batch_tokens is not None:
        tokens = layout.sequences_per_step() * spec.recipe.seq_len
        if tokens != total_batch_tokens:
            problems.append(f"dp {layout.dp} x micro-batch {layout.micro_batch} x accumulation {layout.grad_accum} "
                            f"x seq {spec.recipe.seq_len} = {tokens:,} tokens != total batch {total_batch_tokens:,}")
    if problems:
        raise LayoutError("; ".join(problems))
