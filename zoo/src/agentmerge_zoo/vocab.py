"""The zoo's character-level tokenizer: a real ``PreTrainedTokenizerFast`` built with ``tokenizers``.

One token per character of a fixed alphabet plus ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``. Encoding prepends
``<bos>``; padding is on the left (for batched generation). Saved with ``save_pretrained`` so that
``AutoTokenizer.from_pretrained`` loads it from any zoo checkpoint folder.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

_TokenizerClass: Any = PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 =;:?+-*(),[]>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def char_vocab() -> dict[str, int]:
    """Token -> id for specials then every alphabet character."""
    tokens = [*SPECIALS, *ALPHABET]
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer() -> Any:
    """Build the character tokenizer (deterministic: the same ids every time)."""
    core = Tokenizer(models.WordLevel(char_vocab(), unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    return _TokenizerClass(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=512,
    )
