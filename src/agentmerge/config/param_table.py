"""A config's parameters as typed records, resolved once when the config is validated.

A tensor's parameters are the method's defaults, overlaid with ``params``, then with the ``params`` of every
override whose pattern matches the tensor, in order (the last one wins); a model's own ``params`` go on top of
its tensor's. The tensors that match the same overrides form one group, with one record:

    record(tensor) = resolve(defaults | params | overrides[i1].params | ... | overrides[ik].params)
                     i1 < ... < ik: the overrides whose patterns match the tensor

``ParamTable.build`` resolves, when the config is validated, the record of ``params`` alone (``shared``: the
merge's own parameters, which merge.json reports; no override's, not even one of pattern ``*``), each
override's group (``params`` | that override) and each model's record in each of them; a group that matches
several overrides at once is resolved the first time a tensor of it is asked for (its conflicts: one
``ConfigError`` naming the overrides), and kept. The engine reads records, never dicts.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentmerge.config.userinput import did_you_mean
from agentmerge.errors import ConfigError
from agentmerge.methods import METHODS, Method, MethodParams, ParamValue

Group = tuple[int, ...]  # the indices of the overrides a tensor matches, in order


def resolve_record(method: Method, given: Mapping[str, Any], n_models: int) -> MethodParams:
    """``method``'s record of its defaults overlaid with ``given``, each value checked against its ``Param`` and
    the record's cross-parameter checks run (``ValueError``, an unknown name with a suggestion)."""
    names = tuple(p.name for p in method.params)
    out: dict[str, ParamValue] = method.defaults()
    for key, value in given.items():
        p = method.param(key)
        if p is None:
            known = ", ".join(names) or "none"
            raise ValueError(
                f"method {method.name!r} has no parameter {key!r}{did_you_mean(key, method.names())}; it takes: {known}"
            )
        out[p.name] = p.check(value, method.name)  # under the parameter's own name, whatever name found it
    record = method.record.of(out)
    record.check(n_models)
    return record


@dataclass(frozen=True)
class ParamTable:
    """Every record a config's tensors and models get: ``shared`` (``params`` alone), one per group of overrides
    (``tensor``), one per model of a group (``models``)."""

    method: str  # its name in ``METHODS`` (not the entry: a config pickles, some entries' hooks do not)
    n_models: int
    params: Mapping[str, ParamValue]
    patterns: tuple[str, ...]  # the overrides' patterns, in order
    layers: tuple[Mapping[str, ParamValue], ...]  # the overrides' params, in order
    own: tuple[Mapping[str, ParamValue], ...]  # each model's own params
    shared: MethodParams
    _groups: dict[Group, MethodParams] = field(default_factory=dict, repr=False, compare=False)
    _models: dict[Group, tuple[MethodParams, ...]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        method: Method,
        params: Mapping[str, ParamValue],
        overrides: Sequence[tuple[str, Mapping[str, ParamValue]]],
        own: Sequence[Mapping[str, ParamValue]],
    ) -> ParamTable:
        """Resolve ``params``, each override's group and each model's record (``ValueError`` on a bad value)."""
        n = len(own)
        shared = resolve_record(method, params, n)
        patterns, layers = tuple(p for p, _ in overrides), tuple(v for _, v in overrides)
        table = cls(method.name, n, params, patterns, layers, tuple(own), shared)
        table._groups[()] = shared
        for i, layer in enumerate(layers):
            table._groups[(i,)] = resolve_record(method, {**params, **layer}, n)
        if any(own):
            for group, record in table._groups.items():
                table._models[group] = tuple(resolve_record(method, {**record, **mine}, n) for mine in own)
        return table

    def group(self, tensor: str) -> Group:
        """The overrides ``tensor`` matches (fnmatch, case-sensitive), in order."""
        return tuple(i for i, pattern in enumerate(self.patterns) if fnmatch.fnmatchcase(tensor, pattern))

    def tensor(self, tensor: str) -> MethodParams:
        """The record of ``tensor``: its group's, resolved once per group."""
        return self._record(self.group(tensor))

    def tensor_models(self, tensor: str) -> tuple[MethodParams, ...]:
        """Each model's record for ``tensor`` (its own params over the tensor's); () when no model sets any."""
        return self.models(self.group(tensor))

    def models(self, group: Group) -> tuple[MethodParams, ...]:
        """Each model's record in ``group``; () when no model sets params."""
        if not any(self.own):
            return ()
        found = self._models.get(group)
        if found is None:
            shared = self._record(group)
            found = tuple(self._resolve({**shared, **mine}, group, f"models[{j}]") for j, mine in enumerate(self.own))
            self._models[group] = found
        return found

    def _record(self, group: Group) -> MethodParams:
        found = self._groups.get(group)
        if found is None:
            merged = dict(self.params)
            for i in group:
                merged.update(self.layers[i])
            found = self._groups[group] = self._resolve(merged, group)
        return found

    def _resolve(self, given: Mapping[str, Any], group: Group, model: str = "") -> MethodParams:
        """A group's record, resolved after validation: a conflict of several overrides is one ``ConfigError``."""
        try:
            return resolve_record(METHODS[self.method], given, self.n_models)
        except ValueError as e:
            where = [f"overrides[{i}] ({self.patterns[i]!r})" for i in group] + ([model] if model else [])
            raise ConfigError(f"the parameters of {', '.join(where)} together: {e}") from None
