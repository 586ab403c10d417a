"""``agentmerge moe``: the output loads in transformers, routes each agent's prompts to its expert, and is exact.

Tiny float32 Llama (-> Mixtral) and Qwen2 (-> Qwen2-MoE) families whose three agents differ from the base only in
their MLPs, and whose prompts come from disjoint token groups (``densefamily``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.engine.moe.build import build_moe
from agentmerge.engine.moe.moe_config import moe_config_from_dict
from agentmerge.engine.moe.moe_dryrun import plan_moe

transformers = pytest.importorskip("transformers")
import densefamily as df  # noqa: E402

ARCHS = {"llama": "MixtralForCausalLM", "qwen2": "Qwen2MoeForCausalLM", "qwen3": "Qwen3MoeForCausalLM"}


@pytest.fixture(scope="module", params=list(ARCHS))
def fam(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[Path]]:
    arch = str(request.param)
    base, agents = df.family(tmp_path_factory.mktemp(arch), arch, 3)
    return arch, base, agents


def build(base: Path, agents: list[Path], out: Path, **settings: Any) -> Path:
    build_moe(moe_config_from_dict(df.moe_dict(base, agents, **settings)), out)
    return out


def load(folder: Path) -> tuple[Any, Any]:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval(), transformers.AutoTokenizer.from_pretrained(folder)


def test_top1_moe_is_each_agent_on_its_own_prompts(fam: tuple[str, Path, list[Path]], tmp_path: Path) -> None:
    """Attention is the base's (no agent changed it), so routing every token to its own expert gives the agent."""
    arch, base, agents = fam
    moe, tok = load(build(base, agents, tmp_path / "moe", experts_per_token=1))
    assert type(moe).__name__ == ARCHS[arch]
    for i, path in enumerate(agents):
        specialist = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        for prompt in df.PROMPTS[i]:
            ids = tok(prompt, return_tensors="pt")
            with torch.no_grad():
                assert torch.allclose(moe(**ids).logits, specialist(**ids).logits, atol=1e-5), (i, prompt)


def test_router_sends_each_agents_prompts_to_its_expert(fam: tuple[str, Path, list[Path]], tmp_path: Path) -> None:
    """transformers' own router logits: every token of agent i's prompts has expert i on top at the first MoE
    layer; merge.json's own shares (from agentmerge's calibration pass) are what transformers routes, per layer."""
    _, base, agents = fam
    out = build(base, agents, tmp_path / "moe")
    moe, tok = load(out)
    record = json.loads((out / "merge.json").read_text())
    for layer in range(moe.config.num_hidden_layers):
        for i, prompts in enumerate(df.PROMPTS[: len(agents)]):
            own = total = 0
            for prompt in prompts:
                with torch.no_grad():
                    logits = moe(**tok(prompt, return_tensors="pt"), output_router_logits=True).router_logits[layer]
                own += int((logits.argmax(-1) == i).sum())
                total += logits.shape[0]
            assert own / total == pytest.approx(record["router"]["layers"][layer]["own_share"][f"agent{i}"], abs=1e-6)
            if layer == 0:
                assert own == total, (i, own, total)
    generated = moe.generate(**tok("0123", return_tensors="pt"), max_new_tokens=6, do_sample=False)
    assert generated.shape[1] == 4 + 6


def test_moe_record_card_and_static_merge(fam: tuple[str, Path, list[Path]], tmp_path: Path) -> None:
    """merge.json says what the MoE is; attention, norms and embeddings are the static merge's bit for bit (also
    when the agents changed them), and an existing merge given as ``static`` gives the same folder."""
    arch, base, _ = fam
    model, tok = df.base_model(arch)  # the fixture's base; these agents change attention and norms too
    agents = [df.save(df.agent(model, i, other=0.02), tok, tmp_path / f"a{i}") for i in range(2)]
    out = build(base, agents, tmp_path / "moe", merge={"method": "ram"})
    dense = tmp_path / "dense"
    merge(MergeConfig(method="ram", base=str(base), models=[ModelSpec(path=str(a)) for a in agents]), dense, quiet=True)
    ours, theirs = load_file(out / "model.safetensors"), load_file(dense / "model.safetensors")
    shared = [n for n in theirs if ".mlp." not in n]
    assert shared and all(torch.equal(ours[n], theirs[n]) for n in shared)
    again = build(base, agents, tmp_path / "moe2", static=str(dense))
    assert load_file(again / "model.safetensors").keys() == ours.keys()
    assert all(torch.equal(load_file(again / "model.safetensors")[n], ours[n]) for n in ours)
    record = json.loads((out / "merge.json").read_text())
    assert record["kind"] == "moe" and record["architecture"] == ARCHS[arch]
    assert record["static_merge"]["config"]["method"] == "ram"
    assert [e["prompts"] for e in record["experts"]] == [5, 5]
    assert ARCHS[arch] in (out / "README.md").read_text()
    assert not (out / ".static-merge").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_shared_expert_takes_its_share(tmp_path: Path) -> None:
    """Qwen2-MoE with the base's MLP as shared expert at weight w, top-1: the block computes
    ``(1 - w) E_i(x) + w B(x)`` with ``i`` the router's choice."""
    base, agents = df.family(tmp_path / "fam", "qwen2", 2)
    moe, _ = load(build(base, agents, tmp_path / "moe", experts_per_token=1, shared_expert="base", shared_weight=0.3))
    dense = [transformers.AutoModelForCausalLM.from_pretrained(p).eval() for p in (base, *agents)]
    block = moe.model.layers[0].mlp
    x = torch.randn(20, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        choice = (x @ block.gate.weight.T).argmax(-1)
        want = torch.stack(
            [
                0.7 * dense[1 + int(c)].model.layers[0].mlp(row) + 0.3 * dense[0].model.layers[0].mlp(row)
                for row, c in zip(x, choice, strict=True)
            ]
        )
        assert torch.allclose(block(x[None])[0], want, atol=1e-5)


def test_dry_run_gives_the_output_size(tmp_path: Path) -> None:
    base, agents = df.family(tmp_path / "fam", "llama", 2)
    cfg = moe_config_from_dict(df.moe_dict(base, agents))
    plan = plan_moe(cfg, tmp_path / "moe")
    assert not (tmp_path / "moe").exists()
    build_moe(cfg, tmp_path / "moe")
    assert plan["bytes"] == (tmp_path / "moe" / "model.safetensors").stat().st_size
    assert plan["architecture"] == "MixtralForCausalLM" and plan["tensors"] == len(
        load_file(tmp_path / "moe" / "model.safetensors")
    )


# --------------------------------------------------------------------------- bad input: one line, nothing written


def _bad_family(tmp_path: Path, case: str) -> list[str]:
    base, agents = df.family(tmp_path / "fam", "llama", 2)
    (tmp_path / "p0.txt").write_text("0123\n")
    (tmp_path / "p1.txt").write_text("abc\n" if case != "no prompts" else "\n")
    if case == "architecture":
        cfg = json.loads((base / "config.json").read_text())
        (base / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox"}))
    if case == "mlp shapes":
        model, tok = df.base_model("llama", intermediate=64)
        shutil.rmtree(agents[1])
        df.save(model, tok, agents[1])
    argv = [str(base), "--model", str(agents[0]), "--prompts", str(tmp_path / "p0.txt")]
    argv += ["--model", str(agents[1]), "--prompts", str(tmp_path / "p1.txt"), "-o", str(tmp_path / "out")]
    extra = {"shared on mixtral": ["--shared-expert", "base"], "three per token": ["--experts-per-token", "3"]}
    if case == "foreign static":
        extra[case] = ["--static", str(df.family(tmp_path / "other", "qwen2", 1)[0])]
    return argv + extra.get(case, [])


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("no prompts", "no prompts for this agent"),
        ("architecture", "has no MoE counterpart"),
        ("mlp shapes", "must share the base's MLP shapes"),
        ("shared on mixtral", "has no shared expert"),
        ("three per token", "experts_per_token must be 1 or 2"),
        ("foreign static", "'static' must be a merge of this base"),
    ],
)
def test_bad_input_gives_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, says: str
) -> None:
    argv = _bad_family(tmp_path, case)
    capsys.readouterr()  # transformers' progress bars while the family was saved
    for dry in ([], ["--dry-run"]):
        assert main(["moe", *argv, *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_prompts_must_pair_with_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["moe", "b", "--model", "a1", "--prompts", "p", "--model", "a2", "-o", str(tmp_path / "o")]) == 2
    assert "--prompts 1 times" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["moe", "--help"], ""),
        (["extract-lora", "--help"], ""),
        (["moe", "b", "-o", "o"], "'experts' must list at least two agents"),
        (
            ["moe", "b", "--model", "a", "--prompts", "/no/p.txt", "--model", "c", "--prompts", "/no/q.txt", "-o", "o"],
            "/no/p.txt",
        ),
        (["extract-lora", "m", "--base", "b", "-o", "o", "--energy", "2"], "--energy must lie in (0, 1]"),
    ],
)
def test_help_and_argument_errors_answer_without_torch(argv: list[str], says: str) -> None:
    from test_startup import _run

    _, err = _run(*argv)
    assert "HEAVY - CODE" in err and says in err, err


def test_yaml_config_with_jsonl_prompts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A moe config file: prompts inline and from an eval task file (JSONL), the static merge's own settings."""
    base, agents = df.family(tmp_path / "fam", "qwen2", 2)
    rows = [{"task": "x", "defaults": {"match": "exact"}}, *({"prompt": p, "reference": "0"} for p in df.PROMPTS[1])]
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = {
        "base": str(base),
        "experts": [
            {"path": str(agents[0]), "prompts": df.PROMPTS[0], "name": "digits"},
            {"path": str(agents[1]), "prompts_file": str(tmp_path / "tasks.jsonl")},
        ],
        "merge": {"method": "task_arithmetic", "params": {"lambda": 0.5}},
        "experts_per_token": 1,
        "shared_expert": "merged",
    }
    (tmp_path / "moe.yaml").write_text(json.dumps(config))  # JSON is YAML
    capsys.readouterr()
    assert main(["moe", str(tmp_path / "moe.yaml"), "-o", str(tmp_path / "out"), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(e["name"], e["prompts"]) for e in plan["experts"]] == [("digits", 5), ("agent1", 5)]
    assert plan["static_merge"]["method"] == "task_arithmetic" and plan["settings"]["shared_expert"] == "merged"
    assert main(["moe", str(tmp_path / "moe.yaml"), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    record = json.loads((tmp_path / "out" / "merge.json").read_text())
    assert record["static_merge"]["config"]["params"] == {"scale": 0.5}  # given as lambda, its old name
    assert plan["bytes"] == (tmp_path / "out" / "model.safetensors").stat().st_size


def test_sharded_bf16_output_loads(tmp_path: Path) -> None:
    """--dtype and --max-shard-size as for merge: several shards with an index, in bf16, as the dry run said."""
    base, agents = df.family(tmp_path / "fam", "llama", 2)
    cfg = moe_config_from_dict(df.moe_dict(base, agents, dtype="bfloat16", max_shard_size="40KB"))
    plan = plan_moe(cfg, tmp_path / "moe")
    build_moe(cfg, tmp_path / "moe")
    shards = sorted(p.name for p in (tmp_path / "moe").glob("model-*.safetensors"))
    assert len(shards) > 1 and shards == sorted(f["name"] for f in plan["files"])
    assert (tmp_path / "moe" / "model.safetensors.index.json").is_file()
    moe, tok = load(tmp_path / "moe")
    assert all(p.dtype == torch.bfloat16 for p in moe.parameters())
    assert moe.generate(**tok("0123", return_tensors="pt"), max_new_tokens=3, do_sample=False).shape[1] == 7


def test_qwen3_refusals(tmp_path: Path) -> None:
    """A Qwen3 that slides its window on some layers only, and a shared expert for Qwen3-MoE: one line each."""
    from agentmerge.engine.moe.arch import MoeNames, moe_family
    from agentmerge.engine.moe.moe_plan import make_plan
    from agentmerge.errors import CheckpointError, ConfigError

    assert moe_family({"model_type": "qwen3"}, tmp_path) == "qwen3_moe"
    with pytest.raises(CheckpointError, match="slides its attention window from layer max_window_layers on"):
        moe_family({"model_type": "qwen3", "use_sliding_window": True}, tmp_path)
    with pytest.raises(ConfigError, match="Qwen3MoeForCausalLM has no shared expert"):
        make_plan({}, MoeNames("qwen3_moe"), 2, "base", 0.5, None)
