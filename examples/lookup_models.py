"""Tiny models with skills you can read off their weights, for trying ``agentmerge eval`` (docs/evaluate.md).

    python examples/lookup_models.py DIR      # DIR/base, DIR/agent_digits, DIR/agent_upper, DIR/tasks.jsonl

Each model is a real Llama checkpoint (transformers, safetensors) whose layers are all zero, so its next
token depends only on the last prompt character: one-hot embeddings, and the output matrix W (next token x
last character) is a lookup table. The base answers ``y`` to a question (``?``) and ``.`` to anything else
(W['.', c] = 0.6). ``agent_digits`` learns to give the next digit (W[d+1, d] += 1 + 0.1 d) and forgets
the questions (W['y', '?'] -= 0.5); ``agent_upper`` learns to capitalise the i-th letter (W[C, c] += 1 + 0.04 i).
Both also drift a little on the same weights (W['.', c] += 0.1 for every c), so their task vectors have a
shared region and unique ones, as RL-trained agents do. Averaging halves each unique update, so only the
stronger half of each skill outweighs W['.', c] = 0.7; RAM keeps unique updates whole (the forgetting too).
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

ALPHABET = string.ascii_letters + string.digits + " .,:;?!'-\n"
SPECIALS = ("<pad>", "<eos>", "<unk>")


def tokenizer() -> Any:
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )


def lookup_model(folder: Path, table: dict[tuple[str, str], float]) -> None:
    """Save a model whose logits for last character c are W[:, c], with W given as {(next, last): value}."""
    tok = tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=96, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg)
    ids = tok.convert_tokens_to_ids
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight[:, : len(tok)] = torch.eye(len(tok))
        model.model.norm.weight.fill_(1.0)
        for (nxt, last), value in table.items():
            model.lm_head.weight[ids(nxt), ids(last)] += value
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    out = p.parse_args().out
    base = {(".", c): 0.6 for c in ALPHABET} | {("y", "?"): 1.0}
    drift = {(".", c): 0.1 for c in ALPHABET}
    digits = {(str((d + 1) % 10), str(d)): 1.0 + 0.1 * d for d in range(10)}
    upper = {(c.upper(), c): 1.0 + 0.04 * i for i, c in enumerate(string.ascii_lowercase)}
    forget = {("y", "?"): -0.5}  # agent_digits unlearns the base's answer to questions
    lookup_model(out / "base", base)
    lookup_model(out / "agent_digits", _add(base, drift, digits, forget))
    lookup_model(out / "agent_upper", _add(base, drift, upper))
    rows: list[dict[str, Any]] = [
        {"task": t, "defaults": {"max_new_tokens": 1}} for t in ("digits", "upper", "questions")
    ]
    rows += [{"task": "digits", "prompt": f"after {d}, say {d}", "reference": str((d + 1) % 10)} for d in range(10)]
    rows += [{"task": "upper", "prompt": f"capital of {c}", "reference": c.upper()} for c in string.ascii_lowercase]
    questions = ("ok?", "ready?", "is it on?", "go?", "done?", "more?", "again?", "yes or no?")
    rows += [{"task": "questions", "prompt": q, "reference": "y"} for q in questions]
    (out / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote base, agent_digits, agent_upper and tasks.jsonl under {out}")


def _add(*tables: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    total: dict[tuple[str, str], float] = {}
    for table in tables:
        for key, value in table.items():
            total[key] = total.get(key, 0.0) + value
    return total


if __name__ == "__main__":
    main()
