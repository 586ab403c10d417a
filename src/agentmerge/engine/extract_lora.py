"""``agentmerge extract-lora MODEL --base BASE -o OUT (--rank R | --energy E)``: a model as a PEFT LoRA adapter.

MODEL (an agent, a merge, anything ``merge`` reads as a model) minus BASE, one tensor at a time:

- the weight of each linear layer whose ``Delta W`` is not zero becomes LoRA factors ``B @ A``, the truncated
  SVD at ``--rank`` or the smallest rank keeping ``--energy`` of the spectrum (``lowrank.py``, with the error
  bound); ``lora_alpha = r`` per module, so the scale is 1;
- every other changed tensor (embeddings, norms, biases) is saved whole (``extras="save"``: ``modules_to_save``
  and trained biases, so ``--energy 1.0`` gives MODEL back) or left out (``extras="skip"``: a plain LoRA that
  every server loads); which, and how large each left-out delta is, the report says;
- tensors whose delta is zero are skipped.

One module's ``Delta W`` and its SVD are in memory at a time (about 3x the module's float32 size); the factors
go to a scratch file in the hidden output folder and are copied into ``adapter_model.safetensors`` at the end,
whose header needs every rank. The folder (``adapter_config.json``, ``adapter_model.safetensors``,
``extraction.json`` with each module's rank and relative error, ``README.md``) appears atomically.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from agentmerge._version import __version__
from agentmerge.engine.inputs import check_compatible
from agentmerge.engine.provenance import input_ref
from agentmerge.errors import CheckpointError, ConfigError, MergeError
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.open import open_model
from agentmerge.io.formats.peft_layout import (
    ADAPTER_FILE,
    PREFIX,
    Layout,
    Role,
    adapter_config,
    adapter_key,
    lora_keys,
    model_layout,
    write_adapter_config,
)
from agentmerge.io.formats.tensorfile import dtype_from_name
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.finite import check_finite, check_output_chunk
from agentmerge.io.guards.safety import check_output_target
from agentmerge.io.output.atomic import atomic_output_dir
from agentmerge.io.output.shards import PlannedTensor, plan_shards
from agentmerge.io.output.writer import ShardWriter
from agentmerge.methods.lowrank import factorize, relative_error

CHUNK = 1 << 20
EXTRAS = ("save", "skip")


@dataclass(frozen=True)
class ModuleRecord:
    """One LoRA module: its rank and how much of its ``Delta W`` the factors keep."""

    module: str
    shape: tuple[int, ...]
    rank: int
    max_rank: int
    energy: float  # share of sum s^2 kept
    error: float  # relative Frobenius error from the spectrum (Eckart-Young)
    error_stored: float  # the same, measured with the factors as written (their dtype's rounding included)


@dataclass(frozen=True)
class ExtraRecord:
    """A changed tensor that is not a LoRA target: saved whole or left out."""

    tensor: str
    module_type: str
    action: str  # saved | left out
    delta: float  # ||Delta|| / ||base||


@dataclass
class Extraction:
    """What ``extract_lora`` wrote."""

    out_dir: Path
    model: str
    base: str
    options: dict[str, Any]
    modules: list[ModuleRecord] = field(default_factory=list)
    extras: list[ExtraRecord] = field(default_factory=list)
    zero: list[str] = field(default_factory=list)  # tensors whose delta is zero (skipped)
    adapter_bytes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["out_dir"] = str(self.out_dir)
        out["agentmerge_version"] = __version__
        return out

    def summary(self) -> str:
        return summary_text(self)


def check_options(rank: int | None, energy: float | None, extras: str, dtype: str) -> torch.dtype:
    """Exactly one of rank / energy, in range; extras save|skip; a floating dtype. Returns the dtype."""
    if (rank is None) == (energy is None):
        raise ConfigError("extract-lora: give exactly one of --rank R or --energy E")
    if rank is not None and (isinstance(rank, bool) or rank < 1):
        raise ConfigError(f"--rank must be a positive integer (got {rank})")
    if energy is not None and not 0.0 < energy <= 1.0:
        raise ConfigError(f"--energy must lie in (0, 1] (got {energy}); 1.0 keeps every singular value")
    if extras not in EXTRAS:
        raise ConfigError(f"--extras must be one of {', '.join(EXTRAS)} (got {extras!r})")
    try:
        out = dtype_from_name(dtype)
    except ValueError:
        out = torch.int8
    if not out.is_floating_point:
        raise ConfigError(f"--dtype {dtype}: use float32, bfloat16 or float16")
    return out


def extract_lora(
    model: str | Path,
    base: str | Path,
    out: str | Path,
    *,
    rank: int | None = None,
    energy: float | None = None,
    extras: str = "save",
    dtype: str = "float32",
    quiet: bool = True,
) -> Extraction:
    """Write ``model - base`` as a PEFT LoRA adapter at ``out`` (module docstring). Returns the per-module record."""
    t0 = time.perf_counter()
    factor_dtype = check_options(rank, energy, extras, dtype)
    target = Path(out)
    check_output_target(target, [str(model), str(base)])
    options = {"rank": rank, "energy": energy, "extras": extras, "dtype": str(factor_dtype).removeprefix("torch.")}
    base_r = open_model(str(base), None)
    try:
        model_r = open_model(str(model), base_r)
        try:
            check_compatible(base_r, [model_r])
            layout = model_layout(base_r.folder, list(base_r.tensors))
            result = Extraction(target.resolve(), input_ref(str(model)), input_ref(str(base)), options)
            with atomic_output_dir(target) as tmp:
                scratch = Scratch(tmp / ".factors.bin")
                try:
                    _scan(base_r, model_r, layout, result, scratch, factor_dtype, quiet)
                    _write(tmp, result, layout, model_r, scratch)
                finally:
                    scratch.close()
                result.seconds = time.perf_counter() - t0
                (tmp / "extraction.json").write_text(_json(result.to_dict()))
                (tmp / "README.md").write_text(adapter_card(result))
        finally:
            model_r.close()
    finally:
        base_r.close()
    return result


# --------------------------------------------------------------------------- the scan: deltas, SVDs, decisions


def _scan(
    base: Readable,
    model: Readable,
    layout: Layout,
    result: Extraction,
    scratch: Scratch,
    dtype: torch.dtype,
    quiet: bool,
) -> None:
    """One tensor at a time: linear deltas factorised into ``scratch``, other changed tensors recorded."""
    from tqdm import tqdm

    rank, energy = result.options["rank"], result.options["energy"]
    for name in tqdm(list(base.tensors), desc="extract-lora", unit="tensor", disable=quiet):
        role = layout.roles[name]
        if not base.tensors[name].dtype.is_floating_point:
            _same_exactly(base, model, name)
            continue
        if role.kind != "linear" or len(base.tensors[name].shape) != 2:
            delta, norm = _delta_norms(base, model, name)
            if delta > 0:
                _extra(role, delta / norm if norm else math.inf, result)
            else:
                result.zero.append(name)
            continue
        shape = base.tensors[name].shape
        delta_w = (_read(model, name).float() - _read(base, name).float()).view(shape)
        check_finite(f"{model.path}: tensor {name!r} minus the base's (overflows float32)", delta_w)
        if not bool(delta_w.any()):
            result.zero.append(name)
            continue
        f = factorize(delta_w, rank, energy)
        a, b = f.a.to(dtype), f.b.to(dtype)
        check_output_chunk(f"{name} (LoRA factor A)", 0, a)  # factors overflowing --dtype are not written
        check_output_chunk(f"{name} (LoRA factor B)", 0, b)
        error_stored = relative_error(delta_w, a, b)
        key_a, key_b = lora_keys(role.module)
        scratch.put(key_a, a)
        scratch.put(key_b, b)
        result.modules.append(
            ModuleRecord(role.module, tuple(delta_w.shape), f.rank, f.max_rank, f.energy, f.error, error_stored)
        )
    if not result.modules:
        raise MergeError(
            f"{model.path}: no linear layer differs from {base.path}; an adapter needs at least one (nothing written)"
        )


def _extra(role: Role, delta: float, result: Extraction) -> None:
    if role.kind == "unknown":
        raise CheckpointError(
            f"tensor {role.tensor!r} changed but is no parameter of the model transformers builds from config.json; "
            "a PEFT adapter cannot hold it (nothing written)"
        )
    action = "saved" if result.options["extras"] == "save" else "left out"
    kind = f"{role.module_type} bias" if role.kind == "bias" else role.module_type
    result.extras.append(ExtraRecord(role.tensor, kind, action, delta))


def _delta_norms(base: Readable, model: Readable, name: str) -> tuple[float, float]:
    """``(||model - base||, ||base||)`` of one tensor, chunk by chunk, in float64 (no overflow of the squares)."""
    numel = base.tensors[name].numel
    delta = norm = 0.0
    for start in range(0, numel, CHUNK):
        stop = min(start + CHUNK, numel)
        b = _read(base, name, start, stop).double()
        delta += float((_read(model, name, start, stop).double() - b).square().sum())
        norm += float(b.square().sum())
    return math.sqrt(delta), math.sqrt(norm)


def _read(reader: Readable, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Elements of a tensor of the model or the base, under the finiteness rule ``merge`` reads them with."""
    return check_finite(f"{reader.path}: tensor {name!r}", reader.read(name, start, stop), start)


def _same_exactly(base: Readable, model: Readable, name: str) -> None:
    if not torch.equal(base.read(name), model.read(name)):
        raise MergeError(
            f"{model.path}: integer tensor {name!r} differs from the base's; a LoRA adapter cannot hold it "
            "(nothing written)"
        )


# --------------------------------------------------------------------------- the adapter folder


class Scratch:
    """Tensors appended to one file and read back whole: the factors, until the adapter's header can be planned."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.end = 0
        self.where: dict[str, tuple[int, torch.dtype, tuple[int, ...]]] = {}

    def put(self, key: str, t: torch.Tensor) -> None:
        # flattened first: a [out, 1] factor is "contiguous" with any stride on its size-1 dimension, and a
        # dtype view needs the last stride to be 1
        data = t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
        written = 0
        while written < len(data):
            written += os.pwrite(self.fd, data[written:], self.end + written)
        self.where[key] = (self.end, t.dtype, tuple(t.shape))
        self.end += len(data)

    def get(self, key: str) -> torch.Tensor:
        offset, dtype, shape = self.where[key]
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        data = bytearray(os.pread(self.fd, size, offset))
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.path.unlink(missing_ok=True)


def _write(tmp: Path, result: Extraction, layout: Layout, model: Readable, scratch: Scratch) -> None:
    """``adapter_model.safetensors`` (factors, then the saved tensors) and ``adapter_config.json``."""
    targets = {m.module for m in result.modules}
    saved = [layout.roles[e.tensor] for e in result.extras if e.action == "saved"]
    copies = _saved_tensors(saved, layout, model, targets)
    planned = [PlannedTensor(k, dt, shape) for k, (_, dt, shape) in scratch.where.items()]
    planned += [PlannedTensor(k, model.tensors[n].dtype, model.tensors[n].shape) for k, n in copies.items()]
    plan = replace(plan_shards(planned, 1 << 62)[0], file_name=ADAPTER_FILE)
    writer = ShardWriter(tmp, [plan], planned)
    try:
        for key in scratch.where:
            writer.write(key, 0, scratch.get(key).reshape(-1))
        for key, name in copies.items():
            _copy(model, name, key, writer)
    finally:
        writer.close()
    result.adapter_bytes = plan.size
    modules = sorted({r.module for r in saved if r.kind == "module"})
    tied = layout.tied_head is not None and PREFIX + layout.tied_head in copies
    biases = any(r.kind == "bias" for r in saved)
    cfg = adapter_config(result.base, {m.module: m.rank for m in result.modules}, modules, biases, tied)
    write_adapter_config(tmp, cfg)


def _saved_tensors(saved: list[Role], layout: Layout, model: Readable, targets: set[str]) -> dict[str, str]:
    """Adapter key -> the model tensor it holds: every stored tensor of each module saved whole, each changed
    bias, and a tied head's copy of a saved input embedding."""
    modules = {r.module for r in saved if r.kind == "module"}
    out = {
        adapter_key(role, targets): name
        for name, role in layout.roles.items()
        if role.module in modules and role.kind == "module" and name in model.tensors
    }
    out.update({adapter_key(r, targets): r.tensor for r in saved if r.kind == "bias"})
    if layout.tied_head and layout.input_embedding in modules:
        out[PREFIX + layout.tied_head] = f"{layout.input_embedding}.weight"
    return out


def _copy(model: Readable, name: str, key: str, writer: ShardWriter) -> None:
    numel = model.tensors[name].numel
    for start in range(0, numel, CHUNK):
        writer.write(key, start, model.read(name, start, min(start + CHUNK, numel)))


# --------------------------------------------------------------------------- reports


def _json(data: dict[str, Any]) -> str:
    return jsontext.dumps(data, indent=2) + "\n"


def summary_text(r: Extraction) -> str:
    """The stderr summary: ranks, errors, what was saved whole or left out, sizes."""
    ranks = [m.rank for m in r.modules]
    capped = sum(m.rank == m.max_rank for m in r.modules)
    worst = max(r.modules, key=lambda m: m.error_stored)
    how = f"rank {r.options['rank']}" if r.options["rank"] is not None else f"energy {r.options['energy']}"
    lines = [
        f"extract-lora: {len(r.modules)} LoRA modules at {how}: ranks {min(ranks)}-{max(ranks)} "
        f"(median {statistics.median(ranks):g}; {capped} at full rank), {len(r.zero)} unchanged tensors skipped",
        f"  relative error ||dW - BA|| / ||dW||: median {statistics.median(m.error_stored for m in r.modules):.4f}, "
        f"max {worst.error_stored:.4f} ({worst.module}); energy kept: median "
        f"{statistics.median(m.energy for m in r.modules):.4f}",
    ]
    saved = [e for e in r.extras if e.action == "saved"]
    left = [e for e in r.extras if e.action == "left out"]
    if saved:
        lines.append(f"  saved whole (modules_to_save, biases): {len(saved)} tensors ({_kinds(saved)})")
    if left:
        big = max(left, key=lambda e: e.delta)
        lines.append(
            f"  left out (--extras skip): {len(left)} changed tensors ({_kinds(left)}); largest relative delta "
            f"{big.delta:.2e} ({big.tensor})"
        )
    lines.append(f"  adapter: {r.adapter_bytes / 1e6:.2f} MB ({r.options['dtype']} factors) in {r.out_dir}")
    return "\n".join(lines)


def _kinds(extras: list[ExtraRecord]) -> str:
    counts: dict[str, int] = {}
    for e in extras:
        counts[e.module_type] = counts.get(e.module_type, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def adapter_card(r: Extraction) -> str:
    """README.md of the adapter folder."""
    how = f"rank {r.options['rank']}" if r.options["rank"] is not None else f"energy {r.options['energy']}"
    saved = [e for e in r.extras if e.action == "saved"]
    left = [e for e in r.extras if e.action == "left out"]
    return "\n".join(
        [
            "---",
            "library_name: peft",
            "tags: [agentmerge, lora, extract-lora]",
            "---",
            "",
            f"# LoRA adapter extracted from {Path(r.model).name}",
            "",
            f"`{r.model}` minus its base `{r.base}`, written by `agentmerge extract-lora` ({how}): each changed",
            "linear layer's delta as the truncated SVD `B @ A` (lora_alpha = r, scale 1).",
            f"{len(r.modules)} LoRA modules, {len(saved)} tensors saved whole, {len(left)} changed tensors left out, "
            f"{len(r.zero)} unchanged.",
            "Per-module ranks and relative errors: `extraction.json`.",
            "",
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM",
            f'model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("{r.base}"), "{r.out_dir}")',
            "```",
            "",
        ]
    )
