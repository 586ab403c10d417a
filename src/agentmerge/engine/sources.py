"""Where the output's tokenizer, chat template and generation config come from, and whether the inputs agree.

The merged weights have one tokenizer. It comes, with the chat template (``chat_template.jinja`` or the
``chat_template`` of ``tokenizer_config.json``) and ``generation_config.json``, from one *source*:

1. ``tokenizer_source``, when the config names one: ``base``, an agent's index (0: the first model) or a folder;
2. else the agent that added vocabulary rows (``vocab.py``: only its tokenizer has the new tokens);
3. else the base (the first model when there is no base).

``generation_config.json`` is the source's, or the base's when the source has none. ``config.json`` is the
base's (the architecture), with ``vocab_size`` set to the output's rows, and, when the source is not the
base, the source's ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` where its config.json has them.

Checks, before anything is read or written:

- **EOS ids** (``generation_config.json`` ``eos_token_id``, else ``config.json``'s; an int or a list) of
  the base, the agents and the tokenizer source. When they differ and the source was *not chosen*
  (case 3: nobody named it and no agent added tokens), the merge is refused: the merged model would stop
  generating on the base's EOS while the agents learned to end on another one, which is silent and easy
  to miss. Naming ``tokenizer_source`` (or an agent adding tokens) is a choice: then it is a warning.
- **Chat templates** that differ (one input having none counts): a warning naming which inputs have which
  template, where each is kept (``chat_template.jinja``, ``tokenizer_config.json chat_template``, ...) and whose
  the output uses. Templates are compared by content (sha256).
- **Tokenizer files** (``io.guards.units.TOKENIZER_FILES`` but the templates) of every input that has some, against the
  source's: a warning naming, per input, each file that differs or is missing and, for JSON files, the differing
  fields (``tokenizer_config.json (eos_token, model_max_length)``, ``tokenizer.json (added_tokens, model.vocab)``).

The source, the reason, both checks and the warnings go to merge.json (``sources``), the model card and
the summary on stderr.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmerge.errors import CheckpointError, MergeError
from agentmerge.io.formats.roles import check_tokenizer_source
from agentmerge.io.formats.vocab import VocabPlan, added_token_table
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.strict_json import read_json_object
from agentmerge.io.guards.units import TOKENIZER_FILES

if TYPE_CHECKING:
    from agentmerge.config.schema import MergeConfig
    from agentmerge.io.formats.checkpoint import Readable

TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# fields transformers writes about where and how a tokenizer was loaded, not what it does; never compared
LOAD_FIELDS = frozenset({"chat_template", "is_local", "local_files_only", "name_or_path", "_commit_hash", "cache_dir"})


@dataclass(frozen=True)
class Input:
    """One input folder as the checks name it: ``base``, an agent's label, or ``tokenizer_source``."""

    label: str
    folder: Path


def eos_ids(folder: Path) -> tuple[int, ...] | None:
    """The EOS id(s) generation stops on: generation_config.json's, else config.json's; None when neither says."""
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.is_file():
            value = read_json_object(path, name).get("eos_token_id")
            ids = [value] if type(value) is int else value
            if isinstance(ids, list) and ids and all(type(i) is int for i in ids):
                return tuple(sorted(set(ids)))
    return None


def chat_template(folder: Path) -> str | None:
    """The chat template: chat_template.jinja, else tokenizer_config.json's, else chat_template.json's."""
    found = template_and_place(folder)
    return found[0] if found is not None else None


def template_and_place(folder: Path) -> tuple[str, str] | None:
    """``(template, where it is kept)``: chat_template.jinja, else the ``chat_template`` field of
    tokenizer_config.json, else of chat_template.json; None when there is none."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8", errors="replace"), jinja.name
    for name in ("tokenizer_config.json", "chat_template.json"):
        path = folder / name
        if path.is_file():
            value = read_json_object(path, name).get("chat_template")
            if isinstance(value, str):
                return value, f"{name} chat_template"
            if value:  # a list of named templates
                return jsontext.dumps(value, sort_keys=True), f"{name} chat_template"
    return None


def tokenizer_differences(source: Path, other: Path) -> list[str]:
    """``other``'s tokenizer files that differ from ``source``'s (chat templates left to the template check):
    ``FILE (field, ...)`` for JSON objects, ``FILE (missing)`` / ``FILE (extra)``, else ``FILE``."""
    out = []
    for name in TOKENIZER_FILES:
        if name in TEMPLATE_FILES:
            continue
        a, b = source / name, other / name
        if a.is_file() != b.is_file():
            out.append(f"{name} ({'missing' if a.is_file() else 'extra'})")
        elif a.is_file() and a.read_bytes() != b.read_bytes():
            fields = _json_fields(a, b)
            if fields != []:  # []: only the template or load fields differ
                out.append(f"{name} ({_few(fields)})" if fields else name)
    return out


def _json_fields(a: Path, b: Path) -> list[str] | None:
    """The differing top-level fields (``model.vocab``: one level into objects) of two JSON objects, the chat
    template and ``LOAD_FIELDS`` left out; None when either is not a readable JSON object."""
    try:
        x, y = read_json_object(a, a.name), read_json_object(b, b.name)
    except CheckpointError:
        return None
    fields = []
    for key in sorted(x.keys() | y.keys()):
        if key in LOAD_FIELDS or x.get(key) == y.get(key):
            continue
        u, v = x.get(key), y.get(key)
        if isinstance(u, dict) and isinstance(v, dict) and len(u.keys() | v.keys()) <= 16:
            fields += [f"{key}.{k}" for k in sorted(u.keys() | v.keys()) if u.get(k) != v.get(k)]
        else:
            fields.append(str(key))
    return fields


def _few(fields: Sequence[str], most: int = 6) -> str:
    shown = ", ".join(fields[:most])
    return shown + (f", ... {len(fields) - most} more" if len(fields) > most else "")


def template_id(text: str | None) -> str | None:
    """A short content digest of a template (None: no template)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text is not None else None


@dataclass(frozen=True)
class OutputSources:
    """The output's tokenizer / chat template / generation config source, why it, and what the checks found."""

    source: Input
    reason: str  # "tokenizer_source", "added tokens" or "base"
    generation_config: Input | None  # whose generation_config.json is copied (None: no input has one)
    eos: Mapping[str, tuple[int, ...] | None]
    templates: Mapping[str, str | None]  # label -> template_id
    warnings: tuple[str, ...] = ()
    config_ids: Mapping[str, Any] | None = None  # token ids config.json takes from the source

    def record(self) -> dict[str, Any]:
        """merge.json's ``sources``."""
        return {
            "tokenizer": {"from": self.source.label, "folder": str(self.source.folder), "why": self.reason},
            "chat_template": self.source.label,
            "generation_config": self.generation_config.label if self.generation_config else None,
            "eos_token_id": {k: list(v) if v is not None else None for k, v in self.eos.items()},
            "chat_templates": dict(self.templates),
            "config_token_ids": dict(self.config_ids or {}),
            "warnings": list(self.warnings),
        }


def output_sources(
    cfg: MergeConfig, reference: Readable, models: Sequence[Readable], vocab: VocabPlan
) -> OutputSources:
    """``choose_sources`` for a merge: the base (or reference), the agents by label, the tokenizer source."""
    agents = [Input(spec.label, m.folder) for spec, m in zip(cfg.models, models, strict=True)]
    base = Input("base", reference.folder) if cfg.base else agents[0]
    named = None
    if cfg.tokenizer_ref:
        folder = check_tokenizer_source(cfg.tokenizer_ref)
        same = [i for i in (base, *agents) if i.folder.resolve() == folder.resolve()]
        named = same[0] if same else Input("tokenizer_source", folder)
    return choose_sources(base, agents, named, vocab)


def choose_sources(
    base: Input, agents: Sequence[Input], tokenizer_source: Input | None, vocab: VocabPlan
) -> OutputSources:
    """Pick the source (see the module) and run the checks; ``MergeError`` when EOS ids differ unchosen."""
    if tokenizer_source is not None:
        source, reason = tokenizer_source, "tokenizer_source"
    elif vocab.adders:
        source, reason = agents[vocab.adders[0]], "added tokens"
    else:
        source, reason = base, "base"
    everyone = _unique([base, *agents, *([tokenizer_source] if tokenizer_source else [])])
    eos = {i.label: eos_ids(i.folder) for i in everyone}
    found = {i.label: template_and_place(i.folder) for i in everyone}
    templates = {k: template_id(v[0] if v else None) for k, v in found.items()}
    places = {k: v[1] for k, v in found.items() if v}
    warnings = _eos_check(eos, source, reason) + _template_check(templates, places, source)
    warnings += _tokenizer_check(everyone, source) + _added_tokens_check(source, reason, vocab, agents)
    return OutputSources(
        source=source,
        reason=reason,
        generation_config=next((i for i in (source, base) if (i.folder / "generation_config.json").is_file()), None),
        eos=eos,
        templates=templates,
        warnings=tuple(warnings),
        config_ids=_config_ids(source, base),
    )


def _unique(inputs: Sequence[Input]) -> list[Input]:
    """Inputs by label, first occurrence kept (the reference is the first agent when there is no base)."""
    out: dict[str, Input] = {}
    for i in inputs:
        out.setdefault(i.label, i)
    return list(out.values())


def _groups(values: Mapping[str, Any]) -> dict[Any, list[str]]:
    groups: dict[Any, list[str]] = {}
    for label, value in values.items():
        groups.setdefault(value, []).append(label)
    return groups


def _describe(groups: Mapping[Any, list[str]], show: Any) -> str:
    return "; ".join(f"{', '.join(labels)}: {show(value)}" for value, labels in groups.items())


def _eos_check(eos: Mapping[str, tuple[int, ...] | None], source: Input, reason: str) -> list[str]:
    groups = _groups({k: v for k, v in eos.items() if v is not None})
    if len(groups) <= 1:
        return []
    what = f"EOS token ids differ ({_describe(groups, list)})"
    if reason == "base":
        raise MergeError(
            f"{what}: the output would take {source.label}'s tokenizer and generation config ({source.folder}) "
            "and stop on its EOS only; set tokenizer_source (--tokenizer-source PATH) to the input whose "
            "tokenizer, chat template and EOS the merged model should use"
        )
    return [f"{what}; the output uses {source.label}'s {list(eos.get(source.label) or [])}"]


def _template_check(templates: Mapping[str, str | None], places: Mapping[str, str], source: Input) -> list[str]:
    if len(set(templates.values())) <= 1:
        return []
    groups = _groups({k: (t, places.get(k)) for k, t in templates.items()})
    shown = _describe(groups, lambda t: f"template {t[0]} in {t[1]}" if t[0] else "no template")
    used = templates.get(source.label)
    return [f"chat templates differ ({shown}); the output uses {source.label}'s ({used or 'none'})"]


def _tokenizer_check(inputs: Sequence[Input], source: Input) -> list[str]:
    """One warning naming, per input, the tokenizer files (and JSON fields) that differ from the source's; an input
    with no tokenizer files (a LoRA adapter saved alone) brings no tokenizer and is not compared."""
    others = [i for i in inputs if i.folder != source.folder and any((i.folder / n).is_file() for n in TOKENIZER_FILES)]
    diffs = {i.label: tokenizer_differences(source.folder, i.folder) for i in others}
    shown = "; ".join(f"{label}: {', '.join(d)}" for label, d in diffs.items() if d)
    if not shown:
        return []
    return [f"tokenizers differ from {source.label}'s, which the output uses ({shown})"]


def _added_tokens_check(source: Input, reason: str, vocab: VocabPlan, agents: Sequence[Input]) -> list[str]:
    """A tokenizer_source that does not name the added tokens as the adding agent does: a warning."""
    if reason != "tokenizer_source" or not vocab.resized or vocab.base_rows is None:
        return []
    if added_token_table(source.folder, vocab.base_rows) == dict(vocab.added_tokens):
        return []
    adder = agents[vocab.adders[0]].label
    return [
        f"tokenizer_source {source.folder} does not give ids {vocab.base_rows}..{(vocab.out_rows or 0) - 1} "
        f"the tokens {adder} added; the output keeps {adder}'s rows, but its tokenizer may not use them"
    ]


def _config_ids(source: Input, base: Input) -> dict[str, Any]:
    """The token ids config.json takes from a source that is not the base (those its config.json has)."""
    path = source.folder / "config.json"
    if source.folder == base.folder or not path.is_file():
        return {}
    cfg = read_json_object(path, "config.json")
    return {k: cfg[k] for k in TOKEN_ID_KEYS if k in cfg}
