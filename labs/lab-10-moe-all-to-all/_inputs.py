"""Lab 10's inputs: made in the test process from a secret seed, and what each rank is handed of them.

``test_lab.py`` reads as the spec; this file holds the layer's weights, each rank's tokens and output
gradients, the all-to-all tensors of every split case and the skew experiment's tokens and routers
(``_case``), and the share of a case each rank is handed through ``rank_args`` (``_rank_case``: the
weights, which are everyone's, and its own per-rank inputs only). Every per-rank tensor comes from a
stream of its own (``stream_seed``), so that no rank's values reveal another's. Only the test process
imports this file: ``SEED`` never reaches a rank.
"""

from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import input_seed, stream_seed

# the layer's configuration and the split cases, shared with the ranks (_workers.py, loaded by path)
load_module_from_file("lab_10_workers", str(Path(__file__).resolve().parent / "_workers.py"))
from lab_10_workers import (  # noqa: E402  (loaded just above)
    CYCLIC,
    DTYPE,
    FFN,
    HIDDEN,
    RECEIVE_EQUAL,
    SKEW,
    SPLITS,
    TOKENS,
)

SEED = input_seed(0)  # the tokens and output gradients: secret under the grader, never sent to a rank
EXPERTS = {2: 4, 4: 8}  # 2 experts per rank on both world sizes


def _layer_weights(world, seed=0, dtype=DTYPE, hidden=HIDDEN, ffn=FFN, experts=None):
    """The layer's weights from the public ``seed`` (everyone's: every rank is handed them): router.weight
    (experts, hidden), w1 (experts, ffn, hidden), w2 (experts, hidden, ffn)."""
    experts = experts or EXPERTS[world]
    gen = torch.Generator().manual_seed(seed)
    return {
        "router.weight": torch.randn(experts, hidden, generator=gen, dtype=dtype),
        "w1": torch.randn(experts, ffn, hidden, generator=gen, dtype=dtype) / hidden**0.5,
        "w2": torch.randn(experts, hidden, ffn, generator=gen, dtype=dtype) / ffn**0.5,
    }


def _stream(*labels):
    """A generator of its own for one rank's tensor (``stream_seed``): no rank's values reveal another's."""
    return torch.Generator().manual_seed(stream_seed(SEED, *labels))


def _tokens(world, seed=1, dtype=DTYPE, tokens=TOKENS, hidden=HIDDEN):
    """One (tokens, hidden) tensor per rank, each from its own stream of SEED (``seed`` names the set)."""
    return [torch.randn(tokens, hidden, generator=_stream("tokens", seed, rank), dtype=dtype) for rank in range(world)]


def _a2a_inputs(world):
    """Per split matrix: rank i's send tensor, distinct integer values from SEED: float64 rows of 3, int64
    scalars, and float32 rows of 2 x 3 (a row is everything past the first dimension: an all_to_all that
    sizes a row by the second dimension alone fails on these)."""
    matrix = SPLITS[world]
    rows = [
        torch.randint(-(10**6), 10**6, (sum(matrix[i]), 3), generator=_stream("a2a rows", world, i)).to(DTYPE)
        for i in range(world)
    ]
    ints = [
        torch.randint(-(10**9), 10**9, (sum(matrix[i]),), generator=_stream("a2a ints", world, i)) for i in range(world)
    ]
    blocks = [
        torch.randint(-(10**6), 10**6, (sum(matrix[i]), 2, 3), generator=_stream("a2a blocks", world, i)).to(
            torch.float32
        )
        for i in range(world)
    ]
    return {"rows": rows, "ints": ints, "blocks": blocks}


EQUAL_ROWS = 2  # rows each rank sends each peer in the equal-split case


def _equal_inputs(world):
    """Rank i's send tensor for equal splits: EQUAL_ROWS rows for each rank, integer values from SEED."""
    return [
        torch.randint(-(10**6), 10**6, (world * EQUAL_ROWS, 3), generator=_stream("equal", world, i)).to(DTYPE)
        for i in range(world)
    ]


def _receive_equal_inputs(world):
    """Rank i's send tensor for RECEIVE_EQUAL: RECEIVE_EQUAL[world][j] rows for rank j, integer values from SEED."""
    return [
        torch.randint(-(10**6), 10**6, (sum(RECEIVE_EQUAL[world]), 3), generator=_stream("receive equal", world, i)).to(
            DTYPE
        )
        for i in range(world)
    ]


def _cyclic_inputs():
    """Rank i's input rows of the CYCLIC all-to-all (6 each), integer values from SEED."""
    return [
        torch.randint(-(10**6), 10**6, (sum(CYCLIC[i]), 3), generator=_stream("cyclic", i)).to(DTYPE) for i in range(4)
    ]


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
    # Experts 0, 1 live on rank 0. The other features' logits are normal with a standard deviation of about
    # sqrt(hidden) = 8 per expert: a margin of 30 let a few of 1,024 tokens go to rank 1 for some secret seeds
    # (the grader's), failing correct code; 1,000 is over 80 standard deviations of their difference.
    skewed["router.weight"][:, 0] = torch.tensor([1000.0, 1000.0, 0.0, 0.0])
    return xs, {"balanced": balanced, "skewed": skewed}


def _case(world, with_skew):
    """Every input of one world size's job: the all-to-all tensors, the layer's weights, tokens and output
    gradients; on 4 ranks the cyclic all-to-all and the two 2-rank groups' layer; the skew experiment if asked."""
    weights, xs = _layer_weights(world), _tokens(world)
    ups = _tokens(world, seed=2)
    case = {
        "a2a": _a2a_inputs(world),
        "equal": _equal_inputs(world),
        "receive_equal": _receive_equal_inputs(world),
        "weights": weights,
        "xs": xs,
        "ups": ups,
    }
    if world == 4:
        case["cyclic"] = _cyclic_inputs()
    if with_skew:
        case["skew"] = _skew_inputs()
    if world == 4:
        case["subgroup"] = {"weights": _layer_weights(2), "xs": _tokens(2), "ups": _tokens(2, seed=2)}
    return case


def _only(items, rank):
    """``items`` (one per rank) with every other rank's entry replaced by None."""
    return [item if r == rank else None for r, item in enumerate(items)]


def _rank_case(case, rank):
    """What rank ``rank`` is handed of ``case``: the weights, and of the per-rank inputs its own only."""
    mine = dict(
        case,
        a2a={name: _only(tensors, rank) for name, tensors in case["a2a"].items()},
        equal=_only(case["equal"], rank),
        xs=_only(case["xs"], rank),
        ups=_only(case["ups"], rank),
        receive_equal=_only(case["receive_equal"], rank),
    )
    if "cyclic" in case:
        mine["cyclic"] = _only(case["cyclic"], rank)
    if "subgroup" in case:
        mine["subgroup"] = dict(
            case["subgroup"], xs=_only(case["subgroup"]["xs"], rank % 2), ups=_only(case["subgroup"]["ups"], rank % 2)
        )
    if "skew" in case:
        xs, routers = case["skew"]
        mine["skew"] = (_only(xs, rank), routers)
    return mine


# -- part 1's cases: pure functions, no ranks (public: nothing here depends on SEED) -----------------------

#: (expert_capacity's arguments: tokens, experts, top_k, capacity_factor; the slots; hints of a slip's ratio)
CAPACITY_CASES = (
    ((4096, 8, 2, 1.25), 1280, {}),  # 1.25 * 4096 * 2 / 8 exactly
    ((4096, 8, 2, 1.0), 1024, {}),
    ((10, 4, 1, 1.0), 3, {2 / 3: "2.5 rounded down: the capacity is the ceiling"}),
    (
        (100, 1, 1, 1.1),
        110,
        {111 / 110: "1.1 * 100 is 110.00000000000001 in binary: round the product to 9 decimals before the ceiling"},
    ),
    ((12, 8, 2, 0.75), 3, {2 / 3: "2.25 rounded down: the capacity is the ceiling"}),
    ((0, 8, 2, 1.25), 0, {}),
)

#: (expert_capacity's keyword arguments it must refuse, the argument its ValueError names)
BAD_CAPACITY = (
    (dict(tokens=16, experts=4, top_k=5, capacity_factor=1.0), "top_k"),
    (dict(tokens=-1, experts=4, top_k=1, capacity_factor=1.0), "tokens"),
    (dict(tokens=16, experts=0, top_k=1, capacity_factor=1.0), "experts"),
    (dict(tokens=16, experts=4, top_k=1, capacity_factor=0.0), "capacity_factor"),
    (dict(tokens=16, experts=4, top_k=1, capacity_factor=float("nan")), "capacity_factor"),
)

#: (dispatch_bytes_per_rank's positional and keyword arguments it must refuse, the argument its ValueError names)
BAD_DISPATCH = (
    ((10, 8, 0, 1), {}, "ep"),
    ((10, 8, 2, 3), {"experts": 2}, "top_k"),
    ((10, 8, 2, 0), {}, "top_k"),
    ((10, 0, 2, 1), {}, "hidden"),
    ((-5, 8, 2, 1), {}, "tokens_per_rank"),
    ((10, 8, 3, 1), {"experts": 8}, "experts"),
    ((10, 8, 2, 1), {"capacity_factor": -1.0}, "capacity_factor"),
    # experts left out with a capacity: it is ep = 1, fewer than top_k = 2
    ((100, 16, 1, 2), {"capacity_factor": 1.0}, "top_k"),
    ((100, 16, 1, 2), {"experts": 1}, "top_k"),
    # the bytes per element, which no other test checks
    ((10, 8, 2, 1), {"dtype_bytes": 0}, "dtype_bytes"),
    ((10, 8, 2, 1), {"dtype_bytes": -2}, "dtype_bytes"),
    ((10, 8, 2, 1), {"dtype_bytes": float("nan")}, "dtype_bytes"),
)

#: (tokens, experts, top_k, capacity) of the drawn routings apply_capacity is checked on
CAPACITY_DRAWS = ((12, 4, 2, 3), (40, 8, 2, 6), (30, 4, 1, 5), (16, 8, 4, 0), (9, 3, 3, 9))


def _drawn_routing(tokens, experts, top_k, generator):
    """[tokens, top_k] expert ids, distinct within each token (as top-k gives), drawn with ``generator``."""
    return torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)])
