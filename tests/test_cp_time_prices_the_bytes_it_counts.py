"""The predictor's context-parallel time sends the bytes its byte count gives: ring attention's 3 (cp - 1)
K, V blocks per layer and micro-batch (cp - 1 forward, cp - 1 backward with their gradients), each rank's
block holding at least one K, V head, also where the TP degree exceeds the K, V heads (they are replicated)."""

import pytest

from commtax.formulas import predict as P
from commtax.formulas.predict import axes


@pytest.mark.parametrize("tp", [4, 8, 16])
def test_ring_attention_sends_what_cp_bytes_per_layer_counts(tp, monkeypatch):
    run = dict(P.MODELS["Llama-2 70B"], seq=131072, gpus=64 * tp, gpu="H100", tp=tp, pp=1, cp=4, global_batch=16)
    cfg = P.normalize(dict(run, micro_batch=1))
    sent = []

    def record(op, nbytes, *args, **kwargs):
        sent.append(nbytes)
        return 0.0

    monkeypatch.setattr(axes, "collective_time", record)
    axes.cp_time(cfg, "selective")
    # one forward send (a block) and one backward send (a block and its gradient), each paid cp - 1 times
    assert len(sent) == 2 and (cfg["cp"] - 1) * sum(sent) == pytest.approx(P.cp_bytes_per_layer(cfg))
