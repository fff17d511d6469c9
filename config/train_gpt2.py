# GPT-2 (124M) on OpenWebText, as NanoGPT trains it: ~2.85 val loss on one node of 8x A100 40GB
# in about 4 days. Launch:
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
# Another attention variant: add --attention=optimized|efficient|super

wandb_log = False
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M'

dataset = 'openwebtext'
# 12 batch size * 1024 block size * 5 gradaccum * 8 GPUs = 491,520 tokens per iteration
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
attention = 'standard'

# this makes total number of tokens be 300B
max_iters = 600000
lr_decay_iters = 600000
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 2000

# eval stuff
eval_interval = 1000
eval_iters = 200
log_interval = 10

# weight decay
weight_decay = 1e-1
