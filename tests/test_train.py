"""whiflash-train without a Trainer: dataset contract, datamodule splits, routing metrics, bad input, push."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from whiflash.router import NeuralRouter, export_single_file, load_router
from whiflash.train.data import RouterDataModule
from whiflash.data import MANIFEST_FIELDS, DatasetFormatError, manifest_hash, read_manifest, sha256_file
from whiflash.train.metrics import routing_summary
from whiflash.train.synthetic import write_synthetic_dataset

H = 16


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny MLPs: extra threads only spin on a shared 2-core box
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "ds"
    write_synthetic_dataset(out, num_prompts=60, rounds_per_prompt=10, hidden_size=H, seed=3, rows_per_shard=200,
                            progress=False)
    return out


def _dm(path: Path, tmp_path: Path, **kw) -> RouterDataModule:
    return RouterDataModule(str(path), batch_size=64, cache_dir=str(tmp_path / "cache"), **kw)


def test_synthetic_dataset_follows_the_contract(dataset: Path) -> None:
    manifest = read_manifest(dataset)
    assert set(MANIFEST_FIELDS) <= set(json.loads((dataset / "manifest.json").read_text()))
    assert manifest.hidden_size == H and str(manifest.pair) == "df-e3" and manifest.dtype == "float16"
    assert len(manifest.shards) == 3 and manifest.num_rows == 600
    for shard in manifest.shards:
        assert sha256_file(dataset / shard.file) == shard.sha256
    assert not list(dataset.glob("*.tmp")) and not list(dataset.glob(".*"))  # atomic writes leave no temp files
    t = pq.read_table(dataset / manifest.shards[0].file)
    assert t.schema.field("hidden").type.value_type.bit_width == 16 and t.schema.field("hidden").type.list_size == H
    d = t.to_pydict()
    assert all(1 <= x <= 16 for x in d["tau_0"] + d["tau_1"])
    assert d["gain"] == [a - b for a, b in zip(d["tau_0"], d["tau_1"])]
    assert d["active"] == [0 if a > b else 1 for a, b in zip(d["tau_0"], d["tau_1"])]


def test_split_by_prompt_never_leaks(dataset: Path, tmp_path: Path) -> None:
    dm = _dm(dataset, tmp_path, val_fraction=0.2, test_fraction=0.2)
    dm.setup("fit")
    table = pq.ParquetDataset(sorted(dataset.glob("*.parquet"))).read(columns=["prompt_id"]).to_pydict()["prompt_id"]
    rows = {s: set(dm.split_indices[s].tolist()) for s in ("train", "val", "test")}
    prompts = {s: {table[i] for i in rows[s]} for s in rows}
    assert prompts["train"].isdisjoint(prompts["val"]) and prompts["train"].isdisjoint(prompts["test"])
    assert prompts["val"].isdisjoint(prompts["test"])
    assert sum(len(r) for r in rows.values()) == 600  # every row in exactly one split
    assert (len(prompts["val"]), len(prompts["test"]), len(prompts["train"])) == (12, 12, 36)
    assert prompts["val"] == set(dm.split_prompts["val"])
    # Batches keep float16 and carry the taus; the same seed gives the same split.
    batch = next(iter(dm.val_dataloader()))
    assert batch["hidden"].dtype == torch.float16 and batch["hidden"].shape == (64, H)
    assert torch.equal(batch["gain"], (batch["tau_0"] - batch["tau_1"]).float())
    again = _dm(dataset, tmp_path, val_fraction=0.2, test_fraction=0.2)
    again.setup("fit")
    assert np.array_equal(again.split_indices["val"], dm.split_indices["val"])


def test_extra_datasets_only_add_training_rows(dataset: Path, tmp_path: Path) -> None:
    # rows of the same 60 prompts and 10 more, as datagen --path router would log them along a router's path
    extra = tmp_path / "extra"
    write_synthetic_dataset(extra, num_prompts=70, rounds_per_prompt=5, hidden_size=H, seed=4, rows_per_shard=100,
                            progress=False)
    alone = _dm(dataset, tmp_path, val_fraction=0.2, test_fraction=0.2)
    alone.setup("fit")
    dm = _dm(dataset, tmp_path, val_fraction=0.2, test_fraction=0.2, extra_paths=[str(extra)])
    dm.setup("fit")
    for split in ("val", "test"):  # held-out rows: those of --data.path alone
        assert np.array_equal(dm.split_indices[split], alone.split_indices[split])
        assert dm.split_prompts[split] == alone.split_prompts[split]
    names = (pq.ParquetDataset(sorted(dataset.glob("*.parquet"))).read(columns=["prompt_id"]).to_pydict()["prompt_id"]
             + pq.ParquetDataset(sorted(extra.glob("*.parquet"))).read(columns=["prompt_id"]).to_pydict()["prompt_id"])
    held = set(alone.split_prompts["val"]) | set(alone.split_prompts["test"])
    expected = [*alone.split_indices["train"].tolist(), *(600 + i for i in range(350) if names[600 + i] not in held)]
    assert dm.split_indices["train"].tolist() == expected
    assert len(expected) == 600 - 240 + 350 - 24 * 5  # 12 val + 12 test prompts' rounds dropped from the extra
    assert set(dm.split_prompts["train"]) == set(alone.split_prompts["train"]) | {n for n in names[600:] if n not in held}
    seq = dm.data.scalars["prompt"]
    assert seq[0] != seq[600 + names[600:].index(names[0])]  # one prompt in two datasets: two sequences
    assert dm.extra_manifest_sha256 == [manifest_hash(extra)]
    other = tmp_path / "other"
    write_synthetic_dataset(other, num_prompts=4, rounds_per_prompt=2, hidden_size=H, pair="ddt-e3", tree_budget=8,
                            progress=False)
    with pytest.raises(DatasetFormatError, match=r"--data.extra_paths .*other: manifest field pair is .*ddt-e3"):
        _dm(dataset, tmp_path, extra_paths=[str(other)])


def test_normalisation_uses_the_training_split_only(dataset: Path, tmp_path: Path) -> None:
    dm = _dm(dataset, tmp_path)
    dm.setup("fit")
    train = dm.data.hidden(dm.split_indices["train"]).astype(np.float64)
    everything = dm.data.hidden(np.arange(600)).astype(np.float64)
    assert np.allclose(dm.norm_mean.numpy(), train.mean(0), atol=1e-5)
    assert np.allclose(dm.norm_std.numpy(), train.std(0), atol=1e-4)
    assert not np.allclose(dm.norm_mean.numpy(), everything.mean(0), atol=1e-5)


def test_category_filter_and_balancing(dataset: Path, tmp_path: Path) -> None:
    dm = _dm(dataset, tmp_path, categories=["code", "math"], balance="label")
    dm.setup("fit")
    codes = dm.data.scalars["category"]
    kept = {dm.categories[c] for s in ("train", "val", "test") for c in codes[dm.split_indices[s]]}
    assert kept == {"code", "math"}
    idx = dm.split_indices["train"]
    w = dm._weights(idx)
    positive = dm.data.scalars["gain"][idx] > 0
    assert w[positive].sum() == pytest.approx(0.5) and w[~positive].sum() == pytest.approx(0.5)
    drawn = np.concatenate(list(dm.train_dataloader().sampler))
    assert abs((dm.data.scalars["gain"][drawn] > 0).mean() - 0.5) < 0.1
    with pytest.raises(ValueError, match=r"category filter \['poetry'\] not in .* \['code', 'math', 'prose'\]"):
        _dm(dataset, tmp_path, categories=["poetry"]).setup("fit")


def test_routing_summary_by_hand() -> None:
    tau_0 = torch.tensor([5, 1, 4, 2])
    tau_1 = torch.tensor([2, 3, 4, 1])
    # fixed slots: 3.0 and 2.5; oracle: (5+3+4+2)/4 = 3.5
    perfect = routing_summary((tau_0 - tau_1).float(), tau_0, tau_1, thresholds=[-0.5, 0.0, 0.5])
    assert perfect["tau_slot0"] == 3.0 and perfect["tau_slot1"] == 2.5 and perfect["tau_oracle"] == 3.5
    assert perfect["tau_best"] == 3.5 and perfect["share"] == 1.0
    wrong = routing_summary(-(tau_0 - tau_1).float(), tau_0, tau_1, thresholds=[0.0])
    assert wrong["tau_best"] == 2.0 and wrong["share"] == pytest.approx((2.0 - 3.0) / 0.5)
    # weighted rows (decision points of rows at every position) count as often as their weight
    pred = -(tau_0 - tau_1).float()
    weighed = routing_summary(pred, tau_0, tau_1, thresholds=[0.0], weight=torch.tensor([2.0, 0.0, 1.0, 0.5]))
    assert weighed["tau_slot0"] == pytest.approx((2 * 5 + 4 + 0.5 * 2) / 3.5)
    assert weighed["tau_best"] == pytest.approx((2 * 2 + 4 + 0.5 * 1) / 3.5)  # slot 1 in rows 0, 2, 3
    rows = [0, 0, 2]
    repeated = routing_summary(pred[rows], tau_0[rows], tau_1[rows], thresholds=[0.0])
    whole = routing_summary(pred, tau_0, tau_1, thresholds=[0.0], weight=torch.tensor([2.0, 0.0, 1.0, 0.0]))
    assert all(torch.allclose(whole[k], repeated[k]) for k in ("tau_slot0", "tau_slot1", "tau_oracle", "tau_best"))


def _copy(dataset: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(dataset, out)
    return out


def test_manifest_missing_a_field_is_named(dataset: Path, tmp_path: Path) -> None:
    bad = _copy(dataset, tmp_path)
    m = json.loads((bad / "manifest.json").read_text())
    del m["tau_definition"]
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DatasetFormatError, match=rf"{bad}/manifest.json: manifest lacks required field 'tau_definition'"):
        _dm(bad, tmp_path)
    (bad / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="expected manifest.json"):
        _dm(bad, tmp_path)


def test_shard_disagreeing_with_manifest_is_named(dataset: Path, tmp_path: Path) -> None:
    bad = _copy(dataset, tmp_path)
    m = json.loads((bad / "manifest.json").read_text())
    m["hidden_size"] = H * 2
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DatasetFormatError, match=rf"shard-00000.parquet: column 'hidden' is .*expected float16\[{2 * H}\]"):
        _dm(bad, tmp_path).setup("fit")
    m["hidden_size"] = H
    m["shards"][1]["sha256"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DatasetFormatError, match="shard-00001.parquet: sha256 differs"):
        _dm(bad, tmp_path).setup("fit")
    os.remove(bad / "shard-00002.parquet")
    with pytest.raises(FileNotFoundError, match="lists shard shard-00002.parquet"):
        _dm(bad, tmp_path, verify_hashes=False).setup("fit")


def test_empty_split_is_named(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"val split of .* is empty: 60 prompt\(s\).*val_fraction=0.001"):
        _dm(dataset, tmp_path, val_fraction=0.001).setup("fit")
    with pytest.raises(ValueError, match=r"test split of .* is empty"):
        _dm(dataset, tmp_path, test_fraction=0.0).setup("test")


# ---- push ---------------------------------------------------------------------------------------------------


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    r = NeuralRouter(hidden_size=H, mlp_dim=8, drafters="ddt-e3", tree_budget=128, target="Qwen/Qwen3-8B", threshold=1.0)
    folder = tmp_path / "run" / "router"
    r.save_pretrained(folder, config=r.config())
    (folder / "README.md").write_text("---\nbase_model: Qwen/Qwen3-8B\nlibrary_name: whiflash\n---\n# router\n")
    export_single_file(r, tmp_path / "run" / "router.safetensors")
    return folder


def test_push_cli_uploads_the_folder(exported: Path, fake_hub: type, capsys) -> None:
    from whiflash.train.cli import run

    url = run(["push", "--router", str(exported), "--repo-id", "org/my-router", "--private",
               "--revision", "dev"])
    assert url == "https://hf.co/org/my-router/commit/1" and url in capsys.readouterr().out
    assert ("create_repo", "org/my-router", True, True) in fake_hub.calls
    assert ("create_branch", "org/my-router", "dev") in fake_hub.calls
    upload = [c for c in fake_hub.calls if c[0] == "upload_folder"][0]
    assert upload[2] == "dev" and "ddt-e3" in upload[3] and "tree budget 128" in upload[3]
    pushed = fake_hub.root / "org/my-router@dev"
    assert sorted(p.name for p in pushed.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "base_model: Qwen/Qwen3-8B" in (pushed / "README.md").read_text()
    x = torch.randn(4, H)
    assert torch.equal(load_router(pushed)(x), load_router(exported)(x))


def test_push_suggests_the_upstream_name(exported: Path, fake_hub: type) -> None:
    from whiflash.train.push import push_router

    push_router(exported)
    assert ("create_repo", "alice/Qwen3-8B-NeuralRouter-ddt-e3-b128", False, True) in fake_hub.calls
    push_router(exported, namespace="WhiFlash")
    assert (fake_hub.root / "WhiFlash/Qwen3-8B-NeuralRouter-ddt-e3-b128" / "model.safetensors").is_file()


def test_push_refuses_a_broken_folder(exported: Path, fake_hub: type) -> None:
    from whiflash.train.push import push_router

    (exported / "README.md").unlink()
    with pytest.raises(FileNotFoundError, match=r"expected \['config.json', 'model.safetensors', 'README.md'\].*README.md"):
        push_router(exported, "org/x")
    assert fake_hub.calls == []


@pytest.mark.hub
@pytest.mark.skipif(not os.environ.get("HF_TOKEN"), reason="needs HF_TOKEN (and WHIFLASH_TEST_REPO)")
def test_real_push(exported: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from whiflash.train.push import push_router

    monkeypatch.delenv("HF_HUB_OFFLINE")
    repo = os.environ.get("WHIFLASH_TEST_REPO", "whiflash-ci/router-push-test")
    url = push_router(exported, repo, private=True, token=os.environ["HF_TOKEN"])
    assert repo in url


def test_binned_auroc_matches_torchmetrics() -> None:
    from torchmetrics.classification import BinaryAUROC

    from whiflash.train.metrics import BinnedAUROC

    torch.manual_seed(0)
    stock, ours = BinaryAUROC(thresholds=50), BinnedAUROC(thresholds=50)
    for _ in range(4):
        gain = torch.randn(300) * 3
        pred = torch.sigmoid(gain + torch.randn(300))
        stock.update(pred, (gain > 0).long())
        ours.update(pred, (gain > 0).long())
    assert torch.equal(stock.confmat, ours.confmat) and torch.equal(stock.compute(), ours.compute())


def test_task_names_the_pair_flag_and_reads_old_checkpoint_hparams() -> None:
    from whiflash.train.task import RouterTask

    with pytest.raises(ValueError, match="--model.pair: expected one of df-e3, ddt-e3, df-ddt, got 'e3'"):
        RouterTask(hidden_size=H, pair="e3")
    task = RouterTask(hidden_size=H, mlp_dim=4, pair="ddt-e3", tree_budget=8)
    assert task.router.pair.uses_tree
    old = {"hyper_parameters": {"hidden_size": H, "drafters": "df-e3", "tree_budget": 8}}  # before the rename
    with pytest.raises(ValueError, match="trained with drafter pair 'df-e3', but this run has drafter pair 'ddt-e3'"):
        task.on_load_checkpoint(old)


@pytest.mark.parametrize("gains, logit", [([3.0, -1.0, -1.0], np.log(3 / 2)), ([1.0, 1.0, -3.0], np.log(2 / 3))])
def test_decision_loss_picks_the_sign_of_the_mean_gain_not_of_the_majority(gains: list[float], logit: float) -> None:
    """`--model.loss decision` on rows that share one input: its minimiser is log(sum of positive gains / sum of
    negative ones), whose sign is the mean gain's; where most rows gain a little and one loses a lot, the choice
    it makes is the one that loses least, not the majority's. A misnamed loss is refused with the flag."""
    from whiflash.errors import UsageError
    from whiflash.train.task import RouterTask

    with pytest.raises(UsageError, match="--model.loss: expected one of mse, huber, decision, got 'hinge'"):
        RouterTask(hidden_size=H, loss="hinge")
    task = RouterTask(hidden_size=H, mlp_dim=4, loss="decision")
    score = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([score], lr=0.5, max_iter=200)
    gain = torch.tensor(gains)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = task._loss(score.expand(len(gains)), gain)
        loss.backward()
        return loss

    opt.step(closure)
    assert float(score) == pytest.approx(logit, abs=1e-3) and np.sign(float(score)) == np.sign(sum(gains))
    # rows that gain nothing either way carry no weight
    assert float(task._loss(torch.tensor([5.0, -5.0]), torch.tensor([0.0, 0.0]))) == 0.0


# ---- row values checked at the door ----------------------------------------------------------------------------


def _corrupt(folder: Path, shard: str, column: str, row: int, value: float | None) -> None:
    """Set ``column[row]`` of ``folder/shard`` to ``value`` (None: null) and re-pin the shard in the manifest."""
    from whiflash.data import shard_entry

    path = folder / shard
    table = pq.read_table(path)
    col = table.column(column).combine_chunks()
    if column == "hidden":
        values = col.flatten().to_numpy().copy().reshape(len(col), -1)
        values[row, 1] = value
        new = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    else:
        values = col.to_pylist()
        values[row] = value
        new = pa.array(values, type=col.type)
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, new), path)
    m = json.loads((folder / "manifest.json").read_text())
    m["shards"] = [dict(s, **vars(shard_entry(path))) if s["file"] == shard else s for s in m["shards"]]
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("column, value, says", [
    ("hidden", float("nan"), "holds a NaN, inf or null element"),
    ("entropy", float("inf"), "holds inf"),
    ("tau_0", None, "holds nan"),
    ("tau_1", None, "holds nan"),
    ("gain", float("nan"), "holds nan"),
    ("gain", 0.5, r"is 0.5, expected tau_0 - tau_1 = "),
])
def test_bad_row_values_are_named_before_fitting(dataset: Path, tmp_path: Path, column: str, value: float | None,
                                                 says: str) -> None:
    bad = _copy(dataset, tmp_path)
    _corrupt(bad, "shard-00001.parquet", column, 7, value)
    with pytest.raises(DatasetFormatError, match=rf"{bad}/shard-00001.parquet: column '{column}' row 7 {says}"):
        _dm(bad, tmp_path).setup("fit")


def _empty_dataset(folder: Path) -> Path:
    """A dataset that follows the contract but whose only shard has 0 rows."""
    from whiflash.data import SCALAR_COLUMNS, RouterDatasetManifest, write_manifest, write_shard

    cols = {c: [] for c in SCALAR_COLUMNS}
    entry = write_shard(folder / "shard-00000.parquet", {**cols, "hidden": np.zeros((0, H))}, H)
    write_manifest(folder, RouterDatasetManifest(
        target="t", pair="df-e3", drafter_ids=("dflash", "eagle3"), tree_budget=None, tap_layers=[], hidden_size=H,
        prompt_sets=[], seed=0, versions={}, shards=[entry]))
    return folder


def test_dataset_without_rows_is_named(tmp_path: Path) -> None:
    empty = _empty_dataset(tmp_path)
    with pytest.raises(DatasetFormatError, match=rf"router dataset {tmp_path}: its 1 shard\(s\) .* hold no rows"):
        _dm(empty, tmp_path).setup("fit")


def test_refused_fit_leaves_no_run_folder(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from whiflash.train.cli import run

    monkeypatch.setattr("sys.argv", ["whiflash-train"])
    bad = _copy(dataset, tmp_path)
    _corrupt(bad, "shard-00000.parquet", "entropy", 3, float("nan"))
    out = tmp_path / "runs"
    with pytest.raises(DatasetFormatError, match="shard-00000.parquet: column 'entropy' row 3"):
        run(["fit", "--data.path", str(bad), "--trainer.default_root_dir", str(out), "--trainer.max_epochs", "1",
             "--data.cache_dir", str(tmp_path / "cache"), "--trainer.enable_progress_bar", "false"])
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))


def test_run_root_or_synthetic_out_of_another_kind_is_refused(dataset: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from whiflash.folders import FolderKindError
    from whiflash.train.cli import run

    monkeypatch.setattr("sys.argv", ["whiflash-train"])
    before = sorted(p.name for p in dataset.iterdir())
    with pytest.raises(FolderKindError, match=rf"--trainer.default_root_dir {dataset}: is a router dataset .*; "
                                              "expected a folder to hold run folders"):
        run(["fit", "--data.path", str(dataset), "--trainer.default_root_dir", str(dataset), "--trainer.max_epochs",
             "1", "--data.cache_dir", str(tmp_path / "cache"), "--trainer.enable_progress_bar", "false"])
    assert sorted(p.name for p in dataset.iterdir()) == before  # no run folder inside the dataset
    datagen_out = tmp_path / "datagen"
    datagen_out.mkdir()
    (datagen_out / "datagen_args.json").write_text('{"kind": "whiflash.datagen"}')
    with pytest.raises(FolderKindError, match=rf"out_dir {datagen_out}: is a whiflash-datagen output"):
        write_synthetic_dataset(datagen_out, num_prompts=2, rounds_per_prompt=2, hidden_size=H, progress=False)
    assert [p.name for p in datagen_out.iterdir()] == ["datagen_args.json"]


def test_push_offline_or_without_token_says_what_to_do(exported: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    from huggingface_hub import constants

    from whiflash.train.cli import main, run
    from whiflash.train.push import HubPushError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the real HfApi, refused before any network call
    with pytest.raises(HubPushError, match=r"Hub repo org/r .*OfflineModeIsEnabled.*huggingface-cli login.*HF_TOKEN"):
        run(["push", "--router", str(exported), "--repo-id", "org/r"])
    with pytest.raises(SystemExit) as ended:
        main(["push", "--router", str(exported), "--repo-id", "org/r"])  # the console script: message, no traceback
    err = capsys.readouterr().err
    assert ended.value.code == 1 and "Traceback" not in err  # a failure while running, not a refusal
    assert err.splitlines()[-1].startswith("whiflash-train: error: whiflash-train push: could not push to the Hub "
                                           "repo org/r")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(exported / "no-token"))
    with pytest.raises(HubPushError, match=r"Hub repo <your namespace>/Qwen3-8B-NeuralRouter-ddt-e3-b128 .*"
                                           r"LocalTokenNotFoundError.*HF_TOKEN"):
        run(["push", "--router", str(exported)])


# ---------------------------------------------------------------- tokens/s terms


def _profile(path: Path | None = None, **rounds: float):
    from whiflash.latency import LatencyProfile

    prof = LatencyProfile(ar_step=1.0, round={"dflash": 2.0, "eagle3": 1.0, **rounds},
                          catchup={"dflash": {10: 1.0}, "eagle3": {10: 1.0}})  # 0.1 ms a row
    return prof.write(path) if path else prof


def test_speed_label_by_hand() -> None:
    from whiflash.train.speed import speed_gain

    # one prompt, rounds given out of order; slot 0 advanced rounds 0 and 1, slot 1 round 2
    rnd, pos = np.array([2, 0, 1]), np.array([17, 10, 14])
    t0, t1, active = np.array([1, 4, 3]), np.array([2, 1, 1]), np.array([1, 0, 0])
    gain = speed_gain(np.zeros(3, int), rnd, pos, t0, t1, active, ("dflash", "eagle3"), _profile())
    # round 0: neither catches up anything (both took in the prompt's 10 rows at the prefill): 4 / 2.0 vs 1 / 1.0;
    # round 1: dflash its own 4 rows, eagle3 4; round 2: dflash 3 rows, eagle3 7 (the switch); times the mean
    # round 1.5 ms
    expect = [(1 / 2.3 - 2 / 1.7) * 1.5, (4 / 2.0 - 1 / 1.0) * 1.5, (3 / 2.4 - 1 / 1.4) * 1.5]
    assert gain == pytest.approx(np.array(expect, np.float32))
    # a round is priced as a routed slot's: with routing adding 0.5 ms to EAGLE-3's rounds (and none to DFlash's,
    # whose routed loop round was faster), EAGLE-3 takes 1.5 ms a round and the mean round is 1.75 ms
    prof = _profile()
    prof.meta.update(loop_round_wall_ms={"dflash": 2.0, "eagle3": 1.0},
                     loop_routed_round_wall_ms={"dflash": 1.9, "eagle3": 1.5})
    gain = speed_gain(np.zeros(3, int), rnd, pos, t0, t1, active, ("dflash", "eagle3"), prof)
    expect = [(1 / 2.3 - 2 / 2.2) * 1.75, (4 / 2.0 - 1 / 1.5) * 1.75, (3 / 2.4 - 1 / 1.9) * 1.75]
    assert gain == pytest.approx(np.array(expect, np.float32))


def test_speed_label_needs_a_profile_with_the_slots(dataset: Path, tmp_path: Path) -> None:
    from whiflash.errors import UsageError

    with pytest.raises(UsageError, match=r"--data.label speed needs --data.latency_profile FILE"):
        _dm(dataset, tmp_path, label="speed")
    with pytest.raises(UsageError, match=r"--data.label: expected one of tau, speed, got 'utility'"):
        _dm(dataset, tmp_path, label="utility")
    from whiflash.latency import LatencyProfile

    bad = LatencyProfile(ar_step=1.0, round={"eagle3": 1.0}, catchup={"dflash": {1: 0.1}, "eagle3": {1: 0.1}})
    with pytest.raises(UsageError, match=r"--data.latency_profile: latency profile .*b.json: no round time for dflash"):
        _dm(dataset, tmp_path, latency_profile=str(bad.write(tmp_path / "b.json")))
    dm = _dm(dataset, tmp_path, latency_profile=str(_profile(tmp_path / "p.json")), label="speed")
    dm.setup("fit")
    tau = _dm(dataset, tmp_path)
    tau.setup("fit")
    speed, plain = dm.data.scalars["gain"], tau.data.scalars["gain"]
    assert not np.allclose(speed, plain)  # the speed label, not tau_0 - tau_1
    assert np.array_equal(plain, (tau.data.scalars["tau_0"] - tau.data.scalars["tau_1"]).astype(np.float32))
    assert np.mean(np.sign(speed) == np.sign(plain)) > 0.5  # the same decision most of the time


def test_speed_report_prices_a_router_deciding_after_the_pass(dataset: Path, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    from whiflash.train.export import score_split
    from whiflash.train.speed import speed_report

    dm = _dm(dataset, tmp_path, latency_profile=str(_profile(tmp_path / "p.json", dflash=1.0)))
    dm.setup("fit")
    scores = score_split(NeuralRouter(hidden_size=H, mlp_dim=8), dm, "val")
    prof = _profile(dflash=1.0)
    prof.router.update({"neural": 0.0, "neural-after-pass": 0.2})
    report = lambda in_pass: speed_report(scores, 0.0, [0.0], dm.categories, ("dflash", "eagle3"), prof,  # noqa: E731
                                          in_pass=in_pass)["overall"]
    inside, after = report(True), report(False)
    assert after["router_tokens_per_second"] < inside["router_tokens_per_second"]
    assert after["speed_oracle_tokens_per_second"] == inside["speed_oracle_tokens_per_second"]  # decides nothing
    # a profile from before the after-pass decision was timed prices it as one inside the pass, and says so
    del prof.router["neural-after-pass"]
    with caplog.at_level("WARNING", logger="whiflash.latency"):
        assert report(False)["router_tokens_per_second"] == pytest.approx(inside["router_tokens_per_second"])
    assert "neural-after-pass" in caplog.text and "whiflash-eval profile" in caplog.text


def test_speed_report_standalone_router_has_share_zero(dataset: Path, tmp_path: Path) -> None:
    from whiflash.train.export import score_split
    from whiflash.train.speed import speed_report

    # equal round times: the slots' taus alone decide, so switching pays somewhere
    dm = _dm(dataset, tmp_path, latency_profile=str(_profile(tmp_path / "p.json", dflash=1.0)))
    dm.setup("fit")
    scores = score_split(NeuralRouter(hidden_size=H, mlp_dim=8), dm, "val")
    rep = speed_report(scores, 0.0, [-100.0, 100.0], dm.categories, ("dflash", "eagle3"), dm.profile)
    o = rep["overall"]
    assert o["speed_oracle_tokens_per_second"] > o["best_standalone_tokens_per_second"]
    assert set(rep["per_category"]) == set(dm.categories) and o["speed_best_threshold"] in (-100.0, 100.0)
    # a threshold below every score always drafts with slot 0, one above none with slot 1: the better of
    # them is the best standalone drafter, whose share of the oracle's gain is 0
    theta = -100.0 if o["best_standalone"] == "slot0" else 100.0
    alone = speed_report(scores, theta, [theta], dm.categories, ("dflash", "eagle3"), dm.profile)["overall"]
    assert alone["router_tokens_per_second"] == pytest.approx(o["best_standalone_tokens_per_second"])
    assert alone["share_of_speed_oracle_gain"] == pytest.approx(0.0, abs=1e-9)
    # a threshold per category may pin either drafter, which then pays no decision: never below the better one.
    # With a decision that costs something, thresholds outside every score (each drafter alone, but deciding)
    # lose to the pinned ones, which then are the better drafter exactly.
    costly = _profile(dflash=1.0)
    costly.router["neural"] = 0.05
    rep = speed_report(scores, 0.0, [-100.0, 100.0], dm.categories, ("dflash", "eagle3"), costly)
    for cat, c in rep["per_category"].items():
        assert c["calibrated_threshold"] in (-np.inf, np.inf), cat
        assert c["calibrated_tokens_per_second"] == pytest.approx(c["best_standalone_tokens_per_second"]), cat
        share = c["calibrated_share_of_speed_oracle_gain"]  # None where the oracle gains nothing
        assert share is None or share == pytest.approx(0.0, abs=1e-9), cat
    o = rep["overall"]
    assert o["router_tokens_per_second"] < o["best_standalone_tokens_per_second"]  # deciding at a finite threshold
    assert o["calibrated_tokens_per_second"] >= o["best_standalone_tokens_per_second"] * (1 - 1e-12)
