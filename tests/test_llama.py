"""What is Llama-specific in the Llama-style options (RMSNorm, RoPE, SwiGLU, no biases, untied head,
grouped-query attention): the options' own behaviour and errors, the KV cache they change, the two 1B
configs' exact parameter counts, and exact resume through train.py. The properties every variant keeps
in every shape (equations, causality, cache == recompute, FLOPs) are in test_model.py, over conftest.SHAPES."""

import pytest
import torch
from torch.nn import functional as F

import train as T
from checkpoint import load_checkpoint, model_from_checkpoint
from conftest import GQA, LLAMA, REPO, SHAPES, TINY, random_tokens, tiny_model
from generate import KVCache
from model import GPT, GPTConfig, apply_rotary, rotary_cos_sin
from test_train import tiny


def llama_model(attention, options=LLAMA, **overrides):
    return tiny_model(attention, **{**options, **overrides})


# ----------------------------------------------------------------------------- the options themselves

def test_llama_options_build_llama_modules():
    model = llama_model("efficient")
    names = dict(model.named_parameters())
    assert "transformer.wpe.weight" not in names  # RoPE: no position table
    assert not any(name.endswith(".bias") for name in names)  # bias=False, and RMSNorm has none
    assert model.lm_head.weight is not model.transformer.wte.weight
    mlp = model.transformer.h[0].mlp
    assert mlp.c_fc.weight.shape == (2 * 48, TINY["n_embd"]) and mlp.c_proj.weight.shape == (TINY["n_embd"], 48)
    # the untied head is counted beside the token embedding; non_embedding drops the lookup table only
    table = TINY["vocab_size"] * TINY["n_embd"]
    assert model.get_num_params(non_embedding=False) == sum(p.numel() for p in model.parameters())
    assert model.get_num_params() == model.get_num_params(non_embedding=False) - table
    tied = llama_model("efficient", tie_embeddings=True)
    assert tied.get_num_params(non_embedding=False) == model.get_num_params(non_embedding=False) - table


def test_gpt2_default_keeps_its_parameter_order():
    """Checkpoints written before the options hold AdamW state in the order of model.parameters()."""
    names = [name for name, _ in tiny_model("standard").named_parameters()]
    assert names[:3] == ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight"]
    assert names[-2:] == ["transformer.ln_f.weight", "transformer.ln_f.bias"]  # the tied head is wte


def test_rmsnorm_is_x_over_its_rms_times_the_gain():
    norm = llama_model("standard").transformer.h[0].ln_1
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, TINY["n_embd"])
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_is_down_of_silu_gate_times_up(bias):
    mlp = llama_model("standard", bias=bias).transformer.h[0].mlp
    x = torch.randn(2, 3, TINY["n_embd"])
    W, b = mlp.c_fc.weight, mlp.c_fc.bias if bias else torch.zeros(96)
    with torch.no_grad():
        for p in mlp.parameters():  # biases start at zero: make them count
            p.normal_()
    gate, up = x @ W[:48].T + b[:48], x @ W[48:].T + b[48:]
    expected = (F.silu(gate) * up) @ mlp.c_proj.weight.T + (mlp.c_proj.bias if bias else 0.0)
    torch.testing.assert_close(mlp(x), expected)


def test_the_model_turns_by_its_configured_rope_base():
    """Angle p * theta^(-2m / d_k) for pair m at position p, with the config's theta (Llama 3's here)."""
    model = llama_model("standard", rope_theta=500000.0)
    T, head_dim = TINY["block_size"], TINY["n_embd"] // TINY["n_head"]
    positions = torch.arange(T)
    _, (cos, sin) = model.embed(torch.zeros(1, T, dtype=torch.long), positions)
    angles = positions[:, None].double() * 500000.0 ** (-torch.arange(0, head_dim, 2).double() / head_dim)
    torch.testing.assert_close(cos[:, 0], angles.cos().float())
    torch.testing.assert_close(sin[:, 0], angles.sin().float())


def test_rope_scores_depend_only_on_relative_positions():
    """RoPE's point: <R_p q, R_s k> is a function of p - s, so shifting both positions changes nothing."""
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)  # one head of d_k = 16

    def score(p, s):
        rq = apply_rotary(q, rotary_cos_sin(torch.tensor([p]), 16, 10000.0))
        rk = apply_rotary(k, rotary_cos_sin(torch.tensor([s]), 16, 10000.0))
        return (rq * rk).sum()

    torch.testing.assert_close(score(7, 3), score(107, 103))
    assert not torch.allclose(score(7, 3), score(7, 4))
    assert torch.equal(apply_rotary(q, rotary_cos_sin(torch.tensor([0]), 16, 10000.0)), q)  # R_0 = I


def test_gelu_mlp_takes_intermediate_size():
    model = tiny_model("standard", intermediate_size=40)
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (40, TINY["n_embd"])


# ----------------------------------------------------------------------------- the equations

def test_grouped_query_attention_equals_standard_with_repeated_key_value_heads():
    """n_kv_head=2 of 4 heads is standard attention whose query heads 0,1 share W^K_0, W^V_0 and 2,3
    share W^K_1, W^V_1: copy each shared head's rows into a full n_kv_head=n_head model."""
    gqa = llama_model("standard", GQA)
    full = llama_model("standard", rope_theta=GQA["rope_theta"])  # GQA's model with n_kv_head = n_head
    d, dk = TINY["n_embd"], TINY["n_embd"] // TINY["n_head"]
    state = gqa.state_dict()

    def each_head_twice(rows):  # (2 heads * dk, d) -> (4 heads * dk, d): heads 0, 0, 1, 1
        return rows.view(2, dk, d).repeat_interleave(2, dim=0).reshape(d, d)

    for i in range(TINY["n_layer"]):
        q, k, v = state[f"transformer.h.{i}.attn.c_attn.weight"].split([d, 2 * dk, 2 * dk])
        state[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat([q, each_head_twice(k), each_head_twice(v)])
    full.load_state_dict(state)
    assert gqa.transformer.h[0].attn.c_attn.weight.shape == (d + 2 * 2 * dk, d)
    idx = random_tokens(2, 14)
    with torch.no_grad():
        torch.testing.assert_close(gqa(idx, all_logits=True)[0], full(idx, all_logits=True)[0], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- the KV cache

@pytest.mark.parametrize("options, stored", [({}, {"k"}), (LLAMA, {"k", "v"})], ids=["learned", "rope"])
def test_efficient_cache_stores_rotated_keys_and_plain_values_apart(options, stored):
    """Without RoPE efficient's keys and values are one tensor, X, cached once; with RoPE the keys are
    rotated X and the values X, so both are cached, and they differ."""
    model = tiny_model("efficient", **options)
    cache = KVCache(TINY["n_layer"], TINY["block_size"])
    with torch.no_grad():
        model(random_tokens(2, 6), kv_cache=cache)
    assert set(cache.layers[0]) == stored
    if "v" in stored:
        k, v = cache.layers[0]["k"][:, :6], cache.layers[0]["v"][:, :6]
        torch.testing.assert_close(k[:, 0], v[:, 0])  # position 0 is not turned
        assert not torch.allclose(k[:, 1:], v[:, 1:])


def test_grouped_query_cache_is_smaller():
    model = llama_model("standard", GQA)
    cache = KVCache(TINY["n_layer"], TINY["block_size"])
    with torch.no_grad():
        model(random_tokens(2, 6), kv_cache=cache)
    assert cache.layers[0]["k"].shape == cache.layers[0]["v"].shape == (2, TINY["block_size"], TINY["n_embd"] // 2)


# ----------------------------------------------------------------------------- FLOPs

def test_flops_count_swiglu_and_grouped_key_value_projections_exactly():
    d, ffn, T = TINY["n_embd"], 48, TINY["block_size"]
    gelu = tiny_model("standard", bias=False).flops_per_token(T, backward=False)
    swiglu = tiny_model("standard", bias=False, mlp="swiglu", intermediate_size=ffn).flops_per_token(T, backward=False)
    assert swiglu - gelu == TINY["n_layer"] * (6 * d * ffn - 16 * d * d)
    gqa = llama_model("standard", GQA).flops_per_token(T, backward=False)
    full = llama_model("standard").flops_per_token(T, backward=False)
    assert full - gqa == TINY["n_layer"] * 2 * 2 * d * (d // 2)  # W^K and W^V are d x d/2, not d x d


# ----------------------------------------------------------------------------- bad options

@pytest.mark.parametrize("options, match", [
    (dict(attention="efficient", n_kv_head=2), "attention='standard'"),
    (dict(attention="optimized", n_kv_head=2), "set n_kv_head=0"),
    (dict(n_kv_head=3), "must divide n_head=4"),
    (dict(mlp="swiglu"), "set intermediate_size"),
    (dict(pos="rope", n_embd=36, n_head=4), "is odd"),
    (dict(pos="rope", rope_theta=0.0), "rope_theta"),
    (dict(pos="rope", rope_theta=float("nan")), "must be a finite positive number"),
    (dict(pos="rope", rope_theta=float("inf")), "must be a finite positive number"),
    (dict(norm="batchnorm"), "layernorm, rmsnorm"),
    (dict(pos="alibi"), "learned, rope"),
    (dict(mlp="relu"), "gelu, swiglu"),
    (dict(intermediate_size=-1), "intermediate_size"),
])
def test_bad_llama_options_name_the_fix(options, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**TINY, **options})


# ----------------------------------------------------------------------------- the 1B configs

def model_of_config(name, vocab_size=50304):
    c = T.resolve_config(T.get_config([str(REPO / "config" / name)]))
    with torch.device("meta"):  # shapes only
        return GPT(GPTConfig(**{**{k: c[k] for k in T.MODEL_ARG_KEYS}, "vocab_size": vocab_size})), c


@pytest.mark.parametrize("name, params, with_llama_vocab, flops", [
    # 10 x (2 * 3072^2 + 3 * 3072 * 8192 + 2 * 3072) + 2 * 50304 * 3072 + 3072;
    # 3 x 2 x (10 x (2 * 3072^2 + 2 * 2048 * 3072 + 3 * 3072 * 8192) + 3072 * 50304) at T = 2048
    ("train_llama1b_efficient_c4.py", 1_252_850_688, 1_140_390_912, 7_344_488_448),
    # 22 x (2048 * (2048 + 2 * 256) + 2048^2 + 3 * 2048 * 5632 + 2 * 2048) + 2 * 50304 * 2048 + 2048;
    # 3 x 2 x (22 x (2 * 2048^2 + 2 * 2048 * 256 + 2 * 2048 * 2048 + 3 * 2048 * 5632) + 2048 * 50304)
    ("train_tinyllama_standard_c4.py", 1_175_021_568, 1_100_048_384, 7_538_737_152),  # TinyLlama's own count
])
def test_1b_configs_have_exact_parameter_and_flop_counts(name, params, with_llama_vocab, flops):
    model, c = model_of_config(name)
    assert model.get_num_params(non_embedding=False) == params
    assert model.flops_per_token() == flops  # forward and backward, at the config's context of 2048
    assert model_of_config(name, vocab_size=32000)[0].get_num_params(non_embedding=False) == with_llama_vocab
    assert c["dataset"] == "c4" and c["block_size"] == 2048 and c["norm"] == "rmsnorm" and c["pos"] == "rope"


def test_1b_configs_have_the_papers_and_tinyllamas_shapes():
    paper, c = model_of_config("train_llama1b_efficient_c4.py")
    assert (c["n_layer"], c["n_head"], c["n_embd"], c["intermediate_size"], c["attention"]) == (10, 1, 3072, 8192, "efficient")
    tinyllama, c = model_of_config("train_tinyllama_standard_c4.py")
    assert (c["n_layer"], c["n_head"], c["n_kv_head"], c["n_embd"], c["intermediate_size"]) == (22, 32, 4, 2048, 5632)
    for c in (model_of_config(n)[1] for n in ("train_llama1b_efficient_c4.py", "train_tinyllama_standard_c4.py")):
        tokens_per_step = c["batch_size"] * c["gradient_accumulation_steps"] * c["block_size"]
        assert tokens_per_step == 524_288 and c["learning_rate"] == 4e-4 and c["min_lr"] == 4e-5


# ----------------------------------------------------------------------------- training

@pytest.mark.parametrize("attention, options", [shape for shape in SHAPES if shape.values[1]])  # not GPT-2-style
def test_resume_equals_uninterrupted_training(tmp_path, data_dir, attention, options):
    common = dict(attention=attention, dropout=0.1, max_iters=6, eval_interval=3, gradient_accumulation_steps=2,
                  **{**options, "n_head": 4, "intermediate_size": 40, "n_kv_head": options.get("n_kv_head", 0)})
    T.train(tiny(tmp_path / "straight", data_dir, **common), verbose=False)
    T.train(tiny(tmp_path / "split", data_dir, **{**common, "max_iters": 3}), verbose=False)
    T.train(tiny(tmp_path / "split", data_dir, **common, init_from="resume"), verbose=False)
    straight, split = load_checkpoint(tmp_path / "straight" / "out"), load_checkpoint(tmp_path / "split" / "out")
    assert split["iter_num"] == straight["iter_num"] == 6
    assert straight["model_args"]["pos"] == "rope" and "transformer.wpe.weight" not in straight["model"]
    assert not torch.equal(straight["model"]["lm_head.weight"], straight["model"]["transformer.wte.weight"])
    for key in straight["model"]:
        assert torch.equal(straight["model"][key], split["model"][key]), key
    # what sample.py and eval_hellaswag.py load: the Llama-style options come back from model_args
    model = model_from_checkpoint(straight)
    assert model.config.mlp == "swiglu" and model.generate(torch.zeros(1, 1, dtype=torch.long), 20).shape == (1, 21)
