# Fine-tune OpenAI's GPT-2 on Tiny Shakespeare in GPT-2 BPE, as NanoGPT's finetune_shakespeare.
# Standard attention only: OpenAI's weights exist for it alone (the other variants train from
# scratch). The weights download from the Hugging Face hub on first use (pip install transformers).
# The data, from the text file (7,222 speeches; about 300K train and 31K val tokens):
#   python prepare_openwebtext.py --dataset=path/to/tinyshakespeare.txt \
#       --out_dir=data/shakespeare --val_fraction=0.1
# then: python train.py config/finetune_shakespeare.py
# (--init_from=gpt2 for the 124M model on a small GPU)

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False
wandb_project = 'shakespeare'
wandb_run_name = 'finetune-gpt2-xl'

dataset = 'shakespeare'
init_from = 'gpt2-xl'  # 1.56B parameters, the largest GPT-2

# a corpus this small is overfitted within a few epochs: keep the checkpoint with the lowest val
# loss
always_save_checkpoint = False

# 1 sequence x 32 accumulation steps x 1024 tokens = 32,768 tokens per step: an epoch every ~9 steps
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

# fine-tune at a small constant learning rate
learning_rate = 3e-5
decay_lr = False
