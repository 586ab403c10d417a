"""Resized vocabularies: agents whose embedding / lm_head have more rows than the base's.

A *vocabulary tensor* is a 2-D tensor whose first dimension is its checkpoint's ``vocab_size``
(``config.json``, or ``text_config.vocab_size``; without a config, a name like ``embed_tokens`` or
``lm_head``). When an agent adds ``V_agent - V_base`` tokens (``resize_token_embeddings``), each of its
vocabulary tensors has the shape ``[V_agent, d]`` against the base's ``[V_base, d]``. Stored row-major,
rows ``[0, V_base)`` are the first ``V_base * d`` elements, so the merge splits each such tensor in two:

    out[r]  = merge(base[r], agent_1[r], ..., agent_N[r])      r <  V_base   (the method's own kernels)
    out[r]  = sum_{a in A} w_a * agent_a[r] / sum_{a in A} w_a  V_base <= r < V_out   (A: the adding agents)

The new rows have no base value and so no task vector: they are the adding agent's own values (one
agent), or the weighted mean of the adding agents' values (several agents that added exactly the same
tokens; equal weights when the weights do not sum to a positive number). Everything is read in chunks
of rows, computed in float32 and written in the output dtype.

Refused (``MergeError``, naming the agents, the tensors and the rows): an agent with fewer rows than the
base (rows removed, or a base larger than an agent), vocabulary tensors of one agent resized to different
sizes, and two agents that add rows but not the same tokens (by the tokens their tokenizer files give to
the added ids: ``tokenizer.json`` added tokens and vocabulary, ``added_tokens.json``, ``vocab.json``,
``tokenizer_config.json`` ``added_tokens_decoder``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmerge.errors import MergeError
from agentmerge.io.guards.strict_json import read_json_object

if TYPE_CHECKING:
    import torch

    from agentmerge.io.formats.checkpoint import Readable
    from agentmerge.io.formats.tensorfile import TensorInfo

VOCAB_NAMES = re.compile(r"embed_tokens|lm_head|wte|word_embeddings|tok_embeddings|embed_in|embed_out|^output\.weight")


@dataclass(frozen=True)
class ResizedTensor:
    """One vocabulary tensor with added rows: the base's rows, the output's rows, who holds the new ones."""

    name: str
    base_rows: int
    out_rows: int
    row_shape: tuple[int, ...]  # the shape of one row (``[d]`` for an embedding)
    adders: tuple[int, ...]  # indices of the models that hold rows [base_rows, out_rows)

    @property
    def row_elements(self) -> int:
        return math.prod(self.row_shape)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.out_rows, *self.row_shape)

    @property
    def base_numel(self) -> int:
        return self.base_rows * self.row_elements

    def extra_chunks(self, chunk: int) -> tuple[tuple[int, int], ...]:
        """Element ranges of the output's new rows, whole rows, about ``chunk`` elements each."""
        step = max(1, chunk // max(1, self.row_elements)) * self.row_elements
        stop = self.out_rows * self.row_elements
        return tuple((s, min(s + step, stop)) for s in range(self.base_numel, stop, step))


@dataclass(frozen=True)
class VocabPlan:
    """The vocabulary tensors with added rows (empty when no agent resized its vocabulary)."""

    base_rows: int | None = None
    out_rows: int | None = None
    tensors: Mapping[str, ResizedTensor] = field(default_factory=dict)
    adders: tuple[int, ...] = ()
    added_tokens: Mapping[int, str] = field(default_factory=dict)  # id -> token of the new rows, where known

    @property
    def resized(self) -> bool:
        return bool(self.tensors)

    def record(self, labels: Sequence[str]) -> dict[str, Any] | None:
        """What merge.json and the model card say about the vocabulary (None when not resized)."""
        if not self.resized:
            return None
        return {
            "base_rows": self.base_rows,
            "out_rows": self.out_rows,
            "tensors": sorted(self.tensors),
            "added_by": [labels[i] for i in self.adders],
            "new_rows": "copied from the adding agent" if len(self.adders) == 1 else "mean of the adding agents",
            "added_tokens": {str(i): t for i, t in sorted(self.added_tokens.items())},
        }


def new_rows(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[E]`` float32: the adding agents' rows ``values [A, E]`` combined (one agent: its values exactly).

    ``sum_a w_a v_a / sum_a w_a``, with equal weights when the weights do not sum to a positive number.
    """
    if values.shape[0] == 1:
        return values[0].float()
    w = weights.float()
    if not float(w.sum()) > 0:
        w = w.new_ones(w.shape)
    return (w / w.sum()) @ values.float()


# --------------------------------------------------------------------------- detection


def vocab_size(c: Readable) -> int | None:
    """``vocab_size`` from the checkpoint's config.json (or its ``text_config``), else None."""
    path = c.folder / "config.json"
    if not path.is_file():
        return None
    cfg = read_json_object(path, "config.json")
    for section in (cfg, cfg.get("text_config")):
        if isinstance(section, dict) and type(section.get("vocab_size")) is int:
            return int(section["vocab_size"])
    return None


def is_vocab_tensor(info: TensorInfo, size: int | None) -> bool:
    """A 2-D tensor whose rows are the vocabulary (by ``vocab_size`` when known, else by its name)."""
    if len(info.shape) != 2 or not info.dtype.is_floating_point:
        return False
    return info.shape[0] == size if size is not None else bool(VOCAB_NAMES.search(info.name))


def plan_vocab(ref: Readable, models: Sequence[Readable]) -> VocabPlan:
    """Which vocabulary tensors have added rows, and which agents hold them; refusals as the module says."""
    rows = [_agent_rows(ref, m) for m in models]
    adders = tuple(i for i, r in enumerate(rows) if r)
    if not adders:
        return VocabPlan()
    first = adders[0]
    base_rows = ref.tensors[next(iter(rows[first]))].shape[0]
    for i in adders[1:]:
        _check_same_rows(models[first], models[i], rows[first], rows[i])
    tokens = added_token_table(models[first].folder, base_rows)
    for i in adders[1:]:
        _check_same_tokens(models[first], models[i], tokens, base_rows, rows[first])
    out_rows = next(iter(rows[first].values()))
    tensors = {
        name: ResizedTensor(name, base_rows, out_rows, ref.tensors[name].shape[1:], adders) for name in rows[first]
    }
    return VocabPlan(base_rows, out_rows, tensors, adders, tokens)


def _agent_rows(ref: Readable, m: Readable) -> dict[str, int]:
    """``{tensor: rows}`` of the agent's vocabulary tensors with more rows than the base's; refusals."""
    ref_size, m_size = vocab_size(ref), vocab_size(m)
    grown: dict[str, int] = {}
    same: list[str] = []
    for name, a in ref.tensors.items():
        b = m.tensors.get(name)
        if b is None or not is_vocab_tensor(a, ref_size) or len(b.shape) != 2 or b.shape[1:] != a.shape[1:]:
            continue  # not a vocabulary tensor of the base: check_compatible judges its shape
        if b.shape[0] < a.shape[0]:
            raise MergeError(
                f"{m.path}: tensor {name!r} has {b.shape[0]} rows but the base {ref.path} has {a.shape[0]} "
                f"(rows {b.shape[0]}..{a.shape[0] - 1} removed, or a base larger than this agent); agentmerge only "
                "merges agents that keep every base row: use the base this agent was fine-tuned from"
            )
        if b.shape[0] > a.shape[0]:
            grown[name] = b.shape[0]
        else:
            same.append(name)
    _check_one_size(m, grown, same, {n: ref.tensors[n].shape[0] for n in same}, m_size)
    return grown


def _check_one_size(
    m: Readable, grown: Mapping[str, int], same: Sequence[str], base_rows: Mapping[str, int], size: int | None
) -> None:
    """An agent's vocabulary tensors all grow to one size, its config.json ``vocab_size`` when it has one."""
    if not grown:
        return
    if len(set(grown.values())) > 1 or same:
        listed = ", ".join(f"{n}: {r} rows" for n, r in sorted({**grown, **base_rows}.items()))
        raise MergeError(
            f"{m.path}: its vocabulary tensors have different numbers of rows ({listed}); "
            "resize them together (resize_token_embeddings) and save the agent again"
        )
    rows = next(iter(grown.values()))
    if size is not None and size != rows:
        raise MergeError(
            f"{m.path}: {', '.join(sorted(grown))} have {rows} rows but its config.json says vocab_size {size}; "
            "save the agent again after resize_token_embeddings (it updates both)"
        )


def _check_same_rows(a: Readable, b: Readable, rows_a: Mapping[str, int], rows_b: Mapping[str, int]) -> None:
    if rows_a == rows_b:
        return
    raise MergeError(
        f"{a.path} and {b.path} both add vocabulary rows, but not the same: {a.path} grows {_grown(rows_a)}, "
        f"{b.path} grows {_grown(rows_b)}; merge agents that added the same tokens, or only one of them"
    )


def _grown(rows: Mapping[str, int]) -> str:
    return ", ".join(f"{n} to {r} rows" for n, r in sorted(rows.items()))


def _check_same_tokens(
    a: Readable, b: Readable, tokens_a: Mapping[int, str], base_rows: int, rows: Mapping[str, int]
) -> None:
    tokens_b = added_token_table(b.folder, base_rows)
    missing = [c.path for c in (a, b) if not _has_tokenizer(c.folder)]
    if tokens_a == tokens_b and not missing:
        return
    out_rows = next(iter(rows.values()))
    diff = sorted(i for i in tokens_a.keys() | tokens_b.keys() if tokens_a.get(i) != tokens_b.get(i))
    detail = (
        f"first difference at id {diff[0]}: {tokens_a.get(diff[0])!r} vs {tokens_b.get(diff[0])!r}"
        if diff
        else f"their tokens cannot be compared: {missing[0]} has no tokenizer files"
    )
    raise MergeError(
        f"{a.path} and {b.path} both add rows {base_rows}..{out_rows - 1} to {', '.join(sorted(rows))}, "
        f"but not the same tokens ({detail}); merge agents that added identical tokens, or only one of them"
    )


# --------------------------------------------------------------------------- the tokens of the added ids


def _has_tokenizer(folder: Path) -> bool:
    names = ("tokenizer.json", "tokenizer_config.json", "added_tokens.json", "vocab.json", "tokenizer.model")
    return any((folder / n).is_file() for n in names)


def added_token_table(folder: Path, start: int) -> dict[int, str]:
    """``{id: token}`` for every id ``>= start`` that the folder's tokenizer files name."""
    table: dict[int, str] = {}
    for name, read in _TOKEN_SOURCES:
        path = folder / name
        if path.is_file():
            for i, tok in read(read_json_object(path, name)):
                if i >= start:
                    table.setdefault(i, tok)
    return table


def _tokenizer_json(data: dict[str, Any]) -> list[tuple[int, str]]:
    pairs = [(t["id"], t["content"]) for t in data.get("added_tokens") or [] if _token_entry(t)]
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        pairs += _inverse(vocab)
    return pairs


def _token_entry(t: object) -> bool:
    return isinstance(t, dict) and type(t.get("id")) is int and isinstance(t.get("content"), str)


def _inverse(vocab: Mapping[str, Any]) -> list[tuple[int, str]]:
    return [(i, tok) for tok, i in vocab.items() if type(i) is int]


def _added_decoder(data: dict[str, Any]) -> list[tuple[int, str]]:
    decoder = data.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        return []
    return [
        (int(k), v["content"])
        for k, v in decoder.items()
        if isinstance(k, str) and k.isdigit() and isinstance(v, dict) and isinstance(v.get("content"), str)
    ]


_TOKEN_SOURCES = (
    ("tokenizer.json", _tokenizer_json),
    ("added_tokens.json", _inverse),
    ("vocab.json", _inverse),
    ("tokenizer_config.json", _added_decoder),
)
