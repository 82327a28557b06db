"""Lab 10's checks: what a mismatch says about its cause, for the tests in ``test_lab.py``.

``test_lab.py`` reads as the spec; this file holds the comparisons its tests share (``compare``, with
the least-squares ratio of a wrong tensor; ``fail_if``), the problem finders that return None or a
message naming the slip the numbers point to (the capacity rule's mask, an all-to-all's rows and
refusals, its backward, the layer's output, send_counts, the layer on a subgroup), the hints of a clean
ratio of bytes or slots, the causes of a gradient left None, and the note a size mismatch's abort gets.
Expected values come from ``_reference.py``.
"""

from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import SECTION_FAILED, SharedRunFailed, check, expect_close, fail, mismatch, subgroup_failure

HERE = Path(__file__).resolve().parent
load_module_from_file("lab_10_workers", str(HERE / "_workers.py"))
load_module_from_file("lab_10_reference", str(HERE / "_reference.py"))
from lab_10_reference import _expected_a2a, _keep_by_rule, _token_major  # noqa: E402  (loaded just above)
from lab_10_workers import CYCLIC  # noqa: E402

TOLERANCE = 1e-12


GRAD_CUTS = {  # a .grad left None after backward: where the graph was cut
    "router_grad": "router.weight.grad: no gradient reached the router. The routing weights (the softmax of the "
    "router's logits that scale each expert's output) must stay in the autograd graph: no .detach(), "
    ".item() or torch.no_grad() on them",
    "input_grad": "the input's .grad: the output was not computed from x through autograd (a tensor rebuilt from "
    "data, a .detach(), or an all-to-all without a backward?)",
    "w1_grad": "w1.grad: no gradient reached the experts' first weights (a .detach() or torch.no_grad() around them?)",
    "w2_grad": "w2.grad: no gradient reached the experts' second weights (a .detach() or torch.no_grad() around them?)",
}


def _missing_grads(got, rank, mode):
    """None if every gradient of the backward part exists; else which one stayed None and what that means."""
    missing = [text for name, text in GRAD_CUTS.items() if got.get(name) is None]
    return f"rank {rank}, {mode}: after backward, {'; and '.join(missing)}" if missing else None


ORDER_HINT = (
    "; every rank received the right number of rows from each rank, so the exchange is right and the "
    "experts' work is not: the rows arrive grouped by source rank (and by expert within each source). "
    "Regroup them by local expert before the experts run, and put each result back in the received "
    "order before the combine (a wrong expert for some rows, or results combined in the wrong order?)"
)
ABORT_HINT = (
    "hint (Lab 10): when a message and the receive buffer posted for it differ in size, gloo aborts the "
    "rank (SIGABRT; its peer then reads 'Connection reset by peer') or leaves it waiting in all_to_all's "
    "wait() while its peer moves on. A rank's irecv from rank j must be recv_splits[j] rows (what rank "
    "j's send_splits sends it), at the offset sum(recv_splits[:j]): check each irecv against its peer's send"
)
ABORT_SIGNS = ("SIGABRT", "Connection reset by peer", " in all_to_all: ")


def note_an_abort(exc):
    """Add ABORT_HINT to ``exc`` (a run's DistributedRunError) where gloo aborted or hung on a size mismatch.

    A size mismatch kills gloo's ranks with no word about sizes: say it. Not where the tests that share the
    run report it (``SharedRunFailed``: one line), nor where the runner already named the cause (a dropped
    request, or a hint: a blocking send, a tag ...).
    """
    first_report = not isinstance(exc, SharedRunFailed)  # the tests that share the run say so in one line
    dropped = any(getattr(f, "dropped", None) for f in getattr(exc, "failures", ()))  # the runner named it
    text = str(exc)
    diagnosed = "\nhint: " in text  # the runner named the cause (a blocking send, a tag...): this is not it
    aborted = any(sign in text for sign in ABORT_SIGNS[:2]) or (ABORT_SIGNS[2] in text and not diagnosed)
    if first_report and aborted and not dropped and ABORT_HINT not in getattr(exc, "__notes__", ()):
        exc.add_note(ABORT_HINT)


def _ratio(got, expected):
    """The scale that best maps expected onto got (least squares): 1 when right, 2 when doubled ..."""
    denominator = (expected.double() * expected.double()).sum().item()
    return (got.double() * expected.double()).sum().item() / denominator if denominator else float("nan")


def compare(got, expected, what, tolerance=TOLERANCE):
    """None if equal within ``tolerance``; else where, by how much, and the ratio got/expected."""
    why = mismatch(got, expected, rel=0.0, abs=tolerance)
    if why is None:
        return None
    if mismatch(got, torch.zeros_like(expected), abs=float("inf")) is None and expected.numel():
        ratio = _ratio(got, expected)
        why += f"; least-squares ratio got/expected {ratio:.4g}"
        if abs(ratio) < 1e-12:
            why += " (all zeros: did anything come back from the experts?)"
        elif abs(ratio - 2) < 1e-9:
            why += " (twice: each copy added twice?)"
    return f"{what}: {why}"


def fail_if(problem):
    """Fail the test with ``problem`` (a finder's message), if there is one."""
    __tracebackhide__ = True
    if problem:
        fail(problem)


CAPACITY_HINTS = {
    1 / 2: "half: top_k copies per token, multiply by top_k",
    0.8: "4/5 of it? the capacity factor multiplies the average load",
}


def _dispatch_hints(ep):
    """What a clean ratio (got / expected) of dispatch_bytes_per_rank on ``ep`` ranks suggests."""
    return {
        ep / (ep - 1) if ep > 1 else 0.5: "every copy counted: a copy for an expert on this rank stays local, "
        "so only (ep-1)/ep of them are sent",
        0.5: "half: each token sends top_k copies",
        2.0: "twice: one dispatch, not dispatch and combine",
        4.0: "four times: one dispatch, not Lab 04's whole layer",
    }


def _capacity_problem(got, ids, experts, capacity, what):
    """None if ``got`` keeps exactly what the rule keeps; else what is wrong and what it suggests."""
    expected = _keep_by_rule(ids, experts, capacity)
    why = mismatch(got, expected, rel=0.0)
    if why is None:
        return None
    if mismatch(got, expected.double(), abs=float("inf")) is None:  # a tensor of the right shape: which copies
        wrong = (got.bool() != expected).nonzero().tolist()
        if not wrong:  # the right copies in another dtype than bool
            return f"{what}: {why} - the right copies, as numbers: return the mask as a bool tensor (it indexes rows)"
        why = f"(token, choice) {wrong[:5]} wrong ({len(wrong)} of {expected.numel()})"
        if capacity is not None:
            kept = [int((ids[got.bool()] == e).sum()) for e in range(experts)]
            routed = [int((ids == e).sum()) for e in range(experts)]
            if all(k == min(r, capacity + 1) for k, r in zip(kept, routed)):
                why += f"; each expert kept up to capacity + 1 = {capacity + 1} copies: off by one"
            elif all(k == min(r, max(capacity - 1, 0)) for k, r in zip(kept, routed)):
                why += f"; each expert kept up to capacity - 1 = {capacity - 1} copies: off by one"
            elif mismatch(got, _token_major(ids, experts, capacity), rel=0.0) is None:
                why += (
                    "; these are the copies a token-by-token pass keeps: the rule admits every token's first "
                    "choice before any second choice"
                )
    return f"{what}: {why}"


def _a2a_problem(got, expected, own, what, own_block=None):
    """None if ``got`` is ``expected`` exactly (dtype included); else what differs and what it suggests."""
    why = mismatch(got, expected, rel=0.0)
    if why is None:
        return None if got.dtype == expected.dtype else f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.numel():
        own_rows = own_block if own_block is not None else slice(0, 0)
        others = torch.ones(expected.shape[0], dtype=torch.bool)
        others[own_rows] = False
        if torch.equal(got, own) if got.shape == own.shape else False:
            why += "; it is this rank's own send tensor: nothing was exchanged"
        elif torch.equal(got.reshape(-1).sort().values, expected.reshape(-1).sort().values):
            why += (
                "; the right rows in the wrong places: the rows from rank j go after those of ranks 0..j-1, "
                "at sum(recv_splits[:j])"
            )
        elif own_block is not None and torch.equal(got[others], expected[others]):
            why += (
                f"; only rows {own_rows.start}..{own_rows.stop - 1}, the block this rank sends itself, are wrong: "
                "copy it locally (no message to yourself)"
            )
    return f"{what}: {why}"


def _a2a_error_problem(result, matrix, rank, world_size):
    """None if all_to_all refused each set of splits that cannot fit and copied a group of one; else the first slip."""
    if not result["extra_row"].startswith("ValueError"):
        return (
            f"rank {rank}: all_to_all of a tensor one row longer than send_splits {matrix[rank]} sum to: "
            f"{result['extra_row']}; expected a ValueError (the docstring: ValueError if the splits do not fit)"
        )
    if not result["own_split"].startswith("ValueError"):
        return (
            f"rank {rank}: all_to_all whose recv_splits expect one row more from this rank itself than its "
            f"send_splits {matrix[rank]} send it: {result['own_split']}; expected a ValueError (the docstring: "
            "ValueError if the splits do not fit)"
        )
    if not result["long_recv"].startswith("ValueError"):
        return (
            f"rank {rank}: all_to_all with {world_size + 1} recv_splits on {world_size} ranks: "
            f"{result['long_recv']}; expected a ValueError (one entry per rank, in both lists)"
        )
    if result["solo"] != "equal":
        return (
            f"rank {rank}: all_to_all on a group of one rank (its own): {result['solo']}; expected a new tensor "
            "equal to send (the docstring: returns a new tensor; the caller may write into it)"
        )
    return None


def _none_split_problem(got, sent, counts, rank, world_size):
    """None if all_to_all_single(output, input, None, counts) left in output what rank ``rank`` receives when
    every rank sends it counts[rank] rows (``sent``: each rank's input); else what differs, or what it raised."""
    what = (
        f"rank {rank}: all_to_all_single(output of {world_size * counts[rank]} rows, input of {sum(counts)} "
        f"rows, None, input_split_sizes={counts})"
    )
    none_means = (
        f"output_split_sizes=None means the OUTPUT's {world_size * counts[rank]} rows in equal parts, "
        f"{counts[rank]} from each rank, whatever the input holds (not the input's rows / {world_size})"
    )
    if isinstance(got, tuple):
        return f"{what} raised {got[0]}: {got[1]} - {none_means}"
    problem = _a2a_problem(got, _expected_a2a(sent, [counts] * world_size, rank), sent[rank], what)
    return f"{problem} - {none_means}" if problem else None


def _a2a_backward_problem(grad, xs, rank):
    """None if the input's gradient after AllToAll on the CYCLIC splits is the input ``xs[rank]`` (each gradient
    row back at its origin); else what differs, naming the forward's split lists reused in the backward."""
    what = f"rank {rank}, splits {CYCLIC}: the input's gradient after AllToAll.apply(...).backward()"
    if grad is None:
        return (
            f"{what}: None: no gradient reached the input (AllToAll.backward must return the gradient of x "
            "first, then None for the splits and the group)"
        )
    problem = _a2a_problem(grad, xs[rank], xs[rank], what)
    if problem:
        forward = [_expected_a2a(xs, CYCLIC, r) for r in range(4)]  # the forward's outputs = the gradients
        if torch.equal(grad, _expected_a2a(forward, CYCLIC, rank)):
            problem += (
                "; these are the gradient rows sent the forward's way again: the backward reused the "
                "forward's split lists. Send each row back where it came from: all_to_all(grad, "
                "recv_splits, send_splits) (the two lists swapped)"
            )
    return problem


def _output_problem(got, output, sent, rank, mode, experts):
    """None if a rank's layer output is the reference ``output``; else what differs and, where it shows, why:
    its w1 holds other experts than its contiguous block, or the right rows arrived (``sent[i][j]``: copies
    rank i routes to rank j) and the experts' work is wrong."""
    world_size = len(sent)
    problem = compare(got["output"], output, f"rank {rank}, {mode}: the layer's output")
    local = experts // world_size
    mine = list(range(rank * local, (rank + 1) * local))
    if problem and got.get("w1_experts") not in (None, mine):
        problem += (
            f"; this rank's w1 holds the experts {got['w1_experts']} of the full layer, not its "
            f"contiguous block {mine}: from_full must give rank r the experts r * experts/ep onward"
        )
    elif problem and got.get("recv_counts") == [sent[j][rank] for j in range(world_size)]:
        problem += ORDER_HINT  # the right rows arrived: what goes wrong is which expert computes each
    return problem


def _send_counts_problem(got, sent, undropped, rank, mode, capped):
    """None if a rank's send_counts ``got`` are the routing's ``sent[rank]``; else what differs and the likely
    slip: the dropped copies counted (``undropped``: the counts before the capacity), or its own entry."""
    if capped and got == undropped[rank] != sent[rank]:
        return (
            f"rank {rank}, {mode}: send_counts {got} count every routed copy, the dropped ones "
            f"too; the routing after the capacity says {sent[rank]}: drop the copies apply_capacity rejects "
            "before the dispatch (they are neither sent nor computed)"
        )
    if got == sent[rank]:
        return None
    own_only = (
        isinstance(got, list)
        and len(got) == len(sent)
        and [c for j, c in enumerate(got) if j != rank] == [c for j, c in enumerate(sent[rank]) if j != rank]
    )
    return (
        f"rank {rank}, {mode}: send_counts {got}, the routing says {sent[rank]} (copies this rank routes to "
        "each rank)"
        + (
            f": only entry {rank}, this rank's own, differs: it counts the copies that stay local too"
            if own_only
            else ""
        )
    )


def _subgroup_output_problem(got, output, rank):
    """None if the output of rank ``rank``'s layer on its group of 2 is ``output``; else what it raised or how it
    differs, suggesting the default group."""
    group = [rank // 2 * 2, rank // 2 * 2 + 1]
    if isinstance(got, dict) and SECTION_FAILED in got:
        return (
            f"rank {rank} (group {group}): ExpertParallelMoE(group=...) raised "
            f"{subgroup_failure(got[SECTION_FAILED][0], group, world=4)}"
        )
    problem = compare(
        got["output"], output, f"rank {rank} (group [{rank // 2 * 2}, {rank // 2 * 2 + 1}]): the layer's output"
    )
    return problem + "; the all-to-all ran on the default group? pass group=self.group" if problem else None


def _subgroup_backward_problem(got, input_grad, rank):
    """None if the input's gradient after backward on rank ``rank``'s group of 2 is ``input_grad``; else why not:
    not run (and which earlier test says why), raised, None, or different (the default group suggested)."""
    group = [rank // 2 * 2, rank // 2 * 2 + 1]
    if got is None:
        return (
            f"rank {rank} (group {group}): the backward on the subgroup was not run: AllToAll's backward "
            "sends the gradient rows the wrong way (see test_all_to_all_backward_sends_each_gradient_row_back_"
            "where_it_came_from)"
        )
    if SECTION_FAILED in got and "not run: the forward raised" in str(got[SECTION_FAILED][0]):
        return (
            f"rank {rank} (group {group}): the backward on the subgroup was not run: the forward on it raised "
            "(see test_the_layer_on_a_subgroup_exchanges_only_within_its_group)"
        )
    if SECTION_FAILED in got:
        return (
            f"rank {rank} (group {group}): the layer's backward on its group raised "
            f"{subgroup_failure(got[SECTION_FAILED][0], group, world=4)}; the backward's all-to-all must run "
            "on the forward's group: keep it in ctx (ctx.group = group) and pass it on"
        )
    if got["input_grad"] is None:
        return f"rank {rank} (group {group}): after backward on the subgroup, " + GRAD_CUTS["input_grad"]
    problem = compare(
        got["input_grad"],
        input_grad,
        f"rank {rank} (group {group}): the gradient of the input after backward on the subgroup",
    )
    return (
        problem + "; AllToAll's backward ran on the default group? pass the forward's group (ctx.group)"
        if problem
        else None
    )


# -- part 1: the bill ------------------------------------------------------------------------------

DISPATCH_ARGS = ("tokens_per_rank", "hidden", "ep", "top_k", "dtype_bytes", "capacity_factor", "experts")


def expect_dispatch(lab, args, want, hints=None, **kwargs):
    """``lab.dispatch_bytes_per_rank(*args, **kwargs)`` is ``want`` bytes; the message names every argument."""
    __tracebackhide__ = True
    named = [f"{name}={value}" for name, value in zip(DISPATCH_ARGS, args)]
    named += [f"{name}={value}" for name, value in kwargs.items()]
    got = lab.dispatch_bytes_per_rank(*args, **kwargs)
    expect_close(got, want, what=f"dispatch_bytes_per_rank({', '.join(named)})", hints=hints)


def expect_capacity(lab, ids, experts, capacity, what, given=None):
    """``lab.apply_capacity(given or ids, experts, capacity)`` keeps exactly what the rule keeps of ``ids``.

    ``given``: the same ids in another integer dtype; a RuntimeError on them (F.one_hot and scatter take int64
    only) fails naming the conversion."""
    __tracebackhide__ = True
    try:
        kept = lab.apply_capacity(ids if given is None else given, experts, capacity)
    except RuntimeError as exc:
        if given is None:
            raise
        fail(
            f"apply_capacity of {given.dtype} expert ids raised RuntimeError: {exc}: ids may be any integer dtype "
            "(F.one_hot and scatter want int64: convert with .long())"
        )
    fail_if(_capacity_problem(kept, ids, experts, capacity, what))


# -- part 2: on real ranks -------------------------------------------------------------------------


def expect_point_to_point_traffic(entry, tensors, matrix, rank, name):
    """One all-to-all's record on ``rank`` (``entry``): no collective, each off-rank row sent once, no empty message."""
    __tracebackhide__ = True
    why = f"rank {rank} called collectives {entry['collectives']}: build the all-to-all from dist.isend / dist.irecv"
    check(entry["collectives"] == [], why)
    off_rank = sum(matrix[rank]) - matrix[rank][rank]
    row = tensors[rank][0:1].numel() * tensors[rank].element_size()
    hints = {}
    if off_rank and matrix[rank][rank]:
        hints = {sum(matrix[rank]) / off_rank: "its rows to itself were sent too: copy them locally"}
    what = f"rank {rank}, {name}: bytes sent (its off-rank rows, {off_rank} x {row} B)"
    expect_close(entry["bytes_sent"], off_rank * row, rel=0.0, hints=hints, what=what)
    check(
        entry["empty_messages"] == 0,
        f"rank {rank}, {name}: {entry['empty_messages']} sends or receives "
        f"of 0 rows (splits {matrix}): an empty split sends nothing (the docstring), and each message "
        "costs a latency: skip it",
    )


def _single_refusal_problem(result, rank, world_size):
    """None if all_to_all_single refused both impossible calls with a ValueError naming the split sizes."""
    error = result["error"]
    if not (error is not None and error[0] == "ValueError" and "split_sizes" in error[1]):
        return (
            f"rank {rank}: all_to_all_single on {world_size + 1} rows with no splits (they cannot be equal) "
            f"raised {error}; expected a ValueError naming input_split_sizes or output_split_sizes"
        )
    error = result["rows_error"]
    if not (error is not None and error[0] == "ValueError" and "output_split_sizes" in error[1]):
        return (
            f"rank {rank}: all_to_all_single into an output one row longer than sum(output_split_sizes) raised "
            f"{error}; expected a ValueError naming output_split_sizes (the docstring: output must have "
            "sum(output_split_sizes) rows)"
        )
    return None


def _shard_problem(got, rank, shape):
    """None if ``rank``'s layer holds its own experts' weights (``shape``: experts / ep, ffn, hidden), copied."""
    if tuple(got["w1_shape"]) != shape:
        return f"rank {rank}: w1 shard {got['w1_shape']}, expected {shape} (experts / ep, ffn, hidden)"
    if got["shares"]:
        return (
            f"rank {rank}: the layer's {', '.join(got['shares'])} share memory with the full "
            "MoE's: from_full must copy (.detach().clone()), or training the shard changes the model it came from"
        )
    mine = list(range(rank * shape[0], (rank + 1) * shape[0]))
    if got["w1_experts"] != mine:
        return (
            f"rank {rank}: its w1 holds the experts {got['w1_experts']} of the full "
            f"layer; expected {mine}: rank r holds the contiguous block r * experts/ep ... (r+1) * experts/ep - 1 "
            "(the numbering the router's expert ids, the split counts and the regrouping rely on)"
        )
    return None


def _count_types_problem(got, rank, mode):
    """None if send_counts, recv_counts and dropped came back as a list, a list and an int."""
    if got["count_types"] == ["list", "list", "int"]:
        return None
    return (
        f"rank {rank}, {mode}: send_counts, recv_counts and "
        f"dropped are {', '.join(got['count_types'])}; the docstring says lists of ints and an int (.tolist(), "
        "int(...)): plain numbers a caller can print, compare and send as they are"
    )


def _dropped_hints(dropped, tokens_hit):
    """Hints for a count of dropped copies: ``tokens_hit`` tokens lost at least one of the ``dropped`` copies."""
    if not dropped or tokens_hit == dropped:
        return None
    return {
        tokens_hit / dropped: f"{tokens_hit} is the tokens that lost a copy: count the "
        "copies (a token routed to top_k experts can lose more than one)"
    }
