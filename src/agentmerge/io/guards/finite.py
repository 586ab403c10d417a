"""The finiteness rules: checks that keep a broken model from being written with exit status 0.

- ``check_finite`` (with ``all_finite``): the one finiteness rule for what a command reads. Every floating
  value of every input (``merge``'s models and base, ``moe``'s static merge and agents' experts, ``extract-lora``'s
  model and base, ``convert``'s source) must be finite; the first NaN or Inf stops the command naming the file,
  tensor and element, before anything is written (one sum over the values, the exact test only when it is not
  finite).
- ``check_output_chunk``: every output chunk is finite in the output dtype before it is written (one sum over
  values already in hand, the exact ``torch.isfinite`` test only when that sum is not finite), else the merge
  stops naming the tensor.
- ``check_derived_values``: values agentmerge derives or copies from something that is not a whole model (a
  LoRA update ``W + s B A``, a ``modules_to_save`` tensor, an agent's added vocabulary rows) must be finite
  and at most ``MAX_DERIVED_VALUE`` in size: the bound of a merge weight (``config.schema.MAX_WEIGHT``), far
  above any trained weight (fp16 cannot even hold 1e6), so a larger value is a typo (``lora_alpha: 1e9``)
  or a broken adapter, and the merge stops naming the tensor before anything is written.

What a folder or file is for (a tokenizer source, a Fisher file) is checked in ``formats.roles``.
"""

from __future__ import annotations

import math

import torch

from agentmerge.errors import AgentMergeError, CheckpointError, MergeError

MAX_DERIVED_VALUE = 1e6  # the bound of a merge weight, far above any trained weight


def all_finite(x: torch.Tensor) -> bool:
    """Whether every value of a float tensor is finite (one reduction; the exact test only if the sum is not)."""
    return math.isfinite(float(x.sum())) or bool(torch.isfinite(x).all())


def check_finite(
    where: str, values: torch.Tensor, start: int = 0, error: type[AgentMergeError] = CheckpointError
) -> torch.Tensor:
    """``values`` unchanged, or ``error`` when a floating one is NaN or Inf; ``where`` names file and tensor."""
    if not values.dtype.is_floating_point or values.numel() == 0 or all_finite(values):
        return values
    flat = values.reshape(-1)
    first = int(torch.nonzero(~torch.isfinite(flat))[0, 0])
    raise error(
        f"{where}: element {start + first} is {float(flat[first])} (NaN or Inf); this input is broken, "
        "re-export it; nothing was written"
    )


def check_output_chunk(name: str, start: int, values: torch.Tensor) -> None:
    """``MergeError`` when a chunk about to be written holds NaN or Inf (overflow of the output dtype)."""
    if not values.dtype.is_floating_point or values.numel() == 0:
        return
    if math.isfinite(float(values.sum())):  # a finite sum has no NaN or Inf in it (~0.1 ms per 1M elements)
        return
    if not bool(torch.isfinite(values).all()):  # the exact test only when the sum is not finite
        bad = int(torch.nonzero(~torch.isfinite(values))[0, 0]) + start
        dtype = str(values.dtype).removeprefix("torch.")
        raise MergeError(
            f"tensor {name!r}: output element {bad} is NaN or Inf in {dtype} (the merge overflows); "
            "lower the weights or lambda, or write a wider dtype; nothing was written"
        )


def check_derived_values(where: str, start: int, values: torch.Tensor) -> None:
    """``CheckpointError`` when ``values`` (elements ``start..``) hold NaN, Inf or ``|v| > MAX_DERIVED_VALUE``."""
    if values.numel() == 0:
        return
    low, high = torch.aminmax(values)  # NaN propagates into both and fails the test below
    if float(low) >= -MAX_DERIVED_VALUE and float(high) <= MAX_DERIVED_VALUE:
        return
    bad = values.isnan() | (values.abs() > MAX_DERIVED_VALUE)
    first = int(torch.nonzero(bad)[0, 0])
    raise CheckpointError(
        f"{where}: element {start + first} is {float(values[first]):g}, beyond +-{MAX_DERIVED_VALUE:g} "
        "(a trained weight never is: a wrong lora_alpha, or a broken adapter or agent); nothing was written"
    )
