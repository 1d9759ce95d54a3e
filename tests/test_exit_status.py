"""One exit convention for the commands (whiflash/errors.py): 2 and one `error:` line for a refusal, 1 for a
failure while running, the traceback only with --debug or WHIFLASH_DEBUG=1; a refused run leaves no run folder."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
def test_console_refusal_is_one_line_with_status_2_and_debug_adds_the_traceback(tmp_path: Path, capsys,
                                                                                monkeypatch) -> None:
    from whiflash.eval.cli import console

    cmd = [sys.executable, "-m", "whiflash.eval", "bench", "--name", "a/../../x", "--out", str(tmp_path / "runs")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "WHIFLASH_DEBUG": ""})
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["whiflash-eval: error: --name 'a/../../x': it holds a path separator; expected "
                                        "a plain name of at most 120 characters (letters, digits, '-', '_', '.'), "
                                        "which becomes one folder name"]
    for debug, env in ((["--debug"], ""), ([], "1")):  # the flag, anywhere, or the environment variable
        monkeypatch.setenv("WHIFLASH_DEBUG", env)
        code, err = _console_error(capsys, console, ["bench", *debug, *cmd[4:]])
        assert code == 2 and "Traceback (most recent call last)" in "\n".join(err)
        assert err[-1].startswith("whiflash-eval: error: --name 'a/../../x'")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "x").exists()


def _console_error(capsys: pytest.CaptureFixture, console, argv: list[str]) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as ended:
        console(argv)
    return ended.value.code, capsys.readouterr().err.splitlines()


def test_datagen_train_and_testbed_commands_follow_the_convention(worlds, tmp_path: Path, capsys,
                                                                  monkeypatch) -> None:
    from whiflash.datagen.cli import console as datagen
    from whiflash.testbed.__main__ import console as testbed
    from whiflash.train.cli import main as train

    monkeypatch.delenv("WHIFLASH_DEBUG", raising=False)
    world = worlds["qwen3-mixed"]
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"id": 1, "input_ids": [3, 4, 5]}\n')
    args = ["--prompts", str(ids), "--target", str(world.target_dir), "--eagle3", str(world.eagle_dir),
            "--dflash", str(world.dflash_dir), "--device", "cpu", "--max-new-tokens", "4"]
    code, err = _console_error(capsys, datagen, [*args, "--out", str(tmp_path / "a"), "--shard-size", "0"])
    assert (code, err) == (2, ["whiflash-datagen: error: --shard-size: expected an integer >= 1, got 0"])

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("whiflash.data.shards.pq.write_table", full)  # the disk fills up while running
    out = tmp_path / "b"
    code, err = _console_error(capsys, datagen, [*args, "--out", str(out)])
    assert code == 1 and not any("Traceback" in line for line in err)  # above it: the progress bar
    assert err[-1] == f"whiflash-datagen: error: [Errno 28] No space left on device: '{out / 'shard-00000.parquet'}'"
    monkeypatch.setattr("sys.argv", ["whiflash-train"])
    code, err = _console_error(capsys, train, ["fit", "--data.path", str(tmp_path / "b"), "--run_name", "../up"])
    assert code == 2 and not any("Traceback" in line for line in err)  # above it: the log lines of the run
    assert err[-1].startswith("whiflash-train: error: --run_name '../up': it holds a path separator; expected a plain "
                              "name")
    code, err = _console_error(capsys, testbed, ["build", "--preset", "nosuch", "--out", str(tmp_path / "tb")])
    assert (code, err[-1]) == (2, "python -m whiflash.testbed: error: unknown testbed preset 'nosuch'; choose one of "
                                  "['micro', 'small', 'tiny']")


def test_refused_bench_leaves_no_run_folder(worlds, tmp_path: Path) -> None:
    from whiflash.eval.cli import main

    world = worlds["qwen3-mixed"]
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"id": 1, "input_ids": [3, 4, 5]}\n')
    out = tmp_path / "runs"
    with pytest.raises(ValueError, match=r"--max-new-tokens 20000 leaves no room for a prompt in the target's 16384 "
                                         "positions"):  # found once the target is loaded, after the run folder
        main(["bench", "--out", str(out), "--model-name-or-path", str(world.target_dir), "--draft-name-or-path",
              str(world.dflash_dir), "--methods", "dflash", "--dataset", str(ids), "--max-new-tokens", "20000",
              "--dtype", "float32", "--device", "cpu", "--no-plots"])
    assert not out.exists()


def test_exit_status_of_each_kind_of_error() -> None:
    from whiflash.errors import error_line, exit_status
    from whiflash.folders import FolderKindError

    assert exit_status(ValueError("x")) == exit_status(FileNotFoundError("x")) == exit_status(KeyError("k")) == 2
    assert exit_status(FolderKindError("x")) == 2
    assert exit_status(OSError(errno.ENOSPC, "No space left on device")) == exit_status(RuntimeError("x")) == 1
    assert error_line(KeyError("DIR: missing key(s) ['w']")) == "DIR: missing key(s) ['w']"
    assert error_line(ValueError("two\nlines")) == "two lines" and error_line(RuntimeError()) == "RuntimeError"
