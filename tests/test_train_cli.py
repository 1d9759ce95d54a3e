"""whiflash-train end to end: LightningCLI fit on a planted signal, export, resume checks, the CLI contract."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from whiflash.data.manifest import EVERY_POSITION
from whiflash.errors import UsageError
from whiflash.router import load_router, training_prompts
from whiflash.train.cli import run
from whiflash.train.export import score_split
from whiflash.train.metrics import routing_summary
from whiflash.train.synthetic import write_synthetic_dataset

H = 24


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    hf = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"HF_HOME": str(hf), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
            mp.setenv(k, v)
        mp.setattr(sys, "argv", ["whiflash-train"])  # run(args) replaces the command line, like the console script
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny MLPs: extra threads only spin on a shared 2-core box
        yield hf
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(env, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One short fit on a planted-signal dataset (240 prompts x 40 rounds), via the CLI in-process."""
    tmp = tmp_path_factory.mktemp("fit")
    data = tmp / "data"
    write_synthetic_dataset(data, num_prompts=240, rounds_per_prompt=40, hidden_size=H, seed=1, progress=False)
    out = tmp / "out"
    cli = run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(out), "--trainer.max_epochs", "6",
               "--model.mlp_dim", "64", "--model.lr", "3e-3", "--data.batch_size", "256",
               "--data.cache_dir", str(tmp / "cache"), "--trainer.enable_progress_bar", "false",
               "--trainer.enable_model_summary", "false"])
    run_dir = Path(cli.trainer.log_dir)
    return {"cli": cli, "data": data, "out": out, "run_dir": run_dir, "tmp": tmp}


def test_fit_recovers_most_of_the_oracle_gain(trained: dict) -> None:
    results = json.loads((trained["run_dir"] / "results.json").read_text())
    r = results["routing"]
    assert r["tau_oracle"] > max(r["tau_slot0"], r["tau_slot1"])
    assert r["share"] > 0.6, r
    assert results["spearman"] > 0.7 and results["auroc"] > 0.8
    # Recompute the share independently from the exported router on the validation split.
    router = load_router(trained["run_dir"] / "router")
    dm = trained["cli"].datamodule
    scores = score_split(router, dm, "val")
    t = {k: torch.from_numpy(scores[k]) for k in ("pred", "tau_0", "tau_1")}
    again = routing_summary(t["pred"], t["tau_0"], t["tau_1"], trained["cli"].model.thresholds)
    assert float(again["share"]) == pytest.approx(r["share"], abs=1e-6)
    assert router.threshold == pytest.approx(r["best_threshold"])


def test_run_directory_has_config_logs_plots_and_exports(trained: dict) -> None:
    run_dir: Path = trained["run_dir"]
    assert run_dir.parent == trained["out"]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["data"]["path"] == str(trained["data"]) and cfg["seed_everything"] == 1234
    assert cfg["trainer"]["deterministic"] is True and "hidden_size" not in cfg["model"]  # linked from the data
    assert (run_dir / "metrics.csv").read_text().count("val/share") >= 1
    assert len(list((run_dir / "checkpoints").glob("router-epoch*-share*.ckpt"))) == 1
    for plot in ("learning_curves", "pred_vs_actual", "tau_vs_threshold"):
        assert (run_dir / "plots" / f"{plot}.png").stat().st_size > 10_000
    card = (run_dir / "router" / "README.md").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["kind"] == "whiflash.train" and manifest["subcommand"] == "fit"
    assert manifest["data_manifest_sha256"] in card and "df-e3" in card and "recommended threshold" in card
    cfg_json = json.loads((run_dir / "router" / "config.json").read_text())
    assert cfg_json["hidden_size"] == H and cfg_json["drafters"] == "df-e3" and cfg_json["target"] == "synthetic-target"
    # beside both exports, the prompts the router learned from (a replay leaves their rows out)
    for where in (run_dir / "router", run_dir / "router.safetensors"):
        assert training_prompts(where) == sorted(trained["cli"].datamodule.split_prompts["train"])
    assert not set(training_prompts(run_dir / "router")) & set(trained["cli"].datamodule.split_prompts["val"])


def test_exports_load_strictly_with_identical_outputs(trained: dict) -> None:
    run_dir: Path = trained["run_dir"]
    folder, single = load_router(run_dir / "router"), load_router(run_dir / "router.safetensors")
    assert folder.config() == single.config()
    x = torch.randn(33, H, dtype=torch.float16)
    assert torch.equal(folder(x), single(x)) and folder(x).shape == (33,)
    # The normalisation statistics travelled with the weights.
    dm = trained["cli"].datamodule
    assert torch.allclose(folder.mean, dm.norm_mean) and torch.allclose(folder.std, dm.norm_std.clamp_min(1e-6))
    # ... and the export is the best checkpoint's router.
    from whiflash.train.task import RouterTask

    best = RouterTask.load_from_checkpoint(trained["cli"].trainer.checkpoint_callback.best_model_path)
    assert torch.equal(best.router(x), folder(x))


def test_test_subcommand_on_the_best_checkpoint(trained: dict) -> None:
    ckpt = trained["cli"].trainer.checkpoint_callback.best_model_path
    cli = run(["test", "--data.path", str(trained["data"]), "--trainer.default_root_dir", str(trained["out"]),
               "--data.cache_dir", str(trained["tmp"] / "cache"), "--ckpt_path", ckpt,
               "--trainer.enable_progress_bar", "false"])
    metrics = cli.trainer.callback_metrics
    assert {"test/mse", "test/mae", "test/spearman", "test/auroc", "test/share", "test/tau_oracle"} <= set(metrics)
    assert metrics["test/share"] > 0.5
    assert Path(cli.trainer.log_dir).name.endswith("_router-test")
    manifest = json.loads((Path(cli.trainer.log_dir) / "manifest.json").read_text())
    assert manifest["kind"] == "whiflash.train" and manifest["subcommand"] == "test" and manifest["data"]


def test_predict_writes_predictions(trained: dict) -> None:
    import pyarrow.parquet as pq

    ckpt = trained["cli"].trainer.checkpoint_callback.best_model_path
    cli = run(["predict", "--data.path", str(trained["data"]), "--trainer.default_root_dir", str(trained["out"]),
               "--data.cache_dir", str(trained["tmp"] / "cache"), "--ckpt_path", ckpt, "--data.predict_split", "val",
               "--trainer.enable_progress_bar", "false"])
    table = pq.read_table(Path(cli.trainer.log_dir) / "predictions.parquet").to_pydict()
    dm = cli.datamodule
    assert sorted(table["row"]) == dm.split_indices["val"].tolist()
    router = load_router(trained["run_dir"] / "router")
    expected = router(torch.from_numpy(dm.data.hidden(dm.split_indices["val"])))
    assert torch.allclose(torch.tensor(table["pred"]), expected, atol=1e-5)


def test_resume_with_another_hidden_size_is_refused(trained: dict) -> None:
    other = trained["tmp"] / "data8"
    write_synthetic_dataset(other, num_prompts=20, rounds_per_prompt=5, hidden_size=8, seed=2, progress=False)
    ckpt = trained["cli"].trainer.checkpoint_callback.best_model_path
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt} was trained with hidden size {H}, but dataset "
                                         rf"{other} has hidden size 8"):
        run(["fit", "--data.path", str(other), "--trainer.default_root_dir", str(trained["tmp"] / "resume"),
             "--data.cache_dir", str(trained["tmp"] / "cache"), "--ckpt_path", ckpt,
             "--trainer.enable_progress_bar", "false"])


def test_print_config_links_hidden_size_from_data(trained: dict, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(["fit", "--data.path", str(trained["data"]), "--print_config"])
    assert exit_info.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["checkpoint"]["monitor"] == "val/share" and cfg["early_stopping"]["monitor"] == "val/share"
    assert "hidden_size" not in cfg["model"] and cfg["model"]["loss"] == "mse"


def test_cli_contract_command(env, tmp_path: Path) -> None:
    """`whiflash-train fit --data.path D --trainer.default_root_dir OUT` leaves OUT/**/router/ loadable."""
    data = tmp_path / "data"
    write_synthetic_dataset(data, num_prompts=30, rounds_per_prompt=20, hidden_size=8, seed=4, progress=False)
    out = tmp_path / "out"
    exe = Path(sys.executable).with_name("whiflash-train")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "whiflash.train.cli"]
    proc = subprocess.run([*cmd, "fit", "--data.path", str(data), "--trainer.default_root_dir", str(out),
                           ],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folders = [p for p in out.glob("**/router") if p.is_dir()]
    assert len(folders) == 1
    router = load_router(folders[0])
    assert router(torch.randn(5, 8)).shape == (5,)


def _files_mentioning(folder: Path, text: str) -> list[Path]:
    """Files under ``folder`` whose bytes contain ``text``."""
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.fixture(scope="module")
def local_paths_run(env, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A short fit on data whose manifest names the target and both drafters by absolute local paths."""
    tmp = tmp_path_factory.mktemp("private")
    data, models = tmp / "data", tmp / "home" / "alice" / "models"
    write_synthetic_dataset(data, num_prompts=40, rounds_per_prompt=10, hidden_size=8, seed=2, progress=False,
                            target=str(models / "Qwen3-8B"))
    m = json.loads((data / "manifest.json").read_text())
    m["drafters"] = {"slot_0": str(models / "dflash-b16"), "slot_1": str(models / "eagle3")}
    (data / "manifest.json").write_text(json.dumps(m))
    labels: list[tuple[str, str]] = []
    with pytest.MonkeyPatch.context() as mp:
        from whiflash.train import plots

        real = plots.tau_vs_threshold
        mp.setattr(plots, "tau_vs_threshold",
                   lambda routing, out, names: labels.append(names) or real(routing, out, names))
        cli = run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(tmp / "out"),
                   "--trainer.max_epochs", "1", "--model.mlp_dim", "8", "--data.cache_dir", str(tmp / "cache"),
                   "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])
    return {"run_dir": Path(cli.trainer.log_dir), "models": str(models), "labels": labels}


def test_exports_name_checkpoints_without_local_paths(local_paths_run: dict) -> None:
    run_dir, models = local_paths_run["run_dir"], local_paths_run["models"]
    assert _files_mentioning(run_dir / "router", models) == []
    assert _files_mentioning(run_dir / "router.safetensors", models) == []
    card = (run_dir / "router" / "README.md").read_text()
    assert "`Qwen3-8B`" in card and "slot 0 = dflash-b16" in card and "# Qwen3-8B-NeuralRouter-df-e3" in card
    assert json.loads((run_dir / "router" / "config.json").read_text())["target"] == "Qwen3-8B"
    assert local_paths_run["labels"] == [("dflash-b16", "eagle3")]  # plot legends


def test_push_uploads_no_local_paths(local_paths_run: dict, fake_hub: type) -> None:
    url = run(["push", "--router", str(local_paths_run["run_dir"] / "router"), "--repo-id", "org/r"])
    assert url.startswith("https://hf.co/org/r")
    pushed = fake_hub.root / "org/r"
    assert sorted(p.name for p in pushed.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert _files_mentioning(pushed, local_paths_run["models"]) == []
    assert all(local_paths_run["models"] not in str(c) for c in fake_hub.calls)


def test_fit_with_a_latency_profile_reports_tokens_per_second(env, tmp_path: Path) -> None:
    """`--data.latency_profile` adds the speed replay to results.json, the manifest and the card; `--data.label
    speed` trains on the tokens/s label, and the export keeps the released-router contract."""
    from whiflash.latency import LatencyProfile

    data = tmp_path / "data"
    write_synthetic_dataset(data, num_prompts=40, rounds_per_prompt=12, hidden_size=H, seed=2, progress=False)
    prof = LatencyProfile(ar_step=1.0, round={"dflash": 1.2, "eagle3": 1.0},
                          catchup={"dflash": {1: 0.05, 64: 0.4}, "eagle3": {1: 0.05, 64: 0.6}}).write(tmp_path / "p.json")
    cli = run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(tmp_path / "out"),
               "--trainer.max_epochs", "2", "--model.mlp_dim", "16", "--data.batch_size", "128",
               "--data.latency_profile", str(prof), "--data.label", "speed", "--data.cache_dir", str(tmp_path / "c"),
               "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])
    run_dir = Path(cli.trainer.log_dir)
    speed = json.loads((run_dir / "results.json").read_text())["speed"]
    o = speed["overall"]
    assert o["speed_oracle_tokens_per_second"] >= max(o["router_tokens_per_second"], o["best_standalone_tokens_per_second"])
    assert o["threshold"] == pytest.approx(load_router(run_dir / "router").threshold)
    assert o["threshold"] == o["speed_best_threshold"]  # with a profile the export recommends the fastest threshold
    assert json.loads((run_dir / "manifest.json").read_text())["val_speed"]["share_of_speed_oracle_gain"] == \
        o["share_of_speed_oracle_gain"]
    assert "share of the speed oracle's gain" in (run_dir / "router" / "README.md").read_text()
    router = load_router(run_dir / "router.safetensors", hidden_size=H, pair="df-e3")  # hidden state in, one score out
    assert router(torch.zeros(3, H)).shape == (3,)


def test_variant_comparison_fits_each_label_and_context(env, tmp_path: Path, capsys) -> None:
    """`whiflash.train.compare`: one fit per variant; a context variant's router reads its features, loads
    with them, and its replay works; an unknown feature is refused before any fit."""
    from whiflash.eval.replay import replay_thresholds
    from whiflash.latency import LatencyProfile
    from whiflash.train.compare import main as compare_main
    from whiflash.train.compare import parse_variant

    data = tmp_path / "data"
    write_synthetic_dataset(data, num_prompts=30, rounds_per_prompt=10, hidden_size=H, seed=4, progress=False)
    prof = LatencyProfile(ar_step=1.0, round={"dflash": 1.0, "eagle3": 1.0},
                          catchup={"dflash": {1: 0.05}, "eagle3": {1: 0.05}}).write(tmp_path / "p.json")
    fit = ["--", "--trainer.max_epochs", "1", "--model.mlp_dim", "8", "--data.cache_dir", str(tmp_path / "c"),
           "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    with pytest.raises(UsageError, match="--variants 'speed\+novelty'"):
        compare_main([str(data), "--latency-profile", str(prof), "--variants", "tau,speed+novelty", *fit])
    assert parse_variant("speed/decision+entropy+h2") == ("speed", "decision", ["entropy"], 2, False)
    assert parse_variant("speed/decision+starts") == ("speed", "decision", [], 0, True)
    assert parse_variant("tau") == ("tau", None, [], 0, False)
    with pytest.raises(UsageError, match="names a history \\(hN\\) more than once"):
        parse_variant("speed+h1+h2")
    with pytest.raises(UsageError, match="--variants: 'speed/hinge' names the loss 'hinge'"):
        compare_main([str(data), "--latency-profile", str(prof), "--variants", "tau,speed/hinge", *fit])
    for variant in ("speed+h2", "speed/decision+starts"):  # rows of rounds: refused before the first fit
        with pytest.raises(UsageError, match=f"--variants '{re.escape(variant)}': hN and starts need rows at every"):
            compare_main([str(data), "--latency-profile", str(prof), "--out", str(tmp_path / "refused"),
                          "--variants", f"tau,{variant}", *fit])
    assert not (tmp_path / "refused").exists()
    every = tmp_path / "every"  # the same rows, claimed to be one per position: prev_* refused before the first fit
    shutil.copytree(data, every)
    manifest = json.loads((every / "manifest.json").read_text())
    (every / "manifest.json").write_text(json.dumps({**manifest, "advance_rule": EVERY_POSITION}))
    with pytest.raises(UsageError, match="--variants 'speed\\+entropy\\+prev_tau': prev_tau need rows of rounds"):
        compare_main([str(every), "--latency-profile", str(prof), "--out", str(tmp_path / "refused"),
                      "--variants", "tau,speed+entropy+prev_tau", *fit])
    assert not (tmp_path / "refused").exists()
    compare_main([str(data), "--latency-profile", str(prof), "--out", str(tmp_path / "out"),
                  "--variants", "tau,speed,speed/decision,speed+entropy+prev_tau", *fit])
    table = capsys.readouterr().out
    assert "| tau |" in table and "| speed |" in table and "| speed+entropy+prev_tau |" in table
    saved = json.loads((tmp_path / "out" / "variants.json").read_text())["variants"]
    assert set(saved) == {"tau", "speed", "speed/decision", "speed+entropy+prev_tau"}
    decision = Path(saved["speed/decision"]["run"])
    assert decision.name.endswith("variant-speed-decision") and saved["speed/decision"]["loss"] == "decision"
    assert json.loads((decision / "results.json").read_text())["trained_for"] == {"label": "speed", "loss": "decision"}
    assert "log-odds that slot 0 is the better choice" in (decision / "router" / "README.md").read_text()
    assert Path(saved["speed+entropy+prev_tau"]["run"]).name.endswith("variant-speed-entropy-prev_tau")
    router = load_router(Path(saved["speed+entropy+prev_tau"]["run"]) / "router", hidden_size=H, pair="df-e3")
    assert router.context == ("entropy", "prev_tau") and router(torch.zeros(3, H), torch.zeros(3, 2)).shape == (3,)
    replay = replay_thresholds(data, prof, "whiflash-neural", [-1.0, 0.0, 1.0],
                               str(Path(saved["speed+entropy+prev_tau"]["run"]) / "router"))
    assert replay["overall"]["threshold"] in (-1.0, 0.0, 1.0)


def test_a_later_variant_is_kept_only_where_it_replays_clearly_faster() -> None:
    from whiflash.train.compare import KEEP_MARGIN, kept_variant

    def result(*rates: float) -> dict:
        return {"variants": {f"v{i}": {"calibrated_tokens_per_second": r} for i, r in enumerate(rates)}}

    assert kept_variant(result(100.0, 100.0 * (1 + KEEP_MARGIN / 2))) == "v0"  # within the margin: the plainer one
    assert kept_variant(result(100.0, 95.0, 100.0 * (1 + 2 * KEEP_MARGIN))) == "v2"
    # each later variant is held against the one kept so far, not only against the first
    assert kept_variant(result(100.0, 103.0, 103.5)) == "v1"
    assert kept_variant(result(100.0, 103.0, 103.5), margin=0.0) == "v2"
    with pytest.raises(ValueError, match="no variants"):
        kept_variant({"variants": {}})
