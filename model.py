"""
A GPT language model whose attention is one of the four variants of
"Cost-Effective Attention Mechanisms for Low Resource Settings" (arXiv 2403.01643):

    standard   H_i = softmax(X W^Q_i (X W^K_i)^T / sqrt(d_k)) X W^V_i
    optimized  H_i = softmax(X W^Q_i (X W^K_i)^T / sqrt(d_k)) X_i          (no W^V)
    efficient  H_i = softmax(X W^Q_i X_i^T / sqrt(d_k)) X_i                (no W^V, no W^K)
    super      H_i = softmax(X W^Q_i X_i^T / sqrt(d_k)) (W^A X_i + b)      (efficient + alignment kernel)

X is the block input after LayerNorm, X_i its i-th slice of d_k = n_embd / n_head columns, and in
every variant O = [H_1 ... H_h] W^O. Everything else is NanoGPT's GPT-2 by default (learned position
embeddings, pre-LayerNorm blocks, a 4x GELU MLP, the head tied to the token embedding). Options of
GPTConfig make the blocks Llama-style (docs/llama.md): norm='rmsnorm', pos='rope', mlp='swiglu',
tie_embeddings=False, and grouped-query attention for standard (n_kv_head < n_head).

With pos='rope' the queries and keys (never the values) are rotated by their position, as in RoFormer
and Llama, so efficient's and super's keys (rotated X_i) and values (X_i) are two tensors: docs/llama.md.

The four attention classes stand side by side below; they differ only in `project` (which of Q, K, V
are learned) and, for super, in `align` and in the hooks that follow from W^A (its FLOPs, its decay,
its cropping). docs/adding-a-variant.md shows how to add a fifth. Generation (the KV cache, the
decoding loop, compiled decoding) is in generate.py, behind GPT.generate.
"""

import contextlib
import math
import os
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.nn import functional as F

import generate
from tokenizer import GPT2_VOCAB_SIZE


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
    # Llama-style options (docs/llama.md); the defaults are GPT-2's
    norm: str = "layernorm"  # 'layernorm' (GPT-2) or 'rmsnorm' (Llama: a gain, no mean, no bias)
    pos: str = "learned"  # 'learned' position table (GPT-2) or 'rope', rotary embeddings of q and k
    rope_theta: float = 10000.0  # RoPE's base: head-dim pair m turns by p * rope_theta^(-2m/d_k)
    mlp: str = "gelu"  # 'gelu' (GPT-2) or 'swiglu' (Llama: W_down(silu(W_gate x) * W_up x))
    intermediate_size: int = 0  # the MLP's hidden width; 0 = 4 * n_embd (gelu only)
    tie_embeddings: bool = True  # the output head shares the token embedding (GPT-2); False: its own
    n_kv_head: int = 0  # key/value heads of standard attention (grouped-query); 0 = n_head

    def __post_init__(self):
        for name, choices in (("attention", ATTENTION_CLASSES), ("gelu_approximate", ("none", "tanh")),
                              ("norm", NORMS), ("pos", POSITIONS), ("mlp", MLPS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name}={getattr(self, name)!r}; choose one of {', '.join(choices)}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: each head takes "
                             f"n_embd / n_head columns, so pick n_head among the divisors of n_embd")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        self._check_llama_options()

    def _check_llama_options(self):
        if self.intermediate_size < 0:
            raise ValueError(f"intermediate_size={self.intermediate_size} must be positive, or 0 for 4 * n_embd")
        if self.mlp == "swiglu" and self.intermediate_size == 0:
            raise ValueError("mlp='swiglu' needs its hidden width: set intermediate_size (Llama's is about "
                             "8/3 * n_embd, e.g. 5632 for n_embd=2048), as 4 * n_embd is GELU's convention")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"pos='rope' turns pairs of a head's dimensions, but d_k = n_embd / n_head = "
                             f"{self.n_embd // self.n_head} is odd: pick n_embd and n_head with an even quotient")
        if self.pos == "rope" and not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"rope_theta={self.rope_theta} must be a finite positive number (Llama uses 10000)")
        self._check_kv_heads()

    def _check_kv_heads(self):
        if self.n_kv_head < 0 or (self.n_kv_head and self.n_head % self.n_kv_head):
            raise ValueError(f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head} (each key/value head "
                             f"serves n_head / n_kv_head query heads), or be 0 for n_kv_head = n_head")
        if self.n_kv_head not in (0, self.n_head) and ATTENTION_CLASSES[self.attention].n_learned_inputs < 3:
            raise ValueError(f"n_kv_head={self.n_kv_head} != n_head={self.n_head} needs learned W^K and W^V to share "
                             f"between query heads, but {self.attention} attention's values (and for efficient and "
                             f"super its keys too) are the slices X_i of its input, one per query head: set "
                             f"n_kv_head=0, or use attention='standard'")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class RMSNorm(nn.Module):
    """Llama's norm: x / rms(x) * gain, no mean subtracted and no bias."""

    def __init__(self, ndim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, 1e-5)  # Llama 2's and TinyLlama's epsilon


def make_norm(config):
    return RMSNorm(config.n_embd) if config.norm == "rmsnorm" else LayerNorm(config.n_embd, bias=config.bias)


def rotary_cos_sin(positions, head_dim, theta):
    """cos and sin (T, 1, head_dim / 2) of RoPE's angles p * theta^(-2m / head_dim) at the positions
    (T,) of the tokens, in float32 (the angles reach thousands of radians)."""
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv_freq
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rotary(t, rope):
    """Rotate every head of t (B, T, heads * d_k) by the angles of rope = (cos, sin): dimension m is
    paired with m + d_k / 2 (the "rotate half" layout of GPT-NeoX and Hugging Face's Llama)."""
    cos, sin = (a.to(t.dtype) for a in rope)
    B, T, C = t.shape
    first, second = t.view(B, T, -1, 2 * cos.size(-1)).chunk(2, dim=-1)
    turned = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return turned.view(B, T, C)


# The widest head FlashAttention and cuDNN's attention take. For wider ones, such as the single head of 3072
# of the paper's 1B model, SDPA falls back to its memory-efficient kernel, which on an H100 took 2.2 times as
# long as even its math kernel's float32 products (docs/llama.md); attention_by_matmuls multiplies in bf16.
WIDEST_FUSED_HEAD = 256


def attention_by_matmuls(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0):
    """F.scaled_dot_product_attention as two matrix products in the inputs' dtype (the tensor cores under
    bf16 autocast) around a float32 softmax, for heads wider than the fused kernels take. attn_mask is a
    boolean (T, S) (True: may attend) or None; is_causal masks as SDPA does, query t against keys s <= t."""
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * (1.0 / math.sqrt(q.size(-1)))
    if is_causal:
        attn_mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights.to(v.dtype), v)


class CausalSelfAttention(nn.Module):
    """What all four variants share: the fused input projection `c_attn` (W^Q, and W^K, W^V where the
    variant learns them), the per-head causal scaled dot-product attention, and W^O (`c_proj`)."""

    n_learned_inputs = None  # how many of W^Q, W^K, W^V the variant learns
    values_are_keys = False  # efficient and super use X_i as both keys and values

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.head_dim = config.n_embd // config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head  # fewer only for grouped-query standard
        self.kv_dim = self.n_kv_head * self.head_dim  # the width of learned W^K and W^V
        self.rope_theta = config.rope_theta if config.pos == "rope" else None
        self.dropout = config.dropout
        # W^Q (n_embd wide), then W^K and W^V where learned (kv_dim wide each)
        width = config.n_embd + (self.n_learned_inputs - 1) * self.kv_dim
        self.c_attn = nn.Linear(config.n_embd, width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def project(self, x):
        """Return queries (B, T, n_embd), and keys and values (B, T, kv_dim where learned, else the input's
        n_embd), before the head split."""
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
        """Forward matmul FLOPs per token (a multiply-add is 2): the learned projections (W^Q and W^O
        d x d, W^K and W^V d x kv_dim where learned), then the scores Q K^T and the weighted sum, 2 T d
        each (every query head, whichever key/value head it shares). RoPE's rotations are not matmuls."""
        d = self.n_embd
        return 2 * (2 * d + (self.n_learned_inputs - 1) * self.kv_dim) * d + 4 * seq_len * d

    def split_heads(self, t):
        B, T, C = t.shape
        return t.view(B, T, C // self.head_dim, self.head_dim).transpose(1, 2)

    def rotate(self, q, k, rope):
        """RoPE (rope = (cos, sin) at the tokens' positions, or None): queries and keys turn, values never
        do, so efficient's keys are the rotated X_i and its values the plain X_i, and super's W^A mixes
        the plain X_i."""
        return (q, k) if rope is None else (apply_rotary(q, rope), apply_rotary(k, rope))

    def shared_kv_heads(self, t):
        """Grouped-query attention: each key/value head (B, n_kv_head, S, d_k) serves n_head / n_kv_head
        consecutive query heads. Repeating them works with every SDPA kernel and torch >= 2.4."""
        return t if self.n_kv_head == self.n_head else t.repeat_interleave(self.n_head // self.n_kv_head, dim=1)

    def forward(self, x, cache=None, rope=None):
        """x (B, T, n_embd); cache, when decoding, is this layer's generate.CacheStep; rope, with
        pos='rope', the (cos, sin) of the tokens' absolute positions (rotary_cos_sin)."""
        B, T, C = x.size()
        q, k, v = self.project(x)
        q, k = self.rotate(q, k, rope)
        if cache is not None:
            # kept in the queries' dtype: under autocast, the X_i that efficient and super use come from the
            # norm in float32, half the cache's bandwidth wasted and cast again by SDPA at every step
            k = cache.store("k", k.to(q.dtype))
            # rotated keys and unrotated values are two tensors even where the variant's K and V are one
            v = k if self.values_are_keys and rope is None else cache.store("v", v.to(q.dtype))
        v = self.align(v, cache)
        k, v = (self.shared_kv_heads(self.split_heads(t)) for t in (k, v))
        y = self.attend(self.split_heads(q), k, v, cache)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v, cache):
        """H_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i for every head at once, causal: (B, n_head, T, d_k)
        queries against (B, n_head, S, d_k) keys and values. A variant that changes the scores or the
        mask (a temperature, a window) overrides this."""
        attn_mask, is_causal = (None, q.size(2) > 1) if cache is None else cache.attention_mask
        attention = F.scaled_dot_product_attention if self.head_dim <= WIDEST_FUSED_HEAD else attention_by_matmuls
        return attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                         dropout_p=self.dropout if self.training else 0.0)


class StandardAttention(CausalSelfAttention):
    # Q' = X W^Q_i, K' = X W^K_i, V' = X W^V_i  (paper Eq. 1-2); with n_kv_head < n_head (grouped-query,
    # as TinyLlama), query head i uses W^K_j, W^V_j of group j = i // (n_head / n_kv_head)
    n_learned_inputs = 3

    def project(self, x):
        return self.c_attn(x).split([self.n_embd, self.kv_dim, self.kv_dim], dim=2)


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
        rows = torch.matmul(kernel.to(v.dtype), v) + bias[:, None]  # the bias added in float32, cached or not
        return rows if cache is None else cache.store("v_aligned", rows.to(v.dtype))

    def num_structural_zeros(self):
        return self.block_size * (self.block_size - 1) // 2

    def no_decay_parameters(self):
        # decay would pull W^A towards zero (no values at all), not towards its identity start
        return [self.align_weight]

    def crop_block_size(self, block_size):
        self.block_size = block_size
        self.align_weight = nn.Parameter(self.align_weight[:block_size, :block_size].clone())
        self.align_bias = nn.Parameter(self.align_bias[:block_size].clone())

    def flops_per_token(self, seq_len):
        return super().flops_per_token(seq_len) + 2 * seq_len * self.n_embd  # W^A V


# The registry: a new variant is one class and one line here (docs/adding-a-variant.md).
ATTENTION_CLASSES = {
    "standard": StandardAttention,
    "optimized": OptimizedAttention,
    "efficient": EfficientAttention,
    "super": SuperAttention,
}
# the paper's four, compare.py's default; the registry above may hold more (docs/adding-a-variant.md)
ATTENTION_VARIANTS = ("standard", "optimized", "efficient", "super")
# OpenAI's four GPT-2 sizes (124M, 350M, 774M, 1558M) as (n_layer, n_head, n_embd), as their hub configs say
GPT2_SHAPES = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
               "gpt2-xl": (48, 25, 1600)}
PRETRAINED_GPT2 = tuple(GPT2_SHAPES)
GPT2_CONTEXT = 1024  # the block_size of all four
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "swiglu")


class MLP(nn.Module):
    """GPT-2's: W_2 gelu(W_1 x), hidden width intermediate_size (4 * n_embd by default)."""

    def __init__(self, config):
        super().__init__()
        self.hidden = config.intermediate_size or 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, self.hidden, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(self.hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    def flops_per_token(self):
        return 2 * 2 * self.c_fc.in_features * self.hidden  # two d x hidden matrices


class SwiGLU(nn.Module):
    """Llama's: W_down(silu(W_gate x) * W_up x). W_gate and W_up are one fused Linear (`c_fc`, gate rows
    first): one matmul instead of two, the same FLOPs."""

    def __init__(self, config):
        super().__init__()
        self.hidden = config.intermediate_size
        self.c_fc = nn.Linear(config.n_embd, 2 * self.hidden, bias=config.bias)
        self.c_proj = nn.Linear(self.hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        return self.dropout(self.c_proj(F.silu(gate) * up))

    def flops_per_token(self):
        return 3 * 2 * self.c_fc.in_features * self.hidden  # three d x hidden matrices


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = ATTENTION_CLASSES[config.attention](config)
        self.ln_2 = make_norm(config)
        self.mlp = SwiGLU(config) if config.mlp == "swiglu" else MLP(config)

    def forward(self, x, cache=None, rope=None):
        x = x + self.attn(self.ln_1(x), cache, rope)
        x = x + self.mlp(self.ln_2(x))
        return x


def gpt2_config(hf, model_type, override_args):
    """Our GPTConfig for a Hugging Face GPT2Config (from the hub or a local folder), or a ValueError
    naming a setting of it this model does not have, rather than weights that load but compute
    something else."""
    supported = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,),
                 "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,)}
    for name, choices in supported.items():
        value = getattr(hf, name, choices[0])
        if value not in choices:
            raise ValueError(f"{model_type}: its {name}={value!r} is not GPT-2's ({choices[0]!r}), the only one "
                             f"this model computes")
    return GPTConfig(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer, n_head=hf.n_head,
                     n_embd=hf.n_embd, bias=True, gelu_approximate="tanh", intermediate_size=hf.n_inner or 0,
                     tie_embeddings=getattr(hf, "tie_word_embeddings", True), **override_args)


def published_gpt2_config(model_type):
    """The GPTConfig that from_pretrained(model_type) builds, known before its weights download."""
    n_layer, n_head, n_embd = GPT2_SHAPES[model_type]
    hub_config = SimpleNamespace(n_positions=GPT2_CONTEXT, vocab_size=GPT2_VOCAB_SIZE, n_layer=n_layer,
                                 n_head=n_head, n_embd=n_embd, n_inner=None)
    return gpt2_config(hub_config, model_type, {})


class PretrainedUnavailableError(RuntimeError):
    """GPT-2's weights cannot be loaded here: no `transformers`, or no network and no cached copy."""


def check_pretrained_attention(attention):
    if attention != "standard":
        raise ValueError(f"pretrained GPT-2 weights exist for standard attention only, not attention="
                         f"{attention!r}: train the {attention} variant from scratch (init_from='scratch')")


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        embeddings = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos == "learned":  # with RoPE the positions live in the attention's rotations instead
            # second, as always: an optimizer's saved state follows the order of the parameters
            embeddings["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(dict(
            **embeddings,
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
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
        """Free parameters, a tied head counted once, an untied one (tie_embeddings=False) counted beside
        the token embedding. non_embedding drops the lookup tables, as NanoGPT does: the position
        embedding, and the token embedding when it is not also the output head. Super's upper triangle
        of W^A is zero by construction and is not counted."""
        n_params = sum(p.numel() for p in self.parameters())
        n_params -= sum(block.attn.num_structural_zeros() for block in self.transformer.h)
        if non_embedding:
            if "wpe" in self.transformer:
                n_params -= self.transformer.wpe.weight.numel()
            if not self.config.tie_embeddings:
                n_params -= self.transformer.wte.weight.numel()
        return n_params

    def get_num_attention_params(self):
        """Free parameters of one attention layer (the paper's 'layer size')."""
        attn = self.transformer.h[0].attn
        return sum(p.numel() for p in attn.parameters()) - attn.num_structural_zeros()

    def forward(self, idx, targets=None, all_logits=False, kv_cache=None, input_pos=None):
        """Logits and loss. With targets, or with all_logits=True, logits cover every position
        (B, T, vocab); otherwise only the last one (B, 1, vocab), which is all sampling needs.
        When decoding, kv_cache is a generate.KVCache, which the tokens grow; given input_pos (T,), a
        tensor of positions, they are written there with fixed shapes instead (compiled decoding)."""
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"cannot forward a sequence of {T} tokens: block_size is {self.config.block_size}. "
                             f"Crop the input to its last {self.config.block_size} tokens")
        caches = [None] * len(self.transformer.h) if kv_cache is None else kv_cache.steps(T, idx.device, input_pos)
        x, rope = self.embed(idx, torch.arange(T, device=idx.device) if kv_cache is None else caches[0].positions)
        for block, cache in zip(self.transformer.h, caches):
            x = block(x, cache, rope)
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        return self.float32_logits(x if all_logits else x[:, -1:, :]), None

    def float32_logits(self, x):
        """The head in float32 even under autocast, for sampling and scoring: bfloat16 keeps 8 bits, so
        logits of 20-100 would round to steps of 0.125-0.5, tying top_k=1's candidates and shifting
        HellaSwag's sums. It costs little: one position per sampled token, and training's loss is apart."""
        no_autocast = contextlib.nullcontext() if x.device.type == "meta" else torch.autocast(x.device.type, enabled=False)
        with no_autocast:  # meta tensors (the device-placement tests) have no autocast
            return F.linear(x.float(), self.lm_head.weight.float())

    def embed(self, idx, pos):
        """The token embeddings plus, by default, the learned position embeddings at pos (T,); with RoPE,
        the token embeddings alone and the rotations at pos, which every layer's attention applies."""
        x = self.transformer.wte(idx)
        if self.config.pos == "rope":
            return self.transformer.drop(x), rotary_cos_sin(pos, self.config.n_embd // self.config.n_head,
                                                            self.config.rope_theta)
        return self.transformer.drop(x + self.transformer.wpe(pos)), None

    def crop_block_size(self, block_size):
        """Shrink the context length, e.g. to fine-tune pretrained GPT-2 at block_size < 1024."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"crop_block_size({block_size}): must be in 1..{self.config.block_size}")
        # a new config: the one given to GPT(...) may be shared with other models (NanoGPT edits it in place)
        self.config = replace(self.config, block_size=block_size)
        if "wpe" in self.transformer:  # RoPE has no table: its angles are computed for any position
            # a copy, not a view, so that the full table's memory is freed (and never saved)
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].clone())
        for block in self.transformer.h:
            block.attn.crop_block_size(block_size)

    @classmethod
    def from_pretrained(cls, model_type, override_args=None):
        """OpenAI's GPT-2 weights through Hugging Face `transformers` (standard attention only).
        model_type: gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a local folder of a Hugging Face
        GPT-2 checkpoint (what GPT2LMHeadModel.save_pretrained writes)."""
        override_args = dict(override_args or {})
        check_pretrained_attention(override_args.pop("attention", "standard"))
        unknown = set(override_args) - {"dropout"}
        if unknown:
            raise ValueError(f"only dropout can be overridden for pretrained weights, not {sorted(unknown)}")
        if model_type not in PRETRAINED_GPT2 and not os.path.isdir(model_type):
            raise ValueError(f"unknown pretrained model {model_type!r}; choose one of {', '.join(PRETRAINED_GPT2)} "
                             f"or a local folder holding a Hugging Face GPT-2 checkpoint")
        try:
            from transformers import GPT2LMHeadModel
        except ImportError as e:
            raise PretrainedUnavailableError("loading GPT-2 weights needs Hugging Face transformers: "
                                             "pip install transformers") from e
        try:
            hf_model = GPT2LMHeadModel.from_pretrained(model_type)
        except OSError as e:
            raise PretrainedUnavailableError(
                f"could not load {model_type!r} weights: they download from the Hugging Face hub on first "
                f"use, so a network is needed once (or set HF_HOME to a cache that holds them; offline, "
                f"HF_HUB_OFFLINE=1 skips the hub's retries). Cause: {e}"
            ) from e

        model = cls(gpt2_config(hf_model.config, model_type, override_args))
        ours = model.state_dict()
        # HF's GPT-2 stores these Linear weights as Conv1D, i.e. transposed
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        filled = set()
        for key, value in hf_model.state_dict().items():
            if key.endswith((".attn.masked_bias", ".attn.bias")):
                continue  # causal-mask buffers in older checkpoints, not weights
            if key.endswith(transposed):
                value = value.t()
            with torch.no_grad():
                ours[key].copy_(value)
            filled.add(key)
        if set(ours) - filled:
            raise ValueError(f"{model_type} holds no {sorted(set(ours) - filled)[:3]}: not a GPT-2 checkpoint")
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
        and the MLP's (16 d^2 for GPT-2's, 6 d ffn for SwiGLU); plus the output head 2 d V. NanoGPT's
        6N + 12 L d T agrees for standard, optimized and efficient, up to the biases and norm gains its N
        counts as well (a fraction of a percent); it misses super's W^A V."""
        cfg = self.config
        T = cfg.block_size if seq_len is None else seq_len
        d = cfg.n_embd
        block = self.transformer.h[0]
        per_layer = block.attn.flops_per_token(T) + block.mlp.flops_per_token()
        forward = cfg.n_layer * per_layer + 2 * d * cfg.vocab_size
        return 3 * forward if backward else forward

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=312e12):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (A100 bf16 by default)."""
        T = self.config.block_size
        flops_per_iter = self.flops_per_token(T) * T * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True, compile=False):
        """Sample max_new_tokens tokens after idx (B, T), as NanoGPT does: past block_size the model sees
        the last block_size tokens. Greedy decoding is top_k=1. With the KV cache (the default) each
        step runs one token; compile=True runs those steps through torch.compile. The loop and the
        cache are in generate.py."""
        return generate.generate(self, idx, max_new_tokens, temperature, top_k, use_kv_cache, compile)
