"""Several processes on the CPU, docs/multi_gpu.md: the rank arithmetic and the store collectives of
whiflash.distributed; torchrun datagen writes the one-process dataset and a killed rank resumes; DDP training
(gloo) reaches one device's metrics; torchrun bench shards samples and rank 0 merges them."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from whiflash import distributed
from whiflash.data import read_manifest
from whiflash.datagen.cli import datagen
from whiflash.distributed import Ranks

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[7, 8, 9, 10, 11, 12], [40, 3, 3, 17, 29, 30, 31, 2, 5, 5, 6], [1, 2, 3], [4, 4, 4, 9], [20, 21, 22, 23, 24],
           [11, 2, 33, 4], [5, 6, 7, 8, 9, 10, 11], [30, 3], [9, 9, 2, 7]]
SHARD_SIZE = 2  # 9 prompts: 5 shards, so two ranks get 3 and 2


def _env(**extra: str) -> dict[str, str]:
    """A child's environment: this checkout importable, one thread a process (two processes share 2 cores)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple) -> None:
    """Body of one spawned rank: torchrun's variables, then ``fn(rank, *args)``."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    fn(rank, *args)


def spawn(fn: Callable[..., Any], world: int, *args: Any) -> None:
    """Run ``fn(rank, *args)`` in ``world`` fresh processes of one launch (rank 0 hosts its store at MASTER_PORT, as
    without torchrun's agent); a rank that fails ends all."""
    mp.spawn(_rank_main, args=(world, _free_port(), fn, args), nprocs=world, join=True)


def python(*argv: str, **env: str) -> None:
    """``python ARGV`` in a child process; a failure shows the end of its output."""
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=_env(**env), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def torchrun(world: int, *argv: str) -> None:
    """``torchrun --standalone --nproc-per-node WORLD ARGV`` in a child process."""
    python("-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", *argv)


# ---------------------------------------------------------------- rank arithmetic


@pytest.mark.parametrize("world", [1, 2, 3, 5, 12])
def test_shares_cover_every_item_exactly_once(world: int) -> None:
    items = list(range(11))
    shares = [Ranks(r, world).share(items) for r in range(world)]
    assert sorted(i for s in shares for i in s) == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_ranks_from_env_and_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    one = distributed.from_env()
    assert one == Ranks(0, 1, 0) and one.device("cuda:1") == "cuda:1"  # one process keeps what it was given
    assert distributed.init() == one and distributed.gather("x") == ["x"] and distributed.broadcast(3) == 3
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ranks = distributed.from_env()
    assert ranks == Ranks(3, 4, 1) and not ranks.is_main and ranks.device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"--device cuda:0: under torchrun \(WORLD_SIZE=4\) give the device type"):
        ranks.device("cuda:0")
    if torch.cuda.device_count() < 2:
        with pytest.raises(ValueError, match="LOCAL_RANK 1 with 1 process.es. per device needs device 1, but this host"):
            ranks.device("cuda")
    # several ranks on one GPU: LOCAL_RANK // per_device picks the device
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    assert ranks.device("cuda", per_device=2) == "cuda:0"
    with pytest.raises(ValueError, match=r"start at most 2 processes per host"):
        Ranks(3, 4, 3).device("cuda", per_device=2)
    with pytest.raises(ValueError, match="processes per device 0: expected 1 or more"):
        ranks.device("cuda", per_device=0)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="expected 0 <= RANK < WORLD_SIZE"):
        distributed.from_env()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one': expected an integer"):
        distributed.from_env()


# ---------------------------------------------------------------- collectives


def _collectives_rank(rank: int, calls: int) -> None:
    """Many collectives in a mixed order, each checked; no process group, and no key left behind."""
    ranks = distributed.init()
    assert ranks == Ranks(rank, 3, rank) and distributed.init() == ranks  # joined once
    for i in range(calls):
        assert distributed.gather((rank, i, b"x" * (rank * 1000 * (i % 3)))) == [
            (r, i, b"x" * (r * 1000 * (i % 3))) for r in range(3)]
        assert distributed.broadcast({"call": i} if rank == 0 else None) == {"call": i}
        if i % 4 == 0:
            distributed.barrier()
    distributed.barrier()
    assert not dist.is_initialized()  # no gloo group, so no process-group teardown at exit
    if rank == 0:  # the last collective is over on every rank: only a fresh store's own keys are left
        assert distributed._STORE.num_keys() == dist.TCPStore("127.0.0.1", 0, 1, True).num_keys()


def test_store_collectives_give_every_rank_the_same_values_in_rank_order() -> None:
    spawn(_collectives_rank, 3, 40)


def _left_alone_rank(rank: int, leaver: int) -> None:
    """Rank ``leaver`` leaves without the barrier the other calls: the other fails within the timeout."""
    os.environ[distributed.TIMEOUT_ENV] = "3"
    distributed.init()
    if rank == leaver:
        return
    start = time.monotonic()
    with pytest.raises(dist.DistError):  # rank 1 times out; rank 0's store going down fails rank 1 at once
        distributed.barrier()
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("leaver", [0, 1])
def test_a_rank_left_waiting_fails_within_the_timeout(leaver: int) -> None:
    spawn(_left_alone_rank, 2, leaver)


def _own_group_rank(rank: int) -> None:
    """The caller initialised its own process group: the collectives go over it."""
    dist.init_process_group("gloo")
    distributed.init()
    assert distributed.gather(rank * 10) == [0, 10]
    assert distributed.broadcast("zero" if rank == 0 else None) == "zero"
    distributed.barrier()
    # Tearing a gloo group down at exit aborts a rank now and then ("terminate called without an active
    # exception", even after destroy_process_group: the reason datagen and bench use the store). The group is
    # this test's, so its ranks leave without that teardown; a failed assertion above still fails the rank.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_a_callers_own_process_group_carries_the_collectives() -> None:
    spawn(_own_group_rank, 2)


# ---------------------------------------------------------------- datagen


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "ids.jsonl"
    path.write_text("".join(json.dumps({"id": i, "category": ("math", "code")[i % 2], "input_ids": p}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def _datagen_kwargs(world: Any, prompt_file: Path) -> dict[str, Any]:
    return dict(prompts=[str(prompt_file)], target=str(world.target_dir), eagle3=str(world.eagle_dir),
                dflash=str(world.dflash_dir), max_new_tokens=24, shard_size=SHARD_SIZE, device="cpu")


@pytest.fixture(scope="module")
def one_process(worlds: dict, prompt_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same datagen in this one process (one thread, as every rank runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return datagen(out=tmp_path_factory.mktemp("one") / "data", **_datagen_kwargs(worlds["qwen3-mixed"],
                                                                                       prompt_file))
    finally:
        torch.set_num_threads(threads)


def _rows(data: Path) -> list[tuple]:
    """Every row of a dataset as a tuple (hidden as bytes), sorted: the dataset as a set of rows."""
    import pyarrow.parquet as pq

    table = pq.read_table([data / s.file for s in read_manifest(data).shards]).to_pylist()
    return sorted(tuple(bytes(memoryview(torch.tensor(v, dtype=torch.float16).numpy())) if k == "hidden" else v
                        for k, v in sorted(r.items())) for r in table)


def test_torchrun_datagen_writes_the_one_process_dataset(worlds: dict, prompt_file: Path, one_process: Path,
                                                         tmp_path: Path) -> None:
    world = worlds["qwen3-mixed"]
    out = tmp_path / "data"
    kw = _datagen_kwargs(world, prompt_file)
    torchrun(2, "-m", "whiflash.datagen", "--out", str(out), "--prompts", json.dumps(kw.pop("prompts")),
             *[f"--{k}={v}" for k, v in kw.items()])
    assert _rows(out) == _rows(one_process)  # the merged rows, as a set
    # stronger: the same shards, byte for byte, in the same order (whichever rank claimed each)
    assert read_manifest(out).shards == read_manifest(one_process).shards
    from whiflash.train.data import RouterDataModule  # whiflash-train reads it as it reads any dataset

    dm = RouterDataModule(str(out), val_fraction=0.25, test_fraction=0.0, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    assert sum(len(dm.split_indices[s]) for s in ("train", "val")) == read_manifest(out).num_rows


def _datagen_rank(rank: int, out: str, kwargs: dict[str, Any], die_after_first_shard: int | None) -> None:
    """One rank of datagen; rank ``die_after_first_shard`` is killed (os._exit) right after its first shard."""
    if rank == die_after_first_shard:
        import whiflash.datagen.cli as cli

        write_shard = cli.write_shard

        def write_then_die(*args: Any, **kw: Any) -> Any:
            write_shard(*args, **kw)
            os._exit(9)

        cli.write_shard = write_then_die
    datagen(out=Path(out), **kwargs)


def test_a_killed_rank_resumes_and_loses_nothing(worlds: dict, prompt_file: Path, one_process: Path,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "data"
    kwargs = _datagen_kwargs(worlds["qwen3-mixed"], prompt_file)
    with pytest.raises(mp.ProcessExitedException, match="exit code 9"):
        spawn(_datagen_rank, 2, str(out), kwargs, 1)
    assert not (out / "manifest.json").exists()  # the launch ended (rank 0 was stopped too)
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.parquet")}
    assert kept  # rank 1's first shard, whichever it claimed
    assert len(list(out.glob(".claims-*"))) == 1  # the killed launch's claims stay behind ...
    spawn(_datagen_rank, 2, str(out), kwargs, None)  # the same arguments
    assert read_manifest(out).shards == read_manifest(one_process).shards  # nothing lost, nothing duplicated
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.parquet") if p.name in kept} == kept
    assert not list(out.glob(".claims-*"))  # ... and go when a launch finishes


# ---------------------------------------------------------------- train (Lightning DDP)

FIT = ["--trainer.max_epochs", "2", "--model.mlp_dim", "32", "--data.batch_size", "128", "--trainer.accelerator",
       "cpu", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--num_threads", "1"]


@pytest.fixture(scope="module")
def router_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from whiflash.train.synthetic import write_synthetic_dataset

    data = tmp_path_factory.mktemp("router") / "data"
    write_synthetic_dataset(data, num_prompts=60, rounds_per_prompt=20, hidden_size=16, seed=1, progress=False)
    return data


def _train(devices: int, command: str, data: Path, out: Path, *extra: str) -> Path:
    """``whiflash-train COMMAND`` on ``devices`` CPU processes (gloo DDP; Lightning starts rank 1 by running the
    same command again), or on one device in this process (no DDP, so no process group is left behind);
    returns the run folder."""
    argv = [command, "--data.path", str(data), "--trainer.default_root_dir", str(out), "--trainer.devices",
            str(devices), "--trainer.strategy", "ddp" if devices > 1 else "auto", "--data.cache_dir",
            str(out.parent / "cache"), *FIT, *extra]
    hf = {"HF_HOME": str(out.parent / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if devices == 1:  # in this process: no second start of Python and Lightning
        from whiflash.train.cli import run

        threads = torch.get_num_threads()
        with pytest.MonkeyPatch.context() as mp_:
            for k, v in hf.items():
                mp_.setenv(k, v)
            mp_.setattr(sys, "argv", ["whiflash-train"])
            run(argv)
        torch.set_num_threads(threads)
    else:
        python("-m", "whiflash.train.cli", *argv, **hf)
    (run,) = out.iterdir()  # one run folder, whatever the number of ranks
    return run


def test_every_rank_steps_through_its_part_of_every_batch(router_data: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from whiflash.train.data import BatchIndexSampler, RouterDataModule

    idx = np.arange(0, 203, 2)  # 102 rows, batches of 16: the last holds 6
    for shuffle in (False, True):
        one = list(BatchIndexSampler(idx, 16, shuffle, seed=3))
        for world in (2, 3):
            parts = [list(BatchIndexSampler(idx, 16, shuffle, seed=3, rank=r, world=world)) for r in range(world)]
            assert all(len(p) == len(one) for p in parts)  # DDP ranks step together
            for step, batch in enumerate(one):
                assert sorted(np.concatenate([p[step] for p in parts])) == sorted(batch)
    tiny = [list(BatchIndexSampler(np.array([5]), 16, False, rank=r, world=2)) for r in (0, 1)]
    assert tiny == [[np.array([5])], [np.array([5])]]  # fewer rows than ranks: no rank gets an empty batch
    dm = RouterDataModule(str(router_data), cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1,
                                 _accelerator_connector=SimpleNamespace(use_distributed_sampler=True))
    with pytest.raises(ValueError, match="--trainer.use_distributed_sampler true: .* expected false"):
        dm.train_dataloader()


def test_ddp_on_two_processes_trains_what_one_device_trains(router_data: Path, tmp_path: Path) -> None:
    runs = {d: _train(d, "fit", router_data, tmp_path / f"out{d}") for d in (1, 2)}
    results = {d: json.loads((run / "results.json").read_text()) for d, run in runs.items()}
    for key in ("mse", "mae", "spearman", "auroc"):  # each rank stepped through half of every batch
        assert results[2][key] == pytest.approx(results[1][key], rel=1e-4, abs=1e-5), key
    for key in ("share", "tau_best", "best_threshold"):
        assert results[2]["routing"][key] == pytest.approx(results[1]["routing"][key], rel=1e-4, abs=1e-5), key
    manifest = json.loads((runs[2] / "manifest.json").read_text())
    assert manifest["devices"] == 2 and manifest["global_step"] == json.loads(
        (runs[1] / "manifest.json").read_text())["global_step"]
    assert len(list(runs[2].glob("**/model.safetensors"))) == 1  # exported once, by rank 0
    assert len(list((runs[2] / "checkpoints").glob("*.ckpt"))) == 1


def test_ddp_predict_gathers_every_row_in_order(router_data: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    run = _train(1, "fit", router_data, tmp_path / "fit")
    (ckpt,) = (run / "checkpoints").glob("*.ckpt")
    tables = [pq.read_table(_train(d, "predict", router_data, tmp_path / f"predict{d}", "--ckpt_path", str(ckpt))
                            / "predictions.parquet").to_pydict() for d in (1, 2)]
    assert tables[0]["row"] == tables[1]["row"] and len(tables[0]["row"]) > 100
    assert tables[1]["pred"] == pytest.approx(tables[0]["pred"], abs=1e-6)


# ---------------------------------------------------------------- eval bench

BENCH = ["--dataset", "testbed:test", "--max-samples", "3", "--methods", "ar,dflash", "--max-new-tokens", "12",
         "--warmup-tokens", "4", "--bootstrap", "50", "--dtype", "float32", "--device", "cpu", "--threads", "1",
         "--no-plots", "--name", "sharded"]


def test_torchrun_bench_shards_samples_and_rank0_merges_them(micro: Path, tmp_path: Path) -> None:
    from whiflash.eval.cli import main

    torchrun(2, "-m", "whiflash.eval", "bench", "--testbed", str(micro), "--out", str(tmp_path / "two"), *BENCH)
    (run,) = (tmp_path / "two").glob("*_sharded")
    manifest = json.loads((run / "manifest.json").read_text())
    ids = [s["id"] for s in manifest["samples"]]
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1] and {r["device"] for r in manifest["ranks"]} == {"cpu"}
    assert sorted(i for r in manifest["ranks"] for i in r["samples"]) == sorted(ids)  # every sample once
    per_rank = [[json.loads(x) for x in (run / f"samples-rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert [{row["sample"] for row in rows} for rows in per_rank] == [set(r["samples"]) for r in manifest["ranks"]]
    merged = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert sorted(map(json.dumps, merged)) == sorted(json.dumps(row) for rows in per_rank for row in rows)
    results = json.loads((run / "results.json").read_text())
    assert results["samples"] == 3 and results["mismatches"] == []
    # the same outputs as one process on the same samples (greedy, float32)
    assert main(["bench", "--testbed", str(micro), "--out", str(tmp_path / "one"), *BENCH]) == 0
    (one,) = (tmp_path / "one").glob("*_sharded")
    tokens = lambda rows: sorted((r["sample"], r["method"], r["tokens"]) for r in rows)  # noqa: E731
    assert tokens(merged) == tokens(json.loads(x) for x in (one / "samples.jsonl").read_text().splitlines())


def test_mixed_gpu_models_are_refused_unless_allowed() -> None:
    from whiflash.eval.bench import check_devices

    same = [{"device": f"cuda:{i}", "gpu": "NVIDIA H200"} for i in (0, 1)]
    assert check_devices(same, allow_mixed=False) == same
    mixed = [same[0], {"device": "cuda:1", "gpu": "NVIDIA A100-SXM4-80GB"}]
    with pytest.raises(ValueError, match=r"rank 0: NVIDIA H200, rank 1: NVIDIA A100.*--allow-mixed-devices"):
        check_devices(mixed, allow_mixed=False)
    assert check_devices(mixed, allow_mixed=True) == mixed


def test_only_bench_runs_under_torchrun(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from whiflash.eval.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        main(["report", "some_run"])
    assert "whiflash-eval report runs in one process" in capsys.readouterr().err


def test_ranks_claim_each_shard_once_and_go_on_when_their_shards_were_quick(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    from whiflash.datagen.cli import _claims

    assert list(_claims(tmp_path, 3, Ranks(0, 1, 0))) == [0, 1, 2]  # one process: every shard, no claim files
    assert not list(tmp_path.iterdir())
    (tmp_path / ".claims-killed").mkdir()  # a killed launch had claimed shards 0 and 1
    (tmp_path / ".claims-killed" / "00000").touch()
    (tmp_path / ".claims-killed" / "00001").touch()
    monkeypatch.setattr(distributed, "broadcast", lambda obj: "launch")  # rank 0's launch id on every rank
    fast, slow = _claims(tmp_path, 6, Ranks(0, 2, 0)), _claims(tmp_path, 6, Ranks(1, 2, 1))
    taken = {"fast": [next(fast)], "slow": [next(slow)]}
    taken["fast"] += list(fast)  # the slow rank is still on its first shard: the fast one takes all the rest
    assert taken == {"fast": [0, 2, 3, 4, 5], "slow": [1]}
    assert list(slow) == []
    assert sorted(p.name for p in (tmp_path / ".claims-launch").iterdir()) == [f"{i:05d}" for i in range(6)]
