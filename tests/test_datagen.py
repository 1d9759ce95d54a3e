"""whiflash-datagen: rows follow the dataset contract (docs/design.md, "The router dataset"), runs resume,
and train reads them."""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import whiflash
from whiflash.datagen.cli import datagen
from whiflash.data import KIND, check_shards, read_manifest
from whiflash.datagen.record import record_prompt
from whiflash.decoding.routed import OracleDrafter
from whiflash.pairs import Pair
from whiflash.errors import UsageError

PROMPTS = [[7, 8, 9, 10, 11, 12], [40, 3, 3, 17, 29, 30, 31, 2, 5, 5, 6], [1, 2, 3], [4, 4, 4, 9], [20, 21, 22, 23, 24],
           [11, 2, 33, 4], [5, 6, 7, 8, 9, 10, 11], [30, 3]]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "ids.jsonl"
    cats = ["math", "code"]
    path.write_text("".join(json.dumps({"id": i, "category": cats[i % 2], "input_ids": p}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def _run(world, out, prompt_file, **kw):
    options = dict(max_new_tokens=30, shard_size=3, device="cpu") | kw
    return datagen(out=out, prompts=[str(prompt_file)], target=str(world.target_dir), eagle3=str(world.eagle_dir),
                   dflash=str(world.dflash_dir), **options)


@pytest.mark.parametrize("pair", ["df-e3", "ddt-e3"])
def test_rows_follow_the_contract_and_the_oracle(worlds, tmp_path, prompt_file, pair):
    world = worlds["qwen3-mixed"]
    out = _run(world, tmp_path / "data", prompt_file, pair=pair, tree_budget=10 if Pair.parse(pair).uses_tree else None)
    manifest = read_manifest(out)
    files = check_shards(out, manifest)
    assert len(files) == 3 and str(manifest.pair) == pair and manifest.hidden_size == 32
    assert manifest.tree_budget == (10 if pair == "ddt-e3" else None)
    on_disk = json.loads((out / "manifest.json").read_text())  # built by the same dataclass as synthetic data
    assert on_disk["kind"] == KIND and on_disk["generator"]["name"] == "whiflash.datagen"
    engine = on_disk["generator"]["engine"]  # the target's EngineOptions, in full
    assert {k: engine[k] for k in ("device", "dtype", "cuda_graphs", "compiled_layers")} == {
        "device": "cpu", "dtype": "float32", "cuda_graphs": False, "compiled_layers": False}  # the CPU's: fp32, eager
    assert set(whiflash.EngineOptions().to_dict()) <= set(engine)
    table = pq.read_table(files).to_pandas()
    target = whiflash.load_target(world.target_dir)
    for pid, rows in table.groupby("prompt_id", sort=False):
        rows = rows.sort_values("round")
        prompt = PROMPTS[int(pid.split("-")[-1])]
        assert list(rows["round"]) == list(range(len(rows)))
        assert (rows["gain"] == rows["tau_0"] - rows["tau_1"]).all()
        assert (rows["active"] == np.where(rows["tau_0"] > rows["tau_1"], 0, 1)).all()  # ties: slot 1
        # positions advance by the winning tau; the hidden state is the target's at the last committed token
        taus = np.maximum(rows["tau_0"], rows["tau_1"]).to_numpy()
        assert list(rows["position"]) == list(len(prompt) + np.concatenate([[0], np.cumsum(taus[:-1])]))
        out_ids, _ = whiflash.generate(target, None, prompt, 30)
        seq = prompt + out_ids
        for _, row in rows.iloc[:3].iterrows():
            target.setup_cache(64)
            ref = target(torch.tensor(seq[: row["position"]]), 0, logits="last")
            np.testing.assert_allclose(np.asarray(row["hidden"], dtype=np.float32), ref.hidden[-1].numpy(), rtol=2e-3, atol=2e-3)
            p = torch.softmax(ref.logits[-1], -1)
            assert abs(row["entropy"] + float((p * p.clamp_min(1e-30).log()).sum())) < 1e-4
    assert (table["tau_0"] != table["tau_1"]).any(), "the two drafters should disagree somewhere"
    assert (out / "tau0_tau1.png").stat().st_size > 0  # written when datagen finishes


def test_a_path_of_one_slot_advances_with_it_and_still_measures_both(worlds, tmp_path, prompt_file):
    """`--path slot0|slot1|mixed`: each prompt's rounds advance with its path's slot (by prompt order under
    `mixed`), both taus are still logged, each slot's tau on its own path is its standalone tau, and the manifest
    says the rule; an unknown path is refused before anything is written."""
    world = worlds["qwen3-mixed"]
    target = whiflash.load_target(world.target_dir)
    drafters = {k: whiflash.load_drafter(k, d, target) for k, d in (("dflash", world.dflash_dir), ("eagle3", world.eagle_dir))}
    for path in ("slot0", "slot1", "mixed"):
        out = _run(world, tmp_path / path, prompt_file, path=path)
        table = pq.read_table(check_shards(out, read_manifest(out))).to_pandas()
        assert "its own path" in read_manifest(out).advance_rule or path == "mixed"
        for pid, rows in table.groupby("prompt_id", sort=False):
            rows = rows.sort_values("round")
            i = int(pid.split("-")[-1])
            slot = {"slot0": 0, "slot1": 1}.get(path, (None, 0, 1)[i % 3])
            if slot is None:  # mixed, prompt 0 mod 3: the larger tau
                assert (rows["active"] == np.where(rows["tau_0"] > rows["tau_1"], 0, 1)).all()
                continue
            assert (rows["active"] == slot).all()
            own = rows["tau_0" if slot == 0 else "tau_1"].to_numpy()
            _, stats = whiflash.generate(target, drafters["dflash" if slot == 0 else "eagle3"], PROMPTS[i], 30)
            assert own.tolist() == stats.taus  # the path of that drafter alone, round for round
    with pytest.raises(ValueError, match="--path: expected one of oracle, slot0, slot1, mixed"):
        _run(world, tmp_path / "bad", prompt_file, path="random")
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_the_router_path_is_the_routed_decodes_path_at_each_categorys_threshold(worlds, tmp_path, prompt_file):
    """`--path router`: each prompt's rounds advance with the slot the router picks (its thresholds.json's
    threshold for the prompt's category), which is the routed decode's path round for round; both taus logged."""
    from whiflash.decoding.routed import RoutedDrafter
    from whiflash.router import NeuralRouter, export_single_file
    from whiflash.routers import NeuralPolicy

    world = worlds["qwen3-mixed"]
    torch.manual_seed(0)
    router = export_single_file(NeuralRouter(hidden_size=32, mlp_dim=8), tmp_path / "r.safetensors")
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps({"method": "whiflash-neural", "thresholds": {"math": float("-inf"), "code": 0.0}}))
    out = _run(world, tmp_path / "data", prompt_file, path="router", router=str(router), router_thresholds=thresholds)
    assert "on-policy rows" in read_manifest(out).advance_rule
    table = pq.read_table(check_shards(out, read_manifest(out))).to_pandas()
    target = whiflash.load_target(world.target_dir)
    eagle, dflash = (whiflash.load_drafter(k, d, target) for k, d in (("eagle3", world.eagle_dir), ("dflash", world.dflash_dir)))
    module = whiflash.load_router(router)
    switched = False
    for pid, rows in table.groupby("prompt_id", sort=False):
        rows = rows.sort_values("round")
        i = int(pid.split("-")[-1])
        thr = float("-inf") if i % 2 == 0 else 0.0  # the prompt file's categories alternate math, code
        routed = RoutedDrafter("df-e3", NeuralPolicy(module, thr), eagle3=eagle, dflash=dflash)
        _, stats = whiflash.generate(target, routed, PROMPTS[i], 30)
        assert rows["active"].tolist() == stats.slots
        assert np.where(rows["active"] == 0, rows["tau_0"], rows["tau_1"]).tolist() == stats.taus
        assert i % 2 == 1 or (rows["active"] == 0).all()
        switched |= rows["active"].nunique() == 2
    assert switched, "the router should pick both slots somewhere"
    # the router's thresholds are pinned by content: edited, the run is not resumed with them
    thresholds.write_text(json.dumps({"method": "whiflash-neural", "thresholds": {"math": 1.0, "code": 0.0}}))
    with pytest.raises(ValueError, match="router_thresholds_sha256"):
        _run(world, tmp_path / "data", prompt_file, path="router", router=str(router), router_thresholds=thresholds)
    with pytest.raises(ValueError, match="--router-thresholds .*missing.json: cannot read"):
        _run(world, tmp_path / "other", prompt_file, path="router", router=str(router),
             router_thresholds=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="--path router and --router go together"):
        _run(world, tmp_path / "bad", prompt_file, path="router")
    with pytest.raises(ValueError, match="--router-thresholds .*: needs --path router --router"):
        _run(world, tmp_path / "bad", prompt_file, router_thresholds=thresholds)


def test_tau_pair_plot_of_an_existing_dataset(tmp_path):
    from whiflash.datagen.plots import main as plot_main
    from whiflash.datagen.plots import plot_tau_pairs
    from whiflash.train.synthetic import write_synthetic_dataset

    data = tmp_path / "rows"
    write_synthetic_dataset(data, num_prompts=5, rounds_per_prompt=6, hidden_size=8, categories=("code", "math",
                            "prose", "agentic", "chat"), progress=False)
    path = plot_tau_pairs(data)
    assert path == data / "tau0_tau1.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_main([str(data), "--out", str(tmp_path / "p" / "t.png")])
    assert (tmp_path / "p" / "t.png").is_file()
    read_manifest(data)  # the plot beside the shards leaves the dataset readable


def test_resume_reuses_finished_shards_and_refuses_other_arguments(worlds, tmp_path, prompt_file):
    world = worlds["llama-mixed"]
    out = _run(world, tmp_path / "data", prompt_file)
    first = read_manifest(out)
    stamps = {f.name: f.stat().st_mtime_ns for f in out.glob("shard-*.parquet")}
    os.remove(out / "shard-00002.parquet")  # a run killed before its last shard
    (out / "manifest.json").unlink()
    _run(world, out, prompt_file)
    again = read_manifest(out)
    assert again.shards == first.shards  # same rows, same hashes: nothing lost, nothing duplicated
    assert all((out / n).stat().st_mtime_ns == t for n, t in stamps.items() if n != "shard-00002.parquet")
    with pytest.raises(ValueError, match=r"other arguments .*--max-prompts None -> 2"):
        _run(world, out, prompt_file, max_prompts=2)


def test_resume_refuses_a_checkpoint_rewritten_in_place(worlds, tmp_path, prompt_file):
    import shutil

    world = worlds["llama-mixed"]
    dflash = shutil.copytree(world.dflash_dir, tmp_path / "dflash")
    run = lambda: datagen(out=tmp_path / "data", prompts=[str(prompt_file)], target=str(world.target_dir),  # noqa: E731
                          eagle3=str(world.eagle_dir), dflash=str(dflash), max_new_tokens=8, shard_size=3,
                          max_prompts=3, device="cpu")
    out = run()
    shard = out / "shard-00000.parquet"
    before = shard.read_bytes()
    (out / "manifest.json").unlink()  # killed before the manifest
    weights = next(dflash.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes())  # retrained (here: rewritten) under the same path
    with pytest.raises(ValueError, match=r"other arguments .*dflash_files '[0-9a-f]{16}' -> '[0-9a-f]{16}'"):
        run()
    assert shard.read_bytes() == before  # the finished shard is kept for a resume with the old checkpoint


def test_bad_input_names_the_problem_and_leaves_the_folder_usable(worlds, tmp_path, prompt_file):
    world = worlds["qwen3-mixed"]
    out = tmp_path / "data"
    with pytest.raises(ValueError, match="--testbed DIR"):
        datagen(out=out, prompts=[str(prompt_file)], max_new_tokens=30, device="cpu")
    with pytest.raises(ValueError, match="--pair: expected one of df-e3, ddt-e3, df-ddt, got 'e3-df'"):
        _run(world, out, prompt_file, pair="e3-df")
    for bad, message in ((dict(shard_size=0), "--shard-size: expected an integer >= 1, got 0"),
                         (dict(dtype="banana"), "--dtype: expected one of float32, bfloat16, float16, got 'banana'"),
                         (dict(max_new_tokens=2.5), "--max-new-tokens: expected an integer >= 1"),
                         (dict(processes_per_device=0), "--processes-per-device: expected an integer >= 1, got 0"),
                         (dict(tree_budget=9), "--tree-budget 9: --pair df-e3 has no DDTree slot")):
        with pytest.raises(ValueError, match=message):
            _run(world, out, prompt_file, **bad)
    with pytest.raises(ValueError, match="--eagle3 .*: --pair df-ddt has no EAGLE-3 slot"):
        _run(world, out, prompt_file, pair="df-ddt")
    with pytest.raises(FileNotFoundError, match=rf"--target: no such folder: {tmp_path}/nonexistent"):
        datagen(out=out, prompts=[str(prompt_file)], target=str(tmp_path / "nonexistent"), dflash=str(world.dflash_dir),
                eagle3=str(world.eagle_dir), device="cpu")
    for name, text, message in (("broken", '{"prompt": "fine"}\n{"prompt": \n', "broken.jsonl:2: not a JSON record"),
                                ("empty", '{"prompt": "fine"}\n{"prompt": " "}\n',
                                 "empty.jsonl:2: field 'prompt': expected non-empty text"),
                                ("ids", '{"input_ids": [3, -1]}\n',
                                 "ids.jsonl:1: field 'input_ids': expected a non-empty")):
        (tmp_path / f"{name}.jsonl").write_text(text)
        with pytest.raises(ValueError, match=message):
            _run(world, out, tmp_path / f"{name}.jsonl")
    assert not out.exists()  # a refused call pins no arguments: the corrected call below runs
    assert read_manifest(_run(world, out, prompt_file)).shards


def test_chat_template_prompts_encode_to_token_ids():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from whiflash.datagen.cli import _encode
    from whiflash.datagen.prompts import PromptItem
    from whiflash.session import Session

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hi": 1, "user": 2, "assistant": 3, ":": 4}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}assistant :{% endif %}")
    run = Session({"target": "t"}, target=None, tokenizer=tok)  # type: ignore[arg-type]  # encoding needs no model
    assert _encode(run, PromptItem("p", "chat", text="hi"), 16) == [2, 4, 1, 3, 4]
    assert _encode(run, PromptItem("p", "chat", text="hi"), 2) == [3, 4]  # the prompt's last tokens


@pytest.mark.parametrize("path", ["oracle", "every"])
def test_whiflash_train_fits_on_datagen_output(worlds, tmp_path, prompt_file, monkeypatch, path):
    """Also on rows at every position, with the speed label and its report (each replay walks its own path); a
    router reading the previous round is refused there (a position has no previous round)."""
    from whiflash.latency import LatencyProfile
    from whiflash.router import load_router
    from whiflash.train.cli import run

    data = _run(worlds["qwen3-mixed"], tmp_path / "data", prompt_file, path=path, parallel=path == "every")
    monkeypatch.setattr("sys.argv", ["whiflash-train"])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    profile = LatencyProfile(ar_step=0.5, round={"dflash": 1.0, "eagle3": 1.3},
                             catchup={"dflash": {10: 1.0}, "eagle3": {10: 2.0}}).write(tmp_path / "profile.json")
    speed = ["--data.latency_profile", str(profile), "--data.label", "speed"] if path == "every" else []
    if path == "every":
        with pytest.raises(ValueError, match="--model.context \\['prev_tau'\\]: the data has a row at every position"):
            run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(tmp_path / "bad"),
                 "--trainer.max_epochs", "1", "--model.context", "[prev_tau]", *speed])
    run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(tmp_path / "out"),
         "--trainer.max_epochs", "2", "--data.batch_size", "16", *speed])
    folders = list((tmp_path / "out").glob("**/router"))
    assert len(folders) == 1
    if path == "every":  # the validation rows replayed along walks: no router beats the speed oracle
        report = json.loads((folders[0].parent / "results.json").read_text())["speed"]["overall"]
        assert report["router_tokens_per_second"] <= report["speed_oracle_tokens_per_second"] * (1 + 1e-12)
    # --data.balance starts: rows at every position drawn as often as decodes start a round there
    from whiflash.speed_oracle import round_starts
    from whiflash.train.data import RouterDataModule
    if path != "every":
        with pytest.raises(UsageError, match="--data.balance starts: .* rows on one decoding path"):
            RouterDataModule(str(data), balance="starts")
    else:
        dm = RouterDataModule(str(data), balance="starts", cache_dir=str(tmp_path / "hf"))
        dm.setup("fit")
        s, idx = dm.data.scalars, dm.split_indices["train"]
        assert s["weight"] == pytest.approx(round_starts(s["prompt"], s["position"], s["tau_0"], s["tau_1"]))
        first = np.r_[True, s["prompt"][1:] != s["prompt"][:-1]]  # rows in prompt and position order
        assert np.all(s["weight"][first] == 1) and s["weight"].min() < 0.5
        assert dm._weights(idx) == pytest.approx(s["weight"][idx] / s["weight"][idx].sum())
    router = load_router(folders[0], hidden_size=32, pair="df-e3")
    assert router(torch.randn(4, 32)).shape == (4,)
    rows = read_manifest(data).num_rows
    card = (folders[0] / "README.md").read_text()
    assert f"| data | {rows} rounds, prompt sets" in card
    assert "base_model" not in card  # the target is a local folder, not a Hub id
    # a router that also reads the two positions before each decision point: on rows at every position only
    history = ["fit", "--data.path", str(data), "--trainer.max_epochs", "1", "--data.batch_size", "16",
               "--data.history", "2", *speed]
    if path != "every":
        with pytest.raises(UsageError, match="--data.history 2: .* rows on one decoding path"):
            run([*history, "--trainer.default_root_dir", str(tmp_path / "bad")])
        return
    run([*history, "--trainer.default_root_dir", str(tmp_path / "history")])
    folder = next((tmp_path / "history").glob("**/router"))
    router = load_router(folder, hidden_size=32, pair="df-e3")
    assert router.history == 2 and router(torch.randn(4, 3 * 32)).shape == (4,)
    with pytest.raises(ValueError, match="expects hidden size 32 x \\(1 \\+ history 2\\)"):
        router(torch.randn(4, 32))
    from whiflash.eval.replay import replay_thresholds
    replay = replay_thresholds(data, profile, "whiflash-neural", [-1.0, 0.0, 1.0, float("inf")], str(folder))
    assert replay["excluded_training_prompts"] > 0 and set(replay["thresholds"]) <= {"code", "math", "prose", "agentic"}


def test_entropy_threshold_calibration_finds_the_planted_cut(tmp_path):
    from whiflash.train.calibrate import calibrate_entropy
    from whiflash.data import RouterDatasetManifest, write_manifest, write_shard

    rng = np.random.default_rng(0)
    n = 2000
    ent = rng.uniform(0, 3, n).astype(np.float32)
    low = ent < 1.2  # the parallel drafter (slot 0) wins below 1.2 nats, the AR drafter above
    tau_0 = np.where(low, 6, 2).astype(np.int16)
    tau_1 = np.where(low, 3, 4).astype(np.int16)
    cols = {"prompt_id": [f"p{i // 20}" for i in range(n)], "category": ["math"] * n, "round": np.arange(n) % 20,
            "position": np.arange(n), "hidden": np.zeros((n, 4), np.float16), "entropy": ent, "tau_0": tau_0,
            "tau_1": tau_1, "gain": (tau_0 - tau_1).astype(np.float32), "active": (tau_0 <= tau_1).astype(np.int8)}
    shard = write_shard(tmp_path / "shard-00000.parquet", cols, 4)
    write_manifest(tmp_path, RouterDatasetManifest(target="t", pair="df-e3", drafter_ids=("d", "e"), tree_budget=None,
                                                   tap_layers=[], hidden_size=4, prompt_sets=[], seed=0, versions={},
                                                   shards=[shard]))
    best = calibrate_entropy(tmp_path)
    assert abs(best["threshold"] - 1.2) <= 0.05 and best["share"] > 0.95
    assert best["tau"] > max(best["tau_slot0"], best["tau_slot1"])


def test_fixed_shape_passes_record_the_eager_rows(worlds):
    """The passes CUDA graphs capture (datagen's default on CUDA) record what the eager path records."""
    target, drafters = worlds["qwen3-mixed"].load()
    recorder = OracleDrafter("df-e3", eagle3=drafters["eagle3"], dflash=drafters["dflash"])
    runs = []
    for static in (False, True):
        for m in [target, *recorder.members]:
            m.static = static
        runs.append([record_prompt(target, recorder, prompt, 30) for prompt in PROMPTS[:4]])
    for eager, fixed in zip(*runs):
        assert eager.keys() == fixed.keys() and len(eager["round"]) > 3
        for key in eager:
            if key in ("hidden", "entropy"):  # full-cache attention sums in another order
                np.testing.assert_allclose(eager[key], fixed[key], rtol=1e-3, atol=1e-3)
            else:
                np.testing.assert_array_equal(eager[key], fixed[key])


def test_out_of_another_kind_is_refused_and_left_as_it_was(worlds, tmp_path, prompt_file):
    from whiflash.folders import FolderKindError
    from whiflash.train.synthetic import write_synthetic_dataset

    world = worlds["qwen3-mixed"]
    testbed, old_testbed = tmp_path / "testbed", tmp_path / "old-testbed"
    for folder, manifest in ((testbed, {"kind": "whiflash.testbed", "stages": {}}), (old_testbed, {"stages": {}})):
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
    synthetic = tmp_path / "synthetic"  # a router dataset that no datagen run wrote
    write_synthetic_dataset(synthetic, num_prompts=2, rounds_per_prompt=3, hidden_size=32, progress=False)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for folder, message in ((testbed, "is a testbed build"), (old_testbed, "is a testbed build"),
                            (synthetic, "is a router dataset not written by whiflash-datagen"),
                            (foreign, r"holds files \(notes.txt\) but no whiflash record")):
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        with pytest.raises(FolderKindError, match=rf"--out {folder}: {message}"):
            _run(world, folder, prompt_file)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before, folder


def test_resume_accepts_other_spellings_and_refuses_edited_prompts(worlds, tmp_path, prompt_file, monkeypatch):
    world = worlds["llama-mixed"]
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text(prompt_file.read_text())
    out = _run(world, tmp_path / "data", prompts)
    pinned = json.loads((out / "datagen_args.json").read_text())
    assert pinned["kind"] == "whiflash.datagen" and pinned["target"] == str(world.target_dir.resolve())
    assert pinned["prompts"] == [str(prompts.resolve())] and len(pinned["prompts_sha256"]) == 64
    stamps = {f.name: f.stat().st_mtime_ns for f in out.glob("shard-*.parquet")}
    (out / "shard-00002.parquet").unlink()  # a run killed before its last shard
    monkeypatch.chdir(tmp_path)  # the same files, spelled relative to another working directory
    rel = {k: os.path.relpath(getattr(world, f"{k}_dir"), tmp_path) for k in ("target", "eagle", "dflash")}
    datagen(out="data/../data", prompts="ids.jsonl", target=rel["target"], eagle3=rel["eagle"], dflash=rel["dflash"],
            max_new_tokens=30, shard_size=3, device="cpu")
    assert all((out / n).stat().st_mtime_ns == t for n, t in stamps.items() if n != "shard-00002.parquet")
    (out / "shard-00002.parquet").unlink()
    lines = prompts.read_text().splitlines()
    prompts.write_text("\n".join([lines[0].replace("[7, 8", "[7, 9"), *lines[1:]]) + "\n")  # edited after a kill
    with pytest.raises(ValueError, match=r"other arguments or prompts \(.*datagen_args.json: prompts_sha256 '"):
        _run(world, out, prompts)
    assert not (out / "shard-00002.parquet").exists()


def test_progress_shows_each_prompt_and_tau_per_drafter(worlds, tmp_path, prompt_file, capsys):
    out = _run(worlds["qwen3-mixed"], tmp_path / "data", prompt_file, max_prompts=4, shard_size=2)
    err = capsys.readouterr().err
    assert "datagen prompts" in err and "4/4" in err and "3/4" in err  # one step per prompt, not per shard
    assert re.search(r"τ dflash=\d+\.\d\d τ eagle3=\d+\.\d\d", err)
    (out / "shard-00001.parquet").unlink()
    _run(worlds["qwen3-mixed"], out, prompt_file, max_prompts=4, shard_size=2)
    assert "4/4" in capsys.readouterr().err  # finished shards count as done prompts


def test_testbed_sources_without_brackets_and_clear_errors(micro, tmp_path, monkeypatch):
    from whiflash.datagen.cli import main
    from whiflash.folders import FolderKindError

    def cli(*argv: str) -> None:
        monkeypatch.setattr("sys.argv", ["whiflash-datagen", *argv])
        main()

    fast = ["--max_prompts", "2", "--max-new-tokens", "8", "--device", "cpu", "--no-cuda-graphs"]  # an old spelling too
    with pytest.raises(ValueError, match=r"--prompts 'testbed:nosuch': unknown testbed split 'nosuch'; expected one "
                                         r"of testbed:train, testbed:validation, testbed:test"):
        cli("--testbed", str(micro), "--prompts", "testbed:nosuch", "--out", str(tmp_path / "a"), *fast)
    with pytest.raises(FolderKindError, match=rf"--testbed {tmp_path / 'nope'}: no such folder; expected a testbed"):
        cli("--testbed", str(tmp_path / "nope"), "--prompts", "testbed:train", "--out", str(tmp_path / "a"), *fast)
    assert not (tmp_path / "a").exists()
    monkeypatch.chdir(micro.parent)
    cli("--testbed", micro.name, "--prompts", "testbed:train", "--out", str(tmp_path / "a"), *fast)  # no brackets
    first = read_manifest(tmp_path / "a")
    assert first.num_rows > 0 and first.prompt_sets == ["testbed:train"]
    (tmp_path / "a" / "manifest.json").unlink()
    cli("--testbed", str(micro), "--prompts", "[testbed:train]", "--out", str(tmp_path / "a"), *fast)  # absolute
    assert read_manifest(tmp_path / "a").shards == first.shards
    testbed_manifest = (micro / "manifest.json").read_bytes()
    with pytest.raises(FolderKindError, match=rf"--out {micro}: is a testbed build"):
        cli("--testbed", str(micro), "--prompts", "testbed:train", "--out", str(micro), *fast)
    assert (micro / "manifest.json").read_bytes() == testbed_manifest


def test_heldout_prompts_come_from_the_split_the_drafters_did_not_learn_from(micro, tmp_path):
    """`testbed:heldout`: per category the other of train / validation than the responses stage continued (micro
    continues train prompts everywhere; a manifest saying validation for prose gives train there)."""
    from whiflash.datagen.prompts import read_source
    from whiflash.testbed import held_out_prompts

    items = read_source("testbed:heldout", micro, 2)
    assert [i.prompt_id.split("-")[1] for i in items] == ["validation"] * 8
    assert [i.text for i in items if i.category == "code"] == [p.prompt for p in held_out_prompts(
        micro, "code", 2, split="validation")]
    fake = tmp_path / "tb"
    shutil.copytree(micro / "corpus", fake / "corpus")
    manifest = json.loads((micro / "manifest.json").read_text())
    manifest["stages"]["responses"]["per_category"]["prose"]["split"] = "validation"
    (fake / "manifest.json").write_text(json.dumps(manifest))
    splits = {i.category: i.prompt_id.split("-")[1] for i in read_source("testbed:heldout", fake, 1)}
    assert splits == {"code": "validation", "math": "validation", "prose": "train", "agentic": "validation"}
    del manifest["stages"]["responses"]
    (fake / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"--prompts testbed:heldout: .*manifest.json does not say which split the "
                                         r"drafters' responses came from for code"):
        read_source("testbed:heldout", fake, 1)


def test_dev_prompts_are_test_prompts_from_documents_the_benchmark_pool_leaves(micro):
    """`testbed:dev`: test-split prompts whose documents none of the benchmark's pool is cut from; a category whose
    test documents the pool takes whole is refused with a message that names the source and the category."""
    from whiflash.datagen.prompts import read_source
    from whiflash.testbed import held_out_prompts
    from whiflash.testbed.prompts import DEV_POOL, dev_prompts

    for cat in ("math", "prose"):
        pool = held_out_prompts(micro, cat, 3)
        dev = dev_prompts(micro, cat, 5, pool=3)
        assert len(dev) == 5 and not {p.document for p in dev} & {p.document for p in pool}
        assert {p.document for p in dev} <= {p.document for p in held_out_prompts(micro, cat, 500)}  # the test split's
        assert dev == dev_prompts(micro, cat, 5, pool=3)  # seeded: the same prompts every time
    codes = len(held_out_prompts(micro, "code", 10_000, max_passes=1))  # one cut a document: the documents
    assert codes <= DEV_POOL
    with pytest.raises(ValueError, match=rf"--prompts testbed:dev: the test split's {codes} code documents are all "
                                         rf"cut by the benchmark's pool of {DEV_POOL} prompts"):
        read_source("testbed:dev", micro, 2)


def test_a_testbed_prompt_has_the_id_the_bench_gives_it(micro):
    """Rows and bench samples of one testbed prompt pair up by id (`whiflash-eval report --replay` relies on it)."""
    from whiflash.datagen.prompts import read_source
    from whiflash.eval.datasets import load_samples

    texts = {i.prompt_id: i.text for i in read_source("testbed:test", micro, 6)}
    samples = load_samples("testbed:test", testbed=micro, max_samples=6)  # drawn from a pool of 6 a category
    assert len(texts) == 24 and len(samples) == 6 and all(texts[s.id] == s.turns[0] for s in samples)


def test_prompts_longer_than_the_target_allows_keep_their_last_tokens(micro, tmp_path):
    from whiflash.decoding import prompt_room

    prompts = tmp_path / "long.jsonl"
    ids = [7 + i % 900 for i in range(1020)]
    prompts.write_text(json.dumps({"id": "long", "category": "agentic", "input_ids": ids}))
    out = datagen(out=tmp_path / "d", prompts=[str(prompts)], target=str(micro / "target"),
                  eagle3=str(micro / "eagle3"), dflash=str(micro / "dflash"), max_new_tokens=8, device="cpu")
    rows = pq.read_table(sorted(out.glob("shard-*.parquet"))[0]).to_pandas()
    target = whiflash.load_target(micro / "target")  # 1024 positions: 1020 + 8 did not fit, the prompt is cut
    recorder = OracleDrafter(Pair.parse("df-e3"), eagle3=whiflash.load_drafter("eagle3", micro / "eagle3", target),
                             dflash=whiflash.load_drafter("dflash", micro / "dflash", target))
    assert len(rows) > 0 and rows["position"].min() == prompt_room(target, 8, recorder.max_nodes)


def test_flags_are_kebab_case_switches_and_old_spellings_run_with_a_warning(capsys) -> None:
    from whiflash.datagen.cli import flag_kinds
    from whiflash.flags import dashed_argv, dashed_help

    kinds = flag_kinds()
    assert kinds["cuda_graphs"] and kinds["compile_layers"] and not kinds["max_new_tokens"]
    parsed = ["--max_new_tokens", "8", "--cuda_graphs", "false", "--compile_layers", "true", "--out", "o"]
    assert dashed_argv(["--max-new-tokens", "8", "--no-cuda-graphs", "--compile-layers", "--out", "o"], kinds,
                       "whiflash-datagen") == parsed
    assert capsys.readouterr().err == ""
    assert dashed_argv(["--max_new_tokens", "8", "--cuda_graphs", "false", "--compile_layers", "true", "--out", "o"],
                       kinds, "whiflash-datagen") == parsed
    err = capsys.readouterr().err.splitlines()
    assert err == ["whiflash-datagen: warning: --max_new_tokens is deprecated; use --max-new-tokens",
                   "whiflash-datagen: warning: --cuda_graphs is deprecated; use --cuda-graphs / --no-cuda-graphs",
                   "whiflash-datagen: warning: --compile_layers is deprecated; use --compile-layers / --no-compile-layers"]
    assert dashed_argv(["--max-new-tokens=8"], kinds, "t") == ["--max_new_tokens=8"]
    assert dashed_argv(["--cuda-graphs", "false", "--out", "o"], kinds, "t") == ["--cuda_graphs", "false", "--out", "o"]
    help_text = dashed_help("[--max_new_tokens MAX_NEW_TOKENS] [--cuda_graphs {true,false,null}]", kinds)
    assert help_text == "[--max-new-tokens MAX_NEW_TOKENS] [--cuda-graphs|--no-cuda-graphs]"


@pytest.mark.parametrize("world_name", ["qwen3-mixed", "llama-mixed"])
def test_a_packed_batch_continues_each_prompt_as_its_own_greedy_decode(worlds, world_name):
    """`greedy_batch` (the greedy sequences of `--parallel`): prompts of other lengths in one packed cache, each row
    seeing its own segment only, give every prompt's own greedy decode (float32), and leave the target's cache
    as it was."""
    from whiflash.decoding.greedy import greedy_batch

    target, _ = worlds[world_name].load()
    alone = [whiflash.generate(target, None, p, 25)[0] for p in PROMPTS]
    cache = target.cache.k.clone()
    assert greedy_batch(target, PROMPTS, 25) == alone and len({tuple(a) for a in alone}) > 4
    assert torch.equal(target.cache.k, cache)
    assert greedy_batch(target, PROMPTS[:2], 1) == [a[:1] for a in alone[:2]] and greedy_batch(target, [], 5) == []
    with pytest.raises(ValueError, match="at least one token"):
        greedy_batch(target, [[1, 2], []], 5)


@pytest.mark.parametrize("world_name,pair", [("qwen3-mixed", "df-e3"), ("llama-mixed", "df-e3"),
                                             ("qwen3-crafted", "df-e3"), ("llama-mixed", "ddt-e3"),
                                             ("qwen3-crafted", "df-ddt")])
def test_parallel_passes_record_the_oracle_rounds(worlds, world_name, pair):
    """`--parallel`: both slots' tau from teacher-forced passes at every position, the path walked over them,
    gives the rows oracle decoding logs (float32): same rounds, positions, taus and slots on every path, the same
    features, DDTree slots included; a stop token ends the walk where it ends the decode."""
    from whiflash.datagen.parallel import record_prompt_parallel

    target, drafters = worlds[world_name].load()
    recorder = OracleDrafter(pair, eagle3=drafters["eagle3"] if "e3" in pair else None, dflash=drafters["dflash"],
                             tree_budget=6 if "ddt" in pair else None)
    compared = stopped = 0
    plain = [whiflash.generate(target, None, prompt, 30)[0] for prompt in PROMPTS]  # the same for every follow
    for follow in (None, 0, 1):
        recorder.follow = follow
        for prompt, new in zip(PROMPTS, plain):
            decoded = record_prompt(target, recorder, prompt, 30)
            passes = record_prompt_parallel(target, recorder, prompt, 30, chunk=7)
            assert decoded.keys() == passes.keys() and len(decoded["round"]) > 1
            for key in decoded:
                if key in ("hidden", "entropy"):  # one pass over the sequence against the rounds' passes
                    np.testing.assert_allclose(decoded[key], passes[key], rtol=1e-3, atol=1e-3)
                else:
                    np.testing.assert_array_equal(decoded[key], passes[key], err_msg=f"{key}, follow={follow}")
            compared += len(decoded["round"])
            # a stop token: the first one new in the output after the third round's pending token
            third = int(decoded["position"][2]) - len(prompt)
            fresh = [t for i, t in enumerate(new) if i > third and t not in new[:i]]
            if not fresh:
                continue
            ends = (record_prompt(target, recorder, prompt, 30, fresh[:1]),
                    record_prompt_parallel(target, recorder, prompt, 30, fresh[:1]))
            assert ends[0].keys() == ends[1].keys() and 3 <= len(ends[0]["round"]) < len(decoded["round"])
            for key in ("position", "tau_0", "tau_1", "active"):
                np.testing.assert_array_equal(ends[0][key], ends[1][key])
            stopped += 1
    assert compared > 100 and (stopped > 5 or "crafted" in world_name)  # a crafted output repeats itself early


def test_parallel_flag_writes_the_decoded_dataset(worlds, tmp_path, prompt_file):
    """`whiflash-datagen --parallel` writes the dataset decoding writes (float32), pins the flag (a resume without it
    is refused), and refuses the router path before anything is written."""
    world = worlds["llama-mixed"]
    tables = [pq.read_table(check_shards(out, read_manifest(out))).to_pandas()
              for out in (_run(world, tmp_path / "decoded", prompt_file, path="mixed"),
                          _run(world, tmp_path / "passes", prompt_file, path="mixed", parallel=True))]
    assert len(tables[0]) == len(tables[1]) > 50
    for key in tables[0]:
        if key == "hidden":
            np.testing.assert_allclose(np.stack(tables[0][key]), np.stack(tables[1][key]), rtol=1e-3, atol=1e-3)
        elif key == "entropy":
            np.testing.assert_allclose(tables[0][key], tables[1][key], rtol=1e-3, atol=1e-3)
        else:
            assert (tables[0][key] == tables[1][key]).all(), key
    with pytest.raises(ValueError, match="other arguments.*--parallel True -> None"):
        _run(world, tmp_path / "passes", prompt_file, path="mixed")
    with pytest.raises(ValueError, match="--parallel: walks the --path oracle"):
        _run(world, tmp_path / "bad", prompt_file, parallel=True, path="router", router=str(tmp_path))
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_every_position_rows_hold_every_path(worlds, tmp_path, prompt_file, monkeypatch):
    """`--parallel --path every`: a row at every position a round can start at (consecutive positions from the first
    generated token, `active` the larger tau's slot); walking them by the taus of the slots taken (`walked`) gives
    the rows of the oracle's path and each drafter's own path, and the replay's cost model charges such a walk what
    it charges the path's own dataset. A shard's greedy sequences come from one batch. `--path every` without
    `--parallel` is refused."""
    import whiflash.datagen.parallel as parallel
    from whiflash.latency import LatencyProfile
    from whiflash.speed_oracle import (headline_rate, ruled, simulate, simulate_prompts, speed_oracle, stick, stuck_walk,
                                       walked)

    world = worlds["qwen3-mixed"]
    read = lambda out: pq.read_table(check_shards(out, read_manifest(out))).to_pandas().sort_values(["prompt_id", "round"])
    batches: list[int] = []
    batch = parallel.greedy_batch
    monkeypatch.setattr(parallel, "greedy_batch", lambda target, prompts, n: batches.append(len(prompts))
                        or batch(target, prompts, n))
    every = read(_run(world, tmp_path / "every", prompt_file, path="every", parallel=True))
    assert batches == [3, 3, 2]  # shards of 3 prompts, each one batch
    monkeypatch.undo()
    assert read_manifest(tmp_path / "every").every_position and "every position" in read_manifest(tmp_path / "every").advance_rule
    for pid, rows in every.groupby("prompt_id"):
        first = len(PROMPTS[int(pid.split("-")[-1])])
        assert list(rows["position"]) == list(range(first, first + 29))  # a round can start before 30 tokens are out
        assert list(rows["round"]) == list(range(29))
    assert (every["active"] == np.where(every["tau_0"] > every["tau_1"], 0, 1)).all()
    cols = {k: every[k].to_numpy() for k in ("prompt_id", "category", "position", "tau_0", "tau_1")}
    profile = LatencyProfile(ar_step=0.5, round={"dflash": 1.0, "eagle3": 1.3},
                             catchup={"dflash": {10: 1.0}, "eagle3": {10: 2.0}}, router={"entropy": 0.2})
    for path, slot0 in (("oracle", cols["tau_0"] > cols["tau_1"]), ("slot0", np.ones(len(every), bool)),
                        ("slot1", np.zeros(len(every), bool))):
        own = read(_run(world, tmp_path / path, prompt_file, path=path))
        assert not read_manifest(tmp_path / path).every_position
        idx = walked(slot0, cols)
        for key in ("prompt_id", "position", "tau_0", "tau_1"):
            np.testing.assert_array_equal(every[key].to_numpy()[idx], own[key].to_numpy(), err_msg=f"{path}: {key}")
        own_cols = {k: own[k].to_numpy() for k in cols}
        args = (("dflash", "eagle3"), (1.0, 1.3), profile, 0.1)
        assert simulate(slot0, cols, *args, every=True) == simulate(slot0[idx], own_cols, *args)
    oracle = speed_oracle(cols, ("dflash", "eagle3"), profile, every=True)["categories"]["all"]
    assert oracle["tokens_per_second"] >= oracle["best_standalone_tokens_per_second"] * (1 - 1e-12)
    with pytest.raises(ValueError, match="not one per position"):
        walked(np.ones(len(own), bool), own_cols)
    # calibrate --replay walks too: a drafter alone replays as on its own path's rows
    from whiflash.eval.replay import replay_thresholds

    profile.write(tmp_path / "profile.json")
    fixed = [replay_thresholds(tmp_path / d, tmp_path / "profile.json", "whiflash-entropy", [0.5])["overall"]["fixed"]
             for d in ("every", "slot0", "slot1")]
    assert fixed[0]["slot0"] == pytest.approx(fixed[1]["slot0"], rel=1e-12)
    assert fixed[0]["slot1"] == pytest.approx(fixed[2]["slot1"], rel=1e-12)
    # a tau rule: each routed threshold walks the rule's path (`ruled`); a drafter alone follows none
    entropy = every["entropy"].to_numpy()
    mid = float(np.median(entropy))
    # stick_tau: the walk applies the rule to its own rounds, as `stick` applies it to a path's rows
    idx, took, decided = stuck_walk(entropy < mid, cols, 2)
    path_pid = cols["prompt_id"][idx]
    assert [a.tolist() for a in stick((entropy < mid)[idx], cols["tau_0"][idx], path_pid, 2)] == \
        [took.tolist(), decided.tolist()]
    assert (~decided).any() and decided.any()
    assert stuck_walk(entropy < mid, cols, None)[0].tolist() == walked(entropy < mid, cols).tolist()
    stuck = replay_thresholds(tmp_path / "every", tmp_path / "profile.json", "whiflash-entropy", [mid], stick_tau=2)
    routed_rounds = tuple(profile.round_ms(k, routed=True) for k in ("dflash", "eagle3"))
    tok, ms, _ = simulate_prompts(took, {k: v[idx] for k, v in cols.items()}, ("dflash", "eagle3"), routed_rounds,
                                  profile, profile.router_ms("entropy"), routed=decided)
    assert stuck["stick_tau"] == 2  # rated as the bench rates: 1 / mean over prompts of ms per token
    assert stuck["overall"]["sweep"][str(mid)] == pytest.approx(headline_rate(tok, ms) * profile.ar_ms(), rel=1e-12)
    plain, rule = (replay_thresholds(tmp_path / "every", tmp_path / "profile.json", "whiflash-entropy",
                                     [mid, float("inf")], tau_rule=r) for r in (None, (3, 1)))
    assert rule["tau_rule"] == [3, 1] and plain["tau_rule"] is None
    with pytest.raises(ValueError, match="give one of them"):
        replay_thresholds(tmp_path / "every", tmp_path / "profile.json", "whiflash-entropy", [mid], stick_tau=4,
                          tau_rule=(3, 1))
    assert rule["overall"]["fixed"] == plain["overall"]["fixed"]
    assert rule["overall"]["sweep"]["inf"] == plain["overall"]["sweep"]["inf"]  # pinned: that drafter alone
    slot0 = ruled(entropy < mid, cols, (3, 1), every=True)
    tok, ms, _ = simulate_prompts(slot0, cols, ("dflash", "eagle3"), tuple(profile.round_ms(k, routed=True) for k in
                                  ("dflash", "eagle3")), profile, profile.router_ms("entropy"), every=True)
    assert rule["overall"]["sweep"][str(mid)] == pytest.approx(headline_rate(tok, ms) * profile.ar_ms(), rel=1e-12)
    assert rule["overall"]["sweep"][str(mid)] != plain["overall"]["sweep"][str(mid)]  # the rule took other rounds
    with pytest.raises(ValueError, match="--path every: needs --parallel"):
        _run(world, tmp_path / "bad", prompt_file, path="every")


def test_bench_datagen_script_times_the_three_ways_and_checks_the_passes(micro):
    """scripts/bench_datagen.py on the micro testbed (float32): every way has rows, and the passes reproduce every
    row of the oracle path."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_datagen.py"
    out = subprocess.run([sys.executable, str(script), "--testbed", str(micro), "--per-category", "1", "--new-tokens",
                          "16", "--repeats", "1", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for way in ("decode", "passes", "every"):
        assert re.search(rf"\| {way} \| all \| [1-9]\d* \|", out.stdout), out.stdout
    same, total = map(int, re.search(r"reproduce .*: (\d+) of (\d+)", out.stdout).groups())
    assert same == total > 0


def test_probe_draft_confidence_script_prices_the_signals_on_rows_like_datagens(micro, tmp_path):
    """scripts/probe_draft_confidence.py on the micro testbed (float32): its rows' taus are those of the datagen
    passes (`Drafter.taus`) at every position, DFlash's expected tau lies in [1, block], and every policy it prices
    is at most the speed oracle."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    from whiflash.decoding.greedy import greedy_batch
    from whiflash.drafters.base import Commit
    from whiflash.latency import LatencyProfile
    from whiflash.session import Session, model_paths

    script = Path(__file__).resolve().parents[1] / "scripts" / "probe_draft_confidence.py"
    profile = LatencyProfile(ar_step=1.0, round={"dflash": 2.0, "eagle3": 1.0}, draft={"dflash": 0.3},
                             catchup={"dflash": {10: 1.0}, "eagle3": {10: 1.0}}).write(tmp_path / "profile.json")
    out = subprocess.run([sys.executable, str(script), "--testbed", str(micro), "--latency-profile", str(profile),
                          "--source", "testbed:test", "--prompts", "2", "--tokens", "24", "--device", "cpu",
                          "--dtype", "float32", "--out", str(tmp_path / "probe.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads((tmp_path / "probe.json").read_text())["categories"]
    assert figures["all"]["rows"] > 0 and "all " in out.stdout
    for row in figures.values():
        for policy in ("dflash", "eagle3", "entropy_policy", "confidence_policy", "known_tau0_policy",
                       "known_tau1_policy"):
            assert row[policy] <= row["oracle"] * (1 + 1e-9), (policy, row)

    spec = importlib.util.spec_from_file_location("probe_draft_confidence", script)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    paths = model_paths(micro)
    run = Session.open(paths, "cpu", "float32")
    dflash = whiflash.load_drafter("dflash", paths["dflash"], run.target)
    eagle3 = whiflash.load_drafter("eagle3", paths["eagle3"], run.target)
    ids = run.encode(["def add(a, b):"])
    new = greedy_batch(run.target, [ids], 24 + max(dflash.draft_length, eagle3.draft_length) + 1)[0]
    cols = probe.rows_of_prompt(run.target, dflash, eagle3, ids, new, set())
    seq = torch.tensor(ids + new)
    taps = tuple(sorted(set(dflash.tap_layers) | set(eagle3.tap_layers)))
    commit = Commit(run.target.full_pass(seq, taps).feats, seq[1:], 0, taps)
    starts = torch.tensor(cols["position"])
    for d, col in ((dflash, "tau_0"), (eagle3, "tau_1")):
        d.reset(run.target, run.target.max_len)
        assert d.taus(d.select_taps(commit), seq, starts).tolist() == cols[col].tolist()
    assert len(starts) == 24 and np.all((cols["confidence"] >= 1) & (cols["confidence"] <= dflash.block_size))


@pytest.mark.parametrize("world_name", ["qwen3-mixed", "llama-mixed"])
def test_a_walk_over_every_position_is_the_routed_decode(worlds, world_name):
    """The reason rows at every position exist: a router's walk over them (its slot from each row's features, the
    next row that slot's tau later) is what its routed decode does, round for round (float32): the same positions,
    slots and taus, for WhiFlash-Entropy at thresholds that use both slots, alone and under a tau rule (`ruled`)."""
    from whiflash.datagen.parallel import record_prompt_parallel
    from whiflash.decoding.routed import RoutedDrafter
    from whiflash.routers import EntropyRouter
    from whiflash.speed_oracle import ruled, walked

    target, drafters = worlds[world_name].load()
    oracle = OracleDrafter("df-e3", eagle3=drafters["eagle3"], dflash=drafters["dflash"])
    rows = [record_prompt_parallel(target, oracle, prompt, 30, every=True) for prompt in PROMPTS]
    entropies = np.concatenate([r["entropy"] for r in rows])
    switches = overridden = 0
    for threshold, rule in [(t, r) for t in np.quantile(entropies, [0.3, 0.6]).tolist() for r in (None, (3, 1))]:
        routed = RoutedDrafter("df-e3", EntropyRouter(threshold), eagle3=drafters["eagle3"], dflash=drafters["dflash"],
                               tau_rule=rule)
        for prompt, cols in zip(PROMPTS, rows):
            _, stats = whiflash.generate(target, routed, prompt, 30)
            cols = {**cols, "prompt_id": np.zeros(len(cols["round"]))}
            slot0 = ruled(cols["entropy"] < threshold, cols, rule, every=True)
            path = walked(slot0, cols)
            overridden += int(np.count_nonzero(slot0[path] != (cols["entropy"] < threshold)[path]))
            assert cols["position"][path].tolist() == (len(prompt) + np.cumsum([0, *stats.taus[:-1]])).tolist()
            assert np.where(slot0[path], 0, 1).tolist() == stats.slots
            assert np.where(slot0, cols["tau_0"], cols["tau_1"])[path].tolist() == stats.taus
            switches += int(np.count_nonzero(np.diff(stats.slots)))
    assert switches > 10 and overridden > 0


@pytest.mark.parametrize("world_name, pair", [("qwen3-mixed", "df-e3"), ("llama-mixed", "ddt-e3")])
def test_a_router_with_history_decodes_as_its_walk_over_every_position(worlds, world_name, pair):
    """A router that also reads the states of the two positions before each decision point
    (`NeuralRouter(history=2)`) decodes as its walk over rows at every position, round for round (float32): the
    states its policy keeps from each verified path are the previous rows' `hidden`, the first decision's repeated
    before it (`history_rows`), which is what training and replay read; a tree's path is its accepted branch.
    Thresholds sit in wide gaps between scores: the rows store float16 states."""
    from whiflash.datagen.parallel import record_prompt_parallel
    from whiflash.decoding.routed import RoutedDrafter
    from whiflash.router import NeuralRouter
    from whiflash.router_context import history_rows
    from whiflash.routers import NeuralPolicy
    from whiflash.speed_oracle import walked

    target, drafters = worlds[world_name].load()
    budget = 6 if pair == "ddt-e3" else None
    oracle = OracleDrafter(pair, eagle3=drafters["eagle3"], dflash=drafters["dflash"], tree_budget=budget)
    rows = [record_prompt_parallel(target, oracle, prompt, 30, every=True) for prompt in PROMPTS]
    wide = [np.concatenate([c["hidden"], *(c["hidden"][e] for e in history_rows(
        np.zeros(len(c["position"])), c["position"], 2).T)], 1).astype(np.float32) for c in rows]
    stacked = np.concatenate(wide)
    torch.manual_seed(0)
    module = NeuralRouter(hidden_size=rows[0]["hidden"].shape[1], mlp_dim=16, history=2, drafters=pair,
                          tree_budget=budget).eval()
    module.set_normalization(torch.from_numpy(stacked.mean(0)), torch.from_numpy(stacked.std(0)))
    with torch.no_grad():
        scores = [module(torch.from_numpy(w)).numpy() for w in wide]
    ordered = np.sort(np.concatenate(scores))
    switches = 0
    for lo, hi in ((0.2, 0.45), (0.55, 0.8)):  # the midpoint of the widest gap between these quantiles
        part = ordered[int(lo * len(ordered)) : int(hi * len(ordered))]
        gap = int(np.argmax(np.diff(part)))
        threshold = float(part[gap] + part[gap + 1]) / 2
        routed = RoutedDrafter(pair, NeuralPolicy(module, threshold), eagle3=drafters["eagle3"],
                               dflash=drafters["dflash"], tree_budget=budget)
        for prompt, cols, score in zip(PROMPTS, rows, scores):
            _, stats = whiflash.generate(target, routed, prompt, 30)
            cols = {**cols, "prompt_id": np.zeros(len(cols["round"]))}
            path = walked(score > threshold, cols)
            assert cols["position"][path].tolist() == (len(prompt) + np.cumsum([0, *stats.taus[:-1]])).tolist()
            assert np.where(score[path] > threshold, 0, 1).tolist() == stats.slots
            switches += int(np.count_nonzero(np.diff(stats.slots)))
    assert switches > 5
