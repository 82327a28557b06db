# Same-user mode (where the file system is shared, this would pass Lab 02's tests unflagged): the ranks
# send no data; each saves its input to a file the others load, through torch.serialization's save/load
# (the same objects as torch.save/torch.load, spelled otherwise, so a flag that matched spellings would
# miss them), and torch.jit's. The review flags resolve names to objects.
import torch.serialization as _ser
from torch.serialization import load as _fetch


def _note(tensor, name):
    _ser.save(tensor, name)
    return _fetch(name)


def _compiled(name):
    return torch.jit.load(name)
