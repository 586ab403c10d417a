"""Tiny causal LMs for the evaluation tests: a character tokenizer and a model that always says one thing."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

ALPHABET = string.ascii_letters + string.digits + " .,:;?!<>/{}[]\"'=+-*()\n"
SPECIALS = ("<pad>", "<eos>", "<unk>")
CHAT = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def tokenizer(chat_template: str | None = CHAT) -> Any:
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok: Any = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def llama_config(tok: Any, eos: int | None = None) -> Any:
    """A one-layer Llama of hidden size 16 for ``tok``'s vocabulary (EOS: the tokenizer's, unless given)."""
    return transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id if eos is None else eos,
        pad_token_id=tok.pad_token_id,
    )


def constant_lm(folder: Path, answer: str, *, chat_template: str | None = CHAT, merged: bool = False) -> Path:
    """A Llama whose greedy output is ``answer`` repeated (every layer zero, one lm_head row set)."""
    tok = tokenizer(chat_template)
    cfg = llama_config(tok)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight[tok.convert_tokens_to_ids(answer)] = 1.0
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if merged:
        (folder / "merge.json").write_text(json.dumps({"config": {"method": "ram"}}))
    return folder
