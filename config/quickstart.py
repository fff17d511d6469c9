# The quick start: a small character-level GPT on the Python standard library's own source code,
# a corpus every Python install has, so it runs offline on a fresh clone in about a minute on a CPU:
#   python prepare_char.py --corpus=stdlib && python train.py config/quickstart.py
#   python sample.py --out_dir=out-quickstart
# Choose the attention variant with one key: --attention=standard|optimized|efficient|super

out_dir = 'out-quickstart'
dataset = 'stdlib_char'
device = 'auto'  # a GPU if there is one, else the CPU
compile = False

eval_interval = 250
eval_iters = 20
log_interval = 25
always_save_checkpoint = True

gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
attention = 'standard'

learning_rate = 1e-3
max_iters = 1000
lr_decay_iters = 1000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
