# Forged values, the boundary's side: the learner owns the worker process, so it can send the
# trusted side any plain data it likes, dressed as something else: a tensor of 10**12 elements
# with no bytes (a decoder that trusts the shape allocates 8 TB), an array whose shape hides its
# size (-1) or does not match its bytes, a plain tuple that looks like an encoded array, a record
# of an unknown kind. Every reply of every lab function is one of them.
import sys as _sys

_TAG = "\x00commtax-boundary"
_FORGED = [
    (_TAG, "tensor", "float64", (10**6, 10**6), b""),
    (_TAG, "ndarray", "<f8", (-1,), b"\x00" * 8),
    (_TAG, "ndarray", "<f8", (3,), b"\x00" * 8),
    (_TAG, "ndarray", "<f8", (0,), b""),
    (_TAG, "nonsense", 1),
    (_TAG, "tuple", [0.0]),
]
_sent = [0]


def _forge(value, depth=0):
    _sent[0] += 1
    return _FORGED[_sent[0] % len(_FORGED)]


for _name in ("__main__", "commtax.boundary.worker", "commtax.boundary.codec", "commtax.boundary"):
    _module = _sys.modules.get(_name)
    if _module is not None and hasattr(_module, "lower"):
        _module.lower = _forge
