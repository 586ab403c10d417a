"""Greedy (or seeded sampled) batched completion with transformers: one checkpoint's model and tokenizer.

Prompts are sorted by length and generated in batches (left padding, one KV cache per batch); each completion
is cut at its first end token and first stop string. The suites (``scoring``'s task files, ``bfcl``,
``humaneval``) all generate through :class:`Generator`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.evaluation.decoding import Sampling, cut_at, decoding_options
from agentmerge.evaluation.taskfile import Example


class Generator:
    """One checkpoint's model and tokenizer, and greedy batched completion of examples."""

    def __init__(self, model: Any, tokenizer: Any, chat: bool, device: str) -> None:
        self.model, self.tokenizer, self.chat, self.device = model, tokenizer, chat, device
        config_eos = getattr(model.generation_config, "eos_token_id", None)
        eos = [tokenizer.eos_token_id, *(config_eos if isinstance(config_eos, list) else [config_eos])]
        self.eos = sorted({e for e in eos if e is not None})
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"

    @classmethod
    def load(cls, path: str, device: str, dtype: str, chat: bool) -> Generator:
        import torch
        import transformers

        quiet_transformers()
        auto_model: Any = transformers.AutoModelForCausalLM
        source, extra = gguf_source(path)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, **extra)
            model = auto_model.from_pretrained(
                source, dtype="auto" if dtype == "auto" else getattr(torch, dtype), **extra
            )
        except (OSError, ValueError, TypeError, KeyError) as e:  # what transformers raises on a damaged folder
            why = " ".join(str(e).split())[:300]  # one line, however many transformers wrote
            raise CheckpointError(f"{path}: transformers cannot load this checkpoint ({why})") from None
        model.to(device).eval()
        return cls(model, tokenizer, chat and bool(getattr(tokenizer, "chat_template", None)), device)

    def check_alphabet(self, examples: Sequence[Example]) -> None:
        """Refuse prompts with characters the tokenizer can only read as its unknown token (e.g. a character
        vocabulary that lacks capitals): the model would be scored on text it never sees."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None:
            return
        for ex in examples:
            text = ex.prompt + (ex.system or "")
            if unk not in self.tokenizer.encode(text, add_special_tokens=False):
                continue
            bad = [c for c in sorted(set(text)) if unk in self.tokenizer.encode(c, add_special_tokens=False)]
            if bad:
                raise ConfigError(
                    f"line {ex.line}: this checkpoint's tokenizer reads {''.join(bad[:8])!r} as its unknown token "
                    f"{self.tokenizer.unk_token!r}; write the prompt in characters it knows (a zoo checkpoint: "
                    "score it with --suite zoo)"
                )

    def text(self, ex: Example) -> str:
        if not self.chat:
            return ex.prompt if ex.system is None else f"{ex.system}\n{ex.prompt}"
        messages = ([{"role": "system", "content": ex.system}] if ex.system else []) + [
            {"role": "user", "content": ex.prompt}
        ]
        return self.chat_text(messages)

    def chat_text(self, messages: Sequence[Mapping[str, str]]) -> str:
        """A conversation as the model reads it: its chat template (ready for the assistant's turn), or without
        one the messages' contents one after another, a blank line apart."""
        if not self.chat:
            return "\n\n".join(m["content"] for m in messages) + "\n"
        return str(self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True))

    def complete(self, examples: Sequence[Example], batch_size: int, desc: str, quiet: bool) -> list[str]:
        """Greedy completions in input order; batches of one max_new_tokens, sorted by prompt length."""
        texts = [self.text(ex) for ex in examples]
        outputs = [""] * len(examples)
        groups = _split_by(list(range(len(examples))), lambda i: examples[i].max_new_tokens)
        for group in groups:
            done = self.complete_texts(
                [texts[i] for i in group], examples[group[0]].max_new_tokens, batch_size, desc, quiet
            )
            for i, out in zip(group, done, strict=True):
                outputs[i] = out
        return outputs

    def complete_texts(
        self,
        texts: Sequence[str],
        max_new_tokens: int,
        batch_size: int,
        desc: str = "generate",
        quiet: bool = True,
        stop: Sequence[str] = (),
        sampling: Sampling | None = None,
    ) -> list[str]:
        """Completions of ready-made prompt texts in input order, in batches sorted by length (left padding, one
        KV cache per batch); each cut at its first end token and first ``stop`` string; greedy unless ``sampling``
        (batch ``b`` is drawn with seed ``sampling.seed + b``)."""
        from tqdm import tqdm

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        outputs = [""] * len(texts)
        with tqdm(total=len(texts), desc=desc, unit="prompt", disable=quiet, leave=False, file=sys.stderr) as bar:
            for b, start in enumerate(range(0, len(order), batch_size)):
                batch = order[start : start + batch_size]
                seeded = None if sampling is None else Sampling(sampling.temperature, sampling.top_p, sampling.seed + b)
                done = self._generate([texts[i] for i in batch], max_new_tokens, stop, seeded)
                for i, out in zip(batch, done, strict=True):
                    outputs[i] = out
                bar.update(len(batch))
        return outputs

    def _generate(
        self, texts: list[str], max_new_tokens: int, stop: Sequence[str] = (), sampling: Sampling | None = None
    ) -> list[str]:
        import torch

        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not self.chat)
        enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        drawn = decoding_options(sampling, stop, self.tokenizer, enc["input_ids"].shape[1])
        with torch.no_grad():
            out = self.model.generate(
                **enc,
                **drawn,
                max_new_tokens=max_new_tokens,
                eos_token_id=self.eos or None,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        done = []
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            cut = next((k for k, tok in enumerate(row) if tok in self.eos), len(row))
            done.append(cut_at(str(self.tokenizer.decode(row[:cut], skip_special_tokens=True)), stop))
        return done


def _split_by(items: list[int], key: Any) -> list[list[int]]:
    groups: dict[Any, list[int]] = {}
    for i in items:
        groups.setdefault(key(i), []).append(i)
    return list(groups.values())


def quiet_transformers() -> None:
    """Only errors from transformers; no weight-loading or shard-writing progress bars (ours report progress)."""
    from transformers.utils import logging as hf_logging

    logs: Any = hf_logging  # untyped module
    logs.set_verbosity_error()
    logs.disable_progress_bar()


def gguf_source(path: str) -> tuple[str, dict[str, str]]:
    """``(folder, {"gguf_file": name})`` for a GGUF file (or a folder holding one), which transformers
    dequantizes itself; ``(path, {})`` otherwise."""
    from agentmerge.io.formats.gguf_read import gguf_file, is_gguf

    if not is_gguf(Path(path)):
        return path, {}
    f = gguf_file(Path(path))
    return str(f.parent), {"gguf_file": f.name}
