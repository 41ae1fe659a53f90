"""The pipeline's entry points: one module per dvc.yaml stage (``python -m pipeline.<stage>``), each a
thin call into its stage's module (tests/test_shape.py)."""
