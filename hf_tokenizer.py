"""
A dataset's tokenizer as a Hugging Face tokenizer folder, for export_hf.py:

    write_tokenizer(meta, hf_dir)       # then AutoTokenizer.from_pretrained(hf_dir), offline

GPT-2 BPE: transformers' own tiktoken converter turns the BPE ranks tiktoken reads (r50k_base,
served offline by TIKTOKEN_CACHE_DIR) into a byte-level BPE with tiktoken's split pattern, so every
string encodes to tiktoken's ids and decodes back. <|endoftext|> (50256) is the bos, eos and pad
token; as in every GPT-2 tokenizer of transformers, the literal text "<|endoftext|>" encodes to it
(tiktoken's encode(text, allowed_special="all")), where this repo's training data, made with
encode_ordinary, holds its 7 text tokens.

Character level: one id per character of meta["chars"]. A character outside the table encodes
to <unk>, id vocab_size, which the model has no embedding for (unless a config set a larger
vocab_size): it fails, never drops the character.
"""
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from tokenizer import EOT_TOKEN, check_meta, gpt2_encoding

ENDOFTEXT = "<|endoftext|>"
UNKNOWN_CHAR = "<unk>"


class _RanksConverter(TikTokenConverter):
    """TikTokenConverter reads its ranks from a .tiktoken file; this one takes the ranks tiktoken
    has already loaded, so no file is copied or downloaded."""

    def __init__(self, encoding):
        super().__init__(pattern=encoding._pat_str, extra_special_tokens=encoding._special_tokens)
        self.ranks = encoding._mergeable_ranks

    def load_tiktoken_bpe(self, _vocab_file):
        return self.ranks


def gpt2_hf_tokenizer():
    """The GPT-2 BPE as a transformers tokenizer, encoding as tiktoken does."""
    encoding = gpt2_encoding()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_RanksConverter(encoding).converted(), bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT, pad_token=ENDOFTEXT, clean_up_tokenization_spaces=False)
    assert tokenizer.eos_token_id == EOT_TOKEN
    return tokenizer


def char_hf_tokenizer(chars):
    """One token per character of `chars`, in id order; a BPE without merges."""
    vocab = {ch: i for i, ch in enumerate(chars)}
    vocab[UNKNOWN_CHAR] = len(chars)
    bpe = Tokenizer(models.BPE(vocab, [], unk_token=UNKNOWN_CHAR))
    bpe.decoder = decoders.Fuse()  # the characters joined as they are, no spaces between
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token=UNKNOWN_CHAR,
                                   clean_up_tokenization_spaces=False)


def write_tokenizer(meta, hf_dir):
    """Write the tokenizer of the dataset `meta` describes (tokenizer.py) into hf_dir."""
    check_meta(meta, "the checkpoint's meta")
    if meta["tokenizer"] == "gpt2":
        tokenizer = gpt2_hf_tokenizer()
    else:
        tokenizer = char_hf_tokenizer(meta["chars"])
    tokenizer.save_pretrained(hf_dir)
