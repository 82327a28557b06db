"""Pytest helpers for the labs: run ranks or skip, and the backends to parametrize over."""

from __future__ import annotations

import pytest

from commtax.launch import BackendUnavailable, run_ranks

#: Parametrize a distributed test over these: gloo always runs; NCCL runs only
#: where there is a GPU per rank and is skipped (with the reason) elsewhere.
BACKENDS = ("gloo", pytest.param("nccl", marks=pytest.mark.nccl))


def run_or_skip(fn, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
                backend: str = "gloo", timeout: float = 60.0, **options):
    """:func:`commtax.launch.run_ranks`, turning "this backend cannot run here" into a skip."""
    try:
        return run_ranks(fn, world_size, args, kwargs, backend=backend, timeout=timeout, **options)
    except BackendUnavailable as exc:
        pytest.skip(f"{backend} skipped: {exc}")
