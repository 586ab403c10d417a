"""A method's entry in the table (``registry.METHODS``): its kernel, its typed parameters and its hooks.

``Method`` is what the config, the driver, the dry run and the report know of a method. Its fields are
data: the reference kernel (a ``Lazy`` reference, so the table loads without torch), the parameter record
(``params.py``), the hooks (``hooks.py``) and where its compiled form lives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentmerge.methods.hooks import Advice, Needs, Pass, Scales, TensorPrepare
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.params import MethodParams, NoParams, Param, Params, ParamValue
from agentmerge.methods.spec import Chunk, Compiled, Lazy, TensorSource

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Method:
    """A merge method: its kernel, its typed parameters and its hooks (``hooks.py``: what the driver must
    provide it, the statistics passes it needs before the write pass, the scales it reports)."""

    name: str
    summary: str
    kernel: Callable[[Chunk], torch.Tensor]  # usually a ``Lazy``: imported on first call
    record: type[MethodParams] = NoParams  # its typed parameters (``params.py``); the table follows from it
    needs: Needs = field(default_factory=Needs)  # base, weights, model count, extra tensors, chunk alignment
    passes: tuple[Pass, ...] = ()  # statistics before the write pass, in order (``hooks.py``)
    scales: Scales | None = None  # the per-agent scales it reports (merge.json ``scales``, the merge summary)
    advice: Advice | None = None  # notes for the merge summary from the agents' overlap (``hooks.Advice``)
    compiled_at: Lazy | None = None  # where its compiled form (a ``Compiled``) lives, when it has one
    paper: str | None = None  # arXiv id of the paper that defines it (the model card's ``arxiv:`` tag)
    mergekit: tuple[MethodMap, ...] = ()  # mergekit's names for it (``config.mergekit_names`` collects them)

    # read-only views of ``needs`` and ``passes`` under the names the config and the tests read

    @property
    def uses_weights(self) -> bool:
        return self.needs.weights

    @property
    def needs_base(self) -> bool:
        return self.needs.base

    @property
    def min_models(self) -> int:
        return self.needs.models[0]

    @property
    def max_models(self) -> int | None:
        return self.needs.models[1]

    @property
    def model_inputs(self) -> tuple[str, ...]:
        return self.needs.extras

    @property
    def chunk_multiple(self) -> Callable[[tuple[int, ...]], int] | None:
        return self.needs.chunk_multiple

    @property
    def prepare(self) -> Callable[[TensorSource], Any] | None:
        """The reference ``prepare`` of its ``TensorPrepare`` pass, if it has one."""
        return next((p.prepare for p in self.passes if isinstance(p, TensorPrepare)), None)

    @property
    def caches_statistics(self) -> bool:
        """Whether a pass of it keeps its counts per input set (a sweep counts them once, before its trials)."""
        return any(p.cached for p in self.passes)

    @property
    def compiled(self) -> Compiled | None:
        """The fused kernel (imports ``agentmerge.methods.fused`` on first use), or None."""
        if self.compiled_at is None:
            return None
        form = self.compiled_at.get()
        assert isinstance(form, Compiled), self.compiled_at
        return form

    @property
    def params(self) -> tuple[Param, ...]:
        """The parameter table, from the record's fields."""
        return self.record.table()

    @property
    def output_scale(self) -> str | None:
        """The parameter that multiplies its merged task vector (tuned by the fair protocol), or None."""
        return self.record.output_scale

    def check_params(self, params: Params, n_models: int) -> None:
        """The record's cross-parameter checks of resolved ``params`` (``ValueError``)."""
        self.record.of(params).check(n_models)

    def defaults(self) -> dict[str, ParamValue]:
        return {p.name: p.default for p in self.params}

    def param(self, name: str) -> Param | None:
        """The parameter called ``name`` (its name or an alias, e.g. ``lambda`` for ``scale``), or None."""
        return next((p for p in self.params if p.called(name)), None)

    def names(self) -> tuple[str, ...]:
        """Every name a parameter answers to, aliases included (what a "did you mean" may suggest)."""
        return tuple(n for p in self.params for n in (p.name, *p.aliases))

    def canonical(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with each alias renamed to its parameter's name (``lambda: 0.7`` -> ``scale: 0.7``), in order,
        so a later entry wins as in ``{**params, **override}``; names it does not know are kept as they are."""
        out: dict[str, Any] = {}
        for key, value in params.items():
            p = self.param(key)
            name = p.name if p is not None else key
            out.pop(name, None)
            out[name] = value
        return out

    def needs_reference(self, params: Params) -> bool:
        """Whether ``params`` set a ``reference_only`` parameter away from its default (no compiled form does it)."""
        return any(p.reference_only and params.get(p.name, p.default) != p.default for p in self.params)
