"""What is Llama's own in the Llama-style options: the modules against their formulas, the KV
cache, the 1B configs' exact counts, exact resume. The rest is test_model.py's, over SHAPES."""

import pytest
import torch
from torch.nn import functional as F

import train
from checkpoint import load_checkpoint, load_model_and_tokenizer
from configurator import MODEL_ARG_KEYS, get_config, resolve_config
from conftest import GQA, LLAMA, REPO, SHAPES, TINY, random_tokens, tiny_model
from generate import KVCache
from model import GPT, GPTConfig

D, FFN = TINY["n_embd"], LLAMA["intermediate_size"]


def llama_model(attention, options=LLAMA, **overrides):
    return tiny_model(attention, **{**options, **overrides})


def test_llama_options_build_llama_modules_and_gpt2_keeps_its_own():
    model = llama_model("efficient")
    names = dict(model.named_parameters())
    assert "transformer.wpe.weight" not in names  # RoPE: no position table
    assert not any(name.endswith(".bias") for name in names)  # bias=False, and RMSNorm has none
    assert model.lm_head.weight is not model.transformer.wte.weight
    mlp = model.transformer.h[0].mlp
    assert mlp.c_fc.weight.shape == (2 * FFN, D) and mlp.c_proj.weight.shape == (D, FFN)
    # the untied head is counted beside the token embedding; non_embedding drops the table only
    table = TINY["vocab_size"] * D
    assert model.get_num_params(non_embedding=False) == sum(p.numel() for p in model.parameters())
    assert model.get_num_params() == model.get_num_params(non_embedding=False) - table
    tied = llama_model("efficient", tie_embeddings=True)
    assert tied.get_num_params(non_embedding=False) == model.get_num_params(False) - table
    # GPT-2's parameter order, which an optimizer's saved state follows; its MLP takes a width
    gpt2 = tiny_model("standard", intermediate_size=40)
    names = [name for name, _ in gpt2.named_parameters()]
    assert names[:3] == ["transformer.wte.weight", "transformer.wpe.weight",
                         "transformer.h.0.ln_1.weight"]
    assert names[-2:] == ["transformer.ln_f.weight", "transformer.ln_f.bias"]  # the head is wte
    assert gpt2.transformer.h[0].mlp.c_fc.weight.shape == (40, D)


def test_rmsnorm_is_x_over_its_rms_times_the_gain():
    norm = llama_model("standard").transformer.h[0].ln_1
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, D)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_is_down_of_silu_gate_times_up(bias):
    mlp = llama_model("standard", bias=bias).transformer.h[0].mlp
    x = torch.randn(2, 3, D)
    with torch.no_grad():
        for p in mlp.parameters():  # biases start at zero: make them count
            p.normal_()
    W, b = mlp.c_fc.weight, mlp.c_fc.bias if bias else torch.zeros(2 * FFN)
    gate, up = x @ W[:FFN].T + b[:FFN], x @ W[FFN:].T + b[FFN:]
    expected = (F.silu(gate) * up) @ mlp.c_proj.weight.T + (mlp.c_proj.bias if bias else 0.0)
    torch.testing.assert_close(mlp(x), expected)


def test_the_model_turns_by_its_configured_rope_base():
    """Angle p * theta^(-2m / d_k) for pair m at position p, at the config's theta (Llama 3's)."""
    model = llama_model("standard", rope_theta=500000.0)
    T, head_dim = TINY["block_size"], D // TINY["n_head"]
    positions = torch.arange(T)
    _, (cos, sin) = model.embed(torch.zeros(1, T, dtype=torch.long), positions)
    pairs = torch.arange(0, head_dim, 2).double()
    angles = positions[:, None].double() * 500000.0 ** (-pairs / head_dim)
    torch.testing.assert_close(cos[:, 0], angles.cos().float())
    torch.testing.assert_close(sin[:, 0], angles.sin().float())


def test_grouped_query_attention_equals_standard_with_repeated_key_value_heads():
    """n_kv_head=2 of 4 heads is standard attention whose query heads 0,1 share W^K_0, W^V_0 and
    2,3 share W^K_1, W^V_1: copy each shared head's rows into a full n_kv_head=n_head model."""
    gqa = llama_model("standard", GQA)
    full = llama_model("standard", rope_theta=GQA["rope_theta"])  # GQA's with n_kv_head = n_head
    dk = D // TINY["n_head"]
    state = gqa.state_dict()

    def each_head_twice(rows):  # (2 heads * dk, d) -> (4 heads * dk, d): heads 0, 0, 1, 1
        return rows.view(2, dk, D).repeat_interleave(2, dim=0).reshape(D, D)

    for i in range(TINY["n_layer"]):
        key = f"transformer.h.{i}.attn.c_attn.weight"
        q, k, v = state[key].split([D, 2 * dk, 2 * dk])
        state[key] = torch.cat([q, each_head_twice(k), each_head_twice(v)])
    full.load_state_dict(state)
    assert gqa.transformer.h[0].attn.c_attn.weight.shape == (D + 2 * 2 * dk, D)
    idx, cache = random_tokens(2, 14), KVCache(TINY["n_layer"], TINY["block_size"])
    with torch.no_grad():
        ours, theirs = gqa(idx, all_logits=True)[0], full(idx, all_logits=True)[0]
        gqa(idx, kv_cache=cache)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    k, v = cache.layers[0]["k"], cache.layers[0]["v"]  # the cache holds the shared heads only
    assert k.shape == v.shape == (2, TINY["block_size"], D // 2)


@pytest.mark.parametrize("options, stored", [({}, {"k"}), (LLAMA, {"k", "v"})],
                         ids=["learned", "rope"])
def test_efficient_cache_stores_rotated_keys_and_plain_values_apart(options, stored):
    """Without RoPE efficient's keys and values are one tensor, X, cached once; with RoPE the keys
    are rotated X and the values X, so both are cached, and they differ."""
    model = tiny_model("efficient", **options)
    cache = KVCache(TINY["n_layer"], TINY["block_size"])
    with torch.no_grad():
        model(random_tokens(2, 6), kv_cache=cache)
    assert set(cache.layers[0]) == stored
    if "v" in stored:
        k, v = cache.layers[0]["k"][:, :6], cache.layers[0]["v"][:, :6]
        torch.testing.assert_close(k[:, 0], v[:, 0])  # position 0 is not turned
        assert not torch.allclose(k[:, 1:], v[:, 1:])


def test_flops_count_swiglu_and_grouped_key_value_projections_exactly():
    def forward_flops(model):
        return model.flops_per_token(TINY["block_size"], backward=False)

    gelu = forward_flops(tiny_model("standard", bias=False))
    swiglu = forward_flops(tiny_model("standard", bias=False, mlp="swiglu", intermediate_size=FFN))
    assert swiglu - gelu == TINY["n_layer"] * (6 * D * FFN - 16 * D * D)
    gqa, full = forward_flops(llama_model("standard", GQA)), forward_flops(llama_model("standard"))
    assert full - gqa == TINY["n_layer"] * 2 * 2 * D * (D // 2)  # W^K, W^V: d x d/2, not d x d


def model_of_config(name, vocab_size=50304):
    c = resolve_config(get_config([str(REPO / "config" / name)]))
    with torch.device("meta"):  # shapes only
        return GPT(GPTConfig(**{**{k: c[k] for k in MODEL_ARG_KEYS}, "vocab_size": vocab_size})), c


@pytest.mark.parametrize("name, shape, params, with_llama_vocab, flops", [
    # 10 x (2 * 3072^2 + 3 * 3072 * 8192 + 2 * 3072) + 2 * 50304 * 3072 + 3072;
    # 3 x 2 x (10 x (2 * 3072^2 + 2 * 2048 * 3072 + 3 * 3072 * 8192) + 3072 * 50304) at T = 2048
    ("train_llama1b_efficient_c4.py", ("efficient", 10, 1, 0, 3072, 8192),
     1_252_850_688, 1_140_390_912, 7_344_488_448),
    # 22 x (2048 * (2048 + 2 * 256) + 2048^2 + 3 * 2048 * 5632 + 2 * 2048) + 2 * 50304 * 2048
    # + 2048; 3 x 2 x (22 x (2 * 2048^2 + 2 * 2048 * 256 + 2 * 2048 * 2048 + 3 * 2048 * 5632)
    # + 2048 * 50304)
    ("train_tinyllama_standard_c4.py", ("standard", 22, 32, 4, 2048, 5632),
     1_175_021_568, 1_100_048_384, 7_538_737_152),  # TinyLlama's own count
])
def test_1b_configs_have_their_shapes_and_exact_parameter_and_flop_counts(name, shape, params,
                                                                          with_llama_vocab, flops):
    model, c = model_of_config(name)
    keys = ("attention", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size")
    assert tuple(c[k] for k in keys) == shape
    assert model.get_num_params(non_embedding=False) == params
    assert model.flops_per_token() == flops  # forward and backward, at the config's 2048
    assert model_of_config(name, vocab_size=32000)[0].get_num_params(False) == with_llama_vocab
    assert (c["dataset"], c["block_size"], c["norm"], c["pos"]) == ("c4", 2048, "rmsnorm", "rope")
    tokens_per_step = c["batch_size"] * c["gradient_accumulation_steps"] * c["block_size"]
    assert tokens_per_step == 524_288 and c["learning_rate"] == 4e-4 and c["min_lr"] == 4e-5


@pytest.mark.parametrize("attention, options", [shape for shape in SHAPES if shape.values[1]])
def test_resume_equals_uninterrupted_training(tmp_path, data_dir, attention, options):
    """Every Llama-style shape: 6 iterations straight equal 3, then a resume for 3 more."""
    def run(out_dir, **overrides):
        config = dict(data_dir=str(data_dir), out_dir=str(tmp_path / out_dir), device="cpu",
                      compile=False, num_threads=1, n_layer=2, n_embd=32, block_size=16,
                      batch_size=4, gradient_accumulation_steps=2, max_iters=6, eval_interval=3,
                      eval_iters=2, warmup_iters=2, lr_decay_iters=6, learning_rate=1e-3,
                      min_lr=1e-4, dropout=0.1, always_save_checkpoint=True, attention=attention)
        model = {**options, "n_head": 4, "intermediate_size": 40}
        train.train({**config, **model, **overrides}, verbose=False)
        return tmp_path / out_dir

    straight = load_checkpoint(run("straight"))
    run("split", max_iters=3)
    split = load_checkpoint(run("split", init_from="resume"))
    assert split["iter_num"] == straight["iter_num"] == 6
    weights = straight["model"]
    assert straight["model_args"]["pos"] == "rope" and "transformer.wpe.weight" not in weights
    assert not torch.equal(weights["lm_head.weight"], weights["transformer.wte.weight"])
    for key in weights:
        assert torch.equal(weights[key], split["model"][key]), key
    # what sample.py and eval_hellaswag.py load: the Llama-style options come back from model_args
    model, _, _ = load_model_and_tokenizer("resume", tmp_path / "straight", "cpu")
    assert model.config.mlp == "swiglu"
    assert model.generate(torch.zeros(1, 1, dtype=torch.long), 20).shape == (1, 21)
