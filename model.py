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
(which of Q, K, V are learned) and, for super, in `align`.
"""

import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


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
        if self.attention not in ATTENTION_VARIANTS:
            raise ValueError(
                f"unknown attention={self.attention!r}; choose one of {', '.join(ATTENTION_VARIANTS)}"
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
    """One layer's past keys and values for incremental decoding, preallocated to block_size rows.

    Tensors are kept as (B, T, n_embd), before the head split, so that efficient and super can
    store the raw block input once and use it as both keys and values.
    """

    def __init__(self, max_len):
        self.max_len = max_len
        self.length = 0
        self.buffers = {}

    def extend(self, name, rows):
        """Append rows (B, T, C) at the current position; return all rows so far, a view."""
        B, T, C = rows.shape
        buffer = self.buffers.get(name)
        if buffer is None or buffer.shape[0] != B:
            buffer = self.buffers[name] = rows.new_empty(B, self.max_len, C)
        buffer[:, self.length : self.length + T] = rows
        return buffer[:, : self.length + T]


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

    def align(self, v, start, cache):
        """Values as the scores see them; only super changes them."""
        return v

    def num_structural_zeros(self):
        """Parameters that are zero by construction and so not free (super's upper triangle)."""
        return 0

    def split_heads(self, t):
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def forward(self, x, cache=None):
        B, T, C = x.size()
        start = 0 if cache is None else cache.length
        q, k, v = self.project(x)
        if cache is not None:
            k = cache.extend("k", k)
            v = k if self.values_are_keys else cache.extend("v", v)
        v = self.align(v, start, cache)

        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        if start == 0:  # training, or a prompt entering an empty cache
            attn_mask, is_causal = None, T > 1
        elif T == 1:  # one new token sees every cached position
            attn_mask, is_causal = None, False
        else:  # several new tokens after a cached prefix
            attn_mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
            is_causal = False
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        if cache is not None:
            cache.length += T
        return self.resid_dropout(self.c_proj(y))


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

    def align(self, v, start, cache):
        end = v.size(1)  # v holds raw values for window positions 0 .. end-1
        if end > self.block_size:
            raise ValueError(f"super attention mixes at most block_size={self.block_size} positions, got {end}")
        # rows start..end-1 of W^A V + b; tril keeps the upper triangle out of the graph, so its
        # gradient is exactly zero and it stays zero under AdamW
        kernel = torch.tril(self.align_weight[:end, :end])[start:end]
        rows = torch.matmul(kernel.to(v.dtype), v) + self.align_bias[start:end, None].to(v.dtype)
        if cache is None:
            return rows
        # rows before `start` never change within a window, so only the new rows are computed
        return cache.extend("v_aligned", rows)

    def num_structural_zeros(self):
        return self.block_size * (self.block_size - 1) // 2


ATTENTION_CLASSES = {
    "standard": StandardAttention,
    "optimized": OptimizedAttention,
    "efficient": EfficientAttention,
    "super": SuperAttention,
}
ATTENTION_VARIANTS = tuple(ATTENTION_CLASSES)
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

    def forward(self, idx, targets=None, all_logits=False, kv_cache=None):
        """Logits and loss. With targets, or with all_logits=True, logits cover every position
        (B, T, vocab); otherwise only the last one (B, 1, vocab), which is all sampling needs.
        kv_cache is a list of per-layer KVCache objects, see `generate`."""
        B, T = idx.size()
        start = 0 if kv_cache is None else kv_cache[0].length
        if start + T > self.config.block_size:
            raise ValueError(
                f"cannot forward a sequence of {start + T} tokens: block_size is {self.config.block_size}. "
                f"Crop the input to its last {self.config.block_size} tokens"
            )
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            x = block(x, None if kv_cache is None else kv_cache[i])
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
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
        for block in self.transformer.h:
            attn = block.attn
            if isinstance(attn, SuperAttention):
                attn.block_size = block_size
                attn.align_weight = nn.Parameter(attn.align_weight[:block_size, :block_size])
                attn.align_bias = nn.Parameter(attn.align_bias[:block_size])

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
        super's alignment kernel W^A: W^A starts at the identity, and decay would pull it towards
        zero (no values at all) rather than towards that starting point."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            if p.dim() >= 2 and not name.endswith("align_weight"):
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
        """Matmul FLOPs per token (a multiply-add is 2 FLOPs), forward and, by default, backward.

        Per layer, forward: the learned d x d projections 2 * n_proj * d^2 (n_proj = 4 standard,
        3 optimized, 2 efficient/super), the MLP 16 d^2, the scores and weighted sum 4 T d, and for
        super W^A V another 2 T d. Plus the output head 2 d V. Backward costs twice the forward.
        NanoGPT's 6N + 12 L d T agrees for the first three variants; it misses super's W^A V."""
        cfg = self.config
        T = cfg.block_size if seq_len is None else seq_len
        d = cfg.n_embd
        attn = self.transformer.h[0].attn
        n_proj = attn.n_learned_inputs + 1  # + W^O
        per_layer = 2 * n_proj * d * d + 16 * d * d + 4 * T * d
        if isinstance(attn, SuperAttention):
            per_layer += 2 * T * d
        forward = cfg.n_layer * per_layer + 2 * d * cfg.vocab_size
        return 3 * forward if backward else forward

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=312e12):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (A100 bf16 by default)."""
        T = self.config.block_size
        flops_per_iter = self.flops_per_token(T) * T * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    def new_kv_cache(self):
        return [KVCache(self.config.block_size) for _ in self.transformer.h]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True):
        """Sample max_new_tokens tokens after idx (B, T). Past block_size the context slides: the
        model sees the last block_size tokens, as NanoGPT does. Since every position shifts when
        the window moves, the cache is then rebuilt from the new window, so the result equals the
        uncached computation. Greedy decoding is top_k=1."""
        if temperature <= 0:
            raise ValueError(f"temperature={temperature} must be positive (use top_k=1 for greedy decoding)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k} must be at least 1, or None for no cut")
        block_size = self.config.block_size
        cache = None
        for _ in range(max_new_tokens):
            if not use_kv_cache:
                logits, _ = self(idx[:, -block_size:])
            elif cache is None or idx.size(1) > block_size:
                cache = cache or self.new_kv_cache()  # first step, or the window slid: refill
                for layer_cache in cache:
                    layer_cache.length = 0
                logits, _ = self(idx[:, -block_size:], kv_cache=cache)
            else:
                logits, _ = self(idx[:, -1:], kv_cache=cache)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
