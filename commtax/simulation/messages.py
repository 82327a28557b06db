"""A message-level simulator of collective algorithms: the independent check of every cost formula.

A formula like ``2(P-1)a + 2(P-1)/P * n/B`` is derived by reasoning. This
module does not reason: it *runs* the algorithm, message by message, on P
simulated ranks, and measures what happened.

* An algorithm is a list of **rounds**; a round is a list of messages that
  happen at the same time. Each message copies (or adds) a slice of one rank's
  buffer into a slice of another's.
* The network is the alpha-beta model per link: a message of ``b`` bytes over a
  link costs ``alpha + b / bandwidth`` seconds. A round lasts as long as its
  slowest message, and a rank sends at most one and receives at most one
  message per round (one port per direction, full duplex).
* The data are not numbers but **sets of contributing ranks** (Python ints used
  as bitsets). Rank r starts with ``{r}`` in every element; an "add" must join
  disjoint sets (adding a contribution twice is a bug the simulator raises on);
  at the end an all-reduce is correct iff every element on every rank holds
  every rank. So a wrong schedule fails loudly instead of producing a cost.

Counting is what makes it a check: time is the sum of round times, traffic the
bytes each rank sent. Units: bytes, seconds, bytes/second. ``nbytes`` is the
size of the buffer each rank holds; each of the ``numel`` simulated elements
stands for ``nbytes / numel`` bytes, so a 1 GB all-reduce is as cheap to
simulate as a 1 KB one. The rings cut it into equal chunks (:func:`equal_chunks`), so
``numel`` must be a multiple of every ring's size (the default, 4 per rank, is).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from commtax.checks import require_int, require_nonnegative, require_positive

# -- the network -------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """Who is connected to whom, and how fast.

    ``gpus_per_node`` = None means one flat network (every pair uses the
    ``inter`` link). Otherwise ranks ``node*G .. node*G+G-1`` share a node and
    talk over ``intra``; ranks on different nodes use ``inter``. Links are
    (alpha seconds, bandwidth bytes/s per direction).
    """

    inter: tuple[float, float]
    intra: tuple[float, float] | None = None
    gpus_per_node: int | None = None

    @classmethod
    def flat(cls, alpha: float, bandwidth: float) -> Topology:
        return cls(inter=(alpha, bandwidth))

    @classmethod
    def two_level(cls, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth):
        return cls(
            inter=(inter_alpha, inter_bandwidth), intra=(intra_alpha, intra_bandwidth), gpus_per_node=gpus_per_node
        )

    def link(self, src: int, dst: int) -> tuple[float, float]:
        if self.gpus_per_node and src // self.gpus_per_node == dst // self.gpus_per_node:
            return self.intra
        return self.inter


# -- messages and rounds -----------------------------------------------------


@dataclass(frozen=True)
class Message:
    """Move ``buffers[src][src_buf][src_slice]`` into ``buffers[dst][dst_buf][dst_slice]``.

    ``op`` is ``"add"`` (reduce into the destination) or ``"copy"``. A message
    with ``src == dst`` is a local copy: free, and not counted as traffic.
    """

    src: int
    dst: int
    start: int
    stop: int
    op: str = "add"
    src_buf: str = "data"
    dst_buf: str = "data"
    dst_start: int | None = None  # defaults to ``start`` (same place in the other buffer)

    @property
    def numel(self) -> int:
        return self.stop - self.start


def equal_chunks(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(numel)`` into ``parts`` contiguous chunks of ``numel / parts`` elements each, in order.

    The simulator's elements are a resolution, not the data (each stands for
    ``nbytes / numel`` bytes), so it can always pick a ``numel`` that every ring
    divides: every lesson and test does. A ``numel`` that ``parts`` does not
    divide raises ValueError: splitting a real buffer of any length is Lab 02's
    ``chunk_bounds``, and a release that shipped it here would hand learners that lab's answer.
    """
    parts = require_int("parts", parts, 1)
    numel = require_int("numel", numel, 0)
    if numel % parts:
        raise ValueError(
            f"numel must be a multiple of the ring's {parts} ranks (the simulator splits a buffer into "
            f"equal chunks), got {numel}"
        )
    size = numel // parts
    return [(i * size, (i + 1) * size) for i in range(parts)]


# -- algorithms: each returns a list of rounds --------------------------------


def naive_allreduce(world_size: int, numel: int, root: int = 0) -> list[list[Message]]:
    """Reduce to ``root`` one sender at a time, then send the result back one receiver at a time."""
    others = [r for r in range(world_size) if r != root]
    reduce = [[Message(r, root, 0, numel, "add")] for r in others]
    broadcast = [[Message(root, r, 0, numel, "copy")] for r in others]
    return reduce + broadcast


def tree_allreduce(world_size: int, numel: int) -> list[list[Message]]:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast: whole buffers at every level."""
    rounds_up, mask = [], 1
    while mask < world_size:
        rounds_up.append(
            [Message(r, r - mask, 0, numel, "add") for r in range(world_size) if r & mask and r % mask == 0]
        )
        mask <<= 1
    rounds_down = [[Message(m.dst, m.src, 0, numel, "copy") for m in level] for level in reversed(rounds_up)]
    return rounds_up + rounds_down


def _ring(world_size, numel, ranks, span, offset, op) -> list[list[Message]]:
    """P-1 ring steps: at step s the i-th rank sends chunk (i + offset - s) mod P to the (i+1)-th."""
    ranks = list(range(world_size)) if ranks is None else ranks
    lo, hi = span or (0, numel)
    p = len(ranks)
    chunks = [(lo + a, lo + b) for a, b in equal_chunks(hi - lo, p)]
    return [
        [Message(ranks[i], ranks[(i + 1) % p], *chunks[(i + offset - step) % p], op) for i in range(p)]
        for step in range(p - 1)
    ]


def ring_reduce_scatter(
    world_size: int, numel: int, ranks: list[int] | None = None, span: tuple[int, int] | None = None
) -> list[list[Message]]:
    """Ring reduce-scatter over ``ranks`` (default all) of the elements in ``span``.

    At step s, the i-th rank of the ring adds its chunk (i - s) mod P into its
    successor. After P-1 steps the i-th rank holds chunk (i + 1) mod P summed
    over all ranks.
    """
    return _ring(world_size, numel, ranks, span, 0, "add")


def ring_allgather(
    world_size: int, numel: int, ranks: list[int] | None = None, span: tuple[int, int] | None = None
) -> list[list[Message]]:
    """Ring all-gather: the i-th rank starts owning chunk (i + 1) mod P (where reduce-scatter leaves it)."""
    return _ring(world_size, numel, ranks, span, 1, "copy")


def ring_allreduce(world_size: int, numel: int) -> list[list[Message]]:
    """Ring all-reduce = ring reduce-scatter + ring all-gather."""
    return ring_reduce_scatter(world_size, numel) + ring_allgather(world_size, numel)


def halving_doubling_allreduce(world_size: int, numel: int) -> list[list[Message]]:
    """Recursive halving (reduce-scatter) then recursive doubling (all-gather), Rabenseifner-style.

    For P a power of two: log2(P) exchanges each way, with halves, quarters...
    of the buffer. Otherwise the P - 2^k extra ranks first add their whole
    buffer into a partner, sit out, and get the result back at the end: two
    extra full-buffer messages, which the closed-form formula does not include.
    """
    p2 = 1 << (world_size.bit_length() - 1)
    extra = world_size - p2
    rounds = []
    if extra:
        rounds.append([Message(p2 + i, i, 0, numel, "add") for i in range(extra)])
    # Each rank's segment [lo, hi) shrinks by half per halving step.
    seg = {r: (0, numel) for r in range(p2)}
    history = []
    distance = p2 // 2
    while distance >= 1:
        msgs, new_seg = [], {}
        for r in range(p2):
            partner = r ^ distance
            lo, hi = seg[r]
            mid = lo + (hi - lo) // 2
            keep_low = r < partner
            keep = (lo, mid) if keep_low else (mid, hi)
            give = (mid, hi) if keep_low else (lo, mid)
            msgs.append(Message(r, partner, *give, "add"))
            new_seg[r] = keep
        history.append((distance, dict(seg)))
        seg = new_seg
        rounds.append(msgs)
        distance //= 2
    for distance, old_seg in reversed(history):
        msgs = []
        for r in range(p2):
            msgs.append(Message(r, r ^ distance, *seg[r], "copy"))
        seg = old_seg
        rounds.append(msgs)
    if extra:
        rounds.append([Message(i, p2 + i, 0, numel, "copy") for i in range(extra)])
    return rounds


def pairwise_all_to_all(world_size: int, numel: int) -> list[list[Message]]:
    """All-to-all by pairwise exchange: at step s, rank r sends block (r+s) mod P to rank (r+s) mod P.

    Each rank's ``send`` buffer holds P blocks of numel/P elements; block j
    goes to rank j, landing in block r of j's ``recv`` buffer. The block a rank
    keeps for itself is a free local copy.
    """
    blocks = equal_chunks(numel, world_size)
    rounds = [[Message(r, r, *blocks[r], "copy", src_buf="send", dst_buf="recv") for r in range(world_size)]]
    for step in range(1, world_size):
        msgs = []
        for r in range(world_size):
            dst = (r + step) % world_size
            start, stop = blocks[dst]
            msgs.append(Message(r, dst, start, stop, "copy", src_buf="send", dst_buf="recv", dst_start=blocks[r][0]))
        rounds.append(msgs)
    return rounds


def hierarchical_allreduce(nodes: int, gpus_per_node: int, numel: int) -> list[list[Message]]:
    """Ring reduce-scatter inside each node, ring all-reduce of each shard across nodes (one ring
    per local GPU index: all "rails" at once), ring all-gather inside each node."""
    g = gpus_per_node
    node_ranks = [list(range(n * g, (n + 1) * g)) for n in range(nodes)]
    chunks = equal_chunks(numel, g)

    def in_parallel(per_group):
        # Zip the rounds of independent groups into shared rounds.
        return [sum(step, []) for step in zip(*per_group)] if per_group and per_group[0] else []

    rounds = in_parallel([ring_reduce_scatter(nodes * g, numel, ranks) for ranks in node_ranks])
    rails = []
    for local in range(g):
        owned = chunks[(local + 1) % g]  # what intra-node reduce-scatter left on this local index
        rail = [n * g + local for n in range(nodes)]
        rails.append(ring_reduce_scatter(nodes * g, numel, rail, owned) + ring_allgather(nodes * g, numel, rail, owned))
    rounds += in_parallel(rails)
    rounds += in_parallel([ring_allgather(nodes * g, numel, ranks) for ranks in node_ranks])
    return rounds


ALLREDUCE_ALGORITHMS = {
    "naive": naive_allreduce,
    "tree": tree_allreduce,
    "ring": ring_allreduce,
    "halving_doubling": halving_doubling_allreduce,
}


# -- running a schedule -------------------------------------------------------


@dataclass
class SimResult:
    """What a simulated collective did. Times in seconds, traffic in bytes."""

    time: float
    rounds: int
    bytes_sent: list[float]
    bytes_received: list[float]
    messages_sent: list[int]
    buffers: list[dict[str, np.ndarray]]
    round_times: list[float] = field(default_factory=list)
    snapshots: list | None = None  # per round: (messages, buffers after it), when recorded

    @property
    def max_bytes_sent(self) -> float:
        return max(self.bytes_sent)


def initial_buffers(world_size: int, numel: int, names=("data",)) -> list[dict[str, np.ndarray]]:
    """Rank r starts with the set {r} in every element of every named buffer."""
    buffers = []
    for r in range(world_size):
        bufs = {}
        for name in names:
            arr = np.empty(numel, dtype=object)
            arr[:] = 1 << r
            bufs[name] = arr
        buffers.append(bufs)
    return buffers


def run_schedule(rounds, buffers, topology: Topology, nbytes: float, numel: int, record: bool = False) -> SimResult:
    """Execute ``rounds`` on ``buffers`` (mutated) and count time and traffic."""
    world_size = len(buffers)
    element_bytes = nbytes / numel if numel else 0.0
    sent = [0.0] * world_size
    received = [0.0] * world_size
    count = [0] * world_size
    round_times, snapshots = [], [] if record else None
    for messages in rounds:
        senders = [m.src for m in messages if m.src != m.dst]
        receivers = [m.dst for m in messages if m.src != m.dst]
        if len(set(senders)) != len(senders) or len(set(receivers)) != len(receivers):
            raise AssertionError("a rank sends or receives two messages in one round")
        # Everything a round sends is read before anything it delivers is written.
        payloads = [buffers[m.src][m.src_buf][m.start : m.stop].copy() for m in messages]
        seconds = 0.0
        for m, payload in zip(messages, payloads):
            d0 = m.start if m.dst_start is None else m.dst_start
            target = buffers[m.dst][m.dst_buf]
            if m.op == "add":
                if any(a & b for a, b in zip(target[d0 : d0 + m.numel], payload)):
                    raise AssertionError(f"message {m} adds a contribution that is already there")
                target[d0 : d0 + m.numel] = target[d0 : d0 + m.numel] | payload
            else:
                target[d0 : d0 + m.numel] = payload
            if m.src == m.dst:
                continue
            nb = m.numel * element_bytes
            alpha, bandwidth = topology.link(m.src, m.dst)
            seconds = max(seconds, alpha + nb / bandwidth)
            sent[m.src] += nb
            received[m.dst] += nb
            count[m.src] += 1
        round_times.append(seconds)
        if record:
            snapshots.append((messages, [{k: v.copy() for k, v in b.items()} for b in buffers]))
    return SimResult(sum(round_times), len(rounds), sent, received, count, buffers, round_times, snapshots)


def _check_sizes(nbytes, world_size, numel):
    require_nonnegative("nbytes", nbytes, "bytes")
    world_size = require_int("world_size", world_size, 1)
    numel = world_size * 4 if numel is None else require_int("numel", numel, 0)
    return world_size, numel


def simulate_allreduce(
    algorithm: str,
    nbytes: float,
    world_size: int,
    alpha: float,
    bandwidth: float,
    numel: int | None = None,
    record: bool = False,
) -> SimResult:
    """Run one all-reduce algorithm on ``world_size`` simulated ranks over a flat network.

    Raises AssertionError if the algorithm does not leave the full sum on every rank.
    """
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALLREDUCE_ALGORITHMS)}, got {algorithm!r}")
    world_size, numel = _check_sizes(nbytes, world_size, numel)
    require_nonnegative("alpha", alpha, "s")
    require_positive("bandwidth", bandwidth, "bytes/s")
    buffers = initial_buffers(world_size, numel)
    rounds = ALLREDUCE_ALGORITHMS[algorithm](world_size, numel)
    result = run_schedule(rounds, buffers, Topology.flat(alpha, bandwidth), nbytes, numel, record)
    assert_allreduced(result.buffers)
    return result


def simulate_reduce_scatter(nbytes, world_size, alpha, bandwidth, numel=None) -> SimResult:
    """Ring reduce-scatter of an ``nbytes`` buffer; checks rank i ends owning chunk (i+1) mod P."""
    world_size, numel = _check_sizes(nbytes, world_size, numel)
    buffers = initial_buffers(world_size, numel)
    rounds = ring_reduce_scatter(world_size, numel)
    result = run_schedule(rounds, buffers, Topology.flat(alpha, bandwidth), nbytes, numel)
    full = (1 << world_size) - 1
    for r, (start, stop) in enumerate(equal_chunks(numel, world_size)):
        owner = (r - 1) % world_size
        if any(v != full for v in result.buffers[owner]["data"][start:stop]):
            raise AssertionError(f"rank {owner} does not hold chunk {r} fully reduced")
    return result


def simulate_allgather(nbytes, world_size, alpha, bandwidth, numel=None) -> SimResult:
    """Ring all-gather: ``nbytes`` is the full buffer each rank holds at the end."""
    world_size, numel = _check_sizes(nbytes, world_size, numel)
    chunks = equal_chunks(numel, world_size)
    buffers = initial_buffers(world_size, numel)
    for r in range(world_size):  # rank r starts with only its own chunk (r + 1) mod P
        own = chunks[(r + 1) % world_size]
        data = buffers[r]["data"]
        data[:] = 0
        data[own[0] : own[1]] = 1 << ((r + 1) % world_size)
    result = run_schedule(ring_allgather(world_size, numel), buffers, Topology.flat(alpha, bandwidth), nbytes, numel)
    expected = np.empty(numel, dtype=object)
    for c, (start, stop) in enumerate(chunks):
        expected[start:stop] = 1 << c
    for r in range(world_size):
        if list(result.buffers[r]["data"]) != list(expected):
            raise AssertionError(f"rank {r} did not gather every chunk")
    return result


def simulate_all_to_all(nbytes, world_size, alpha, bandwidth, numel=None) -> SimResult:
    """Pairwise all-to-all; ``nbytes`` is what each rank sends in total (its own block included)."""
    world_size, numel = _check_sizes(nbytes, world_size, numel)
    buffers = initial_buffers(world_size, numel, names=("send", "recv"))
    for b in buffers:
        b["recv"][:] = 0
    result = run_schedule(
        pairwise_all_to_all(world_size, numel), buffers, Topology.flat(alpha, bandwidth), nbytes, numel
    )
    blocks = equal_chunks(numel, world_size)
    for j in range(world_size):
        for r, (start, stop) in enumerate(blocks):
            if start == stop:
                continue
            got = result.buffers[j]["recv"][start:stop]
            if any(v != 1 << r for v in got):
                raise AssertionError(f"rank {j} block {r} did not come from rank {r}")
    return result


def simulate_hierarchical_allreduce(
    nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth, numel=None
) -> SimResult:
    """Two-level all-reduce on ``nodes`` x ``gpus_per_node`` ranks (see :func:`hierarchical_allreduce`)."""
    nodes = require_int("nodes", nodes, 1)
    gpus_per_node = require_int("gpus_per_node", gpus_per_node, 1)
    world_size = nodes * gpus_per_node
    numel = world_size * 4 if numel is None else numel
    topo = Topology.two_level(gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth)
    buffers = initial_buffers(world_size, numel)
    result = run_schedule(hierarchical_allreduce(nodes, gpus_per_node, numel), buffers, topo, nbytes, numel)
    assert_allreduced(result.buffers)
    return result


def simulate_flat_ring_on_two_levels(
    nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth, numel=None
) -> SimResult:
    """One ring through all ``nodes * gpus_per_node`` ranks, on the same two-level network."""
    world_size = nodes * gpus_per_node
    numel = world_size * 4 if numel is None else numel
    topo = Topology.two_level(gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth)
    buffers = initial_buffers(world_size, numel)
    result = run_schedule(ring_allreduce(world_size, numel), buffers, topo, nbytes, numel)
    assert_allreduced(result.buffers)
    return result


def assert_allreduced(buffers) -> None:
    """Every element on every rank holds every rank's contribution exactly once."""
    full = (1 << len(buffers)) - 1
    for r, b in enumerate(buffers):
        if any(v != full for v in b["data"]):
            raise AssertionError(f"rank {r} does not hold the full sum")
