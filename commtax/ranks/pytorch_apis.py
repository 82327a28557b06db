"""Lab 12's plan built with PyTorch's own parallel APIs on gloo ranks, its communication counted two ways.

Lab 12 builds DP x TP x PP by hand (``dist.new_group``, explicit all-reduces
and sends). This module builds the same kind of plan with the APIs a 2026
practitioner uses, on CPU ranks (gloo, torch 2.13), and checks that what they
send is the course's bill, axis by axis, for one training step:

* ``DeviceMesh`` (``init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))``): the groups,
  in Megatron's order (TP innermost: ranks d*tp + t);
* tensor parallelism with DTensor: ``parallelize_module`` with ``ColwiseParallel`` on each
  block's first Linear and ``RowwiseParallel`` on its second (Megatron's MLP), and the same with
  sequence parallelism (``ColwiseParallel(input_layouts=Shard(1))``,
  ``RowwiseParallel(output_layouts=Shard(1))``: the activations between blocks are split along
  the sequence; ``SequenceParallel`` is the style for the norms and dropouts that sit there, and
  Lab 12's blocks have none: the "tp_sp_norm" plan adds a pre-norm LayerNorm to each block for it);
* FSDP2, ``fully_shard`` on the mesh's "dp" dimension, one unit per block (ZeRO-3: parameters
  gathered for the forward and again for the backward, gradients reduce-scattered);
* ``torch.distributed.pipelining``: a ``PipelineStage`` per rank of a ("pp", "dp") mesh and
  ``Schedule1F1B``, with the data-parallel gradients all-reduced once per step;
* all of them at once, Lab 12's 2 x 2 x 2 on 8 ranks (:func:`pp_dp_tp_steps`, :func:`expected_3d`):
  a ("pp", "dp", "tp") mesh, DTensor TP inside each stage, FSDP2 on "dp", ``Schedule1F1B`` on "pp".

The model is Lab 12's (:mod:`commtax.ranks.wholebill`): residual MLP blocks
x + W2 gelu(W1 x + b1) + b2, float64, hidden h, 4h inside; its weights and
data come from ``wholebill.make_model`` / ``make_batch``, so the losses can be
checked against single-process training (``wholebill.reference_losses``).

**The bill's convention**: bytes each rank *sends* in one training step, ring
factors kept (CONTRIBUTING): an all-reduce of n bytes on g ranks sends
2(g-1)/g n, an all-gather (n: the full buffer after) or a reduce-scatter (n:
the full buffer before) (g-1)/g n, a send its n bytes; averaged over the ranks.
The expected numbers (:func:`expected_bill`) are computed from the sizes alone,
before any run, with :mod:`commtax.formulas.bill`:

* TP: ``bill.tp_bytes_per_layer(b, s, h, t) / 2`` per layer: the bill counts four all-reduces of
  the b s h activation per transformer layer (attention and MLP, forward and backward); these
  blocks are MLP-only, so two: one in the forward (after ``RowwiseParallel``), one in the
  backward (the gradient of ``ColwiseParallel``'s input). With sequence parallelism each
  all-reduce becomes a reduce-scatter and an all-gather of the same buffer: the same bytes, twice
  the calls.
* DP (FSDP2): ``bill.zero_bytes(N_rank, d, stage=3)``, 3(d-1)/d N_rank B, where N_rank is the
  parameters of one TP rank (W1, b1 and W2 split t ways, b2 replicated: 8h^2/t + 4h/t + h per
  block). Two all-gathers per block and one reduce-scatter.
* PP: ``bill.pp_bytes_per_microbatch(b, s, h)`` per micro-batch and boundary, (p-1)/p of it per
  rank on average (stage 0 sends activations, stage 1 their gradients); with DP beside it,
  ``bill.dp_allreduce_bytes`` of a stage's parameters.

**Two independent counts**, both inside the ranks:

* PyTorch's ``CommDebugMode`` (``torch.distributed.tensor.debug``), a dispatch mode: it counts the
  collective ops (``c10d_functional.*`` that DTensor issues, and the ``c10d.*`` ops that FSDP2's
  ``dist.all_gather_into_tensor`` / ``dist.reduce_scatter_tensor`` reach); it sees FSDP2's
  collectives, not only DTensor's. It does not name a collective's group, so its counts are
  put on an axis by who issued them: functional collectives are DTensor's (TP), the others FSDP2's
  (DP). Counts only, no bytes.
* The course's byte counter: :func:`commtax.ranks.traffic.record_traffic` wraps
  ``torch.distributed``'s calls (FSDP2's collectives, the pipeline's sends) and
  :func:`commtax.ranks.funcol_traffic.record_functional_collectives` the functional collectives
  DTensor calls instead (``record_traffic`` alone sees no TP traffic). Each call's bytes and its
  group's ranks put it on an axis.

What does not work on gloo/CPU with torch 2.13 (found here, 2026-12):

* ``CommDebugMode`` around a ``torch.distributed.pipelining`` schedule fails. In the first step,
  inside the schedule's shape inference: ``RuntimeError: A leaf node was passed to
  _will_engine_execute_node but we are currently running autograd.grad(). This is currently not
  supported.`` (CommDebugMode's module tracker registers multi-grad hooks, which
  ``autograd.grad`` on the stage's inputs does not allow); in a later step, in its forward
  hook: ``IndexError: list index out of range`` (``_comm_mode.py``, ``self.parent_list[-1]``: the
  stage's module is run outside any module its tracker entered). So the pipeline's sends are
  counted by the byte counter alone.
* A Python process group wrapping gloo, to count below every API (``dist.Backend.register_backend``
  with a ``dist.ProcessGroup`` subclass, given to ``init_device_mesh(backend_override=...)``):
  ``RuntimeError: ProcessGroup name not set`` in ``DeviceMesh._init_one_process_group``, with or
  without ``extended_api``. Not used.
* Everything else works on gloo: the 2-D mesh, DTensor TP with and without sequence parallelism
  (its all-gathers and reduce-scatters included), FSDP2 on the mesh's "dp" dimension of
  TP-sharded parameters, ``PipelineStage`` + ``Schedule1F1B`` over a mesh dimension's group.

What the counts show beside the bill (:func:`reconcile`):

* the first step of a pipeline sends more than the bill: the schedule's shape inference on its
  first ``step`` (3 tiny messages of tensor metadata per rank, 177 or 178 bytes here) and, with TP and
  FSDP2 in the stages, a real forward and backward to infer the gradients' metadata (2 more TP
  all-reduces and 1 more all-gather per rank in the 2 x 2 x 2); from the second step on every
  axis equals the bill exactly;
* FSDP2 inside a pipeline is not ZeRO-3 per micro-batch: the stage switches gradient
  synchronisation and resharding after backward off for all micro-batches but the last, and with
  ``reshard_after_forward=False`` (torchtitan's choice under PP) each block is gathered once and
  reduce-scattered once per step: ``bill.zero_bytes(N_rank, d, 1)``, 2(d-1)/d N_rank B;
* without an input that needs a gradient (the first layer of a model with no embedding before it,
  ``slip="input_no_grad"``), the first block's backward all-reduce is skipped: 2L - 1, not 2L;
* Colwise on both Linears (``slip="colwise_twice"``) trains the same losses but all-gathers the 4h
  activation: a correct model with another bill;
* ``fully_shard(reshard_after_forward=False)`` (``slip="fsdp_no_reshard"``) gathers once per block:
  2(d-1)/d N_rank, not ZeRO-3's 3(d-1)/d N_rank;
* a ``SequenceParallel`` LayerNorm's weight and bias gradients come out of the backward as
  ``Partial(sum)`` DTensors and are all-reduced over TP when the optimizer steps (2 all-reduces of h
  elements per norm; Megatron does the same for its norms under sequence parallelism): a few bytes
  the bill does not list, counted by both counters (the "tp_sp_norm" plan).

Entry points: :func:`run_plans` (the rank side, one job of 4 ranks under
:func:`commtax.ranks.launch.run_ranks`, about 12 s on 2 idle cores for the four plans and the three
slips), :func:`pp_dp_tp_steps` (8 ranks, about 15 s), :func:`expected_bill`, :func:`expected_3d`,
:func:`reconcile`, :func:`reconcile_slip`, :func:`reference_losses` and :func:`run_losses` (the
parent side), :data:`SIZES`. Measured (2 x 2, float64, L = 2, h = 16, b = 2, s = 8, m = 4), bytes
sent per rank per step, both counters and the bill alike: TP 8,192 (4 all-reduces; with SP 4
all-gathers + 4 reduce-scatters; with SP norms 8,704: + 4 all-reduces), FSDP2 25,728 (4 all-gathers
+ 2 reduce-scatters), PP 8,192 (4 sends), DP beside PP 17,024 (1 all-reduce); 2 x 2 x 2: TP 16,384,
FSDP2 8,576, PP 8,192.

The run's sizes and model are in :mod:`commtax.ranks.api_model`, the bill in :mod:`commtax.ranks.api_bill`,
the counting in :mod:`commtax.ranks.api_counts`, the parent side in :mod:`commtax.ranks.api_reconcile`;
this module holds the rank side and names them all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from commtax.ranks import wholebill
from commtax.ranks.api_bill import expected_3d, expected_bill, params_per_tp_rank
from commtax.ranks.api_counts import course_op, debug_mode_calls, ledger, sent_bytes
from commtax.ranks.api_model import AXES, DTYPE_BYTES, PLANS, SIZES, SLIPS, Block, make_model
from commtax.ranks.api_reconcile import reconcile, reconcile_slip, reference_losses, run_losses

__all__ = [
    "AXES",
    "DTYPE_BYTES",
    "PLANS",
    "SIZES",
    "SLIPS",
    "Block",
    "average_gradients",
    "course_op",
    "debug_mode_calls",
    "dp_tp_steps",
    "expected_3d",
    "expected_bill",
    "ledger",
    "make_model",
    "params_per_tp_rank",
    "pp_dp_steps",
    "pp_dp_tp_steps",
    "reconcile",
    "reconcile_slip",
    "reference_losses",
    "run_losses",
    "run_plans",
    "sent_bytes",
]


# -- the rank side ---------------------------------------------------------------------------


def _tp_plan(sequence_parallel: bool, slip, norm: bool = False):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if sequence_parallel:
        plan = {"up": ColwiseParallel(input_layouts=Shard(1)), "down": RowwiseParallel(output_layouts=Shard(1))}
        return dict(plan, norm=SequenceParallel()) if norm else plan
    if slip == "colwise_twice":  # the second Linear split by columns too: gathers its input and its output
        return {"up": ColwiseParallel(), "down": ColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate())}
    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def dp_tp_steps(mesh, sizes: dict, sequence_parallel: bool = False, slip=None, norm: bool = False) -> dict:
    """FSDP2 x DTensor TP on a ("dp", "tp") mesh: ``sizes["steps"]`` SGD steps, each counted both ways.

    ``norm=True`` (with ``sequence_parallel``): pre-norm blocks, the norms in ``SequenceParallel``, and
    no FSDP2 (each DP replica trains alone: the run is there for TP's counts; FSDP2 is not given the
    norms' Partial gradients). Returns plain data: ``{"loss": [this rank's loss per step], "counted": [ledger per step],
    "debug_mode": [CommDebugMode's calls by axis per step]}``.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    from commtax.ranks.funcol_traffic import record_functional_collectives
    from commtax.ranks.traffic import record_traffic

    layers, hidden, b, seq = sizes["layers"], sizes["hidden"], sizes["micro_batch"], sizes["seq"]
    dp, tp = mesh["dp"].size(), mesh["tp"].size()
    d, t = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    model = make_model(layers, hidden, norm=norm)
    for block in model:
        parallelize_module(block, mesh["tp"], _tp_plan(sequence_parallel, slip, norm))
    if not norm:
        for block in model:
            fully_shard(block, mesh=mesh["dp"], reshard_after_forward=slip != "fsdp_no_reshard")
        fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=sizes["lr"])
    groups = {"dp": tuple(mesh["dp"].mesh.tolist()), "tp": tuple(mesh["tp"].mesh.tolist())}
    out = {"loss": [], "counted": [], "debug_mode": []}
    for step in range(sizes["steps"]):
        x, target = wholebill.make_batch(dp * b, seq, hidden, step)
        x, target = x[d * b : (d + 1) * b], target[d * b : (d + 1) * b]
        if sequence_parallel:  # each TP rank holds its 1/t of the sequence
            chunk = seq // tp
            x, target = x[:, t * chunk : (t + 1) * chunk], target[:, t * chunk : (t + 1) * chunk]
        x = x.clone().requires_grad_(slip != "input_no_grad")
        debug = CommDebugMode()
        with record_traffic() as traffic, record_functional_collectives() as functional, debug:
            loss = F.mse_loss(model(x), target)
            # sequence parallel: the loss of the whole sequence is the mean of the t shards' losses
            (loss / tp if sequence_parallel else loss).backward()
            optimizer.step()
            optimizer.zero_grad()
        out["loss"].append(loss.item())  # the mean over ranks is the global batch's loss
        out["counted"].append(ledger(traffic, functional, groups))
        out["debug_mode"].append(debug_mode_calls(debug.get_comm_counts()))
    return out


def average_gradients(parameters: list, dp_group, dp: int) -> None:
    """All-reduce the parameters' gradients over ``dp_group`` as one flat buffer and divide by ``dp``: the
    pipeline's data parallelism, as Lab 12's ``sync_gradients`` does it (the student release calls the
    learner's)."""
    import torch.distributed as dist

    # BEGIN GRADED lab-12 sync_gradients
    if dp == 1:
        return
    grads = [q.grad for q in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=dp_group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    # END GRADED: return learner.lab("12").sync_gradients([dict(enumerate(parameters))], dp_group, dp)


def pp_dp_steps(mesh, sizes: dict) -> dict:
    """A 2-stage ``Schedule1F1B`` on the mesh's "pp" dimension beside DP: ``sizes["steps"]`` SGD steps, counted.

    Each DP replica runs its own pipeline on ``microbatches`` micro-batches; after the schedule the
    stage's gradients are flattened and all-reduced (averaged) on the "dp" group, once per step
    (DDP's bill). Counted by the byte counter only: ``CommDebugMode`` fails inside the schedule
    (see the module's docstring). Returns ``{"loss": [...] (last stage; None elsewhere),
    "counted": [ledger per step]}``.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from commtax.ranks.funcol_traffic import record_functional_collectives
    from commtax.ranks.traffic import record_traffic

    layers, hidden, b, seq, m = (sizes[k] for k in ("layers", "hidden", "micro_batch", "seq", "microbatches"))
    pp, dp = mesh["pp"].size(), mesh["dp"].size()
    p, d = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    per_stage = layers // pp
    stage_module = nn.Sequential(*list(make_model(layers, hidden))[p * per_stage : (p + 1) * per_stage])
    stage = PipelineStage(stage_module, p, pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=F.mse_loss)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=sizes["lr"])
    dp_group = mesh["dp"].get_group()
    groups = {"dp": tuple(mesh["dp"].mesh.tolist()), "pp": tuple(mesh["pp"].mesh.tolist())}
    out = {"loss": [], "counted": []}
    for step in range(sizes["steps"]):
        x, target = wholebill.make_batch(dp * m * b, seq, hidden, step)
        x, target = x[d * m * b : (d + 1) * m * b], target[d * m * b : (d + 1) * m * b]
        losses = []
        with record_traffic() as traffic, record_functional_collectives() as functional:
            if p == 0:
                schedule.step(x)
            elif p == pp - 1:
                schedule.step(target=target, losses=losses)
            else:
                schedule.step()
            average_gradients(list(stage_module.parameters()), dp_group, dp)
            optimizer.step()
            optimizer.zero_grad()
        out["loss"].append(sum(float(v) for v in losses) / m if losses else None)
        out["counted"].append(ledger(traffic, functional, groups))
    return out


def run_plans(rank, world_size, sizes=None, plans=PLANS, slips=()) -> dict:
    """The rank side of one job on 4 gloo ranks (under :func:`commtax.ranks.launch.run_ranks`): every plan in turn.

    ``plans``: any of "dp_tp" (FSDP2 x TP on a 2 x 2 ("dp", "tp") mesh), "dp_tp_sp" (the same with
    sequence parallelism), "pp_dp" (2 pipeline stages x 2 DP replicas on a ("pp", "dp") mesh),
    "tp_sp_norm" (pre-norm blocks, ``SequenceParallel`` norms, TP only: counts, no training to check).
    ``slips``: any of :data:`SLIPS`, each run as the "dp_tp" plan with that departure, one step.
    Returns {plan: plain data, "slips": {slip: plain data}}.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if world_size != 4:
        raise ValueError(f"world_size must be 4 (2 x 2 meshes), got {world_size}")
    for slip in slips:
        if slip not in SLIPS:
            raise ValueError(f"slips: each must be one of {SLIPS}, got {slip!r}")
    torch.set_num_threads(1)
    sizes = dict(SIZES, **(sizes or {}))
    out = {}
    for plan in plans:
        if plan in ("dp_tp", "dp_tp_sp", "tp_sp_norm"):
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            out[plan] = dp_tp_steps(mesh, sizes, sequence_parallel=plan != "dp_tp", norm=plan == "tp_sp_norm")
        elif plan == "pp_dp":
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
            out[plan] = pp_dp_steps(mesh, sizes)
        else:
            raise ValueError(f"plans: unknown plan {plan!r}, expected some of {PLANS}")
    if slips:
        out["slips"] = {
            slip: dp_tp_steps(
                init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), dict(sizes, steps=1), slip=slip
            )
            for slip in slips
        }
    return out


def pp_dp_tp_steps(rank, world_size, sizes=None, input_grad: bool = True) -> dict:
    """Lab 12's 2 x 2 x 2 with every API at once on 8 gloo ranks: a ("pp", "dp", "tp") mesh, each stage's blocks
    in DTensor TP, FSDP2 on "dp", ``Schedule1F1B`` on "pp". Counted by the byte counter (``CommDebugMode``
    cannot run around a schedule).

    FSDP2 inside a pipeline: the stage turns gradient synchronisation and resharding after backward
    off for every micro-batch but the last, and the blocks keep their gathered parameters from the
    forward (``reshard_after_forward=False``, as torchtitan does under PP): one all-gather and one
    reduce-scatter per block per step, 2(d-1)/d N_rank B (ZeRO-1's bytes, not ZeRO-3's 3m passes).
    ``input_grad``: the pipeline's input needs a gradient (as behind an embedding), so stage 0's first
    block all-reduces in its backward too. Returns ``{"loss": [...] (last stage; None elsewhere),
    "counted": [ledger per step]}``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor.parallel import parallelize_module

    from commtax.ranks.funcol_traffic import record_functional_collectives
    from commtax.ranks.traffic import record_traffic

    if world_size != 8:
        raise ValueError(f"world_size must be 8 (a 2 x 2 x 2 mesh), got {world_size}")
    torch.set_num_threads(1)
    sizes = dict(SIZES, **(sizes or {}))
    layers, hidden, b, seq, m = (sizes[k] for k in ("layers", "hidden", "micro_batch", "seq", "microbatches"))
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    pp, dp = mesh["pp"].size(), mesh["dp"].size()
    p, d = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    per_stage = layers // pp
    stage_module = nn.Sequential(*list(make_model(layers, hidden))[p * per_stage : (p + 1) * per_stage])
    for block in stage_module:
        parallelize_module(block, mesh["tp"], _tp_plan(False, None))
        fully_shard(block, mesh=mesh["dp"], reshard_after_forward=False)
    fully_shard(stage_module, mesh=mesh["dp"], reshard_after_forward=False)
    stage = PipelineStage(stage_module, p, pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=F.mse_loss)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=sizes["lr"])
    groups = {axis: tuple(mesh[axis].mesh.tolist()) for axis in ("pp", "dp", "tp")}
    out = {"loss": [], "counted": []}
    for step in range(sizes["steps"]):
        x, target = wholebill.make_batch(dp * m * b, seq, hidden, step)
        x, target = x[d * m * b : (d + 1) * m * b], target[d * m * b : (d + 1) * m * b]
        losses = []
        with record_traffic() as traffic, record_functional_collectives() as functional:
            if p == 0:
                schedule.step(x.clone().requires_grad_(input_grad))
            else:
                schedule.step(target=target, losses=losses)
            optimizer.step()
            optimizer.zero_grad()
        out["loss"].append(sum(float(v) for v in losses) / m if losses else None)
        out["counted"].append(ledger(traffic, functional, groups))
    return out
