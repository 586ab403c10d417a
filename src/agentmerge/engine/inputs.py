"""The opened inputs of a merge: the base (or reference) and the models, checked to be mergeable, read chunk by chunk.

``Inputs`` opens every input through one format switch (``io.formats.open.open_model``: safetensors folders and
Hub ids, verl / DCP trainer checkpoints, GGUF, LoRA adapters and mergekit's ``MODEL+ADAPTER``), checks them against the
reference (``check_compatible``) and reads any element range of any tensor from all of them: float32 and
checked finite (``read``), or as stored into reused per-thread buffers (``read_stored``, ``Scratch``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence

import torch

from agentmerge.config.schema import MergeConfig
from agentmerge.errors import MergeError
from agentmerge.io.formats.checkpoint import Checkpoint, Readable
from agentmerge.io.formats.open import open_model, open_weights
from agentmerge.io.formats.roles import check_fisher_role
from agentmerge.io.formats.tensorfile import TensorInfo
from agentmerge.io.formats.vocab import VocabPlan, plan_vocab
from agentmerge.io.guards.finite import all_finite, check_derived_values, check_finite
from agentmerge.io.guards.strict_json import read_json_object


class Inputs:
    """The opened base (or reference) and models, checked to be mergeable, with chunk reads."""

    def __init__(
        self,
        base: str | None,
        models: Sequence[str],
        *,
        extras: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.models: list[Readable] = []
        self.extras: dict[str, list[Checkpoint]] = {}  # per-model extra tensors, e.g. "fisher"
        self.base = open_weights(base) if base is not None else None
        self.vocab = VocabPlan()
        try:
            self.models = [open_model(m, self.base) for m in models]
            for c in self.checkpoints:
                if isinstance(c, Checkpoint):
                    check_fisher_role(c, fisher=False)
            self.vocab = plan_vocab(self.reference, self.models)
            check_compatible(self.reference, self.models, resized=self.vocab.tensors.keys())
            for kind, paths in (extras or {}).items():
                self.extras[kind] = []
                for path in paths:
                    self.extras[kind].append(Checkpoint(path))
                    check_fisher_role(self.extras[kind][-1], fisher=kind == "fisher")
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_merge(cls, cfg: MergeConfig) -> Inputs:
        """The inputs of a merge configuration, with the extra per-model tensors its method reads (e.g. Fisher)."""
        extras = {kind: [getattr(m, kind) for m in cfg.models] for kind in cfg.spec.model_inputs}
        models = [m.path for m in cfg.models]
        return cls(cfg.base, models, extras=extras)

    @property
    def checkpoints(self) -> list[Readable]:
        """The reference and the models, in that order."""
        return [self.reference, *self.models]

    @property
    def reference(self) -> Readable:
        """The checkpoint task vectors are taken against: the base, else the first model."""
        return self.base if self.base is not None else self.models[0]

    def close(self) -> None:
        for c in [self.base, *self.models, *(e for group in self.extras.values() for e in group)]:
            if c is not None:
                c.close()

    def check_extras(self, names: Sequence[str]) -> None:
        """Every extra checkpoint holds each of ``names`` with its model's shape, else ``MergeError``."""
        for kind, group in self.extras.items():
            for ckpt, model in zip(group, self.models, strict=True):
                for name in names:
                    info = ckpt.tensors.get(name)
                    want = model.tensors[name].shape
                    if info is None or info.shape != want:
                        got = "lacks it" if info is None else f"has shape {list(info.shape)}"
                        raise MergeError(
                            f"{ckpt.path}: {kind} tensor {name!r} {got}, the model has shape {list(want)} "
                            f"(recompute it for this model, or exclude the tensor)"
                        )

    def read_extras(self, name: str, start: int, stop: int) -> dict[str, torch.Tensor]:
        """``{kind: [N, E] float32}`` extra per-model values of elements ``start:stop`` of ``name``."""
        out = {}
        for kind, group in self.extras.items():
            values = torch.empty(len(group), stop - start)
            for i, ckpt in enumerate(group):
                values[i] = ckpt.read(name, start, stop)
            if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
                raise MergeError(f"{kind} tensor {name!r}: values must be finite and non-negative")
            out[kind] = values
        return out

    def read(self, name: str, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``([E], [N, E])`` float32: reference and model values of elements ``start:stop`` of ``name``."""
        ref = self.reference.read(name, start, stop).float()
        models = torch.empty(len(self.models), stop - start)
        for i, m in enumerate(self.models):
            models[i] = m.read(name, start, stop)
        if not (all_finite(ref) and all_finite(models)):
            _check_finite(name, start, ref, models, self)
        return ref, models

    def read_added(self, name: str, adders: Sequence[int], start: int, stop: int) -> torch.Tensor:
        """``[A, E]`` float32: elements ``start:stop`` of ``name`` in the models that added vocabulary rows."""
        values = torch.empty(len(adders), stop - start)
        for row, i in enumerate(adders):
            values[row] = self.models[i].read(name, start, stop)
            check_derived_values(f"{self.models[i].path}: tensor {name!r} (added vocabulary rows)", start, values[row])
        return values

    def read_stored(
        self, name: str, start: int, stop: int, scratch: Scratch | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``([E], [N, E])`` as stored (no conversion, no finiteness check); models in float32 if dtypes differ.

        With ``scratch`` the values land in this thread's reused buffers (valid until its next read).
        """
        scratch = scratch or Scratch()
        e = stop - start
        ref = self.reference.read_into(name, start, scratch.get("ref", e, self.reference.tensors[name].dtype))
        dtypes = {m.tensors[name].dtype for m in self.models}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        models = scratch.get("models", len(self.models) * e, dtype).view(len(self.models), e)
        for i, m in enumerate(self.models):
            if m.tensors[name].dtype == dtype:
                m.read_into(name, start, models[i])
            else:
                models[i] = m.read(name, start, stop)
        return ref, models


class Scratch(threading.local):
    """Per-thread buffers reused from chunk to chunk: no allocation (and no page faults) per chunk."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat ``[numel]`` tensor of ``dtype`` over this thread's buffer ``key`` (grown when too small)."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < nbytes:
            self.buffers[key] = buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        return buf[:nbytes].view(dtype)


def _check_finite(name: str, start: int, ref: torch.Tensor, models: torch.Tensor, inputs: Inputs) -> None:
    for ckpt, values in zip(inputs.checkpoints, [ref, *models], strict=True):
        check_finite(f"{ckpt.path}: tensor {name!r}", values, start, MergeError)


def check_compatible(
    ref: Readable,
    models: Sequence[Readable],
    resized: Collection[str] = (),
) -> None:
    """Same architecture, tensor names and shapes, and dtypes of the same kind; else a ``MergeError``.

    Floating tensors may differ in dtype (a bf16 base with fp32 agents is how verl and ToolRL release them);
    task vectors are float32 either way.
    The vocabulary tensors in ``resized`` may have more rows (``vocab.plan_vocab`` checked them).
    """
    arch = _architecture(ref)
    for m in models:
        other = _architecture(m)
        if arch and other and arch != other:
            raise MergeError(f"{m.path}: architecture {other} differs from {ref.path}'s {arch}")
        missing, extra = ref.tensors.keys() - m.tensors.keys(), m.tensors.keys() - ref.tensors.keys()
        if missing or extra:
            what = f"lacks {sorted(missing)[0]!r}" if missing else f"has extra tensor {sorted(extra)[0]!r}"
            raise MergeError(
                f"{m.path}: tensor sets differ from {ref.path} ({what}; {len(missing)} missing, {len(extra)} extra); "
                "models must share the base's architecture"
            )
        for name, info in ref.tensors.items():
            _check_tensor(ref, m, info, m.tensors[name], name in resized)


def _check_tensor(ref: Readable, m: Readable, a: TensorInfo, b: TensorInfo, resized: bool = False) -> None:
    if a.shape != b.shape and not resized:
        raise MergeError(
            f"{m.path}: tensor {a.name!r} has shape {list(b.shape)} but {ref.path} has {list(a.shape)} "
            "(only vocabulary tensors, embedding and lm_head with config.json vocab_size rows, may grow; "
            "merge models with this tensor's shape)"
        )
    floating = a.dtype.is_floating_point and b.dtype.is_floating_point  # bf16 base, fp32 agents: a normal case
    if a.dtype != b.dtype and not floating:
        raise MergeError(
            f"{m.path}: tensor {a.name!r} is {b.dtype} but {ref.path} stores it as {a.dtype}; integer and "
            "boolean tensors must match the base exactly (convert the checkpoint)"
        )


def _architecture(c: Readable) -> tuple[str, ...] | None:
    cfg = c.folder / "config.json"
    if not cfg.exists():
        return None
    data = read_json_object(cfg, "config.json")
    arch = data.get("architectures") or [data.get("model_type")]
    arch = arch if isinstance(arch, list) else [arch]
    return tuple(str(a) for a in arch) if any(arch) else None
