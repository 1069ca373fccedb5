from tests.webapp.experiments.conftest import data_dir  # noqa: F401 -- the same autouse data directory
