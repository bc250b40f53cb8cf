"""The optimizer a model spec names, for timing the reference model's training step: AdamW and Muon.

Muon (MomentUm Orthogonalized by Newton-Schulz) follows Keller Jordan's reference implementation,
github.com/KellerJordan/Muon muon.py (`zeropower_via_newtonschulz5`, `muon_update`) and the post
kellerjordan.github.io/posts/muon: SGD momentum 0.95 with Nesterov, then the update of each matrix
replaced by an approximate orthogonalisation, 5 Newton-Schulz steps with the quintic coefficients
(a, b, c) = (3.4445, -4.7750, 2.0315), in bf16 on a GPU (fp32 on CPU, where bf16 matmuls are slow),
scaled by sqrt(max(1, rows / cols)). Matrices of one shape are orthogonalised together as a batch
(modded-nanogpt's batched Muon; nanochat stacks them too). Hyperparameters (learning rates, weight
decay) do not change the time of a step; they are nanochat-like defaults, not a training recipe.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from ddplan.calibrate.reference import param_group
from ddplan.specs import ModelSpec

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan, Muon, muon.py: maximal slope at zero


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximate orthogonalisation U S' V^T of G = U S V^T (S' ~ 0.5..1.5), for G (..., rows, cols).

    X = G / ||G||_F (spectral norm <= 1), then `steps` times: A = X X^T, X = a X + (b A + c A^2) X,
    on the wide orientation (rows <= cols). Runs in bf16 on GPUs and in fp32 on CPU; returns that dtype.
    Ref: Jordan et al., "Muon" (2024), muon.py `zeropower_via_newtonschulz5`.
    """
    if g.ndim < 2:
        raise ValueError(f"Newton-Schulz needs a matrix, got shape {tuple(g.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = g.to(torch.float32 if g.device.type == "cpu" else torch.bfloat16)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        m = x @ x.mT
        x = a * x + (b * m + c * m @ m) @ x
    return x.mT if tall else x


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters: Nesterov momentum, then a Newton-Schulz orthogonalised update.

    update = NS(g.lerp(buf, momentum)) * sqrt(max(1, rows / cols)), after buf.lerp_(g, 1 - momentum);
    p <- p (1 - lr wd) - lr update. Ref: Keller Jordan's muon.py `muon_update`, `Muon.step`.
    """

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
                 ns_steps: int = 5):
        params = list(params)
        bad = [tuple(p.shape) for p in params if p.ndim != 2]
        if bad:
            raise ValueError(f"Muon updates matrices only; got parameters of shapes {bad}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, ns_steps=ns_steps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[(tuple(p.shape), p.dtype)].append(p)
            for params in by_shape.values():
                updates = []
                for p in params:
                    buf = self.state[p].get("momentum_buffer")
                    if buf is None:
                        buf = self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    updates.append(p.grad.lerp(buf, group["momentum"]))  # Nesterov
                ortho = newton_schulz(torch.stack(updates), group["ns_steps"])
                rows, cols = params[0].shape
                scale = max(1.0, rows / cols) ** 0.5
                for p, u in zip(params, ortho.unbind(0)):
                    if group["weight_decay"]:
                        p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(u.to(p.dtype), alpha=-group["lr"] * scale)
        return loss


class Optimizers:
    """Several optimizers stepped as one (AdamW for some groups, Muon for others)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)


def build_optimizer(model: nn.Module, spec: ModelSpec) -> Optimizers:
    """AdamW and Muon over the model's parameters, grouped as spec.recipe.optimizer.algorithm says.

    Each parameter's group comes from its name (ddplan.calibrate.reference.param_group). AdamW keeps
    its state in the parameter's dtype (torch's behaviour; nanochat's `adamw_state_dtype: param`) and
    uses the fused kernel on GPUs, as nanoGPT does; Muon takes spec.recipe.optimizer.muon_ns_steps.
    """
    opt = spec.recipe.optimizer
    chosen: dict[str, list[nn.Parameter]] = {"adamw": [], "muon": []}
    missing = set()
    for name, p in model.named_parameters():
        group = param_group(name)
        if group not in opt.algorithm:
            missing.add(group)
            continue
        chosen[opt.algorithm[group]].append(p)
    if missing:
        raise ValueError(f"recipe.optimizer.algorithm names no algorithm for parameter groups {sorted(missing)}")
    optimizers: list[torch.optim.Optimizer] = []
    if chosen["adamw"]:
        fused = all(p.device.type == "cuda" for p in chosen["adamw"])
        optimizers.append(torch.optim.AdamW(chosen["adamw"], lr=3e-4, betas=(0.8, 0.95), eps=1e-10,
                                            weight_decay=0.0, fused=fused or None))
    if chosen["muon"]:
        optimizers.append(Muon(chosen["muon"], ns_steps=opt.muon_ns_steps))
    return Optimizers(optimizers)
