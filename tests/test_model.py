"""model.py and generate.py: parameter counts, causality, the variants' equations, equivalences between
variants, KV-cached and compiled generation, FLOP counts and input validation. The properties run over
every variant in four shapes (conftest.SHAPES): GPT-2-style, Llama-style, grouped-query standard, and
efficient with one head wider than SDPA's fused kernels."""

import math
from collections import Counter

import pytest
import torch
from torch.nn import functional as F
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from conftest import LLAMA, SHAPES, TINY, VARIANTS, WIDE_HEAD, needs_compiler, random_tokens, tiny_model
from example_variant import TemperatureAttention
import generate
from generate import KVCache
from model import (GPT, GPT2_SHAPES, GPTConfig, SuperAttention, attention_by_matmuls, gpt2_config, published_gpt2_config,
                   rotary_cos_sin)


# ----------------------------------------------------------------------------- parameter counts

GPT2_SHAPE = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, bias=True)


@pytest.mark.parametrize(
    "attention, layer_params, model_params",
    [
        ("standard", 2_362_368, 124_439_808),
        ("optimized", 1_771_776, 117_352_704),
        ("efficient", 1_181_184, 110_265_600),
        # free lower-triangular entries of W^A (1024*1025/2) and its bias, per layer
        ("super", 1_181_184 + 524_800 + 1_024, 110_265_600 + 12 * (524_800 + 1_024)),
    ],
)
def test_parameter_counts_at_gpt2_124m_shape(attention, layer_params, model_params):
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = GPT(GPTConfig(**GPT2_SHAPE, attention=attention))
    assert model.get_num_attention_params() == layer_params
    assert model.get_num_params(non_embedding=False) == model_params
    assert model.get_num_params() == model_params - 1024 * 768  # minus the position embedding


def test_paper_model_sizes_round_to_124m_117m_110m():
    sizes = []
    for attention in ("standard", "optimized", "efficient"):
        with torch.device("meta"):
            sizes.append(round(GPT(GPTConfig(**GPT2_SHAPE, attention=attention)).get_num_params(False) / 1e6))
    assert sizes == [124, 117, 110]


@pytest.mark.parametrize("options", [{}, LLAMA], ids=["gpt2", "llama"])
def test_initialisation_is_gpt2s_with_the_residual_projections_scaled_down(options):
    """Weights N(0, 0.02), W^O and the MLP's output projection N(0, 0.02 / sqrt(2 n_layer)), biases zero
    and norm gains one."""
    model = tiny_model("standard", n_layer=4, **options)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert torch.equal(p, torch.full_like(p, 1.0 if name.endswith("weight") else 0.0)), name
        else:
            std = 0.02 / math.sqrt(2 * 4) if name.endswith("c_proj.weight") else 0.02
            assert p.std().item() == pytest.approx(std, rel=0.15), name


# ----------------------------------------------------------------------------- the variants' equations

def rotate_by_matrix(t, theta):
    """RoPE as RoFormer writes it: row p of one head's (T, d_k) queries or keys times the block rotation
    matrix R_p, which turns the pair (m, m + d_k/2) by p * theta^(-2m/d_k); theta None is no RoPE."""
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


# Where a variant's equation departs from H_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i: its values, its scores.
VALUES = {SuperAttention: lambda attn, V: torch.tril(attn.align_weight[:len(V), :len(V)]) @ V
          + attn.align_bias[:len(V), None]}  # V' = W^A V + b
SCORES = {TemperatureAttention: lambda attn, scores, head: scores * attn.log_temperature[head].exp()}


def reference_attention(attn, x):
    """The variant stated literally, unfused, one head at a time, for one sequence x (T, d): the oracle
    that `forward` (fused, cached, compiled) is held to."""
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
        q, k = rotate_by_matrix(Q[:, cols], attn.rope_theta), rotate_by_matrix(K[:, kv_cols], attn.rope_theta)
        scores = SCORES.get(type(attn), lambda attn, scores, head: scores)(attn, q @ k.T / math.sqrt(dk), i)
        heads.append(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ V[:, kv_cols])
    return attn.c_proj(torch.cat(heads, dim=1))


@pytest.mark.parametrize("attention, options", SHAPES)
def test_attention_matches_the_variants_equations(attention, options):
    attn = tiny_model(attention, **options).transformer.h[0].attn
    x = torch.randn(3, TINY["block_size"], attn.n_embd, generator=torch.Generator().manual_seed(2))
    rope = None if attn.rope_theta is None else rotary_cos_sin(torch.arange(x.size(1)), attn.head_dim, attn.rope_theta)
    with torch.no_grad():
        ours = attn(x, rope=rope)
        for seq in range(x.size(0)):
            torch.testing.assert_close(ours[seq], reference_attention(attn, x[seq]), atol=1e-5, rtol=1e-5)


def sdpa_calls(ops):
    return sum(count for name, count in ops.items() if name.startswith("aten::_scaled_dot_product"))


@pytest.mark.parametrize("mask", ["causal", "boolean", "none"])
def test_attention_by_matmuls_equals_sdpa(mask):
    """Heads wider than SDPA's fused kernels take (WIDEST_FUSED_HEAD) go through attention_by_matmuls,
    with SDPA's masks: is_causal for training, a boolean mask for the KV cache's rows."""
    q = torch.randn(2, 3, 5, 40, generator=torch.Generator().manual_seed(0))
    k, v = torch.randn(2, 2, 3, 8, 40, generator=torch.Generator().manual_seed(1))
    masks = dict(causal=dict(is_causal=True), none={},
                 boolean=dict(attn_mask=torch.arange(8) <= torch.tensor([3, 4, 5, 6, 7])[:, None]))
    torch.testing.assert_close(attention_by_matmuls(q, k, v, **masks[mask]),
                               F.scaled_dot_product_attention(q, k, v, **masks[mask]))


def test_attention_by_matmuls_multiplies_in_bf16_under_autocast_and_keeps_float32_for_softmax(monkeypatch):
    softmax, softmax_dtypes = F.softmax, []
    monkeypatch.setattr(F, "softmax", lambda scores, **kw: softmax_dtypes.append(scores.dtype) or softmax(scores, **kw))
    q, k, v = (torch.randn(1, 1, 6, 300, generator=torch.Generator().manual_seed(s)) for s in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention_by_matmuls(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16  # the weighted sum was a bf16 product
    assert softmax_dtypes == [torch.float32]
    torch.testing.assert_close(out.float(), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=3e-2, rtol=3e-2)


def test_attention_by_matmuls_drops_attention_weights_and_rescales_the_rest():
    q, k, v = (torch.randn(1, 1, 5, 40, generator=torch.Generator().manual_seed(s)) for s in range(3))
    plain = attention_by_matmuls(q, k, v, is_causal=True)[0]
    torch.manual_seed(0)
    dropped = attention_by_matmuls(*(t.expand(4000, -1, -1, -1) for t in (q, k, v)), is_causal=True, dropout_p=0.5)
    assert not torch.allclose(dropped[0], plain)
    torch.testing.assert_close(dropped.mean(0), plain, atol=0.1, rtol=0)  # in expectation, no dropout


@pytest.mark.parametrize("options, uses_sdpa", [(LLAMA, True), (WIDE_HEAD, False)], ids=["narrow", "wide"])
def test_only_heads_wider_than_the_fused_kernels_take_skip_sdpa(options, uses_sdpa):
    model, idx = tiny_model("efficient", **options), random_tokens(2, 8)
    ops = ops_run(lambda: model(idx, idx)[1].backward())
    assert (sdpa_calls(ops) > 0) == uses_sdpa, ops
    ops = ops_run(lambda: model.generate(idx, 3))
    assert (sdpa_calls(ops) > 0) == uses_sdpa, ops


@pytest.mark.slow
@needs_compiler
def test_compiled_wide_head_attention_stays_matmuls():
    """Inductor rewrites some matmul-softmax-matmul patterns into SDPA (its fuse_attention pass), which for
    a wide head would be the slow kernel again."""
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
    """logits = head(ln_f(x_L)), x_l = h + mlp(ln_2(h)) with h = x_(l-1) + attn(ln_1(x_(l-1))), x_0 the token
    embeddings plus (learned positions) the position embeddings; every norm's gain and bias drawn at
    random, as all start at one and zero, where swapping or skipping a norm changes nothing."""
    model = tiny_model("standard", **options)
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.5)
    idx = random_tokens(2, 10)
    positions = torch.arange(idx.size(1))
    with torch.no_grad():
        x = model.transformer.wte(idx)
        rope = None
        if cfg.pos == "learned":
            x = x + model.transformer.wpe(positions)
        else:
            rope = rotary_cos_sin(positions, cfg.n_embd // cfg.n_head, cfg.rope_theta)
        for block in model.transformer.h:
            h = x + block.attn(block.ln_1(x), None, rope)
            x = h + block.mlp(block.ln_2(h))
        expected = model.transformer.ln_f(x) @ model.lm_head.weight.T
        logits, _ = model(idx, all_logits=True)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- causality

@pytest.mark.parametrize("attention, options", SHAPES)
def test_future_tokens_do_not_change_past_logits(attention, options):
    """At every cut t of a full block, not one: a leak that only later positions have shows at theirs."""
    model = tiny_model(attention, **options)
    idx = random_tokens(2, TINY["block_size"])
    with torch.no_grad():
        logits, _ = model(idx, all_logits=True)
        for t in range(idx.size(1) - 1):
            changed = idx.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % TINY["vocab_size"]
            logits_changed, _ = model(changed, all_logits=True)
            torch.testing.assert_close(logits[:, : t + 1], logits_changed[:, : t + 1], atol=0, rtol=0,
                                       msg=lambda m: f"the tokens after {t} changed the logits up to it: {m}")
            assert not torch.allclose(logits[:, t + 1 :], logits_changed[:, t + 1 :]), t


def test_super_ignores_the_upper_triangle_of_its_kernel():
    """Training keeps it at zero, but a kernel loaded from elsewhere need not be: neither the whole
    sequence nor cached decoding (a prefix, single tokens, or single tokens at fixed shapes) reads it."""
    model = tiny_model("super")
    idx = random_tokens(2, 12)
    with torch.no_grad():
        before, _ = model(idx, all_logits=True)
        for block in model.transformer.h:
            block.attn.align_weight.add_(torch.ones(TINY["block_size"], TINY["block_size"]).triu(1))
        after, _ = model(idx, all_logits=True)
        cache = KVCache(TINY["n_layer"], TINY["block_size"])
        growing = [model(idx[:, :5], all_logits=True, kv_cache=cache)[0]]
        growing += [model(idx[:, t : t + 1], all_logits=True, kv_cache=cache)[0] for t in range(5, 12)]
        cache.length = 0
        fixed = [model(idx[:, :1], all_logits=True, kv_cache=cache)[0]]
        fixed += [model(idx[:, t : t + 1], all_logits=True, kv_cache=cache, input_pos=torch.tensor([t]))[0]
                  for t in range(1, 12)]
    torch.testing.assert_close(before, after, atol=0, rtol=0)
    torch.testing.assert_close(torch.cat(growing, dim=1), before, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(fixed, dim=1), before, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- equivalences

def standard_equivalent_of(model):
    """A standard-attention model with `model`'s weights, and identities where `model` has no W^K / W^V."""
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


@pytest.mark.parametrize("attention, options", SHAPES)
def test_dropout_acts_only_while_training(attention, options):
    model, plain = tiny_model(attention, dropout=0.5, **options), tiny_model(attention, **options)
    idx = random_tokens(2, 10)
    with torch.no_grad():
        evaluated, expected = model(idx, all_logits=True)[0], plain(idx, all_logits=True)[0]
        trained = model.train()(idx, all_logits=True)[0]
    torch.testing.assert_close(evaluated, expected, atol=0, rtol=0)
    assert not torch.allclose(trained, expected)


@pytest.mark.parametrize("attention", ["optimized", "efficient"])
def test_variant_equals_standard_with_identity_projections(attention):
    model = tiny_model(attention)
    standard = standard_equivalent_of(model)
    idx = random_tokens(3, 14)
    with torch.no_grad():
        ours, _ = model(idx, all_logits=True)
        theirs, _ = standard(idx, all_logits=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [{}, LLAMA], ids=["gpt2", "llama"])
def test_super_at_initialisation_equals_efficient(options):
    sup = tiny_model("super", random_alignment=False, **options)
    efficient = tiny_model("efficient", **options)
    efficient.load_state_dict({k: v for k, v in sup.state_dict().items() if "align_" not in k})
    for block in sup.transformer.h:
        assert torch.equal(block.attn.align_weight, torch.eye(TINY["block_size"]))
        assert torch.equal(block.attn.align_bias, torch.zeros(TINY["block_size"]))
    idx = random_tokens(3, 14)
    with torch.no_grad():
        # exactly: the identity W^A and the zero bias reproduce each value bit for bit
        assert torch.equal(sup(idx, all_logits=True)[0], efficient(idx, all_logits=True)[0])


def test_optimizer_keeps_the_upper_triangle_of_w_a_exactly_zero():
    model = tiny_model("super", random_alignment=False).train()
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2, betas=(0.9, 0.95), device_type="cpu")
    idx = random_tokens(4, 16)
    for _ in range(3):
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for block in model.transformer.h:
        W = block.attn.align_weight
        assert torch.count_nonzero(W.triu(1)) == 0
        assert not torch.equal(W.tril(), torch.eye(TINY["block_size"]))  # it did learn


def test_the_optimizer_takes_the_given_learning_rate_and_betas():
    """train.py sets each group's lr at every step; other callers rely on the one given here."""
    optimizer = tiny_model("standard").configure_optimizers(0.1, 3e-3, (0.85, 0.97), "cpu")
    assert [(g["lr"], g["betas"], g["weight_decay"]) for g in optimizer.param_groups] == [
        (3e-3, (0.85, 0.97), 0.1), (3e-3, (0.85, 0.97), 0.0)]
    assert optimizer.defaults["fused"]  # one kernel for all parameters, on CPU as on CUDA


def test_weight_decay_groups():
    model = tiny_model("super")
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert optimizer.param_groups[0]["weight_decay"] == 0.1
    assert optimizer.param_groups[1]["weight_decay"] == 0.0
    attn = model.transformer.h[0].attn
    assert id(attn.c_attn.weight) in decayed and id(model.lm_head.weight) in decayed
    assert id(attn.align_weight) not in decayed and id(attn.c_attn.bias) not in decayed
    n_in_groups = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    assert n_in_groups == sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- logits and cropping

@pytest.mark.parametrize("attention, options", SHAPES)
def test_logits_cover_every_position_with_targets_or_all_logits_else_the_last(attention, options):
    model = tiny_model(attention, **options)
    idx = random_tokens(2, 10)
    with torch.no_grad():
        every, _ = model(idx, all_logits=True)
        last, _ = model(idx)
        with_targets, loss = model(idx[:, :-1], targets=idx[:, 1:])
    assert every.shape == (2, 10, TINY["vocab_size"]) and last.shape == (2, 1, TINY["vocab_size"])
    torch.testing.assert_close(last[:, 0], every[:, -1])
    torch.testing.assert_close(with_targets, every[:, :-1], atol=1e-6, rtol=1e-6)
    expected = F.cross_entropy(every[:, :-1].reshape(-1, TINY["vocab_size"]), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)


def test_targets_of_minus_one_are_left_out_of_the_loss():
    model, idx = tiny_model("standard"), random_tokens(2, 11)
    targets = idx[:, 1:].clone()
    targets[:, :4] = -1  # e.g. a prompt that a fine-tune does not learn to predict
    with torch.no_grad():
        every, _ = model(idx[:, :-1], all_logits=True)
        _, loss = model(idx[:, :-1], targets=targets)
    expected = F.cross_entropy(every[:, 4:].reshape(-1, TINY["vocab_size"]), idx[:, 5:].reshape(-1))
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)


def test_logits_for_sampling_and_scoring_are_float32_under_autocast():
    """bfloat16 would round logits of 20-100 to steps of 0.125-0.5: the head that sampling and HellaSwag
    read runs in float32 on the final hidden state; training's loss keeps autocast's head."""
    model = tiny_model("super").eval()
    hidden = []
    model.transformer.ln_f.register_forward_hook(lambda module, args, out: hidden.append(out))
    idx = random_tokens(2, 10)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        every, _ = model(idx, all_logits=True)
        last, _ = model(idx)
        with_targets, _ = model(idx, targets=idx)
    assert every.dtype == last.dtype == torch.float32 and with_targets.dtype == torch.bfloat16
    assert torch.equal(every, F.linear(hidden[0].float(), model.lm_head.weight))  # the first forward's
    torch.testing.assert_close(last[:, 0], every[:, -1])  # one row or ten: float32's rounding may differ


def test_sampling_float16_logits_at_a_small_temperature_is_greedy():
    from generate import sample_next

    logits = torch.tensor([[12.0, 11.5, -3.0, 5.0]], dtype=torch.float16)  # / 1e-4 overflows float16
    assert [sample_next(logits, temperature=1e-4).item() for _ in range(5)] == [0] * 5


@pytest.mark.parametrize("temperature", [1e-40, 1e-300])
@pytest.mark.parametrize("top_k", [None, 2])
def test_sampling_at_a_vanishing_temperature_is_greedy(temperature, top_k):
    """A positive temperature is accepted however small; logits / 1e-40 overflow float32 to inf."""
    from generate import sample_next

    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.0, -2.0, 4.0, 0.5]])
    torch.manual_seed(0)
    assert [sample_next(logits, temperature, top_k).flatten().tolist() for _ in range(5)] == [[1, 2]] * 5


def ops_run(fn):
    """The aten operators fn runs, by name and count, nested calls included (torch.profiler)."""
    with torch.profiler.profile() as profile:
        fn()
    return Counter(event.name for event in profile.events() if event.name.startswith("aten::"))


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.8, 5)])
def test_sampling_draws_torch_multinomial_tokens_without_reading_back_to_the_host(temperature, top_k):
    from generate import sample_next

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
    assert ops_run(lambda: sample_next(logits, temperature, top_k))["aten::_local_scalar_dense"] == 0


def test_top_k_draws_only_the_k_likeliest_tokens():
    """Four near-equal logits and one far below: top_k=2 must draw the first two, and both of them."""
    from generate import sample_next

    logits = torch.tensor([[3.0, 2.9, 2.8, 2.7, -5.0]]).expand(400, -1)
    torch.manual_seed(0)
    assert set(sample_next(logits, top_k=2).flatten().tolist()) == {0, 1}
    assert set(sample_next(logits, top_k=4).flatten().tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("attention, options", SHAPES)
def test_generation_never_reads_a_value_back_to_the_host(attention, options):
    """On a GPU such a read (.item(), a tensor's truth value) waits for every kernel queued before it;
    one a token keeps the host from queuing the next step while the GPU runs this one."""
    model, prompt = tiny_model(attention, **options), random_tokens(2, 3)
    for sampling in (dict(), dict(use_kv_cache=False), dict(temperature=0.8, top_k=3)):
        ops = ops_run(lambda: model.generate(prompt, TINY["block_size"] + 4, **sampling))  # the window slides
        assert ops["aten::_local_scalar_dense"] == 0, sampling


@pytest.mark.slow
@needs_compiler
def test_compiled_decoding_steps_run_no_fused_attention_kernel():
    """Compiled steps use the math SDPA, which inductor writes as its own kernels for one query over the
    masked cache; only the eager prompt pass (one per layer) calls a fused kernel."""
    model, prompt = tiny_model("standard"), random_tokens(1, 3)
    model.generate(prompt, 8, compile=True)
    ops = ops_run(lambda: model.generate(prompt, 8, compile=True))
    assert sdpa_calls(ops) == TINY["n_layer"], ops
    assert ops["aten::_local_scalar_dense"] == 0  # nor does the compiled loop read back to the host


@pytest.mark.parametrize("attention, options", SHAPES)
def test_crop_block_size_keeps_short_sequences_unchanged(attention, options):
    model = tiny_model(attention, **options)
    idx = random_tokens(2, 8)
    with torch.no_grad():
        before, _ = model(idx, all_logits=True)
        model.crop_block_size(8)
        after, _ = model(idx, all_logits=True)
    torch.testing.assert_close(before, after, atol=0, rtol=0)
    assert model.config.block_size == 8
    if "wpe" in model.transformer:  # RoPE has no position table
        assert model.transformer.wpe.weight.shape[0] == 8
    if attention == "super":
        assert model.transformer.h[0].attn.align_weight.shape == (8, 8)
        assert model.transformer.h[0].attn.align_bias.shape == (8,)
        # the cropped W^A's free entries: its lower triangle, 8 * 9 / 2, and 8 biases
        efficient = tiny_model("efficient", **options).get_num_attention_params()
        assert model.get_num_attention_params() == efficient + 8 * 9 // 2 + 8
    for name, p in model.named_parameters():  # copies: the full-size tables are freed, and never saved
        assert p.untyped_storage().nbytes() == p.numel() * p.element_size(), name
    with pytest.raises(ValueError, match="block_size is 8"):
        model(random_tokens(1, 9))


@pytest.mark.parametrize("block_size", [0, TINY["block_size"] + 1])
def test_crop_block_size_refuses_a_size_outside_the_context(block_size):
    model = tiny_model("super")
    with pytest.raises(ValueError, match=rf"crop_block_size\({block_size}\): must be in 1..16"):
        model.crop_block_size(block_size)
    assert model.config.block_size == 16 and model.transformer.wpe.weight.shape[0] == 16


def test_crop_block_size_leaves_the_config_it_was_built_from_alone():
    config = GPTConfig(**{**TINY, "attention": "super"})
    cropped, other = GPT(config), GPT(config)
    cropped.crop_block_size(8)
    assert config.block_size == other.config.block_size == 16  # a second model from it still takes 16 tokens
    other(random_tokens(1, 16))


# ----------------------------------------------------------------------------- generation

@pytest.mark.parametrize("attention, options", SHAPES)
@pytest.mark.parametrize("sampling", [dict(top_k=1), dict(temperature=0.8), dict(temperature=1.3, top_k=5)])
def test_cached_generation_equals_uncached_past_block_size(attention, options, sampling):
    model = tiny_model(attention, **options)
    prompt = random_tokens(2, 5)
    steps = 2 * TINY["block_size"]  # well past block_size: the window slides, the cache refills
    torch.manual_seed(7)
    cached = model.generate(prompt, steps, **sampling)
    torch.manual_seed(7)
    uncached = model.generate(prompt, steps, use_kv_cache=False, **sampling)
    assert cached.shape == (2, 5 + steps)
    assert torch.equal(cached, uncached)


DECODINGS = ([pytest.param(attention, options, decoding, id=f"{shape.id}-{decoding}")
              for shape in SHAPES for attention, options in [shape.values] for decoding in ("cached", "uncached")]
             + [pytest.param("super", options, "compiled", id=f"super-{name}-compiled",
                             marks=[pytest.mark.slow, needs_compiler])
                for name, options in (("gpt2", {}), ("llama", LLAMA))])


@pytest.mark.parametrize("attention, options, decoding", DECODINGS)
def test_each_step_samples_from_the_logits_of_the_last_block_size_tokens(attention, options, decoding, monkeypatch):
    """The logits every step of generate draws from, against the model run afresh on the last block_size
    tokens: up to the slide (a prompt, then one token a step) and past it, where every position shifts
    (super's W^A row p is again the p-th token of the new window). Equal tokens alone let small errors
    through: logits off by up to 0.0005 past the slide change no token of the test above."""
    model, prompt, block = tiny_model(attention, **options), random_tokens(2, 5), TINY["block_size"]
    seen, sample_next = [], generate.sample_next

    def recording(logits, temperature=1.0, top_k=None):
        seen.append(logits.clone())
        return sample_next(logits, temperature, top_k)

    with monkeypatch.context() as patch:
        patch.setattr(generate, "sample_next", recording)
        out = model.generate(prompt, block + 6, top_k=1, use_kv_cache=decoding != "uncached",
                             compile=decoding == "compiled")
    with torch.no_grad():
        expected = [model(out[:, max(0, t - block) : t])[0][:, -1] for t in range(5, out.size(1))]
    torch.testing.assert_close(torch.stack(seen), torch.stack(expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention, options", SHAPES)
def test_cached_logits_equal_recomputed_logits(attention, options):
    """Growing (eager decoding): a prefix, single tokens and a chunk. Fixed shapes (compiled decoding):
    single tokens at input_pos, over buffers that still hold another sequence."""
    model = tiny_model(attention, **options)
    block = TINY["block_size"]
    idx = random_tokens(2, block)
    with torch.no_grad():
        full, _ = model(idx, all_logits=True)
        cache = KVCache(TINY["n_layer"], block)
        growing = [model(idx[:, :5], all_logits=True, kv_cache=cache)[0]]
        growing += [model(idx[:, t : t + 1], all_logits=True, kv_cache=cache)[0] for t in range(5, 9)]
        growing.append(model(idx[:, 9:], all_logits=True, kv_cache=cache)[0])  # a chunk after a prefix
        cache.length = 0
        model(random_tokens(2, block, seed=9), kv_cache=cache)  # stale rows everywhere
        cache.length = 0
        fixed = [model(idx[:, :3], all_logits=True, kv_cache=cache)[0]]
        fixed += [model(idx[:, t : t + 1], all_logits=True, kv_cache=cache, input_pos=torch.tensor([t]))[0]
                  for t in range(3, block)]
    torch.testing.assert_close(torch.cat(growing, dim=1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(fixed, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention, options", SHAPES)
def test_the_cache_holds_the_compute_dtype_under_autocast(attention, options):
    """Under bf16 autocast the norm's output is float32, so efficient's and super's X_i (and optimized's
    values) would fill a float32 cache that SDPA casts to bf16 at every step; the cache holds bf16, and
    cached logits still equal recomputed ones up to bf16 rounding."""
    model = tiny_model(attention, **options)
    idx = random_tokens(2, TINY["block_size"])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full, _ = model(idx, all_logits=True)
        cache = KVCache(TINY["n_layer"], TINY["block_size"])
        cached = [model(idx[:, :5], all_logits=True, kv_cache=cache)[0]]
        cached += [model(idx[:, t : t + 1], all_logits=True, kv_cache=cache)[0] for t in range(5, idx.size(1))]
    assert {buffer.dtype for layer in cache.layers for buffer in layer.values()} == {torch.bfloat16}
    torch.testing.assert_close(torch.cat(cached, dim=1), full, atol=5e-3, rtol=0)


def test_a_full_cache_says_so():
    model, cache = tiny_model("standard"), KVCache(TINY["n_layer"], TINY["block_size"])
    with torch.no_grad():
        model(random_tokens(1, 10), kv_cache=cache)
        with pytest.raises(ValueError, match="the cache holds 16 positions; 10 are used, 7 more do not fit"):
            model(random_tokens(1, 7), kv_cache=cache)


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_generating_no_new_tokens_returns_the_prompt(use_kv_cache):
    prompt = random_tokens(2, 3)
    assert torch.equal(tiny_model("efficient").generate(prompt, 0, use_kv_cache=use_kv_cache), prompt)


@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize("attention, options", [(a, {}) for a in VARIANTS] + [("standard", LLAMA), ("efficient", LLAMA)])
def test_compiled_generation_equals_eager(attention, options):
    model = tiny_model(attention, **options)
    prompt = random_tokens(2, 5)
    steps = 2 * TINY["block_size"]  # the window slides: refills between compiled steps
    recompile_limit = torch._dynamo.config.recompile_limit
    graphs_before = counters["stats"]["unique_graphs"]
    for sampling in (dict(top_k=1), dict(temperature=0.9, top_k=5)):
        torch.manual_seed(7)
        eager = model.generate(prompt, steps, **sampling)
        torch.manual_seed(7)
        compiled = model.generate(prompt, steps, compile=True, **sampling)
        assert torch.equal(compiled, eager), sampling
    # one graph for the model, whatever the step, refill or call: a recompile per step (a CUDA graph
    # re-recorded per token on a GPU) would make compiled decoding slower than eager
    assert counters["stats"]["unique_graphs"] - graphs_before <= 1
    assert torch._dynamo.config.recompile_limit == recompile_limit  # sampling changes no global setting


@pytest.mark.slow
@needs_compiler
def test_compiled_generation_after_cropping_equals_eager():
    """Compiled decoding keeps its cache between calls; a model cropped since needs one of its new size."""
    model, prompt = tiny_model("super"), random_tokens(1, 5)
    model.generate(prompt, 3, compile=True)
    model.crop_block_size(8)
    torch.manual_seed(7)
    eager = model.generate(prompt, 12, top_k=3)
    torch.manual_seed(7)
    assert torch.equal(model.generate(prompt, 12, top_k=3, compile=True), eager)


@pytest.mark.parametrize("arguments, match", [
    (dict(temperature=0), "temperature=0 must be a positive number"),
    (dict(temperature=float("nan")), "temperature=nan must be a positive number"),
    (dict(temperature=float("inf")), "temperature=inf must be a positive number"),
    (dict(top_k=0), "top_k=0 must be at least 1"),
    (dict(top_k=2.5), "top_k=2.5 must be"),
    (dict(top_k=True), "top_k=True must be"),
    (dict(max_new_tokens=-1), "max_new_tokens=-1"),
    (dict(use_kv_cache=False, compile=True), "use_kv_cache=True"),
])
def test_generate_rejects_bad_sampling_arguments(arguments, match):
    with pytest.raises(ValueError, match=match):
        tiny_model("efficient").generate(random_tokens(1, 3), **{"max_new_tokens": 2, **arguments})


def test_top_k_may_be_any_integer_type():
    import numpy as np

    model, prompt = tiny_model("efficient"), random_tokens(1, 3)
    assert torch.equal(model.generate(prompt, 4, top_k=np.int64(1)), model.generate(prompt, 4, top_k=1))


@pytest.mark.parametrize("prompt", [torch.tensor([1, 2, 3]), torch.zeros(1, 0, dtype=torch.long), torch.ones(1, 3)])
def test_generate_rejects_a_prompt_that_is_not_a_batch_of_ids(prompt):
    with pytest.raises(ValueError, match=r"idx must be integer token ids of shape \(batch, tokens\)"):
        tiny_model("efficient").generate(prompt, max_new_tokens=2)


# ----------------------------------------------------------------------------- FLOPs

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
    measured = counter.get_total_flops()
    estimated = model.flops_per_token(T) * B * T
    assert estimated == measured  # exact: every matmul counted, attention's full T x T included
    assert model.flops_per_token(T, backward=False) * 3 == model.flops_per_token(T)


def test_flop_ratios_at_gpt2_shape():
    flops = {}
    for attention in ("standard", "optimized", "efficient", "super"):
        with torch.device("meta"):
            flops[attention] = GPT(GPTConfig(**GPT2_SHAPE, attention=attention)).flops_per_token(1024)
    ratios = {a: flops[a] / flops["standard"] for a in flops}
    assert ratios["optimized"] == pytest.approx(0.95, abs=0.01)
    assert ratios["efficient"] == pytest.approx(0.90, abs=0.01)
    assert ratios["super"] == pytest.approx(0.97, abs=0.01)


def test_estimate_mfu():
    model = tiny_model("standard")
    flops_per_iter = model.flops_per_token(16) * 16 * 4
    assert model.estimate_mfu(4, dt=2.0, peak_flops=flops_per_iter) == pytest.approx(0.5)


# ----------------------------------------------------------------------------- bad input

def test_config_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match="standard, optimized, efficient, super"):
        GPTConfig(attention="fast")
    with pytest.raises(ValueError, match="not divisible by n_head"):
        GPTConfig(n_embd=100, n_head=12)
    with pytest.raises(ValueError, match="n_head=0 must be a positive integer"):
        GPTConfig(n_head=0)
    with pytest.raises(ValueError, match=r"dropout=1.0 must be in \[0, 1\)"):
        GPTConfig(dropout=1.0)


def test_too_long_sequence_names_the_limit():
    model = tiny_model("standard")
    with pytest.raises(ValueError, match="block_size is 16"):
        model(random_tokens(1, 17))


def test_from_pretrained_refuses_other_variants():
    with pytest.raises(ValueError, match="standard attention only"):
        GPT.from_pretrained("gpt2", dict(attention="efficient"))
    with pytest.raises(ValueError, match="gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local folder"):
        GPT.from_pretrained("gpt3")
    with pytest.raises(ValueError, match=r"only dropout can be overridden for pretrained weights, not \['pos'\]"):
        GPT.from_pretrained("gpt2", dict(dropout=0.1, pos="rope"))


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"tie_word_embeddings": False}, {"n_inner": 100}], ids=str)
def test_from_pretrained_reproduces_a_hugging_face_gpt2(options, tmp_path):
    """A small random GPT-2 saved the way the hub stores them loads into our standard model with the
    same logits (the real gpt2 weights need a network, so this checks the conversion offline); a local
    folder may also hold an untied head or another MLP width."""
    transformers = pytest.importorskip("transformers", reason="from_pretrained needs transformers (in requirements.txt)")
    hf_config = transformers.GPT2Config(n_positions=32, n_embd=48, n_layer=2, n_head=4, vocab_size=97, **options)
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(hf_config).eval()
    if not hf_config.tie_word_embeddings:
        torch.nn.init.normal_(hf_model.lm_head.weight)  # not a copy of the embedding
    hf_model.save_pretrained(tmp_path)
    model = GPT.from_pretrained(str(tmp_path)).eval()
    assert model.config.block_size == 32 and model.config.vocab_size == 97 and model.config.attention == "standard"
    idx = random_tokens(2, 20, vocab=97)
    with torch.no_grad():
        ours, _ = model(idx, all_logits=True)
        theirs = hf_model(idx).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_the_published_gpt2_config_is_what_its_hub_config_builds():
    """resolve_config checks a fine-tune's keys against published_gpt2_config before the download: it
    must be the GPTConfig that from_pretrained builds from the hub's config (transformers' defaults are
    gpt2's; the others differ in shape alone)."""
    transformers = pytest.importorskip("transformers", reason="GPT2Config comes from transformers (in requirements.txt)")
    for name, (n_layer, n_head, n_embd) in GPT2_SHAPES.items():
        hub_config = transformers.GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd)
        assert gpt2_config(hub_config, name, {}) == published_gpt2_config(name)
    with torch.device("meta"):
        assert GPT(published_gpt2_config("gpt2")).get_num_params(non_embedding=False) == 124_439_808  # GPT-2 small


@pytest.mark.slow
@pytest.mark.parametrize("setting, value", [("activation_function", "relu"), ("layer_norm_epsilon", 1e-6),
                                            ("scale_attn_by_inverse_layer_idx", True)])
def test_from_pretrained_refuses_a_gpt2_that_computes_something_else(setting, value, tmp_path):
    transformers = pytest.importorskip("transformers", reason="from_pretrained needs transformers (in requirements.txt)")
    hf_config = transformers.GPT2Config(n_positions=32, n_embd=48, n_layer=2, n_head=4, vocab_size=97, **{setting: value})
    transformers.GPT2LMHeadModel(hf_config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"its {setting}={value!r} is not GPT-2's"):
        GPT.from_pretrained(str(tmp_path))
