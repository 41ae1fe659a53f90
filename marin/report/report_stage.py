"""Stage report: the transparency report of the trained model, from the ledger alone
(reports/<report.model_name>/), as a ledger run of stage ``report``; signed when the signing
key exists, else written unsigned and said so (see :mod:`marin.report.build`). ``marin report``
runs the same stage, under the same runtime (:func:`marin.stages.runner.execute`)."""

from __future__ import annotations

from pathlib import Path

from marin import stages
from marin.config import Params


def run_stage(root: Path, params: Params) -> bool:
    """The report of the running stage's input ``model`` (``marin report --model`` sets it), then the
    MLflow view, with one ledger index for both; False: the runtime has nothing left to mirror."""
    import sys

    from marin.ledger.index import Index  # here, not above: params are checked before the report's imports
    from marin.report import build, release
    from marin.report.placeholders import placeholders
    from marin.tracking import sync_quietly

    model = stages.current().input("model").as_posix()
    with Index.using(root, None, refresh=False) as idx:
        done = build.publish(root, params, model, index=idx)
        print(build.report_line(done, root))
        print(release.line(done.release, params.report.model_name if params.report else ""))
        for line in placeholders(build.meta_for(params.report, model)) if params.report else ():
            print(f"report: warning: params.yaml: {line} (`marin report verify --release` refuses it)", file=sys.stderr)
        sync_quietly(root, idx)  # the MLflow view, as after every stage
    return False
