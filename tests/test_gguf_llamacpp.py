"""llama.cpp (llama-cpp-python) loads agentmerge's GGUF output and generates what transformers generates.

Opt-in: llama-cpp-python builds llama.cpp from source (long on a small machine), so it is no dependency;
without it these tests are skipped with that reason. F32 and F16: the same 16 greedy tokens as transformers
on the same file, and the same tokenization; Q8_0 (llama.cpp also rounds the activations to 8 bits in
its Q8_0 products): the first step's logits within a few percent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from agentmerge.io.formats.open import open_weights
from agentmerge.io.output.gguf_write import export_with
from ggufmodels import tiny_model

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (opt-in: docs/ecosystem.md)")

TEXT = "the model and the merge"
HARD = ("x=1234567; y = f(3.14)!", "  two  spaces\n\nnew lines\ttab", "Ünïcode — émoji 🤖 I'm you're")
STEPS = 16


def load(path: Path) -> Any:
    return llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=1, verbose=False, seed=0)


@pytest.mark.parametrize(("arch", "qtype"), [("llama", "F32"), ("llama", "F16"), ("qwen2", "F16"), ("qwen3", "F16")])
def test_llama_cpp_generates_what_transformers_generates(tmp_path: Path, arch: str, qtype: str) -> None:
    src = tiny_model(tmp_path / "src", arch, scale=3.0)  # larger weights: clear margins between the top tokens
    out = tmp_path / "m.gguf"
    export_with(open_weights, str(src), out, qtype)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    ids = tok(TEXT)["input_ids"]
    llm = load(out)
    for text in (TEXT, *HARD):
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok(text)["input_ids"], text
    model = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name, dtype=torch.float32)
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False)[0, len(ids) :].tolist()
    got = []
    for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        got.append(token)
        if len(got) == STEPS:
            break
    assert got == want


def test_llama_cpp_q8_0_logits(tmp_path: Path) -> None:
    src = tiny_model(tmp_path / "src", "llama", scale=3.0)
    out = tmp_path / "m.gguf"
    export_with(open_weights, str(src), out, "Q8_0")
    ids = transformers.AutoTokenizer.from_pretrained(src)(TEXT)["input_ids"]
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=128, n_threads=1, verbose=False, logits_all=True)
    llm.eval(ids)
    got = torch.tensor(llm.scores[len(ids) - 1])
    model = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name, dtype=torch.float32)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1]
    assert float((got - want).abs().max()) < 0.05 * float(want.abs().max())
    assert int(got.argmax()) == int(want.argmax())
