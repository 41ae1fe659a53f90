"""Stage report: the transparency report of the model (reports/<report.model_name>).
The stage's code is :mod:`marin.report.report_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("report")
