"""nanochat's depth rule: every nanochat model and its default recipe from `--depth` alone.

The shipped models/nanochat-d{20,24,26,32}.yaml are this function's output, written by
`python -m ddplan.nanochat models/` and checked against it by the tests, so the rule and the files
cannot drift apart. Any other depth (`--model d12`) is built here on the fly.

Source: github.com/karpathy/nanochat, scripts/base_train.py @00255c1 (argument defaults, the
auto batch size) and nanochat/gpt.py @92d63d4 (architecture); see shared/reference/nanochat.md.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ddplan.params import scaling_params
from ddplan.specs import Architecture, ModelSpec, nanochat_dims

SOURCE = "karpathy/nanochat gpt.py @92d63d4 (architecture), scripts/base_train.py @00255c1 (defaults)"
VOCAB = 32768  # scripts/tok_train.py --vocab-size default, special tokens included
SEQ_LEN = 2048  # base_train.py --max-seq-len default
DEVICE_BATCH = 32  # base_train.py --device-batch-size default
PARAM_DATA_RATIO = 12.0  # base_train.py --target-param-data-ratio default
B_REF_TOKENS = 2**19  # base_train.py B_REF: optimal batch at d12, measured by nanochat
BATCH_EXPONENT = 0.383  # Power Lines, arXiv 2505.13738: B_opt ~ D^0.383


def architecture(depth: int) -> Architecture:
    """nanochat's architecture at a depth: width 64*depth rounded up to 128, heads of 128, MLP 4x ReLU^2."""
    d_model, heads = nanochat_dims(depth)
    return Architecture(
        num_layers=depth, d_model=d_model, num_heads=heads, num_kv_heads=heads, head_dim=128,
        vocab_size=VOCAB, max_seq_len=SEQ_LEN, mlp="relu2", mlp_hidden_dim=4 * d_model,
        norm="rmsnorm", norm_learnable=False, linear_bias=False, tied_embeddings=False, position="rope",
        qk_norm=True, value_embeddings={"gate_in_features": 12}, smear_gate_in_features=24, backout=True,
        scalars_per_layer=2, scalars_global=2, window_pattern="SSSL",
        short_window={"divisor": 4, "round_to": 128}, logit_softcap=15.0,
    )


def auto_total_batch_tokens(depth: int) -> int:
    """nanochat's auto total batch (tokens): 2^19 at d12, scaled by (D/D_ref)^0.383, rounded to a power of 2.

    B = 2^round(log2(B_ref x (D / D_ref)^0.383)), with D = ratio x scaling params at this depth and
    D_ref the same at d12; the ratio cancels. Ref: nanochat scripts/base_train.py @00255c1 l.~300
    ("Power Lines", arXiv 2505.13738).
    """
    ratio = scaling_params(architecture(depth)) / scaling_params(architecture(12))
    return 2 ** round(math.log2(B_REF_TOKENS * ratio**BATCH_EXPONENT))


def nanochat_spec(depth: int) -> ModelSpec:
    """The model spec of nanochat at `depth`, with nanochat's current default recipe."""
    arch = architecture(depth)
    total_batch = auto_total_batch_tokens(depth)
    return ModelSpec(
        kind="model",
        name=f"nanochat-d{depth}",
        aliases=[f"d{depth}"],
        family="nanochat",
        description=(f"nanochat depth {depth}: {arch.d_model} wide, {arch.num_heads} heads of 128, vocab {VOCAB}, "
                     f"value embeddings on alternate layers, window pattern SSSL (S = 512 at T = 2048)"),
        source=SOURCE,
        architecture=arch,
        dtypes={
            "compute": "bf16",
            "params": {"wte": "bf16", "value_embeddings": "bf16", "lm_head": "fp32", "block_matrices": "fp32",
                       "ve_gates": "fp32", "smear_gate": "fp32", "scalars": "fp32"},
            "logits": "fp32",
        },
        recipe={
            "seq_len": SEQ_LEN,
            "device_batch_size": DEVICE_BATCH,
            "total_batch_tokens": total_batch,
            "budget": {"param_data_ratio": PARAM_DATA_RATIO, "ratio_params": "scaling"},
            "optimizer": {
                "name": "MuonAdamW",
                "algorithm": {"block_matrices": "muon", "ve_gates": "muon", "lm_head": "adamw", "wte": "adamw",
                              "value_embeddings": "adamw", "smear_gate": "adamw", "scalars": "adamw"},
                "adamw_state_dtype": "param",
                "muon_ns_steps": 5,
                "source": "nanochat/optim.py @92d63d4 l.337-382 (state dtypes), gpt.py l.419-457 (groups)",
            },
            "distribution": "sharded_optimizer",
            "fp8_formats": ["e4m3fn", "e5m2"],  # nanochat/fp8.py: torch._scaled_mm, e4m3fn x/w, e5m2 grads
            "fp8_recipe": "nanochat",  # nanochat/fp8.py: tensorwise dynamic scaling in one autograd function
            "fp8_lm_head": True,  # base_train.py @00255c1 fp8_module_filter: every Linear of dims % 16, min >= 128
            "world_size_rule": "power_of_two",
            "evaluation": {"every_steps": 250, "tokens": 80 * 524288,
                           "source": "base_train.py @00255c1 --eval-every 250, --eval-tokens 80*524288 "
                                     "(CORE metric every 2000 steps and sampling are not counted)"},
            "source": (f"base_train.py @00255c1 defaults: device batch {DEVICE_BATCH} x {SEQ_LEN}, "
                       f"--target-param-data-ratio {PARAM_DATA_RATIO:g}, --total-batch-size -1 (auto: "
                       f"2^round(log2(2^19 x (D/D_d12)^0.383)) = {total_batch:,} tokens at d{depth})"),
        },
    )


def spec_yaml(depth: int) -> str:
    """The spec as the YAML text shipped in models/."""
    import yaml

    data = nanochat_spec(depth).model_dump(mode="json", exclude_none=True)
    header = (f"# nanochat d{depth}, generated by `python -m ddplan.nanochat models/` from nanochat's depth rule\n"
              f"# (ddplan/nanochat.py). Do not edit by hand: tests check this file against the rule.\n")
    return header + yaml.safe_dump(data, sort_keys=False, width=110)


if __name__ == "__main__":  # python -m ddplan.nanochat models/
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "models")
    for d in (20, 24, 26, 32):
        (out / f"nanochat-d{d}.yaml").write_text(spec_yaml(d), encoding="utf-8")
