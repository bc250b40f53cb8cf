"""The `ddplan` command line: parse flags, load specs, call the model, render. No math here.

Errors: a DdplanError prints one line `error: <file>: <field>: <what>` on stderr and exits 1 (2 for
usage errors); typer's own usage errors are reduced to one line too. DDPLAN_DEBUG=1 re-raises.
"""

from __future__ import annotations

import os
import sys
from enum import Enum

import typer

from ddplan.errors import DdplanError

app = typer.Typer(
    name="ddplan",
    help="Plan distributed training of language models: time, cost, memory, and what to fix first.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
specs_app = typer.Typer(help="The built-in hardware and model specs (any spec can also be a YAML path).",
                        no_args_is_help=True)
app.add_typer(specs_app, name="specs")


class SpecFormat(str, Enum):
    text = "text"
    json = "json"


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


DEFAULT_HARDWARE = "mi300x"  # the canonical case (shared/seed): nanochat d24 on AMD MI300X

ModelOpt = typer.Option(..., "--model", "-m", help="Model: a built-in (d24, nanochat-d24, gpt2, llama-3-8b), "
                        "any nanochat dN, or a YAML path.")
HardwareOpt = typer.Option(DEFAULT_HARDWARE, "--hardware", help="GPU: a built-in (mi300x, h100-sxm, h200, b200, "
                           "...) or a YAML path. Default mi300x, the canonical case.")
FormatOpt = typer.Option(Format.table, "--format", help="Output format; csv and json are data only.")


def _positive(value: int | float | None, flag: str) -> None:
    from ddplan.errors import UsageError

    if value is not None and value <= 0:
        raise UsageError(f"must be positive, got {value}", field=flag)


@specs_app.command("list")
def specs_list() -> None:
    """List the built-in hardware and models, one line each."""
    from ddplan import render
    from ddplan.describe import list_rows

    render.echo(render.spec_list(list_rows()))


@specs_app.command("show")
def specs_show(
    name: str = typer.Argument(..., help="A built-in name or alias (mi300x, d24, nanochat-d24, gpt2) or a YAML path."),
    format: SpecFormat = typer.Option(SpecFormat.text, "--format", help="text: the spec as YAML and derived "
                                      "figures; json: both as one JSON object."),
) -> None:
    """Show one spec, with the figures ddplan derives from it."""
    from ddplan import render
    from ddplan.describe import describe

    spec, derived = describe(name)
    render.echo(render.spec_json(spec, derived) if format is SpecFormat.json else render.spec_text(spec, derived))


@app.command("memory")
def memory_cmd(
    model: str = ModelOpt,
    hardware: str = HardwareOpt,
    gpus: int = typer.Option(1, "--gpus", help="GPUs in the data-parallel group (x tp x pp)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    zero: str = typer.Option("0,1,2,3", "--zero", help="ZeRO stages to show, comma-separated."),
    device_batch_size: int = typer.Option(None, "--device-batch-size", help="Sequences per GPU per micro-batch "
                                          "(default: the recipe's)."),
    attention: str = typer.Option(None, "--attention", help="Attention implementation (default: the hardware's "
                                  "default; see `ddplan specs show HARDWARE`)."),
    recompute: Recompute = typer.Option(Recompute.none, "--recompute", help="Activation recompute policy."),
    window_pattern: str = typer.Option(None, "--window-pattern", help="Override the window pattern (e.g. L, SSSL)."),
    compiled: bool = typer.Option(None, "--compile/--no-compile", help="torch.compile'd model (changes what is "
                                  "saved for backward; default: the recipe's)."),
    measured_peak: float = typer.Option(None, "--measured-peak", help="A measured peak in GB (1e9 bytes): say which "
                                        "attention and recompute setups it is consistent with."),
    format: Format = FormatOpt,
) -> None:
    """Memory per GPU by ZeRO stage: each term, the total against usable memory, and the verdict."""
    from ddplan import render
    from ddplan.fit import Setup, alternatives, consistent_with, verdict, zero_rows
    from ddplan.layout import Layout, check_layout
    from ddplan.registry import load_hardware, load_model

    for value, flag in ((gpus, "--gpus"), (tp, "--tp"), (pp, "--pp"), (device_batch_size, "--device-batch-size"),
                        (measured_peak, "--measured-peak")):
        _positive(value, flag)
    stages = _int_list(zero, "--zero", allowed=(0, 1, 2, 3))
    spec, hw = load_model(model), load_hardware(hardware)
    _check_pattern(window_pattern)
    mb = device_batch_size or spec.recipe.device_batch_size
    dp = gpus
    accum = max(1, spec.recipe.total_batch_tokens // (dp * mb * spec.recipe.seq_len))
    layout = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, grad_accum=accum,
                    attention=attention or hw.default_attention, recompute=recompute.value,
                    compiled=spec.recipe.compiled if compiled is None else compiled)
    check_layout(layout, spec)
    setup = Setup(layout=layout, window_pattern=window_pattern)
    rows = zero_rows(spec, hw, setup, stages)
    alts = alternatives(spec, hw, setup) if not any(r["fits"] and r["setup"] == "native" for r in rows) else []
    words = verdict(spec, hw, rows, alts)
    matches = consistent_with(spec, hw, setup, measured_peak) if measured_peak else []
    if measured_peak:
        ok = [m for m in matches if m["consistent"]]
        words.append(f"Measured {measured_peak:g} GB is consistent with: " + (
            "; ".join(f"{m['attention']}, recompute {m['recompute']}, {'compiled' if m['compiled'] else 'eager'} "
                      f"({m['predicted_gb']:.1f} GB, {m['error_pct']:+.0f}%)" for m in ok[:4])
            if ok else "none of the configurations within 10% (closest: "
            f"{matches[0]['attention']}, {matches[0]['recompute']}, {matches[0]['predicted_gb']:.1f} GB)") + ".")
    title = (f"{spec.name} on {gpus * tp * pp} x {hw.name} (dp {dp}, tp {tp}, pp {pp}), device batch {mb} x "
             f"{spec.recipe.seq_len}, {layout.attention}, recompute {layout.recompute}, "
             f"{'compiled' if layout.compiled else 'eager'}: memory per GPU (GiB = 2^30 bytes)")
    if format is Format.json:
        import json

        render.echo(json.dumps({"title": title, "rows": rows, "verdict": words, "measured_peak_matches": matches},
                               indent=2))
        return
    render.echo(render.table(rows, format.value, title=title))
    if format in (Format.table, Format.markdown):
        render.echo(render.lines(words, format.value))


def _int_list(text: str, flag: str, allowed: tuple[int, ...] | None = None) -> list[int]:
    from ddplan.errors import UsageError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"expected comma-separated integers, got {text!r}", field=flag) from None
    if not values:
        raise UsageError("expected at least one value", field=flag)
    bad = [v for v in values if (allowed is not None and v not in allowed) or v <= 0 and allowed is None]
    if bad:
        allowed_text = ", ".join(map(str, allowed)) if allowed else "positive integers"
        raise UsageError(f"invalid values {bad}; allowed: {allowed_text}", field=flag)
    return values


def _check_pattern(pattern: str | None) -> None:
    from ddplan.errors import UsageError

    if pattern is not None and (not pattern or set(pattern) - {"S", "L"}):
        raise UsageError(f"window pattern must be letters S and L only (e.g. L, SSSL), got {pattern!r}",
                         field="--window-pattern")


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code instead of raising SystemExit inside tests."""
    debug = os.environ.get("DDPLAN_DEBUG") == "1"
    try:
        result = app(args=argv, standalone_mode=False, prog_name="ddplan")
        return result if isinstance(result, int) else 0
    except DdplanError as e:
        if debug:
            raise
        print(e.one_line(), file=sys.stderr)
        return e.exit_code
    except Exception as e:  # typer/click usage errors carry exit_code and format_message
        if debug:
            raise
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            print("error: " + " ".join(e.format_message().split()), file=sys.stderr)
            return int(e.exit_code)
        if type(e).__name__ == "Abort":
            print("error: aborted", file=sys.stderr)
            return 1
        print(f"error: internal error: {type(e).__name__}: {e} (set DDPLAN_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
