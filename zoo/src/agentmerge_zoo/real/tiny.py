"""A tiny random-initialised Llama with a real byte-level BPE tokenizer and a ChatML template: the smoke base.

It goes through every code path of the real zoo (chat template, group sampling, GRPO, export, merges,
evaluation) in seconds and needs no download: the tokenizer is trained here, with the ``tokenizers`` library,
on the suite's own prompts; the template and special tokens are SmolLM2's (``<|im_start|>``, ``<|im_end|>``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(n: int, seed: int) -> list[str]:
    from agentmerge_zoo.real.suite import SKILLS

    rng = random.Random(seed)
    texts = []
    for task in SKILLS.values():
        for _ in range(n):
            ex = task.sample(rng)
            texts += [ex.system or "", ex.user, *(a for _, a in ex.shots)]
    return [*texts, "```python\ndef f(xs):\n    return [x for x in xs if x > 0]\n```", '{"name": "x", "arguments": {}}']


def build_tokenizer(vocab_size: int = 512, seed: int = 0) -> Any:
    """A byte-level BPE tokenizer trained on the suite's prompts, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(40, seed), trainer)
    fast: Any = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", unk_token="<|endoftext|>"
    )
    fast.pad_token = "<|im_end|>"
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_base(out: Path, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Write the tiny base (bf16, tied embeddings) with its tokenizer to ``out``; skipped when it exists."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").exists():
        return out
    tokenizer = build_tokenizer(seed=seed)
    vocab = len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
