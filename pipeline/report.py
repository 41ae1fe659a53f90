"""Stage report: the transparency report of the model (reports/<report.model_name>).
The stage's code is :mod:`marin.report.report_stage` (``dvc repro`` runs ``python -m pipeline.report``)."""

from marin.report import report_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(report_stage.run_stage)
