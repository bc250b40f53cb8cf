# source: karpathy/nanochat runs/speedrun.sh @92d63d4 (2026-07-03), trimmed to its pretraining line (L67)
torchrun --standalone --nproc_per_node=8 -m scripts.base_train -- --depth=24 --target-param-data-ratio=8 --device-batch-size=16 --fp8 --run=$WANDB_RUN
