"""Optimizer state offload to the host (ZeRO-Offload): the bytes it moves and the time the step pays for it.

Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC 2021 (arXiv 2101.06840),
sec. 4: each GPU keeps its parameters (and, by its ZeRO stage, gradients); the optimizer states and the fp32
master weights of the partition it owns live in host memory (ddplan.memory.model_states counts them as 0 on
the GPU). Each step the rank sends its gradient partition to the host as backward produces it, the CPU runs
Adam on the partition (a vectorised, memory-bound CPU Adam, sec. 5.1), and the updated parameter partition
comes back before ZeRO's all-gather. The one-step delayed parameter update (DPU, sec. 5.2), which hides the
CPU step under the next step's forward and backward, is off by default and not modelled; nor are the host's
memory capacity and NVMe offload (ZeRO-Infinity).
"""

from __future__ import annotations

from ddplan.anatomy import adamw_bytes
from ddplan.errors import UsageError
from ddplan.layout import NATIVE_ZERO, Layout
from ddplan.memory import state_share
from ddplan.params import param_counts
from ddplan.specs import HardwareSpec, ModelSpec
from ddplan.units import dtype_bytes

MASTER_BYTES = 4  # CPU Adam keeps fp32 master weights, momentum and variance (sec. 4.1)


def offload_problem(spec: ModelSpec, hw: HardwareSpec) -> str | None:
    """Why --offload-optimizer cannot run for this model on this hardware, or None."""
    muon = sorted(g for g, a in spec.recipe.optimizer.algorithm.items() if a == "muon")
    if muon:
        return (f"ZeRO-Offload runs Adam on the CPU; {spec.name} updates {', '.join(muon)} with Muon, whose "
                f"Newton-Schulz GEMMs have no CPU step modelled")
    if hw.host is None:
        return f"{hw.name}'s spec has no host figures (host.link_gbyte_per_s, host.memory_gbyte_per_s)"
    return None


def check_activation_offload(hw: HardwareSpec, layers: int) -> None:
    """Raise UsageError (naming --offload-activations) when activations cannot be offloaded on this hardware: its spec
    states no host link to copy them over. layers 0: nothing asked."""
    if layers and hw.host is None:
        raise UsageError(f"{hw.name}'s spec has no host link (host.link_gbyte_per_s) to copy activations over",
                         field="--offload-activations")


def check_offload(spec: ModelSpec, hw: HardwareSpec, zeros: tuple[int, ...] | None) -> None:
    """Raise UsageError (naming --offload-optimizer) when optimizer offload cannot apply. zeros: the ZeRO stages
    asked for (() = the model's native one; None: searched, as plan does)."""
    problem = offload_problem(spec, hw)
    if problem:
        raise UsageError(problem, field="--offload-optimizer")
    if zeros is None:  # plan searches the stages: those that can offload will
        return
    stages = zeros or (NATIVE_ZERO[spec.recipe.distribution],)
    if max(stages) == 0:
        raise UsageError("needs ZeRO-1, 2 or 3, whose optimizer-state partitions it moves to the host (got ZeRO-0): "
                         "add --zero 1", field="--offload-optimizer")


def offload_elements(spec: ModelSpec, layout: Layout) -> dict[str, tuple[float, int, int]]:
    """Per group: (elements of the partition this GPU owns, gradient bytes, parameter bytes an element).

    Owned = parameters on the busiest stage's tp rank / the ranks ZeRO shards its states over
    (ddplan.memory.state_share); all of them at one data-parallel rank.
    """
    counts, dt = param_counts(spec.architecture), spec.dtypes
    out = {}
    for group in spec.recipe.optimizer.algorithm:
        if counts[group]:
            share, shard = state_share(spec, layout, group)
            out[group] = (counts[group] * share / shard, dt.grad_bytes(group), dtype_bytes(dt.params[group]))
    return out


def cpu_adam_bytes(elements: float, grad_bytes: int, param_bytes: int) -> float:
    """Host memory traffic of one CPU Adam step over `elements`, bytes.

    bytes = adamw_bytes(elements, 4, grad_bytes, 4) + elements x param_bytes
          = elements x (24 + grad_bytes + param_bytes): read the fp32 master, the gradient as it arrived,
    m and v; write master, m and v; write the updated parameter in the GPU's dtype for the copy back.
    Ref: Ren et al., arXiv 2101.06840, sec. 5.1 (CPU Adam: vectorised, bound by memory bandwidth).
    """
    return adamw_bytes(elements, MASTER_BYTES, grad_bytes, MASTER_BYTES) + elements * param_bytes


def offload_step_s(to_host_bytes: float, from_host_bytes: float, adam_bytes: float, link_bytes_per_s: float,
                   host_bytes_per_s: float, bwd_s: float) -> float:
    """Seconds the offloaded optimizer step adds to the critical path of one step (no DPU).

    t = max(0, to_host / link - bwd) + adam_bytes / host_bw + from_host / link
    The gradient copies run as backward produces the gradients, hidden up to the last micro-batch's backward
    (sec. 4.2: "each gradient transfer can be overlapped with the backpropagation on the remainder of the
    backward graph"); the CPU step and the copy of the updated parameters back follow backward (sec. 4.2-4.3).
    Ref: Ren et al., "ZeRO-Offload", USENIX ATC 2021 (arXiv 2101.06840), sec. 4.2-4.3, 5.2 (DPU, off).
    """
    if min(link_bytes_per_s, host_bytes_per_s) <= 0:
        raise ValueError(f"need positive bandwidths, got link {link_bytes_per_s}, host {host_bytes_per_s} bytes/s")
    return (max(0.0, to_host_bytes / link_bytes_per_s - bwd_s) + adam_bytes / host_bytes_per_s
            + from_host_bytes / link_bytes_per_s)


def host_bytes_per_s_per_gpu(hw: HardwareSpec, layout: Layout) -> float:
    """The host memory bandwidth one GPU's CPU Adam gets: the node's, split evenly over the GPUs of the job on
    it, min(num_gpus, gpus_per_node) (assumed: one process per GPU, DeepSpeed's launch)."""
    assert hw.host is not None
    return hw.host.memory_bytes_per_s / min(layout.num_gpus, hw.gpus_per_node)


def offload_time_s(spec: ModelSpec, hw: HardwareSpec, layout: Layout, bwd_s: float) -> float:
    """offload_step_s for a layout: its owned partition's gradients to the host and parameters back over
    hw.host.link_gbyte_per_s, CPU Adam at host_bytes_per_s_per_gpu. The step's optimizer_s (StepTime)."""
    problem = offload_problem(spec, hw)
    if problem:
        raise UsageError(problem, field="--offload-optimizer")
    owned = offload_elements(spec, layout).values()
    to_host = sum(n * gb for n, gb, _ in owned)
    from_host = sum(n * pb for n, _, pb in owned)
    adam = sum(cpu_adam_bytes(n, gb, pb) for n, gb, pb in owned)
    return offload_step_s(to_host, from_host, adam, hw.host.link_bytes_per_s, host_bytes_per_s_per_gpu(hw, layout),
                          bwd_s)


def activation_offload_exposed_s(sent_bytes: float, link_bytes_per_s: float, forward_s: float,
                                 backward_s: float) -> float:
    """Seconds a micro-batch waits on activation offload (Megatron-Core --cpu-offloading, Transformer Engine's
    offload of the first N layers' saved tensors): the copies to the host run on their own stream under the forward
    and the reloads under the backward, so each direction costs what its copy time exceeds that pass by:
    max(0, sent / link - forward) + max(0, sent / link - backward). The copy engines move the bytes, not the SMs, so
    nothing is added for the compute they overlap. e.g. 165 GiB at 200 GB/s (0.886 s) under a 2.6 s forward and
    5.2 s backward: 0; over PCIe at 50 GB/s (3.54 s): 0.94 s. Ref: NVIDIA/TransformerEngine
    transformer_engine/pytorch/cpu_offload.py@00382b96 (OffloadSynchronizer: offload_stream, layer i's copy finished
    before layer L - N + i's forward, reloads started N layers ahead in backward)."""
    if min(sent_bytes, forward_s, backward_s) < 0 or link_bytes_per_s <= 0:
        raise ValueError(f"need sent, forward, backward >= 0 and link > 0; got {sent_bytes}, {forward_s}, "
                         f"{backward_s}, {link_bytes_per_s}")
    copy = sent_bytes / link_bytes_per_s
    return max(0.0, copy - forward_s) + max(0.0, copy - backward_s)
