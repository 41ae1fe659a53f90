"""Stage report: the signed transparency report of the trained model, from the ledger alone
(reports/<report.model_name>/; see marin/report/build.py)."""

from pathlib import Path

from marin.cli import stage_main
from marin.config import Params
from marin.errors import ParamsError


def report_stage(root: Path, params: Params) -> None:
    from marin.report import build

    if params.report is None:
        raise ParamsError("params.yaml: no report section; add one (see the shipped params.yaml)")
    out = build.write(root, params.report)
    print(f"report: wrote {out.relative_to(root)}/")


if __name__ == "__main__":
    stage_main(report_stage)
