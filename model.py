"""
A GPT language model whose attention is one of the four variants of
"Cost-Effective Attention Mechanisms for Low Resource Settings" (arXiv 2403.01643):

    standard   H_i = softmax(X W^Q_i (X W^K_i)^T / sqrt(d_k)) X W^V_i
    optimized  H_i = softmax(X W^Q_i (X W^K_i)^T / sqrt(d_k)) X_i          (no W^V)
    efficient  H_i = softmax(X W^Q_i X_i^T / sqrt(d_k)) X_i                (no W^V, no W^K)
    super      H_i = softmax(X W^Q_i X_i^T / sqrt(d_k)) (W^A X_i + b)      (efficient + alignment kernel)

X is the block input after LayerNorm, X_i its i-th slice of d_k = n_embd / n_head columns, and in
every variant O = [H_1 ... H_h] W^O. Everything else is NanoGPT's GPT-2: learned position
embeddings, pre-LayerNorm blocks, a 4x GELU MLP and a language-model head tied to the token
embedding. The four attention classes stand side by side below; they differ only in `project`
(which of Q, K, V are learned) and, for super, in `align` and in the hooks that follow from W^A
(its FLOPs, its decay, its cropping). docs/adding-a-variant.md shows how to add a fifth.
"""

import contextlib
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms, like GPT-2
    attention: str = "standard"  # one of ATTENTION_VARIANTS
    # nn.GELU's `approximate`: 'none' is the exact erf GELU (NanoGPT's, and faster on CPU); 'tanh' is
    # GPT-2's own, which from_pretrained uses so that OpenAI's weights reproduce exactly
    gelu_approximate: str = "none"

    def __post_init__(self):
        if self.attention not in ATTENTION_CLASSES:
            raise ValueError(
                f"unknown attention={self.attention!r}; choose one of {', '.join(ATTENTION_CLASSES)}"
            )
        if self.gelu_approximate not in ("none", "tanh"):
            raise ValueError(f"unknown gelu_approximate={self.gelu_approximate!r}; choose 'none' (exact) or 'tanh'")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                f"each head takes n_embd / n_head columns, so pick n_head among the divisors of n_embd"
            )
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class KVCache:
    """Past keys and values of every layer, for incremental decoding, preallocated to max_len positions.

    Rows are kept as (B, max_len, n_embd), before the head split, so that efficient and super store the
    raw block input once and use it as both keys and values; super also keeps its aligned values. The
    buffers start at zero: rows not yet written are masked out of the scores and meet only zeros of
    super's W^A, and 0 * 0 stays 0 where uninitialised memory could hold a NaN.

    A forward either *grows* the cache (eager decoding: its tokens go at `length`, the rows so far are a
    view that grows a row a step) or, given `input_pos`, writes at those positions and attends to all
    max_len rows with the later ones masked (compiled decoding: every step has the same shapes and
    buffer addresses, which is what a CUDA graph replays).
    """

    def __init__(self, n_layer, max_len):
        self.max_len = max_len
        self.length = 0  # positions filled so far
        self.layers = [{} for _ in range(n_layer)]

    def step(self, T, device, input_pos=None):
        """Where the T tokens of one forward go, and what each may attend to."""
        if input_pos is not None:
            return CacheStep(self, input_pos, fixed_size=True)
        if self.length + T > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; {self.length} are used, {T} more do not fit")
        return CacheStep(self, torch.arange(self.length, self.length + T, device=device), fixed_size=False)

    def buffer(self, layer, name, rows):
        """Layer `layer`'s buffer `name`, made on first use with the batch size, width and dtype of rows."""
        buffer = self.layers[layer].get(name)
        B, _, C = rows.shape
        if buffer is None or buffer.shape != (B, self.max_len, C) or buffer.dtype != rows.dtype:
            buffer = self.layers[layer][name] = rows.new_zeros(B, self.max_len, C)
            # a fixed address lets a CUDA graph update the buffer in place instead of copying it each step
            torch._dynamo.mark_static_address(buffer)
        return buffer


class CacheStep:
    """One forward through a KVCache: the positions of its tokens and, per layer, the cached rows."""

    def __init__(self, cache, positions, fixed_size):
        self.cache, self.positions, self.fixed_size = cache, positions, fixed_size
        self.start = None if fixed_size else cache.length
        window = cache.max_len if fixed_size else cache.length + len(positions)
        # visible[t, s]: the t-th new token may attend to window position s (s <= its own position)
        self.visible = torch.arange(window, device=positions.device) <= positions[:, None]

    def store(self, layer, name, rows):
        """Put this step's rows (B, T, C) into the cache; return the rows of the whole window."""
        buffer = self.cache.buffer(layer, name, rows)
        if self.fixed_size:
            buffer.index_copy_(1, self.positions, rows)
            return buffer
        buffer[:, self.start : self.start + rows.size(1)] = rows
        return buffer[:, : self.start + rows.size(1)]

    def attention_mask(self):
        """(attn_mask, is_causal) for scaled_dot_product_attention: a growing cache avoids the mask
        where it can, so that a prompt entering an empty cache and single-token steps stay on the
        fastest kernels."""
        if not self.fixed_size and self.start == 0:
            return None, len(self.positions) > 1
        if not self.fixed_size and len(self.positions) == 1:
            return None, False
        return self.visible, False

    def layer(self, index):
        return LayerStep(self, index)

    def finish(self):
        if not self.fixed_size:
            self.cache.length += len(self.positions)


class LayerStep:
    """A CacheStep seen from one layer: what an attention module reads and writes."""

    def __init__(self, step, index):
        self.step, self.index = step, index
        self.positions, self.visible = step.positions, step.visible

    def store(self, name, rows):
        return self.step.store(self.index, name, rows)

    def attention_mask(self):
        return self.step.attention_mask()


class CausalSelfAttention(nn.Module):
    """What all four variants share: the fused input projection `c_attn` (W^Q, and W^K, W^V where the
    variant learns them), the per-head causal scaled dot-product attention, and W^O (`c_proj`)."""

    n_learned_inputs = None  # how many of W^Q, W^K, W^V the variant learns
    values_are_keys = False  # efficient and super use X_i as both keys and values

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, self.n_learned_inputs * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def project(self, x):
        """Return queries, keys and values, each (B, T, n_embd), before the head split."""
        raise NotImplementedError

    def align(self, v, cache):
        """Values as the scores see them; only super changes them."""
        return v

    def num_structural_zeros(self):
        """Parameters that are zero by construction and so not free (super's upper triangle)."""
        return 0

    def no_decay_parameters(self):
        """Matrices AdamW must not decay (biases and gains never are)."""
        return []

    def crop_block_size(self, block_size):
        """Shrink whatever depends on the context length (GPT.crop_block_size)."""

    def flops_per_token(self, seq_len):
        """Forward matmul FLOPs per token (a multiply-add is 2): the learned d x d projections (W^Q, and
        W^K, W^V where learned, and W^O), then the scores Q K^T and the weighted sum, 2 T d each."""
        d = self.n_embd
        return 2 * (self.n_learned_inputs + 1) * d * d + 4 * seq_len * d

    def split_heads(self, t):
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def forward(self, x, cache=None):
        """x (B, T, n_embd); cache, when decoding, is this layer's LayerStep of a KVCache."""
        B, T, C = x.size()
        q, k, v = self.project(x)
        if cache is not None:
            k = cache.store("k", k)
            v = k if self.values_are_keys else cache.store("v", v)
        v = self.align(v, cache)
        y = self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v), cache)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v, cache):
        """H_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i for every head at once, causal: (B, n_head, T, d_k)
        queries against (B, n_head, S, d_k) keys and values. A variant that changes the scores or the
        mask (a temperature, a window) overrides this."""
        attn_mask, is_causal = (None, q.size(2) > 1) if cache is None else cache.attention_mask()
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
        )

    # The variant stated literally, unfused, one head at a time, for one sequence: the tests hold
    # `forward` (fused, cached, compiled) to it. A variant overrides the hooks where its equation differs.
    def reference(self, x):
        T, d = x.shape
        dk = d // self.n_head
        W = self.c_attn.weight
        b = self.c_attn.bias if self.c_attn.bias is not None else torch.zeros(W.size(0), device=x.device)
        # the learned inputs come in the order W^Q, W^K, W^V; those not learned are X itself
        learned = [x @ W[j * d : (j + 1) * d].T + b[j * d : (j + 1) * d] for j in range(self.n_learned_inputs)]
        Q, K, V = (learned + [x, x])[:3]
        V = self.reference_values(V)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        heads = []
        for i in range(self.n_head):
            cols = slice(i * dk, (i + 1) * dk)
            scores = self.reference_scores(Q[:, cols] @ K[:, cols].T / math.sqrt(dk), i)
            heads.append(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ V[:, cols])
        return self.c_proj(torch.cat(heads, dim=1))

    def reference_values(self, v):
        return v

    def reference_scores(self, scores, head):
        return scores


class StandardAttention(CausalSelfAttention):
    # Q' = X W^Q_i, K' = X W^K_i, V' = X W^V_i  (paper Eq. 1-2)
    n_learned_inputs = 3

    def project(self, x):
        return self.c_attn(x).split(self.n_embd, dim=2)


class OptimizedAttention(CausalSelfAttention):
    # Q' = X W^Q_i, K' = X W^K_i, V'_i = X_i  (Optimized Attention: W^V removed)
    n_learned_inputs = 2

    def project(self, x):
        q, k = self.c_attn(x).split(self.n_embd, dim=2)
        return q, k, x


class EfficientAttention(CausalSelfAttention):
    # Q' = X W^Q_i, K'_i = V'_i = X_i  (Efficient Attention: W^K and W^V removed)
    n_learned_inputs = 1
    values_are_keys = True

    def project(self, x):
        return self.c_attn(x), x, x


class SuperAttention(EfficientAttention):
    # Efficient plus V'_i = W^A X_i + b  (Super Attention); W^A is lower-triangular so that
    # row p mixes only positions s <= p, and it is shared by all heads of the layer.

    def __init__(self, config):
        super().__init__(config)
        self.block_size = config.block_size
        # identity and zero: super starts out exactly equal to efficient
        self.align_weight = nn.Parameter(torch.eye(config.block_size))
        self.align_bias = nn.Parameter(torch.zeros(config.block_size))

    def align(self, v, cache):
        window = v.size(1)  # v holds the raw values of window positions 0 .. window-1
        if window > self.block_size:
            raise ValueError(f"super attention mixes at most block_size={self.block_size} positions, got {window}")
        if cache is None:
            # all rows of W^A V + b; tril keeps the upper triangle out of the graph, so its gradient
            # is exactly zero and it stays zero under AdamW
            kernel, bias = torch.tril(self.align_weight[:window, :window]), self.align_bias[:window]
        else:
            # only the new tokens' rows: earlier rows never change within a window
            kernel = self.align_weight[cache.positions, :window].masked_fill(~cache.visible, 0.0)
            bias = self.align_bias[cache.positions]
        rows = torch.matmul(kernel.to(v.dtype), v) + bias[:, None].to(v.dtype)
        return rows if cache is None else cache.store("v_aligned", rows)

    def reference_values(self, v):
        T = v.size(0)
        return torch.tril(self.align_weight[:T, :T]) @ v + self.align_bias[:T, None]  # V' = W^A V + b

    def num_structural_zeros(self):
        return self.block_size * (self.block_size - 1) // 2

    def no_decay_parameters(self):
        # decay would pull W^A towards zero (no values at all), not towards its identity start
        return [self.align_weight]

    def crop_block_size(self, block_size):
        self.block_size = block_size
        self.align_weight = nn.Parameter(self.align_weight[:block_size, :block_size])
        self.align_bias = nn.Parameter(self.align_bias[:block_size])

    def flops_per_token(self, seq_len):
        return super().flops_per_token(seq_len) + 2 * seq_len * self.n_embd  # W^A V


# The registry: a new variant is one class and one line here (docs/adding-a-variant.md).
ATTENTION_CLASSES = {
    "standard": StandardAttention,
    "optimized": OptimizedAttention,
    "efficient": EfficientAttention,
    "super": SuperAttention,
}
ATTENTION_VARIANTS = ("standard", "optimized", "efficient", "super")  # the paper's four
PRETRAINED_GPT2 = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # 124M, 350M, 774M, 1558M


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = ATTENTION_CLASSES[config.attention](config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self._compiled = {}  # generate(compile=True)'s decode step and its cache, made on first use

        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding=True):
        """Free parameters, the tied head counted once. non_embedding drops the position embedding
        (the token embedding stays, as it is also the output head), as NanoGPT does. Super's upper
        triangle of W^A is zero by construction and is not counted."""
        n_params = sum(p.numel() for p in self.parameters())
        n_params -= sum(block.attn.num_structural_zeros() for block in self.transformer.h)
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def get_num_attention_params(self):
        """Free parameters of one attention layer (the paper's 'layer size')."""
        attn = self.transformer.h[0].attn
        return sum(p.numel() for p in attn.parameters()) - attn.num_structural_zeros()

    def forward(self, idx, targets=None, all_logits=False, kv_cache=None, input_pos=None):
        """Logits and loss. With targets, or with all_logits=True, logits cover every position
        (B, T, vocab); otherwise only the last one (B, 1, vocab), which is all sampling needs.
        kv_cache is a KVCache (see `generate`); input_pos, a tensor of positions, makes the step
        write there with fixed shapes instead of growing the cache."""
        B, T = idx.size()
        start = 0 if kv_cache is None or input_pos is not None else kv_cache.length
        if start + T > self.config.block_size:
            raise ValueError(
                f"cannot forward a sequence of {start + T} tokens: block_size is {self.config.block_size}. "
                f"Crop the input to its last {self.config.block_size} tokens"
            )
        step = None if kv_cache is None else kv_cache.step(T, idx.device, input_pos)
        pos = torch.arange(T, device=idx.device) if step is None else step.positions
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            x = block(x, None if step is None else step.layer(i))
        if step is not None:
            step.finish()
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        logits = self.lm_head(x if all_logits else x[:, [-1], :])
        return logits, None

    def crop_block_size(self, block_size):
        """Shrink the context length, e.g. to fine-tune pretrained GPT-2 at block_size < 1024."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"crop_block_size({block_size}): must be in 1..{self.config.block_size}")
        self.config.block_size = block_size
        self._compiled.clear()
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
        for block in self.transformer.h:
            block.attn.crop_block_size(block_size)

    @classmethod
    def from_pretrained(cls, model_type, override_args=None):
        """OpenAI's GPT-2 weights through Hugging Face `transformers` (standard attention only).
        model_type: gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a local folder of a Hugging Face
        GPT-2 checkpoint (what GPT2LMHeadModel.save_pretrained writes)."""
        override_args = dict(override_args or {})
        attention = override_args.pop("attention", "standard")
        if attention != "standard":
            raise ValueError(
                f"pretrained GPT-2 weights exist for standard attention only, not attention={attention!r}: "
                f"train the {attention} variant from scratch (init_from='scratch')"
            )
        unknown = set(override_args) - {"dropout"}
        if unknown:
            raise ValueError(f"only dropout can be overridden for pretrained weights, not {sorted(unknown)}")
        if model_type not in PRETRAINED_GPT2 and not os.path.isdir(model_type):
            raise ValueError(
                f"unknown pretrained model {model_type!r}; choose one of {', '.join(PRETRAINED_GPT2)} "
                f"or a local folder holding a Hugging Face GPT-2 checkpoint"
            )
        try:
            from transformers import GPT2LMHeadModel
        except ImportError as e:
            raise RuntimeError("loading GPT-2 weights needs Hugging Face transformers: pip install transformers") from e
        try:
            hf_model = GPT2LMHeadModel.from_pretrained(model_type)
        except OSError as e:
            raise RuntimeError(
                f"could not load {model_type!r} weights: they download from the Hugging Face hub on first "
                f"use, so a network is needed once (or set HF_HOME to a cache that holds them). Cause: {e}"
            ) from e

        hf = hf_model.config
        config = GPTConfig(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer,
                           n_head=hf.n_head, n_embd=hf.n_embd, bias=True, gelu_approximate="tanh", **override_args)
        model = cls(config)
        ours = model.state_dict()
        # HF's GPT-2 stores these Linear weights as Conv1D, i.e. transposed
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        for key, value in hf_model.state_dict().items():
            if key.endswith((".attn.masked_bias", ".attn.bias")):
                continue  # causal-mask buffers in older checkpoints, not weights
            if key.endswith(transposed):
                value = value.t()
            with torch.no_grad():
                ours[key].copy_(value)
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW that decays the weight matrices and embeddings but not biases, LayerNorm gains, or
        the matrices an attention variant exempts (super's W^A)."""
        exempt = {id(p) for block in self.transformer.h for p in block.attn.no_decay_parameters()}
        decay, no_decay = [], []
        for p in self.parameters():
            if not p.requires_grad:
                continue
            if p.dim() >= 2 and id(p) not in exempt:
                decay.append(p)
            else:
                no_decay.append(p)
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        # one fused kernel for all parameters: on CPU (torch >= 2.4) it saves ~7% of a small model's step
        fused = device_type in ("cuda", "cpu")
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self, seq_len=None, backward=True):
        """Matmul FLOPs per token (a multiply-add is 2), forward and, by default, backward (twice the
        forward). Per layer, the attention variant's own count (CausalSelfAttention.flops_per_token)
        and the MLP's 16 d^2; plus the output head 2 d V. NanoGPT's 6N + 12 L d T agrees for
        standard, optimized and efficient; it misses super's W^A V."""
        cfg = self.config
        T = cfg.block_size if seq_len is None else seq_len
        d = cfg.n_embd
        per_layer = self.transformer.h[0].attn.flops_per_token(T) + 16 * d * d
        forward = cfg.n_layer * per_layer + 2 * d * cfg.vocab_size
        return 3 * forward if backward else forward

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=312e12):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (A100 bf16 by default)."""
        T = self.config.block_size
        flops_per_iter = self.flops_per_token(T) * T * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    def new_kv_cache(self):
        return KVCache(self.config.n_layer, self.config.block_size)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True, compile=False):
        """Sample max_new_tokens tokens after idx (B, T). Past block_size the context slides: the
        model sees the last block_size tokens, as NanoGPT does. Since every position shifts when
        the window moves, the cache is then refilled from the new window, so the result equals the
        uncached computation. Greedy decoding is top_k=1.

        compile=True decodes with fixed shapes (the token at a position tensor, attention over the
        whole preallocated cache with the future masked) through torch.compile; on CUDA that is
        one CUDA graph replay per token. The prompt and each refill run eagerly."""
        check_sampling(temperature, top_k)
        if compile and not use_kv_cache:
            raise ValueError("compile=True decodes from the KV cache: leave use_kv_cache=True")
        with decoding_attention_kernels(idx.device):
            if not use_kv_cache:
                for _ in range(max_new_tokens):
                    logits, _ = self(idx[:, -self.config.block_size:])
                    idx = torch.cat((idx, sample_next(logits[:, -1], temperature, top_k)), dim=1)
                return idx
            return self._generate_cached(idx, max_new_tokens, temperature, top_k, compile)

    def _generate_cached(self, idx, max_new_tokens, temperature, top_k, compile):
        block_size = self.config.block_size
        cache = self._compiled_decode_cache() if compile else self.new_kv_cache()
        cache.length = 0
        decode = self._compiled_decode_step() if compile else None
        input_pos = torch.zeros(1, dtype=torch.long, device=idx.device)
        for _ in range(max_new_tokens):
            if cache.length == 0 or idx.size(1) > block_size:  # first step, or the window slid: refill
                cache.length = 0
                logits, _ = self(idx[:, -block_size:], kv_cache=cache)
                logits = logits[:, -1]
            elif decode is None:
                logits = self(idx[:, -1:], kv_cache=cache)[0][:, -1]
            else:
                input_pos.fill_(cache.length)
                torch.compiler.cudagraph_mark_step_begin()
                logits = decode(idx[:, -1:], input_pos, cache)
                cache.length += 1
            idx = torch.cat((idx, sample_next(logits, temperature, top_k)), dim=1)
        return idx

    def _decode_step(self, token, input_pos, cache):
        """Logits (B, vocab) of one token (B, 1) at position input_pos, a fixed-shape cache step."""
        return self(token, kv_cache=cache, input_pos=input_pos)[0][:, -1]

    def _compiled_decode_step(self):
        # compiled once per model and kept: later generate calls reuse the graphs
        if "decode" not in self._compiled:
            # every model, batch size and autocast dtype gets its own graph under the one code object
            # of _decode_step: let a process that samples several models (benchmarks, tests) keep them
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            on_cuda = next(self.parameters()).is_cuda
            self._compiled["decode"] = torch.compile(
                self._decode_step, mode="reduce-overhead" if on_cuda else None, fullgraph=True)
        return self._compiled["decode"]

    def _compiled_decode_cache(self):
        # kept across generate calls: the same buffer addresses let a CUDA graph be replayed, not re-recorded
        cache = self._compiled.get("cache")
        if cache is None or cache.max_len != self.config.block_size:
            cache = self._compiled["cache"] = self.new_kv_cache()
        return cache


def check_sampling(temperature, top_k):
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be positive (use top_k=1 for greedy decoding)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be at least 1, or None for no cut")


def sample_next(logits, temperature=1.0, top_k=None):
    """One token per row (B, 1) from the last position's logits (B, vocab)."""
    logits = logits / temperature
    if top_k is not None:
        kth_largest = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        # torch.where, not boolean indexing: no device-to-host sync on the GPU
        logits = torch.where(logits < kth_largest, float("-inf"), logits)
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def decoding_attention_kernels(device):
    """SDPA backends for decoding. On CUDA, cuDNN's attention is left out: it builds a new plan for
    every new sequence length, i.e. at every step of a growing cache, and that dominated decoding."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
