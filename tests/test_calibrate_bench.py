"""ddplan.calibrate.bench and .optim on CPU with tiny shapes: the benchmarks run and return sane numbers.

No timed assertions (only positive and finite); GPU-only backends must answer None here.
"""

from __future__ import annotations

import math
import time

import pytest

torch = pytest.importorskip("torch")

from ddplan.calibrate import bench  # noqa: E402
from ddplan.calibrate.optim import AdamW, Muon, build_optimizer, newton_schulz  # noqa: E402
from ddplan.calibrate.reference import build_model  # noqa: E402
from ddplan.calibration import Provenance  # noqa: E402
from ddplan.nanochat import nanochat_spec  # noqa: E402
from ddplan.registry import load_model  # noqa: E402
from ddplan.specs import ModelSpec  # noqa: E402

SEQ = 128


def shrink(spec: ModelSpec, **arch) -> ModelSpec:
    data = spec.model_dump()
    data["architecture"].update(arch)
    data["recipe"].update(seq_len=SEQ, total_batch_tokens=8 * SEQ)
    return ModelSpec.model_validate(data)


def nanochat_tiny() -> ModelSpec:
    return shrink(nanochat_spec(2), vocab_size=512)


def gpt2_tiny() -> ModelSpec:
    return shrink(load_model("gpt2-124m"), num_layers=1, d_model=64, num_heads=4, num_kv_heads=4, head_dim=16,
                  vocab_size=512, max_seq_len=SEQ, mlp_hidden_dim=256)


def positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def test_provenance_validates_on_cpu():
    p = Provenance.model_validate(bench.device_provenance("cpu"))
    assert p.backend == "cpu" and p.device_count == 1 and p.torch == torch.__version__
    assert p.date.tzinfo is not None


def test_gemm_shapes_d24_cover_every_linear_forward_and_backward():
    spec = load_model("nanochat-d24")
    shapes = bench.gemm_shapes(spec, [32])
    by_shape = {(m, n, k): label for m, n, k, label in shapes}
    t = 32 * 2048
    assert by_shape[(t, 6144, 1536)] == "h*.mlp.c_fc fwd (+1 same shape)"  # and h*.mlp.c_proj dX
    assert by_shape[(t, 32768, 1536)] == "lm_head fwd"
    assert by_shape[(t, 1536, 32768)] == "lm_head dX"
    assert by_shape[(1536, 32768, t)] == "lm_head dW"
    assert (1536, 6144, t) in by_shape and (t, 1536, 6144) in by_shape  # c_fc dW; c_fc dX = c_proj fwd
    assert len(by_shape) == len(shapes)  # distinct
    assert all("h*" in label or not label.startswith("h") for label in by_shape.values())
    # Muon's Newton-Schulz on the 1536 x 6144 MLP matrices: X X^T (1536, 1536, 6144), B X (1536, 6144, 1536);
    # A A and the square attention matrices share (1536, 1536, 1536)
    assert by_shape[(1536, 1536, 6144)].startswith("muon 1536x6144 X X^T")
    assert by_shape[(1536, 6144, 1536)].startswith("muon 1536x6144 B X")
    assert "muon 1536x1536" in by_shape[(1536, 1536, 1536)]
    muon = [s for s in shapes if s[3].startswith("muon")]  # the optimizer's shapes do not depend on the batch
    two = bench.gemm_shapes(spec, [16, 32])
    assert (16 * 2048, 6144, 1536, "h*.mlp.c_fc fwd (+1 same shape)") in two
    assert len(two) == 2 * (len(shapes) - len(muon)) + len(muon)


def test_bench_gemm_cpu():
    assert positive(bench.bench_gemm(64, 64, 64, dtype="fp32", device="cpu", quick=True))
    assert positive(bench.bench_gemm(48, 80, 24, dtype="bf16", device="cpu", quick=True))


@pytest.mark.parametrize("role", bench.GEMM_ROLES)
def test_bench_gemm_times_each_role_in_its_training_layout(role, monkeypatch):
    """fwd: x @ W^T (the weight stored n x k); dX: dY @ W (stored as is); dW: dY^T @ x as autograd runs it,
    an (n x m) result for gemm_shapes' (k_in, n_out, m_tokens): the same 2 m n k FLOPs either way."""
    seen = []
    real_mm = torch.mm

    def mm(a, b, out=None):
        seen.append((tuple(a.shape), a.is_contiguous(), tuple(b.shape), b.is_contiguous(), tuple(out.shape)))
        return real_mm(a, b, out=out)

    monkeypatch.setattr(torch, "mm", mm)
    m, n, k = 24, 40, 56
    assert positive(bench.bench_gemm_stats(m, n, k, dtype="fp32", device="cpu", quick=True, role=role)[0])
    expected = {"fwd": ((m, k), True, (k, n), False, (m, n)), "dX": ((m, k), True, (k, n), True, (m, n)),
                "dW": ((n, k), False, (k, m), True, (n, m))}[role]
    assert set(seen) == {expected}


def test_gemm_role_from_the_shape_label():
    assert [bench.gemm_role(lbl) for lbl in ("h*.attn.c_q fwd (+7 same shape)", "lm_head dX", "h*.mlp.c_fc dW",
                                             "muon 128x128 X X^T (+4 same shape)", "muon 128x128 A A",
                                             "muon 128x512 B X")] == ["fwd", "dX", "dW", "fwd", "dX", "dX"]
    with pytest.raises(ValueError, match="role must be one of fwd, dX, dW"):
        bench.bench_gemm_stats(2, 2, 2, device="cpu", dtype="fp32", role="dY")


def test_bench_peak_gemm_cpu_quick():
    tflops, shape = bench.bench_peak_gemm(dtype="fp32", device="cpu", quick=True)
    assert positive(tflops) and max(shape) <= 1024


@pytest.mark.parametrize("impl", ["sdpa-math", "sdpa-fused"])
@pytest.mark.parametrize("window", [128, 32])
def test_bench_attention_cpu(impl, window):
    out = bench.bench_attention(impl, batch=1, heads=2, seq_len=128, window=window, head_dim=32, dtype="fp32",
                                device="cpu", quick=True)
    assert out is not None and all(positive(x) for x in out)


@pytest.mark.parametrize("impl", ["sdpa-cudnn", "fa2", "flash-attn-ck", "fa3", "cudnn"])
def test_bench_attention_unavailable_on_cpu_is_none(impl):
    assert bench.bench_attention(impl, batch=1, heads=2, seq_len=64, window=64, head_dim=32, dtype="fp32",
                                 device="cpu", quick=True) is None


def test_every_specs_attention_has_a_benchmark():
    """calibrate times each hardware spec's default attention implementations: every one must be a name
    bench_attention knows (the b200/gb200 `cudnn` through PyTorch's cuDNN SDPA backend), or the stage skips it."""
    from ddplan.registry import builtin_names, load_hardware

    for name in builtin_names("hardware"):
        for impl in load_hardware(name).default_attention_impls():
            assert impl.name in bench.ATTENTION_IMPLS, (name, impl.name)
    # a window cuDNN would skip natively cannot be timed through SDPA (a mask computes it all): not timed
    assert bench.bench_attention("cudnn", batch=1, heads=2, seq_len=64, window=16, head_dim=32, dtype="fp32",
                                 device="cpu", quick=True) is None


def test_attention_flops_convention():
    # full window: s(s+1)/2 causal pairs for every implementation
    f, b = bench.attention_flops(batch=2, heads=3, seq_len=8, window=8, head_dim=4, impl="sdpa-fused")
    assert (f, b) == (4.0 * 2 * 3 * 36 * 4, 8.0 * 2 * 3 * 36 * 4)
    # window 2 (3 keys per query): flash packages count 1 + 2 + 3 * 6 = 21 pairs; SDPA (a mask) the full 36
    assert bench.attention_flops(batch=1, heads=1, seq_len=8, window=2, head_dim=1, impl="fa3")[0] == 4.0 * 21
    assert bench.attention_flops(batch=1, heads=1, seq_len=8, window=2, head_dim=1, impl="sdpa-math")[0] == 4.0 * 36


def test_bench_attention_rejects_unknown_impl():
    with pytest.raises(ValueError, match="allowed"):
        bench.bench_attention("xformers", batch=1, heads=1, seq_len=8, window=8, head_dim=8, device="cpu")


def test_bench_hbm_and_overhead_cpu():
    assert positive(bench.bench_hbm("cpu", nbytes=4 * 2**20, quick=True))
    assert positive(bench.bench_kernel_overhead_us("cpu", quick=True))


@pytest.mark.parametrize("make", [nanochat_tiny, gpt2_tiny], ids=["nanochat-d2", "gpt2"])
def test_bench_train_step_cpu(make):
    r = bench.bench_train_step(make(), batch=2, seq_len=SEQ, attention="sdpa-fused", device="cpu",
                               dtype_policy="fp32", steps=2, warmup=1)
    assert positive(r["step_time_s"]) and all(positive(r[k]) for k in ("fwd_s", "bwd_s", "optimizer_s"))
    assert r["peak_memory_gb"] is None and math.isfinite(r["loss"])
    assert (r["device_batch_size"], r["total_batch_tokens"], r["compiled"]) == (2, 2 * SEQ, False)
    # counted on CPU where there is getrusage (None on Windows)
    assert r["page_faults"] is None or (isinstance(r["page_faults"], (int, float)) and r["page_faults"] >= 0)


def test_the_speed_probe_runs_between_timed_steps_only():
    """between() runs once after each timed step (none after the warm-up), outside the step's time."""
    calls = []
    r = bench.bench_train_step(nanochat_tiny(), batch=1, seq_len=SEQ, device="cpu", dtype_policy="fp32", steps=3,
                               warmup=1, between=lambda: calls.append(time.perf_counter()))
    assert len(calls) == 3 and positive(r["step_time_s"])
    assert positive(bench.bench_probe_s("cpu", dtype="fp32"))
    assert bench.probe_words("cpu", "fp32") == "fp32 512x512x512 GEMM, median of 5"


def test_the_probes_before_a_run_are_the_cpus_only():
    """calibrate probes the machine's speed before its first estimate on CPU (eta.FIRST_PROBES times); on a GPU
    there is no quiet figure to compare with, so none run."""
    from ddplan.calibrate import eta, runner

    times = runner.first_probes_s("cpu")
    assert len(times) == eta.FIRST_PROBES and all(positive(t) for t in times)
    assert runner.first_probes_s("cuda") == ()


INDUCTOR = pytest.mark.xdist_group("inductor")  # one worker compiles them all: Inductor starts once, not thrice


@pytest.mark.slow
@INDUCTOR
def test_bench_train_step_compiled_cpu():
    """The step as a compiled run runs it (nanochat's base_train.py): torch.compile(model, dynamic=False) and
    compiled optimizer kernels; compilation in the warm-up step (taken even when warmup=0 is asked), recorded as
    compiled. On the tiny GPT-2 (AdamW): Inductor compiling nanochat's Muon kernels is
    test_muon_step_times_eager_and_compiled's, and the tiny nanochat's whole step took 66-83 s with a cold
    compile cache on a 2-core machine, against ~52 s for this GPT-2 at 2 layers and ~45 s at the one layer
    used here (what is tested, compiling a model and its optimizer, needs no second block)."""
    r = bench.bench_train_step(gpt2_tiny(), batch=1, seq_len=SEQ, device="cpu", dtype_policy="fp32", steps=1,
                               warmup=0, compile_model=True, compile_optimizer=True)
    assert (r["compiled"], r["compiled_optimizer"], r["compile_notes"]) == (True, True, [])
    assert positive(r["first_step_s"]) and positive(r["step_time_s"]) and math.isfinite(r["loss"])


def test_a_failing_compile_runs_eager_and_says_why(monkeypatch):
    """torch.compile that fails when called (no C++ compiler, no Triton): the model and the optimizer run
    eager, the step is still measured, and the reasons are in compile_notes."""
    def broken_compile(fn, **kwargs):
        def call(*a, **k):
            raise RuntimeError("backend='inductor' raised:\nInvalidCxxCompiler: No working C++ compiler found")
        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    r = bench.bench_train_step(nanochat_tiny(), batch=1, seq_len=SEQ, device="cpu", dtype_policy="fp32", steps=1,
                               warmup=1, compile_model=True, compile_optimizer=True)
    assert (r["compiled"], r["compiled_optimizer"]) == (False, False) and positive(r["step_time_s"])
    model_note, optimizer_note = r["compile_notes"]
    assert model_note.startswith("the model ran eager") and "No working C++ compiler" in model_note
    assert optimizer_note.startswith("the optimizer ran eager") and "RuntimeError" in optimizer_note


@INDUCTOR
def test_loss_head_times_eager_and_compiled():
    """The elementwise chain after the lm_head runs eager and torch.compile'd (as a compiled step runs its
    head); forward and forward + backward give positive, finite times. No timed comparison: speed is for
    benchmarks/."""
    for compiled in (False, True):
        fwd, both = bench.bench_loss_head_s("cpu", rows=64, vocab=256, softcap=15.0, quick=True, compiled=compiled)
        assert 0 < fwd < math.inf and 0 < both < math.inf


@INDUCTOR
def test_muon_step_times_eager_and_compiled():
    """One Muon step over a stack of small matrices, eager and compiled (as nanochat's optimizer runs): a
    positive, finite time; bad sizes are refused."""
    for compiled in (False, True):
        t = bench.bench_muon_s("cpu", rows=32, cols=64, count=3, quick=True, compiled=compiled)
        assert 0 < t < math.inf
    with pytest.raises(ValueError):
        bench.bench_muon_s("cpu", rows=0, cols=64, count=3)


def test_bench_adamw_splits_its_elements_over_separate_copies(monkeypatch):
    """The AdamW rate is over `copies` separate allocations holding numel elements in all (one allocation
    alone measured up to 1.5x off on a shared CPU): 4096 over 3 is 1365 + 1365 + 1366. No copies, or more
    copies than elements, is an error."""
    sizes = []
    real = torch.optim.AdamW

    def recording(params, **kw):
        sizes.extend(p.numel() for p in params)
        return real(params, **kw)

    monkeypatch.setattr(bench.torch.optim, "AdamW", recording)
    assert positive(bench.bench_adamw_s("cpu", numel=4096, quick=True, copies=3))
    assert sizes == [1365, 1365, 1366]
    with pytest.raises(ValueError, match="copies <= numel"):
        bench.bench_adamw_s("cpu", numel=4096, copies=0)
    with pytest.raises(ValueError, match="copies <= numel"):
        bench.bench_adamw_s("cpu", numel=2, copies=3)


def test_adamw_kernel_is_torch_adamw():
    """adamw_step (the kernel nanochat compiles) against torch.optim.AdamW: same update, three steps."""
    p0, g = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)), torch.randn(16, 8)
    out = []
    for make in (lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1),
                 lambda ps: AdamW(ps, lr=1e-2, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1)):
        p = torch.nn.Parameter(p0.clone())
        opt = make([p])
        for i in range(3):
            p.grad = g * (i + 1)
            opt.step()
        out.append(p.detach())
    torch.testing.assert_close(out[0], out[1], rtol=1e-6, atol=1e-6)


def test_muon_update_is_newton_schulz_of_the_nesterov_momentum():
    """One Muon step from zero momentum, by hand: buf = (1 - m) g; Nesterov g.lerp(buf, m) = (1 - m)(1 + m) g;
    p <- p - lr sqrt(max(1, rows / cols)) NS(that), for two same-shape matrices updated as one stack."""
    gen = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(32, 16, generator=gen)) for _ in range(2)]
    grads = [torch.randn(32, 16, generator=gen) for _ in ps]
    before = [p.detach().clone() for p in ps]
    for p, g in zip(ps, grads):
        p.grad = g
    m = 0.95
    Muon(ps, lr=0.02, momentum=m).step()
    for p, b, g in zip(ps, before, grads):
        expected = b - 0.02 * 2**0.5 * newton_schulz((1 - m) * (1 + m) * g, 5)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-5)


def test_newton_schulz_orthogonalises():
    g = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    sv = torch.linalg.svdvals(newton_schulz(g, 5).float())
    assert sv.min() >= 0.5 and sv.max() <= 1.5
    sv_tall = torch.linalg.svdvals(newton_schulz(g.T, 5).float())
    assert sv_tall.min() >= 0.5 and sv_tall.max() <= 1.5


def test_muon_refuses_non_matrices():
    with pytest.raises(ValueError, match="matrices"):
        Muon([torch.nn.Parameter(torch.zeros(3))])


def test_build_optimizer_follows_the_spec_groups():
    spec = nanochat_tiny()
    model = build_model(spec, attention="sdpa-fused", recompute="none", seq_len=SEQ, dtype_policy="fp32")
    opt = build_optimizer(model, spec)
    kinds = {type(o).__name__: sum(p.numel() for g in o.param_groups for p in g["params"]) for o in opt.optimizers}
    muon_groups = [g for g, a in spec.recipe.optimizer.algorithm.items() if a == "muon"]
    from ddplan.calibrate.reference import count_params

    counts = count_params(model)
    assert kinds["Muon"] == sum(counts[g] for g in muon_groups)
    assert kinds["AdamW"] == sum(counts.values()) - kinds["Muon"]
    idx = torch.randint(0, 512, (1, SEQ))
    before = [p.detach().clone() for p in model.parameters()]
    model(idx, idx).backward()
    opt.step()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_outside_allocator_is_device_use_less_what_torch_reserved(monkeypatch):
    """Hand: 80 GB total, 30 GB free, 45 GB reserved by torch's allocator: 5 GB outside it (context, kernels,
    library handles, other processes); never negative (a reading taken while the allocator grows)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (30e9, 80e9))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 45e9)
    assert bench.outside_allocator_bytes("cuda:0") == 5e9
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 55e9)
    assert bench.outside_allocator_bytes("cuda:0") == 0.0
