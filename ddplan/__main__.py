"""`python -m ddplan ...`: the same as the `ddplan` console script."""

from ddplan.cli import entry

entry()
