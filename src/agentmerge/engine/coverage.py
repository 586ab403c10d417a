"""Every tensor of every input reaches the output, or the merge fails naming it (never a silent drop).

Tools that map tensors through per-architecture name tables lose whatever the table does not know (a vision
tower, a Mamba layer's ``A_log``, a new norm). agentmerge plans by the names the inputs hold, so nothing should
be lost; this module proves it twice, so that a bug anywhere between the inputs and the written folder fails
loudly instead:

- ``check_planned``: before any weight is read, the union of the tensor names of the base and every model
  (the set ``U``) against the tensors the plan reads to make its output (``P``): ``U - P`` must be empty.
  No rule of a merge removes a tensor: ``exclude`` copies the base's tensor unchanged, so it is in ``P``.
- ``check_written``: after the shards are written, before the folder is renamed into place, the names, shapes
  and dtypes in the written safetensors headers must be exactly the planned ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from agentmerge.errors import MergeError
from agentmerge.io.formats.checkpoint import Checkpoint, Readable
from agentmerge.io.output.shards import PlannedTensor


def check_planned(inputs: Sequence[Readable], planned: Iterable[str], what: str = "merge") -> None:
    """``MergeError`` naming the first input tensor (sorted) that no output tensor carries, and whose input it is."""
    out = set(planned)
    for ckpt in inputs:
        lost = sorted(set(ckpt.tensors) - out)
        if lost:
            raise MergeError(
                f"tensor {lost[0]!r} of {ckpt.path} would be missing from the {what} output "
                f"({len(lost)} tensor(s) in all); agentmerge never drops a tensor silently, so nothing was "
                "written: please report this with the model's config.json"
            )


def check_written(folder: Path, planned: Sequence[PlannedTensor]) -> None:
    """``MergeError`` when the written shards do not hold exactly the planned tensors (name, shape, dtype)."""
    want: Mapping[str, PlannedTensor] = {t.name: t for t in planned}
    with Checkpoint(folder) as written:
        got = written.tensors
        missing = sorted(want.keys() - got.keys())
        if missing:
            raise MergeError(
                f"tensor {missing[0]!r} is missing from the written shards in {folder} ({len(missing)} in all); "
                "nothing was kept: please report this"
            )
        for name, t in want.items():
            info = got[name]
            if tuple(info.shape) != tuple(t.shape) or info.dtype != t.dtype:
                raise MergeError(
                    f"tensor {name!r} was written as {info.dtype} {list(info.shape)}, planned as {t.dtype} "
                    f"{list(t.shape)}; nothing was kept: please report this"
                )
