"""Tiny llama / qwen2 / qwen3 models with a byte-level BPE tokenizer and a chat template, for the GGUF tests.

Hidden size 256 and MLP size 512: every matrix row splits into Q6_K's 256-value blocks (and Q8_0's 32).
The tokenizer holds all 256 byte symbols (so llama.cpp and transformers can tokenize any text), a few
merges and three special tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ("the", "and", "merge", "model", "token")


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (GPT-2's table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tokenizer() -> Any:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for s in byte_symbols():
        vocab[s] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        for cut in range(1, len(word)):
            left, right = word[:cut], word[cut]
            if left + right not in vocab:
                merges.append((left, right))
                vocab[left + right] = len(vocab)
    core = Tokenizer(models.BPE(vocab, merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok: Any = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHAT
    return tok


def config(arch: str, vocab: int, tie: bool = False) -> Any:
    common: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": tie,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-6,
    }
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common)
    return transformers.Qwen3Config(**common, head_dim=128)  # transformers' GGUF loader assumes 128


def tiny_model(folder: Path, arch: str = "llama", *, seed: int = 0, tie: bool = False, scale: float = 1.0) -> Path:
    """A random ``arch`` model saved with its tokenizer in ``folder`` (float32)."""
    tok = tokenizer()
    torch.manual_seed(seed)
    cfg = config(arch, len(tok), tie)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05 * scale) if p.dim() > 1 else p.uniform_(0.8, 1.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def nudged(base: Path, out: Path, seed: int, size: float = 0.01) -> Path:
    """``base`` with every weight moved by N(0, size²) (an 'agent' of the base), saved to ``out``."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * size)
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out
