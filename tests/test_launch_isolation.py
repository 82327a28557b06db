"""What a rank may see: its own inputs, its own traffic, and in an error only the learner's lines.

A rank's own arguments reach that rank alone (never a file of the shared run folder); the seeds of
the ranks' input streams give no rank another's; the wire counters are read only from the run's own
network namespace; and an error quotes source lines only from the learner's files, read when the run
started (never a hidden test, commtax itself, a file swapped for a link, or a test module).
"""

import os
import sys

import pytest
import torch
import torch.distributed as dist

import commtax.testing
from commtax.boundary.byfile import load_module_from_file
from commtax.ranks.launch import run_ranks
from commtax.testing import stream_seed
from tests.launch_support import planted

# -- workers (top level of this file: each rank imports it by path) -------------


def sum_of_ranks(rank, world_size, scale):
    t = torch.full((3,), float(rank + 1) * scale)
    dist.all_reduce(t)
    return t.tolist()


def own_and_shared(rank, world_size, shared, own):
    """What this rank was handed, whether its standard input is empty now, and whether any file of the
    run folder holds another rank's own argument."""
    others = [f"secret-of-rank-{r}".encode() for r in range(world_size) if r != rank]
    run_dir = sys.argv[1]  # the rank's entry point: python -m commtax.ranks._rank RUN_DIR RANK ...
    found = []
    for name in os.listdir(run_dir):
        try:
            with open(os.path.join(run_dir, name), "rb") as f:
                data = f.read()
        except OSError:
            continue
        found += [name for other in others if other in data]
    dist.barrier()  # no rank writes its result (which holds its own argument) before every rank has looked
    return [shared, own.decode(), sys.stdin.buffer.read() == b"", found]


# -- what a rank may see -----------------------------------------------------------


def test_rank_args_reach_only_their_rank_never_the_shared_run_folder():
    # A rank must not be able to read another rank's inputs where the
    # launcher put them: they come on the rank's standard input, read and gone before the job runs.
    own = [(f"secret-of-rank-{r}".encode(),) for r in range(3)]
    results = run_ranks(own_and_shared, 3, args=("everyone",), rank_args=own)
    assert results == [["everyone", f"secret-of-rank-{r}", True, []] for r in range(3)]
    assert results.wire_bytes is None  # outside the grader's sandbox the kernel's count means nothing


def test_stream_seeds_of_ranks_and_of_consecutive_secrets_share_no_offset_no_xor_and_no_bias():
    # A rank that recovers its own stream's seed (from the values it was handed) must learn no other
    # rank's, as it would if the seeds were the secret + rank. stream_seed hashes the secret with the
    # stream's labels: neighbours (ranks, or secrets one apart) share no offset and no XOR, in the low
    # 32 bits too (the only bits torch's CPU generator keys its stream on), and the bits are unbiased.
    secret = 0x2F1C_55AA_0123_4567
    ranks = [stream_seed(secret, "rank", r) for r in range(16)]
    assert stream_seed(secret, 1) != stream_seed(secret, 0) + 1
    for seeds in (ranks, [stream_seed(secret + i, "rank", 0) for i in range(16)]):
        for mask in (2**63 - 1, 2**32 - 1):
            assert len({(b - a) & mask for a, b in zip(seeds, seeds[1:])}) == 15, "a common offset"
            assert len({(a ^ b) & mask for a, b in zip(seeds, seeds[1:])}) == 15, "a common XOR"
    many = [stream_seed(secret, "shard", i) for i in range(256)]
    assert all(0 <= s < 2**63 for s in many) and len({s & (2**32 - 1) for s in many}) == 256
    ones = [sum(s >> bit & 1 for s in many) for bit in range(32)]
    assert all(64 <= n <= 192 for n in ones), ones  # 128 +- 8 standard deviations
    assert stream_seed(secret, "rank", 3) == ranks[3]  # reproducible
    assert stream_seed(secret, 1) != stream_seed(secret, "1") != stream_seed(secret, (1,))
    for bad in (1.5, None, True, [1]):
        with pytest.raises(ValueError, match="labels"):
            stream_seed(secret, bad)
    with pytest.raises(ValueError, match="seed"):
        stream_seed(str(secret), 0)


def test_loopback_counters_are_read_only_from_a_private_namespace(tmp_path):
    from commtax.ranks import wire

    head = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes\n"
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.write_text(head + "    lo: 5000 40 0 0 0 0 0 0 5000 40 0 0 0 0 0 0\n")
    shared.write_text(
        head + "    lo: 5000 40 0 0 0 0 0 0 5000 40 0 0 0 0 0 0\n  eth0: 9 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n"
    )
    assert wire.read_loopback(str(private)) == 5000
    assert wire.read_loopback(str(shared)) is None  # the machine's loopback: shared with everything else
    assert wire.read_loopback(str(tmp_path / "absent")) is None
    assert wire.wire_problem(None, 10**6, 10, "job") is None  # not countable: nothing to say
    assert wire.wire_problem(10**6 + 5000, 10**6, 10, "job") is None  # payload plus headers
    assert "less than the data" in wire.wire_problem(4000, 10**6, 10, "job")  # nothing sent
    assert "more than a correct run" in wire.wire_problem(3 * 10**6, 10**6, 10, "job")


def test_an_error_quotes_source_lines_only_from_the_learners_files_read_before_the_run(tmp_path):
    # Stacks come from the ranks, which run the learner's code: a forged frame naming another file
    # (a hidden test, an answer module of commtax) must not put that file's lines into a message,
    # and a learner's file swapped for a link after the run started must not be read through it.
    from commtax.ranks._frames import where
    from commtax.ranks._quotes import Quotes
    from commtax.ranks._watch import valid_beat

    secret = tmp_path / "hidden_test.py"
    secret.write_text("EXPECTED = 42  # the answer\n")
    learner = tmp_path / "starter.py"
    learner.write_text("def ring():\n    dist.recv(buf, 1)  # the learner's line\n")
    quotes = Quotes.of_job(planted.ring_with_a_wrong_tag, (load_module_from_file("quoted_starter", str(learner)),))
    learner.unlink()
    learner.symlink_to(secret)  # flipped after the start: the lines read at the start stay
    line = planted.stuck_line("ring_with_a_wrong_tag")
    assert "tag=1" in quotes.line(planted.__file__, line)
    assert quotes.line(str(learner), 2) == "    dist.recv(buf, 1)  # the learner's line"
    assert quotes.line(str(secret), 1) == ""
    collectives = os.path.join(os.path.dirname(commtax.testing.__file__), "formulas", "collectives.py")
    assert quotes.line(collectives, 1) == "" and quotes.line(commtax.testing.__file__, 1) == ""
    assert where(str(secret), 1, "f", quotes) == f"{secret}:1 in f"
    assert not valid_beat({"time": 0.0, "cpu": 0.0, "stack": [[str(secret)]], "p2p": {}})
    # A file that is a link when the run starts is not read at all; a test module is named, not quoted.
    assert Quotes([str(learner)]).line(str(learner), 1) == ""
    assert Quotes.of_job(sum_of_ranks).line(__file__, 1) == ""
