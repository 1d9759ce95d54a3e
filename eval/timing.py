"""Timers for component latencies: CUDA events on a GPU, synchronised wall clock elsewhere.

Shared by `whiflash-eval profile` and `scripts/profile_shapes.py`. On a GPU, `device_ms` times a
batch of back-to-back calls between two CUDA events, so it measures GPU time without the host
synchronisation a per-call wall clock adds (~20 µs a call, comparable to a graphed decode step).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["copy_bandwidth", "device_ms", "sync", "wall_ms"]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(fn: Callable[[], Any], device: torch.device, n: int = 20) -> float:
    """Median wall latency of one synchronised call, in milliseconds (one untimed call first)."""
    fn()
    sync(device)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def device_ms(fn: Callable[[], Any], device: torch.device, n: int = 30) -> float:
    """Time of one call in milliseconds: on CUDA the median over 3 batches of `n` back-to-back calls
    between CUDA events (GPU time); elsewhere `wall_ms` over `n` calls."""
    if device.type != "cuda":
        return wall_ms(fn, device, n=n)
    fn()
    fn()  # the first calls capture graphs and warm allocators
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / n)
    return statistics.median(times)


def copy_bandwidth(device: torch.device) -> float:
    """Device copy bandwidth in bytes/s (read + write), over a 2 GiB buffer on CUDA (16 MiB elsewhere)."""
    x = torch.empty(2 * 1024**3 if device.type == "cuda" else 2**24, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = device_ms(lambda: y.copy_(x), device, n=10)
    return 2 * x.numel() / (ms / 1e3)
