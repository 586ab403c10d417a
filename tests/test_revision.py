"""Hub ids with ``@revision``: parsing, resolution through huggingface_hub (faked: no network), what a merge records.

The fake ``snapshot_download`` lays the tiny family out as the Hugging Face cache does
(``models--org--name/snapshots/<commit>/``), one commit per (repository, revision), and logs every call.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import yaml
from huggingface_hub.errors import LocalEntryNotFoundError

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.config.mergekit import from_mergekit
from agentmerge.engine.render import model_card
from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.io.formats.checkpoint import resolve_model_path
from agentmerge.io.formats.hubref import HubRef, hub_repo_id, is_hub_ref, parse_hub_ref, snapshot_commit, split_revision

Calls = list[tuple[str, str | None]]


def commit_of(repo: str, revision: str | None) -> str:
    return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


@pytest.fixture
def fake_hub(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Calls, dict[str, Path]]:
    """``org/base`` and ``org/a``, ``org/b``, ``org/c`` served from the tiny family; every call logged."""
    base, agents = tiny_family
    repos = {"org/base": base, "org/a": agents[0], "org/b": agents[1], "org/c": agents[2]}
    calls: Calls = []

    def snapshot_download(repo_id: str, *, revision: str | None = None, allow_patterns: object = None) -> str:
        calls.append((repo_id, revision))
        assert allow_patterns is not None and "*.safetensors" in allow_patterns  # type: ignore[operator]
        if repo_id not in repos:
            raise huggingface_hub.errors.RepositoryNotFoundError(f"404 for {repo_id}")
        snap = tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit_of(repo_id, revision)
        if not snap.exists():
            shutil.copytree(repos[repo_id], snap)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)  # no stray local folder named org/ where the tests run
    return calls, repos


def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> str:
        raise AssertionError(f"snapshot_download called with {args} {kwargs}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("org/name", HubRef("org/name")),
        ("org/name@main", HubRef("org/name", "main")),
        ("Qwen/Qwen2.5-0.5B@v1.0", HubRef("Qwen/Qwen2.5-0.5B", "v1.0")),
        ("org/name@refs/pr/3", HubRef("org/name", "refs/pr/3")),
        ("org/name@" + "a" * 40, HubRef("org/name", "a" * 40)),
        ("org/name@", None),
        ("org/name@a@b", None),
        ("org/name@../x", None),
        ("org/name@has space", None),
        ("name@main", None),
        ("./org/name@main", None),
    ],
)
def test_split_revision(ref: str, expected: HubRef | None) -> None:
    assert split_revision(ref) == expected
    if expected is not None:
        assert str(expected) == ref


def test_a_local_folder_with_at_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name@v2").mkdir(parents=True)
    assert parse_hub_ref("org/name@v2") is None and not is_hub_ref("org/name@v2")
    assert hub_repo_id("org/name@v2") is None and hub_repo_id("org/other@v2") == "org/other"
    no_download(monkeypatch)
    assert resolve_model_path("org/name@v2") == Path("org/name@v2")


def test_snapshot_commit_reads_the_cache_layout(tmp_path: Path) -> None:
    sha = commit_of("org/a", "main")
    assert snapshot_commit(tmp_path / "models--org--a" / "snapshots" / sha) == sha
    assert snapshot_commit(tmp_path / "snapshots" / "main") is None
    assert snapshot_commit(tmp_path / "blobs" / sha) is None


# --------------------------------------------------------------------------- resolution


def test_revision_is_passed_to_huggingface_hub(fake_hub: tuple[Calls, dict[str, Path]]) -> None:
    calls, _ = fake_hub
    path = resolve_model_path("org/a@refs/pr/3")
    assert calls == [("org/a", "refs/pr/3")] and path.name == commit_of("org/a", "refs/pr/3")
    resolve_model_path("org/a")
    assert calls[-1] == ("org/a", None)


@pytest.mark.parametrize(
    "error",
    [LocalEntryNotFoundError("offline: not in the cache"), huggingface_hub.errors.OfflineModeIsEnabled("offline")],
)
def test_offline_names_the_id_and_the_revision(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def offline(*args: object, **kwargs: object) -> str:
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError) as e:
        resolve_model_path("org/a@v1.2")
    msg = str(e.value)
    assert msg.startswith("org/a@v1.2: could not fetch revision 'v1.2' of hub id 'org/a'")
    assert "--revision v1.2" in msg and type(error).__name__ in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match=r"^org/a: could not fetch this hub id"):
        resolve_model_path("org/a")


def test_missing_local_paths_with_at_are_not_fetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    no_download(monkeypatch)
    for ref in ("./x@v1", "models/agent@v1", "/abs/org@v1"):
        with pytest.raises(CheckpointError, match="no such file or folder"):
            resolve_model_path(ref)


# --------------------------------------------------------------------------- a merge of revisions


def test_merge_records_commits_and_the_card_lists_ids(fake_hub: tuple[Calls, dict[str, Path]], tmp_path: Path) -> None:
    calls, _ = fake_hub
    cfg = MergeConfig(
        method="ram",
        base="org/base@v1.0",
        models=[ModelSpec(path="org/a@main"), ModelSpec(path="org/b"), ModelSpec(path="org/c@" + "c" * 40)],
    )
    merge(cfg, tmp_path / "out", quiet=True)
    assert ("org/base", "v1.0") in calls and ("org/a", "main") in calls and ("org/b", None) in calls
    record = json.loads((tmp_path / "out" / "merge.json").read_text())
    assert record["config"]["base"] == "org/base@v1.0" and record["config"]["models"][0]["path"] == "org/a@main"
    assert record["hub"] == {
        "org/base@v1.0": {"repo_id": "org/base", "revision": "v1.0", "commit": commit_of("org/base", "v1.0")},
        "org/a@main": {"repo_id": "org/a", "revision": "main", "commit": commit_of("org/a", "main")},
        "org/b": {"repo_id": "org/b", "revision": None, "commit": commit_of("org/b", None)},
        f"org/c@{'c' * 40}": {"repo_id": "org/c", "revision": "c" * 40, "commit": commit_of("org/c", "c" * 40)},
    }
    assert set(record["inputs"]) == set(record["hub"])
    front = yaml.safe_load((tmp_path / "out" / "README.md").read_text().split("---\n")[1])
    assert front["base_model"] == ["org/base", "org/a", "org/b", "org/c"]  # ids only, as the Hub expects
    assert front["base_model_relation"] == "merge"


def test_the_card_lists_one_id_once_across_revisions(tmp_path: Path) -> None:
    from agentmerge.engine.provenance import MergeResult

    cfg = MergeConfig(method="ram", base="org/base@v1", models=[ModelSpec(path="org/a@v1"), ModelSpec(path="org/a@v2")])
    front = yaml.safe_load(model_card(cfg, MergeResult(tmp_path, "ram", {}, 1.0, 1, 1)).split("---\n")[1])
    assert front["base_model"] == ["org/base", "org/a"]


def test_cli_flags_and_native_yaml_take_revisions(fake_hub: tuple[Calls, dict[str, Path]], tmp_path: Path) -> None:
    calls, _ = fake_hub
    argv = ["merge", "--method", "ram", "--base", "org/base@v2", "--model", "org/a@v2", "--model", "org/b@v3"]
    assert main([*argv, "-o", str(tmp_path / "flags"), "--quiet"]) == 0
    assert {("org/base", "v2"), ("org/a", "v2"), ("org/b", "v3")} <= set(calls)
    doc = {"method": "ram", "base": "org/base@v2", "models": ["org/a@v2", {"path": "org/c@refs/pr/1"}]}
    (tmp_path / "native.yaml").write_text(yaml.safe_dump(doc))
    assert main(["merge", str(tmp_path / "native.yaml"), str(tmp_path / "yaml"), "--quiet"]) == 0
    assert ("org/c", "refs/pr/1") in calls
    assert (
        json.loads((tmp_path / "yaml" / "merge.json").read_text())["hub"]["org/c@refs/pr/1"]["revision"] == "refs/pr/1"
    )


def test_cli_offline_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def offline(*args: object, **kwargs: object) -> str:
        raise LocalEntryNotFoundError("cannot reach the Hub and the revision is not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)
    argv = ["merge", "--method", "ram", "--base", "org/base@v2", "--model", "org/a", "-o", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "revision 'v2' of hub id 'org/base'" in err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- mergekit's spellings


@pytest.mark.parametrize(
    "model",
    [
        "org/a@v2",
        {"path": "org/a", "revision": "v2"},
        {"model": {"path": "org/a", "revision": "v2"}},
        {"model": "org/a@v2"},
    ],
)
def test_mergekit_revisions_are_read(model: object) -> None:
    doc = {
        "merge_method": "ties",
        "base_model": {"model": {"path": "org/base", "revision": "main"}},
        "models": [{"model": model}, {"model": "org/b"}],
    }
    conv = from_mergekit(doc, "mk.yaml")
    assert conv.config["base"] == "org/base@main"
    assert [m["path"] for m in conv.config["models"]] == ["org/a@v2", "org/b"]


def test_mergekit_lora_on_a_revision() -> None:
    doc = {
        "merge_method": "linear",
        "models": [{"model": {"model": {"path": "org/a", "revision": "v1"}, "lora": "ad"}}],
    }
    assert from_mergekit(doc).config["models"][0]["path"] == "org/a@v1+ad"


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ("org/a@v1@v2", "once per model"),
        ("./local@v1", "after a hub id"),
        ({"path": "org/a", "revision": ""}, "expected {path"),
        ({"path": "org/a", "revision": "v1", "extra": 1}, "unknown key 'extra'"),
        ({"path": "not a hub id", "revision": "v1"}, "not a hub id with a revision"),
    ],
)
def test_mergekit_bad_revisions_are_refused(model: object, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_mergekit({"merge_method": "linear", "models": [{"model": model}]}, "mk.yaml")
    assert needle in str(e.value) and str(e.value).startswith("mk.yaml: models[0].model")


def test_mergekit_revision_on_a_local_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="revision 'v1' given for the local path"):
        from_mergekit(
            {"merge_method": "linear", "models": [{"model": {"path": str(tmp_path / "m"), "revision": "v1"}}]}
        )
    local = tmp_path / "ckpt@v1"
    local.mkdir()
    assert from_mergekit({"merge_method": "linear", "models": [{"model": str(local)}]}).config["models"][0][
        "path"
    ] == str(local)


def test_tokenizer_source_from_a_hub_revision(
    fake_hub: tuple[Calls, dict[str, Path]], tmp_path: Path, tiny_family: tuple[Path, list[Path]]
) -> None:
    calls, repos = fake_hub
    tok = tmp_path / "tok-src"
    shutil.copytree(tiny_family[0], tok)
    (tok / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    repos["org/tok"] = tok
    base, agents = tiny_family
    cfg = MergeConfig(
        method="ram", base=str(base), models=[ModelSpec(path=str(a)) for a in agents], tokenizer_source="org/tok@v3"
    )
    merge(cfg, tmp_path / "out", quiet=True)
    assert ("org/tok", "v3") in calls
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (tok / "tokenizer.json").read_text()
