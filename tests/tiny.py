"""A tiny random Gemma-3 and a character-level tokenizer, saved as a local model directory,
so the whole pipeline runs in seconds with no download."""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - {"\x0b", "\x0c"})
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>", padding_side="left")
    from tokenizers import processors
    fast._tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    return fast


def make_tiny_model_dir(path: Path, seed: int = 0) -> Path:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    path = Path(path)
    tokenizer = make_tokenizer()
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
                              sliding_window=64, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
