"""Sizes and dtype names as a config writes them, checked without torch (the config loads before any kernel)."""

from __future__ import annotations

import re

MODEL_FILES = ("config.json", "generation_config.json")  # copied next to merged weights from the base
TOKENIZER_FILES = (  # copied from the base, or from tokenizer_source
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)

FLOAT_DTYPE_NAMES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float64": "float64",
}
SAFETENSORS_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U8", "BOOL")


def check_dtype_name(name: str) -> str:
    """``name`` if it names a dtype ``tensorfile.dtype_from_name`` knows, else ``ValueError``."""
    if name.lower().removeprefix("torch.") in FLOAT_DTYPE_NAMES or name.upper() in SAFETENSORS_DTYPES:
        return name
    raise ValueError(f"unknown dtype {name!r}; use one of bfloat16, float16, float32")


def parse_size(text: str | int) -> int:
    """``"2GB"`` -> 2_000_000_000, ``"512MiB"`` -> 536_870_912, ``1000`` -> 1000."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?)B?\s*", text.upper())
    if not m:
        raise ValueError(f"cannot read size {text!r}; write e.g. 5GB, 500MB or 2GiB")
    number, unit, binary = float(m.group(1)), m.group(2), m.group(3)
    base = 1024 if binary else 1000
    return int(number * base ** " KMGT".index(unit or " "))
