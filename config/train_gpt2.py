# GPT-2 (124M) on OpenWebText with NanoGPT's recipe: 491,520 tokens per step, 600K steps (~300B
# tokens); NanoGPT reaches val loss ~2.85 with it on 8x A100 40GB in about four days.
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
# Another attention variant: add --attention=optimized|efficient|super

wandb_log = False
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M'

dataset = 'openwebtext'
batch_size = 12  # sequences per micro-batch per GPU
block_size = 1024
# global: 5 micro-batches on each of 8 GPUs; 12 * 1024 * 40 tokens per step
gradient_accumulation_steps = 5 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
attention = 'standard'

max_iters = 600000
lr_decay_iters = 600000
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1

eval_interval = 1000
eval_iters = 200
log_interval = 10
