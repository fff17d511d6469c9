# TinyLlama's shape (22 layers, 32 heads with 4 key/value heads, d 2048, FFN 5632, RoPE theta
# 10000, context 2048) with standard attention: the baseline the paper's large LM is compared with
# (TinyLlama's loss 2.25 against the paper's 2.12), trained here on the same C4 tokens as
# config/train_llama1b_efficient_c4.py with the same recipe, so the two differ only in shape and
# attention. See docs/llama.md.
#   python prepare_openwebtext.py --dataset c4 --max_tokens 30B        # -> data/c4 (docs/data.md)
#   python train.py config/train_tinyllama_standard_c4.py                      # one GPU
#   torchrun --standalone --nproc_per_node=8 train.py config/train_tinyllama_standard_c4.py
# Parameters: 1,175,021,568 with this repo's GPT-2 BPE (vocab 50304, untied); with Llama's
# 32000-token vocabulary it would be 1,100,048,384, TinyLlama's own count.
# Grouped-query attention exists for standard attention only: --attention=efficient needs
# --n_kv_head=0.

out_dir = 'out-tinyllama-standard-c4'
wandb_log = False
wandb_project = 'c4'
wandb_run_name = 'tinyllama-standard'

dataset = 'c4'
block_size = 2048  # TinyLlama's context
# 524,288 tokens per step, as config/train_llama1b_efficient_c4.py (4 sequences x 64 micro-steps x
# 2048, the accumulation shared out over the DDP processes); the micro-batch of 4 peaks at 30.3 GiB
# (docs/gpu.md)
batch_size = 4
gradient_accumulation_steps = 64

n_layer = 22
n_head = 32
n_kv_head = 4
n_embd = 2048
intermediate_size = 5632
attention = 'standard'
norm = 'rmsnorm'
pos = 'rope'
rope_theta = 10000.0
mlp = 'swiglu'
tie_embeddings = False
bias = False
dropout = 0.0

# 30B tokens / 524,288 per step = 57,220 steps
max_iters = 57220
lr_decay_iters = 57220
warmup_iters = 2000
learning_rate = 4e-4  # TinyLlama's: 4e-4 peak, cosine down to 4e-5
min_lr = 4e-5
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 1000
# divisible by 1, 2, 3, 4, 6, 8, 12, 16, 24 or 32 processes, as --parallelism=fsdp needs
eval_iters = 96
log_interval = 10
