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
