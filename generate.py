"""
Generation for model.GPT: the sampling checks, the KV cache, the decoding loop and compiled decoding.
`GPT.generate` (NanoGPT's entry point) calls `generate` here.

Eager decoding grows the cache a row a step; compiled decoding writes it at fixed shapes (one CUDA graph
per token on a GPU). Past block_size the context slides, and as every position then shifts, the cache is
refilled from the new window: cached generation gives exactly the uncached tokens.
"""
import contextlib
import functools
import math
import numbers
import weakref

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def check_sampling(temperature=1.0, top_k=None, max_new_tokens=0, use_kv_cache=True, compile=False):
    """A ValueError saying which sampling argument is wrong and how to fix it; sample.py relies on it too."""
    if not (temperature > 0 and math.isfinite(temperature)):  # nan and inf too: no distribution to sample
        raise ValueError(f"temperature={temperature} must be a positive number (use top_k=1 for greedy decoding)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k={top_k} must be at least 1, or None (on the command line 0) for no cut")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 0")
    if compile and not use_kv_cache:
        raise ValueError("compile=True decodes from the KV cache: leave the KV cache on (use_kv_cache=True)")


def check_prompt(idx):
    """A ValueError unless idx is a batch of token ids (B, T) with T >= 1."""
    if idx.dim() != 2 or idx.size(1) == 0 or idx.is_floating_point() or idx.is_complex():
        raise ValueError(f"idx must be integer token ids of shape (batch, tokens) with at least one token; got "
                         f"{idx.dtype} of shape {tuple(idx.shape)} (one prompt of ids x: torch.tensor([x]))")


def sample_next(logits, temperature=1.0, top_k=None):
    """One token per row (B, 1) from the last position's logits (B, vocab)."""
    logits = logits.float()  # float16 logits over a small temperature would overflow to inf
    # the gaps to the best logit, not the logits, over the temperature: at a tiny temperature the logits
    # themselves overflow to inf (a nan softmax, which drew token 0), where the best token keeps 0 and the
    # rest go to -inf. A temperature under float32's smallest normal number (1e-38) is taken as that number,
    # as it would otherwise lose its precision, or round to 0 (0 / 0 is nan).
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, torch.finfo(torch.float32).tiny)
    if top_k is not None:
        kth_largest = torch.topk(logits, min(int(top_k), logits.size(-1))).values[:, -1:]
        # a slice and torch.where, not a list index or boolean indexing: no host-device sync on the GPU
        logits = torch.where(logits < kth_largest, float("-inf"), logits)
    probs = F.softmax(logits, dim=-1)
    # torch.multinomial(probs, 1) computed as torch.multinomial does it for one sample, so the same seed
    # draws the same token, without its validity checks, which a softmax of finite logits always
    # passes: they read two values back to the host at every token, which stalled decoding on the GPU
    exponential = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / exponential, dim=-1, keepdim=True)


class KVCache:
    """Past keys and values of every layer, preallocated to max_len positions.

    Rows are kept as (B, max_len, width), before the head split (width is n_embd, or n_kv_head * d_k for
    grouped-query keys and values), so that efficient and super store the raw block input once and use
    it as both keys and values (not with RoPE: its keys are rotated, its values not); super also keeps
    its aligned values. The buffers start at zero: rows not yet written are masked out of the scores
    and meet only zeros of super's W^A, and 0 * 0 stays 0 where uninitialised memory could hold a NaN.

    A forward either grows the cache (eager decoding: its tokens go at `length` and attend to the rows
    so far) or, given input_pos, writes at those positions and attends to all max_len rows with the
    later ones masked (compiled decoding: every step has the same shapes and buffer addresses, which is
    what a CUDA graph replays). Growing is the faster of the two for eager decoding on CPU.
    """

    def __init__(self, n_layer, max_len):
        self.max_len = max_len
        self.length = 0  # positions filled by growing forwards
        self.layers = [{} for _ in range(n_layer)]  # per layer, buffers by name: "k", "v", "v_aligned"

    def steps(self, T, device, input_pos=None):
        """Per layer, where the T tokens of one forward go and what each of them may see."""
        if input_pos is not None:
            positions, window, mask = input_pos, self.max_len, None
        else:
            if self.length + T > self.max_len:
                raise ValueError(f"the cache holds {self.max_len} positions; {self.length} are used, {T} more do not fit")
            positions, window = torch.arange(self.length, self.length + T, device=device), self.length + T
            # no mask keeps SDPA on its fastest kernels: a prompt into an empty cache is plain causal
            # attention, and a single new token sees every row so far
            mask = (None, T > 1) if self.length == 0 or T == 1 else None
            self.length = window
        # visible[t, s]: the t-th new token may attend to cache row s, s <= its own position
        visible = torch.arange(window, device=device) <= positions[:, None]
        return [CacheStep(buffers, self.max_len, positions, visible, mask or (visible, False)) for buffers in self.layers]


class CacheStep:
    """One layer's buffers during one forward: its tokens' positions, the rows they may see (visible,
    (T, window)), and the (attn_mask, is_causal) that scaled_dot_product_attention needs."""

    def __init__(self, buffers, max_len, positions, visible, attention_mask):
        self.buffers, self.max_len, self.positions = buffers, max_len, positions
        self.visible, self.attention_mask = visible, attention_mask

    def store(self, name, rows):
        """Write this forward's rows (B, T, C) at their positions; return the rows of its window."""
        buffer = self.buffers.get(name)
        B, _, C = rows.shape
        # a kept cache outlives its call: the batch, the autocast dtype or the model's device may have changed
        if buffer is None or (buffer.shape, buffer.dtype, buffer.device) != ((B, self.max_len, C), rows.dtype, rows.device):
            buffer = self.buffers[name] = rows.new_zeros(B, self.max_len, C)
            # a fixed address lets a CUDA graph update the buffer in place instead of copying it each step
            torch._dynamo.mark_static_address(buffer)
        buffer.index_copy_(1, self.positions, rows)
        return buffer[:, : self.visible.size(1)]


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True, compile=False):
    """idx (B, T) followed by max_new_tokens sampled tokens; see GPT.generate."""
    check_sampling(temperature, top_k, max_new_tokens, use_kv_cache, compile)
    check_prompt(idx)
    block_size = model.config.block_size
    with decoding_attention_kernels(idx.device), torch._dynamo.config.patch(recompile_limit=64):
        if use_kv_cache:
            return generate_cached(model, idx, max_new_tokens, temperature, top_k, compile)
        for _ in range(max_new_tokens):
            logits, _ = model(idx[:, -block_size:])
            idx = torch.cat((idx, sample_next(logits[:, -1], temperature, top_k)), dim=1)
        return idx


def generate_cached(model, idx, max_new_tokens, temperature, top_k, compile):
    block_size = model.config.block_size
    cache = kept_cache(model) if compile else KVCache(model.config.n_layer, block_size)
    cache.length = 0
    input_pos = torch.zeros(1, dtype=torch.long, device=idx.device)
    token = idx[:, -1:]
    for _ in range(max_new_tokens):
        if cache.length == 0 or idx.size(1) > block_size:  # the first step, or the window slid: refill, eagerly
            cache.length = 0
            logits = model(idx[:, -block_size:], kv_cache=cache)[0][:, -1]
        elif not compile:
            logits = model(token, kv_cache=cache)[0][:, -1]
        else:
            input_pos.fill_(cache.length)
            torch.compiler.cudagraph_mark_step_begin()
            # token is sample_next's own (B, 1) tensor, not a view of idx: a view's stride grows with idx,
            # and dynamo would recompile for it (and CUDA graphs re-record per stride). The math kernel
            # lets inductor write one query's attention over the masked cache as its own fused kernels:
            # on an H200 the memory-efficient kernel this replaces took over half of a 124M step's time
            with sdpa_kernel(SDPBackend.MATH):
                logits = compiled_decode_step(idx.is_cuda)(model, token, input_pos, cache)
            cache.length += 1
        token = sample_next(logits, temperature, top_k)
        idx = torch.cat((idx, token), dim=1)
    return idx


def decode_step(model, token, input_pos, cache):
    """Logits (B, vocab) of one token (B, 1) at input_pos (1,): a fixed-shape cache step."""
    return model(token, kv_cache=cache, input_pos=input_pos)[0][:, -1]


@functools.cache
def compiled_decode_step(on_cuda):
    # every model, variant, batch size and autocast dtype gets its own graph under decode_step's one
    # code object: generate raises dynamo's recompile_limit for its own duration, not for the process
    return torch.compile(decode_step, mode="reduce-overhead" if on_cuda else None, fullgraph=True)


_kept_caches = weakref.WeakKeyDictionary()  # model -> its compiled decoding's KVCache


def kept_cache(model):
    """Compiled decoding keeps one cache per model across calls: the same buffer addresses let a CUDA
    graph be replayed, not re-recorded."""
    cache = _kept_caches.get(model)
    if cache is None or cache.max_len != model.config.block_size:  # new, or the model was cropped
        cache = _kept_caches[model] = KVCache(model.config.n_layer, model.config.block_size)
    return cache


def decoding_attention_kernels(device):
    """SDPA backends for decoding. On CUDA, cuDNN's attention is left out: it builds a new plan for
    every new sequence length, i.e. at every step of a growing cache, and that dominated decoding."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
