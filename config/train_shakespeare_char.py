# Tiny Shakespeare at character level with a 10.7M-parameter GPT, sized for one GPU: the same
# settings as NanoGPT's shakespeare_char run (val loss ~1.47 there with standard attention).
# Prepare the data first: python prepare_char.py   (or --input=path/to/tinyshakespeare.txt offline)
# Any attention variant: python train.py config/train_shakespeare_char.py --attention=efficient

out_dir = 'out-shakespeare-char'
eval_interval = 250  # the model overfits this 1M-character corpus, so watch val loss often
eval_iters = 200
log_interval = 10

# keep the checkpoint with the lowest val loss, not the last one
always_save_checkpoint = False

wandb_log = False
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # characters of context

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
attention = 'standard'

learning_rate = 1e-3  # a model this small tolerates a high learning rate
max_iters = 5000
lr_decay_iters = 5000  # decay over the whole run
min_lr = 1e-4  # a tenth of the peak
beta2 = 0.99  # few tokens per step (16K), so average the second moment over more steps

warmup_iters = 100
