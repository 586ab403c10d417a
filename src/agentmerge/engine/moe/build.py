"""The ``moe`` driver: static merge -> plan -> one layer at a time (copy, route, experts) -> finish the folder.

1. The inputs are checked before anything is written: a dense Llama / Mistral / Qwen2 base (``arch``), the same
   MLP shapes in every agent, prompts for every agent (``moe_config``), a shared expert only where the output has one.
2. The static merge (``agentmerge.merge.merge`` with the config's method, RAM by default) is written into the
   hidden output folder, or an existing merge (``static``) is used. Its attention, embeddings, norms and head
   are the MoE's; its MLP is the shared expert when ``shared_expert: merged``.
3. The output is planned whole (``moe_plan.py``), then written one layer at a time: the layer's static tensors, its
   router from the prompts' hidden states at that layer (``router.py``), each agent's MLP as an expert, and the
   shared expert; the prompts move on through the layer as the output will compute it. Memory holds one layer's
   attention and one expert's MLP in float32, plus the prompts' hidden states.
4. ``config.json`` (the MoE architecture), the static merge's tokenizer and generation config, ``merge.json``
   and the model card; the static merge is deleted and the folder renamed into place.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentmerge.engine.coverage import check_planned, check_written
from agentmerge.engine.inputs import check_compatible
from agentmerge.engine.moe.arch import MoeNames, moe_config, moe_family
from agentmerge.engine.moe.moe_config import MoeConfig
from agentmerge.engine.moe.moe_plan import LayerPlan, MoePlan, Slot, check_mlp_shapes, make_plan, shared_size
from agentmerge.engine.moe.record import MoeResult, merge_record, model_card
from agentmerge.engine.moe.router import MAX_TOKENS, Calibration, Router, mlp, route, router_rows
from agentmerge.engine.parallel import torch_threads
from agentmerge.errors import CheckpointError, MergeError
from agentmerge.io.formats.checkpoint import Checkpoint, Readable, resolve_model_path
from agentmerge.io.formats.open import open_model, trainer_config_folder
from agentmerge.io.formats.tensorfile import TensorInfo
from agentmerge.io.guards.finite import check_finite, check_output_chunk
from agentmerge.io.guards.safety import check_output_target
from agentmerge.io.guards.strict_json import read_json_object
from agentmerge.io.guards.units import TOKENIZER_FILES
from agentmerge.io.output.atomic import atomic_output_dir
from agentmerge.io.output.shards import plan_shards
from agentmerge.io.output.writer import ShardWriter, copy_aux_files

CHUNK = 1 << 20
STATIC = ".static-merge"
HEAD_CHARS = 8 * MAX_TOKENS  # the first cut of a prompt's text (``_head``)


def moe_inputs(cfg: MoeConfig) -> list[str]:
    """Every folder the MoE reads (an output must be none of them, nor inside one)."""
    return [cfg.base, *(e.path for e in cfg.experts), *([cfg.static] if cfg.static else [])]


def base_family(cfg: MoeConfig) -> MoeNames:
    """The output family of the base (``mixtral``, ``qwen2_moe``, ``qwen3_moe``); unsupported bases fail here, first."""
    folder = trainer_config_folder(cfg.base) or resolve_model_path(cfg.base)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json; the MoE architecture is chosen from the base's")
    names = MoeNames(moe_family(read_json_object(folder / "config.json", "config.json"), folder))
    if cfg.shared_expert != "none" and not names.has_shared:
        make_plan({}, names, len(cfg.experts), cfg.shared_expert, cfg.shared_weight, None)  # raises the clear line
    return names


def build_moe(cfg: MoeConfig, out: str | Path, *, force: bool = False, quiet: bool = True) -> MoeResult:
    """Write the MoE of ``cfg`` at ``out`` (atomically; nothing is left behind on failure). Returns what it did."""
    t0 = time.perf_counter()
    target = Path(out)
    check_output_target(target, moe_inputs(cfg), force=force)
    names = base_family(cfg)
    with opened_inputs(cfg) as (base, agents), atomic_output_dir(target, force=force) as tmp:
        prompt_tokens(cfg, base)  # tokenizer, chat template and token ids checked before the static merge
        static_dir, static_record = _static_merge(cfg, tmp, quiet)
        with Checkpoint(static_dir) as static:
            check_static(static, base)
            result = _write(cfg, names, tmp, static, base, agents, quiet)
        if not cfg.static:
            shutil.rmtree(static_dir)
        result.seconds = time.perf_counter() - t0
        result.out_dir = target.resolve()
        (tmp / "merge.json").write_text(merge_record(cfg, result, static_record))
        (tmp / "README.md").write_text(model_card(cfg, result))
    return result


@contextlib.contextmanager
def opened_inputs(cfg: MoeConfig) -> Iterator[tuple[Readable, list[Readable]]]:
    """The base and the agents, opened and checked (``check_inputs``); closed on the way out."""
    base = open_model(cfg.base, None)
    agents: list[Readable] = []
    try:
        agents += [open_model(e.path, base) for e in cfg.experts]
        check_inputs(base, agents)
        yield base, agents
    finally:
        for a in agents:
            a.close()
        base.close()


def check_inputs(base: Readable, agents: list[Readable]) -> None:
    """The experts' MLP shapes first (the clearest line when they differ), then everything a merge checks."""
    check_mlp_shapes(base.tensors, [(str(a.path), a.tensors) for a in agents])
    check_compatible(base, agents)


def _static_merge(cfg: MoeConfig, tmp: Path, quiet: bool) -> tuple[Path, dict[str, Any] | None]:
    """The folder whose attention, embeddings and norms the MoE takes, and its merge.json (if it has one)."""
    if cfg.static:
        folder = resolve_model_path(cfg.static)
    else:
        from agentmerge.engine.merge import merge

        folder = tmp / STATIC
        merge(cfg.merge, folder, quiet=quiet)
    record = folder / "merge.json"
    return folder, read_json_object(record, "merge.json") if record.is_file() else None


def check_static(static: Readable, base: Readable) -> None:
    """A given static merge must be a model of the base's architecture (its vocabulary may have grown)."""
    missing = base.tensors.keys() ^ static.tensors.keys()
    if missing:
        raise MergeError(
            f"{static.path}: its tensors differ from the base's ({sorted(missing)[0]!r}); 'static' must be a merge "
            "of this base"
        )
    for name, info in base.tensors.items():
        other = static.tensors[name].shape
        if other != info.shape and (len(other) != 2 or other[1:] != info.shape[1:] or other[0] < info.shape[0]):
            raise MergeError(f"{static.path}: tensor {name!r} is {list(other)}, the base's {list(info.shape)}")


def _write(
    cfg: MoeConfig, names: MoeNames, tmp: Path, static: Checkpoint, base: Readable, agents: list[Readable], quiet: bool
) -> MoeResult:
    plan = make_plan(static.tensors, names, len(agents), cfg.shared_expert, cfg.shared_weight, None)
    check_planned([static, base, *agents], (s.tensor for s in plan.slots if s.tensor), "moe")
    gate = plan.layers[0].router
    assert gate is not None
    dense = _dense_config(static.folder)
    moe = moe_config(
        dense,
        names.family,
        len(agents),
        cfg.experts_per_token,
        shared_size(static.tensors, cfg.shared_expert),
        str(gate.dtype).removeprefix("torch."),
    )
    moe.save_pretrained(tmp)
    copy_aux_files(static.folder, tmp, ["generation_config.json", *TOKENIZER_FILES])
    tokens = tokenize(tmp, [e.prompts for e in cfg.experts], cfg.chat_template)  # as the output will read them
    check_token_ids(tokens, _embedding_rows(static.tensors), tmp)
    slots = [s.planned for s in plan.slots]
    writer = ShardWriter(tmp, plan_shards(slots, cfg.merge.shard_bytes), slots)
    try:
        routers = _layers(cfg, plan, static, base, agents, writer, tokens, moe, quiet)
    finally:
        writer.close()
    check_written(tmp, slots)
    experts = [
        {"name": e.name, "path": e.path, "prompts": len(e.prompts), "tokens": sum(len(t) for t in ids)}
        for e, ids in zip(cfg.experts, tokens, strict=True)
    ]
    return MoeResult(tmp, moe.architectures[0], experts, routers, plan.nbytes, 0.0, cfg.merge.method)


def _dense_config(folder: Path) -> Any:
    import transformers

    return transformers.AutoConfig.from_pretrained(folder)


def tokenize(folder: Path, prompts: Sequence[Sequence[str]], chat_template: bool) -> list[list[list[int]]]:
    """Each agent's prompts as token ids, with ``folder``'s tokenizer (in its chat template when asked).

    Only a prompt's first ``MAX_TOKENS`` tokens feed the router, so its text is cut first (``_head``): a
    megabyte line costs what its first few thousand characters do.
    """
    import transformers

    try:
        tok = transformers.AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}: no tokenizer to read the prompts with ({str(e).splitlines()[0]})") from None
    if chat_template and not getattr(tok, "chat_template", None):
        raise CheckpointError(
            f"{folder}: its tokenizer has no chat template; leave out --chat-template (chat_template: false) or "
            "add one to its tokenizer_config.json"
        )
    out = []
    for agent in prompts:
        ids = []
        for whole in agent:
            p = _head(lambda text: len(tok(text, add_special_tokens=False)["input_ids"]), whole)
            if chat_template:
                text = tok.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                ids.append(list(tok(text, add_special_tokens=False)["input_ids"])[:MAX_TOKENS])
            else:
                ids.append(list(tok(p)["input_ids"])[:MAX_TOKENS])
            if not ids[-1]:
                raise CheckpointError(f"prompt {p[:60]!r}: the tokenizer gives no tokens for it; remove it")
        out.append(ids)
    return out


def _head(count: Callable[[str], int], text: str) -> str:
    """The shortest cut ``text[:HEAD_CHARS * 2**k]`` with at least ``2 * MAX_TOKENS`` tokens (or all of ``text``).

    Its first ``MAX_TOKENS`` tokens are the whole text's: the cut only changes the tokens near its end.
    Tokenizing the cuts costs at most twice tokenizing the last one.
    """
    n = HEAD_CHARS
    while n < len(text) and count(text[:n]) < 2 * MAX_TOKENS:
        n *= 2
    return text[:n]


def check_token_ids(tokens: Sequence[Sequence[list[int]]], rows: int, folder: Path) -> None:
    """Every prompt token id is a row of the embedding (``rows`` of them); else one line, before any writing."""
    top = max((max(t) for agent in tokens for t in agent), default=-1)
    if top >= rows:
        raise CheckpointError(
            f"{folder}: its tokenizer gives token id {top} for a prompt, but the embedding has {rows} rows; "
            "the tokenizer files do not belong to these weights"
        )


def prompt_tokens(cfg: MoeConfig, base: Readable) -> list[list[list[int]]]:
    """The prompts' token ids from the folder whose tokenizer the output gets (``static``, else the base's),
    checked against its embedding rows: run before the static merge, so a bad prompt costs no merge."""
    folder = resolve_model_path(cfg.static) if cfg.static else base.folder
    tokens = tokenize(folder, [e.prompts for e in cfg.experts], cfg.chat_template)
    if cfg.static:
        with Checkpoint(folder) as static:
            check_token_ids(tokens, _embedding_rows(static.tensors), folder)
    else:
        check_token_ids(tokens, _embedding_rows(base.tensors), folder)
    return tokens


def _embedding_rows(tensors: Mapping[str, TensorInfo]) -> int:
    name = next((n for n in tensors if n.endswith("embed_tokens.weight")), None)
    return tensors[name].shape[0] if name is not None else 1 << 62


def _layers(
    cfg: MoeConfig,
    plan: MoePlan,
    static: Checkpoint,
    base: Readable,
    agents: list[Readable],
    writer: ShardWriter,
    tokens: list[list[list[int]]],
    moe: Any,
    quiet: bool,
) -> list[Router]:
    """Copy the outer tensors, then write and calibrate one layer at a time."""
    from tqdm import tqdm

    for slot in plan.outer:
        _copy(static, slot, writer)
    calibration = Calibration(tokens, _eager(moe), plan.names.family)
    embedding = next(s for s in plan.outer if s.name.endswith("embed_tokens.weight"))
    calibration.embed(lambda ids: _rows(static, embedding, ids))
    shared = base if cfg.shared_expert == "base" else static
    routers = []
    with torch_threads(max(1, cfg.merge.threads or torch.get_num_threads())):
        for layer in tqdm(plan.layers, desc="moe", unit="layer", disable=quiet):
            routers.append(_layer(cfg, layer, static, shared, agents, writer, calibration))
    return routers


def _eager(config: Any) -> Any:
    """A copy of the config that runs eager attention (the calibration passes its own causal mask)."""
    out = copy.deepcopy(config)
    out._attn_implementation = "eager"
    return out


def _layer(
    cfg: MoeConfig,
    layer: LayerPlan,
    static: Checkpoint,
    shared: Readable,
    agents: list[Readable],
    writer: ShardWriter,
    calibration: Calibration,
) -> Router:
    """One layer: static tensors, router, experts and shared expert written; the prompts moved through it."""
    weights = {s.name.removeprefix(layer.prefix): _put(writer, s, _read(static, s.tensor)) for s in layer.static}
    inputs = calibration.attend(layer.layer, weights)
    assert layer.router is not None
    router = router_rows(inputs, cfg.router_margin)
    rows = _put(writer, layer.router, router.rows)
    x = torch.cat(inputs)
    index, weight = route(x, rows, cfg.experts_per_token)
    out = torch.zeros_like(x)
    for e, slots in enumerate(layer.experts):
        proj = {s.tensor.split(".")[-2]: _put(writer, s, _read(agents[e], s.tensor)) for s in slots}
        share = (weight * (index == e)).sum(-1, keepdim=True)
        out += share * mlp(x, proj["gate_proj"], proj["up_proj"], proj["down_proj"], calibration.act)
    if layer.shared:
        out += _shared_expert(layer.shared, shared, writer, x, calibration)
    calibration.advance(list(torch.split(out, [len(i) for i in inputs])))
    return router


def _shared_expert(
    slots: list[Slot], source: Readable, writer: ShardWriter, x: torch.Tensor, calibration: Calibration
) -> torch.Tensor:
    """Write the shared expert and its gate; its output ``sigmoid(g . x) S(x)`` on the prompts' tokens."""
    values = {}
    for s in slots:
        read = _read(source, s.tensor) if s.source == "shared" else torch.zeros(s.shape)
        values[s.name.rsplit(".", 2)[-2]] = _put(writer, s, read)
    gate = values.pop("shared_expert_gate")
    if values["gate_proj"].numel() == 0:
        return torch.zeros_like(x)
    y = mlp(x, values["gate_proj"], values["up_proj"], values["down_proj"], calibration.act)
    return torch.sigmoid(x @ gate.T) * y


def _put(writer: ShardWriter, slot: Slot, values: torch.Tensor) -> torch.Tensor:
    """Write ``values * slot.scale`` in the slot's dtype; return them as written, in float32 and the slot's shape."""
    stored = (values.float() * slot.scale if slot.scale != 1.0 else values.float()).to(slot.dtype)
    check_output_chunk(slot.name, 0, stored)  # a router from broken calibration, a scale overflowing the dtype
    if stored.numel():
        writer.write(slot.name, 0, stored.reshape(-1))
    return stored.float().reshape(slot.shape)


def _read(source: Readable, tensor: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """A tensor (or elements ``start:stop``) of the static merge, an agent or the base, checked finite."""
    return check_finite(f"{source.path}: tensor {tensor!r}", source.read(tensor, start, stop), start)


def _copy(static: Checkpoint, slot: Slot, writer: ShardWriter) -> None:
    numel = static.tensors[slot.tensor].numel
    for start in range(0, numel, CHUNK):
        writer.write(slot.name, start, _read(static, slot.tensor, start, min(start + CHUNK, numel)).to(slot.dtype))


def _rows(static: Checkpoint, embedding: Slot, ids: torch.Tensor) -> torch.Tensor:
    """Embedding rows of ``ids`` as written, float32 ``[T, H]``."""
    width = embedding.shape[1]
    rows = {
        i: static.read(embedding.tensor, i * width, (i + 1) * width).to(embedding.dtype).float()
        for i in set(ids.tolist())
    }
    return torch.stack([rows[i] for i in ids.tolist()])
