"""Trainer checkpoints as models: verl FSDP rank files (plain tensors and DTensors) and torch DCP folders.

The folders are built with torch itself, as the trainers write them: verl's ``torch.save`` of each rank's
sharded state dict (dim 0 cut ``torch.chunk``-style, empty pieces for the ranks past the rows, DTensors made
on a single-process fake process group that is gone before anything is read) and ``dcp.save`` with no process
group. Every read is checked against the original state dict; merge, probe and convert against the same
weights in plain safetensors folders.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from tests.tinylm import tokenizer

from agentmerge.config.schema import MergeConfig, ModelSpec
from agentmerge.engine.merge import merge
from agentmerge.engine.probe import probe
from agentmerge.errors import AgentMergeError, CheckpointError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.dcp import DcpCheckpoint
from agentmerge.io.formats.open import open_weights
from agentmerge.io.formats.verl import VerlCheckpoint

HF_AUX = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tiny_llama(folder: Path, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A 2-layer Llama (vocab 92: dim-0 cuts are uneven) saved as a Hugging Face folder; its state dict."""
    tok = tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fsdp_pieces(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    """FSDP's dim-0 pieces: ``torch.chunk``, then empty pieces for the ranks it leaves without rows."""
    pieces = [p.clone() for p in t.chunk(world, 0)] if t.dim() else [t.clone()] * world
    return pieces + [t.new_empty((0, *t.shape[1:]))] * (world - len(pieces))


def verl_step(root: Path, hf: Path, state: dict[str, torch.Tensor], world: int) -> Path:
    """``root/global_step_1/actor/`` with plain-tensor rank files, ``huggingface/`` and ``fsdp_config.json``."""
    actor = _actor(root, hf, world)
    for rank in range(world):
        shard = {k: fsdp_pieces(v, world)[rank] for k, v in state.items()}
        torch.save(shard, actor / f"model_world_size_{world}_rank_{rank}.pt")
    return actor.parent


def _actor(root: Path, hf: Path, world: int) -> Path:
    actor = root / "global_step_1" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    for name in HF_AUX:
        if (hf / name).exists():
            shutil.copy(hf / name, actor / "huggingface" / name)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
    return actor


def verl_dtensor_step(root: Path, hf: Path, state: dict[str, torch.Tensor], mesh_shape: tuple[int, ...]) -> Path:
    """Rank files of DTensors: FSDP on a 1-D mesh, or HSDP (Replicate on ``ddp``, Shard(0) on ``fsdp``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = int(torch.tensor(mesh_shape).prod())
    names = ("fsdp",) if len(mesh_shape) == 1 else ("ddp", "fsdp")
    placements = [Shard(0)] if len(mesh_shape) == 1 else [Replicate(), Shard(0)]
    fsdp = mesh_shape[-1]
    actor = _actor(root, hf, world)
    for rank in range(world):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        try:
            mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
            shard = {
                k: DTensor.from_local(
                    fsdp_pieces(v, fsdp)[rank % fsdp], mesh, placements, run_check=False, shape=v.shape,
                    stride=v.stride(),
                )
                for k, v in state.items()
            }  # fmt: skip
            torch.save(shard, actor / f"model_world_size_{world}_rank_{rank}.pt")
        finally:
            dist.destroy_process_group()
    return actor.parent


def dcp_folder(folder: Path, hf: Path, state: dict[str, torch.Tensor], *, wrapped: bool) -> Path:
    """``dcp.save`` with no process group, wrapped as NeMo RL saves it (``{"model": sd}``) or flat."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": dict(state)} if wrapped else dict(state), checkpoint_id=folder, no_dist=True)
    (folder / "huggingface").mkdir()
    for name in HF_AUX:
        if (hf / name).exists():
            shutil.copy(hf / name, folder / "huggingface" / name)
    return folder


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("trainer")
    base = root / "base"
    tiny_llama(base, 0, torch.bfloat16)
    states = [tiny_llama(root / f"hf{i}", i + 1) for i in range(2)]  # fp32 "master" weights
    return {"root": root, "base": base, "hf": [root / "hf0", root / "hf1"], "states": states}


def check_reads(reader: Any, state: dict[str, torch.Tensor]) -> None:
    """Whole reads equal the state dict; element ranges across piece borders equal the flat slice."""
    assert set(reader.tensors) == set(state)
    gen = torch.Generator().manual_seed(0)
    for name, want in state.items():
        info = reader.tensors[name]
        assert info.shape == tuple(want.shape) and info.dtype == want.dtype, name
        assert torch.equal(reader.read(name).view(want.shape), want), name
        flat = want.reshape(-1)
        for _ in range(5):
            a, b = sorted(torch.randint(0, flat.numel() + 1, (2,), generator=gen).tolist())
            assert torch.equal(reader.read(name, a, b), flat[a:b]), (name, a, b)
            out = torch.empty(b - a, dtype=want.dtype)
            assert torch.equal(reader.read_into(name, a, out), flat[a:b]), (name, a, b)


@pytest.mark.parametrize("world", [2, 4])
def test_verl_plain_rank_files_read_as_the_state_dict(family: dict[str, Any], tmp_path: Path, world: int) -> None:
    step = verl_step(tmp_path, family["hf"][0], family["states"][0], world)
    for ref in (step, step / "actor"):  # the step folder holding actor/, or actor/ itself
        with open_weights(ref) as reader:
            assert isinstance(reader, VerlCheckpoint)
            assert reader.folder == step / "actor" / "huggingface"
            assert len(reader.weight_files) == world
            check_reads(reader, family["states"][0])


@pytest.mark.parametrize("mesh", [(4,), (2, 2)], ids=["fsdp", "hsdp"])
def test_verl_dtensor_rank_files_read_without_a_process_group(
    family: dict[str, Any], tmp_path: Path, mesh: tuple[int, ...]
) -> None:
    step = verl_dtensor_step(tmp_path, family["hf"][0], family["states"][0], mesh)
    assert not torch.distributed.is_initialized()
    with open_weights(step) as reader:
        check_reads(reader, family["states"][0])


@pytest.mark.parametrize("wrapped", [True, False])
def test_dcp_folder_reads_as_the_state_dict(family: dict[str, Any], tmp_path: Path, wrapped: bool) -> None:
    folder = dcp_folder(tmp_path / "dcp", family["hf"][1], family["states"][1], wrapped=wrapped)
    with open_weights(folder) as reader:
        assert isinstance(reader, DcpCheckpoint)
        assert reader.folder == folder / "huggingface"
        check_reads(reader, family["states"][1])
        assert len(reader._cache) <= reader.keep
        for name, want in family["states"][1].items():  # the path for pieces stored through a transform
            assert torch.equal(reader.load_with_dcp(name), want), name


def test_dcp_pieces_of_several_ranks_are_put_in_place(family: dict[str, Any], tmp_path: Path) -> None:
    """Metadata with a tensor in 4 dim-0 pieces (as 4 ranks save it), each its own item, read back whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    state = family["states"][1]
    folder = tmp_path / "dcp"
    name = "model.embed_tokens.weight"
    pieces = fsdp_pieces(state[name], 4)
    dcp.save({f"{name}.{r}": p for r, p in enumerate(pieces)} | state, checkpoint_id=folder, no_dist=True)
    reader = DcpCheckpoint(folder)
    md = reader.dcp_metadata
    chunks, row = [], 0
    for r, p in enumerate(pieces):  # rewrite .metadata: the 4 items become the pieces of one tensor
        key = f"{name}.{r}"
        offsets = torch.Size([row, 0])
        chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=p.shape))
        md.storage_data[MetadataIndex(name, offsets, r)] = md.storage_data.pop(MetadataIndex(key, torch.Size([0, 0])))
        del md.state_dict_metadata[key]
        row += p.shape[0]
    md.state_dict_metadata[name].chunks = chunks
    import pickle

    (folder / ".metadata").write_bytes(pickle.dumps(md))  # read back through the layout proof
    check_reads(DcpCheckpoint(folder), state)


def test_verl_rank_file_missing_or_mixed_is_named(family: dict[str, Any], tmp_path: Path) -> None:
    step = verl_step(tmp_path, family["hf"][0], family["states"][0], 2)
    (step / "actor" / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(CheckpointError, match=r"rank_1\.pt is missing"):
        open_weights(step)
    pieces = {k: fsdp_pieces(v, 2)[1] for k, v in family["states"][0].items()}
    torch.save({k: v.double() for k, v in pieces.items()}, step / "actor" / "model_world_size_2_rank_1.pt")
    with pytest.raises(CheckpointError, match="do not make its shape"):
        open_weights(step)
    (step / "actor" / "fsdp_config.json").write_text('{"world_size": 8}')
    with pytest.raises(CheckpointError, match="world_size 8, but the folder holds 2 rank files"):
        open_weights(step)
    (step / "actor" / "fsdp_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"fsdp_config\.json"):
        open_weights(step)
    (step / "actor" / "fsdp_config.json").unlink()
    torch.save({"x": torch.zeros(2)}, step / "actor" / "model_world_size_2_rank_1.pt")
    with pytest.raises(CheckpointError, match=r"lacks it|not a tensor"):
        open_weights(step)


def test_merge_and_probe_read_trainer_folders_like_their_safetensors(family: dict[str, Any], tmp_path: Path) -> None:
    verl = verl_dtensor_step(tmp_path / "v", family["hf"][0], family["states"][0], (4,))
    dcp = dcp_folder(tmp_path / "dcp", family["hf"][1], family["states"][1], wrapped=True)
    outs = {}
    for kind, models in (("trainer", [verl, dcp]), ("hf", family["hf"])):
        cfg = MergeConfig(method="ties", base=str(family["base"]), models=[ModelSpec(path=str(m)) for m in models])
        outs[kind] = merge(cfg, tmp_path / kind, quiet=True).out_dir
    with Checkpoint(outs["trainer"]) as a, Checkpoint(outs["hf"]) as b:
        assert set(a.tensors) == set(b.tensors)
        for name in a.tensors:
            assert a.tensors[name].dtype == torch.bfloat16  # the base's dtype, from fp32 inputs
            assert torch.equal(a.read(name), b.read(name)), name
    p_trainer = probe(str(family["base"]), [str(verl), str(dcp)], quiet=True)
    p_hf = probe(str(family["base"]), [str(m) for m in family["hf"]], quiet=True)
    for a, b in zip(p_trainer.agents, p_hf.agents, strict=True):
        assert (a.numel, a.updated, a.overlap) == (b.numel, b.updated, b.overlap)
    assert p_trainer.per_tensor.keys() == p_hf.per_tensor.keys()


def test_a_trainer_folder_can_be_the_base(family: dict[str, Any], tmp_path: Path) -> None:
    base_state = {k: v.float() for k, v in Checkpoint_state(family["base"]).items()}
    verl = verl_step(tmp_path / "v", family["base"], base_state, 2)
    outs = []
    for base in (verl, family["base"]):
        cfg = MergeConfig(
            method="task_arithmetic", base=str(base), models=[ModelSpec(path=str(m)) for m in family["hf"]]
        )
        outs.append(merge(cfg, tmp_path / f"out{len(outs)}", quiet=True).out_dir)
    assert json.loads((outs[0] / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (outs[0] / "tokenizer.json").is_file()
    with Checkpoint(outs[0]) as a, Checkpoint(outs[1]) as b:
        for name in a.tensors:
            assert a.tensors[name].dtype == torch.float32  # the trainer base's stored dtype
            assert torch.equal(a.read(name).bfloat16(), b.read(name)), name  # the same fp32 merge, rounded once


def Checkpoint_state(folder: Path) -> dict[str, torch.Tensor]:
    with Checkpoint(folder) as c:
        return {n: c.read(n).view(i.shape) for n, i in c.tensors.items()}


class Boom:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_with_code_is_refused_and_never_runs(family: dict[str, Any], tmp_path: Path) -> None:
    step = verl_step(tmp_path / "v", family["hf"][0], family["states"][0], 2)
    marker = tmp_path / "pwned"
    torch.save({"model.norm.weight": Boom(marker)}, step / "actor" / "model_world_size_2_rank_1.pt")
    with pytest.raises(CheckpointError, match=r"rank_1\.pt: refused to load"):
        open_weights(step)
    folder = dcp_folder(tmp_path / "dcp", family["hf"][1], family["states"][1], wrapped=True)
    import pickle

    (folder / ".metadata").write_bytes(pickle.dumps(Boom(marker)))
    with pytest.raises(CheckpointError, match="not a DCP metadata record"):
        open_weights(folder)
    assert not marker.exists()


def test_convert_writes_a_model_transformers_loads(family: dict[str, Any], tmp_path: Path) -> None:
    from agentmerge.engine.convert import convert

    step = verl_dtensor_step(tmp_path / "v", family["hf"][0], family["states"][0], (2, 2))
    out = convert(step, tmp_path / "hf", dtype="bf16", max_shard_size=4000)
    assert (out / "model.safetensors.index.json").is_file()  # sharded by the shard planner
    cfg = json.loads((out / "config.json").read_text())
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    for name, value in model.state_dict().items():
        assert torch.equal(value, family["states"][0][name].bfloat16()), name
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("ab", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4
    dcp = dcp_folder(tmp_path / "dcp", family["hf"][1], family["states"][1], wrapped=True)
    with Checkpoint(convert(dcp, tmp_path / "hf2")) as c:  # keep: the stored fp32
        for name, want in family["states"][1].items():
            assert torch.equal(c.read(name).view(want.shape), want), name


def test_convert_refuses_to_overwrite_inputs(family: dict[str, Any], tmp_path: Path) -> None:
    from agentmerge.engine.convert import convert

    step = verl_step(tmp_path / "v", family["hf"][0], family["states"][0], 2)
    for out in (step, step / "actor" / "out", tmp_path):
        with pytest.raises(AgentMergeError, match="must not be, contain or lie inside"):
            convert(step, out)
    with pytest.raises(AgentMergeError, match="exists and is not empty"):
        convert(step, family["hf"][1])
    assert sorted(p.name for p in (step / "actor").iterdir())[:2] == ["fsdp_config.json", "huggingface"]


def test_cli_probe_and_merge_take_trainer_folders(family: dict[str, Any], tmp_path: Path) -> None:
    from agentmerge.cli import main

    verl = verl_step(tmp_path / "v", family["hf"][0], family["states"][0], 4)
    dcp = dcp_folder(tmp_path / "dcp", family["hf"][1], family["states"][1], wrapped=True)
    args = ["--base", str(family["base"]), str(verl), str(dcp), "--quiet"]
    assert main(["probe", *args, "--json", str(tmp_path / "p.json")]) == 0
    assert [a["numel"] for a in json.loads((tmp_path / "p.json").read_text())["agents"]] == [8272, 8272]
    merged = ["merge", "--method", "ram_plus", "--base", str(family["base"]), "-o", str(tmp_path / "out"), "--quiet"]
    assert main([*merged, "--model", str(verl), "--model", str(dcp)]) == 0
    record = json.loads((tmp_path / "out" / "merge.json").read_text())
    assert "model_world_size_4_rank_3.pt" in json.dumps(record)  # every rank file hashed as an input


def test_cli_convert_and_its_errors(family: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentmerge.cli import main

    dcp = dcp_folder(tmp_path / "dcp", family["hf"][1], family["states"][1], wrapped=False)
    assert main(["convert", str(dcp), str(tmp_path / "out"), "--dtype", "fp16", "--max-shard-size", "4kB"]) == 0
    with Checkpoint(tmp_path / "out") as c:
        assert len(c.weight_files) > 1
        for name, want in family["states"][1].items():
            assert torch.equal(c.read(name).view(want.shape), want.half()), name
    assert main(["convert", str(dcp), str(tmp_path / "out2"), "--max-shard-size", "lots"]) == 2
    shutil.rmtree(dcp / "huggingface")
    assert main(["convert", str(dcp), str(tmp_path / "out3")]) == 2
    assert "no config.json found" in capsys.readouterr().err
    assert not (tmp_path / "out3").exists()
    assert main(["convert", str(dcp), str(tmp_path / "out3"), "--model-files", str(family["hf"][1])]) == 0
    assert (tmp_path / "out3" / "tokenizer.json").is_file()


def test_fisher_of_a_trainer_folder_equals_the_fisher_of_its_weights(family: dict[str, Any], tmp_path: Path) -> None:
    from agentmerge.evaluation.fisher import estimate_fisher

    step = verl_step(tmp_path / "v", family["hf"][0], family["states"][0], 4)
    outs = [
        estimate_fisher(m, tmp_path / f"f{i}", samples=2, max_tokens=4) for i, m in enumerate([step, family["hf"][0]])
    ]
    with Checkpoint(outs[0]) as a, Checkpoint(outs[1]) as b:
        assert set(a.tensors) == set(b.tensors) == set(family["states"][0])
        for name in a.tensors:
            assert torch.equal(a.read(name), b.read(name)), name
        assert any(bool(a.read(n).abs().sum() > 0) for n in a.tensors)


def test_convert_applies_a_lora_adapter_given_as_model_plus_adapter(tmp_path: Path) -> None:
    from tests.test_lora import make_adapter, merged_by_peft
    from tests.test_lora import tiny_llama as lora_llama

    from agentmerge.engine.convert import convert

    lora_llama(tmp_path / "m")
    adapter = make_adapter(tmp_path / "m", tmp_path / "a")
    out = convert(f"{tmp_path / 'm'}+{adapter}", tmp_path / "out", dtype="fp32")
    want = merged_by_peft(tmp_path / "m", adapter)
    with Checkpoint(out) as c:
        assert set(c.tensors) == set(want)
        for name, value in want.items():
            torch.testing.assert_close(c.read(name).view(value.shape), value, rtol=0, atol=1e-6)


def test_unsupported_shardings_are_refused_by_name(family: dict[str, Any], tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    actor = _actor(tmp_path, family["hf"][0], 2)
    w = family["states"][0]["model.layers.0.mlp.up_proj.weight"]
    for rank in range(2):  # tensor parallel: columns split across the ranks
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
        try:
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
            local = w.chunk(2, 1)[rank].contiguous()
            d = DTensor.from_local(local, mesh, [Shard(1)], run_check=False, shape=w.shape, stride=w.stride())
            torch.save({"w": d}, actor / f"model_world_size_2_rank_{rank}.pt")
        finally:
            dist.destroy_process_group()
    with pytest.raises(CheckpointError, match=r"placement Shard\(dim=1\) is not supported"):
        open_weights(actor)
    (actor / "model_world_size_2_rank_1.pt").write_bytes(b"\x80\x02}q\x00.")  # a legacy (non-zip) pickle
    with pytest.raises(CheckpointError, match="not a torch zip archive"):
        open_weights(actor)


def test_fully_shard_state_dicts_as_verl_saves_them(family: dict[str, Any], tmp_path: Path) -> None:
    """The real thing: FSDP2 (``fully_shard``) on each of 4 fake ranks, ``torch.save(model.state_dict())`` per rank,
    as verl's checkpoint manager does; read back equal to the unsharded model, then merged like its safetensors."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    hf, state = family["hf"][0], family["states"][0]
    actor = _actor(tmp_path, hf, 4)
    for rank in range(4):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("fsdp",))
            model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            torch.save(model.state_dict(), actor / f"model_world_size_4_rank_{rank}.pt")
        finally:
            dist.destroy_process_group()
    with open_weights(actor.parent) as reader:
        check_reads(reader, state)
    outs = []
    for models in ([actor, family["hf"][1]], family["hf"]):
        cfg = MergeConfig(method="ram", base=str(family["base"]), models=[ModelSpec(path=str(m)) for m in models])
        outs.append(merge(cfg, tmp_path / f"out{len(outs)}", quiet=True).out_dir)
    with Checkpoint(outs[0]) as a, Checkpoint(outs[1]) as b:
        for name in state:
            assert torch.equal(a.read(name), b.read(name)), name
