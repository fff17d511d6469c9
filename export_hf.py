"""
Export a checkpoint to a Hugging Face folder that `transformers` loads offline, weights as
safetensors (docs/export.md):

    python export_hf.py --out_dir=out-quickstart --hf_dir=hf-quickstart
    python export_hf.py --out_dir=out/ckpt.pt --hf_dir=hf-model

Standard attention with GPT-2 blocks becomes a plain GPT2LMHeadModel, with Llama-style blocks
(RMSNorm, RoPE, SwiGLU, no biases) a plain LlamaForCausalLM; both load back into GPT with
GPT.from_pretrained(folder). Every other model (the other variants, mixed block styles) becomes
a folder of this repo's own code: hf_model.py beside copies of model.py and generate.py, loaded
with AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True). The folder carries
the checkpoint's tokenizer too, where hf_tokenizer.py can write it.
"""
import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from checkpoint import CheckpointError, checkpoint_meta, load_checkpoint, load_weights
from model import CONV1D_WEIGHTS, GPT, GPTConfig
from runtime import run_script

REPO = Path(__file__).resolve().parent
REMOTE_CODE = ("hf_model.py", "model.py", "generate.py")  # what a trust_remote_code folder runs
# Llama's weights that each of ours stacks, row blocks in this order; RoPE needs no permutation:
# model.apply_rotary turns the same pairs (m, m + d_k / 2) as HF's rotate_half
LLAMA_LAYER = {"ln_1.weight": ["input_layernorm"], "ln_2.weight": ["post_attention_layernorm"],
               "attn.c_attn.weight": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
               "attn.c_proj.weight": ["self_attn.o_proj"],
               "mlp.c_fc.weight": ["mlp.gate_proj", "mlp.up_proj"],
               "mlp.c_proj.weight": ["mlp.down_proj"]}


def export_kind(config):
    """'gpt2' or 'llama' where transformers has the model's own class, else 'remote_code'."""
    if config.attention == "standard":
        blocks = (config.norm, config.pos, config.mlp)
        if blocks == ("layernorm", "learned", "gelu") and config.tie_embeddings \
                and config.n_kv_head in (0, config.n_head):
            return "gpt2"
        if blocks == ("rmsnorm", "rope", "swiglu") and not config.bias:
            return "llama"
    return "remote_code"


def llama_names(n_layer):
    """Our weight names, each with the names of the Llama weights it stacks."""
    names = {"transformer.wte.weight": ["model.embed_tokens.weight"],
             "transformer.ln_f.weight": ["model.norm.weight"],
             "lm_head.weight": ["lm_head.weight"]}
    for i in range(n_layer):
        for ours, theirs in LLAMA_LAYER.items():
            names[f"transformer.h.{i}.{ours}"] = [f"model.layers.{i}.{t}.weight" for t in theirs]
    return names


def llama_config(config, eos_token_id):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.n_embd, num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head, num_key_value_heads=config.n_kv_head or config.n_head,
        head_dim=config.n_embd // config.n_head, intermediate_size=config.intermediate_size,
        max_position_embeddings=config.block_size, rms_norm_eps=1e-5,  # model.make_norm's
        rope_theta=config.rope_theta, hidden_act="silu", attention_bias=False, mlp_bias=False,
        tie_word_embeddings=config.tie_embeddings, bos_token_id=eos_token_id,
        eos_token_id=eos_token_id)


def gpt_from_llama(hf_model, override_args):
    """GPT.from_pretrained's GPT for a LlamaForCausalLM, or a ValueError naming a setting of it
    that this model does not compute."""
    hf = hf_model.config
    rope = getattr(hf, "rope_parameters", None) or {"rope_theta": hf.rope_theta}  # transformers 4
    supported = dict(hidden_act="silu", rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False,
                     head_dim=hf.hidden_size // hf.num_attention_heads)
    differ = [f"{name}={getattr(hf, name)!r}" for name, value in supported.items()
              if getattr(hf, name, value) != value]
    if rope.get("rope_type", "default") != "default":
        differ.append(f"rope_type={rope['rope_type']!r}")
    if differ:
        raise ValueError(f"this Llama's {', '.join(differ)}: GPT computes only "
                         f"{', '.join(f'{k}={v!r}' for k, v in supported.items())}")
    n_head, n_kv_head = hf.num_attention_heads, hf.num_key_value_heads
    config = GPTConfig(
        block_size=hf.max_position_embeddings, vocab_size=hf.vocab_size, n_embd=hf.hidden_size,
        n_layer=hf.num_hidden_layers, n_head=n_head,
        n_kv_head=0 if n_kv_head == n_head else n_kv_head,  # 0: as many as n_head
        bias=False, norm="rmsnorm", pos="rope", rope_theta=rope["rope_theta"], mlp="swiglu",
        intermediate_size=hf.intermediate_size, tie_embeddings=hf.tie_word_embeddings,
        **override_args)
    model = GPT(config)
    theirs = hf_model.state_dict()
    model.load_state_dict({ours: torch.cat([theirs[name] for name in names])
                           for ours, names in llama_names(config.n_layer).items()})
    return model


def read_model(checkpoint_path):
    """(GPT in eval mode, in the dtype of the checkpoint's weights, its checkpoint)."""
    checkpoint = load_checkpoint(checkpoint_path)
    try:
        config = GPTConfig(**checkpoint["model_args"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {checkpoint_path} does not describe a model: {e}") \
            from None
    model = GPT(config)
    dtype = next(iter(checkpoint["model"].values())).dtype
    load_weights(model.to(dtype), checkpoint["model"], checkpoint_path)
    return model.eval(), checkpoint


def write_gpt2(model, hf_dir, eos_token_id):
    from transformers import GPT2Config, GPT2LMHeadModel
    c = model.config
    hf_config = GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
        n_head=c.n_head, n_inner=c.intermediate_size or None, layer_norm_epsilon=1e-5,
        activation_function="gelu_new" if c.gelu_approximate == "tanh" else "gelu",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
        bos_token_id=eos_token_id, eos_token_id=eos_token_id)
    ours = model.state_dict()
    hf_model = GPT2LMHeadModel(hf_config).to(model.lm_head.weight.dtype)
    # GPT-2 always has biases: a model without them exports zeros
    weights = {name: zero_bias(name, t) if name not in ours
               else ours[name].t() if name.endswith(CONV1D_WEIGHTS) else ours[name]
               for name, t in hf_model.state_dict().items()}
    hf_model.load_state_dict(weights)
    hf_model.save_pretrained(hf_dir)


def zero_bias(name, like):
    if not name.endswith(".bias"):
        raise KeyError(f"GPT has no weight for GPT-2's {name}")
    return torch.zeros_like(like)


def write_llama(model, hf_dir, eos_token_id):
    from transformers import LlamaForCausalLM
    hf_model = LlamaForCausalLM(llama_config(model.config, eos_token_id))
    hf_model.to(model.lm_head.weight.dtype)
    theirs, ours = hf_model.state_dict(), model.state_dict()
    weights = {}
    for name, parts in llama_names(model.config.n_layer).items():
        rows = torch.split(ours[name], [theirs[part].size(0) for part in parts])
        weights.update(zip(parts, rows))
    hf_model.load_state_dict(weights)
    hf_model.save_pretrained(hf_dir)


def write_remote_code(model, hf_dir, eos_token_id):
    from safetensors.torch import save_file
    attention_class = type(model.transformer.h[0].attn)
    if attention_class.__module__ != GPT.__module__:
        raise ValueError(f"attention={model.config.attention!r} is defined in "
                         f"{attention_class.__module__}, not model.py, whose copy the folder "
                         f"carries: move the class into model.py to export it")
    for name in REMOTE_CODE:
        shutil.copyfile(REPO / name, hf_dir / name)
    dtype = model.lm_head.weight.dtype
    config = dict(
        architectures=["GPTVariantForCausalLM"], model_type="gpt_attention_variant",
        auto_map={"AutoConfig": "hf_model.GPTVariantConfig",
                  "AutoModelForCausalLM": "hf_model.GPTVariantForCausalLM"},
        **asdict(model.config), tie_word_embeddings=model.config.tie_embeddings, use_cache=False,
        dtype=str(dtype).removeprefix("torch."), bos_token_id=eos_token_id,
        eos_token_id=eos_token_id)
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tied = model.config.tie_embeddings  # safetensors keeps one copy: transformers ties it again
    weights = {f"gpt.{name}": t.contiguous() for name, t in model.state_dict().items()
               if not (tied and name == "lm_head.weight")}
    save_file(weights, hf_dir / "model.safetensors", metadata={"format": "pt"})


WRITERS = {"gpt2": write_gpt2, "llama": write_llama, "remote_code": write_remote_code}


def export(checkpoint_path_or_dir, hf_dir):
    """Write the Hugging Face folder of a checkpoint (its file, or the out_dir holding ckpt.pt)
    to hf_dir; returns hf_dir as a Path. A CheckpointError or ValueError says what is wrong."""
    try:
        import safetensors  # noqa: F401  the weights' format
        import transformers  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"export needs transformers and safetensors: pip install "
                           f"transformers safetensors ({e})") from None
    model, checkpoint = read_model(checkpoint_path_or_dir)
    meta = checkpoint_meta(checkpoint)
    eos_token_id = 50256 if meta and meta.get("tokenizer") == "gpt2" else None  # <|endoftext|>
    hf_dir = Path(hf_dir)
    hf_dir.mkdir(parents=True, exist_ok=True)
    kind = export_kind(model.config)
    with torch.no_grad():
        WRITERS[kind](model, hf_dir, eos_token_id)
    if meta is not None:
        try:
            import hf_tokenizer
        except ModuleNotFoundError as e:
            if e.name != "hf_tokenizer":
                raise
        else:
            hf_tokenizer.write_tokenizer(meta, hf_dir)
    return hf_dir


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out", help="a training out_dir, or a checkpoint file")
    p.add_argument("--hf_dir", required=True, help="the folder to write (made if missing)")
    args = p.parse_args(argv)
    try:
        hf_dir = export(args.out_dir, args.hf_dir)
    # a checkpoint missing or damaged (CheckpointError), a model not exportable (ValueError),
    # a folder not writable (OSError), transformers missing (RuntimeError)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    remote = "auto_map" in json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    print(f"wrote {hf_dir}: AutoModelForCausalLM.from_pretrained({str(hf_dir)!r}"
          f"{', trust_remote_code=True' if remote else ''})")
    return 0


if __name__ == "__main__":
    run_script(main, "stopped by Ctrl-C; the folder may be incomplete: export again")
