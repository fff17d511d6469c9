# The language-modelling setting of arXiv 2403.01643: GPT-2-small-shaped models on OpenWebText,
# context 1024, 500 sequences per optimizer step (micro-batch 5 x 100 accumulation steps, the steps
# shared out over the DDP processes, so use 1, 2, 4, 5, 10, 20, 25, 50 or 100 of them), one epoch.
#   torchrun --standalone --nproc_per_node=4 train.py config/train_paper_lm.py --attention=super
# Choose the variant with one key: attention='standard' | 'optimized' | 'efficient' | 'super'.
# Assumptions where the paper leaves details open: NanoGPT's GPT-2 (124M) shape and optimizer
# settings, no dropout, no biases.

out_dir = 'out-paper-lm'
wandb_log = False
wandb_project = 'paper-lm'
wandb_run_name = 'paper-lm'

dataset = 'openwebtext'
block_size = 1024
batch_size = 5
gradient_accumulation_steps = 100  # 5 * 100 = 500 sequences = 512,000 tokens per step

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
attention = 'standard'

# one epoch: NanoGPT's OpenWebText train.bin holds ~9.04e9 tokens, / 512,000 per step =
# ~17,650 steps
max_iters = 17650
lr_decay_iters = 17650
warmup_iters = 500
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 500
eval_iters = 200
log_interval = 10
