"""`ddplan import`: a run as torchtitan, Megatron-LM, NeMo and nanochat state it, priced as the same flags would.

Each file under tests/data/import/ is a real config from its repository at a pinned commit (the first lines name
it). Each test states, by hand from that file, the `table` flags that describe the same run, and checks that the
imported run file prices to the same row: the import's mapping is checked against a reading of the source, not
against its own output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import csv_rows, fails, run, run_ok

DATA = Path(__file__).parent / "data" / "import"

# file -> (import options, the same run as table flags, read by hand from the file), each with the reason
CASES = {
    # [parallelism] shard -1, tp/pp/cp 1 -> FSDP over the world size, which the file gives only in its note ("a
    # preset for 64 A100 GPUs"); local_batch_size 1, seq_len 8192 -> 64 x 8192 tokens a step; steps 1000;
    # activation_checkpoint selective + op -> per-op; compile off; bf16 params, fp32 reduce; no fp8 converter; a TOML
    # is torchtitan before its chunked loss: eager cross entropy
    "torchtitan-llama3-8b.toml": ([], [
        "--model", "llama-3-8b", "--framework", "torchtitan", "--hardware", "a100-sxm-80gb", "--gpus", "64",
        "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3", "--device-batch-size", "1",
        "--total-batch-size", str(64 * 8192), "--seq-len", "8192", "--steps", "1000", "--dtype", "bf16",
        "--grads", "fp32", "--recompute", "per-op", "--no-compile", "--cross-entropy", "eager"]),
    # the 70B preset: tp 8, local batch 8, full AC; world size 64 from its note -> dp 8, 64 sequences a step
    "torchtitan-llama3-70b.toml": ([], [
        "--model", "llama-3-70b", "--framework", "torchtitan", "--hardware", "a100-sxm-80gb", "--gpus", "64",
        "--tp", "8", "--pp", "1", "--cp", "1", "--zero", "3", "--device-batch-size", "8",
        "--total-batch-size", str(64 * 8192), "--seq-len", "8192", "--steps", "1000", "--dtype", "bf16",
        "--grads", "fp32", "--recompute", "full", "--no-compile", "--cross-entropy", "eager"]),
    # GPT-3 175B dims (96 x 12288, 96 heads, GPT-2 BPE padded to 51200 at tp 8), tp 8 pp 16, micro-batch 1,
    # global batch 1536 x 2048, fp16, 500,000 iterations; the script's 8 GPUs cannot hold tp x pp = 128, so
    # import --gpus 1024 states the run (as its "Change for multinode config" comment asks)
    "megatron-gpt3-175b.sh": (["--gpus", "1024", "--hardware", "a100-sxm-80gb"], [
        "--model", "gpt3-175b", "--framework", "megatron-core", "--hardware", "a100-sxm-80gb", "--gpus", "1024",
        "--tp", "8", "--pp", "16", "--cp", "1", "--device-batch-size", "1", "--total-batch-size",
        str(1536 * 2048), "--seq-len", "2048", "--steps", "500000", "--dtype", "fp16"]),
    # Llama 3 8B dims, 8 GPUs (GPUS_PER_NODE 8 x NUM_NODES 1), tp/cp 1 (its --sequence-parallel is off at tp 1),
    # distributed optimizer (ZeRO-1), gradient reduce and param gather overlapped, micro-batch 1, global 128 x 8192,
    # bf16 with bf16 gradient reduction, fp8 hybrid (delayed scaling) with --fp8-param-gather (fp8 weights the
    # distributed optimizer gathers), --train-samples 1,953,125,000 x 8192 tokens
    "megatron-llama3-8b-fp8.sh": ([], [
        "--model", "llama-3-8b", "--framework", "megatron-core", "--hardware", "h100-sxm", "--gpus", "8",
        "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "1", "--overlap-grad-reduce", "--overlap-param-gather",
        "--device-batch-size", "1", "--total-batch-size", str(128 * 8192), "--seq-len", "8192",
        "--tokens", str(1_953_125_000 * 8192), "--dtype", "bf16", "--grads", "param", "--fp8", "--fp8-recipe", "delayed", "--fp8-params"]),
    # Qwen3-30B-A3B dims (48 x 2048, 32 heads, 4 KV groups, 128 experts of 768, top 8, vocab 151,936), tp 4
    # (TP default), ep 2, micro-batch 1, global 256 x 8192, bf16; no GPU count: one node of 8 assumed
    "megatron-qwen3-30b-a3b.sh": ([], [
        "--model", "qwen3-30b-a3b", "--framework", "megatron-core", "--hardware", "h100-sxm", "--gpus", "8",
        "--tp", "4", "--pp", "1", "--cp", "1", "--ep", "2", "--device-batch-size", "1",
        "--total-batch-size", str(256 * 8192), "--seq-len", "8192", "--dtype", "bf16"]),
    # NeMo launcher Llama 3.1 8B: 16 nodes x 8, tp 1 pp 1 cp 2, micro 1, global 2048 x 8192, bf16, 300,000 steps,
    # mcore_distributed_optim with overlap_grad_sync and overlap_param_sync -> ZeRO-1 with the reduce and the gather
    # overlapped; no recompute
    "nemo-llama3-1-8b.yaml": ([], [
        "--model", "llama-3-8b", "--framework", "megatron-core", "--hardware", "h100-sxm", "--gpus", "128",
        "--tp", "1", "--pp", "1", "--cp", "2", "--zero", "1", "--overlap-grad-reduce", "--overlap-param-gather",
        "--device-batch-size", "1", "--total-batch-size", str(2048 * 8192), "--seq-len", "8192",
        "--steps", "300000", "--dtype", "bf16"]),
    # speedrun.sh: 8 processes, depth 24, data:param ratio 8, 16 sequences a GPU, fp8 (nanochat's tensorwise)
    "nanochat-speedrun.sh": ([], [
        "--model", "d24", "--framework", "nanochat", "--hardware", "h100-sxm", "--gpus", "8",
        "--device-batch-size", "16", "--param-data-ratio", "8", "--fp8", "--fp8-recipe", "nanochat"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_imported_file_prices_as_the_same_run_stated_by_flags(capsys, tmp_path, name):
    options, flags = CASES[name]
    out = tmp_path / "run.yaml"
    run_ok(capsys, ["import", str(DATA / name), "-o", str(out), *options])
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# written by `ddplan import") and "kind: run" in text
    attention = ["--attention", "fa2"]  # one row each; the files do not name an attention kernel
    imported = csv_rows(run_ok(capsys, ["table", "--config", str(out), *attention, "--format", "csv"]))
    stated = csv_rows(run_ok(capsys, ["table", *flags, *attention, "--format", "csv"]))
    assert len(imported) == len(stated) >= 1
    assert imported == stated


def test_what_the_file_does_not_say_is_marked_assumed(capsys, tmp_path):
    """torchtitan's shard degree -1 takes the world size, which only the preset's note gives; no file names the
    GPU: both are written, each marked `# assumed:` with why; --gpus and --hardware to import replace them."""
    out = tmp_path / "run.yaml"
    run_ok(capsys, ["import", str(DATA / "torchtitan-llama3-8b.toml"), "-o", str(out)])
    lines = out.read_text(encoding="utf-8").splitlines()
    gpus = next(ln for ln in lines if ln.startswith("gpus:"))
    assert gpus.startswith("gpus: 64  # assumed: ") and "preset for 64 A100 GPUs" in gpus
    assert next(ln for ln in lines if ln.startswith("hardware:")).startswith("hardware: a100-sxm-80gb  # assumed: ")
    assert "framework: torchtitan" in lines
    run_ok(capsys, ["import", str(DATA / "torchtitan-llama3-8b.toml"), "-o", str(out), "--gpus", "16",
                    "--hardware", "h100-sxm"])
    text = out.read_text(encoding="utf-8")
    assert "gpus: 16  # given to import" in text and "hardware: h100-sxm\n" in text
    assert "total_tokens: 131072" in text  # local batch 1 x dp 16 x 8192
    run_ok(capsys, ["import", str(DATA / "torchtitan-llama3-8b.toml"), "-o", str(out)])
    text = out.read_text(encoding="utf-8")  # derived from the assumed GPU count: assumed too
    assert "  total_tokens: 524288  # assumed: 64 sequences of 8192 tokens" in text


def test_what_is_not_priced_as_stated_is_a_warning(capsys, tmp_path):
    """The GPT-3 script's 8 GPUs cannot hold tp 8 x pp 16: a warning, and 128 (one replica) marked assumed; an
    option import does not know is named; options that do not change cost are counted on stderr."""
    out = tmp_path / "run.yaml"
    code, _, err = run(capsys, ["import", str(DATA / "megatron-gpt3-175b.sh"), "-o", str(out)])
    assert code == 0
    assert "warning: " in err and "does not divide: 128 assumed" in err
    assert "gpus: 128  # assumed: " in out.read_text(encoding="utf-8")
    assert "import: not read, as they do not change a step's cost: 22 options" in err
    script = tmp_path / "args.txt"
    script.write_text("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
                      "--micro-batch-size 2 --frobnicate 3 --lr 1e-4\n", encoding="utf-8")
    code, _, err = run(capsys, ["import", str(script), "-o", str(out), "--from", "megatron"])
    assert code == 0 and "warning: " in err and "--frobnicate is not read" in err
    # no built-in has these dimensions: the architecture is written beside as a config.json, and it prices
    assert "model: run.config.json" in out.read_text(encoding="utf-8")
    assert (tmp_path / "run.config.json").is_file()
    (row,) = csv_rows(run_ok(capsys, ["table", "--config", str(out), "--attention", "fa2", "--format", "csv"]))
    assert row["tp"] == "1" and float(row["step_s"]) > 0


@pytest.mark.parametrize("text, suffix, words", [
    ("hello\n", ".txt", "not a torchtitan job TOML"),
    ("[model\n", ".toml", "not valid TOML"),
    ('[model]\nname = "llama3"\nflavor = "3B"\n', ".toml", "import reads llama3 flavors 8B, 70B, 405B"),
    ("--num-layers 2 --hidden-size 64\n", ".sh", "--num-attention-heads is not given"),
    ("--num-layers x --hidden-size 64 --num-attention-heads 2\n", ".sh", "--num-layers: must be a whole number"),
    ("trainer:\n  devices: 8\nmodel:\n  num_layers: 2\n", ".yaml", "hidden_size, num_layers and num_attention_heads"),
    # found by feeding each reader odd values (2026-12-04): each was an internal error
    ("training = 3\n[model]\nname = \"llama3\"\n", ".toml", "training: must be a table ([training]), got 3"),
    ("trainer:\n  devices: 8\nmodel:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 2\n"
     "  encoder_seq_length: 64\n  tokenizer: 3\n", ".yaml", "model.tokenizer: must be a mapping, got 3"),
])
def test_a_file_that_is_not_what_it_claims_is_one_error_line(capsys, tmp_path, text, suffix, words):
    path = tmp_path / f"cfg{suffix}"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "run.yaml"
    code, line = fails(capsys, ["import", str(path), "-o", str(out)])
    assert code == 1 and words in line and str(path) in line
    assert not out.exists()  # nothing half-written


def test_import_flags_are_checked_before_anything_is_written(capsys, tmp_path):
    out = tmp_path / "run.yaml"
    _, line = fails(capsys, ["import", str(DATA / "nanochat-speedrun.sh"), "-o", str(out), "--hardware", "h1000"])
    assert "h1000" in line and not out.exists()
    _, line = fails(capsys, ["import", str(DATA / "nanochat-speedrun.sh"), "-o", str(tmp_path / "run.txt")])
    assert "--out" in line
    _, line = fails(capsys, ["import", str(tmp_path / "missing.toml"), "-o", str(out)])
    assert "no such file" in line


def test_torchtitan_ffn_sizes_are_meta_llama3s():
    """torchtitan's FeedForward rule gives Llama 3's published hidden sizes (HF configs: 14,336, 28,672, 53,248)."""
    from ddplan.importers import TITAN_LLAMA3, titan_ffn

    got = {f: titan_ffn(dim, mult, multiple) for f, (dim, _, _, _, mult, multiple) in TITAN_LLAMA3.items()}
    assert got == {"8B": 14336, "70B": 28672, "405B": 53248}


def test_megatron_pads_the_vocabulary_as_megatron_does():
    """_vocab_size_with_padding: 50,257 to a multiple of 128 x tp (51,200 at tp 8, as Korthikanti et al.'s runs;
    50,304 at tp 1, nanoGPT's well-known padded size)."""
    from ddplan.importers import padded_vocab

    assert padded_vocab(50257, 128, 8) == 51200
    assert padded_vocab(50257, 128, 1) == 50304
    assert padded_vocab(128256, 128, 1) == 128256


def test_a_mixture_of_experts_no_built_in_has_is_written_as_its_config(capsys, tmp_path):
    """Megatron-LM MoE arguments of no built-in model: a Mixtral-style config.json beside (experts, top-k, expert
    width), which prices with the experts split over --expert-model-parallel-size; a layer frequency other than 1
    is one error line (not priced as something else)."""
    args = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --group-query-attention --num-query-groups 2 "
            "--ffn-hidden-size 2048 --swiglu --untie-embeddings-and-output-weights --position-embedding-type rope "
            "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 --expert-model-parallel-size 2 "
            "--seq-length 1024 --micro-batch-size 2 --global-batch-size 64 --bf16 --vocab-size 32000 "
            "--nproc_per_node 8")
    path = tmp_path / "moe.sh"
    path.write_text(args + "\n", encoding="utf-8")
    out = tmp_path / "run.yaml"
    run_ok(capsys, ["import", str(path), "-o", str(out), "--from", "megatron"])
    import json

    cfg = json.loads((tmp_path / "run.config.json").read_text(encoding="utf-8"))
    assert (cfg["model_type"], cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]) == (
        "mixtral", 8, 2, 1024)
    assert cfg["vocab_size"] == 32000 and cfg["num_key_value_heads"] == 2
    (row,) = csv_rows(run_ok(capsys, ["table", "--config", str(out), "--attention", "fa2", "--format", "csv"]))
    assert row["ep"] == "2" and row["gpus"] == "8"
    path.write_text(args + " --moe-layer-freq 2\n", encoding="utf-8")
    _, line = fails(capsys, ["import", str(path), "-o", str(out), "--from", "megatron"])
    assert "--moe-layer-freq 2" in line


def test_megatron_s_own_argument_map_prices_as_the_memory_dataset_states_that_run(capsys, tmp_path):
    """Megatron-LM's functional tests keep their arguments as a YAML map (MODEL_ARGS). Imported, the 12-layer tp 4
    distributed-optimizer test prices to the same memory and step as validation/memory_peaks.yaml's entry for
    that run (megatron-test-tiny-tp4-distopt-h100, stated by hand from the same file): two ways in, one run."""
    from ddplan.replay import price_run
    from ddplan.runs import load_peaks

    out = tmp_path / "run.yaml"
    run_ok(capsys, ["import", str(DATA / "megatron-test-tiny-tp4-model_config.yaml"), "-o", str(out)])
    text = out.read_text(encoding="utf-8")
    assert "framework: megatron-core" in text and "  tp: 4" in text and "  zero: 1" in text
    (row,) = csv_rows(run_ok(capsys, ["table", "--config", str(out), "--format", "csv"]))
    (peak,) = [p for p in load_peaks().peaks if p.id == "megatron-test-tiny-tp4-distopt-h100"]
    *_, priced = price_run(peak, peak.id)
    assert float(row["memory_gib"]) == pytest.approx(priced.memory.total / 2**30, rel=1e-12)
    assert float(row["step_s"]) == pytest.approx(priced.step_s, rel=1e-12)


def test_grouped_query_attention_with_a_gelu_mlp_is_an_error_not_a_dropped_group(capsys, tmp_path):
    """No config.json layout ddplan reads holds KV groups with a GELU MLP (Llama's is SwiGLU, GPT-2's has no
    groups): import says so and names --model, rather than writing a model without its groups."""
    path = tmp_path / "args.sh"
    path.write_text("--num-layers 2 --hidden-size 512 --num-attention-heads 8 --group-query-attention "
                    "--num-query-groups 2 --seq-length 128\n", encoding="utf-8")
    _, line = fails(capsys, ["import", str(path), "-o", str(tmp_path / "run.yaml"), "--from", "megatron"])
    assert "KV groups" in line and "--model" in line


def test_review_fixes_each_stated_by_the_source(capsys, tmp_path):
    """Found in review (2026-12-04), each against its source:
    - Megatron's --swiglu default width is int(4h x 2/3 / 64) x 64 (arguments.py@d98e8a6 L1327): 10,880 at h 4096;
    - torchtitan runs a pipeline's local batch in micro-batches of pipeline_parallel_microbatch_size (default 1);
    - import --model rescues a file whose model import cannot read (an unknown flavor, an unknown tokenizer);
    - --gpus wins over nanochat's torchrun line; a file value that is not a number is one error line."""
    out = tmp_path / "run.yaml"
    args = tmp_path / "swiglu.sh"
    args.write_text("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --swiglu --seq-length 128 "
                    "--untie-embeddings-and-output-weights --position-embedding-type rope --vocab-size 32000\n",
                    encoding="utf-8")
    run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    import json

    assert json.loads((tmp_path / "run.config.json").read_text(encoding="utf-8"))["intermediate_size"] == 10880
    toml = tmp_path / "pp.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 16\nseq_len = 1024\n'
                    '[parallelism]\npipeline_parallel_degree = 4\ndata_parallel_shard_degree = 2\n', encoding="utf-8")
    run_ok(capsys, ["import", str(toml), "-o", str(out)])
    text = out.read_text(encoding="utf-8")
    assert "  device: 1  # parallelism.pipeline_parallel_microbatch_size (local batch 16)" in text
    assert "gpus: 8  # the product" in text
    # torchtitan's fsdp_reshard_after_forward "default" keeps the gathered parameters under a pipeline
    assert "reshard_after_forward: false  # fsdp_reshard_after_forward 'default' with pipeline parallelism" in text
    toml.write_text('[model]\nname = "qwen3"\nflavor = "30B-A3B"\n[parallelism]\nexpert_parallel_degree = 2\n',
                    encoding="utf-8")
    run_ok(capsys, ["import", str(toml), "-o", str(out), "--model", "qwen3-30b-a3b", "--gpus", "8"])
    assert "model: qwen3-30b-a3b  # given to import" in out.read_text(encoding="utf-8")
    line = tmp_path / "nano.sh"
    line.write_text("torchrun --nproc_per_node=8 -m scripts.base_train -- --depth=12\n", encoding="utf-8")
    run_ok(capsys, ["import", str(line), "-o", str(out), "--gpus", "16"])
    assert "gpus: 16  # given to import" in out.read_text(encoding="utf-8")
    line.write_text("torchrun --nproc_per_node=8 -m scripts.base_train -- --depth=12 --eval-every=$EVAL\n",
                    encoding="utf-8")
    _, err = fails(capsys, ["import", str(line), "-o", str(out)])
    assert "--eval-every: must be a whole number, got '$EVAL'" in err


def test_nemo_s_amp_o2_and_megatron_s_default_global_batch(capsys, tmp_path):
    """NeMo's megatron_amp_O2 decides how weights are kept (true: 16-bit with fp32 masters; false: fp32 under
    autocast); a sibling reference (${.encoder_seq_length}) is read as its value. Megatron without
    --global-batch-size takes one micro-batch a data-parallel rank (2 x 8 / tp 2 = 8 sequences here)."""
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text("trainer:\n  devices: 8\n  precision: bf16\nmodel:\n  num_layers: 2\n  hidden_size: 256\n"
                    "  num_attention_heads: 4\n  encoder_seq_length: 512\n  max_position_embeddings: "
                    "${.encoder_seq_length}\n  megatron_amp_O2: false\n  tokenizer:\n    type: GPT2BPETokenizer\n",
                    encoding="utf-8")
    out = tmp_path / "run.yaml"
    run_ok(capsys, ["import", str(nemo), "-o", str(out)])
    assert "  weights: fp32  # model.megatron_amp_O2 false" in out.read_text(encoding="utf-8")
    args = tmp_path / "args.sh"
    args.write_text("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 2 "
                    "--nproc_per_node 8 --tensor-model-parallel-size 2\n", encoding="utf-8")
    run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    assert "  total_tokens: 1024  # no --global-batch-size" in out.read_text(encoding="utf-8")


def test_megatron_s_recompute_modules_are_the_per_module_policy(capsys, tmp_path):
    """--recompute-modules takes a list (nargs '+'): the ModelZoo's `--recompute-granularity selective
    --recompute-modules layernorm moe_act` is ddplan's selective:layernorm+moe_act, which prices less memory than
    core_attn alone; selective with no modules is Megatron's default, core_attn (`selective`); a module ddplan does
    not model is a warning, left out. NeMo's recompute_modules list reads the same way."""
    out = tmp_path / "run.yaml"
    args = tmp_path / "args.sh"
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --micro-batch-size 4 "
            "--nproc_per_node 8 --bf16 --recompute-granularity selective")
    memory = {}
    for modules, policy in (("", "selective"), (" --recompute-modules layernorm mlp", "selective:layernorm+mlp"),
                            (" --recompute-modules core_attn", "selective")):
        args.write_text(base + modules + "\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        assert f"recompute: {policy}" in out.read_text(encoding="utf-8")
        memory[policy] = float(csv_rows(run_ok(capsys, ["memory", "--config", str(out), "--format", "csv"]))[0]
                               ["activations_gib"])
    assert memory["selective:layernorm+mlp"] < memory["selective"]
    args.write_text(base + " --recompute-modules mla_up_proj moe_act --lr 1e-4\n", encoding="utf-8")
    code, _, err = run(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    assert code == 0 and "--recompute-modules mla_up_proj: not modelled" in err
    assert "recompute: selective:moe_act" in out.read_text(encoding="utf-8")
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text("trainer:\n  devices: 8\n  precision: bf16\nmodel:\n  num_layers: 2\n  hidden_size: 256\n"
                    "  num_attention_heads: 4\n  encoder_seq_length: 512\n  recompute_granularity: selective\n"
                    "  recompute_modules: [mlp, core_attn]\n  tokenizer:\n    type: GPT2BPETokenizer\n", encoding="utf-8")
    run_ok(capsys, ["import", str(nemo), "-o", str(out)])
    assert "recompute: selective:core_attn+mlp" in out.read_text(encoding="utf-8")
    # found in review: a module named twice (Megatron takes it once) and a list item that is not a name
    args.write_text(base + " --recompute-modules mlp core_attn mlp\n", encoding="utf-8")
    run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    assert "recompute: selective:core_attn+mlp" in out.read_text(encoding="utf-8")
    nemo.write_text(nemo.read_text(encoding="utf-8").replace("[mlp, core_attn]", "[mlp, 3]"), encoding="utf-8")
    _, err = fails(capsys, ["import", str(nemo), "-o", str(out)])
    assert "model.recompute_modules: must be a list of module names" in err and "Traceback" not in err
    args.write_text(base + " --recompute-modules --bf16\n", encoding="utf-8")  # the flag with no module
    _, err = fails(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    assert "--recompute-modules needs at least one module" in err and "internal error" not in err


def test_megatron_s_block_recompute_is_full_n_and_prices_between_none_and_full(capsys, tmp_path):
    """--recompute-granularity full --recompute-method block --recompute-num-layers N (NeMo:
    activations_checkpoint_method block) is ddplan's full:N, whose activations lie between none's and full's; the
    uniform method is full (with N > 1, a warning: one checkpoint per N layers); a block N that is not a number is
    one line naming the field."""
    out, args = tmp_path / "run.yaml", tmp_path / "args.sh"
    base = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --micro-batch-size 4 "
            "--nproc_per_node 8 --bf16")
    gib = {}
    for extra, policy in (("", "none"), (" --recompute-granularity full --recompute-method block "
                                         "--recompute-num-layers 2", "full:2"),
                          (" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1", "full")):
        args.write_text(base + extra + "\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        text = out.read_text(encoding="utf-8")
        assert f"recompute: {policy}" in text if policy != "none" else "recompute:" not in text  # Megatron's default
        gib[policy] = float(csv_rows(run_ok(capsys, ["memory", "--config", str(out), "--format", "csv"]))[0]
                            ["activations_gib"])
    assert gib["full"] < gib["full:2"] < gib["none"]
    # 2 of 8 layers re-run whole: a quarter of the way from none to full (the layers are alike; the embeddings
    # and head keep the same either way up to the checkpoints' shared inputs)
    assert (gib["none"] - gib["full:2"]) / (gib["none"] - gib["full"]) == pytest.approx(0.25, abs=0.01)
    args.write_text(base + " --recompute-granularity full --recompute-method uniform --recompute-num-layers 2\n",
                    encoding="utf-8")
    code, _, err = run(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    assert code == 0 and "recompute: full" in out.read_text(encoding="utf-8") and "one checkpoint per 2 layers" in err
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text("trainer:\n  devices: 8\n  precision: bf16\nmodel:\n  num_layers: 8\n  hidden_size: 256\n"
                    "  num_attention_heads: 4\n  encoder_seq_length: 512\n  activations_checkpoint_granularity: full\n"
                    "  activations_checkpoint_method: block\n  activations_checkpoint_num_layers: 3\n"
                    "  tokenizer:\n    type: GPT2BPETokenizer\n", encoding="utf-8")
    run_ok(capsys, ["import", str(nemo), "-o", str(out)])
    assert "recompute: full:3" in out.read_text(encoding="utf-8")
    nemo.write_text(nemo.read_text(encoding="utf-8").replace("num_layers: 3", "num_layers: three"), encoding="utf-8")
    _, err = fails(capsys, ["import", str(nemo), "-o", str(out)])
    assert "model.activations_checkpoint_num_layers: must be a whole number >= 1" in err and "Traceback" not in err


def test_torchtitan_s_layer_selective_ac_is_every_k(capsys, tmp_path):
    """torchtitan's selective AC with a layer frequency (selective_ac_option "2", its default before 2026-03:
    every 2nd block checkpointed whole) is every:2, whose activations lie halfway between none's and full's on an
    8-layer Llama-like model; "1" (and "0": all) is full."""
    toml = (DATA / "torchtitan-llama3-8b.toml").read_text(encoding="utf-8")
    assert 'selective_ac_option = "op"' in toml
    src, out = tmp_path / "tt.toml", tmp_path / "run.yaml"
    for option, policy in (("2", "every:2"), ("1", "full"), ("0", "full")):
        src.write_text(toml.replace('selective_ac_option = "op"', f'selective_ac_option = "{option}"'), encoding="utf-8")
        run_ok(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
        assert f"recompute: {policy}" in out.read_text(encoding="utf-8"), option
    src.write_text(toml.replace('selective_ac_option = "op"', 'selective_ac_option = "2"'), encoding="utf-8")
    run_ok(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
    gib = {rc: float(csv_rows(run_ok(capsys, ["memory", "--config", str(out), "--recompute", rc, "--format", "csv"]))[0]
                     ["activations_gib"]) for rc in ("none", "every:2", "full")}
    assert (gib["none"] - gib["every:2"]) / (gib["none"] - gib["full"]) == pytest.approx(0.5, abs=0.01)


def test_torchtitan_s_bf16_reduce_is_the_compute_dtype_over_fp32_gradients(capsys, tmp_path):
    """torchtitan's training.mixed_precision_reduce "bfloat16" reduce-scatters bf16 gradients over FSDP2's fp32
    sharded parameters: `grads: compute` (reduced in the compute dtype, kept in fp32), not `param` (the fp32
    parameters' own dtype); the default "float32" is fp32."""
    toml = (DATA / "torchtitan-llama3-8b.toml").read_text(encoding="utf-8")
    src, out = tmp_path / "tt.toml", tmp_path / "run.yaml"
    for reduce, grads in (("bfloat16", "compute"), ("float32", "fp32")):
        src.write_text(toml.replace("seq_len = 8192\n", f'seq_len = 8192\nmixed_precision_reduce = "{reduce}"\n'),
                       encoding="utf-8")
        run_ok(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
        assert f"grads: {grads}" in out.read_text(encoding="utf-8"), reduce
    # a bf16 reduce under fp32 compute (mixed_precision_param float32) is neither: priced fp32, said
    src.write_text(toml.replace("seq_len = 8192\n", 'seq_len = 8192\nmixed_precision_param = "float32"\n'
                                'mixed_precision_reduce = "bfloat16"\n'), encoding="utf-8")
    code, _, err = run(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
    assert code == 0 and "grads: fp32" in out.read_text(encoding="utf-8")
    assert "mixed_precision_reduce bfloat16 is neither float32 nor the compute dtype (float32)" in err


def test_megatron_s_tensorwise_fp8_is_transformer_engine_current_scaling(capsys, tmp_path):
    """Megatron-Core's --fp8-recipe tensorwise runs Transformer Engine's Float8CurrentScaling (fp8_utils.py
    L777-779): ddplan's `current`, not torchao's tensorwise; no recipe is delayed (Megatron's default); mxfp8 is
    ddplan's mxfp8; another (blockwise) is a warning, priced as delayed; --fp8-param-gather keeps the weights in fp8
    (fp8_params) with the distributed optimizer, and is a warning without it."""
    args, out = tmp_path / "args.sh", tmp_path / "run.yaml"
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --micro-batch-size 4 "
            "--nproc_per_node 8 --bf16 --fp8-format hybrid")
    for extra, recipe in ((" --fp8-recipe tensorwise", "current"), ("", "delayed"), (" --fp8-recipe mxfp8", "mxfp8"),
                          (" --fp8-recipe blockwise", "delayed")):
        args.write_text(base + extra + " --fp8-param-gather\n", encoding="utf-8")
        code, _, err = run(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        written = out.read_text(encoding="utf-8")
        assert code == 0 and f"fp8_recipe: {recipe}" in written, extra
        assert ("blockwise: priced as delayed" in err) == ("blockwise" in extra)
        # without the distributed optimizer there is no ZeRO-1 to gather the fp8 weights: not stated, said
        assert "fp8_params: true" not in written and "--fp8-param-gather without the distributed optimizer or " \
            "Megatron-FSDP" in err
    for optimizer in (" --use-distributed-optimizer", " --use-megatron-fsdp"):  # ZeRO-1, and Megatron-FSDP's ZeRO-3
        args.write_text(base + optimizer + " --fp8-param-gather\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        assert "fp8_params: true" in out.read_text(encoding="utf-8"), optimizer


def test_megatron_s_transformer_engine_loss_is_te(capsys, tmp_path):
    """--cross-entropy-loss-fusion --cross-entropy-fusion-impl te runs Transformer Engine's in-place parallel cross
    entropy (language_module.py@d98e8a6 L174): cross_entropy te in the run file; the native fused loss (the impl's
    default) keeps the megatron-core profile's vocab-parallel, so nothing is written for it."""
    args, out = tmp_path / "args.sh", tmp_path / "run.yaml"
    base = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --nproc_per_node 8 --bf16"
    for extra, written in ((" --cross-entropy-loss-fusion --cross-entropy-fusion-impl te", True),
                           (" --cross-entropy-loss-fusion", False), (" --cross-entropy-fusion-impl te", False)):
        args.write_text(base + extra + "\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        assert ("cross_entropy: te" in out.read_text(encoding="utf-8")) == written, extra


def test_megatron_s_overlap_grad_reduce_is_stated_and_its_absence_is_the_profile_s(capsys, tmp_path):
    """--overlap-grad-reduce writes layout.overlap_grad_reduce true; without it nothing is written and the
    megatron-core profile the file names reduces after backward (its default, arguments.py@d98e8a64 L3121)."""
    from ddplan.registry import load_framework

    args, out = tmp_path / "args.sh", tmp_path / "run.yaml"
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --nproc_per_node 8 --bf16 "
            "--use-distributed-optimizer")
    for extra, written in ((" --overlap-grad-reduce", True), ("", False)):
        args.write_text(base + extra + "\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        text = out.read_text(encoding="utf-8")
        assert ("overlap_grad_reduce: true" in text) == written and "framework: megatron-core" in text, extra
    assert load_framework("megatron-core").applies["overlap_grad_reduce"].value is False


def test_megatron_s_gradient_buckets_are_stated_where_its_arguments_set_them(capsys, tmp_path):
    """Under --overlap-grad-reduce: --overlap-param-gather-with-optimizer-step turns bucketing off (one bucket a model
    chunk: grad_bucket chunk, training.py@d98e8a6 L2508-2510), --ddp-bucket-size N states N parameters a bucket, and
    neither leaves the megatron-core profile's default (max(40M, 1M x dp x cp)); without the overlap nothing is
    bucketed and nothing is written. The file it writes then prices (table reads it back)."""
    from ddplan.registry import load_framework

    args, out = tmp_path / "args.sh", tmp_path / "run.yaml"
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --nproc_per_node 8 --bf16 "
            "--use-distributed-optimizer --global-batch-size 64")
    for extra, written in ((" --overlap-grad-reduce --overlap-param-gather-with-optimizer-step", "grad_bucket: chunk"),
                           (" --overlap-grad-reduce --ddp-bucket-size 134217728", "grad_bucket: '134217728'"),
                           (" --overlap-grad-reduce", None), (" --ddp-bucket-size 134217728", None),
                           # Megatron-FSDP (ZeRO-3) reduces a unit at a time: its bucket size is not ZeRO 0-2's
                           (" --overlap-grad-reduce --use-megatron-fsdp --ddp-bucket-size 134217728", None)):
        args.write_text(base + extra + "\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        text = out.read_text(encoding="utf-8")
        assert (written in text) if written else "grad_bucket" not in text, extra
        run_ok(capsys, ["table", "--config", str(out)])
    assert load_framework("megatron-core").applies["grad_bucket"].value == "megatron"


def test_megatron_s_default_attention_backend_is_transformer_engine_s_kernel(capsys, tmp_path):
    """Megatron-Core's attention_backend auto (its default) or fused lets Transformer Engine pick cuDNN's fused
    attention (transformer_config.py@d98e8a6 L151-155): imported as the hardware's nearest priced kernel, assumed
    (cudnn on GB200, fa3 on H100); --use-flash-attn stays fa2 and unfused stays Megatron's own; a GPU listing none of
    them (MI300X) gets no attention line, so each kernel gets its row."""
    args, out = tmp_path / "args.sh", tmp_path / "run.yaml"
    base = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --nproc_per_node 8 --bf16"
    for extra, hardware, line in (("", "gb200", "attention: cudnn  # assumed"),
                                  (" --attention-backend fused", "h100-sxm", "attention: fa3  # assumed"),
                                  (" --use-flash-attn", "h100-sxm", "attention: fa2"),
                                  (" --attention-backend unfused", "h100-sxm", "attention: megatron-unfused")):
        args.write_text(base + extra + "\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron", "--hardware", hardware])
        assert line in out.read_text(encoding="utf-8"), (extra, hardware)
    args.write_text(base + "\n", encoding="utf-8")
    run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron", "--hardware", "mi300x"])
    assert "attention:" not in out.read_text(encoding="utf-8")


def test_a_launch_script_s_comments_and_arrays_read_as_the_shell_reads_them():
    """A # inside quotes is not a comment (`--wandb-exp-name "run#3" --bf16` keeps --bf16); an array may close on
    its last item's line."""
    from ddplan.importers import _flags, _shell_args

    tokens, _ = _shell_args('ARGS=(\n  --num-layers 2\n  --hidden-size 64 )\n'
                            'torchrun x.py ${ARGS[@]} --wandb-exp-name "run#3" --bf16 # a comment\n')
    assert _flags(tokens) == {"--num-layers": "2", "--hidden-size": "64", "--wandb-exp-name": "run#3", "--bf16": True}


def test_a_named_format_the_file_is_not_is_one_error_line(capsys, tmp_path):
    """--from nemo on a file that is not a NeMo YAML (here a bare word, which YAML reads as a string)."""
    path = tmp_path / "e.txt"
    path.write_text("x", encoding="utf-8")
    _, line = fails(capsys, ["import", str(path), "-o", str(tmp_path / "run.yaml"), "--from", "nemo"])
    assert "no trainer: and model: mappings" in line


def test_an_older_torchtitan_toml_is_read_as_its_torchtitan_ran_it(capsys, tmp_path):
    """A TOML from before [parallelism] and the model converters (torchtitan@cca0702, 2025-01): the pipeline and
    context degrees and async TP sit in [experimental], float8 is [float8] enable_float8_linear (tensorwise, the only
    scaling then), and its checkpoint wrapper kept torch's early stop (training.compile marks the era). Read by hand
    from tests/data/import/torchtitan-llama3-405b-2025-01.toml: tp 8 in [training], async TP and compile on, full AC,
    float8 with its FSDP fp8 all-gather, local batch 2. What torchtitan refuses, or a value of the wrong type, is one
    line naming the field."""
    src, out = DATA / "torchtitan-llama3-405b-2025-01.toml", tmp_path / "run.yaml"
    run_ok(capsys, ["import", str(src), "-o", str(out), "--gpus", "128"])
    text = out.read_text(encoding="utf-8")
    for want in ("tp: 8", "tp_comm_overlap: true", "fp8: true", "fp8_recipe: tensorwise", "fp8_all_gather: true",
                 "recompute: full", "recompute_early_stop: true", "compiled: true", "device: 2"):
        assert want in text, want
    # a pipeline stated the older way: [experimental] degree, its micro-batches a count (default: one a stage)
    toml = src.read_text(encoding="utf-8").replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2")
    older = tmp_path / "pp.toml"
    for extra, device in (("", 1), ("pipeline_parallel_microbatches = 1\n", 2)):
        older.write_text(toml.replace("[experimental]\n", "[experimental]\n" + extra), encoding="utf-8")
        run_ok(capsys, ["import", str(older), "-o", str(out), "--gpus", "128"])
        assert "pp: 2" in (text := out.read_text(encoding="utf-8")) and f"device: {device}" in text, extra
    older.write_text(toml.replace("[experimental]\n", "[experimental]\npipeline_parallel_microbatches = 3\n"),
                     encoding="utf-8")
    _, line = fails(capsys, ["import", str(older), "-o", str(out), "--gpus", "128"])
    assert "experimental.pipeline_parallel_microbatches: training.batch_size 2 must split into 3 micro-batches" in line
    # a looped schedule without split points runs two stages a rank (pipelining_utils.py@cca0702 L28-40): by default
    # four micro-batches of a local batch of 8 at pp 2
    looped = toml.replace("batch_size = 2", "batch_size = 8").replace(
        "[experimental]\n", '[experimental]\npipeline_parallel_schedule = "Interleaved1F1B"\n')
    older.write_text(looped, encoding="utf-8")
    run_ok(capsys, ["import", str(older), "-o", str(out), "--gpus", "128"])
    assert "device: 2" in out.read_text(encoding="utf-8")
    # async TP needs the model compiled: torchtitan refuses the job otherwise (parallelize_llama.py@cca0702 L53-58)
    for text, field in ((src.read_text(encoding="utf-8").replace("compile = true", "compile = false"),
                         "experimental.enable_async_tensor_parallel: true needs the model compiled"),
                        (src.read_text(encoding="utf-8").replace("enable_async_tensor_parallel = true",
                                                                 'enable_async_tensor_parallel = "no"'),
                         "experimental.enable_async_tensor_parallel: must be true or false"),
                        (src.read_text(encoding="utf-8").replace("enable_float8_linear = true",
                                                                 'enable_float8_linear = "yes"'),
                         "float8.enable_float8_linear: must be true or false"),
                        (src.read_text(encoding="utf-8").replace("batch_size = 2", 'batch_size = "2"'),
                         "training.batch_size: must be a whole number >= 1")):
        older.write_text(text, encoding="utf-8")
        _, line = fails(capsys, ["import", str(older), "-o", str(out), "--gpus", "128"])
        assert field in line and "Traceback" not in line, field


def test_a_torchtitan_norm_type_says_how_its_block_ran_eagerly(capsys, tmp_path):
    """[model] norm_type (torchtitan until 2025-04-17): "rmsnorm" was torchtitan's float32 RMSNorm in torch ops, each
    a kernel when not compiled (fusions decomposed: ddplan.anatomy.decomposed_rmsnorm_bytes), "fused_rmsnorm" one
    Triton kernel with the rotary embedding and SwiGLU still op by op (fused-norm); the LayerNorms are said and priced
    as the flavor's RMSNorm; anything else is one line. Eager, the decomposed block is slower (its norms move 36 bytes
    an element forward, not 4); compiled, the same."""
    toml = (DATA / "torchtitan-llama3-8b.toml").read_text(encoding="utf-8")
    assert "norm_type" not in toml
    src, out = tmp_path / "tt.toml", tmp_path / "run.yaml"
    steps = {}
    for norm, fusions in (("rmsnorm", "decomposed"), ("fused_rmsnorm", "fused-norm")):
        src.write_text(toml.replace("[model]\n", f'[model]\nnorm_type = "{norm}"\n'), encoding="utf-8")
        run_ok(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
        assert f"fusions: {fusions}" in out.read_text(encoding="utf-8"), norm
        steps[norm] = {c: float(csv_rows(run_ok(capsys, ["table", "--config", str(out), "--format", "csv", c]))[0]
                                ["step_s"]) for c in ("--no-compile", "--compile")}
    assert steps["rmsnorm"]["--no-compile"] > 1.05 * steps["fused_rmsnorm"]["--no-compile"]
    assert steps["rmsnorm"]["--compile"] == steps["fused_rmsnorm"]["--compile"]
    # torchtitan's build_norm lowercased the name (models/norms.py@989718967 L27)
    src.write_text(toml.replace("[model]\n", '[model]\nnorm_type = "RMSNorm"\n'), encoding="utf-8")
    run_ok(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
    assert "fusions: decomposed" in out.read_text(encoding="utf-8")
    src.write_text(toml.replace("[model]\n", '[model]\nnorm_type = "layernorm"\n'), encoding="utf-8")
    code, _, err = run(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
    assert code == 0 and "model.norm_type 'layernorm': priced as the flavor's RMSNorm" in err
    src.write_text(toml.replace("[model]\n", '[model]\nnorm_type = "rms"\n'), encoding="utf-8")
    _, line = fails(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
    assert "model.norm_type: must be one of rmsnorm, fused_rmsnorm, layernorm, np_layernorm, got 'rms'" in line


def test_a_torchtitan_preset_note_names_the_hardware_it_was_made_for():
    """torchtitan presets note their GPUs ("NOTE: this toml config is a preset for 64 A100 GPUs"): the built-in spec
    of that name, the Blackwell parts included; a GPU without a spec names none."""
    from ddplan.importers import _note_hardware

    got = {gpu: _note_hardware(f"# NOTE: this toml config is a preset for 64 {gpu} GPUs")
           for gpu in ("A100", "H100", "B200", "GB200", "B300", "GB300", "L4")}
    assert {gpu: h and h[0] for gpu, h in got.items()} == {
        "A100": "a100-sxm-80gb", "H100": "h100-sxm", "B200": "b200", "GB200": "gb200", "B300": "b300",
        "GB300": "gb300", "L4": None}


def test_megatron_s_precision_aware_optimizer_is_its_moments_and_remainder_masters(capsys, tmp_path):
    """--use-precision-aware-optimizer (arguments.py@d98e8a64 L3666-3685): --exp-avg-dtype/--exp-avg-sq-dtype are the
    moments' dtype; on bf16 weights without fp8 (or with delayed scaling) Transformer Engine's FusedAdam keeps the
    masters as 16-bit remainders (store_param_remainders, optimizer_config.py L192 and L400-411): weights remainder;
    with current scaling Megatron-Core keeps them whole, and without the flag the dtypes are not read."""
    args, out = tmp_path / "args.sh", tmp_path / "run.yaml"
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --nproc_per_node 8 --bf16 "
            "--use-distributed-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    for extra, moments, remainder in ((" --use-precision-aware-optimizer", True, True),
                                      (" --use-precision-aware-optimizer --fp8-format e4m3 --fp8-recipe tensorwise",
                                       True, False),
                                      (" --use-precision-aware-optimizer --fp8-format hybrid", True, True),
                                      (" --use-precision-aware-optimizer --fp8-format hybrid --fp8-param-gather",
                                       True, False),
                                      ("", False, False)):
        args.write_text(base + extra + "\n", encoding="utf-8")
        run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
        written = out.read_text(encoding="utf-8")
        assert ("moments: bf16" in written) == moments, extra
        assert ("weights: remainder" in written) == remainder, extra
        code, _, err = run(capsys, ["table", "--config", str(out)])
        assert code == 0, err
    args.write_text(base.replace("--exp-avg-sq-dtype bf16", "--exp-avg-sq-dtype fp32")
                    + " --use-precision-aware-optimizer --main-grads-dtype bf16\n", encoding="utf-8")
    code, _, err = run(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    written = out.read_text(encoding="utf-8")
    assert code == 0 and "grads: param" in written and "moments: " not in written
    assert "both moments priced in fp32" in err


def test_megatron_bridge_s_task_configuration_prices_as_the_same_run_stated_by_flags(capsys, tmp_path):
    """A Megatron-Bridge training log's "Task Configuration" (its ConfigContainer, as run_config.yaml keeps it), read
    by hand from tests/data/import/megatron-bridge-llama32-1b-log.txt: Llama 3.2 1B (model: 16 layers of 2048, 32
    heads, 8 query groups of kv_channels 64, ffn 8192, gated silu, no biases, tied embeddings of vocab 128,256 not
    padded: should_pad_vocab false), the dataset's sequence of 1024 (the model's seq_length 131,072 is its limit), 8
    GPUs (the torchrun line), tp/pp/cp 1 without sequence parallelism or TP overlap, the distributed optimizer with the
    reduce and the gather overlapped in buckets of 40,000,000 parameters (ddp.bucket_size, resolved), bf16 with ddp.grad_reduce_in_fp32 true (fp32 gradients), micro-batch 1, global
    512, 10 iterations, no recompute (granularity null: the modules list is not read), the native fused loss
    (Megatron-Core's vocab-parallel cross entropy), whole fp32 masters (use_precision_aware_optimizer false). Every one
    of these is written, so none is the megatron-bridge profile's perf-launcher default (sequence parallelism, bf16
    gradients, Transformer Engine's loss, remainder masters)."""
    import json

    out = tmp_path / "run.yaml"
    run_ok(capsys, ["import", str(DATA / "megatron-bridge-llama32-1b-log.txt"), "-o", str(out), "--hardware",
                    "h100-sxm"])
    text = out.read_text(encoding="utf-8")
    assert "framework: megatron-bridge" in text and "gpus: 8  # torchrun --nproc_per_node 8" in text
    model = tmp_path / "llama32-1b.json"
    model.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False}), encoding="utf-8")
    flags = ["--model", str(model), "--framework", "megatron-bridge", "--hardware", "h100-sxm", "--gpus", "8",
             "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "1", "--overlap-grad-reduce", "--overlap-param-gather",
             "--grad-bucket", "40000000",
             "--no-sequence-parallel", "--no-tp-comm-overlap", "--device-batch-size", "1", "--total-batch-size",
             str(512 * 1024), "--seq-len", "1024", "--steps", "10", "--dtype", "bf16", "--grads", "fp32",
             "--weights", "master", "--recompute", "none", "--cross-entropy", "vocab-parallel"]
    attention = ["--attention", "fa2"]
    imported = csv_rows(run_ok(capsys, ["table", "--config", str(out), *attention, "--format", "csv"]))
    stated = csv_rows(run_ok(capsys, ["table", *flags, *attention, "--format", "csv"]))
    assert imported == stated and len(stated) == 1
    # the same block as a run_config.yaml (no log around it) reads alike, GPUs then given to import
    block = (DATA / "megatron-bridge-llama32-1b-log.txt").read_text(encoding="utf-8").split(
        "------- Task Configuration -------\n")[1].split("\n----------")[0]
    (tmp_path / "run_config.yaml").write_text(block, encoding="utf-8")
    run_ok(capsys, ["import", str(tmp_path / "run_config.yaml"), "-o", str(out), "--hardware", "h100-sxm",
                    "--gpus", "8"])
    assert csv_rows(run_ok(capsys, ["table", "--config", str(out), *attention, "--format", "csv"])) == stated
    # a dump that leaves the bucket unresolved, with no CommOverlapConfig to set one: Megatron-Core's own default
    # (dist_utils.py@2a75ac1 L315-316), not the profile's perf-recipe 134217728
    (tmp_path / "run_config.yaml").write_text(block.replace("  bucket_size: 40000000", "  bucket_size: null"),
                                              encoding="utf-8")
    run_ok(capsys, ["import", str(tmp_path / "run_config.yaml"), "-o", str(out), "--hardware", "h100-sxm",
                    "--gpus", "8"])
    assert "grad_bucket: megatron" in out.read_text(encoding="utf-8")


def test_megatron_bridge_s_settings_ddplan_cannot_price_are_said_or_refused(capsys, tmp_path):
    """Multi-latent attention has no ddplan architecture: one error line naming the field. A dump's precision-aware
    optimizer with bf16 moments is read as Megatron-LM's flags are (moments bf16; remainders unless
    store_param_remainders is false), bf16 gradients from grad_reduce_in_fp32 false; CUDA graphs and multi-token
    prediction are warnings."""
    block = (DATA / "megatron-bridge-llama32-1b-log.txt").read_text(encoding="utf-8").split(
        "------- Task Configuration -------\n")[1].split("\n----------")[0]
    path, out = tmp_path / "run_config.yaml", tmp_path / "run.yaml"
    path.write_text(block.replace("  multi_latent_attention: false", "  multi_latent_attention: true"),
                    encoding="utf-8")
    code, line = fails(capsys, ["import", str(path), "-o", str(out)])
    assert code == 1 and "multi-latent attention" in line and "model.multi_latent_attention" in line
    assert not out.exists()
    aware = (block.replace("  use_precision_aware_optimizer: false", "  use_precision_aware_optimizer: true")
             .replace("  exp_avg_dtype:\n    _call_: false\n    _target_: torch.float32",
                      "  exp_avg_dtype:\n    _call_: false\n    _target_: torch.bfloat16")
             .replace("  exp_avg_sq_dtype:\n    _call_: false\n    _target_: torch.float32",
                      "  exp_avg_sq_dtype:\n    _call_: false\n    _target_: torch.bfloat16")
             .replace("  grad_reduce_in_fp32: true\n  gradient_reduce_div_fusion",
                      "  grad_reduce_in_fp32: false\n  gradient_reduce_div_fusion")
             .replace("  mtp_num_layers: null", "  mtp_num_layers: 1")
             .replace("  cuda_graph_scope: full", "  cuda_graph_impl: local\n  cuda_graph_scope: full"))
    for remainders, weights in (("true", "remainder"), ("false", "master")):
        path.write_text(aware.replace("  store_param_remainders: true", f"  store_param_remainders: {remainders}"),
                        encoding="utf-8")
        code, _, err = run(capsys, ["import", str(path), "-o", str(out), "--gpus", "8"])
        written = out.read_text(encoding="utf-8")
        assert code == 0 and "moments: bf16" in written and f"weights: {weights}" in written
        assert "grads: param" in written
        assert "model.cuda_graph_impl local: CUDA graphs are not priced" in err
        assert "model.mtp_num_layers: multi-token prediction layers are not priced" in err
    path.write_text("_target_: megatron.bridge.training.config.ConfigContainer\nmodel: [1\n", encoding="utf-8")
    code, line = fails(capsys, ["import", str(path), "-o", str(out)])
    assert code == 1 and "not valid YAML" in line
    # found in review: each misread is now read, or refused naming the dump's field
    cases = (
        # an MoE layer pattern that is not every layer: refused, not priced as all-MoE
        ("  moe_layer_freq: 1\n", "  moe_layer_freq:\n  - 1\n  - 0\n", "model.moe_layer_freq"),
        # no vocabulary anywhere: refused, not GPT-2's 50,257
        ("  vocab_size: 128256\n  wgrad", "  vocab_size: null\n  wgrad", "model.vocab_size"),
        # a field of the wrong kind: named as the dump's field, not the Megatron-LM flag it is read as
        ("  hidden_size: 2048", "  hidden_size: {width: 2048}", "model.hidden_size"),
        # 0 is a value, not "unset", where the field has no such meaning: refused as Megatron-LM would
        ("  global_batch_size: 512", "  global_batch_size: 0", "train.global_batch_size"),
        ("train:\n  _target_", "train: 5\nxtrain:\n  _target_", "train"))
    for old, new, field in cases:
        assert old in block, old
        text = block.replace(old, new).replace("  num_moe_experts: null", "  num_moe_experts: 8")
        if field == "model.vocab_size":
            text = text.replace("  vocab_size: 128256\ntrain:", "  vocab_size: null\ntrain:")
        path.write_text(text, encoding="utf-8")
        code, line = fails(capsys, ["import", str(path), "-o", str(out)])
        assert code == 1 and f": {field}: " in line and "--" not in line.split(field)[0], line
    # fp8 moments (Megatron keeps them as uint8), a named mixed-precision recipe, Megatron-FSDP's sharding strategy,
    # and a torchrun line with several nodes
    fp8 = (aware.replace("_target_: torch.bfloat16", "_target_: torch.uint8")
           .replace("mixed_precision:\n  _target_: megatron.bridge.training.mixed_precision.MixedPrecisionConfig",
                    "mixed_precision: bf16_with_fp8_current_scaling_mixed\nold_mixed_precision:")
           .replace("  use_megatron_fsdp: false\ndist:", "  use_megatron_fsdp: true\ndist:")
           .replace("  data_parallel_sharding_strategy: no_shard", "  data_parallel_sharding_strategy: optim_grads"))
    path.write_text("torchrun --nnodes=4 --nproc_per_node=8 train.py\n" + fp8, encoding="utf-8")
    code, _, err = run(capsys, ["import", str(path), "-o", str(out)])
    written = out.read_text(encoding="utf-8")
    assert code == 0, err
    assert "moments: fp8" in written and "fp8: true" in written and "fp8_recipe: current" in written
    assert "zero: 2  # Megatron-FSDP, data_parallel_sharding_strategy optim_grads" in written
    assert "gpus: 32  # torchrun --nproc_per_node 8 --nnodes 4" in written


def test_a_torchtitan_pipeline_schedule_is_priced_as_its_stages_run(capsys, tmp_path):
    """torchtitan's looped schedules run 2 stages a rank unless pipeline_parallel_layers_per_stage says otherwise
    (torchtitan/distributed/pipeline_parallel.py@b5bcd76 L219-263): Interleaved1F1B at pp 4 is interleaved at vp 2;
    Llama 3 8B's 32 layers at 1 a stage are ceil((32 + 1 + 1) / 1) = 34 stages, 17 a rank at pp 2, and at pp 4 (34
    not a multiple of 4) or 17 a stage (2 stages, 1 a rank) refused as torchtitan refuses them. ZBVZeroBubble is
    ddplan's zb-v (two chunks); InterleavedZeroBubble and DualPipeV are priced as their nearest, each said on stderr;
    the run file then prices in `ddplan table`, its row named ZB-V."""
    toml, out = tmp_path / "pp.toml", tmp_path / "run.yaml"
    head = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 16\nseq_len = 1024\n'
            '[parallelism]\ndata_parallel_shard_degree = 2\n')
    looped = 'pipeline_parallel_schedule = "Interleaved1F1B"\n'
    cases = (("pipeline_parallel_degree = 4\n" + looped, "interleaved", 2, ""),
             ("pipeline_parallel_degree = 2\n" + looped + "pipeline_parallel_layers_per_stage = 1\n", "interleaved", 17,
              ""),
             ('pipeline_parallel_degree = 4\npipeline_parallel_schedule = "ZBVZeroBubble"\n', "zb-v", 2, ""),
             ('pipeline_parallel_degree = 4\npipeline_parallel_schedule = "InterleavedZeroBubble"\n', "interleaved", 2,
              "interleaved 1F1B's bubble, an upper bound"),
             ('pipeline_parallel_degree = 4\npipeline_parallel_schedule = "DualPipeV"\n', "zb-v", 2, "priced as ZB-V"))
    for extra, schedule, vp, said in cases:
        toml.write_text(head + extra, encoding="utf-8")
        code, _, err = run(capsys, ["import", str(toml), "-o", str(out)])
        text = out.read_text(encoding="utf-8")
        assert code == 0 and f"schedule: {schedule}" in text and f"vp: {vp}" in text, (extra, text, err)
        assert said in err, (extra, err)
    assert "ZB-V" in run_ok(capsys, ["table", "--config", str(out)])
    for degree, per_stage, words in ((4, 1, "34 stages"), (2, 17, "2 stages")):
        toml.write_text(head + f"pipeline_parallel_degree = {degree}\n" + looped
                        + f"pipeline_parallel_layers_per_stage = {per_stage}\n", encoding="utf-8")
        _, line = fails(capsys, ["import", str(toml), "-o", str(out)])
        assert "parallelism.pipeline_parallel_layers_per_stage" in line and words in line, line
    # what torchtitan refuses or torch does not name, one line each: ZB-V at other than two stages a rank, a layer
    # count that is not whole, a schedule name torch has not
    for extra, words in (('pipeline_parallel_schedule = "ZBVZeroBubble"\npipeline_parallel_layers_per_stage = 3\n',
                          "exactly 2 a rank"),
                         (looped + "pipeline_parallel_layers_per_stage = 1\npipeline_parallel_first_stage_less_layers"
                          ' = "x"\n', "first_stage_less_layers: must be a whole number >= 0"),
                         (looped + "pipeline_parallel_layers_per_stage = 1\npipeline_parallel_last_stage_less_layers"
                          " = 1.0\n", "last_stage_less_layers: must be a whole number >= 0"),
                         ('pipeline_parallel_schedule = "ScheduleFoo"\n', "'ScheduleFoo' is not a schedule ddplan")):
        toml.write_text(head + "pipeline_parallel_degree = 2\n" + extra, encoding="utf-8")
        code, line = fails(capsys, ["import", str(toml), "-o", str(out)])
        assert code in (1, 2) and words in line and "Traceback" not in line, line
    # torch matches schedule names whatever their case (older presets wrote "1f1b")
    toml.write_text(head + 'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "zbvzerobubble"\n',
                    encoding="utf-8")
    code, _, _ = run(capsys, ["import", str(toml), "-o", str(out)])
    assert code == 0 and "schedule: zb-v" in out.read_text(encoding="utf-8")
    toml.write_text(head + 'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "1f1b"\n', encoding="utf-8")
    code, _, _ = run(capsys, ["import", str(toml), "-o", str(out)])
    assert code == 0 and "schedule:" not in out.read_text(encoding="utf-8")
    # the keys that set the chunks are read, not reported unread
    toml.write_text(head + "pipeline_parallel_degree = 2\n" + looped + "pipeline_parallel_layers_per_stage = 1\n",
                    encoding="utf-8")
    code, _, err = run(capsys, ["import", str(toml), "-o", str(out)])
    assert code == 0 and "not read" not in err and "vp: 17" in out.read_text(encoding="utf-8")


def test_the_zero_bubble_forks_flags_are_its_schedules(capsys, tmp_path):
    """The Zero Bubble fork of Megatron-LM (sail-sg/zero-bubble-pipeline-parallelism megatron/arguments.py@6574e0ea):
    --zero-bubble-v-schedule is zb-v at two chunks; --enable-zero-bubble with --zero-bubble-max-pending-backward 2p or
    more is ZB-2p (zb-h2), p is ZB-1p (zb-h1), "auto" zb-h1 with a warning; every schedule flag is read (its timers
    are listed as not a step's cost)."""

    base = ("python pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 1024 "
            "--max-position-embeddings 2048 --pipeline-model-parallel-size 8 --micro-batch-size 3 "
            "--global-batch-size 72 --fp16 --zero-bubble-pipeline-timers-start-iter 100 ")
    src, out = tmp_path / "zb.sh", tmp_path / "run.yaml"
    for extra, schedule, said in (("--zero-bubble-v-schedule", "zb-v", ""),
                                  ("--enable-zero-bubble --zero-bubble-max-pending-backward 16", "zb-h2", ""),
                                  ("--enable-zero-bubble --zero-bubble-max-pending-backward 8", "zb-h1", ""),
                                  ("--enable-zero-bubble", "zb-h1", "an adaptive memory limit, priced as ZB-1p")):
        src.write_text(base + extra + "\n", encoding="utf-8")
        code, _, err = run(capsys, ["import", str(src), "-o", str(out), "--gpus", "8"])
        text = out.read_text(encoding="utf-8")
        assert code == 0 and f"schedule: {schedule}" in text and said in err, (extra, text, err)
        unread = [line for line in (text + err).splitlines() if "not read" in line and "zero-bubble" in line]
        assert ("vp: 2" in text) == (schedule == "zb-v") and not [u for u in unread if "timers" not in u], unread
