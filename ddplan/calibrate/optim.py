"""The optimizer a model spec names, for timing the reference model's training step: AdamW and Muon.

Muon (MomentUm Orthogonalized by Newton-Schulz) follows Keller Jordan's reference implementation,
github.com/KellerJordan/Muon muon.py (`zeropower_via_newtonschulz5`, `muon_update`) and the post
kellerjordan.github.io/posts/muon: SGD momentum 0.95 with Nesterov, then the update of each matrix
replaced by an approximate orthogonalisation, 5 Newton-Schulz steps with the quintic coefficients
(a, b, c) = (3.4445, -4.7750, 2.0315), in bf16 on a GPU (fp32 on CPU, where bf16 matmuls are slow),
scaled by sqrt(max(1, rows / cols)). Matrices of one shape are orthogonalised together as a batch
(modded-nanogpt's batched Muon; nanochat stacks them too). Hyperparameters (learning rates, weight
decay) do not change the time of a step; they are nanochat-like defaults, not a training recipe.

Compiled, as nanochat runs them (nanochat/optim.py: `adamw_step_fused` and `muon_step_fused`, each
`@torch.compile(dynamic=False, fullgraph=True)`): the update of one parameter (AdamW) or one stack of
same-shape matrices (Muon) is a single function, `adamw_step` / `muon_step`, which runs as is (eager) or
torch.compile'd; hyperparameters and the step count are 0-d tensors, so a new step recompiles nothing.
Deliberate differences from nanochat's kernels, none of which changes the GEMMs: the Newton-Schulz
quintic instead of Polar Express's per-step coefficients (the same three products per step), no NorMuon
second moment and plain instead of cautious weight decay (a few elementwise passes fewer), and fp32
instead of bf16 Newton-Schulz on CPU.
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


def muon_step(stacked_grads: torch.Tensor, stacked_params: torch.Tensor, momentum_buffer: torch.Tensor,
              momentum_t: torch.Tensor, lr_t: torch.Tensor, wd_t: torch.Tensor, scale: float, ns_steps: int) -> None:
    """One Muon update of K same-shape matrices stacked as (K, rows, cols), in place.

    buf <- buf.lerp(g, 1 - momentum); u = NS(g.lerp(buf, momentum)) (Nesterov);
    p <- p (1 - lr wd) - lr scale u, scale = sqrt(max(1, rows / cols)).
    Ref: Keller Jordan's muon.py `muon_update`, `Muon.step`; nanochat optim.py `muon_step_fused` (the same
    shape: one stacked call per shape group, compiled).
    """
    momentum = momentum_t.to(stacked_grads.dtype)
    momentum_buffer.lerp_(stacked_grads, 1 - momentum)
    update = newton_schulz(stacked_grads.lerp(momentum_buffer, momentum), ns_steps)
    lr = lr_t.to(stacked_params.dtype)
    stacked_params.mul_(1 - lr * wd_t.to(stacked_params.dtype))
    stacked_params.sub_(update.to(stacked_params.dtype) * (lr * scale))


def adamw_step(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               step_t: torch.Tensor, lr_t: torch.Tensor, beta1_t: torch.Tensor, beta2_t: torch.Tensor,
               eps_t: torch.Tensor, wd_t: torch.Tensor) -> None:
    """One AdamW update of one parameter, in place (decoupled weight decay, bias-corrected moments).

    p <- p (1 - lr wd); m <- m.lerp(g, 1 - b1); v <- v.lerp(g^2, 1 - b2);
    p <- p - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps).
    Ref: Loshchilov & Hutter, arXiv 1711.05101, Alg. 2; nanochat optim.py `adamw_step_fused`.
    """
    p.mul_(1 - lr_t * wd_t)
    exp_avg.lerp_(grad, 1 - beta1_t)
    exp_avg_sq.lerp_(grad.square(), 1 - beta2_t)
    bias1 = 1 - beta1_t ** step_t
    bias2 = 1 - beta2_t ** step_t
    p.add_(exp_avg / ((exp_avg_sq / bias2).sqrt() + eps_t), alpha=-(lr_t / bias1))


def kernel(fn, compiled: bool):
    """fn as nanochat runs its optimizer kernels, torch.compile(dynamic=False, fullgraph=True), or as is."""
    return torch.compile(fn, dynamic=False, fullgraph=True) if compiled else fn


def _scalar(value: float, device) -> torch.Tensor:
    # 0-d tensors, as nanochat keeps its hyperparameters: a compiled kernel takes them as inputs (a
    # Python number would be a constant of the graph, and a new step count a recompilation); on the
    # parameters' device, which eager ops need
    return torch.tensor(value, dtype=torch.float32, device=device)


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters: Nesterov momentum, then a Newton-Schulz orthogonalised update (`muon_step`).

    Parameters of one shape are stacked, updated by one `muon_step` call (torch.compile'd when
    compiled) and copied back, as nanochat does; the momentum buffer is kept stacked, per shape.
    """

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
                 ns_steps: int = 5, compiled: bool = False):
        params = list(params)
        bad = [tuple(p.shape) for p in params if p.ndim != 2]
        if bad:
            raise ValueError(f"Muon updates matrices only; got parameters of shapes {bad}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, ns_steps=ns_steps))
        self.step_fn = kernel(muon_step, compiled)
        self.compiled = compiled
        self.buffers: dict[tuple, torch.Tensor] = {}
        self._scalars: dict[tuple, list[torch.Tensor]] = {}

    def _hyper(self, group: dict, device) -> list[torch.Tensor]:
        key = (id(group), str(device))
        if key not in self._scalars:
            self._scalars[key] = [_scalar(group[k], device) for k in ("momentum", "lr", "weight_decay")]
        return self._scalars[key]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for gi, group in enumerate(self.param_groups):
            by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[(tuple(p.shape), p.dtype)].append(p)
            for key, params in by_shape.items():
                hyper = self._hyper(group, params[0].device)
                grads = torch.stack([p.grad for p in params])
                stacked = torch.stack(params)
                buf = self.buffers.get((gi, *key))
                if buf is None:
                    buf = self.buffers[(gi, *key)] = torch.zeros_like(grads)
                rows, cols = params[0].shape
                self.step_fn(grads, stacked, buf, *hyper, max(1.0, rows / cols) ** 0.5, group["ns_steps"])
                torch._foreach_copy_(params, list(stacked.unbind(0)))
        return loss


class AdamW(torch.optim.Optimizer):
    """AdamW one parameter at a time through `adamw_step` (torch.compile'd when compiled): nanochat's
    program. State in the parameter's dtype (nanochat's `adamw_state_dtype: param`)."""

    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.8, 0.95), eps: float = 1e-10,
                 weight_decay: float = 0.0, compiled: bool = False):
        super().__init__(list(params), dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.step_fn = kernel(adamw_step, compiled)
        self.compiled = compiled
        self.steps = 0
        self._scalars: dict[tuple, list[torch.Tensor]] = {}  # (group, device) -> step, lr, b1, b2, eps, wd

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        self.steps += 1
        for scalars in self._scalars.values():
            scalars[0].fill_(self.steps)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                key = (id(group), str(p.device))
                if key not in self._scalars:
                    b1, b2 = group["betas"]
                    self._scalars[key] = [_scalar(v, p.device) for v in
                                          (self.steps, group["lr"], b1, b2, group["eps"], group["weight_decay"])]
                state = self.state[p]
                if not state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                self.step_fn(p, p.grad, state["exp_avg"], state["exp_avg_sq"], *self._scalars[key])
        return loss


class Optimizers:
    """Several optimizers stepped as one (AdamW for some groups, Muon for others)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def compiled(self) -> bool:
        """Whether the update kernels are torch.compile'd (all of them, or none: build_optimizer)."""
        return any(getattr(opt, "compiled", False) for opt in self.optimizers)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)


def build_optimizer(model: nn.Module, spec: ModelSpec, compiled: bool = False) -> Optimizers:
    """AdamW and Muon over the model's parameters, grouped as spec.recipe.optimizer.algorithm says.

    Each parameter's group comes from its name (ddplan.calibrate.reference.param_group). AdamW keeps
    its state in the parameter's dtype (torch's behaviour; nanochat's `adamw_state_dtype: param`);
    Muon takes spec.recipe.optimizer.muon_ns_steps. Eager: torch.optim.AdamW (the fused kernel on GPUs,
    as nanoGPT runs it) and Muon's `muon_step` as is. compiled: nanochat's program, the `adamw_step` and
    `muon_step` kernels torch.compile'd (compilation happens at the first step).
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
    if chosen["adamw"] and compiled:
        optimizers.append(AdamW(chosen["adamw"], compiled=True))
    elif chosen["adamw"]:
        fused = all(p.device.type == "cuda" for p in chosen["adamw"])
        optimizers.append(torch.optim.AdamW(chosen["adamw"], lr=3e-4, betas=(0.8, 0.95), eps=1e-10,
                                            weight_decay=0.0, fused=fused or None))
    if chosen["muon"]:
        optimizers.append(Muon(chosen["muon"], ns_steps=opt.muon_ns_steps, compiled=compiled))
    return Optimizers(optimizers)
