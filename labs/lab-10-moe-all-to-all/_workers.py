"""Lab 10's rank side: the layer's configuration and what every rank runs.

``test_lab.py`` reads as the spec; this file holds what its ranks execute (``exchange_worker``,
``moe_worker`` and their parts) and the configuration both sides share. Workers return plain data;
every expected value is computed in the test process, by the single-process reference written
there, independently of the lab. Each rank runs only on the inputs it is handed (``rank_args``).
"""

import time

import torch

from commtax.ranks.launch import rank_device
from commtax.ranks.traffic import record_traffic
from commtax.testing import SECTION_FAILED, run_section

DTYPE = torch.float64
HIDDEN, FFN, TOP_K, TOKENS = 8, 16, 2, 12  # the small layer: 12 tokens per rank
CAPACITY_FACTOR = 0.75  # below 1: some copies must be dropped

# Split matrices for the all-to-all: SPLITS[w][i][j] = rows rank i sends rank j (zeros included).
SPLITS = {2: [[3, 0], [5, 2]], 4: [[1, 0, 4, 2], [0, 0, 3, 0], [2, 6, 0, 1], [0, 1, 1, 5]]}

# The skew experiment: a bigger float32 layer, top-1, timed on 2 ranks.
SKEW = dict(hidden=64, ffn=4096, experts=4, tokens=512, repeats=3)

#: Rank j receives RECEIVE_EQUAL[j] rows from every rank: its output splits are equal, its input's are not, and
#: the output and the input have different row counts (a None output split list is the OUTPUT's rows / P).
RECEIVE_EQUAL = {world: [2 * j + 1 for j in range(world)] for world in (2, 4)}

#: Every rank sends as many rows as it receives and the matrix is not symmetric: an AllToAll backward that
#: reuses the forward's split lists (not swapped) runs to the end and sends the gradient rows the wrong way.
CYCLIC = [[(j - i) % 4 for j in range(4)] for i in range(4)]


# -- workers: run inside the ranks, return plain data --------------------------------------------


def _moe(lab, weights, top_k, device):
    experts, ffn, hidden = weights["w1"].shape
    moe = lab.MoE(hidden, ffn, experts, top_k, dtype=weights["w1"].dtype)
    moe.load_state_dict(weights)
    return moe.to(device)


def _grad_of(tensor):
    return None if tensor.grad is None else tensor.grad.cpu()


def _which(shard, whole):
    """For each expert of a rank's ``shard`` (experts first), which expert of the ``whole`` layer it is (None: none)."""
    with torch.no_grad():
        shard, whole = shard.detach().cpu(), whole.detach().cpu()
        return [
            next((e for e in range(whole.shape[0]) if whole[e].shape == one.shape and torch.equal(whole[e], one)), None)
            for one in shard
        ]


def _same_storage(layer, full, name):
    """Whether ``layer``'s tensor ``name`` ("router.weight", "w1", "w2") shares memory with ``full``'s."""

    def get(module):
        value = module
        for part in name.split("."):
            value = getattr(value, part, None)
        return value

    mine, theirs = get(layer), get(full)
    return (
        torch.is_tensor(mine)
        and torch.is_tensor(theirs)
        and mine.untyped_storage().data_ptr() == theirs.untyped_storage().data_ptr()
    )


def _ep_parts(lab, weights, x, up, top_k, cf, device):
    """The layer's forward and backward as two parts: a backward that raises leaves the forward's tests alone."""
    state = {}

    def forward():
        full = _moe(lab, weights, top_k, device)
        layer = lab.ExpertParallelMoE.from_full(full)
        if not isinstance(layer, torch.nn.Module):
            raise TypeError(
                f"ExpertParallelMoE.from_full(moe) returned {type(layer).__name__} {layer!r:.60}, not an nn.Module"
            )
        xi = x.clone().to(device).requires_grad_()
        with record_traffic() as traffic:
            y = layer(xi, capacity_factor=cf)
        state.update(layer=layer, x=xi, y=y)
        got = {
            "output": y.detach().cpu(),
            "w1_shape": tuple(layer.w1.shape),
            "w1_experts": _which(layer.w1, full.w1),
            "send_counts": list(layer.send_counts),
            "recv_counts": list(layer.recv_counts),
            "dropped": int(layer.dropped),
            "count_types": [type(getattr(layer, name)).__name__ for name in ("send_counts", "recv_counts", "dropped")],
            "sent": traffic.bytes_sent,
            "collectives": traffic.collectives,
            "shares": [name for name in ("router.weight", "w1", "w2") if _same_storage(layer, full, name)],
        }
        if cf is not None:  # the same layer once more, dropless: its count is this call's, not the last one's
            with torch.no_grad():
                layer(x.clone().to(device), capacity_factor=None)
            got["dropped_then_dropless"] = int(layer.dropped)
        return got

    def backward():
        if not state:
            raise RuntimeError("not run: the forward raised (see the forward's tests)")
        with record_traffic() as traffic:
            (state["y"] * up.to(device)).sum().backward()
        layer = state["layer"]
        # A .grad that stays None is the learner's graph cut, not an error here: the tests name it (_missing_grads).
        return {
            "input_grad": _grad_of(state["x"]),
            "router_grad": _grad_of(layer.router.weight),
            "w1_grad": _grad_of(layer.w1),
            "w2_grad": _grad_of(layer.w2),
            "sent": traffic.bytes_sent,
            "collectives": traffic.collectives,
        }

    return forward, backward


def _timed_layer(lab, weights, x, top_k, repeats):
    layer = lab.ExpertParallelMoE.from_full(_moe(lab, weights, top_k, "cpu"))
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        xi = x.clone().requires_grad_()
        wall, cpu = time.perf_counter(), time.thread_time()
        layer(xi).sum().backward()
        best_cpu, best_wall = min(best_cpu, time.thread_time() - cpu), min(best_wall, time.perf_counter() - wall)
    return {"recv_counts": list(layer.recv_counts), "cpu": best_cpu, "wall": best_wall}


def _a2a_checks(lab, rank, world_size, case, device):
    out = {}
    matrix = SPLITS[world_size]
    send_splits, recv_splits = matrix[rank], [row[rank] for row in matrix]
    for name, tensors in case["a2a"].items():
        send = tensors[rank].to(device)
        with record_traffic() as traffic:
            got = lab.all_to_all(send, send_splits, recv_splits)
        out[name] = {
            "got": got.cpu() if isinstance(got, torch.Tensor) else got,
            "bytes_sent": traffic.bytes_sent,
            "collectives": traffic.collectives,
            "empty_messages": sum(1 for m in traffic.messages if m[3] == 0),
        }
    # One row more than send_splits sum to (the docstring's ValueError; a sum below the rows moves nothing
    # wrong on the wire, so a missing check cannot hang the run): every rank calls it alike.
    send = case["a2a"]["rows"][rank].to(device)
    try:
        lab.all_to_all(torch.cat([send, send[:1]]), send_splits, recv_splits)
        out["extra_row"] = "returned"
    except Exception as exc:  # noqa: BLE001 - the test says what it expected
        out["extra_row"] = f"{type(exc).__name__}: {exc}"
    # A rank expecting one row more from itself than it sends itself (the peers' splits agree, so nothing
    # on the wire differs): the docstring's ValueError, not a broadcast slice assignment.
    expects = [n + (j == rank) for j, n in enumerate(recv_splits)]
    try:
        lab.all_to_all(send, send_splits, expects)
        out["own_split"] = "returned"
    except Exception as exc:  # noqa: BLE001 - the test says what it expected
        out["own_split"] = f"{type(exc).__name__}: {exc}"
    # One entry too many in recv_splits (a check of send_splits' length alone returns uninitialised rows)
    try:
        lab.all_to_all(send, send_splits, recv_splits + [1])
        out["long_recv"] = "returned"
    except Exception as exc:  # noqa: BLE001 - the test says what it expected
        out["long_recv"] = f"{type(exc).__name__}: {exc}"
    # A group of one (every rank makes every group, in the same order): a new tensor equal to send, not
    # send itself (the caller may write into the result; `return send` for a world of 1 passes everything else).
    solo = [torch.distributed.new_group([r]) for r in range(world_size)][rank]
    try:
        got = lab.all_to_all(send, [send.shape[0]], [send.shape[0]], group=solo)
        out["solo"] = (
            "equal" if isinstance(got, torch.Tensor) and torch.equal(got.cpu(), send.cpu()) else f"got {got!r:.200}"
        ) + (
            ", send itself"
            if got is send
            or (isinstance(got, torch.Tensor) and got.untyped_storage().data_ptr() == send.untyped_storage().data_ptr())
            else ""
        )
    except Exception as exc:  # noqa: BLE001 - the test says what it expected
        out["solo"] = f"{type(exc).__name__}: {exc}"
    # Last, and not caught: the same rows as a transposed view (not contiguous). gloo sends only contiguous
    # tensors; a rank whose isend raises leaves its peer waiting in irecv, and the part's report of the
    # raise ("but first it raised, at ...: input tensor has to be contiguous") is what names it.
    got = lab.all_to_all(send.t().contiguous().t(), send_splits, recv_splits)
    out["strided"] = got.cpu() if isinstance(got, torch.Tensor) else got
    return out


def _single_checks(lab, rank, world_size, case, device):
    """lab.all_to_all_single in torch's argument order: given splits, then None (equal splits), then bad ones."""
    matrix = SPLITS[world_size]
    send_splits, recv_splits = matrix[rank], [row[rank] for row in matrix]
    send = case["a2a"]["rows"][rank].to(device)
    out = {}
    given = torch.full((sum(recv_splits), send.shape[1]), -1.0, dtype=send.dtype, device=device)
    returned = lab.all_to_all_single(given, send, recv_splits, send_splits)
    out["given"], out["given_returned"] = given.cpu(), returned is None
    equal = case["equal"][rank].to(device)  # EQUAL_ROWS rows per peer
    mine = torch.full_like(equal, -1.0)
    lab.all_to_all_single(mine, equal)
    torchs = torch.empty_like(equal)
    torch.distributed.all_to_all_single(torchs, equal)
    out["equal"], out["equal_torch"] = mine.cpu(), torchs.cpu()
    counts = RECEIVE_EQUAL[world_size]  # output rows: P x counts[rank]; input: sum(counts)
    received = torch.full((world_size * counts[rank], 3), -1.0, dtype=DTYPE, device=device)
    try:
        lab.all_to_all_single(received, case["receive_equal"][rank].to(device), None, counts)
        out["none_out"] = received.cpu()
    except Exception as exc:  # noqa: BLE001 - reported by the test: a None read from the input's rows raises here
        out["none_out"] = (type(exc).__name__, str(exc))
    try:  # an output one row longer than output_split_sizes says: every rank raises (the docstring's ValueError)
        lab.all_to_all_single(
            torch.empty(sum(recv_splits) + 1, send.shape[1], dtype=send.dtype, device=device),
            send,
            recv_splits,
            send_splits,
        )
        out["rows_error"] = None
    except Exception as exc:  # noqa: BLE001 - reported by the test, whatever it is
        out["rows_error"] = (type(exc).__name__, str(exc))
    try:  # a row too many: None cannot mean equal splits; every rank raises before sending anything
        lab.all_to_all_single(
            torch.empty(world_size + 1, 3, dtype=DTYPE, device=device),
            torch.zeros(world_size + 1, 3, dtype=DTYPE, device=device),
        )
        out["error"] = None
    except Exception as exc:  # noqa: BLE001 - reported by the test, whatever it is
        out["error"] = (type(exc).__name__, str(exc))
    return out


def _a2a_backward_check(lab, rank, x, device):
    """AllToAll on the CYCLIC splits, then backward with dL/dy = y: each row's gradient is its own value, so
    the input's gradient is the input itself when every row goes back where it came from."""
    send_splits, recv_splits = CYCLIC[rank], [row[rank] for row in CYCLIC]
    x = x.clone().to(device).requires_grad_(True)
    y = lab.AllToAll.apply(x, send_splits, recv_splits, None)
    (y * y.detach()).sum().backward()
    return {"x": x.detach().cpu(), "grad": None if x.grad is None else x.grad.cpu()}


def _from_full_error(lab, world_size):
    try:
        lab.ExpertParallelMoE.from_full(lab.MoE(HIDDEN, FFN, world_size + 1, 1, dtype=DTYPE))
        return "no error"
    except ValueError as exc:
        return str(exc)


def _subgroup_parts(lab, rank, case, device):
    """The layer on half of the 4 ranks: groups [0, 1] and [2, 3], each running the 2-rank case; its forward
    and its backward as two parts (a backward that leaves the group must not hide a right forward)."""
    state = {}
    sub, mine = case["subgroup"], rank % 2

    def forward():
        groups = [torch.distributed.new_group([0, 1]), torch.distributed.new_group([2, 3])]  # every rank makes both
        layer = lab.ExpertParallelMoE.from_full(_moe(lab, sub["weights"], TOP_K, device), group=groups[rank // 2])
        x = sub["xs"][mine].clone().to(device).requires_grad_()
        y = layer(x)
        state.update(x=x, y=y)
        return {"output": y.detach().cpu(), "recv_counts": list(layer.recv_counts)}

    def backward():
        if not state:
            raise RuntimeError(
                "not run: the forward raised (see test_the_layer_on_a_subgroup_exchanges_only_within_its_group)"
            )
        (state["y"] * sub["ups"][mine].to(device)).sum().backward()
        return {"input_grad": _grad_of(state["x"])}

    return forward, backward


def _exchange_parts(lab, rank, world_size, case, device, part, out):
    """The parts of all_to_all, all_to_all_single and AllToAll's backward; False if that backward sent some
    gradient rows the wrong way on some rank (the layer's backward would then deadlock or be wrong)."""
    part("a2a", lambda: _a2a_checks(lab, rank, world_size, case, device))
    part("single", lambda: _single_checks(lab, rank, world_size, case, device))
    if "cyclic" not in case:
        return True
    part("a2a backward", lambda: _a2a_backward_check(lab, rank, case["cyclic"][rank], device))
    mine = out["a2a backward"]
    flags = [None] * world_size  # every rank learns whether any rank's gradient rows went astray
    torch.distributed.all_gather_object(
        flags,
        isinstance(mine, dict)
        and SECTION_FAILED not in mine
        and mine.get("grad") is not None
        and torch.equal(mine["grad"], mine["x"]),
    )
    return all(flags)


def exchange_worker(rank, world_size, lab, case):
    """Only the exchange parts of :func:`moe_worker` (tests/test_planted_*.py: one cheap start-up)."""
    out = {}

    def part(name, fn):
        out[name] = run_section(fn)
        torch.distributed.barrier()

    _exchange_parts(lab, rank, world_size, case, rank_device(), part, out)
    return out


def moe_worker(rank, world_size, lab, case):
    """All checks of one world size in one start-up, each part on its own (``run_section``).

    A barrier after each part keeps the parts apart: a rank that is done with a part waits for the
    others, so a wrong message of one part (a size the receiver does not expect: gloo aborts the
    receiving rank) is received, and reported, in that part."""
    device = rank_device()
    out = {}

    def part(name, fn):
        out[name] = run_section(fn)
        torch.distributed.barrier()

    backward_ok = _exchange_parts(lab, rank, world_size, case, device, part, out)
    for label, cf in (("dropless", None), ("capacity", CAPACITY_FACTOR)):
        forward, backward = _ep_parts(lab, case["weights"], case["xs"][rank], case["ups"][rank], TOP_K, cf, device)
        part(f"{label} forward", forward)
        if backward_ok:
            part(f"{label} backward", backward)
        else:  # it would deadlock or give wrong gradients: the AllToAll test names the cause
            out[f"{label} backward"] = {
                SECTION_FAILED: (
                    "not run: AllToAll's backward sends the gradient rows the wrong way (see "
                    "test_all_to_all_backward_sends_each_gradient_row_back_where_it_came_from)",
                    "",
                )
            }
    part("from_full error", lambda: _from_full_error(lab, world_size))
    if "subgroup" in case:
        forward, backward = _subgroup_parts(lab, rank, case, device)
        part("subgroup", forward)
        if backward_ok:
            part("subgroup backward", backward)
    if "skew" in case:
        xs, routers = case["skew"]
        part(
            "skew",
            lambda: {
                name: _timed_layer(lab, weights, xs[rank], 1, SKEW["repeats"]) for name, weights in routers.items()
            },
        )
    return out
