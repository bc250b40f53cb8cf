"""Training stacks as they run: what a framework does when its user says nothing, each item sourced.

A profile (frameworks/*.yaml, `kind: framework`, shipped like the hardware and model specs) is one stack at one
commit: torchtitan, Megatron-Core (NeMo runs on it), Composer with llm-foundry, nanochat, OLMo-core, IBM's fms-fsdp,
and the older legacy Megatron-LM (2023) and BigScience's Megatron-DeepSpeed (2022). Every item names the
file and commit it comes from (`where`, path@commit) with the line that says it (`quote`), because a stack's
defaults move between releases (torchtitan's attention went from SDPA to FlexAttention in 2026).

`applies`: the items ddplan prices, each one a run-configuration field (APPLIES maps the item to the field).
`--framework NAME`, or a run file's `framework:`, fills those fields where nothing else states them; a flag given
or a field of the run file wins over the profile, and the profile wins over ddplan's own default.
`unpriced`: what the stack runs that ddplan does not price yet (a kernel it has no efficiency for, a recompute
policy it cannot state, CUDA graphs); a command that takes the profile says each one, so a reader knows what
the figure leaves out (the frameworks issue, #35, prices them one by one).
`lacks`: the parallelism the stack cannot run (LACKS: nanochat has no tensor or pipeline parallelism; torchtitan
refuses tied embeddings under a pipeline): `table` and `memory` refuse a layout that needs it, `plan` and
`memory`'s fixes do not search it (FrameworkProfile.lacked); or whole-model torch.compile (Megatron's stacks), which
`table`'s verdict then does not suggest.
"""

from __future__ import annotations

import typing
from typing import Literal

from pydantic import Field, model_validator

from ddplan.errors import SpecError
from ddplan.runconfig import RunConfig
from ddplan.runfields import OPTION_FIELDS, SCHEDULES
from ddplan.specfile import validate
from ddplan.specs import KERNELS, Fp8Recipe, Strict

# profile item -> the run-configuration field it fills (ddplan.runconfig field paths): every framework option
# (ddplan.runfields.OPTION_FIELDS) and kernel field (ddplan.specs.KERNELS) by its name, and these
APPLIES: dict[str, tuple[str, ...]] = {
    "zero": ("layout", "zero"),
    **{f.param: f.path for f in OPTION_FIELDS},
    "compiled": ("compiled",),
    "recompute": ("recompute",),
    # on hardware whose spec lacks it, the item's `elsewhere` where the spec has that, else the spec's own
    # (FrameworkProfile.attention_on)
    "attention": ("attention",),
    "fp8_recipe": ("precision", "fp8_recipe"),
    "grads": ("precision", "grads"),
    "weights": ("precision", "weights"),
    **{name: (name,) for name in KERNELS},
}
COMMIT = r"^[0-9a-f]{40}$"
WHERE = r"^\S+@[0-9a-f]{7,40}\b"  # path@commit (a short commit is enough beside the profile's full one)


class Item(Strict):
    """One thing a stack does by default, with where it says so."""

    value: bool | int | str
    where: str = Field(pattern=WHERE)  # e.g. torchtitan/distributed/fsdp.py@b5bcd76 (line numbers may follow)
    quote: str = Field(default="", max_length=400)  # the line (or a paraphrase of it) that says it
    # the attention item only: what the stack runs on hardware that cannot run `value` (nanochat: SDPA off Hopper),
    # or what stands in for it where ddplan has no figure for `value` there (FA3 for TE's cuDNN attention on Hopper),
    # and the compute dtypes `value` runs in (none listed: every one; nanochat runs FA3 in bf16 only, SDPA otherwise)
    elsewhere: str | None = None
    dtypes: list[Literal["bf16", "fp16", "fp32"]] = []


# what a stack may lack (FrameworkProfile.lacks): a parallel dimension above 1, tied embeddings under a pipeline,
# tensor and expert parallelism together, or a ZeRO stage over more than one data-parallel rank (ddplan's stages:
# 0 every rank whole, 1 the optimizer state sharded, 2 the gradients too, 3 the parameters too); or whole-model
# torch.compile (Megatron's stacks: the table's verdict then suggests no compile)
ZERO_LACKS = ("zero0", "zero1", "zero2", "zero3")
LACKS = ("tp", "pp", "cp", "ep", "tied_embeddings_with_pp", "tp_with_ep", *ZERO_LACKS, "compile")
LACK_WORDS = {"tp": "tensor parallelism", "pp": "pipeline parallelism", "cp": "context parallelism",
              "ep": "expert parallelism", "tied_embeddings_with_pp": "tied embeddings under a pipeline",
              "tp_with_ep": "tensor and expert parallelism together",
              "zero0": "ZeRO-0 (plain data parallelism: every rank its whole optimizer state)",
              "zero1": "ZeRO-1 (the optimizer state sharded alone)",
              "zero2": "ZeRO-2 (the gradients sharded too, the parameters whole)",
              "zero3": "ZeRO-3 (the parameters sharded too)", "compile": "whole-model torch.compile"}
REFUSED = ("tied_embeddings_with_pp", "tp_with_ep")  # combinations a stack refuses (the rest it has no code for)


def profile_weights(value: str | None, fp8: bool) -> str | None:
    """How a profile's `weights` item applies to a run: its remainder masters (the NeMo and Megatron-Bridge perf
    launchers', for their bf16 runs) become whole ones with fp8, which Megatron-Core keeps whole then
    (optimizer_config.py@d98e8a64 L400-411); fp16 weights and layouts without the distributed optimizer keep whole
    ones too, row by row (ddplan.specs.Optimizer.adamw_bytes)."""
    return "master" if value == "remainder" and fp8 else value


def needs(tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, tied: bool = False,
          zero: int | None = None) -> list[str]:
    """The LACKS items a layout of these degrees needs (tied: the model ties its embeddings; zero: its ZeRO stage
    over more than one data-parallel rank, None where one rank shards nothing), in LACKS order."""
    wanted = {"tp": tp > 1, "pp": pp > 1, "cp": cp > 1, "ep": ep > 1, "tied_embeddings_with_pp": tied and pp > 1,
              "tp_with_ep": tp > 1 and ep > 1, **{k: zero == i for i, k in enumerate(ZERO_LACKS)}}
    return [k for k in LACKS if wanted.get(k, False)]  # compile is no layout's degree: never needed here


def can_run(lacks: frozenset[str], tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
            tied: bool = False, zero: int | None = None) -> bool:
    """Whether a layout of these degrees needs nothing a stack lacks (`lacks`: names of LACKS, a search's set)."""
    return not lacks or not lacks.intersection(needs(tp, pp, cp, ep, tied, zero))


class Lack(Strict):
    """Something the stack cannot run, with where it says so (or where its code shows it has none)."""

    where: str = Field(pattern=WHERE)
    quote: str = Field(min_length=3, max_length=400)


# ddplan's recompute policies by family (ddplan.runfields.RECOMPUTE_HINT): a stack's policy is priced as one or more
# of them (RecomputePolicy.priced_as); full:N and every:K for any N and K, selective:MODULES for any module list
# (Megatron's --recompute-modules, OLMo-core's module globs), selective alone Megatron's default (core attention)
RECOMPUTE_FAMILIES = ("none", "selective", "selective:MODULES", "per-op", "full", "full:N", "every:K")
# the ones a search tries, lightest first (plan's layouts, memory's fixes), of what a stack offers: the layer
# policies need an N or K the stack's configuration sets; where nothing says what it offers, DEFAULT_RECOMPUTES
SEARCHED_RECOMPUTES = ("none", "selective", "per-op", "full")
DEFAULT_RECOMPUTES = ("none", "selective", "full")


def searched_recomputes(offered: tuple[str, ...] | None) -> tuple[str, ...]:
    """The recompute policies plan searches and memory's fixes try, lightest first: DEFAULT_RECOMPUTES where the
    stack's offer is unknown (`offered`: FrameworkProfile.recompute_offered, None), else those of SEARCHED_RECOMPUTES
    it offers, at least none. e.g. torchtitan (none, per-op, full, its selective being per-op): none, per-op, full."""
    if offered is None:
        return DEFAULT_RECOMPUTES
    return tuple(r for r in SEARCHED_RECOMPUTES if r in offered) or ("none",)


def recompute_family(policy: str) -> str:
    """The family (RECOMPUTE_FAMILIES) of one of ddplan's recompute policies: `selective:mlp` is selective:MODULES,
    `full:4` full:N, `every:2` every:K, the rest themselves."""
    head, colon, _ = policy.partition(":")
    return {"selective": "selective:MODULES", "full": "full:N", "every": "every:K"}.get(head, head) if colon else policy


class RecomputePolicy(Strict):
    """A recompute (activation checkpointing) policy as the stack names and defines it."""

    name: str = Field(min_length=1)
    saves: str = Field(min_length=3)  # what it keeps for backward, and what it recomputes
    where: str = Field(pattern=WHERE)
    # the ddplan policies (RECOMPUTE_FAMILIES) it is priced as; none: ddplan cannot price it (a memory budget)
    priced_as: list[Literal[RECOMPUTE_FAMILIES]] = []


class PipelineSchedule(Strict):
    """A pipeline schedule the stack offers, by its own name, and the ddplan schedule it is priced as (a run file's
    layout.schedule spelling, ddplan.runfields.SCHEDULES; none: ddplan cannot price it, so plan does not search it)."""

    name: str = Field(min_length=1)
    priced_as: list[Literal[SCHEDULES]] = []
    where: str = Field(pattern=WHERE)
    quote: str = Field(default="", max_length=400)


class FrameworkProfile(Strict):
    kind: Literal["framework"]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    aliases: list[str] = []
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")  # owner/name on GitHub
    commit: str = Field(pattern=COMMIT)
    commit_date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    also: dict[str, str] = {}  # other repositories the profile read (owner/name -> commit)
    applies: dict[str, Item] = {}
    unpriced: dict[str, Item] = {}
    recompute_policies: list[RecomputePolicy] = []
    pipeline_schedules: list[PipelineSchedule] = []  # none listed: 1F1B and interleaved, plan's default search
    lacks: dict[Literal[LACKS], Lack] = {}
    # fp8 recipes by the name a user gives (--fp8-recipe, ddplan.specs.Fp8Recipe) -> the recipe this stack runs
    # under that name, e.g. torchtitan's mxfp8 is torchao's MXFP8Linear (mxfp8_torchao), not Transformer Engine's
    fp8_recipe_names: dict[Fp8Recipe, Item] = {}
    notes: list[str] = []

    @model_validator(mode="after")
    def _known_items(self) -> FrameworkProfile:
        odd = sorted(k for k, item in {**self.applies, **self.unpriced}.items()
                     if (item.elsewhere is not None or item.dtypes) and (k != "attention" or k in self.unpriced))
        if odd:
            raise ValueError(f"{', '.join(odd)}: `elsewhere` and `dtypes` are for applies.attention only")
        odd_recipes = sorted(f"{k}: {item.value}" for k, item in self.fp8_recipe_names.items()
                             if item.value not in typing.get_args(Fp8Recipe))
        if odd_recipes:
            raise ValueError(f"fp8_recipe_names: {', '.join(odd_recipes)} is not an fp8 recipe ddplan prices; allowed: "
                             f"{', '.join(typing.get_args(Fp8Recipe))}")
        unknown = sorted(set(self.applies) - set(APPLIES))
        if unknown:
            raise ValueError(f"applies: {', '.join(unknown)} is not an item ddplan prices; allowed: "
                             f"{', '.join(APPLIES)} (put what ddplan cannot price under `unpriced`)")
        priced = sorted(set(self.unpriced) & set(APPLIES))
        if priced:
            raise ValueError(f"unpriced: {', '.join(priced)} is an item ddplan prices: put it under `applies`")
        if all(k in self.lacks for k in ZERO_LACKS):
            raise ValueError("lacks: every ZeRO stage (zero0-zero3): a stack runs at least one")
        compiled = self.applies.get("compiled")
        if compiled is not None and compiled.value is True and "compile" in self.lacks:
            raise ValueError("applies.compiled: true, and `lacks` names compile")
        zero = self.applies.get("zero")
        if zero is not None and f"zero{zero.value}" in self.lacks:
            raise ValueError(f"applies.zero: {zero.value} is a stage its `lacks` names (zero{zero.value})")
        # each value one its run-configuration field takes
        for key, item in self.applies.items():
            for part_name, value in (("value", item.value), ("elsewhere", item.elsewhere)):
                if value is None:
                    continue
                data: dict = {"kind": "run"}
                node = data
                for part in APPLIES[key][:-1]:
                    node = node.setdefault(part, {})
                node[APPLIES[key][-1]] = value
                try:
                    validate(RunConfig, data, "applies")
                except SpecError as e:
                    raise ValueError(f"applies.{key}.{part_name}: {e.message}") from None
        return self

    def fields(self) -> dict[tuple[str, ...], bool | int | str]:
        """The run-configuration fields this profile fills, by field path."""
        return {APPLIES[k]: item.value for k, item in self.applies.items()}

    def attention_on(self, available, dtype: str | None = None) -> str | None:
        """The attention this stack runs on hardware whose spec has the implementations `available` (names), in the
        compute dtype `dtype` (None: not weighed): the item's value where the spec has it and the dtype is one of the
        item's `dtypes` (or it lists none), else its `elsewhere` where the spec has that, else None (the spec's own);
        None too where the profile states no attention."""
        item = self.applies.get("attention")
        if item is None:
            return None
        first = str(item.value) if not item.dtypes or dtype is None or dtype in item.dtypes else None
        return next((a for a in (first, item.elsewhere) if a is not None and a in available), None)

    def lacked(self, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, tied: bool = False,
               zero: int | None = None) -> list[str]:
        """The items of `lacks` a layout of these degrees needs (tied: the model ties its embeddings; zero: its ZeRO
        stage over more than one data-parallel rank), in LACKS order."""
        return [k for k in needs(tp, pp, cp, ep, tied, zero) if k in self.lacks]

    def recompute_offered(self) -> tuple[str, ...] | None:
        """The recompute families (RECOMPUTE_FAMILIES) the stack's policies are priced as, in that order; None where
        the profile prices none of its policies (none listed, or a profile written before `priced_as`: nothing is
        known, every one is allowed)."""
        out = tuple(f for f in RECOMPUTE_FAMILIES if any(f in p.priced_as for p in self.recompute_policies))
        return out or None

    def schedules_offered(self) -> tuple[str, ...] | None:
        """The pipeline schedules (ddplan.runfields.SCHEDULES) the stack's schedules are priced as, in that order;
        None where the profile lists none (plan then searches its default, 1F1B and interleaved)."""
        out = tuple(s for s in SCHEDULES if any(s in p.priced_as for p in self.pipeline_schedules))
        return out or None

    def zero_stages(self) -> tuple[int, ...]:
        """The ZeRO stages the stack runs over more than one data-parallel rank (those its `lacks` does not name)."""
        return tuple(i for i, k in enumerate(ZERO_LACKS) if k not in self.lacks)

    def lack_words(self, name: str) -> str:
        """One lacked item in words: what, and where the stack says so (its quote is the profile's). e.g. "nanochat
        (@92d63d4) has no tensor parallelism (nanochat/common.py@92d63d4 L194-201)"."""
        verb = "refuses" if name in REFUSED else "has no"
        return f"{self.name} (@{self.commit[:7]}) {verb} {LACK_WORDS[name]} ({self.lacks[name].where})"

    def unpriced_words(self, moe: bool = True) -> list[str]:
        """One sentence per item ddplan does not price: what the stack runs and where it says so (the expert
        items, `moe_...`, only for a mixture of experts). None of them is a run-configuration field (a run could
        not state it)."""
        return [f"{self.name} (@{self.commit[:7]}) runs {k.replace('_', ' ')} = {item.value} by default "
                f"({item.where}); ddplan does not price it yet" for k, item in self.unpriced.items()
                if moe or not k.startswith("moe_")]
