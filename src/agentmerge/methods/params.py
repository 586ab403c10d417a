"""Typed method parameters: one frozen record per method, its fields declared with their ``Param``.

A method's parameters are a frozen dataclass whose fields are declared by ``use(Param(...))``: the field's
default is the parameter's, and the ``Param`` (name, help, range, choices) rides along as the field's
metadata. The method's parameter table (``Method.params``: what the config checks, `agentmerge methods`
lists, mergekit export reads) is derived from the fields, in declaration order (a subclass's fields come
after its base's). Kernels read attributes (``p.r``), which mypy checks:

    @dataclass(frozen=True, eq=False)
    class RamPlusParams(RamParams):
        r: float = use(Param("r", 0.1, "paper form: strength of the unique-region rescaling", low=0.0))

    p = RamPlusParams.of(c.params)    # in a kernel: the plan's record itself, or one built from a mapping
    lam = 1.0 + p.r * ...

A record is also a read-only mapping from parameter names to values (``p["epsilon"]``), so code that is the
same for every method (mask rules, ``epsilon``, merge.json) reads it by name; a method's own values are read as
attributes only. A field's name is its parameter's name. One idea has one name in every record: ``scale`` the
output scale (the merged task vector's multiplier), ``density``, ``clip`` RAM+'s bound of rho; a field's older
or paper name (task arithmetic's ``lambda``, TSV's ``alpha``, RAM+'s ``alpha``) is a ``Param`` alias, accepted on
input (``Method.canonical`` renames it) and kept in mergekit YAML, never written.

``check`` is the record's cross-parameter check (``ValueError`` with a sentence saying what to change); the
config calls it once per parameter set, after each value was checked against its ``Param``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any, ClassVar, Self

from agentmerge.paramtext import parse_value

ParamValue = float | int | str | bool
Params = Mapping[str, ParamValue]

_PARAM = "agentmerge.param"  # the metadata key of a field's ``Param``


@dataclass(frozen=True)
class Param:
    """One method parameter: default, help, and the range or choices a value must respect."""

    name: str
    default: ParamValue
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    low_open: bool = False  # True: value must be > low (not >=)
    per_model: bool = False  # may be set per model (``models[i].params``)
    reference_only: bool = False  # a value other than the default runs on the reference (torch) kernels
    tune: str = ""  # why the default usually needs tuning when several models are merged (a warning when left)
    aliases: tuple[str, ...] = ()  # older names accepted on input (TA's ``lambda`` for ``scale``); never written

    def called(self, name: str) -> bool:
        """Whether ``name`` is this parameter's name or one of its aliases."""
        return name == self.name or name in self.aliases

    def check(self, value: object, method: str) -> ParamValue:
        """Return ``value`` coerced to the default's type, or raise ``ValueError`` saying why not."""
        where = f"{method}: parameter {self.name!r}"
        if self.choices:
            if value not in self.choices:
                raise ValueError(f"{where} must be one of {', '.join(self.choices)} (got {value!r})")
            return str(value)
        kind = type(self.default)
        if kind is str:  # free text (e.g. a list of patterns): checked by the record's ``check``
            if not isinstance(value, str):
                raise ValueError(f"{where} must be text (got {value!r})")
            return value
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{where} must be true or false (got {value!r})")
            return value
        if isinstance(value, str):
            value = parse_value(value)  # "1e-3" from a YAML file: the one grammar of --param
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where} must be a number (got {value!r})")
        try:
            if kind is int and float(value) != int(value):
                raise ValueError(f"{where} must be a whole number (got {value!r})")
            number: float | int = int(value) if kind is int else float(value)
        except OverflowError:  # inf for an int parameter, or an integer too large for a float
            raise ValueError(f"{where} must be a finite number of sensible size (got {str(value)[:40]})") from None
        self._check_range(where, number)
        return number

    def _check_range(self, where: str, number: float) -> None:
        if not math.isfinite(number):
            raise ValueError(f"{where} must be finite (got {number})")
        below = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        above = self.high is not None and number > self.high
        if below or above:
            lo = "-inf" if self.low is None else f"{self.low}"
            hi = "inf" if self.high is None else f"{self.high}"
            bracket = "(" if self.low_open else "["
            raise ValueError(f"{where} = {number} is out of range {bracket}{lo}, {hi}]")


# The post-steps every method takes on its merged task vector, fields of every record (``MethodParams``):
# LiNeS depth scaling (``lines.py``, applied by the driver: ``engine.lines_pass``)
LINES_BETA = Param(
    "lines_beta",
    0.0,
    "LiNeS: the merged task vector of decoder layer l of L is scaled by lines_shallow + lines_beta * l / (L - 1) "
    "(0 with lines_shallow 0: off; the authors tune beta over 0.1 .. 1.0)",
    low=0.0,
)
LINES_SHALLOW = Param(
    "lines_shallow",
    0.0,
    "LiNeS: the scale of the shallowest layer (0) and of tensors outside the layers (the paper's alpha, still "
    "accepted as lines_alpha); 0: the reference's ||sum_i tau_i||_1 / (N ||tau*||_1) (1/N for task arithmetic)",
    low=0.0,
    aliases=("lines_alpha",),
)
# SVC, spectral calibration of every 2-D merged delta (``svc.py``, applied by the driver after the
# kernel and before LiNeS: ``poststeps.POST_STEPS``)
CALIBRATE = Param(
    "calibrate",
    "none",
    "svc: after the method, spectral calibration of every 2-D merged delta (SVC, arXiv 2602.05536); "
    "none: the method's result as it is",
    choices=("none", "svc"),
)
SVC_FLOOR = Param(
    "svc_floor",
    0.1,
    "SVC's floor of each task's response ratio (the paper's alpha, still accepted as svc_alpha): gamma_r = "
    "N / sum_i max(svc_floor, s_r^i) per singular direction of the merged delta (default per base method as "
    "fusion_bench: 1.0 tsv, 0.2 iso_cts, 0.1 otherwise)",
    low=0.0,
    low_open=True,
    aliases=("svc_alpha",),
)
SVD_EMBEDDINGS = Param(
    "svd_embeddings",
    True,
    "decompose the embeddings and LM head (V x d) like every matrix, as the references do; false: no SVD of them "
    "(tsv, iso_c, iso_cts: the mean of the task vectors; SVC: left as the method made them), which skips an LLM's "
    "largest SVDs",
)
POST_STEP_PARAMS = (LINES_BETA, LINES_SHALLOW, CALIBRATE, SVC_FLOOR, SVD_EMBEDDINGS)
POST_STEP_NAMES = tuple(p.name for p in POST_STEP_PARAMS)  # none is mergekit's: exported only at their defaults

# a lower bound of Fisher values, shared by ``fisher`` and ``ram_fisher``
FLOOR = Param("floor", 1e-10, "lower bound of each Fisher value (all-zero Fisher -> plain average)", 0.0, low_open=True)


def use(param: Param) -> Any:
    """A record field declared by its ``Param``: default and metadata (typed ``Any`` so it fits any annotation)."""
    return field(default=param.default, metadata={_PARAM: param})


@dataclass(frozen=True, eq=False)
class MethodParams(Mapping[str, ParamValue]):
    """The base of every method's parameter record (see the module docstring); equal to a mapping of its items.

    Its own fields are the post-steps every method takes on its merged task vector (``POST_STEP_PARAMS``); a
    method's record may redeclare one with a default of its own (``svc_floor``: fusion_bench's per method).
    ``output_scale`` names the parameter that multiplies the method's merged task vector (task arithmetic's
    ``lambda``, RAM's ``scale``), the one the fair protocol tunes on validation (``sweep`` ``output_scale``,
    ``agentmerge converge``); None: the method has none.
    """

    output_scale: ClassVar[str | None] = None

    lines_beta: float = use(LINES_BETA)
    lines_shallow: float = use(LINES_SHALLOW)
    calibrate: str = use(CALIBRATE)
    svc_floor: float = use(SVC_FLOOR)
    svd_embeddings: bool = use(SVD_EMBEDDINGS)

    @classmethod
    def table(cls) -> tuple[Param, ...]:
        """The parameters, in field order."""
        return tuple(p for _, p in _fields(cls))

    @classmethod
    def of(cls, params: Params) -> Self:
        """``params`` itself when it is this record, else a record of its values (defaults for the missing ones).

        The plan builds each tensor's record once; a mapping (a test's dict) is converted, each value to its
        default's type, names the record does not have left out.
        """
        if isinstance(params, cls):
            return params
        given: dict[str, Any] = {}
        for f, p in _fields(cls):
            key = next((a for a in p.aliases if a in params), p.name)  # an alias is only there when given
            if key in params:
                given[f] = _coerce(p.default, params[key])
        return cls(**given)

    def check(self, n_models: int) -> None:
        """Cross-parameter checks (``ValueError``); every value is already in its ``Param``'s range."""

    def sum_multiple(self, weight: float, n_models: int) -> Fraction | None:
        """c when the method's merged task vector is ``c * sum_i tau_i`` on this tensor, every model weighing
        ``weight`` (LiNeS's alpha in closed form: ``lines.closed_form_alpha``); None: it is not such a method."""
        return None

    def __getitem__(self, name: str) -> ParamValue:
        attr = _names(type(self)).get(name)  # the parameter's name only: aliases are for input
        if attr is None:
            raise KeyError(name)
        value: ParamValue = getattr(self, attr)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(_names(type(self)))

    def __len__(self) -> int:
        return len(_names(type(self)))

    def __hash__(self) -> int:
        return hash(tuple(self.items()))


@dataclass(frozen=True, eq=False)
class NoParams(MethodParams):
    """The record of a method without parameters."""


@functools.cache
def _fields(cls: type[MethodParams]) -> tuple[tuple[str, Param], ...]:
    """``(field name, Param)`` of a record class, checked: every field declared by ``use``, names unique."""
    out = []
    for f in fields(cls):
        p = f.metadata.get(_PARAM)
        if not isinstance(p, Param):
            raise TypeError(f"{cls.__name__}.{f.name}: declare parameter fields with use(Param(...))")
        out.append((f.name, p))
    names = [n for _, p in out for n in (p.name, *p.aliases)]
    if len(set(names)) != len(names):
        raise TypeError(f"{cls.__name__}: a parameter name is declared twice ({names})")
    return tuple(out)


@functools.cache
def _names(cls: type[MethodParams]) -> dict[str, str]:
    """Parameter name -> field name."""
    return {p.name: f for f, p in _fields(cls)}


def _coerce(default: ParamValue, value: ParamValue) -> ParamValue:
    """``value`` as the type of ``default`` (a float parameter given as ``2`` reads ``2.0``)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return value
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if isinstance(default, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
