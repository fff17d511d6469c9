"""
This repo's GPT as a Hugging Face `transformers` model, for the attention variants and block
styles transformers has no class of. export_hf.py copies this file into the exported folder
beside copies of model.py and generate.py, and transformers imports the three as a package:

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

so it runs only from such a folder (its imports are relative); the repo never imports it.
Decoding recomputes the context at every token (no cache): GPT's logits, as GPT.generate's.
"""
from dataclasses import asdict, fields

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

# transformers copies into its module cache only the files that relative imports name
from .generate import KVCache  # noqa: F401
from .model import GPT, GPTConfig

GPT_FIELDS = [field.name for field in fields(GPTConfig)]


class GPTVariantConfig(PretrainedConfig):
    """GPTConfig's fields as they are (config.json lists them), under transformers' names too."""

    model_type = "gpt_attention_variant"
    attribute_map = {"max_position_embeddings": "block_size", "hidden_size": "n_embd",
                     "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"}

    def __post_init__(self, **kwargs):
        gpt_args = {name: kwargs.pop(name) for name in GPT_FIELDS if name in kwargs}
        for name, value in asdict(GPTConfig(**gpt_args)).items():  # GPTConfig checks them
            setattr(self, name, value)
        self.tie_word_embeddings = self.tie_embeddings
        self.use_cache = False  # no past_key_values: every step recomputes the context
        super().__post_init__(**kwargs)


class GPTVariantForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GPTVariantConfig
    base_model_prefix = "gpt"
    _tied_weights_keys = {"gpt.lm_head.weight": "gpt.transformer.wte.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(GPTConfig(**{name: getattr(config, name) for name in GPT_FIELDS}))
        self.post_init()

    def _init_weights(self, module):
        pass  # GPT initialises itself, and from_pretrained replaces every weight

    def get_input_embeddings(self):
        return self.gpt.transformer.wte

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, **kwargs):
        """Logits (B, T, vocab), or of the last logits_to_keep positions (generate asks for one).
        Position t sees at most block_size tokens, t - block_size + 1 .. t: past block_size the
        window slides, as in GPT.generate. Right padding needs no mask (the model is causal)."""
        if attention_mask is not None and (attention_mask.cummin(1)[0] != attention_mask).any():
            raise ValueError("the model takes no attention mask: pad on the right "
                             "(tokenizer.padding_side = 'right') or run one sequence at a time")
        block_size, T = self.config.block_size, input_ids.size(1)
        start = T - logits_to_keep if 0 < logits_to_keep < T else 0
        logits = []
        if start < block_size:  # the first window: one forward gives all of its positions
            logits.append(self.gpt(input_ids[:, :block_size], all_logits=True)[0][:, start:])
        for t in range(max(start, block_size), T):  # each later position: its own window
            logits.append(self.gpt(input_ids[:, t + 1 - block_size: t + 1])[0])
        return CausalLMOutput(logits=torch.cat(logits, dim=1))
