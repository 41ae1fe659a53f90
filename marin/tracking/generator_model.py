"""The code MLflow keeps with the pyfunc model and runs to load it ("models from code", not a
pickle): marin's greedy JAX generator (marin.tracking.pyfunc)."""

from mlflow.models import set_model

from marin.tracking.pyfunc import Generator

set_model(Generator())
