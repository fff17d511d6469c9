"""model.py and generate.py: parameter counts, the variants' equations, equivalences, causality,
KV-cached and compiled generation, FLOP counts. The properties run over every variant in the
shapes of conftest.SHAPES (GPT-2-style, Llama-style, grouped-query, one wide head)."""

import math
from collections import Counter

import pytest
import torch
from torch.nn import functional as F
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from conftest import (LLAMA, SHAPES, TINY, VARIANTS, WIDE_HEAD, needs_compiler, random_tokens,
                      tiny_model)
from example_variant import TemperatureAttention
import generate
from generate import KVCache, sample_next
from model import (GPT, GPTConfig, SuperAttention, attention_by_matmuls, gpt2_config,
                   rotary_cos_sin)

BLOCK = TINY["block_size"]
GPT2_SHAPE = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, bias=True)


def ops_run(fn):
    """The aten operators fn runs, by name and count, nested calls included (torch.profiler)."""
    with torch.profiler.profile() as profile:
        fn()
    return Counter(event.name for event in profile.events() if event.name.startswith("aten::"))


def sdpa_calls(ops):
    return sum(n for name, n in ops.items() if name.startswith("aten::_scaled_dot_product"))


def logits(model, idx, **kwargs):
    with torch.no_grad():
        return model(idx, all_logits=True, **kwargs)[0]


@pytest.mark.parametrize("attention, layer_params, model_params", [
    ("standard", 2_362_368, 124_439_808),
    ("optimized", 1_771_776, 117_352_704),
    ("efficient", 1_181_184, 110_265_600),
    # free lower-triangular entries of W^A (1024*1025/2) and its bias, per layer
    ("super", 1_181_184 + 524_800 + 1_024, 110_265_600 + 12 * (524_800 + 1_024)),
])
def test_parameter_counts_at_gpt2_124m_shape(attention, layer_params, model_params):
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = GPT(GPTConfig(**GPT2_SHAPE, attention=attention))
    assert model.get_num_attention_params() == layer_params
    assert model.get_num_params(non_embedding=False) == model_params
    assert model.get_num_params() == model_params - 1024 * 768  # minus the position embedding


@pytest.mark.parametrize("options", [{}, LLAMA], ids=["gpt2", "llama"])
def test_initialisation_is_gpt2s_with_the_residual_projections_scaled_down(options):
    """Weights N(0, 0.02), W^O and the MLP's output 0.02 / sqrt(2 n_layer), biases 0, gains 1."""
    model = tiny_model("standard", n_layer=4, **options)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            expected = 1.0 if name.endswith("weight") else 0.0
            assert torch.equal(p, torch.full_like(p, expected)), name
        else:
            std = 0.02 / math.sqrt(2 * 4) if name.endswith("c_proj.weight") else 0.02
            assert p.std().item() == pytest.approx(std, rel=0.15), name


def rotate_by_matrix(t, theta):
    """RoPE as RoFormer writes it: row p of one head's (T, d_k) queries or keys times the block
    rotation matrix R_p, which turns the pair (m, m + d_k/2) by p * theta^(-2m/d_k)."""
    if theta is None:
        return t
    T, dk = t.shape
    half = dk // 2
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2 * torch.arange(half) / dk)
    R = torch.zeros(T, dk, dk, dtype=torch.float64)
    m = torch.arange(half)
    R[:, m, m], R[:, m, m + half] = angle.cos(), -angle.sin()
    R[:, m + half, m], R[:, m + half, m + half] = angle.sin(), angle.cos()
    return torch.einsum("pij,pj->pi", R.to(t), t)


# Where a variant's equation departs from H_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i.
VALUES = {SuperAttention: lambda attn, V: torch.tril(attn.align_weight[:len(V), :len(V)]) @ V
          + attn.align_bias[:len(V), None]}  # V' = W^A V + b
SCORES = {TemperatureAttention: lambda attn, s, head: s * attn.log_temperature[head].exp()}


def reference_attention(attn, x):
    """The variant stated literally, unfused, one head at a time, for one sequence x (T, d): the
    oracle that `forward` (fused, cached, compiled) is held to."""
    T, d = x.shape
    dk = attn.head_dim
    W = attn.c_attn.weight
    b = attn.c_attn.bias if attn.c_attn.bias is not None else torch.zeros(W.size(0))
    # the learned inputs come in the order W^Q, W^K, W^V; those not learned are X itself
    rows = [0, d, d + attn.kv_dim, d + 2 * attn.kv_dim][: attn.n_learned_inputs + 1]
    learned = [x @ W[r0:r1].T + b[r0:r1] for r0, r1 in zip(rows, rows[1:])]
    Q, K, V = (learned + [x, x])[:3]
    V = VALUES.get(type(attn), lambda attn, V: V)(attn, V)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for i in range(attn.n_head):
        cols = slice(i * dk, (i + 1) * dk)
        j = i // (attn.n_head // attn.n_kv_head)  # the key/value head query head i shares
        kv_cols = slice(j * dk, (j + 1) * dk)
        q = rotate_by_matrix(Q[:, cols], attn.rope_theta)
        k = rotate_by_matrix(K[:, kv_cols], attn.rope_theta)
        scores = SCORES.get(type(attn), lambda attn, s, head: s)(attn, q @ k.T / math.sqrt(dk), i)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        heads.append(weights @ V[:, kv_cols])
    return attn.c_proj(torch.cat(heads, dim=1))


@pytest.mark.parametrize("attention, options", SHAPES)
def test_attention_matches_the_variants_equations(attention, options):
    attn = tiny_model(attention, **options).transformer.h[0].attn
    x = torch.randn(3, BLOCK, attn.n_embd, generator=torch.Generator().manual_seed(2))
    rope = None if attn.rope_theta is None else rotary_cos_sin(torch.arange(BLOCK), attn.head_dim,
                                                                attn.rope_theta)
    with torch.no_grad():
        ours = attn(x, rope=rope)
        for seq in range(x.size(0)):
            expected = reference_attention(attn, x[seq])
            torch.testing.assert_close(ours[seq], expected, atol=1e-5, rtol=1e-5)


def test_attention_by_matmuls_multiplies_in_bf16_with_a_float32_softmax(monkeypatch):
    """The wide-head shape of SHAPES holds it to the equations; this, to its dtypes."""
    softmax, dtypes = F.softmax, []
    monkeypatch.setattr(F, "softmax", lambda s, **kw: dtypes.append(s.dtype) or softmax(s, **kw))
    q, k, v = torch.randn(3, 1, 1, 6, 300, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention_by_matmuls(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16 and dtypes == [torch.float32]
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.float(), plain, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("options, uses_sdpa", [(LLAMA, True), (WIDE_HEAD, False)],
                         ids=["narrow", "wide"])
def test_only_heads_wider_than_the_fused_kernels_take_skip_sdpa(options, uses_sdpa):
    model, idx = tiny_model("efficient", **options), random_tokens(2, 8)
    ops = ops_run(lambda: model(idx, idx)[1].backward())
    assert (sdpa_calls(ops) > 0) == uses_sdpa, ops
    ops = ops_run(lambda: model.generate(idx, 3))
    assert (sdpa_calls(ops) > 0) == uses_sdpa, ops


@pytest.mark.slow
@needs_compiler
def test_compiled_wide_head_attention_stays_matmuls():
    """Inductor's fuse_attention pass would make some matmul-softmax-matmul SDPA again."""
    model, idx = tiny_model("efficient", **WIDE_HEAD), random_tokens(2, 8)
    compiled = torch.compile(model)
    counters.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled(idx, idx)[1].backward()
        ops = ops_run(lambda: compiled(idx, idx)[1].backward())
    assert counters["inductor"]["fuse_attention"] == 0
    assert sdpa_calls(ops) == 0, ops


@pytest.mark.parametrize("options", [{}, LLAMA], ids=["gpt2", "llama"])
def test_the_model_is_embeddings_pre_norm_blocks_final_norm_and_head(options):
    """logits = head(ln_f(x_L)), x_l = h + mlp(ln_2(h)), h = x_(l-1) + attn(ln_1(x_(l-1))), x_0 the
    token (and learned position) embeddings; the norms' gains and biases random (at one and zero
    swapping or skipping a norm would change nothing)."""
    model, idx = tiny_model("standard", **options), random_tokens(2, 10)
    cfg, positions = model.config, torch.arange(10)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.5)
        x, rope = model.transformer.wte(idx), None
        if cfg.pos == "learned":
            x = x + model.transformer.wpe(positions)
        else:
            rope = rotary_cos_sin(positions, cfg.n_embd // cfg.n_head, cfg.rope_theta)
        for block in model.transformer.h:
            h = x + block.attn(block.ln_1(x), None, rope)
            x = h + block.mlp(block.ln_2(h))
        expected = model.transformer.ln_f(x) @ model.lm_head.weight.T
    torch.testing.assert_close(logits(model, idx), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention, options", SHAPES)
def test_future_tokens_do_not_change_past_logits(attention, options):
    """At every cut t of a full block: a leak that only later positions have shows at theirs."""
    model = tiny_model(attention, **options)
    idx = random_tokens(2, BLOCK)
    full = logits(model, idx)
    for t in range(idx.size(1) - 1):
        changed = idx.clone()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % TINY["vocab_size"]
        after = logits(model, changed)
        torch.testing.assert_close(full[:, : t + 1], after[:, : t + 1], atol=0, rtol=0,
                                   msg=lambda m: f"tokens after {t} changed logits up to it: {m}")
        assert not torch.allclose(full[:, t + 1 :], after[:, t + 1 :]), t


def cached_logits(model, idx, prefix, cache=None, fixed_shapes=False):
    """Logits of idx fed to the KV cache as a prefix, then one token a step: growing the cache
    (eager decoding) or written at input_pos (compiled decoding's fixed shapes)."""
    cache = cache or KVCache(model.config.n_layer, model.config.block_size)
    cache.length = 0
    steps = [logits(model, idx[:, :prefix], kv_cache=cache)]
    for t in range(prefix, idx.size(1)):
        at = dict(input_pos=torch.tensor([t])) if fixed_shapes else {}
        steps.append(logits(model, idx[:, t : t + 1], kv_cache=cache, **at))
    return torch.cat(steps, dim=1)


def test_super_ignores_the_upper_triangle_of_its_kernel():
    """Training keeps it zero, a loaded kernel need not: no forward, cached or not, reads it."""
    model, idx = tiny_model("super"), random_tokens(2, 12)
    before = logits(model, idx)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.align_weight.add_(torch.ones(BLOCK, BLOCK).triu(1))
    torch.testing.assert_close(logits(model, idx), before, atol=0, rtol=0)
    cache = KVCache(TINY["n_layer"], BLOCK)
    torch.testing.assert_close(cached_logits(model, idx, 5, cache), before, atol=1e-5, rtol=1e-5)
    fixed = cached_logits(model, idx, 1, cache, fixed_shapes=True)
    torch.testing.assert_close(fixed, before, atol=1e-5, rtol=1e-5)


def standard_equivalent_of(model):
    """A standard model with `model`'s weights, and identities where `model` has no W^K / W^V."""
    d = model.config.n_embd
    standard = GPT(GPTConfig(**{**vars(model.config), "attention": "standard"})).eval()
    state = {k: v for k, v in model.state_dict().items() if "align_" not in k}
    eye, zero = torch.eye(d), torch.zeros(d)
    for i, block in enumerate(model.transformer.h):
        W, b = block.attn.c_attn.weight, block.attn.c_attn.bias
        n = block.attn.n_learned_inputs
        state[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat([W] + [eye] * (3 - n))
        state[f"transformer.h.{i}.attn.c_attn.bias"] = torch.cat([b] + [zero] * (3 - n))
    standard.load_state_dict(state)
    return standard


@pytest.mark.parametrize("attention", ["optimized", "efficient"])
def test_variant_equals_standard_with_identity_projections(attention):
    model, idx = tiny_model(attention), random_tokens(3, 14)
    torch.testing.assert_close(logits(model, idx), logits(standard_equivalent_of(model), idx),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [{}, LLAMA], ids=["gpt2", "llama"])
def test_super_at_initialisation_equals_efficient(options):
    sup = tiny_model("super", random_alignment=False, **options)
    efficient = tiny_model("efficient", **options)
    efficient.load_state_dict({k: v for k, v in sup.state_dict().items() if "align_" not in k})
    for block in sup.transformer.h:
        assert torch.equal(block.attn.align_weight, torch.eye(BLOCK))
        assert torch.equal(block.attn.align_bias, torch.zeros(BLOCK))
    idx = random_tokens(3, 14)
    # exactly: the identity W^A and the zero bias reproduce each value bit for bit
    assert torch.equal(logits(sup, idx), logits(efficient, idx))


@pytest.mark.parametrize("attention, options", SHAPES)
def test_dropout_acts_only_while_training(attention, options):
    model, plain = tiny_model(attention, dropout=0.5, **options), tiny_model(attention, **options)
    idx = random_tokens(2, 10)
    evaluated, expected = logits(model, idx), logits(plain, idx)
    trained = logits(model.train(), idx)
    torch.testing.assert_close(evaluated, expected, atol=0, rtol=0)
    assert not torch.allclose(trained, expected)


def test_optimizer_decays_matrices_but_not_biases_or_w_a_whose_upper_triangle_stays_zero():
    model = tiny_model("super", random_alignment=False).train()
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.85, 0.97), "cpu")
    # train.py sets each group's lr at every step; other callers rely on the one given here
    assert [(g["lr"], g["betas"], g["weight_decay"]) for g in optimizer.param_groups] == [
        (1e-2, (0.85, 0.97), 0.1), (1e-2, (0.85, 0.97), 0.0)]
    assert optimizer.defaults["fused"]  # one kernel for all parameters, on CPU as on CUDA
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    attn = model.transformer.h[0].attn
    assert id(attn.c_attn.weight) in decayed and id(model.lm_head.weight) in decayed
    assert id(attn.align_weight) not in decayed and id(attn.c_attn.bias) not in decayed
    n_in_groups = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    assert n_in_groups == sum(p.numel() for p in model.parameters())
    idx = random_tokens(4, 16)
    for _ in range(3):
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for block in model.transformer.h:
        W = block.attn.align_weight
        assert torch.count_nonzero(W.triu(1)) == 0
        assert not torch.equal(W.tril(), torch.eye(BLOCK))  # it did learn


@pytest.mark.parametrize("attention, options", SHAPES)
def test_logits_cover_every_position_with_targets_or_all_logits_else_the_last(attention, options):
    model = tiny_model(attention, **options)
    idx = random_tokens(2, 11)
    every = logits(model, idx)
    with torch.no_grad():
        last, _ = model(idx)
        with_targets, loss = model(idx[:, :-1], targets=idx[:, 1:])
        targets = idx[:, 1:].clone()
        targets[:, :4] = -1  # left out of the loss, e.g. a prompt a fine-tune does not learn
        _, partial_loss = model(idx[:, :-1], targets=targets)
    assert every.shape == (2, 11, TINY["vocab_size"]) and last.shape == (2, 1, TINY["vocab_size"])
    torch.testing.assert_close(last[:, 0], every[:, -1])
    torch.testing.assert_close(with_targets, every[:, :-1], atol=1e-6, rtol=1e-6)
    V = TINY["vocab_size"]
    expected = F.cross_entropy(every[:, :-1].reshape(-1, V), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
    expected = F.cross_entropy(every[:, 4:-1].reshape(-1, V), idx[:, 5:].reshape(-1))
    torch.testing.assert_close(partial_loss, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype, autocast", [(torch.float32, torch.bfloat16),
                                             (torch.float64, None)])
def test_logits_for_sampling_and_scoring_are_float32_or_wider(dtype, autocast):
    """bf16 would round logits of 20-100 to steps of 0.125-0.5, float32 a float64 model's by ~5e-6:
    the head sampling and HellaSwag read is float32 or the model's wider dtype (not the loss)."""
    model, idx, hidden = tiny_model("super").to(dtype), random_tokens(2, 10), []
    model.transformer.ln_f.register_forward_hook(lambda module, args, out: hidden.append(out))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast is not None):
        every, _ = model(idx, all_logits=True)
        last, _ = model(idx)
        with_targets, _ = model(idx, targets=idx)
    assert every.dtype == last.dtype == dtype and with_targets.dtype == (autocast or dtype)
    assert torch.equal(every, F.linear(hidden[0].to(dtype), model.lm_head.weight))  # 1st forward's
    torch.testing.assert_close(last[:, 0], every[:, -1])  # one row or ten: rounding may differ
    if dtype == torch.float64:  # the float32 model's, up to its rounding
        expected = logits(tiny_model("super"), idx).double()
        torch.testing.assert_close(every, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention, options", SHAPES)
def test_crop_block_size_keeps_short_sequences_unchanged(attention, options):
    model = tiny_model(attention, **options)
    config = model.config
    idx = random_tokens(2, 8)
    before = logits(model, idx)
    with pytest.raises(ValueError, match=r"crop_block_size\(17\)"):
        model.crop_block_size(BLOCK + 1)
    model.crop_block_size(8)
    torch.testing.assert_close(logits(model, idx), before, atol=0, rtol=0)
    # a new config: the one it was built from may be shared with other models
    assert model.config.block_size == 8 and config.block_size == BLOCK
    if "wpe" in model.transformer:  # RoPE has no position table
        assert model.transformer.wpe.weight.shape[0] == 8
    if attention == "super":
        assert model.transformer.h[0].attn.align_weight.shape == (8, 8)
        assert model.transformer.h[0].attn.align_bias.shape == (8,)
        # the cropped W^A's free entries: its lower triangle, 8 * 9 / 2, and 8 biases
        efficient = tiny_model("efficient", **options).get_num_attention_params()
        assert model.get_num_attention_params() == efficient + 8 * 9 // 2 + 8
    for name, p in model.named_parameters():  # copies: the full-size tables are freed, never saved
        assert p.untyped_storage().nbytes() == p.numel() * p.element_size(), name
    with pytest.raises(ValueError, match="block_size is 8"):
        model(random_tokens(1, 9))


@pytest.mark.parametrize("dtype, temperature", [(torch.float16, 1e-4), (torch.float32, 1e-40),
                                                (torch.float32, 1e-300)])
@pytest.mark.parametrize("top_k", [None, 2])
def test_sampling_at_a_vanishing_temperature_is_greedy(dtype, temperature, top_k):
    """However small: logits / 1e-4 overflow float16, and / 1e-40 float32, to inf."""
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [12.0, 11.5, 14.0, 5.0]], dtype=dtype)
    torch.manual_seed(0)
    drawn = [sample_next(logits, temperature, top_k).flatten().tolist() for _ in range(5)]
    assert drawn == [[1, 2]] * 5


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.8, 5)])
def test_sampling_draws_torch_multinomial_tokens_without_a_host_read(temperature, top_k):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 4
    kept = logits / temperature if top_k is None else (logits / temperature).where(
        logits >= logits.topk(top_k).values[:, -1:], float("-inf"))
    for seed in range(5):
        torch.manual_seed(seed)
        expected, expected_next = torch.multinomial(F.softmax(kept, dim=-1), 1), torch.rand(1)
        torch.manual_seed(seed)
        assert torch.equal(sample_next(logits, temperature, top_k), expected)
        assert torch.equal(torch.rand(1), expected_next)  # the same random numbers used up
    # .item() on a GPU tensor waits for the GPU; torch.multinomial's checks did it twice a token
    ops = ops_run(lambda: sample_next(logits, temperature, top_k))
    assert ops["aten::_local_scalar_dense"] == 0


@pytest.mark.parametrize("arguments, match", [
    (dict(temperature=0), "temperature=0 must be a positive number"),
    (dict(top_k=0), "top_k=0 must be at least 1"),
    (dict(max_new_tokens=-1), "max_new_tokens=-1 must be at least 0"),
    (dict(use_kv_cache=False, compile=True), "leave use_kv_cache=True"),
])
def test_generate_rejects_bad_sampling_arguments(arguments, match):
    with pytest.raises(ValueError, match=match):
        tiny_model("efficient").generate(random_tokens(1, 3), **{"max_new_tokens": 2, **arguments})


COMPILED = [(a, "gpt2", {}) for a in VARIANTS] + [(a, "llama", LLAMA) for a in VARIANTS[:4]]
DECODINGS = ([pytest.param(*shape.values, False, id=shape.id) for shape in SHAPES]
             + [pytest.param(attention, options, True, id=f"{attention}-{name}-compiled",
                             marks=[pytest.mark.slow, needs_compiler])
                for attention, name, options in COMPILED])


@pytest.mark.parametrize("attention, options, compile", DECODINGS)
def test_cached_generation_equals_uncached_past_block_size(attention, options, compile,
                                                           monkeypatch):
    """The same tokens as uncached generation, well past block_size (the window slides and the
    cache refills), and at each step the logits of the model run afresh on the last block_size
    tokens: past the slide every position shifts (super's W^A row p is again the p-th token of
    the window), and logits off by up to 0.0005 there changed no token. Compiled decoding makes
    one graph per model, whatever the step, refill or call (a CUDA graph re-recorded per token
    would be slower than eager), and calls no fused attention kernel after the prompt's pass."""
    model, prompt = tiny_model(attention, **options), random_tokens(2, 5)
    graphs, limit = counters["stats"]["unique_graphs"], torch._dynamo.config.recompile_limit
    for sampling in (dict(top_k=1), dict(temperature=0.8), dict(temperature=1.3, top_k=5)):
        torch.manual_seed(7)
        cached = model.generate(prompt, 2 * BLOCK, compile=compile, **sampling)
        torch.manual_seed(7)
        uncached = model.generate(prompt, 2 * BLOCK, use_kv_cache=False, **sampling)
        assert cached.shape == (2, 5 + 2 * BLOCK) and torch.equal(cached, uncached), sampling
    assert counters["stats"]["unique_graphs"] - graphs <= compile
    assert torch._dynamo.config.recompile_limit == limit  # no global setting changed
    assert torch.equal(model.generate(prompt, 0), prompt)
    if compile:  # inductor writes the steps' math SDPA over the masked cache as its own kernels
        ops = ops_run(lambda: model.generate(prompt, 8, compile=True))
        assert sdpa_calls(ops) == TINY["n_layer"] and ops["aten::_local_scalar_dense"] == 0, ops
    seen = []
    monkeypatch.setattr(generate, "sample_next",
                        lambda x, *args: seen.append(x.clone()) or sample_next(x, *args))
    out = model.generate(prompt, BLOCK + 6, top_k=1, compile=compile)
    with torch.no_grad():
        expected = [model(out[:, max(0, t - BLOCK) : t])[0][:, -1] for t in range(5, out.size(1))]
    torch.testing.assert_close(torch.stack(seen), torch.stack(expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention, options", SHAPES)
def test_cached_logits_equal_recomputed_logits(attention, options):
    """Growing (eager decoding): a prefix, single tokens and a chunk. Fixed shapes (compiled
    decoding): single tokens at input_pos, over buffers that still hold another sequence. Under
    bf16 autocast the cache holds bf16, not the float32 of the norm's output (efficient's X_i),
    which SDPA would cast at every step."""
    model, idx = tiny_model(attention, **options), random_tokens(2, BLOCK)
    full, cache = logits(model, idx), KVCache(TINY["n_layer"], BLOCK)
    growing = cached_logits(model, idx[:, :9], 5, cache)
    growing = torch.cat([growing, logits(model, idx[:, 9:], kv_cache=cache)], dim=1)  # a chunk
    cached_logits(model, random_tokens(2, BLOCK, seed=9), BLOCK, cache)  # stale rows everywhere
    fixed = cached_logits(model, idx, 3, cache, fixed_shapes=True)
    torch.testing.assert_close(growing, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fixed, full, atol=1e-5, rtol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cache = KVCache(TINY["n_layer"], BLOCK)
        full, cached = logits(model, idx), cached_logits(model, idx, 5, cache)
    assert {buf.dtype for layer in cache.layers for buf in layer.values()} == {torch.bfloat16}
    torch.testing.assert_close(cached, full, atol=5e-3, rtol=0)


@pytest.mark.parametrize("attention, options", SHAPES)
def test_generation_never_reads_a_value_back_to_the_host(attention, options):
    """On a GPU a read (.item(), a tensor's truth value) waits for all queued kernels: one a token
    keeps the host from queuing the next step while the GPU runs this one."""
    model, prompt = tiny_model(attention, **options), random_tokens(2, 3)
    for sampling in (dict(), dict(use_kv_cache=False), dict(temperature=0.8, top_k=3)):
        ops = ops_run(lambda: model.generate(prompt, BLOCK + 4, **sampling))  # the window slides
        assert ops["aten::_local_scalar_dense"] == 0, sampling


@pytest.mark.slow
@needs_compiler
def test_compiled_generation_after_cropping_equals_eager():
    """Compiled decoding keeps its cache between calls; a model cropped since needs a new one."""
    model, prompt = tiny_model("super"), random_tokens(1, 5)
    model.generate(prompt, 3, compile=True)
    model.crop_block_size(8)
    torch.manual_seed(7)
    eager = model.generate(prompt, 12, top_k=3)
    torch.manual_seed(7)
    assert torch.equal(model.generate(prompt, 12, top_k=3, compile=True), eager)


@pytest.mark.parametrize("attention, options", SHAPES)
def test_flop_estimate_matches_flop_counter(attention, options):
    shape = dict(n_embd=64, block_size=32, vocab_size=101, intermediate_size=176 if options else 0)
    model = tiny_model(attention, **{**options, **shape}).train()
    B, T = 2, 32
    idx = random_tokens(B, T + 1, vocab=101)
    # FlopCounterMode counts the math attention kernel, not the fused CPU one
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        loss.backward()
    # exact: every matmul counted, attention's full T x T included
    assert model.flops_per_token(T) * B * T == counter.get_total_flops()
    assert model.flops_per_token(T, backward=False) * 3 == model.flops_per_token(T)


def test_flop_ratios_at_gpt2_shape_and_mfu():
    flops = {}
    for attention in ("standard", "optimized", "efficient", "super"):
        with torch.device("meta"):
            model = GPT(GPTConfig(**GPT2_SHAPE, attention=attention))
        flops[attention] = model.flops_per_token(1024)
    ratios = {a: flops[a] / flops["standard"] for a in flops}
    assert ratios["optimized"] == pytest.approx(0.95, abs=0.01)
    assert ratios["efficient"] == pytest.approx(0.90, abs=0.01)
    assert ratios["super"] == pytest.approx(0.97, abs=0.01)
    model = tiny_model("standard")
    flops_per_iter = model.flops_per_token(16) * 16 * 4
    assert model.estimate_mfu(4, dt=2.0, peak_flops=flops_per_iter) == pytest.approx(0.5)


@pytest.mark.parametrize("options, match", [
    (dict(attention="fast"), "'fast'; choose one of standard, optimized, efficient, super"),
    (dict(norm="batchnorm"), "layernorm, rmsnorm"),
    (dict(n_head=0), "n_head=0 must be a positive integer"),
    (dict(n_embd=100, n_head=12), "not divisible by n_head"),
    (dict(mlp="swiglu"), "needs intermediate_size"),
    (dict(pos="rope", n_embd=36, n_head=4), "is odd"),
    (dict(n_kv_head=3), "must divide n_head=4"),
    (dict(attention="efficient", n_kv_head=2), "needs attention='standard'"),
])
def test_bad_configs_name_the_fix(options, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**TINY, **options})


def test_from_pretrained_refuses_other_variants_and_models():
    with pytest.raises(ValueError, match="standard attention only"):
        GPT.from_pretrained("gpt2", dict(attention="efficient"))
    with pytest.raises(ValueError, match="choose one of gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        GPT.from_pretrained("gpt3")


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, dict(tie_word_embeddings=False), dict(n_inner=100)],
                         ids=str)
def test_from_pretrained_reproduces_a_hugging_face_gpt2(options, tmp_path):
    """A small random GPT-2 saved as the hub stores them (the real weights need a network) loads
    with the same logits; a local folder may also hold an untied head or another MLP width."""
    transformers = pytest.importorskip("transformers", reason="from_pretrained needs transformers")
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_positions=32, n_embd=48, n_layer=2, n_head=4, vocab_size=97, **options)).eval()
    if not hf_model.config.tie_word_embeddings:
        torch.nn.init.normal_(hf_model.lm_head.weight)  # not a copy of the embedding
    hf_model.save_pretrained(tmp_path)
    model = GPT.from_pretrained(str(tmp_path)).eval()
    cfg = model.config
    assert (cfg.block_size, cfg.vocab_size, cfg.attention) == (32, 97, "standard")
    idx = random_tokens(2, 20, vocab=97)
    with torch.no_grad():
        theirs = hf_model(idx).logits
    torch.testing.assert_close(logits(model, idx), theirs, atol=1e-5, rtol=1e-5)


def test_a_hub_gpt2_config_builds_gpt2_and_one_that_computes_otherwise_is_refused():
    """from_pretrained builds its model from the hub's config (transformers' defaults are
    gpt2's). A GPT-2 that computes something else is refused, not loaded."""
    transformers = pytest.importorskip("transformers", reason="GPT2Config comes from transformers")
    for setting, value in (("activation_function", "relu"), ("layer_norm_epsilon", 1e-6),
                           ("scale_attn_by_inverse_layer_idx", True)):
        with pytest.raises(ValueError, match=f"its {setting}={value!r} is not GPT-2's"):
            gpt2_config(transformers.GPT2Config(**{setting: value}), "gpt2", {})
    with torch.device("meta"):
        model = GPT(gpt2_config(transformers.GPT2Config(), "gpt2", {}))
    assert model.get_num_params(non_embedding=False) == 124_439_808  # GPT-2 small
