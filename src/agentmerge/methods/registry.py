"""Every merge method in one table: name, summary, kernel, typed parameters, hooks, compiled form.

``METHODS`` is the only registry: the config, the CLI (`agentmerge methods`), the driver and the
mergekit translation all read it. A method's reference kernel lives in ``ram.py`` (RAM family, linear,
task arithmetic), ``baselines.py``, ``elementwise.py`` / ``spherical.py`` (the field's) or ``spectral.py`` /
``resmerge.py`` (the SVD methods), its parameter record in ``records.py`` (``field_params.py``,
``svd_params.py``), its report hooks in ``scales.py``; its compiled twin, when it has one, in ``fused/``.
The entries name kernels and hooks as ``Lazy`` references (``rm("ram")`` is ``agentmerge.methods.ram.kernels:ram``),
imported on first use: the table itself, and everything that only reads it (`agentmerge methods`, config
checks), loads without torch or numba. What the hooks mean: ``hooks.py``. mergekit's names for these entries
live with the configs (``agentmerge.config.mergekit_names``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from agentmerge.methods.field import (
    ConsensusParams,
    KarcherParams,
    MagMaxParams,
    MultiSlerpParams,
    NuSlerpParams,
    SceParams,
)
from agentmerge.methods.hooks import ModelSum, Needs, OverlapCounts, Scales, TensorPrepare
from agentmerge.methods.method import Method
from agentmerge.methods.records import (
    BreadcrumbsParams,
    DareLinearParams,
    DareTiesParams,
    DellaParams,
    FisherParams,
    RamFisherParams,
    RamParams,
    RamPlusParams,
    RamTiesParams,
    SlerpParams,
    TaskArithmeticParams,
    TiesParams,
    UniqueOnlyParams,
)
from agentmerge.methods.spec import Lazy
from agentmerge.methods.svd import CartParams, IsoCParams, IsoCtsParams, ResMergeParams, TsvParams
from agentmerge.methods.svd import rules as sr


def rm(name: str) -> Lazy:
    """A reference kernel (or hook) of ``ram.py``, imported on first use."""
    return Lazy(f"agentmerge.methods.ram.kernels:{name}")


def bl(name: str) -> Lazy:
    """A reference kernel (or hook) of ``baselines.py``, imported on first use."""
    return Lazy(f"agentmerge.methods.ties.kernels:{name}")


def fk(name: str) -> Lazy:
    """A compiled form (``Compiled``) in ``fused/kernels.py`` (RAM family, linear, task arithmetic)."""
    return Lazy(f"agentmerge.methods.fused.kernels:{name}")


def ft(name: str) -> Lazy:
    """A compiled form (``Compiled``) of the TIES family in ``fused/ties.py``."""
    return Lazy(f"agentmerge.methods.ties.compiled:{name}")


def ew(name: str) -> Lazy:
    """A reference kernel (or hook) of ``elementwise.py`` (MagMax, Consensus, SCE), imported on first use."""
    return Lazy(f"agentmerge.methods.field.kernels:{name}")


def sp(name: str) -> Lazy:
    """A reference kernel (or hook) of ``spherical.py`` (Karcher, Multi-SLERP, NuSLERP), imported on first use."""
    return Lazy(f"agentmerge.methods.spherical.kernels:{name}")


def ff(name: str) -> Lazy:
    """A compiled form (``Compiled``) of MagMax, Consensus or SCE in ``fused/field.py``."""
    return Lazy(f"agentmerge.methods.field.compiled:{name}")


def fs(name: str) -> Lazy:
    """A compiled form (``Compiled``) of Karcher, Multi-SLERP or NuSLERP in ``fused/sphere.py``."""
    return Lazy(f"agentmerge.methods.spherical.compiled:{name}")


def sv(name: str) -> Lazy:
    """A reference kernel of the SVD methods (``spectral.py``; ResMerge's in ``resmerge.py``), imported on first use."""
    return Lazy(f"agentmerge.methods.svd.{'resmerge' if name == 'resmerge' else 'kernels'}:{name}")


def sc(name: str) -> Lazy:
    """A report hook (``hooks.Scales``, ``hooks.Advice``) of ``scales.py``, imported on first use."""
    return Lazy(f"agentmerge.methods.ram.scales:{name}")


STAT_BLOCKS = Lazy("agentmerge.methods.stats:stat_blocks")
WEIGHTED = Needs(weights=True)  # what most baselines need: a base, the models' weights
RAM_PAPER = "2601.13572"  # Reinforced Agent Merging (RAM, RAM+), the paper this project implements

# --------------------------------------------------------------------------- the table

_ALL = (
    Method(
        "ram",
        "RAM: mean where 2+ agents updated, unique updates kept whole",
        rm("ram"),
        RamParams,
        advice=sc("ram_shared_advice"),
        compiled_at=Lazy("agentmerge.methods.ram.compiled:RAM"),
        paper=RAM_PAPER,
    ),
    Method(
        "ram_plus",
        "RAM+: RAM with each agent's unique updates scaled up by its overlap-unique ratio",
        rm("ram_plus"),
        RamPlusParams,
        passes=(OverlapCounts(group=rm("scope_group")),),
        scales=Scales(rows=sc("ram_plus_rows"), summary=sc("ram_plus_summary")),
        advice=sc("ram_shared_advice"),
        compiled_at=Lazy("agentmerge.methods.ram.compiled:RAM_PLUS"),
        paper=RAM_PAPER,
    ),
    Method(
        "ram_fisher",
        "RAM with a Fisher-weighted mean where 2+ agents updated; unique updates kept whole (or scaled by Fisher mass)",
        rm("ram_fisher"),
        RamFisherParams,
        Needs(extras=("fisher",)),
        passes=(ModelSum(count=rm("fisher_masses"), wanted=rm("fisher_rescales"), label="statistics (Fisher)"),),
        scales=Scales(rows=sc("ram_fisher_rows"), summary=sc("ram_fisher_summary")),
    ),
    Method(
        "unique_only",
        "dilution ablation: base + scale * (one agent's unique updates only)",
        rm("unique_only"),
        UniqueOnlyParams,
        paper=RAM_PAPER,
    ),
    Method(
        "linear",
        "weighted average of the models",
        Lazy("agentmerge.methods.arithmetic.kernels:linear"),
        needs=Needs(weights=True, base=False),
        compiled_at=Lazy("agentmerge.methods.arithmetic.compiled:LINEAR"),
    ),
    Method(
        "task_arithmetic",
        "base + lambda * sum of weighted task vectors",
        Lazy("agentmerge.methods.arithmetic.kernels:task_arithmetic"),
        TaskArithmeticParams,
        WEIGHTED,
        compiled_at=Lazy("agentmerge.methods.arithmetic.compiled:TASK_ARITHMETIC"),
        paper="2212.04089",
    ),
    Method(
        "ties",
        "TIES: trim to top-density magnitudes, elect signs by mass, disjoint mean",
        bl("ties"),
        TiesParams,
        WEIGHTED,
        passes=(TensorPrepare(bl("ties_prepare")),),
        compiled_at=ft("TIES"),
        paper="2306.01708",
    ),
    Method(
        "dare_linear",
        "DARE + task arithmetic: random drop with rescale, then lambda * weighted sum",
        bl("dare_linear"),
        DareLinearParams,
        WEIGHTED,
        compiled_at=ft("DARE_LINEAR"),
        paper="2311.03099",
    ),
    Method(
        "dare_ties",
        "DARE + TIES: random drop with rescale, then (optional trim,) sign election and disjoint mean",
        bl("dare_ties"),
        DareTiesParams,
        WEIGHTED,
        passes=(TensorPrepare(bl("dare_ties_prepare")),),
        compiled_at=ft("DARE_TIES"),
        paper="2311.03099",
    ),
    Method(
        "breadcrumbs",
        "Model Breadcrumbs: drop the largest gamma and smallest magnitudes, keep density; task arithmetic",
        bl("breadcrumbs"),
        BreadcrumbsParams,
        WEIGHTED,
        passes=(TensorPrepare(bl("breadcrumbs_prepare")),),
        compiled_at=ft("BREADCRUMBS"),
        paper="2312.06795",
    ),
    Method(
        "della",
        "DELLA: magnitude-ranked random drop per row with rescale, sign election, disjoint mean",
        bl("della"),
        DellaParams,
        Needs(weights=True, chunk_multiple=bl("row_length")),
        paper="2406.11617",
    ),
    Method(
        "model_stock",
        "Model Stock: average of the models pulled toward the base by their task vectors' mean cosine",
        bl("model_stock"),
        needs=Needs(chunk_multiple=STAT_BLOCKS),
        passes=(TensorPrepare(bl("model_stock_prepare")),),
        paper="2403.19522",
    ),
    Method(
        "slerp",
        "spherical interpolation of two models' weights per tensor (lerp when nearly colinear)",
        bl("slerp"),
        SlerpParams,
        Needs(base=False, models=(2, 2), chunk_multiple=STAT_BLOCKS),
        passes=(TensorPrepare(bl("slerp_prepare")),),
    ),
    Method(
        "ram_ties",
        "RAM authors' arm-ties: unique updates kept whole, TIES (keep fraction) on the shared region",
        bl("ram_ties"),
        RamTiesParams,
        passes=(TensorPrepare(bl("ram_ties_prepare")),),
        compiled_at=ft("RAM_TIES"),
    ),
    Method(
        "fisher",
        "diagonal Fisher merging: sum_i w_i F_i theta_i / sum_i w_i F_i",
        bl("fisher"),
        FisherParams,
        Needs(weights=True, base=False, extras=("fisher",)),
        paper="2111.09832",
    ),
    Method(
        "magmax",
        "MagMax: per element the task vector of largest magnitude, times lambda",
        ew("magmax"),
        MagMaxParams,
        compiled_at=ff("MAGMAX"),
        paper="2407.06322",
    ),
    Method(
        "consensus",
        "Consensus TA: lambda * sum of task vectors, kept where at least k agents' TALL masks agree",
        ew("consensus"),
        ConsensusParams,
        compiled_at=ff("CONSENSUS"),
        paper="2405.07813",
    ),
    Method(
        "sce",
        "SCE (mergekit): select high-variance elements, weight agents by mean square, erase minority signs",
        ew("sce"),
        SceParams,
        Needs(chunk_multiple=STAT_BLOCKS),
        passes=(TensorPrepare(ew("sce_prepare")),),
        compiled_at=ff("SCE"),
        paper="2408.07990",
    ),
    Method(
        "karcher",
        "Karcher mean (mergekit): Riemannian mean of the models' weight directions, times their mean norm",
        sp("karcher"),
        KarcherParams,
        Needs(base=False, chunk_multiple=STAT_BLOCKS),
        passes=(TensorPrepare(sp("karcher_prepare")),),
        compiled_at=fs("KARCHER"),
    ),
    Method(
        "multislerp",
        "Multi-SLERP (mergekit): weighted spherical interpolation of task vectors (with a base) or weights",
        sp("multislerp"),
        MultiSlerpParams,
        Needs(base=False, weights=True, chunk_multiple=STAT_BLOCKS),
        passes=(TensorPrepare(sp("multislerp_prepare")),),
        compiled_at=fs("MULTISLERP"),
    ),
    Method(
        "nuslerp",
        "NuSLERP (mergekit): SLERP of two task vectors (with a base) or models, t = w_1 / (w_0 + w_1)",
        sp("nuslerp"),
        NuSlerpParams,
        Needs(base=False, weights=True, models=(2, 2), chunk_multiple=sp("nuslerp_unit")),
        passes=(TensorPrepare(sp("nuslerp_prepare")),),
        compiled_at=fs("NUSLERP"),
    ),
    Method(
        "tsv",
        "TSV-M: each task vector's top k/N singular triplets side by side, both factors orthogonalised (polar)",
        sv("tsv"),
        TsvParams,
        Needs(whole=sr.TSV_WHOLE),
        paper="2412.00081",
    ),
    Method(
        "iso_c",
        "Iso-C: the sum of the task vectors with all its singular values set to their mean",
        sv("iso_c"),
        IsoCParams,
        Needs(whole=sr.ISO_C_WHOLE),
        paper="2502.04959",
    ),
    Method(
        "iso_cts",
        "Iso-CTS: Iso-C over the sum's top directions and each task's own directions outside them",
        sv("iso_cts"),
        IsoCtsParams,
        Needs(whole=sr.ISO_CTS_WHOLE, check_tensor=sr.cts_check),
        paper="2502.04959",
    ),
    Method(
        "cart",
        "CART: the average plus prior times the sum of each model's low-rank deviation from the average",
        sv("cart"),
        CartParams,
        Needs(whole=sr.CART_WHOLE, check_tensor=sr.cart_check),
        paper="2412.12153",
    ),
    Method(
        "resmerge",
        "ResMerge: coherence-scaled backbone of the task vectors' SVD tails plus a gated head correction",
        sv("resmerge"),
        ResMergeParams,
        Needs(whole=sr.RESMERGE_WHOLE, check_tensor=sr.resmerge_check),
        paper="2606.02252",
    ),
)

METHODS: Mapping[str, Method] = MappingProxyType({m.name: m for m in _ALL})
