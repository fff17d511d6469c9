# Tiny Shakespeare at character level on a CPU: NanoGPT's CPU quick start, i.e. its
# shakespeare_char config with
#   --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
#   --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0
# NanoGPT reports val loss ~1.88 for it. Prepare the data first:
#   python prepare_char.py --input=path/to/tinyshakespeare.txt
# (or without --input, to download it)
# Any attention variant: python train.py config/train_shakespeare_char_cpu.py --attention=super

out_dir = 'out-shakespeare-char-cpu'
dataset = 'shakespeare_char'
device = 'cpu'
# measured: compiling does not pay for itself at this size on CPU (see docs/training.md)
compile = False

eval_interval = 250
eval_iters = 20
log_interval = 1
always_save_checkpoint = False

gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
attention = 'standard'

learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
