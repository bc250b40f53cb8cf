"""A ddplan model spec from a local Hugging Face `config.json` (no network).

`--model path/to/config.json` (or a folder holding one) builds the spec here; `ddplan specs import`
writes it as YAML for editing. The architecture comes from the config; what a config does not say
(precision, optimizer, distribution, recipe, budget) comes from the stated defaults below, each named
in the spec's `source` fields, so that `table`'s assumptions list them.

Families: Llama, Mistral, Qwen2, Qwen3, Gemma (decoder-only, RMSNorm, RoPE, gated MLP), GPT-2 and
GPT-NeoX (LayerNorm, biases, GELU MLP), and the mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE and
OLMoE. DeepSeek-V2/V3 are refused: their multi-head latent attention is not modelled.
Field names follow transformers' configuration classes (LlamaConfig, MistralConfig, Qwen2Config,
Qwen3Config, GemmaConfig, GPT2Config, GPTNeoXConfig, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig,
OlmoeConfig).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from ddplan.errors import InputWarning, SpecError, kind_of
from ddplan.files import loads_json
from ddplan.params import total_params
from ddplan.specfile import validate
from ddplan.specs import DROPLESS_IMBALANCE, Architecture, ModelSpec, present_param_groups

# Defaults for what a config.json does not carry; each is listed in the spec it builds.
DEFAULT_SEQ_LEN = 4096  # capped at the config's max_position_embeddings
DEFAULT_BATCH_TOKENS = 4_194_304  # 4M tokens: Llama 2 (arXiv 2307.09288 sec. 2.2) and Llama 3's first stage
DEFAULT_TOKENS_PER_PARAM = 20  # Chinchilla (Hoffmann et al., arXiv 2203.15556): ~20 tokens per parameter
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma")
MOE_LIKE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
GPT_LIKE = ("gpt2", "gpt_neox")
READ = LLAMA_LIKE + MOE_LIKE + GPT_LIKE
MAX_CONFIG_BYTES = 1_000_000
# Keys of transformers' configs that do not change what a training step computes or holds (token ids, numeric
# epsilons, initialisation, RoPE's frequencies, inference caching, bookkeeping): not read, and not worth a
# warning. Any other key ddplan does not read is named in one (a DeepSeek config relabelled llama, say).
NOT_COST = frozenset({
    "architectures", "model_type", "_name_or_path", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "initializer_range", "init_std",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "rotary_emb_base", "rotary_pct", "partial_rotary_factor", "use_cache", "hidden_act",
    "activation_function", "hidden_activation", "output_router_logits", "router_aux_loss_coef", "router_z_loss_coef",
    "router_jitter_noise", "max_window_layers", "use_sliding_window", "sliding_window", "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "task_specific_params", "embd_pdrop",
    "pretraining_tp", "id2label", "label2id", "is_encoder_decoder", "tokenizer_class", "classifier_dropout",
    "auto_map", "quantization_config", "bias", "use_qk_norm", "attn_implementation", "n_ctx", "vocab_file",
    "tie_encoder_decoder", "layer_types", "clip_qkv", "qk_layernorm",
    # transformers' PretrainedConfig attributes that older saved configs carry (generation and output switches)
    "output_past", "return_dict", "_num_labels", "n_special", "predict_special_tokens", "torchscript",
    "use_return_dict", "output_hidden_states", "output_attentions", "problem_type", "finetuning_task", "prefix",
    "bad_words_ids", "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "num_return_sequences", "chunk_size_feed_forward",
    "is_decoder", "pruned_heads", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "tf_legacy_loss", "use_bfloat16", "cross_attention_hidden_size",
    "add_cross_attention",
})


class _Reads(dict):
    """A config object that remembers which keys were looked at (read, or tested for)."""

    def __init__(self, data: dict):
        super().__init__(data)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)


def config_path(name: str) -> Path | None:
    """The config.json a --model value names (a file, or a folder holding config.json), else None."""
    p = Path(name).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    if p.suffix == ".json":
        return p
    return None


def read_config(path: Path) -> dict:
    """The config's JSON object; one-line errors naming the file."""
    if not path.is_file():
        raise SpecError("no such file for --model", file=str(path))
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise SpecError(f"{path.stat().st_size:,} bytes: a config.json is at most {MAX_CONFIG_BYTES:,}", file=str(path))
    try:
        data = loads_json(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text (byte {e.start})", file=str(path)) from None
    except json.JSONDecodeError as e:
        raise SpecError(f"not JSON: {e.msg} at line {e.lineno}, column {e.colno}", file=str(path)) from None
    except ValueError as e:  # a duplicate key: JSON keeps the last one silently, ddplan refuses it as in YAML
        raise SpecError(f"{e}: a key may appear once", file=str(path)) from None
    if not isinstance(data, dict):
        raise SpecError(f"expected a JSON object, got {kind_of(data)}", file=str(path))
    return data


def _get(cfg: dict, path: Path, *keys: str, default: Any = ..., kind: type = int) -> Any:
    """The first of `keys` present in the config, checked to be of `kind`; `default` when none is (or
    an error naming the keys when there is no default)."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            v = cfg[k]
            ok = isinstance(v, bool) if kind is bool else (isinstance(v, kind) and not isinstance(v, bool))
            if kind is float and isinstance(v, int) and not isinstance(v, bool):
                ok = True
            if not ok:
                words = {int: "a whole number", float: "a number", bool: "true or false"}[kind]
                raise SpecError(f"must be {words}, got {kind_of(v)}", file=str(path), field=k)
            return v
    if default is ...:
        raise SpecError(f"missing (one of {', '.join(keys)})", file=str(path), field=keys[0])
    return default


def architecture_from_config(cfg: dict, path: Path) -> tuple[dict, str, list[str]]:
    """(architecture fields, ddplan family, notes on what was approximated) from a config.json object."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise SpecError("missing model_type (a Hugging Face config names its architecture there)", file=str(path),
                        field="model_type")
    if model_type.startswith("deepseek") or "kv_lora_rank" in cfg:
        raise SpecError(f"{model_type}: multi-head latent attention (kv_lora_rank) is not modelled; allowed "
                        f"model_type: {', '.join(READ)}", file=str(path), field="model_type")
    notes: list[str] = []
    if model_type in LLAMA_LIKE + MOE_LIKE:
        d = _get(cfg, path, "hidden_size")
        heads = _get(cfg, path, "num_attention_heads")
        arch = dict(
            num_layers=_get(cfg, path, "num_hidden_layers"), d_model=d, num_heads=heads,
            num_kv_heads=_get(cfg, path, "num_key_value_heads", default=heads),
            head_dim=_get(cfg, path, "head_dim", default=d // heads if heads else 1),
            vocab_size=_get(cfg, path, "vocab_size"),
            max_seq_len=_get(cfg, path, "max_position_embeddings"),
            mlp="swiglu", mlp_hidden_dim=_get(cfg, path, "intermediate_size"), norm="rmsnorm", norm_learnable=True,
            linear_bias=False, tied_embeddings=_get(cfg, path, "tie_word_embeddings", default=model_type == "gemma",
                                                    kind=bool),
            position="rope")
        if model_type in ("qwen2", "qwen2_moe"):
            arch["qkv_bias"] = True  # Qwen2Attention: q_proj, k_proj, v_proj with bias; o_proj and the MLP without
        if _get(cfg, path, "attention_bias", default=False, kind=bool) or _get(cfg, path, "mlp_bias", default=False,
                                                                               kind=bool):
            arch["linear_bias"] = True
            notes.append("attention_bias/mlp_bias: biases on every Linear priced")
        if model_type == "gemma":
            notes.append("Gemma's GeGLU priced as SwiGLU (the same three matrices; GELU for SiLU)")
        window = cfg.get("sliding_window")
        if model_type == "mistral" and isinstance(window, int) and window < arch["max_seq_len"]:
            notes.append(f"sliding_window {window}: full attention priced (the same up to {window} tokens)")
        if model_type in ("qwen3", "qwen3_moe", "olmoe"):
            arch["qk_norm"] = True  # RMSNorm on q and k per head (Qwen3Attention q_norm/k_norm; OLMoE over all heads)
        if model_type in MOE_LIKE:
            arch["moe"] = _moe_from_config(cfg, path, model_type, arch["num_layers"], notes)
        family = "llama"
    elif model_type == "gpt2":
        d = _get(cfg, path, "n_embd", "hidden_size")
        inner = cfg.get("n_inner")
        arch = dict(
            num_layers=_get(cfg, path, "n_layer", "num_hidden_layers"), d_model=d,
            num_heads=_get(cfg, path, "n_head", "num_attention_heads"), vocab_size=_get(cfg, path, "vocab_size"),
            max_seq_len=_get(cfg, path, "n_positions", "n_ctx"), mlp="gelu",
            mlp_hidden_dim=inner if isinstance(inner, int) and inner > 0 else 4 * d, norm="layernorm",
            norm_learnable=True, linear_bias=True, tied_embeddings=_get(cfg, path, "tie_word_embeddings", default=True,
                                                                        kind=bool), position="learned")
        arch["num_kv_heads"] = arch["num_heads"]
        arch["head_dim"] = d // arch["num_heads"] if arch["num_heads"] else 1
        family = "gpt2"
    elif model_type == "gpt_neox":
        d = _get(cfg, path, "hidden_size")
        heads = _get(cfg, path, "num_attention_heads")
        arch = dict(
            num_layers=_get(cfg, path, "num_hidden_layers"), d_model=d, num_heads=heads, num_kv_heads=heads,
            head_dim=d // heads if heads else 1, vocab_size=_get(cfg, path, "vocab_size"),
            max_seq_len=_get(cfg, path, "max_position_embeddings"), mlp="gelu",
            mlp_hidden_dim=_get(cfg, path, "intermediate_size"), norm="layernorm", norm_learnable=True,
            linear_bias=True, tied_embeddings=_get(cfg, path, "tie_word_embeddings", default=False, kind=bool),
            position="rope")
        if _get(cfg, path, "use_parallel_residual", default=True, kind=bool):
            notes.append("GPT-NeoX's parallel residual priced as sequential attention then MLP (the same ops)")
        family = "gpt2"
    else:
        raise SpecError(f"model_type {model_type!r} is not one ddplan reads; allowed: "
                        f"{', '.join(READ)}", file=str(path), field="model_type")
    # dropout as the config states it (GPT-2: attn_pdrop / resid_pdrop; Llama, Qwen2, GPT-NeoX:
    # attention_dropout / hidden_dropout); the embedding dropout (embd_pdrop) is not modelled
    hidden = _get(cfg, path, "resid_pdrop", "hidden_dropout", default=0.0, kind=float)
    attention = _get(cfg, path, "attn_pdrop", "attention_dropout", default=0.0, kind=float)
    if hidden or attention:
        if not (0 <= hidden < 1 and 0 <= attention < 1):
            raise SpecError(f"dropout must be in [0, 1), got {hidden}, {attention}", file=str(path),
                            field="resid_pdrop/attn_pdrop")
        arch["dropout"] = {"hidden": float(hidden), "attention": float(attention)}
        notes.append(f"dropout {hidden:g} on hidden states and {attention:g} on attention probabilities, as the "
                     f"config states (set them to 0 in the spec for a run without)")
    return arch, family, notes


def _moe_from_config(cfg: dict, path: Path, model_type: str, layers: int, notes: list[str]) -> dict:
    """The `moe` fields of a mixture-of-experts config. Mixtral (MixtralConfig): num_local_experts experts of
    intermediate_size, num_experts_per_tok of them per token. Qwen2-MoE / Qwen3-MoE: num_experts of
    moe_intermediate_size, Qwen2-MoE's shared expert of shared_expert_intermediate_size behind a sigmoid gate,
    dense layers where decoder_sparse_step or mlp_only_layers say. OLMoE: num_experts of intermediate_size."""
    experts = _get(cfg, path, "num_local_experts", "num_experts")
    moe: dict = {"num_experts": experts, "top_k": _get(cfg, path, "num_experts_per_tok")}
    if model_type == "mixtral" or model_type == "olmoe":
        moe["expert_hidden_dim"] = _get(cfg, path, "intermediate_size")
    else:
        moe["expert_hidden_dim"] = _get(cfg, path, "moe_intermediate_size")
        shared = _get(cfg, path, "shared_expert_intermediate_size", default=0)
        if shared:
            moe.update(shared_experts=1, shared_hidden_dim=shared, shared_expert_gate=model_type == "qwen2_moe")
        step = _get(cfg, path, "decoder_sparse_step", default=1)
        dense = cfg.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense):
            raise SpecError(f"must be a list of layer indices below {layers}, got {dense!r}", file=str(path),
                            field="mlp_only_layers")
        sparse = [i for i in range(layers) if i not in dense and step > 0 and (i + 1) % step == 0]
        if len(sparse) < layers:
            moe["dense_layers"] = layers - len(sparse)
            if sparse != list(range(layers - len(sparse), layers)):
                notes.append(f"{layers - len(sparse)} dense-MLP layers priced as the first ones (the config places "
                             f"them elsewhere: the same work in all, but with pipeline parallelism a stage's share "
                             f"of them may differ)")
    if model_type == "qwen2_moe" or model_type == "qwen3_moe":
        if _get(cfg, path, "norm_topk_prob", default=False, kind=bool):
            notes.append("norm_topk_prob: renormalised routing weights (no cost of note)")
    notes.append(f"routing dropless (every routed token computed once); under expert parallelism the busiest rank "
                 f"takes {DROPLESS_IMBALANCE:g}x the mean rows (moe.load_imbalance; `--moe-imbalance`)")
    return moe


def spec_from_config(path: Path):
    """The ModelSpec of a local config.json: its architecture, and ddplan's stated defaults for the rest."""
    cfg = _Reads(read_config(path))
    fields, family, notes = architecture_from_config(cfg, path)
    unread = sorted(k for k in cfg if k not in cfg.read and k not in NOT_COST)
    if unread:
        warnings.warn(InputWarning(
            f"{path}: {len(unread)} field{'s' if len(unread) > 1 else ''} of model_type {cfg['model_type']} not "
            f"read: {', '.join(unread[:12])}{', ...' if len(unread) > 12 else ''}; the spec is built without them "
            f"(if they change the model, e.g. experts or latent attention on a config relabelled, the price is off)"))
    arch = validate(Architecture, fields, f"{path}: (the architecture it gives)")
    groups = present_param_groups(arch)
    seq = min(DEFAULT_SEQ_LEN, arch.max_seq_len)
    batch = max(seq, DEFAULT_BATCH_TOKENS // seq * seq)
    params = total_params(arch)
    tokens = max(1, DEFAULT_TOKENS_PER_PARAM * params)
    name = _name(cfg, path)
    defaults = (f"assumed, not in {path.name}: sequence {seq} (the config's max_position_embeddings "
                f"{arch.max_seq_len} capped at {DEFAULT_SEQ_LEN}), total batch {batch:,} tokens (~4M, Llama 2 arXiv "
                f"2307.09288 sec. 2.2), device batch 1, FSDP, {DEFAULT_TOKENS_PER_PARAM} tokens per parameter "
                f"(Chinchilla, arXiv 2203.15556), eager (no torch.compile)")
    data = {
        "kind": "model", "name": name, "aliases": [], "family": family,
        "description": f"{name} from {path} (model_type {cfg['model_type']}): {arch.num_layers} layers, "
                       f"{arch.d_model} wide, {arch.num_heads} heads ({arch.num_kv_heads} KV) of {arch.head_dim}, "
                       f"{arch.mlp} {arch.mlp_hidden_dim}, vocab {arch.vocab_size}"
                       + (f", {arch.moe.num_experts} experts of {arch.moe.expert_hidden_dim} (top {arch.moe.top_k})"
                          if arch.moe else "")
                       + (f"; {'; '.join(notes)}" if notes else ""),
        "source": f"Hugging Face config {path} (read by ddplan.hf); " + defaults
                  + (f"; approximated: {'; '.join(notes)}" if notes else ""),
        "architecture": arch.model_dump(mode="json", exclude_defaults=True),
        "dtypes": {"compute": "bf16", "params": dict.fromkeys(groups, "fp32"), "logits": "fp32"},
        "recipe": {
            "seq_len": seq, "device_batch_size": 1, "total_batch_tokens": batch,
            "budget": {"tokens": tokens},
            "optimizer": {"name": "AdamW", "algorithm": dict.fromkeys(groups, "adamw"), "adamw_state_dtype": "fp32",
                          "source": "assumed: AdamW with fp32 states and fp32 master weights (bf16 mixed precision), "
                                    "the common pre-training setup; not in the config"},
            "distribution": "fsdp", "compiled": False, "source": defaults,
        },
    }
    return validate(ModelSpec, data, f"{path}: (the spec it gives)")


def _name(cfg: dict, path: Path) -> str:
    raw = cfg.get("_name_or_path") if isinstance(cfg.get("_name_or_path"), str) else ""
    fallback = path.resolve().parent.name if path.name == "config.json" else path.stem
    raw = raw.rstrip("/").split("/")[-1] or fallback or "model"
    slug = re.sub(r"[^a-z0-9_.-]+", "-", raw.lower()).strip("-.")
    return slug if slug and slug[0].isalnum() else "hf-model"
