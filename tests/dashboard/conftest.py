"""Dashboard tests: Streamlit's script runner leaves its page module installed as
``sys.modules["__main__"]`` (``script_runner.py``: "Install the fake module as the __main__
module") and never puts the real one back. A later test that spawns processes
(multiprocessing's spawn re-runs ``__main__``'s file in each child: dask's LocalCluster) then
re-ran the last page script in every worker and failed ("Nanny failed to start worker
process" after the Verify page). Each dashboard test gets the real ``__main__`` back.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_main_module() -> Iterator[None]:
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main
