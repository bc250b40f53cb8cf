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
      1 GB/s per node, a network file system).
    """

    startup_s: float = 300.0
    eval_every_steps: int | None = None  # None: the recipe's
    eval_tokens: int | None = None
    checkpoint_every_steps: int = 0
    checkpoint_gbyte_per_s: float = 1.0


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
