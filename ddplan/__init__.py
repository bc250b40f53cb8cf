"""ddplan: a planner for distributed training of language models.

How long, how much, does it fit, and what to fix first — from a model spec, a hardware spec and,
where available, measurements taken with `ddplan calibrate`.
"""

__version__ = "0.1.0"
