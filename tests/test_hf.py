"""--model config.json: a ddplan spec from a local Hugging Face config (ddplan.hf), and `ddplan specs import`.

The configs are written here (no download), with the fields of the published config.json files; the
parameter counts are the published totals of those models.
"""

from __future__ import annotations

import json

import pytest

from ddplan.errors import SpecError
from ddplan.hf import config_path, spec_from_config
from ddplan.params import total_params
from ddplan.registry import load_model

from cli_helpers import csv_rows, fails, run, run_ok

CONFIGS = {
    # meta-llama/Meta-Llama-3-8B config.json; 8,030,261,248 parameters (the model card's 8.03B)
    "llama-3-8b": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                    "max_position_embeddings": 8192, "tie_word_embeddings": False}, 8_030_261_248),
    # mistralai/Mistral-7B-v0.1 config.json; 7,241,732,096 (the model card's 7.24B)
    "mistral-7b": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                    "max_position_embeddings": 32768, "sliding_window": 4096, "tie_word_embeddings": False},
                   7_241_732_096),
    # Qwen/Qwen2-7B config.json (q, k, v with bias); 7,615,616,512 (the model card's 7.62B)
    "qwen2-7b": ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                  "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                  "max_position_embeddings": 131072, "tie_word_embeddings": False}, 7_615_616_512),
    # google/gemma-7b config.json (16 heads of 256 over a 3072 stream, tied); 8,537,680,896 (the card's 8.54B)
    "gemma-7b": ({"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 256000,
                  "max_position_embeddings": 8192}, 8_537_680_896),
    # openai-community/gpt2 config.json; 124,439,808 (HF's count of GPT-2 small, tied)
    "gpt2": ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
              "vocab_size": 50257}, 124_439_808),
    # EleutherAI/pythia-6.9b config.json; 6,857,302,016 (Biderman et al. 2023, Table 1's 6,857,302,016)
    "pythia-6.9b": ({"model_type": "gpt_neox", "hidden_size": 4096, "intermediate_size": 16384,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 50432,
                     "max_position_embeddings": 2048, "tie_word_embeddings": False}, 6_857_302_016),
}


def _write(tmp_path, name: str, cfg: dict):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(cfg), encoding="utf-8")
    return p


@pytest.mark.parametrize("name", CONFIGS)
def test_published_parameter_counts(tmp_path, name):
    cfg, published = CONFIGS[name]
    spec = load_model(str(_write(tmp_path, name, cfg)))
    assert total_params(spec.architecture) == published
    assert spec.name == name


def test_a_folder_holding_config_json(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS["llama-3-8b"][0]), encoding="utf-8")
    assert config_path(str(folder)) == folder / "config.json"
    spec = load_model(str(folder))
    assert spec.name == "meta-llama-3-8b" and total_params(spec.architecture) == 8_030_261_248


def test_defaults_are_stated_and_a_table_prices_the_config(capsys, tmp_path):
    p = _write(tmp_path, "mistral-7b", CONFIGS["mistral-7b"][0])
    spec = spec_from_config(p)
    assert spec.recipe.seq_len == 4096 and spec.recipe.total_batch_tokens == 4_194_304
    assert "assumed" in spec.recipe.source and "sliding_window 4096" in spec.source
    out = run_ok(capsys, ["table", "--model", str(p), "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa2",
                          "--format", "csv"])
    (row,) = csv_rows(out)
    assert float(row["step_s"]) > 0


def test_specs_import_writes_a_spec_that_loads_back(capsys, tmp_path):
    p = _write(tmp_path, "qwen2-7b", CONFIGS["qwen2-7b"][0])
    out = tmp_path / "qwen.yaml"
    code, stdout, err = run(capsys, ["specs", "import", str(p), "-o", str(out)])
    assert code == 0 and "wrote" in err and stdout == ""
    again = load_model(str(out))
    assert total_params(again.architecture) == 7_615_616_512 and again.architecture.qkv_bias
    assert not list(tmp_path.glob(".qwen.yaml.*"))  # no temporary file left behind


@pytest.mark.parametrize("cfg, words", [
    ({"model_type": "deepseek_v3", "n_routed_experts": 256, "kv_lora_rank": 512}, "multi-head latent attention"),
    ({"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 2,
      "vocab_size": 10, "max_position_embeddings": 64, "intermediate_size": 64, "num_experts_per_tok": 2},
     "num_local_experts: missing"),
    ({"model_type": "mixtral", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 10, "max_position_embeddings": 64, "intermediate_size": 64, "num_local_experts": 2,
      "num_experts_per_tok": 3}, "top_k (3) cannot exceed num_experts (2)"),
    ({"model_type": "t5"}, "allowed: llama, mistral"),
    ({"hidden_size": 4096}, "model_type"),
    ({"model_type": "llama", "hidden_size": "4096"}, "hidden_size: must be a whole number, got the text"),
    ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}, "missing"),
    ([1, 2], "JSON object"),
])
def test_bad_configs_get_one_line(capsys, tmp_path, cfg, words):
    p = _write(tmp_path, "bad", cfg)
    _, err = fails(capsys, ["table", "--model", str(p)])
    assert words in err and str(p) in err


def test_not_json_and_missing(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json", encoding="utf-8")
    _, err = fails(capsys, ["table", "--model", str(p)])
    assert "not JSON" in err
    _, err = fails(capsys, ["specs", "import", str(tmp_path / "none.json"), "-o", str(tmp_path / "x.yaml")])
    assert "no such file" in err
    _, err = fails(capsys, ["specs", "import", str(p), "-o", str(tmp_path / "x.txt")])
    assert "--out" in err


def test_dropout_as_the_config_states_it(tmp_path):
    """openai-community/gpt2's config.json has attn_pdrop 0.1 and resid_pdrop 0.1: the spec runs with them
    (their masks in memory); a Llama config has attention_dropout 0.0: none."""
    gpt2 = dict(CONFIGS["gpt2"][0], attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.1)
    spec = spec_from_config(_write(tmp_path, "gpt2", gpt2))
    assert (spec.architecture.dropout.hidden, spec.architecture.dropout.attention) == (0.1, 0.1)
    llama = dict(CONFIGS["llama-3-8b"][0], attention_dropout=0.0)
    spec = spec_from_config(_write(tmp_path, "llama", llama))
    assert (spec.architecture.dropout.hidden, spec.architecture.dropout.attention) == (0.0, 0.0)
    with pytest.raises(SpecError, match="dropout must be in"):
        spec_from_config(_write(tmp_path, "bad", dict(CONFIGS["gpt2"][0], attn_pdrop=1.5)))
