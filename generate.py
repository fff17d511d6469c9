"""
Generation for model.GPT, behind GPT.generate: the sampling checks, the KV cache, the decoding
loop and compiled decoding. Past block_size the context slides and every position shifts, so the
cache is refilled from the new window: cached generation gives exactly the uncached tokens.
"""
import contextlib
import functools
import math
import weakref

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def check_sampling(temperature=1.0, top_k=None, max_new_tokens=0, use_kv_cache=True,
                   compile=False):
    """A ValueError saying which sampling argument is wrong and how to fix it."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature={temperature} must be a positive number "
                         "(use top_k=1 for greedy decoding)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be at least 1, or None (on the command line 0)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 0")
    if compile and not use_kv_cache:
        raise ValueError("compile=True decodes from the KV cache: leave use_kv_cache=True")


def sample_next(logits, temperature=1.0, top_k=None):
    """One token per row (B, 1) from the last position's logits (B, vocab)."""
    logits = logits.float()  # float16 logits over a small temperature would overflow to inf
    # the gaps to the best logit over the temperature: at a tiny one, logits would overflow to a
    # nan softmax, gaps go to -inf. One under float32's smallest normal number is taken as that.
    temperature = max(temperature, torch.finfo(torch.float32).tiny)
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        kth_largest = torch.topk(logits, min(int(top_k), logits.size(-1))).values[:, -1:]
        # torch.where, not boolean indexing: no host-device sync on the GPU
        logits = torch.where(logits < kth_largest, float("-inf"), logits)
    probs = F.softmax(logits, dim=-1)
    # torch.multinomial(probs, 1) as it computes one sample, so the same seed draws the same
    # token, without its validity checks: they read two values back to the host at every token
    exponential = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / exponential, dim=-1, keepdim=True)


class KVCache:
    """Past keys and values of every layer, (B, max_len, width) before the head split, so that
    efficient and super store their raw input once as keys and values (with RoPE twice: the keys
    turn). The buffers start at zero: unwritten rows meet only zeros of super's W^A, where
    uninitialised memory could hold a NaN. A forward grows the cache (eager decoding: its tokens
    go at `length`) or, given input_pos, writes there and attends to all max_len rows, the later
    ones masked (compiled decoding: fixed shapes and addresses, which a CUDA graph replays)."""

    def __init__(self, n_layer, max_len):
        self.max_len = max_len
        self.length = 0  # positions filled by growing forwards
        self.layers = [{} for _ in range(n_layer)]  # per layer: "k", "v", "v_aligned"

    def steps(self, T, device, input_pos=None):
        """Per layer, where the T tokens of one forward go and what each of them may see."""
        if input_pos is not None:
            positions, window, mask = input_pos, self.max_len, None
        else:
            window = self.length + T
            positions = torch.arange(self.length, window, device=device)
            # no mask keeps SDPA on its fastest kernels: a prompt into an empty cache is plain
            # causal attention, and a single new token sees every row so far
            mask = (None, T > 1) if self.length == 0 or T == 1 else None
            self.length = window
        # visible[t, s]: the t-th new token may attend to cache row s, s <= its own position
        visible = torch.arange(window, device=device) <= positions[:, None]
        return [CacheStep(buffers, self.max_len, positions, visible, mask or (visible, False))
                for buffers in self.layers]


class CacheStep:
    """One layer's buffers during one forward: its tokens' positions, the rows they may see
    (visible, (T, window)), and the (attn_mask, is_causal) that SDPA needs."""

    def __init__(self, buffers, max_len, positions, visible, attention_mask):
        self.buffers, self.max_len, self.positions = buffers, max_len, positions
        self.visible, self.attention_mask = visible, attention_mask

    def store(self, name, rows):
        """Write this forward's rows (B, T, C) at their positions; return the window's rows."""
        buffer = self.buffers.get(name)
        B, _, C = rows.shape
        # a kept cache outlives its call: the batch, autocast dtype or device may have changed
        if (buffer is None or buffer.shape != (B, self.max_len, C) or buffer.dtype != rows.dtype
                or buffer.device != rows.device):
            buffer = self.buffers[name] = rows.new_zeros(B, self.max_len, C)
            # a fixed address lets a CUDA graph update the buffer in place, not copy it each step
            torch._dynamo.mark_static_address(buffer)
        buffer.index_copy_(1, self.positions, rows)
        return buffer[:, : self.visible.size(1)]


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True,
             compile=False):
    """idx (B, T) followed by max_new_tokens sampled tokens; see GPT.generate."""
    check_sampling(temperature, top_k, max_new_tokens, use_kv_cache, compile)
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
        if cache.length == 0 or idx.size(1) > block_size:  # first step or a slide: refill eagerly
            cache.length = 0
            logits = model(idx[:, -block_size:], kv_cache=cache)[0][:, -1]
        elif not compile:
            logits = model(token, kv_cache=cache)[0][:, -1]
        else:
            input_pos.fill_(cache.length)
            torch.compiler.cudagraph_mark_step_begin()
            # token is sample_next's own tensor, not a view of idx whose stride grows (a recompile
            # per stride). The math kernel lets inductor fuse one query's attention over the cache:
            # on an H200 the memory-efficient kernel took over half of a 124M step's time
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
    # every model, variant, batch size and autocast dtype gets its own graph under decode_step's
    # one code object: generate raises dynamo's recompile_limit while it runs
    return torch.compile(decode_step, mode="reduce-overhead" if on_cuda else None, fullgraph=True)


_kept_caches = weakref.WeakKeyDictionary()  # model -> its compiled decoding's KVCache


def kept_cache(model):
    """Compiled decoding keeps one cache per model across calls: the same buffer addresses let
    a CUDA graph be replayed, not re-recorded."""
    cache = _kept_caches.get(model)
    if cache is None or cache.max_len != model.config.block_size:  # new, or the model cropped
        cache = _kept_caches[model] = KVCache(model.config.n_layer, model.config.block_size)
    return cache


def decoding_attention_kernels(device):
    """SDPA backends for decoding. On CUDA, without cuDNN's attention: it builds a new plan for
    every sequence length, i.e. at every step of a growing cache, which dominated decoding."""
    kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    on_cuda = torch.device(device).type == "cuda"
    return sdpa_kernel(kernels) if on_cuda else contextlib.nullcontext()
