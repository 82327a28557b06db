"""What the predictor's tests share: the public runs as the predictor reads them, Llama-2 70B's preset and
Lab 11's folder (whose reference is held against the predictor)."""

from pathlib import Path

from commtax.formulas import predict as P

PUBLISHED = P.read_published(P.PUBLIC_RUNS)
LLAMA70 = P.MODELS["Llama-2 70B"]
LAB_11 = Path(__file__).resolve().parents[1] / "labs" / "lab-11-plan-a-cluster"
