"""A whole run: steps, wall-clock (training plus what happens outside steps), GPU-hours and cost."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddplan.params import non_embedding_params, scaling_params, total_params
from ddplan.specs import Budget, ModelSpec, Price
from ddplan.units import HOUR


@dataclass(frozen=True)
class RunOverheads:
    """Wall-clock outside training steps; each term is an assumption and can be set to zero.

    startup_s: process launch, data loader start, torch.compile and the slow first steps (assumed
      5 min; nanochat excludes its first 10 steps from its own timer for this reason,
      base_train.py @00255c1). eval_every_steps / eval_tokens: periodic validation, forward only
      (default: the recipe's). checkpoint_every_steps: 0 = only at the end (nanochat's default
      --save-every -1); checkpoint_gbyte_per_s: write speed of model + optimizer state (assumed
      1 GB/s per node, a network file system). interruptions_per_gpu_hour: job interruptions a GPU-hour
      (None: LLAMA3_INTERRUPTIONS_PER_GPU_HOUR on more than one node, 0 on one; 0 turns goodput off);
      restart_s: detect, reschedule, reload the last checkpoint and warm up again (assumed 10 min).
    """

    startup_s: float = 300.0
    eval_every_steps: int | None = None  # None: the recipe's
    eval_tokens: int | None = None
    checkpoint_every_steps: int = 0
    checkpoint_gbyte_per_s: float = 1.0
    interruptions_per_gpu_hour: float | None = None
    restart_s: float = 600.0


# Llama 3 (Dubey et al., arXiv 2407.21783, sec. 3.3.4): 419 unexpected interruptions in a 54-day snapshot of
# pre-training on 16,384 H100s (466 in all; the 47 planned ones are left out): 419 / (54 x 24 x 16,384) a GPU-hour.
LLAMA3_INTERRUPTIONS_PER_GPU_HOUR = 419 / (54 * 24 * 16384)


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that minimises lost time, seconds: sqrt(2 delta M) (first order).

    delta = time to write one checkpoint, M = mean time between interruptions of the whole job.
    e.g. delta 180 s, M 178,560 s (49.6 h): sqrt(2 x 180 x 178,560) = 8,017 s (2.23 h).
    Ref: J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974;
    J. T. Daly, FGCS 22(3), 2006 (the same to first order).
    """
    if checkpoint_s < 0 or mtbf_s <= 0:
        raise ValueError(f"need checkpoint_s >= 0 and mtbf_s > 0, got {checkpoint_s}, {mtbf_s}")
    return math.sqrt(2 * checkpoint_s * mtbf_s)


@dataclass(frozen=True)
class Goodput:
    """Time a run loses to interruptions (seconds) and the checkpoint interval it assumes."""

    lost_s: float = 0.0  # periodic checkpoints (when ddplan chose their interval) + restarts + lost work
    interval_s: float = 0.0  # checkpoint interval (0: off)
    interruptions: float = 0.0  # expected over the run
    mtbf_s: float = 0.0  # mean time between interruptions of the job


def goodput(train_s: float, gpus: int, rate_per_gpu_hour: float, checkpoint_s: float, restart_s: float,
            interval_s: float | None = None) -> Goodput:
    """Expected time lost to interruptions over `train_s` seconds of steps on `gpus` GPUs (first order).

    M = 3600 / (rate x gpus); the interval tau is Young's sqrt(2 delta M) unless given (then its checkpoints
    are counted elsewhere, with the run's other checkpoints). Checkpoints: train_s / tau of delta each.
    Interruptions: (train_s + checkpoints) / M, each costing the restart plus half an interval of lost work:
    lost = checkpoints (Young's only) + interruptions x (restart + tau / 2).
    e.g. 100 h of steps on 1,024 GPUs at Llama 3's 1.973e-5 per GPU-hour (M = 49.5 h), delta 180 s, restart
    600 s: tau = 2.225 h, 44.95 checkpoints = 2.248 h, 2.066 interruptions x (0.167 + 1.112) h = 2.642 h;
    4.890 h lost.
    Ref: Young, CACM 17(9), 1974; Llama 3, arXiv 2407.21783, sec. 3.3.4 (the rate).
    """
    if train_s < 0 or gpus < 1 or rate_per_gpu_hour < 0 or checkpoint_s < 0 or restart_s < 0:
        raise ValueError(f"need train_s, rate, checkpoint_s, restart_s >= 0 and gpus >= 1; got {train_s}, "
                         f"{rate_per_gpu_hour}, {checkpoint_s}, {restart_s}, {gpus}")
    if rate_per_gpu_hour == 0 or train_s == 0:
        return Goodput()
    mtbf = HOUR / (rate_per_gpu_hour * gpus)
    chosen = interval_s is None
    tau = young_interval_s(checkpoint_s, mtbf) if chosen else interval_s
    if tau <= 0:  # checkpoints that cost nothing: every failure loses only the restart
        tau = 0.0
    ckpt = train_s / tau * checkpoint_s if (chosen and tau > 0) else 0.0
    failures = (train_s + ckpt) / mtbf
    return Goodput(lost_s=ckpt + failures * (restart_s + tau / 2), interval_s=tau, interruptions=failures,
                   mtbf_s=mtbf)


def interruption_rate(o: RunOverheads, nodes: int) -> float:
    """Interruptions a GPU-hour: the overheads' value, else Llama 3's on more than one node and 0 on one."""
    if o.interruptions_per_gpu_hour is not None:
        return o.interruptions_per_gpu_hour
    return LLAMA3_INTERRUPTIONS_PER_GPU_HOUR if nodes > 1 else 0.0


def steps_for(spec: ModelSpec, budget: Budget, total_batch_tokens: int) -> int:
    """Optimizer steps of a budget: given; ceil(tokens / batch); or ratio x params // batch (nanochat).

    Ref: nanochat base_train.py @00255c1: num_iterations = target_tokens // total_batch_size with
    target_tokens = int(ratio x scaling params).
    """
    if budget.steps is not None:
        return budget.steps
    if budget.tokens is not None:
        return math.ceil(budget.tokens / total_batch_tokens)
    n = {"scaling": scaling_params, "total": total_params,
         "non_embedding": non_embedding_params}[budget.ratio_params](spec.architecture)
    return max(1, int(budget.param_data_ratio * n) // total_batch_tokens)


def evaluations(steps: int, every: int) -> int:
    """Evaluations in a run that evaluates at step 0, every `every` steps and at the last step."""
    if every <= 0:
        return 0
    return steps // every + 1 + (1 if steps % every else 0)


def cost_usd(price: Price, num_gpus: int, gpus_per_node: int, hours: float) -> float:
    """Price of a run: per GPU-hour, or for whole nodes when the offer is billed per node."""
    billed = num_gpus if price.billing == "per_gpu" else math.ceil(num_gpus / gpus_per_node) * gpus_per_node
    return price.usd_per_gpu_hour * billed * hours


def hours(seconds: float) -> float:
    return seconds / HOUR


def outside_steps_s(o: RunOverheads, *, steps: int, eval_every: int, eval_tokens: int, tokens_per_forward: int,
                    forward_s: float, checkpoint_bytes: float, nodes: int) -> float:
    """Seconds outside training steps: start-up + evaluations (forward only) + checkpoints.

    Evaluations: as many forward micro-batches as the eval tokens need, at the step's forward time;
    checkpoints: model + optimizer state written at checkpoint_gbyte_per_s per node (every node writes
    its share), at the end and every checkpoint_every_steps.
    """
    if tokens_per_forward <= 0 or nodes <= 0:
        raise ValueError(f"tokens_per_forward and nodes must be positive, got {tokens_per_forward}, {nodes}")
    eval_s = evaluations(steps, eval_every) * -(-eval_tokens // tokens_per_forward) * forward_s
    n_ckpt = 1 + (steps // o.checkpoint_every_steps if o.checkpoint_every_steps else 0)
    ckpt_s = n_ckpt * checkpoint_bytes / (o.checkpoint_gbyte_per_s * 1e9 * nodes)
    return o.startup_s + eval_s + ckpt_s


def eval_cadence(spec: ModelSpec, o: RunOverheads) -> tuple[int, int]:
    """(every N steps, tokens per evaluation): the overheads' values where given, else the recipe's."""
    ev = spec.recipe.evaluation
    every = o.eval_every_steps if o.eval_every_steps is not None else (ev.every_steps if ev else 0)
    tokens = o.eval_tokens if o.eval_tokens is not None else (ev.tokens if ev else 0)
    return every, tokens
