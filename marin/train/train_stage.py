"""Stage train: a decoder-only transformer on the token shards, recorded step by step.

The XLA thread count and device count come from params.yaml (runtime) and are set
before jax starts: they decide the bits. An unfinished run of the same recipe is
resumed from its last complete checkpoint. With ``runtime.processes > 1`` this command
starts the worker processes itself on one machine, or is one of them on a cluster
(marin/train/distributed.py); process 0 alone records the run.
"""

from __future__ import annotations

from pathlib import Path

from marin.config import Params
from marin.train import distributed, runtime


def run_stage(root: Path, params: Params) -> bool:
    """The train stage; False in a process that must not mirror the run into MLflow."""
    refuse_too_little(root, params)  # before JAX starts: one line, no run
    topo = distributed.topology(params.runtime)
    if topo.launch:  # start the workers (all of them here, or this host's one); each runs this stage again
        from marin.train import launch

        launch.launch(root, topo)
        return False  # process 0 mirrored the run into MLflow
    runtime.configure(params.runtime)  # before jax initializes
    distributed.initialize(topo, params.runtime)
    from marin.train import loop

    loop.run(root, params, topo)
    distributed.shutdown(topo)
    return topo.primary



def refuse_too_little(root: Path, params: Params) -> None:
    """Too little data for the params is refused in one line before anything starts: a train split
    shorter than one batch of sequences (``batch_size`` windows of ``seq_len`` + 1 tokens, the
    stream holding the documents' tokens and one EOS each), or an empty validation split."""
    from marin import stages
    from marin.data import manifest
    from marin.errors import StageError

    path = root / stages.current().input("tokens") / "manifest.json"
    if not path.is_file():
        return  # the loop names the missing input
    splits = manifest.read(path, "tokenize")["splits"]
    train, val = splits["train"], splits["validation"]
    need = params.train.batch_size * params.model.seq_len + 1
    if train["tokens"] + train["docs"] < need:
        raise StageError(f"data/tokens: the train split has {train['tokens']:,} tokens in {train['docs']} document(s), "
                         f"fewer than one batch of sequences (train.batch_size {params.train.batch_size} x "
                         f"model.seq_len {params.model.seq_len} = {need - 1:,}); add data, or lower train.batch_size "
                         "or model.seq_len")
    if val["tokens"] == 0:
        raise StageError("data/tokens: the validation split has no tokens, so the validation loss and evaluate have "
                         "nothing to measure; add data or raise curate.split.validation_fraction")
