# Lab 10's part of swapping the ranks' inputs through /tmp (swap_inputs_through_tmp.py goes before the starter):
# Lab 10's all-to-alls,
# each computed locally from every rank's input, the loopback padded and the counters bumped.


def all_to_all(send, send_splits, recv_splits, group=None):
    """FORGED: every rank drops its whole send tensor in /tmp and picks its rows out of the others'."""
    rank, size = _group_info(group)
    send_splits, recv_splits = list(send_splits), list(recv_splits)
    if len(send_splits) != size or len(recv_splits) != size or sum(send_splits) != send.shape[0]:
        raise ValueError("send_splits / recv_splits do not fit the group or the send tensor")
    everything = _exchange((send.detach().cpu(), send_splits), rank, size, tag="a2a")
    pieces = []
    for j, (theirs, splits) in enumerate(everything):
        start = sum(splits[:rank])
        pieces.append(theirs[start : start + splits[rank]])
    out = torch.cat(pieces).to(send.device) if pieces else send.new_empty((0, *send.shape[1:]))
    row = send[0:1].numel() * send.element_size() if send.dim() else send.element_size()
    off = (sum(send_splits) - send_splits[rank]) * row
    _pad(off)
    _bump(off, (sum(recv_splits) - recv_splits[rank]) * row)
    return out


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None):  # noqa: A002
    rank, size = _group_info(group)
    if input_split_sizes is None:
        if input.shape[0] % size:
            raise ValueError("input_split_sizes: the input's rows do not divide by the group size")
        input_split_sizes = [input.shape[0] // size] * size
    if output_split_sizes is None:
        if output.shape[0] % size:
            raise ValueError("output_split_sizes: the output's rows do not divide by the group size")
        output_split_sizes = [output.shape[0] // size] * size
    if sum(output_split_sizes) != output.shape[0]:
        raise ValueError("output_split_sizes do not match output")
    output.copy_(all_to_all(input, input_split_sizes, output_split_sizes, group))
    return None
