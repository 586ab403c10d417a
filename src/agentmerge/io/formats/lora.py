"""PEFT LoRA adapters as models: ``theta_i = host + Delta W``, computed chunk by chunk of rows, never whole.

An adapter folder (``adapter_config.json`` and ``adapter_model.safetensors``, or ``adapter_model.bin``
read with ``weights_only``) becomes a model the engine reads like a checkpoint: every tensor of its host
(the base, or ``MODEL`` in mergekit's ``MODEL+ADAPTER`` form), plus the adapter's update on its target
modules, in float32. Per target module with ``lora_A`` ``[r, in]`` and ``lora_B`` ``[out, r]``:

    Delta W = s * B @ A                       [out, in]   linear layers
    Delta W = s * (B @ A)^T                   [in, out]   fan_in_fan_out (GPT-2 Conv1D), embeddings
    s       = alpha / r   (alpha / sqrt(r) with use_rslora; r and alpha per module from rank/alpha_pattern)

A read of elements ``start:stop`` of a target tensor multiplies only the rows those elements lie in
(``B[rows] @ A``), so memory stays bounded by the chunk. Adapter tensors that name a host tensor with its
shape (``modules_to_save``, trained biases, the ``base_layer`` peft saves of a targeted embedding) replace
it whole, the module's update then added on top (a ``lm_head.weight`` copy of a tied embedding is ignored: the
host reads its head from the embedding). DoRA, layer replication, convolution and
other adapter types are refused by name.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.checkpoint import Checkpoint, Readable, resolve_model_path
from agentmerge.io.formats.localpath import ADAPTER_CONFIG, is_adapter
from agentmerge.io.formats.lora_config import LoraSettings, read_lora_config
from agentmerge.io.formats.tensorfile import TensorInfo
from agentmerge.io.guards.bounded import check_reference, regular_file_size
from agentmerge.io.guards.finite import check_derived_values

_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B)(?:\.weight)?$")


def split_model_plus_adapter(ref: str) -> tuple[str, str] | None:
    """mergekit's ``MODEL+ADAPTER``: ``(model, adapter)`` when ``ref`` is not itself a path and the adapter exists."""
    check_reference(ref)
    if Path(ref).expanduser().exists() or "+" not in ref:
        return None
    model, _, adapter = ref.rpartition("+")
    return (model, adapter) if model and is_adapter(adapter) else None


@dataclass(frozen=True)
class LoraModule:
    """One target tensor's update: its adapter tensors and scale."""

    target: str  # the host tensor, e.g. model.layers.0.self_attn.q_proj.weight
    a: str  # adapter tensor names
    b: str
    scale: float
    transposed: bool  # Delta W = s (B A)^T: fan_in_fan_out layers and embeddings


class LoraModel:
    """An adapter applied to a host checkpoint, read like a ``Checkpoint`` (its floating tensors in float32)."""

    def __init__(self, adapter: str | Path, host: Readable, *, owns_host: bool = False) -> None:
        self.ref = str(adapter)
        self.path = resolve_model_path(adapter)
        self.folder = self.path
        self.host, self._owns_host = host, owns_host
        self.config, self.settings = read_lora_config(self.path)
        _check_base(self.path, self.config, host)
        self.adapter = _open_weights(self.path)
        try:
            self.modules, self.replaced = _plan(self.adapter, host, self.settings, self.path)
        except BaseException:
            self.adapter.close()
            raise
        self.tensors = {
            n: TensorInfo(n, torch.float32, i.shape, i.file, i.offset) if i.dtype.is_floating_point else i
            for n, i in host.tensors.items()
        }
        self._a: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> LoraModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.adapter.close()
        if self._owns_host:
            self.host.close()

    @property
    def weight_files(self) -> list[Path]:
        """The files that decide its values: the adapter's weights and ``adapter_config.json`` (alpha, r, patterns)
        and, when it brought its own host model, the host's (the caches key by them, merge.json lists them)."""
        own = [*self.adapter.weight_files, self.path / ADAPTER_CONFIG]
        return own + (self.host.weight_files if self._owns_host else [])

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Elements ``[start, stop)`` of tensor ``name`` of the adapted model: float32 for floating tensors."""
        stop = self.tensors[name].numel if stop is None else stop
        if not self.tensors[name].dtype.is_floating_point:
            return self.host.read(name, start, stop)
        source = self.replaced.get(name)
        values = (self.adapter.read(source, start, stop) if source else self.host.read(name, start, stop)).float()
        module = self.modules.get(name)
        if module is not None:
            values.add_(self._delta(module, start, stop))
        if source or module is not None:  # what the adapter brings or derives: within the bound of a weight
            check_derived_values(f"{self.path}: tensor {name!r} (adapted)", start, values)
        return values

    def read_into(self, name: str, start: int, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(self.read(name, start, start + out.numel()))

    def _delta(self, m: LoraModule, start: int, stop: int) -> torch.Tensor:
        """``[stop - start]`` float32: the update of the target's elements ``start:stop``, from their rows only."""
        shape = self.tensors[m.target].shape
        width = shape[-1] if len(shape) > 1 else 1
        r0, r1 = start // width, -(-stop // width)
        a = self._whole_a(m)  # [r, in] (or [r, rows] when transposed)
        r = a.shape[0]
        if m.transposed:  # rows of Delta W^T are columns of A
            b = self.adapter.read(m.b).float().view(-1, r)  # [width, r]
            rows = a[:, r0:r1].T @ b.T
        else:
            b = self.adapter.read(m.b, r0 * r, r1 * r).float().view(r1 - r0, r)
            rows = b @ a
        rows.mul_(m.scale)
        return rows.reshape(-1)[start - r0 * width : stop - r0 * width]

    def _whole_a(self, m: LoraModule) -> torch.Tensor:
        with self._lock:
            if m.a not in self._a:
                info = self.adapter.tensors[m.a]
                self._a[m.a] = self.adapter.read(m.a).float().view(info.shape[0], -1)
            return self._a[m.a]


class _PickledAdapter:
    """``adapter_model.bin`` read with ``weights_only=True`` (plain tensors only), with ``Checkpoint``'s reads."""

    def __init__(self, path: Path) -> None:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # code in the pickle, or a corrupt file
            raise CheckpointError(
                f"{path}: refused to load ({type(e).__name__}); only plain tensor pickles are read"
            ) from None
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise CheckpointError(f"{path}: expected a state dict of tensors")
        self.values = {str(k): t.contiguous() for k, t in state.items()}
        self.tensors = {k: TensorInfo(k, t.dtype, tuple(t.shape), path, 0) for k, t in self.values.items()}
        self.path = path

    @property
    def weight_files(self) -> list[Path]:
        return [self.path]

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        out: torch.Tensor = self.values[name].reshape(-1)[start:stop].clone()
        return out

    def close(self) -> None:
        self.values.clear()


def _open_weights(folder: Path) -> Checkpoint | _PickledAdapter:
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (folder / name).exists():
            regular_file_size(folder / name, "adapter weights file")  # a FIFO or a device would never end
    if (folder / "adapter_model.safetensors").is_file():
        return Checkpoint(folder / "adapter_model.safetensors")
    if (folder / "adapter_model.bin").is_file():
        return _PickledAdapter(folder / "adapter_model.bin")
    raise CheckpointError(f"{folder}: adapter folder without adapter_model.safetensors or adapter_model.bin")


def _check_base(folder: Path, cfg: Mapping[str, Any], host: Readable) -> None:
    """An adapter whose ``base_model_name_or_path`` is a local folder must be applied to that very folder."""
    named = cfg.get("base_model_name_or_path")
    if not isinstance(named, str) or not named:
        return
    try:
        local = Path(named).expanduser()
        elsewhere = local.is_dir() and local.resolve() != host.folder.resolve()
    except (OSError, ValueError, RuntimeError):  # a name no file system can hold (100k characters, a NUL): no folder
        return
    if elsewhere:
        raise CheckpointError(
            f"{folder}: this adapter was trained on {named}, not on {host.folder}; pass that base (--base {named})"
        )


def _plan(
    adapter: Any, host: Readable, cfg: LoraSettings, folder: Path
) -> tuple[dict[str, LoraModule], dict[str, str]]:
    """``({target tensor: LoraModule}, {host tensor: adapter tensor replacing it})``; anything else is refused."""
    parts: dict[str, dict[str, str]] = {}
    replaced: dict[str, str] = {}
    for key, info in adapter.tensors.items():
        name = key.removeprefix(_PREFIX).replace(".base_layer.", ".")  # peft saves targeted embeddings whole
        m = _LORA_KEY.match(name)
        if m:
            parts.setdefault(m["module"], {})[m["part"]] = key
        elif name in host.tensors and host.tensors[name].shape == info.shape:
            replaced[name] = key
        elif name == "lm_head.weight" and name not in host.tensors:
            continue  # peft's copy of a tied head (ensure_weight_tying): the host reads it from the embedding
        else:
            raise CheckpointError(f"{folder}: adapter tensor {key!r} matches no tensor of the base model")
    modules = {}
    for module, found in parts.items():
        modules[f"{module}.weight"] = _module(module, found, adapter, host, cfg, folder)
    return modules, replaced


def _module(
    module: str, found: dict[str, str], adapter: Any, host: Readable, cfg: LoraSettings, folder: Path
) -> LoraModule:
    """One target's update, shapes checked: A ``[r, X]``, B ``[Y, r]``, target ``[Y, X]`` (``[X, Y]`` transposed)."""
    embedding = "lora_embedding_A" in found or "lora_embedding_B" in found
    a_key, b_key = ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A", "lora_B")
    if a_key not in found or b_key not in found:
        raise CheckpointError(f"{folder}: module {module!r} has only one of {a_key}, {b_key}")
    target = f"{module}.weight"
    if target not in host.tensors:
        raise CheckpointError(f"{folder}: LoRA module {module!r} targets {target!r}, which the base does not have")
    a, b, shape = adapter.tensors[found[a_key]], adapter.tensors[found[b_key]], host.tensors[target].shape
    transposed = embedding or cfg.fan_in_fan_out
    want = (b.shape[0], a.shape[-1]) if not transposed else (a.shape[-1], b.shape[0])
    ok = len(a.shape) == 2 and len(b.shape) == 2 and a.shape[0] == b.shape[1] and tuple(shape) == want
    if not ok or not (a.dtype.is_floating_point and b.dtype.is_floating_point):
        raise CheckpointError(
            f"{folder}: {module!r}: {a_key} {list(a.shape)} and {b_key} {list(b.shape)} do not fit the base's "
            f"{target!r} {list(shape)} (convolutions and other layer types are not supported)"
        )
    r = cfg.rank_and_alpha(module)[0]
    if a.shape[0] != r:
        raise CheckpointError(
            f"{cfg.file}: r of module {module!r} is {r} (r or rank_pattern), but its {a_key} has rank "
            f"{a.shape[0]}; the config does not belong to these weights (peft refuses it too)"
        )
    return LoraModule(target, found[a_key], found[b_key], cfg.scale(module), transposed)
