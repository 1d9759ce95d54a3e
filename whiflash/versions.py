"""Software versions recorded in manifests (testbed builds, datagen datasets, training runs)."""
from __future__ import annotations

import importlib.metadata as md
import platform


def package_versions(*packages: str) -> dict[str, str | None]:
    """Python's version and each package's installed version (None when it is not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out
