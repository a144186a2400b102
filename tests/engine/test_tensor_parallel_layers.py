"""The TP-aware layers really shard: two gloo ranks of a model give the single-rank logits."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.attention import SdpaBackend, SeqSpan, build_metadata
from engine.layers.parallel import TensorParallel
from engine.loader import build_model
from tests.conftest import make_tiny_model_dir


def _logits(path, tp: TensorParallel) -> torch.Tensor:
    cfg = json.loads((path / "config.json").read_text())
    model = build_model(cfg, [path / "model.safetensors"], max_positions=64, dtype=torch.float32,
                        device=torch.device("cpu"), tp=tp)
    backend = SdpaBackend()
    backend.allocate(num_layers=model.args.num_layers, num_slots=64, num_kv_heads=model.num_kv_heads_local,
                     head_dim=model.args.head_dim, dtype=torch.float32, device=torch.device("cpu"))
    ids = torch.arange(3, 23)
    with torch.no_grad():
        meta = build_metadata(range(20), [SeqSpan(0, 20, slice(0, 20), 20)])
        return model.compute_logits(model(ids, torch.arange(20), meta, backend))


def _worker(rank: int, port: int, path, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    logits = _logits(path, TensorParallel(rank, 2, dist.group.WORLD))
    if rank == 0:
        torch.save(logits, out)
    dist.barrier()
    # Leave without tearing gloo down: its destructor races with the peer's closing sockets and can abort
    # the process ("terminate called without an active exception") after the work is done.
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_two_ranks_match_one(tmp_path, family):
    # 4 query heads and 2 KV heads split over 2 ranks; the vocabulary (384) splits evenly too
    path = make_tiny_model_dir(tmp_path, family=family, tied=family == "qwen3")
    out = tmp_path / "tp2.pt"
    mp.start_processes(_worker, args=(_free_port(), path, out), nprocs=2, join=True, start_method="spawn")
    assert torch.allclose(torch.load(out), _logits(path, TensorParallel()), atol=1e-4)
