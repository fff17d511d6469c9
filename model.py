"""
A GPT language model whose attention is one of the four variants of "Cost-Effective Attention
Mechanisms for Low Resource Settings" (arXiv 2403.01643):

    standard   H_i = softmax(X W^Q_i (X W^K_i)^T / sqrt(d_k)) X W^V_i
    optimized  H_i = softmax(X W^Q_i (X W^K_i)^T / sqrt(d_k)) X_i          (no W^V)
    efficient  H_i = softmax(X W^Q_i X_i^T / sqrt(d_k)) X_i                (no W^V, no W^K)
    super      H_i = softmax(X W^Q_i X_i^T / sqrt(d_k)) (W^A X_i + b)      (efficient + W^A)

X is the block input after the norm, X_i its i-th slice of d_k = n_embd / n_head columns, and
O = [H_1 ... H_h] W^O. The rest is NanoGPT's GPT-2, or Llama-style blocks (docs/llama.md). The
four attention classes stand side by side in the middle of this file and differ only in their
hooks (docs/adding-a-variant.md). Generation (KV cache, decoding loop) is in generate.py.
"""

import contextlib
import math
import os
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
from torch.nn import functional as F

try:  # a package: the copy in a folder export_hf.py wrote, as transformers imports it
    from . import generate
except ImportError:
    import generate


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms, like GPT-2
    attention: str = "standard"  # a key of ATTENTION_CLASSES
    gelu_approximate: str = "none"  # exact GELU (NanoGPT's), or 'tanh': GPT-2's own
    # Llama-style options (docs/llama.md); the defaults are GPT-2's
    norm: str = "layernorm"  # or 'rmsnorm': a gain, no mean, no bias
    pos: str = "learned"  # a learned position table, or 'rope': rotary embeddings of q and k
    rope_theta: float = 10000.0  # RoPE's base: head-dim pair m turns by p * theta^(-2m/d_k)
    mlp: str = "gelu"  # or 'swiglu': W_down(silu(W_gate x) * W_up x)
    intermediate_size: int = 0  # the MLP's hidden width; 0 = 4 * n_embd (gelu only)
    tie_embeddings: bool = True  # the output head is the token embedding (GPT-2), or its own
    n_kv_head: int = 0  # key/value heads of standard attention (grouped-query); 0 = n_head

    def __post_init__(self):
        choices = dict(attention=ATTENTION_CLASSES, gelu_approximate=("none", "tanh"),
                       norm=NORMS, pos=POSITIONS, mlp=MLPS)
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name}={getattr(self, name)!r}; "
                                 f"choose one of {', '.join(allowed)}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.mlp == "swiglu" and not self.intermediate_size:
            raise ValueError("mlp='swiglu' needs intermediate_size (Llama's: about 8/3 * n_embd)")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("pos='rope' turns pairs of dimensions: d_k = n_embd / n_head is odd")
        kv_learned = ATTENTION_CLASSES[self.attention].n_learned_inputs == 3
        if 0 < self.n_kv_head != self.n_head and (self.n_head % self.n_kv_head or not kv_learned):
            raise ValueError(f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head}, and "
                             "needs attention='standard', the variant with W^K and W^V to share")


NORMS, POSITIONS, MLPS = ("layernorm", "rmsnorm"), ("learned", "rope"), ("gelu", "swiglu")


def make_norm(config):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)  # Llama 2's and TinyLlama's epsilon
    return nn.LayerNorm(config.n_embd, bias=config.bias)


def rotary_cos_sin(positions, head_dim, theta):
    """cos and sin (T, 1, head_dim / 2) of RoPE's angles p * theta^(-2m / head_dim) at the
    positions (T,), in float32 (the angles reach thousands of radians)."""
    pairs = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    angles = positions.float()[:, None] * theta ** -(pairs / head_dim)
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rotary(t, rope):
    """Turn every head of t (B, T, heads * d_k) by rope = (cos, sin): dimension m pairs with
    m + d_k / 2 (the "rotate half" layout of GPT-NeoX and Hugging Face's Llama)."""
    cos, sin = (a.to(t.dtype) for a in rope)
    B, T, C = t.shape
    first, second = t.view(B, T, -1, 2 * cos.size(-1)).chunk(2, dim=-1)
    turned = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return turned.view(B, T, C)


# The widest head FlashAttention and cuDNN take. For wider ones (the paper's 1B model has one head
# of 3072) SDPA falls back to a kernel that was 17 times slower on an H100 (docs/llama.md).
WIDEST_FUSED_HEAD = 256


def attention_by_matmuls(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0):
    """SDPA as two matrix products in the inputs' dtype (the tensor cores under bf16 autocast)
    around a float32 softmax. attn_mask: boolean (T, S), True where a query may attend."""
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
    """What all variants share: the fused input projection `c_attn` (W^Q, then W^K and W^V where
    the variant learns them), causal scaled dot-product attention per head, and W^O (`c_proj`)."""

    n_learned_inputs = None  # how many of W^Q, W^K, W^V the variant learns
    values_are_keys = False  # efficient and super use X_i as both keys and values

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.head_dim = config.n_embd // config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head  # fewer only for grouped-query
        self.kv_dim = self.n_kv_head * self.head_dim  # the width of learned W^K and W^V
        self.rope_theta = config.rope_theta if config.pos == "rope" else None
        self.dropout = config.dropout
        width = config.n_embd + (self.n_learned_inputs - 1) * self.kv_dim
        self.c_attn = nn.Linear(config.n_embd, width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def project(self, x):
        """Queries (B, T, n_embd), keys and values (B, T, kv_dim where learned, else n_embd)."""
        raise NotImplementedError

    def align(self, v, cache):
        """The values as the scores weigh them; only super changes them."""
        return v

    def attend(self, q, k, v, cache):
        """softmax(Q_i K_i^T / sqrt(d_k)) V_i, causal, for all heads at once: (B, n_head, T, d_k)
        queries, (B, n_head, S, d_k) keys and values. Override to change the scores or the mask."""
        attn_mask, is_causal = cache.attention_mask if cache else (None, q.size(2) > 1)
        fused = self.head_dim <= WIDEST_FUSED_HEAD
        attention = F.scaled_dot_product_attention if fused else attention_by_matmuls
        return attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                         dropout_p=self.dropout if self.training else 0.0)

    def forward(self, x, cache=None, rope=None):
        """x (B, T, n_embd); cache, when decoding, this layer's generate.CacheStep; rope, with
        pos='rope', the (cos, sin) of the tokens' positions (rotary_cos_sin)."""
        B, T, C = x.size()
        q, k, v = self.project(x)
        if rope is not None:  # queries and keys turn, values never do
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        if cache is not None:
            # in the queries' dtype: under autocast, efficient's X_i comes from the norm in float32
            k = cache.store("k", k.to(q.dtype))
            # rotated keys and plain values are two tensors even where the variant's are one
            v = k if self.values_are_keys and rope is None else cache.store("v", v.to(q.dtype))
        v = self.align(v, cache)
        k, v = self.split_heads(k), self.split_heads(v)
        if self.n_kv_head != self.n_head:  # grouped-query: a K/V head serves several query heads
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))
        y = self.attend(self.split_heads(q), k, v, cache)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))

    def split_heads(self, t):
        B, T, C = t.shape
        return t.view(B, T, C // self.head_dim, self.head_dim).transpose(1, 2)

    def flops_per_token(self, seq_len):
        """Forward matmul FLOPs per token (a multiply-add is 2): W^Q and W^O (d x d), the learned
        W^K and W^V (d x kv_dim), then Q K^T and the weighted sum, 2 T d each."""
        d = self.n_embd
        return 2 * (2 * d + (self.n_learned_inputs - 1) * self.kv_dim) * d + 4 * seq_len * d

    def num_structural_zeros(self):
        """Parameters that are zero by construction, so not free (super's upper triangle)."""
        return 0

    def no_decay_parameters(self):
        """Matrices AdamW must not decay (biases and gains never are)."""
        return []

    def crop_block_size(self, block_size):
        """Shrink whatever depends on the context length (GPT.crop_block_size)."""


class StandardAttention(CausalSelfAttention):
    # Q' = X W^Q_i, K' = X W^K_i, V' = X W^V_i (paper Eq. 1-2). With n_kv_head < n_head (grouped-
    # query, as TinyLlama) query head i uses W^K_j, W^V_j of group j = i // (n_head / n_kv_head).
    n_learned_inputs = 3

    def project(self, x):
        return self.c_attn(x).split([self.n_embd, self.kv_dim, self.kv_dim], dim=2)


class OptimizedAttention(CausalSelfAttention):
    # Q' = X W^Q_i, K' = X W^K_i, V'_i = X_i (W^V removed)
    n_learned_inputs = 2

    def project(self, x):
        q, k = self.c_attn(x).split(self.n_embd, dim=2)
        return q, k, x


class EfficientAttention(CausalSelfAttention):
    # Q' = X W^Q_i, K'_i = V'_i = X_i (W^K and W^V removed)
    n_learned_inputs = 1
    values_are_keys = True

    def project(self, x):
        return self.c_attn(x), x, x


class SuperAttention(EfficientAttention):
    # efficient plus V'_i = W^A X_i + b. W^A (block_size square) is lower-triangular, so row p
    # mixes only positions s <= p, and one W^A serves all heads of the layer.

    def __init__(self, config):
        super().__init__(config)
        self.block_size = config.block_size
        # identity and zero: super starts out exactly equal to efficient
        self.align_weight = nn.Parameter(torch.eye(config.block_size))
        self.align_bias = nn.Parameter(torch.zeros(config.block_size))

    def align(self, v, cache):
        T = v.size(1)  # v holds the raw values of window positions 0 .. T-1
        if cache is None:
            # tril keeps the upper triangle out of the graph: its gradient is exactly zero
            kernel, bias = torch.tril(self.align_weight[:T, :T]), self.align_bias[:T]
        else:  # only the new tokens' rows: earlier rows never change within a window
            kernel = self.align_weight[cache.positions, :T].masked_fill(~cache.visible, 0.0)
            bias = self.align_bias[cache.positions]
        rows = torch.matmul(kernel.to(v.dtype), v) + bias[:, None]  # the bias added in float32
        return rows if cache is None else cache.store("v_aligned", rows.to(v.dtype))

    def flops_per_token(self, seq_len):
        return super().flops_per_token(seq_len) + 2 * seq_len * self.n_embd  # W^A V

    def num_structural_zeros(self):
        return self.block_size * (self.block_size - 1) // 2

    def no_decay_parameters(self):
        # decay would pull W^A towards zero (no values at all), not towards its identity start
        return [self.align_weight]

    def crop_block_size(self, block_size):
        self.block_size = block_size
        self.align_weight = nn.Parameter(self.align_weight[:block_size, :block_size].clone())
        self.align_bias = nn.Parameter(self.align_bias[:block_size].clone())


# The registry: a new variant is one class and one line here (docs/adding-a-variant.md).
ATTENTION_CLASSES = {
    "standard": StandardAttention,
    "optimized": OptimizedAttention,
    "efficient": EfficientAttention,
    "super": SuperAttention,
}
ATTENTION_VARIANTS = ("standard", "optimized", "efficient", "super")  # the paper's four


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
    """Llama's: W_down(silu(W_gate x) * W_up x); c_fc is W_gate and W_up, gate rows first."""

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
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        embeddings = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos == "learned":  # with RoPE the positions are in the attention's rotations
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
        """Free parameters (not super's zero upper triangle). non_embedding drops the lookup
        tables, as NanoGPT does: positions, and tokens when the table is not also the head."""
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
        """Logits of every position with targets or all_logits, else of the last (all sampling
        needs), and the loss. kv_cache: a generate.KVCache, written at input_pos if given."""
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"cannot forward {T} tokens: block_size is {self.config.block_size}")
        if kv_cache is None:
            caches, pos = [None] * self.config.n_layer, torch.arange(T, device=idx.device)
        else:
            caches = kv_cache.steps(T, idx.device, input_pos)
            pos = caches[0].positions
        x, rope = self.embed(idx, pos)
        for block, cache in zip(self.transformer.h, caches):
            x = block(x, cache, rope)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.precise_logits(x if all_logits else x[:, -1:, :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-1)
        return logits, loss

    def embed(self, idx, pos):
        """The token embeddings plus the learned position embeddings at pos (T,); with RoPE, the
        token embeddings alone, and the rotations at pos that every layer applies."""
        x = self.transformer.wte(idx)
        if self.config.pos == "rope":
            d_k = self.config.n_embd // self.config.n_head
            return self.transformer.drop(x), rotary_cos_sin(pos, d_k, self.config.rope_theta)
        return self.transformer.drop(x + self.transformer.wpe(pos)), None

    def precise_logits(self, x):
        """The head outside autocast, in float32 or the model's wider dtype, for sampling and
        scoring: bf16 keeps 8 bits, so logits of 20-100 would round to steps of 0.125-0.5."""
        dtype = torch.promote_types(self.lm_head.weight.dtype, torch.float32)
        meta = x.device.type == "meta"  # meta tensors (test_device_placement) have no autocast
        with contextlib.nullcontext() if meta else torch.autocast(x.device.type, enabled=False):
            return F.linear(x.to(dtype), self.lm_head.weight.to(dtype))

    def crop_block_size(self, block_size):
        """Shrink the context length, e.g. to fine-tune pretrained GPT-2 at block_size < 1024."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"crop_block_size({block_size}): not in 1..{self.config.block_size}")
        # a new config: the one given to GPT(...) may be shared with other models
        self.config = replace(self.config, block_size=block_size)
        if "wpe" in self.transformer:  # a copy, not a view, so that the full table is freed
            wpe = self.transformer.wpe
            wpe.weight = nn.Parameter(wpe.weight[:block_size].clone())
        for block in self.transformer.h:
            block.attn.crop_block_size(block_size)

    @classmethod
    def from_pretrained(cls, model_type, override_args=None):
        """OpenAI's GPT-2 weights through Hugging Face `transformers` (standard attention only).
        model_type: one of PRETRAINED_GPT2, or a GPT-2 or Llama folder (save_pretrained's)."""
        override_args = dict(override_args or {})
        check_pretrained_attention(override_args.pop("attention", "standard"))
        assert set(override_args) <= {"dropout"}, "only dropout can be overridden"
        if model_type not in PRETRAINED_GPT2 and not os.path.isdir(model_type):
            raise ValueError(f"unknown pretrained model {model_type!r}; choose one of "
                             f"{', '.join(PRETRAINED_GPT2)} or a Hugging Face GPT-2 or Llama "
                             f"folder")
        try:
            from transformers import AutoModelForCausalLM
            hf_model = AutoModelForCausalLM.from_pretrained(model_type, trust_remote_code=False)
        except ImportError as e:
            raise PretrainedUnavailableError("GPT-2 weights need: pip install transformers") from e
        except OSError as e:
            raise PretrainedUnavailableError(
                f"could not load {model_type!r} weights: they download from the Hugging Face hub "
                f"on first use, so a network is needed once (or set HF_HOME to a cache that holds "
                f"them; offline, HF_HUB_OFFLINE=1 skips the hub's retries). Cause: "
                f"{str(e).splitlines()[0]}") from e
        if hf_model.config.model_type == "llama":  # its weight names are in export_hf.py
            from export_hf import gpt_from_llama
            return gpt_from_llama(hf_model, override_args)
        if hf_model.config.model_type != "gpt2":
            raise ValueError(f"{model_type} is a {hf_model.config.model_type} model, not GPT-2 "
                             f"or Llama: load its checkpoint instead")
        model = cls(gpt2_config(hf_model.config, model_type, override_args))
        model.load_state_dict({k: v.t() if k.endswith(CONV1D_WEIGHTS) else v
                               for k, v in hf_model.state_dict().items()
                               if not k.endswith((".attn.masked_bias", ".attn.bias"))})  # masks
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW that decays the weight matrices and embeddings, but not biases, norm gains or the
        matrices an attention variant exempts (super's W^A)."""
        exempt = {id(p) for block in self.transformer.h for p in block.attn.no_decay_parameters()}
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2 and id(p) not in exempt]
        no_decay = [p for p in params if p.dim() < 2 or id(p) in exempt]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        # one fused kernel for all parameters: on CPU (torch >= 2.4) ~7% of a small model's step
        fused = device_type in ("cuda", "cpu")
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self, seq_len=None, backward=True):
        """Matmul FLOPs per token (a multiply-add is 2), forward and by default backward (twice
        the forward): each layer's attention and MLP, and the head's 2 d V (docs/llama.md)."""
        cfg = self.config
        T = cfg.block_size if seq_len is None else seq_len
        block = self.transformer.h[0]
        per_layer = block.attn.flops_per_token(T) + block.mlp.flops_per_token()
        forward = cfg.n_layer * per_layer + 2 * cfg.n_embd * cfg.vocab_size
        return 3 * forward if backward else forward

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=312e12):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (A100 bf16 by default)."""
        T = self.config.block_size
        return self.flops_per_token(T) * T * fwdbwd_per_iter / dt / peak_flops

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True,
                 compile=False):
        """Sample max_new_tokens tokens after idx (B, T), as NanoGPT does (greedy: top_k=1),
        through the KV cache by default, compiled with compile=True (generate.py)."""
        return generate.generate(self, idx, max_new_tokens, temperature, top_k, use_kv_cache,
                                 compile)


# GPT-2's published weights: OpenAI's four sizes, each with a context of 1024 tokens
PRETRAINED_GPT2 = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
GPT2_CONTEXT = 1024
# HF's GPT-2 stores these Linear weights as Conv1D, i.e. transposed
CONV1D_WEIGHTS = ("c_attn.weight", "c_proj.weight", "c_fc.weight")


class PretrainedUnavailableError(RuntimeError):
    """GPT-2's weights cannot be loaded here: no `transformers`, or no network and no cache."""


def check_pretrained_attention(attention):
    if attention != "standard":
        raise ValueError(f"pretrained GPT-2 weights exist for standard attention only, not "
                         f"attention={attention!r}: train {attention} from scratch")


def gpt2_config(hf, model_type, override_args):
    """Our GPTConfig for a Hugging Face GPT2Config, or a ValueError naming a setting of it that
    this model does not compute (weights that load but compute something else)."""
    supported = {"activation_function": ("gelu_new", "gelu_pytorch_tanh", "gelu"),
                 "layer_norm_epsilon": (1e-5,), "scale_attn_weights": (True,),
                 "scale_attn_by_inverse_layer_idx": (False,)}
    for name, choices in supported.items():
        if getattr(hf, name, choices[0]) not in choices:
            raise ValueError(f"{model_type}: its {name}={getattr(hf, name)!r} is not GPT-2's")
    return GPTConfig(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer,
                     n_head=hf.n_head, n_embd=hf.n_embd, bias=True,
                     intermediate_size=hf.n_inner or 0, gelu_approximate="none"
                     if getattr(hf, "activation_function", "gelu_new") == "gelu" else "tanh",
                     tie_embeddings=getattr(hf, "tie_word_embeddings", True), **override_args)