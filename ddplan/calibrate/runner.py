"""`ddplan calibrate`: run the micro-benchmarks, write the calibration file, check the model against a real step.

Order: provenance, GEMMs at the model's own shapes, a short peak-GEMM sweep, attention per
implementation, HBM copy, kernel launch overhead, collectives (under torchrun, several GPUs only),
then one real training step, which is held out: the efficiencies come from the micro-benchmarks
alone, and the closing table compares the model's prediction for that step with the measurement,
before and after calibration. The file is rewritten atomically after every benchmark, so an
interrupted or failing run keeps what it measured, with the failure recorded.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from ddplan.calibration import CalibrationSpec
from ddplan.specs import HardwareSpec, ModelSpec

# hardware spec names by substrings of torch.cuda.get_device_name()
DEVICE_NAMES = (("MI355", "mi355x"), ("MI325", "mi325x"), ("MI300", "mi300x"), ("H200", "h200"),
                ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("B200", "b200"), ("A100", "a100-sxm-80gb"))


def guess_hardware(device_name: str) -> str | None:
    for key, name in DEVICE_NAMES:
        if key.lower() in device_name.lower():
            return name
    return None


def atomic_write(path: Path, text: str) -> None:
    """Write text to path via a temporary file in the same folder and os.replace: never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class Recorder:
    """The calibration file being built; every update is validated and written atomically."""

    path: Path
    data: dict = field(default_factory=dict)

    def set(self, key: str, value) -> None:
        self.data[key] = value
        self.flush()

    def append(self, key: str, values: list) -> None:
        self.data.setdefault(key, []).extend(values)
        self.flush()

    def fail(self, what: str, err: BaseException) -> None:
        msg = " ".join(f"{what}: {type(err).__name__}: {err}".split())
        self.data.setdefault("failures", []).append(msg[:500])
        self.flush()

    def flush(self) -> None:
        # validate first: never write a file ddplan could not read back; dump plain JSON types
        plain = CalibrationSpec.model_validate(self.data).model_dump(mode="json", exclude_none=True)
        atomic_write(self.path, "# written by `ddplan calibrate`; see ddplan/calibration.py for the format\n"
                     + yaml.safe_dump(plain, sort_keys=False, width=110))


def cpu_hardware(peak: float, hbm: float, overhead_us: float, src: str, provenance: dict) -> HardwareSpec:
    """A hardware spec for this CPU, built from its own measurements (there is no datasheet figure to use).

    Peak = the best measured fp32 GEMM (so GEMM efficiencies are fractions of what this machine can
    do), HBM = measured copy bandwidth; attention and GEMM efficiencies come from measured points.
    """
    sourced = {"value": peak, "source": src}
    eff = {"value": 1.0, "basis": "measured", "source": src}
    busbw = {"value": 1.0, "source": "assumed: a single CPU process has no fabric"}
    return HardwareSpec.model_validate({
        "kind": "hardware", "name": "cpu-local", "display_name": f"this CPU ({provenance.get('device_name', 'cpu')})",
        "vendor": "nvidia", "software_stack": "cuda",
        "peak": {"bf16_tflops": sourced, "fp8_tflops": None, "tf32_tflops": None, "fp32_vector_tflops": sourced},
        "memory": {"usable_gib": {"value": 16.0, "source": "assumed"}, "vendor_label_gb": 16.0,
                   "hbm_tbyte_per_s": {"value": hbm, "source": src}},
        "gpus_per_node": 2,
        "intra_node": {"topology": "pcie", "links_per_gpu": 1,
                       "link_gbyte_per_s_per_direction": busbw,
                       "busbw_gbyte_per_s": {c: {2: busbw} for c in ("all_reduce", "reduce_scatter", "all_gather")},
                       "latency_us": {"value": 10.0, "source": "assumed"}},
        "inter_node": {"nics_per_node": 1, "nic_gbit_per_s": {"value": 10.0, "source": "assumed"},
                       "fabric": "ethernet",
                       "busbw_fraction_of_nics": {"value": 0.5, "basis": "assumed", "source": "assumed"},
                       "latency_us": {"value": 50.0, "source": "assumed"}},
        "prices": [{"usd_per_gpu_hour": 0.1, "billing": "per_gpu", "provider": "local", "date": dt.date.today(),
                    "source": "assumed: a placeholder for a local CPU"}],
        "efficiency": {"gemm": {"best": eff, "half_dim": {"value": 1.0, "source": "unused: measured points"}},
                       "hbm": eff, "kernel_overhead_us": {"value": overhead_us, "source": src}},
        "attention": [{"name": n, "kind": k, "windows": "mask", "efficiency_fwd": eff, "efficiency_bwd": eff,
                       "description": f"PyTorch SDPA on CPU ({n})"}
                      for n, k in (("sdpa-math", "unfused_math"), ("sdpa-fused", "fused_sdpa"))],
        "default_attention": "sdpa-fused",
    })


@dataclass(frozen=True)
class CalibrateRequest:
    model: ModelSpec
    hardware: HardwareSpec | None  # None: guessed from the device name, or built from measurements on CPU
    device: str  # "cpu" or "cuda" (ROCm GPUs are "cuda" to torch)
    out: Path
    quick: bool = False
    micro_batches: tuple[int, ...] = ()  # () = the recipe's device batch and its halves down to /4
    attention: tuple[str, ...] = ()  # () = every implementation the hardware spec lists
    nproc: int = 1  # GPUs on this node for the collectives (torchrun)
    seq_len: int | None = None
    step_batch: int | None = None  # micro-batch of the held-out training step (default: the recipe's)


Progress = Callable[[str], None]


def run(req: CalibrateRequest, progress: Progress = lambda msg: None) -> tuple[CalibrationSpec, HardwareSpec, dict]:
    """Run every benchmark; return the calibration, the hardware spec it refines, and the held-out step."""
    from ddplan.calibrate import bench

    spec, device = req.model, req.device
    seq = req.seq_len or spec.recipe.seq_len
    mb0 = req.step_batch or spec.recipe.device_batch_size
    batches = req.micro_batches or tuple(sorted({max(1, mb0 // 4), max(1, mb0 // 2), mb0}))
    dtype_policy = "fp32" if device == "cpu" else "spec"
    gemm_dtype = "fp32" if device == "cpu" else spec.dtypes.compute
    prov = bench.device_provenance(device)
    hw = req.hardware
    hw_name = hw.name if hw else (guess_hardware(prov.get("device_name", "")) or ("cpu-local" if device == "cpu"
                                                                                  else "unknown"))
    rec = Recorder(req.out, {"kind": "calibration", "version": 1, "hardware": hw_name, "provenance": prov})
    rec.flush()

    def stage(name: str, fn: Callable[[], None]) -> None:
        progress(name)
        try:
            fn()
        except KeyboardInterrupt:
            rec.fail(name, KeyboardInterrupt("interrupted"))
            raise
        except Exception as e:  # a failing benchmark is recorded, the rest carries on
            if os.environ.get("DDPLAN_DEBUG") == "1":
                traceback.print_exc()
            rec.fail(name, e)

    def gemms() -> None:
        points = []
        for m, n, k, label in bench.gemm_shapes(spec, list(batches), seq):
            tflops = bench.bench_gemm(m, n, k, dtype=gemm_dtype, device=device, quick=req.quick)
            points.append({"m": m, "n": n, "k": k, "dtype": gemm_dtype, "tflops": round(tflops, 4), "label": label})
        rec.append("gemm", points)

    def peak() -> None:
        tflops, shape = bench.bench_peak_gemm(dtype=gemm_dtype, device=device, quick=req.quick)
        rec.set("peak_gemm_tflops", round(tflops, 4))

    def attention() -> None:
        a = spec.architecture
        names = req.attention or ((tuple(x.name for x in hw.attention)) if hw else ("sdpa-math", "sdpa-fused"))
        windows = sorted(set(a.windows(seq)))
        points, missing = [], []
        for impl in names:
            for w in windows:
                got = bench.bench_attention(impl, batch=mb0, heads=a.num_heads, seq_len=seq, window=w,
                                            head_dim=a.head_dim, dtype=gemm_dtype, device=device, quick=req.quick)
                if got is None:  # this backend cannot run this window here (e.g. flash with a mask)
                    missing.append(f"{impl} (window {w})")
                    continue
                points.append({"implementation": impl, "batch": mb0, "heads": a.num_heads, "seq_len": seq,
                               "window": w if _native(hw, impl) else seq, "head_dim": a.head_dim,
                               "fwd_tflops": round(got[0], 4), "bwd_tflops": round(got[1], 4)})
        rec.append("attention", points)
        for impl in missing:
            rec.data.setdefault("failures", []).append(f"attention {impl}: not available on this device/stack")
        rec.flush()

    def hbm() -> None:
        rec.set("hbm_tbyte_per_s", round(bench.bench_hbm(device, nbytes=(64 if device == "cpu" else 1024) * 2**20), 6))

    def pointwise() -> None:
        from ddplan.anatomy import build_anatomy

        run_spec = spec_for_device(spec, device)
        head = [op for op in build_anatomy(run_spec, batch=mb0, seq_len=seq).ops
                if op.name in ("logits_cast", "logits_softcap", "cross_entropy")]
        t = bench.bench_loss_head_s(device, rows=mb0 * seq, vocab=spec.architecture.vocab_size,
                                    softcap=spec.architecture.logit_softcap, dtype="fp32", quick=req.quick)
        rec.set("pointwise_tbyte_per_s", round(sum(op.bytes_fwd + op.bytes_bwd for op in head) / t / 1e12, 6))

    def optimizer() -> None:
        from ddplan.anatomy import adamw_bytes

        n = spec.architecture.vocab_size * spec.architecture.d_model  # an embedding-sized tensor
        t = bench.bench_adamw_s(device, numel=n, dtype="fp32", quick=req.quick)
        rec.set("optimizer_tbyte_per_s", round(adamw_bytes(n, 4, 4, 4) / t / 1e12, 6))

    def overhead() -> None:
        rec.set("kernel_overhead_us", round(bench.bench_kernel_overhead_us(device), 3))

    def collectives() -> None:
        if req.nproc < 2:
            rec.data.setdefault("failures", []).append(
                "collectives: skipped, one device (use --nproc N on a box with N GPUs, or run "
                "`torchrun --nproc_per_node N -m ddplan.calibrate.collectives --out FILE`)")
            rec.flush()
            return
        from ddplan.calibrate import collectives as coll

        sizes = coll.default_sizes(req.quick)
        if device == "cpu":
            sizes = coll.cap_sizes(sizes, 16 * 2**20)
        with tempfile.TemporaryDirectory() as tmp:
            points = coll.launch(req.nproc, sizes_bytes=sizes, quick=req.quick, out_path=Path(tmp) / "c.json",
                                 device=device)
        kept = coll.to_collective_points(points)  # emulated points (gloo's reduce-scatter) are left out
        rec.append("collectives", [p.model_dump() for p in kept])
        if len(kept) < len(points):
            rec.data.setdefault("failures", []).append(
                f"collectives: {len(points) - len(kept)} emulated point(s) left out (gloo has no real reduce-scatter)")
            rec.flush()

    held_out: dict = {}

    def train_step() -> None:
        attention_name = (hw.default_attention if hw else "sdpa-fused")
        res = bench.bench_train_step(spec, batch=mb0, seq_len=seq, attention=_ref_attention(attention_name),
                                     device=device, dtype_policy=dtype_policy, steps=2 if req.quick else 5)
        held_out.update(res, attention=attention_name, batch=mb0, seq_len=seq)
        if "skipped" in res:
            rec.data.setdefault("failures", []).append(f"training step: {res['skipped']}")
            rec.flush()
            return
        rec.append("step_times", [{
            "model": spec.name, "gpus": 1, "step_time_s": round(res["step_time_s"], 6), "device_batch_size": mb0,
            "total_batch_tokens": mb0 * seq, "attention": attention_name,
            "window_pattern": spec.architecture.window_pattern, "seq_len": seq, "compiled": False,
            "peak_memory_gb": round(res["peak_memory_bytes"] / 1e9, 3) if res.get("peak_memory_bytes") else None,
            "source": f"ddplan calibrate: reference model, one micro-batch, eager, {prov.get('device_name')}"}])

    for name, fn in (("GEMMs at the model's shapes", gemms), ("peak GEMM sweep", peak), ("attention", attention),
                     ("HBM bandwidth", hbm), ("elementwise ops", pointwise), ("optimizer", optimizer),
                     ("kernel overhead", overhead),
                     ("collectives", collectives),
                     ("training step (held out)", train_step)):
        stage(name, fn)
    cal = CalibrationSpec.model_validate(rec.data)
    if hw is None:
        if device == "cpu":
            hw = cpu_hardware(cal.peak_gemm_tflops or 0.1, cal.hbm_tbyte_per_s or 0.01, cal.kernel_overhead_us or 10.0,
                           f"measured {dt.date.today()} {prov.get('device_name')}", prov)
        else:
            from ddplan.registry import load_hardware

            hw = load_hardware(hw_name)
    return cal, hw, held_out


def _native(hw: HardwareSpec | None, impl: str) -> bool:
    if hw is None:
        return False
    try:
        return hw.attention_impl(impl).windows == "native"
    except KeyError:
        return False


def _ref_attention(name: str) -> str:
    """The reference model's attention for a hardware implementation name (flash packages -> fused SDPA)."""
    return "sdpa-math" if name == "sdpa-math" else "sdpa-fused"


# --------------------------------------------------------------------------------------------
# Closing the loop


def check_step(spec: ModelSpec, hw: HardwareSpec, cal: CalibrationSpec, held_out: dict,
               device: str) -> list[dict]:
    """The held-out step, measured vs predicted before and after calibration, per term.

    Before: the hardware spec's assumptions. After: the calibration's micro-benchmarks (GEMMs at the
    model's shapes, attention, HBM, launch overhead) with the step time itself left out of the fit.
    Both are ddplan.price.Pricer's step, the one every planning command uses.
    """
    from ddplan.layout import NATIVE_ZERO, Layout
    from ddplan.price import Pricer, RunPlan
    from ddplan.specs import run_variant

    if not held_out or "skipped" in held_out:
        return []
    run_spec = run_variant(spec_for_device(spec, device), seq_len=held_out["seq_len"])
    impl = hw.attention_impl(held_out["attention"])
    layout = Layout(dp=1, zero=NATIVE_ZERO[spec.recipe.distribution], micro_batch=held_out["batch"],
                    grad_accum=1, attention=impl.name, compiled=False)
    plan = RunPlan(run_spec.recipe.budget, hw.price)
    after_cal = cal.model_copy(update={"step_times": []})  # held out
    window = run_spec.architecture.window_pattern
    before = Pricer(run_spec, hw, plan).step(layout, window)
    after = Pricer(run_spec, hw, plan, after_cal).step(layout, window)
    rows = []
    for term, key, pick in (("forward", "fwd_s", lambda st: st.fwd_s), ("backward", "bwd_s", lambda st: st.bwd_s),
                            ("optimizer", "optimizer_s", lambda st: st.optimizer_s),
                            ("step", "step_time_s", lambda st: st.total_s)):
        measured = held_out.get(key)
        if not measured:
            continue
        b, a = pick(before), pick(after)
        rows.append({"term": term, "measured_s": measured, "before_s": b,
                     "before_error_pct": 100 * (b - measured) / measured, "after_s": a,
                     "after_error_pct": 100 * (a - measured) / measured})
    return rows


def spec_for_device(spec: ModelSpec, device: str) -> ModelSpec:
    """The model as it runs in the benchmark: on CPU everything is fp32 (dtype_policy='fp32'), as
    `--dtype fp32` asks the planning commands for it (ddplan.specs.run_variant)."""
    from ddplan.specs import run_variant

    return spec if device != "cpu" else run_variant(spec, dtype="fp32")
