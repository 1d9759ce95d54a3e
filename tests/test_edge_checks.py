"""Validation at the edge: every flag is range-checked under its own spelling before anything is pinned, loaded or
created; prompt records are typed (turns a list of strings, ids unique, UTF-8); a broken file is named."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from whiflash.train.synthetic import write_synthetic_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("edge") / "ds"
    write_synthetic_dataset(out, num_prompts=6, rounds_per_prompt=4, hidden_size=8, progress=False)
    return out


def _datagen(world, out: Path, prompts: list[str], **kw):
    from whiflash.datagen.cli import datagen

    return datagen(out=out, prompts=prompts, target=str(world.target_dir), eagle3=str(world.eagle_dir),
                   dflash=str(world.dflash_dir), device="cpu", **({"max_new_tokens": 6, "shard_size": 2} | kw))


@pytest.mark.parametrize("flags, message", [
    (["--max-prompt-tokens", "0"], r"--max-prompt-tokens: expected an integer >= 1 \(or unset\), got 0"),
    (["--ddtree-tree-budget", "0"], r"--ddtree-tree-budget: expected an integer >= 1 \(or unset\), got 0"),
    (["--ddtree-tree-budget", "-4", "--methods", "ddtree"], r"--ddtree-tree-budget: expected an integer >= 1"),
    (["--ddtree-tree-budget", "9", "--methods", "dflash,whiflash"],
     r"--ddtree-tree-budget 9: no method of this run uses DDTree \(methods ar, dflash, whiflash-entropy; "
     r"--whiflash-drafters df-e3\)"),
    (["--eagle-num-steps", "3", "--methods", "dflash"], r"--eagle-num-steps 3: no method of this run uses EAGLE-3"),
    (["--whiflash-latency-profile", "p.json"], r"--whiflash-latency-profile p.json: only the utility-oracle method"),
    (["--whiflash-entropy-threshold", "-1"], r"--whiflash-entropy-threshold: expected a finite number >= 0 \(nats"),
    (["--warmup-tokens", "-1"], r"--warmup-tokens: expected an integer >= 0, got -1"),
    (["--whiflash-stick-tau", "0"], r"--whiflash-stick-tau: expected an integer >= 1 \(or unset\), got 0"),
    (["--whiflash-tau-rule", "2,5"], r"--whiflash-tau-rule: expected ENTER,LEAVE, two integers >= 1 with LEAVE < "
                                     r"ENTER \(taus, bonus token included\), got '2,5'"),
    (["--whiflash-tau-rule", "5"], r"--whiflash-tau-rule: expected ENTER,LEAVE"),
    (["--whiflash-tau-rule", "5,2", "--whiflash-stick-tau", "4"], r"give one of them"),
    (["--whiflash-tau-rule", "5,2", "--methods", "dflash"], r"--whiflash-tau-rule 5,2: only the routed methods"),
    (["--max-new-tokens", "0"], r"--max-new-tokens: expected an integer >= 1, got 0"),
    (["--bootstrap", "0"], r"--bootstrap: expected an integer >= 1, got 0"),
    (["--temperature", "-0.5"], r"--temperature: expected a finite number >= 0, got -0.5"),
    (["--dtype", "fp8"], r"--dtype: expected one of float32, bfloat16, float16, got 'fp8'"),
    (["--whiflash-router", "best"], r"--whiflash-router: expected one of entropy, neural, oracle, utility-oracle"),
    (["--whiflash-drafters", "e3-df"], r"--whiflash-drafters: expected one of df-e3, ddt-e3, df-ddt, got 'e3-df'"),
])
def test_bench_flags_out_of_range_or_not_applying_are_refused_before_anything(tmp_path: Path, flags: list[str],
                                                                              message: str) -> None:
    from whiflash.eval.cli import main

    out = tmp_path / "runs"
    with pytest.raises(ValueError, match=message):  # refused before the (missing) testbed is even looked at
        main(["bench", "--testbed", str(tmp_path / "no-testbed"), "--out", str(out), *flags])
    assert not out.exists()


def test_calibrate_and_train_flags_name_themselves(dataset: Path, tmp_path: Path, monkeypatch) -> None:
    from whiflash.eval.cli import main
    from whiflash.train.cli import run

    with pytest.raises(ValueError, match=r"--thresholds '0.1,x': 'x' is not a number"):
        main(["calibrate", "--replay", str(dataset), "--latency-profile", "p.json", "--thresholds", "0.1,x",
              "--out", str(tmp_path / "cal")])
    monkeypatch.setattr("sys.argv", ["whiflash-train"])
    base = ["fit", "--data.path", str(dataset), "--trainer.default_root_dir", str(tmp_path / "train"),
            "--trainer.max_epochs", "1", "--data.cache_dir", str(tmp_path / "cache")]
    for flags, message in ((["--data.batch_size", "0"], r"--data.batch_size: expected an integer >= 1, got 0"),
                           (["--model.lr", "0"], r"--model.lr: expected a finite number > 0, got 0"),
                           (["--model.dropout", "1.5"], r"--model.dropout: expected a probability in \[0, 1\)"),
                           (["--num_threads", "0"], r"--num_threads: expected an integer >= 1 \(or unset\), got 0")):
        with pytest.raises(ValueError, match=message):
            run([*base, *flags])
    assert not (tmp_path / "train").exists() or not any((tmp_path / "train").iterdir())


def test_turns_that_are_not_a_list_of_strings_are_refused_by_both_readers(worlds, tmp_path: Path) -> None:
    from whiflash.datagen.prompts import read_source
    from whiflash.eval.datasets import load_samples

    haiku = tmp_path / "haiku.jsonl"
    for turns in ('"Write a haiku"', '["Write a haiku", 3]', "[]"):
        haiku.write_text('{"question_id": 1, "turns": ["fine"]}\n{"question_id": 2, "turns": %s}\n' % turns)
        message = rf"{haiku}:2: field 'turns': expected a non-empty list of non-empty strings"
        with pytest.raises(ValueError, match=message):  # not 13 one-character turns
            load_samples(str(haiku))
        with pytest.raises(ValueError, match=message):  # not the prompt "W"
            read_source(str(haiku), None, 1)
    with pytest.raises(ValueError, match=rf"{haiku}:2: field 'turns'"):
        _datagen(worlds["qwen3-mixed"], tmp_path / "data", [str(haiku)])
    assert not (tmp_path / "data").exists()
    haiku.write_text('{"question_id": 1, "prompt": 7}\n')
    with pytest.raises(ValueError, match=rf"{haiku}:1: field 'prompt': expected non-empty text, got 7"):
        load_samples(str(haiku))


def test_repeated_prompt_ids_are_refused(worlds, tmp_path: Path) -> None:
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"id": 1, "input_ids": [3, 4]}\n{"id": 2, "input_ids": [5, 6]}\n{"id": 1, "input_ids": [7]}\n')
    world = worlds["qwen3-mixed"]
    with pytest.raises(ValueError, match=rf"{ids}:3: prompt id 'ids-1' was already given by {ids}:1"):
        _datagen(world, tmp_path / "a", [str(ids)])
    ids.write_text('{"id": 1, "input_ids": [3, 4]}\n')
    with pytest.raises(ValueError, match=rf"{ids}:1: prompt id 'ids-1' was already given by {ids}:1; .*every "
                                         "source to be listed once"):
        _datagen(world, tmp_path / "b", [str(ids), str(ids)])  # one source twice: every prompt twice
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_prompt_files_that_are_not_utf8_name_the_line(tmp_path: Path) -> None:
    from whiflash.datagen.prompts import read_source
    from whiflash.eval.datasets import load_samples

    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    message = rf"{bad}:2: not UTF-8 text \(byte 0xe9 at column 16\); expected a UTF-8 encoded JSONL file"
    with pytest.raises(ValueError, match=message):
        load_samples(str(bad))
    with pytest.raises(ValueError, match=message):
        read_source(str(bad), None, 1)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"prompt": "caf\xc3\xa9"}\n')  # a byte-order mark is fine
    assert load_samples(str(bom))[0].turns == ("café",)


def test_datagen_max_new_tokens_beyond_the_target_is_named_before_pinning(worlds, tmp_path: Path) -> None:
    world = worlds["qwen3-mixed"]
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"id": 1, "input_ids": [3, 4, 5]}\n')
    out = tmp_path / "data"
    with pytest.raises(ValueError, match=r"--max-new-tokens 20000: the target .* has 16384 positions, and a round's "
                                         r"drafts take \d+ of them, so no prompt token fits; expected at most \d+"):
        _datagen(world, out, [str(ids)], max_new_tokens=20000)
    assert not out.exists()  # nothing pinned: the corrected command starts afresh


def test_unreadable_parquet_shard_is_named(dataset: Path, tmp_path: Path) -> None:
    from whiflash.train.data import RouterDataModule

    bad = shutil.copytree(dataset, tmp_path / "bad")
    shard = bad / "shard-00000.parquet"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated: no footer
    for verify in (True, False):
        dm = RouterDataModule(str(bad), verify_hashes=verify, cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ValueError, match=rf"{shard}: not a readable Parquet shard \(.*\); expected a shard as "
                                             "whiflash-datagen writes it"):
            dm.setup("fit")


def test_a_full_disk_names_the_file(tmp_path: Path, monkeypatch) -> None:
    import errno

    import numpy as np

    from whiflash.data import write_shard
    from whiflash.eval.outputs import SampleLog

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("whiflash.data.shards.pq.write_table", full)
    shard = tmp_path / "shard-00000.parquet"
    cols = {"prompt_id": ["p"], "category": ["c"], "round": [0], "position": [1], "hidden": np.zeros((1, 4)),
            "entropy": [0.1], "tau_0": [2], "tau_1": [1], "gain": [1.0], "active": [0]}
    with pytest.raises(OSError, match=rf"No space left on device: '{shard}'"):
        write_shard(shard, cols, 4)
    assert list(tmp_path.iterdir()) == []  # no temporary file left either
    rows = SampleLog(tmp_path / "samples.jsonl")
    rows.path = Path("/dev/full")  # a device that is always full
    with pytest.raises(OSError, match=r"No space left on device: '/dev/full'"):
        rows.append({"sample": "s", "turn": 0, "method": "ar"})


def test_another_tools_folder_as_data_path_is_named(tmp_path: Path) -> None:
    from whiflash.train.data import RouterDataModule

    for kind, manifest, what in (("testbed", {"kind": "whiflash.testbed", "stages": {}}, "a testbed build"),
                                 ("eval", {"tool": "whiflash-eval bench", "argv": []}, "a whiflash-eval run"),
                                 ("train", {"kind": "whiflash.train"}, "a whiflash-train run")):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ValueError, match=rf"--data.path {folder}: is {what}.*, kind '[a-z.]+'; expected a "
                                             r"router dataset \(the --out folder of whiflash-datagen"):
            RouterDataModule(str(folder))


def test_bad_repo_id_is_named_before_anything_is_loaded(tmp_path: Path) -> None:
    from whiflash.train.push import push_router

    for repo in ("a b", "org/a/b", "../x"):
        with pytest.raises(ValueError, match=rf"--repo-id '{repo}': not a Hub repo id \(.*\); expected ORG/NAME"):
            push_router(tmp_path / "no-router", repo)
