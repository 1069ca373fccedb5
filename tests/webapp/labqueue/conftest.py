# The real shard queue under a throw-away host namespace, and a data folder per test, as the experiment tests use.
from tests.webapp.experiments.conftest import data_dir, scheduler  # noqa: F401
