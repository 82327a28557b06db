"""Lab 10 tests: the MoE bill on paper, the all-to-all from send/recv, and an expert-parallel MoE
layer on 2 and 4 real ranks that equals the single-process layer, sends the bytes its routing
says, slows down where the router is skewed, and drops exactly the copies the capacity rule drops.

Grader isolation: workers (top-level functions below) run inside the ranks and return plain data;
every expected value is computed here, in the pytest process, from the same inputs, by code that
does not come from the lab.
"""

import math
import time
import traceback

import pytest
import torch
import torch.nn.functional as F

from commtax.formulas import bill
from commtax.ranks.launch import rank_device
from commtax.ranks.traffic import record_traffic
from commtax.testing import BACKENDS, SharedRuns

RUNS = SharedRuns()
DTYPE = torch.float64
TOLERANCE = 1e-12
HIDDEN, FFN, TOP_K, TOKENS = 8, 16, 2, 12       # the small layer: 12 tokens per rank
EXPERTS = {2: 4, 4: 8}                          # 2 experts per rank on both world sizes
CAPACITY_FACTOR = 0.75                          # below 1: some copies must be dropped
COUNT_BYTES = 8                                 # the per-expert counts travel as int64

# Split matrices for the all-to-all: SPLITS[w][i][j] = rows rank i sends rank j (zeros included).
SPLITS = {
    2: [[3, 0], [5, 2]],
    4: [[1, 0, 4, 2], [0, 0, 3, 0], [2, 6, 0, 1], [0, 1, 1, 5]],
}

# The skew experiment: a bigger float32 layer, top-1, timed on 2 ranks.
SKEW = dict(hidden=64, ffn=4096, experts=4, tokens=512, repeats=3)


# -- inputs, made here and sent to the ranks ----------------------------------------------------

def _layer_weights(world, seed=0, dtype=DTYPE, hidden=HIDDEN, ffn=FFN, experts=None):
    experts = experts or EXPERTS[world]
    gen = torch.Generator().manual_seed(seed)
    return {"router.weight": torch.randn(experts, hidden, generator=gen, dtype=dtype),
            "w1": torch.randn(experts, ffn, hidden, generator=gen, dtype=dtype) / hidden ** 0.5,
            "w2": torch.randn(experts, hidden, ffn, generator=gen, dtype=dtype) / ffn ** 0.5}


def _tokens(world, seed=1, dtype=DTYPE, tokens=TOKENS, hidden=HIDDEN):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, hidden, generator=gen, dtype=dtype) for _ in range(world)]


def _a2a_inputs(world):
    """Per split matrix: rank i's send tensor, rows numbered so that every row is recognisable."""
    matrix = SPLITS[world]
    rows = [torch.stack([torch.arange(3, dtype=DTYPE) + 1000 * i + 10 * n for n in range(sum(matrix[i]))])
            if sum(matrix[i]) else torch.zeros(0, 3, dtype=DTYPE) for i in range(world)]
    ints = [torch.arange(sum(matrix[i]), dtype=torch.int64) + 100 * i for i in range(world)]
    return {"rows": rows, "ints": ints}


def _skew_inputs():
    """Tokens with a constant feature 0, a router that balances them and one that sends all to rank 0."""
    h, e = SKEW["hidden"], SKEW["experts"]
    xs = _tokens(2, seed=5, dtype=torch.float32, tokens=SKEW["tokens"], hidden=h)
    for x in xs:
        x[:, 0] = 1.0
    weights = _layer_weights(2, seed=6, dtype=torch.float32, hidden=h, ffn=SKEW["ffn"], experts=e)
    balanced = dict(weights, **{"router.weight": weights["router.weight"].clone()})
    balanced["router.weight"][:, 0] = 0.0
    skewed = dict(weights, **{"router.weight": weights["router.weight"].clone()})
    skewed["router.weight"][:, 0] = torch.tensor([30.0, 30.0, 0.0, 0.0])  # experts 0, 1 live on rank 0
    return xs, {"balanced": balanced, "skewed": skewed}


# -- the reference: a single-process MoE written here, independently of the lab -----------------

def _capacity(tokens, experts, top_k, cf):
    return math.ceil(round(cf * tokens * top_k / experts, 9))


def _keep_by_rule(ids, experts, capacity):
    """Brute force: choices in order (all first choices, then all second ...), tokens in order."""
    keep = torch.ones_like(ids, dtype=torch.bool)
    if capacity is None:
        return keep
    taken = [0] * experts
    for j in range(ids.shape[1]):
        for t in range(ids.shape[0]):
            e = int(ids[t, j])
            if taken[e] < capacity:
                taken[e] += 1
            else:
                keep[t, j] = False
    return keep


def _route(router, x, top_k):
    top, ids = torch.topk(x @ router.t(), top_k, dim=-1)
    return ids, torch.softmax(top, dim=-1)


def _reference(weights, xs, ups, top_k, cf):
    """Outputs per rank and gradients of sum_r <y_r, up_r> for the whole layer; each rank's tokens one group."""
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    experts = params["w1"].shape[0]
    xs = [x.clone().requires_grad_() for x in xs]
    outputs, keeps, loss = [], [], 0.0
    for x, up in zip(xs, ups):
        ids, w = _route(params["router.weight"], x, top_k)
        cap = None if cf is None else _capacity(x.shape[0], experts, top_k, cf)
        keep = _keep_by_rule(ids, experts, cap)
        y = torch.zeros_like(x)
        for e in range(experts):
            gate = ((ids == e) & keep).to(x.dtype) * w                     # tokens x k
            expert = F.gelu(x @ params["w1"][e].t()) @ params["w2"][e].t()
            y = y + gate.sum(1, keepdim=True) * expert
        outputs.append(y)
        keeps.append((ids, keep))
        loss = loss + (y * up).sum()
    loss.backward()
    grads = {k: p.grad for k, p in params.items()}
    return outputs, [x.grad for x in xs], grads, keeps


def _routing_counts(ids, keep, experts, world):
    """Copies each rank sends to each rank, from (ids, keep) of one source rank."""
    per_rank = experts // world
    counts = [0] * world
    for e in ids[keep].tolist():
        counts[e // per_rank] += 1
    return counts


# -- workers: run inside the ranks, return plain data --------------------------------------------

def _moe(lab, weights, top_k, device):
    experts, ffn, hidden = weights["w1"].shape
    moe = lab.MoE(hidden, ffn, experts, top_k, dtype=weights["w1"].dtype)
    moe.load_state_dict(weights)
    return moe.to(device)


def _ep_run(lab, weights, x, up, top_k, cf, device):
    layer = lab.ExpertParallelMoE.from_full(_moe(lab, weights, top_k, device))
    x = x.clone().to(device).requires_grad_()
    with record_traffic() as forward:
        y = layer(x, capacity_factor=cf)
    with record_traffic() as backward:
        (y * up.to(device)).sum().backward()
    return {"output": y.detach().cpu(), "input_grad": x.grad.cpu(),
            "router_grad": layer.router.weight.grad.cpu(), "w1_grad": layer.w1.grad.cpu(),
            "w2_grad": layer.w2.grad.cpu(), "w1_shape": tuple(layer.w1.shape),
            "send_counts": list(layer.send_counts), "recv_counts": list(layer.recv_counts),
            "dropped": int(layer.dropped),
            "forward_sent": forward.bytes_sent, "backward_sent": backward.bytes_sent,
            "collectives": forward.collectives + backward.collectives}


def _timed_layer(lab, weights, x, top_k, repeats):
    layer = lab.ExpertParallelMoE.from_full(_moe(lab, weights, top_k, "cpu"))
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        xi = x.clone().requires_grad_()
        wall, cpu = time.perf_counter(), time.thread_time()
        layer(xi).sum().backward()
        best_cpu, best_wall = min(best_cpu, time.thread_time() - cpu), min(best_wall, time.perf_counter() - wall)
    return {"recv_counts": list(layer.recv_counts), "cpu": best_cpu, "wall": best_wall}


def _section(fn):
    """Run one part of the checks; a learner's exception there becomes a message for that part's tests only
    (if the other ranks then wait forever, the launcher's deadlock detection fails the whole run instead)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported by the tests that read this part
        return {"failed": "".join(traceback.format_exception(exc))[-4000:]}


def _a2a_checks(lab, rank, world_size, case, device):
    out = {}
    matrix = SPLITS[world_size]
    send_splits, recv_splits = matrix[rank], [row[rank] for row in matrix]
    for name, tensors in case["a2a"].items():
        send = tensors[rank].to(device)
        with record_traffic() as traffic:
            got = lab.all_to_all(send, send_splits, recv_splits)
        single = send.new_empty((sum(recv_splits),) + tuple(send.shape[1:]))
        torch.distributed.all_to_all_single(single, send, recv_splits, send_splits)
        out[name] = {"got": got.cpu(), "single": single.cpu(), "bytes_sent": traffic.bytes_sent,
                     "collectives": traffic.collectives}
    return out


def _from_full_error(lab, world_size):
    try:
        lab.ExpertParallelMoE.from_full(lab.MoE(HIDDEN, FFN, world_size + 1, 1, dtype=DTYPE))
        return "no error"
    except ValueError as exc:
        return str(exc)


def moe_worker(rank, world_size, lab, case):
    """All checks of one world size in one start-up: all-to-all, the EP layer, its errors, the skew."""
    device = rank_device()
    out = {"a2a": _section(lambda: _a2a_checks(lab, rank, world_size, case, device)),
           "ep": _section(lambda: {label: _ep_run(lab, case["weights"], case["xs"][rank], case["ups"][rank], TOP_K,
                                                  cf, device)
                                   for label, cf in (("dropless", None), ("capacity", CAPACITY_FACTOR))}),
           "error": _section(lambda: _from_full_error(lab, world_size))}
    if "skew" in case:
        xs, routers = case["skew"]
        out["skew"] = _section(lambda: {name: _timed_layer(lab, weights, xs[rank], 1, SKEW["repeats"])
                                        for name, weights in routers.items()})
    return out


def _case(world, with_skew):
    weights, xs = _layer_weights(world), _tokens(world)
    ups = _tokens(world, seed=2)
    case = {"a2a": _a2a_inputs(world), "weights": weights, "xs": xs, "ups": ups}
    if with_skew:
        case["skew"] = _skew_inputs()
    return case


def _results(lab, world_size, backend="gloo"):
    needs = [lab.all_to_all, lab.AllToAll.backward, lab.ExpertParallelMoE.from_full, lab.ExpertParallelMoE.forward,
             lab.apply_capacity, lab.expert_capacity]
    case = _case(world_size, with_skew=(world_size == 2 and backend == "gloo"))
    return RUNS.get((world_size, backend), moe_worker, world_size, (lab, case), backend=backend, timeout=120,
                    needs=needs)


def _part(result, rank, key):
    """One part of a rank's results; if the learner's code raised there, fail with its traceback."""
    part = result[key]
    if isinstance(part, dict) and "failed" in part:
        raise AssertionError(f"rank {rank}: the {key} checks raised in your code:\n{part['failed']}")
    return part


def _diff(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


# -- part 1: the bill, by hand -------------------------------------------------------------------

@pytest.mark.points(3)
def test_expert_capacity_is_the_ceiling_of_cf_times_the_average_load(lab):
    assert lab.expert_capacity(4096, 8, 2, 1.25) == 1280       # 1.25 * 4096 * 2 / 8 exactly
    assert lab.expert_capacity(4096, 8, 2, 1.0) == 1024
    assert lab.expert_capacity(10, 4, 1, 1.0) == 3             # 2.5 rounds up
    assert lab.expert_capacity(100, 1, 1, 1.1) == 110          # not 111: 1.1 is inexact in binary
    assert lab.expert_capacity(12, 8, 2, 0.75) == 3            # 2.25 rounds up
    assert lab.expert_capacity(0, 8, 2, 1.25) == 0


def test_expert_capacity_refuses_bad_input_naming_the_argument(lab):
    for kwargs, name in ((dict(tokens=16, experts=4, top_k=5, capacity_factor=1.0), "top_k"),
                         (dict(tokens=-1, experts=4, top_k=1, capacity_factor=1.0), "tokens"),
                         (dict(tokens=16, experts=0, top_k=1, capacity_factor=1.0), "experts"),
                         (dict(tokens=16, experts=4, top_k=1, capacity_factor=0.0), "capacity_factor"),
                         (dict(tokens=16, experts=4, top_k=1, capacity_factor=float("nan")), "capacity_factor")):
        with pytest.raises(ValueError, match=name):
            lab.expert_capacity(**kwargs)


@pytest.mark.points(3)
def test_dispatch_bytes_are_the_off_rank_share_of_routed_copies(lab):
    # Mixtral 8x7B shapes: 4096 tokens on a rank, h = 4096, top-2, EP = 8, bf16.
    assert lab.dispatch_bytes_per_rank(4096, 4096, 8, 2) == pytest.approx(7 / 8 * 4096 * 2 * 4096 * 2)
    assert lab.dispatch_bytes_per_rank(4096, 4096, 8, 2) == pytest.approx(58_720_256)
    assert lab.dispatch_bytes_per_rank(100, 16, 1, 2) == 0                      # one rank: all local
    assert lab.dispatch_bytes_per_rank(10, 8, 2, 1, dtype_bytes=4) == pytest.approx(160)


def test_padded_dispatch_sends_every_remote_buffer_whole(lab):
    # 8 experts on 4 ranks, 12 tokens, top-2, cf 0.75: C = 3 slots; 3 remote ranks x 2 experts x 3 x 8 x 2.
    assert lab.dispatch_bytes_per_rank(12, 8, 4, 2, 2, capacity_factor=0.75, experts=8) == pytest.approx(288)
    # DeepSeek-V3-like: 256 experts on 64 ranks, 4096 tokens, top-8, cf 1.25, h 7168:
    # C = ceil(1.25 * 4096 * 8 / 256) = 160 slots; 63 ranks x 4 experts x 160 x 7168 x 2 bytes.
    assert lab.dispatch_bytes_per_rank(4096, 7168, 64, 8, 2, 1.25, 256) == pytest.approx(63 * 4 * 160 * 7168 * 2)
    # cf = 1 and experts divide the load evenly: padding adds nothing over the uniform dropless figure
    assert lab.dispatch_bytes_per_rank(64, 8, 4, 2, 2, 1.0, 8) == pytest.approx(
        lab.dispatch_bytes_per_rank(64, 8, 4, 2, 2))


def test_dispatch_bytes_refuse_bad_input_naming_the_argument(lab):
    for args, kwargs, name in (((10, 8, 0, 1), {}, "ep"), ((10, 8, 2, 3), {"experts": 2}, "top_k"),
                               ((10, 0, 2, 1), {}, "hidden"), ((-5, 8, 2, 1), {}, "tokens_per_rank"),
                               ((10, 8, 3, 1), {"experts": 8}, "experts"),
                               ((10, 8, 2, 1), {"capacity_factor": -1.0}, "capacity_factor")):
        with pytest.raises(ValueError, match=name):
            lab.dispatch_bytes_per_rank(*args, **kwargs)


@pytest.mark.points(3)
def test_lab_04s_ep_row_is_four_dispatches_of_this_lab(lab):
    # bill.ep_alltoall_bytes_per_layer prices dispatch + combine, forward + backward: four all-to-alls.
    for tokens, hidden, ep, top_k in ((4096, 4096, 8, 2), (4096, 7168, 64, 8), (2048, 5120, 16, 6), (7, 3, 2, 1)):
        four = 4 * lab.dispatch_bytes_per_rank(tokens, hidden, ep, top_k, 2)
        assert bill.ep_alltoall_bytes_per_layer(tokens, hidden, ep, top_k, 2) == pytest.approx(four), \
            f"tokens {tokens}, hidden {hidden}, ep {ep}, top_k {top_k}"


@pytest.mark.points(3)
def test_capacity_drops_exactly_the_copies_the_rule_drops(lab):
    gen = torch.Generator().manual_seed(3)
    for tokens, experts, top_k, capacity in ((12, 4, 2, 3), (40, 8, 2, 6), (30, 4, 1, 5), (16, 8, 4, 0), (9, 3, 3, 9)):
        # distinct choices per token, as top-k gives
        ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
        got = lab.apply_capacity(ids, experts, capacity)
        expected = _keep_by_rule(ids, experts, capacity)
        wrong = (got.bool() != expected).nonzero().tolist()
        assert not wrong, f"{tokens} tokens, {experts} experts, capacity {capacity}: (token, choice) {wrong[:5]} wrong"
    ids = torch.tensor([[0, 1], [0, 1], [0, 1]])                # hand-checked: the third token loses expert 0
    assert lab.apply_capacity(ids, 2, 2).tolist() == [[True, True], [True, True], [False, False]]
    ids = torch.tensor([[1, 0], [0, 1]])                        # first choices first: token 1's expert 0 wins
    assert lab.apply_capacity(ids, 2, 1).tolist() == [[True, False], [True, False]]
    assert bool(lab.apply_capacity(ids, 2, None).all())


# -- part 2: on real ranks -----------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_all_to_all_equals_all_to_all_single_with_uneven_and_empty_splits(lab, world_size):
    inputs, matrix = _a2a_inputs(world_size), SPLITS[world_size]
    for rank, result in enumerate(_results(lab, world_size)):
        for name, tensors in inputs.items():
            # expected, from the inputs: rows matrix[j][rank] of rank j's block for this rank
            pieces = []
            for j in range(world_size):
                start = sum(matrix[j][:rank])
                pieces.append(tensors[j][start:start + matrix[j][rank]])
            expected = torch.cat(pieces)
            got = _part(result, rank, "a2a")[name]["got"]
            assert got.dtype == expected.dtype and tuple(got.shape) == tuple(expected.shape), \
                f"rank {rank}, {name}: got {got.dtype} {tuple(got.shape)}, expected {expected.dtype} {tuple(expected.shape)}"
            assert torch.equal(got, expected), f"rank {rank}, {name}: rows differ from the splits' transpose"
            assert torch.equal(result["a2a"][name]["single"], expected), "dist.all_to_all_single disagrees"


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_to_all_uses_point_to_point_only_and_sends_each_row_once(lab, world_size):
    inputs, matrix = _a2a_inputs(world_size), SPLITS[world_size]
    for rank, result in enumerate(_results(lab, world_size)):
        for name, tensors in inputs.items():
            entry = _part(result, rank, "a2a")[name]
            assert entry["collectives"] == [], f"rank {rank} called collectives {entry['collectives']}"
            off_rank = sum(matrix[rank]) - matrix[rank][rank]
            expected = off_rank * tensors[rank][0:1].numel() * tensors[rank].element_size()
            assert entry["bytes_sent"] == expected, \
                f"rank {rank}, {name}: sent {entry['bytes_sent']} bytes, its off-rank rows are {expected}"


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("mode", ["dropless", "capacity"])
def test_expert_parallel_outputs_and_input_grads_equal_the_single_process_moe(lab, world_size, mode):
    case = _case(world_size, with_skew=False)
    cf = None if mode == "dropless" else CAPACITY_FACTOR
    outputs, input_grads, _, _ = _reference(case["weights"], case["xs"], case["ups"], TOP_K, cf)
    for rank, result in enumerate(_results(lab, world_size)):
        got = _part(result, rank, "ep")[mode]
        d_out, d_grad = _diff(got["output"], outputs[rank].detach()), _diff(got["input_grad"], input_grads[rank])
        assert d_out < TOLERANCE, f"rank {rank}: output differs by {d_out:g}"
        assert d_grad < TOLERANCE, f"rank {rank}: input gradient differs by {d_grad:g}"


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("mode", ["dropless", "capacity"])
def test_expert_and_router_gradients_equal_the_single_process_moe(lab, world_size, mode):
    case = _case(world_size, with_skew=False)
    cf = None if mode == "dropless" else CAPACITY_FACTOR
    _, _, grads, _ = _reference(case["weights"], case["xs"], case["ups"], TOP_K, cf)
    results = [_part(r, rank, "ep")[mode] for rank, r in enumerate(_results(lab, world_size))]
    local = EXPERTS[world_size] // world_size
    for rank, got in enumerate(results):
        mine = slice(rank * local, (rank + 1) * local)
        for name in ("w1", "w2"):
            d = _diff(got[f"{name}_grad"], grads[name][mine])
            assert d < TOLERANCE, f"rank {rank}: {name} gradient of experts {mine.start}..{mine.stop - 1} differs by {d:g}"
    # the router is replicated: each rank's gradient covers its own tokens; they sum to the full one
    total = sum(got["router_grad"] for got in results)
    d = _diff(total, grads["router.weight"])
    assert d < TOLERANCE, f"sum over ranks of the router gradient differs by {d:g}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_holds_only_its_experts(lab, world_size):
    for rank, result in enumerate(_results(lab, world_size)):
        shape = _part(result, rank, "ep")["dropless"]["w1_shape"]
        assert shape == (EXPERTS[world_size] // world_size, FFN, HIDDEN), f"rank {rank}: w1 shard {shape}"
        error = _part(result, rank, "error")
        assert "experts" in error, f"from_full with {world_size + 1} experts: {error!r}"


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("mode", ["dropless", "capacity"])
def test_bytes_each_rank_sends_equal_its_routing_times_hidden(lab, world_size, mode):
    case = _case(world_size, with_skew=False)
    cf = None if mode == "dropless" else CAPACITY_FACTOR
    experts = EXPERTS[world_size]
    _, _, _, keeps = _reference(case["weights"], case["xs"], case["ups"], TOP_K, cf)
    sent = [_routing_counts(ids, keep, experts, world_size) for ids, keep in keeps]   # sent[i][j]
    row = HIDDEN * DTYPE.itemsize
    counts = (world_size - 1) * (experts // world_size) * COUNT_BYTES      # the per-expert counts, int64
    for rank, result in enumerate(_results(lab, world_size)):
        got = _part(result, rank, "ep")[mode]
        assert got["send_counts"] == sent[rank], f"rank {rank}: sent {got['send_counts']}, routing says {sent[rank]}"
        received = [sent[j][rank] for j in range(world_size)]
        assert got["recv_counts"] == received, f"rank {rank}: received {got['recv_counts']}, expected {received}"
        dispatch = (sum(sent[rank]) - sent[rank][rank]) * row              # rows this rank routes off-rank
        combine = (sum(received) - received[rank]) * row                   # rows it sends back
        assert got["forward_sent"] == counts + dispatch + combine, \
            f"rank {rank}: forward sent {got['forward_sent']} B, expected {counts} + {dispatch} + {combine}"
        assert got["backward_sent"] == dispatch + combine, \
            f"rank {rank}: backward sent {got['backward_sent']} B, expected {dispatch} + {combine}"
        assert got["collectives"] == [], f"rank {rank} called collectives {got['collectives']}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_capacity_in_the_layer_drops_what_the_rule_drops(lab, world_size):
    case = _case(world_size, with_skew=False)
    _, _, _, keeps = _reference(case["weights"], case["xs"], case["ups"], TOP_K, CAPACITY_FACTOR)
    dropped = [int((~keep).sum()) for _, keep in keeps]
    assert sum(dropped) > 0, "the test's capacity factor should drop something"
    for rank, result in enumerate(_results(lab, world_size)):
        ep = _part(result, rank, "ep")
        assert ep["capacity"]["dropped"] == dropped[rank], \
            f"rank {rank}: dropped {ep['capacity']['dropped']}, the rule drops {dropped[rank]}"
        assert ep["dropless"]["dropped"] == 0


@pytest.mark.points(3)
def test_a_skewed_router_loads_the_busiest_rank_and_its_time_as_predicted(lab):
    xs, routers = _skew_inputs()
    per_rank = SKEW["experts"] // 2
    expected = {}
    for name, weights in routers.items():
        counts = [[0, 0] for _ in range(2)]
        for src, x in enumerate(xs):
            ids, _ = _route(weights["router.weight"], x, 1)
            for e in ids.reshape(-1).tolist():
                counts[e // per_rank][src] += 1
        expected[name] = counts                                   # expected[name][dst][src]
    results = [{"skew": _part(r, rank, "skew")} for rank, r in enumerate(_results(lab, 2))]
    for rank, result in enumerate(results):
        for name in routers:
            assert result["skew"][name]["recv_counts"] == expected[name][rank], \
                f"rank {rank}, {name} router: received {result['skew'][name]['recv_counts']}, expected {expected[name][rank]}"
    busiest = {name: max(sum(c) for c in expected[name]) for name in routers}
    assert busiest["skewed"] == 2 * SKEW["tokens"], "the skewed router sends every token to rank 0"
    # Time model: t = t_fixed + per_copy * copies computed. t_fixed is what the idle rank of the skewed
    # run spends (it routes, sorts and exchanges, but computes no expert rows); per_copy comes from the
    # balanced run; the skewed run's busiest rank is then predicted, not fitted.
    cpu = {name: [r["skew"][name]["cpu"] for r in results] for name in routers}
    loads = {name: [sum(c) for c in expected[name]] for name in routers}
    t_fixed = cpu["skewed"][loads["skewed"].index(0)]
    hot = loads["balanced"].index(busiest["balanced"])
    per_copy = (cpu["balanced"][hot] - t_fixed) / busiest["balanced"]
    predicted = t_fixed + per_copy * busiest["skewed"]
    measured = max(cpu["skewed"])
    detail = (f"busiest rank's CPU time: balanced {cpu['balanced'][hot] * 1e3:.1f} ms for {busiest['balanced']} "
              f"copies, skewed {measured * 1e3:.1f} ms for {busiest['skewed']}; fixed part {t_fixed * 1e3:.1f} ms, "
              f"so {predicted * 1e3:.1f} ms predicted (ratio {measured / predicted:.2f})")
    assert measured > 1.3 * cpu["balanced"][hot], "the skewed router should slow the busiest rank: " + detail
    # CPU time of a few ms per run varies with caches and the other rank's work: within a factor of 2
    assert 0.5 < measured / predicted < 2.0, detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_layer_runs_on_each_backend(lab, backend):
    case = _case(2, with_skew=False)
    outputs, _, _, _ = _reference(case["weights"], case["xs"], case["ups"], TOP_K, None)
    for rank, result in enumerate(_results(lab, 2, backend)):
        d = _diff(_part(result, rank, "ep")["dropless"]["output"], outputs[rank].detach())
        assert d < 1e-9, f"rank {rank} on {backend}: output differs by {d:g}"
