"""The testbed manifest and resumable, atomic build stages.

Every stage writes into ``OUT/.tmp-<stage>`` and is moved to ``OUT/<stage>`` only when it has
finished; then the manifest records its fingerprint (a hash of the stage's config and of the
*output hashes* of the stages it reads), the hash of its own output files, timings and figures.
A later build reuses a stage whose fingerprint matches and whose folder still holds exactly what
was recorded (its files hash to the recorded ``output_sha256``), and rebuilds it otherwise (a
truncated or edited ``model.safetensors`` is rebuilt, not reused); a rebuilt stage whose output
differs changes the fingerprints of everything downstream, which is then rebuilt too. The
``log`` list of the manifest says, per run, which stages were built and which were reused.
The build holds the folder's lock (:mod:`whiflash.locks`) from its first check to its last write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from whiflash.folders import MANIFEST, TESTBED, check_folder
from whiflash.io import atomic_write_json
from whiflash.locks import claim
from whiflash.versions import package_versions

__all__ = ["Manifest", "fingerprint", "hash_dir"]

log = logging.getLogger(__name__)
LOG_ENTRIES = 200
"""Build-log entries a manifest keeps (about 25 runs of the 8 stages)."""

FORMAT_VERSION = 1
"""Bump when a stage's on-disk output changes meaning, so old builds are not reused."""


UNFINGERPRINTED = frozenset({"max_minutes"})
"""Config fields that cannot change a stage's output (a time cap only aborts), so changing them rebuilds nothing."""


def _plain(x: Any) -> Any:
    if is_dataclass(x) and not isinstance(x, type):
        return {k: _plain(v) for k, v in asdict(x).items() if k not in UNFINGERPRINTED}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if k not in UNFINGERPRINTED}
    return x


def fingerprint(*parts: Any) -> str:
    """Stable short hash of JSON-able parts (dataclasses as dicts, ``UNFINGERPRINTED`` fields left out)."""
    blob = json.dumps([_plain(p) for p in parts], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def hash_dir(path: Path) -> str:
    """sha256 over the relative names and bytes of every file below ``path`` (sorted)."""
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


class Manifest:
    """``OUT/manifest.json``: kind, config, versions, stage records and the build log."""

    def __init__(self, root: Path, config: dict[str, Any]):
        self.root = Path(root)
        # another tool's folder (a datagen output, a run) is refused before anything in it is touched
        check_folder(self.root, TESTBED, "testbed --out")
        claim(self.root, "testbed --out")  # one build at a time; checked again under the lock
        resumed = check_folder(self.root, TESTBED, "testbed --out")
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / MANIFEST
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if resumed else {}
        self.data["kind"] = TESTBED  # builds from before the field existed gain it
        self.data.setdefault("format_version", FORMAT_VERSION)
        self.data.setdefault("stages", {})
        self.data.setdefault("log", [])
        self.data["config"] = config
        self.data["versions"] = package_versions("torch", "transformers", "tokenizers", "lightning", "numpy", "whiflash")
        self.run_id = time.strftime("%Y-%m-%dT%H:%M:%S")

    def save(self) -> None:
        atomic_write_json(self.path, self.data)

    def stage(self, name: str) -> dict[str, Any]:
        """The record of a finished stage (KeyError when it has not finished)."""
        return self.data["stages"][name]

    def is_done(self, name: str, fp: str) -> bool:
        """Whether stage ``name`` finished with fingerprint ``fp`` and its folder still holds what it wrote."""
        rec = self.data["stages"].get(name)
        if not (rec and rec.get("fingerprint") == fp and rec.get("done") and (self.root / name).is_dir()):
            return False
        found = hash_dir(self.root / name)
        if found != rec.get("output_sha256"):
            log.warning("stage %-9s rebuilt: %s changed since it was built (sha256 %s, recorded %s)", name,
                        self.root / name, found[:16], str(rec.get("output_sha256"))[:16])
            return False
        return True

    def run_stage(self, name: str, fp: str, fn: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """Run ``fn(tmp_dir) -> figures`` unless the stage is done with this fingerprint.

        ``fn`` writes into a fresh temporary folder; on success the folder replaces
        ``OUT/<name>`` and the manifest gains ``{fingerprint, done, seconds, output_sha256, **figures}``.
        """
        if self.is_done(name, fp):
            log.info("stage %-9s reused (fingerprint %s)", name, fp)
            self._log(name, "reused", fp)
            return self.stage(name)
        tmp = self.root / f".tmp-{name}"
        if tmp.exists():
            shutil.rmtree(tmp)  # leftovers of a killed run
        tmp.mkdir(parents=True)
        self.data["stages"].pop(name, None)
        self.save()  # a crash from here on leaves the stage marked not done
        log.info("stage %-9s building (fingerprint %s)", name, fp)
        t0 = time.perf_counter()
        figures = fn(tmp)
        seconds = time.perf_counter() - t0
        final = self.root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        rec = {"fingerprint": fp, "done": True, "seconds": round(seconds, 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "output_sha256": hash_dir(final), **figures}
        self.data["stages"][name] = rec
        self._log(name, "built", fp, seconds)
        return rec

    def _log(self, name: str, action: str, fp: str, seconds: float | None = None) -> None:
        entry = {"run": self.run_id, "stage": name, "action": action, "fingerprint": fp}
        if seconds is not None:
            entry["seconds"] = round(seconds, 1)
        # every resumed run logs each stage; keep the recent history (the demo resumes on every call)
        self.data["log"] = [*self.data["log"], entry][-LOG_ENTRIES:]
        self.save()
