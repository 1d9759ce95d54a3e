"""Plots of a router dataset: tau_0 against tau_1 per category (matplotlib, Agg backend).

`whiflash-datagen` writes `tau0_tau1.png` into the dataset's folder when it finishes; for an existing
dataset call :func:`plot_tau_pairs` or run `python -m whiflash.datagen.plots DATASET_DIR [--out FILE]`.
Each panel is a heat map of how many rounds fall into each (tau_0, tau_1) cell of one category, with
the diagonal drawn: rounds above it went better with slot 1, below it with slot 0, so the panel shows
how often (and by how much) the better drafter changes, which is the room a router has.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["PLOT_NAME", "plot_tau_pairs"]

PLOT_NAME = "tau0_tau1.png"
"""The file name of the plot in the dataset's folder."""


def plot_tau_pairs(data_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the per-category tau_0 / tau_1 heat maps of the router dataset `data_dir` (to `out`, default
    `data_dir/tau0_tau1.png`); returns the file's path."""
    import pyarrow.parquet as pq

    from whiflash.data import check_shards, read_manifest

    manifest = read_manifest(data_dir)
    paths = check_shards(data_dir, manifest, verify_hashes=False)
    table = pq.read_table(paths, columns=["category", "tau_0", "tau_1"]) if paths else None
    if table is None or table.num_rows == 0:
        raise ValueError(f"{data_dir}: the router dataset has no rows to plot")
    cats = table.column("category").to_numpy(zero_copy_only=False).astype(str)
    t0, t1 = table.column("tau_0").to_numpy().astype(int), table.column("tau_1").to_numpy().astype(int)
    top = int(max(t0.max(), t1.max()))
    edges = np.arange(0.5, top + 1.5)
    names = sorted(set(cats.tolist()))
    cols = min(len(names), 4)
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), squeeze=False)
    slots = list(manifest.pair.slots)
    for ax, name in zip(axes.flat, names):
        sel = cats == name
        counts, _, _ = np.histogram2d(t0[sel], t1[sel], bins=[edges, edges])
        # rows of the image are tau_1, columns tau_0; empty cells stay blank so that rare cells stand out
        img = ax.imshow(np.where(counts.T > 0, counts.T, np.nan), origin="lower", cmap="viridis",
                        extent=(edges[0], edges[-1], edges[0], edges[-1]), aspect="equal")
        ax.plot([edges[0], edges[-1]], [edges[0], edges[-1]], color="red", linewidth=1)
        better0, better1 = int((t0[sel] > t1[sel]).sum()), int((t1[sel] > t0[sel]).sum())
        ax.set_title(f"{name}: {int(sel.sum())} rounds\n{slots[0]} ahead {better0}, {slots[1]} ahead {better1}",
                     fontsize=9)
        ax.set_xlabel(f"tau_0 ({slots[0]})")
        ax.set_ylabel(f"tau_1 ({slots[1]})")
        fig.colorbar(img, ax=ax, fraction=0.046, pad=0.04, label="rounds")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"tau_0 against tau_1 per category ({manifest.pair})", fontsize=10)
    fig.tight_layout()
    path = Path(out) if out is not None else Path(data_dir) / PLOT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    """`python -m whiflash.datagen.plots DATASET_DIR [--out FILE]`: plot an existing router dataset."""
    parser = argparse.ArgumentParser(prog="python -m whiflash.datagen.plots",
                                     description="Heat maps of tau_0 against tau_1 per category of a router dataset.")
    parser.add_argument("data", help="a router dataset folder (manifest.json + Parquet shards)")
    parser.add_argument("--out", default=None, help=f"the PNG to write (default: DATA/{PLOT_NAME})")
    args = parser.parse_args(argv)
    print(plot_tau_pairs(args.data, args.out))


if __name__ == "__main__":
    main()
