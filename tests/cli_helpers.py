"""Helpers the CLI test modules share: run a command in-process, and check its streams.

Every command runs through `ddplan.cli.main`, which returns the exit code, so the real error handling
(one line on stderr, exit 1 or 2) is what the tests see.
"""

from __future__ import annotations

import csv
import io

from ddplan import cli


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_ok(capsys, argv: list[str]) -> str:
    """stdout of a successful run; stderr may hold warnings and progress lines only, one line each."""
    code, out, err = run(capsys, argv)
    assert code == 0, err
    assert all(line.startswith(("warning: ", "plan: ", "table: ", "memory: ", "validate: ", "import: "))
               for line in err.splitlines()), err
    return out


def fails(capsys, argv: list[str]) -> tuple[int, str]:
    """(exit code, the one error line) of a failing run: nothing on stdout, no traceback."""
    code, out, err = run(capsys, argv)
    assert code in (1, 2), (code, err)
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("error: ")
    return code, err.rstrip("\n")


def data_lines(out: str) -> str:
    """CSV output without its provenance comment (the first line, '# ddplan ...')."""
    return "".join(line for line in out.splitlines(keepends=True) if not line.startswith("#"))


def csv_rows(out: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data_lines(out))))


def f(row: dict[str, str], key: str) -> float:
    return float(row[key])


def readable(csv_text: str, rows: int | None = None) -> str:
    """A CSV output as a reviewer reads a golden: floats to 4 significant figures, at most `rows` rows.

    Goldens pin what a person checks; properties of the whole layout space are property tests.
    """
    def short(cell: str) -> str:
        if any(c in cell for c in ".e") and cell.replace(".", "", 1).replace("e", "", 1).replace("-", "").replace(
                "+", "").isdigit():
            return f"{float(cell):.4g}"
        return cell

    lines = list(csv.reader(io.StringIO(csv_text)))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(lines[0])
    for line in lines[1:][:rows]:
        writer.writerow([short(c) for c in line])
    return buf.getvalue()
