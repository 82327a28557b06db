"""Inputs the ranks cannot predict (secret seeds, one stream per rank), and bytes counted outside them."""

from __future__ import annotations

import os

from commtax.harness.verdict import fail

# A test's worker function runs inside the learner's rank processes, next to the learner's module:
# whatever it measures there (result tensors, byte counters, the collectives called) the learner's
# code can forge. So the inputs of a distributed test are drawn here, in the trusted test process,
# from a seed the learner cannot know when the grader runs, and each rank is handed only its own
# (``rank_args``): no rank can rebuild the others' inputs, so a right sum needs the data to move.
# The bytes that moved are counted by the kernel, outside the ranks (:mod:`commtax.ranks.wire`).

#: Set to an integer to fix the seed of every test's inputs (outside the grader only).
SEED_ENV = "COMMTAX_INPUT_SEED"


def input_seed(default: int) -> int:
    """The seed of a test module's inputs: secret under the grader, else ``default`` (reproducible).

    Under the grader (its sandbox settings are in the environment) the seed is
    drawn from :mod:`secrets` in the trusted test process, afresh for each lab
    run, and never leaves it: ranks get the inputs made from it, each only its
    own. A learner running ``pytest`` sees ``default`` (or ``$COMMTAX_INPUT_SEED``),
    so that a failure repeats.
    """
    from commtax.learner_process import sandbox

    if sandbox() is not None:
        import secrets

        return secrets.randbits(62)
    text = os.environ.get(SEED_ENV, "")
    return int(text) if text.strip().lstrip("-").isdigit() else default


def stream_seed(seed: int, *labels) -> int:
    """The seed of one independent random stream: a keyed hash (BLAKE2b) of ``seed`` and ``labels``.

    Every stream a test draws from its secret :func:`input_seed` (one rank's input,
    one shard, one decoy) gets its own seed from here, never ``seed + rank``: with
    consecutive seeds, a rank that recovered its own stream's seed from the values it
    was handed (a Mersenne Twister's state can be rebuilt from its outputs) would know
    every other rank's. Hashed seeds share no relation a rank could use: knowing one
    says nothing of the secret or of another label's. ``labels``: ints, strings, or
    tuples of them, naming the stream (say ``"x", rank``). Returns an int in
    [0, 2**63), which ``torch.Generator().manual_seed`` accepts; note that torch's CPU
    generator keys its stream on the low 32 bits of a seed only (seeds ``s`` and
    ``s + 2**32`` give the same numbers), so each stream is one of 2**32, chosen here
    by a hash of the whole 62-bit secret.
    """
    import hashlib

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r:.60}")
    _check_labels(labels)
    digest = hashlib.blake2b(repr((seed, labels)).encode(), digest_size=8, person=b"commtax-stream").digest()
    return int.from_bytes(digest, "little") >> 1


def _check_labels(labels) -> None:
    for label in labels:
        if isinstance(label, tuple):
            _check_labels(label)
        elif isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ValueError(f"labels must be ints, strings or tuples of them, got {label!r:.60}")


def expect_wire_bytes(results, payload: int, messages: int, what: str) -> None:
    """Fail unless the job behind ``results`` really moved ``payload`` bytes between its ranks.

    ``results``: what :func:`commtax.ranks.launch.run_ranks` (or :class:`SharedRuns`) returned; its
    ``wire_bytes`` are counted by the kernel outside the ranks, all ranks together, headers
    included (None outside the grader's OS sandbox: then nothing is checked, and the
    per-rank counts the ranks report are the only evidence). ``payload``: the bytes a correct
    implementation sends in the whole job, all ranks together; ``messages``: how many
    messages it sends (overhead allowance, :func:`commtax.ranks.wire.wire_problem`).
    """
    __tracebackhide__ = True
    from commtax.ranks.wire import wire_problem

    problem = wire_problem(getattr(results, "wire_bytes", None), payload, messages, what)
    if problem:
        fail(problem)
