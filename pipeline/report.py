"""Stage report: the transparency report of the trained model, from the ledger alone
(reports/<report.model_name>/), as a ledger run of stage ``report``; signed when the signing
key exists, else written unsigned and said so (see marin/report/build.py)."""

from pathlib import Path

from marin.config import Params
from marin.stage import stage_main


def report_stage(root: Path, params: Params) -> None:
    from marin.report import build

    print(build.report_line(build.publish(root, params), root))


if __name__ == "__main__":
    stage_main(report_stage)
