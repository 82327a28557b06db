# ---- attack: forge the ranks' answers and byte counts, appended to Lab 02's shipped starter ----------
# The tests' worker functions run inside this module's rank processes. This suffix sends no message at
# all: every rank regenerates the other ranks' inputs from the seeds test_lab.py uses when nobody keeps
# them secret (manual_seed(1234 + rank), integers in [-50, 50); the all-gather's vector is "rank" 99),
# writes the answer in place, and adds to the byte counter of commtax.ranks.traffic (the Traffic object
# held in the closure of the wrapped dist.send) exactly what the tests expect a ring to send.
# With per-rank inputs from a secret seed and bytes counted by the kernel outside the ranks, it must
# score nothing.


def _attack_guess(rank, numel):
    generator = torch.Generator().manual_seed(1234 + rank)
    return torch.randint(-50, 50, (numel,), generator=generator).to(torch.float64)


def _attack_counter():
    for wrapped in (dist.send, dist.isend, dist.recv, dist.irecv):
        for cell in getattr(wrapped, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if type(value).__name__ == "Traffic":
                return value
    return None


def _attack_pretend(nbytes):
    counter = _attack_counter()
    if counter is not None:
        counter.bytes_sent += nbytes
        counter.bytes_received += nbytes
        counter.sends += 1
        counter.receives += 1


def _attack_chunks(numel, size):
    base, extra = divmod(numel, size)
    starts = [i * base + min(i, extra) for i in range(size + 1)]
    return list(zip(starts, starts[1:]))


def ring_reduce_scatter(tensor, group=None):
    flat = _check_tensor(tensor)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    owned = (rank + 1) % size
    start, stop = _attack_chunks(flat.numel(), size)[owned]
    total = sum(_attack_guess(r, flat.numel()) for r in range(size))
    flat[start:stop] = total[start:stop].to(flat.dtype)
    _attack_pretend((flat.numel() - (stop - start)) * flat.element_size())
    return owned


def ring_all_gather(tensor, owned_chunk, group=None):
    flat = _check_tensor(tensor)
    size = dist.get_world_size(group)
    if not isinstance(owned_chunk, int) or not 0 <= owned_chunk < size:
        raise ValueError(f"owned_chunk must be in 0..{size - 1}")
    flat.copy_(_attack_guess(99, flat.numel()).to(flat.dtype))
    start, stop = _attack_chunks(flat.numel(), size)[(owned_chunk + 1) % size]
    _attack_pretend((flat.numel() - (stop - start)) * flat.element_size())


def ring_all_reduce(tensor, group=None):
    flat = _check_tensor(tensor)
    size = dist.get_world_size(group)
    total = sum(_attack_guess(r, flat.numel()) for r in range(size))
    flat.copy_(total.to(flat.dtype))
    _attack_pretend(2 * (size - 1) * flat.numel() * flat.element_size() // size)
    return tensor
