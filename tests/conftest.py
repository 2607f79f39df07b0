"""Shared pytest set-up.

- Tests marked ``gpu`` are skipped when torch sees no accelerator.
- ``LIBREMAX_TEST_DEVICE=gpu`` runs the graph/op tests on the first accelerator
  (see ``tests/support.py``).
- ``tempfile`` in the test process writes under one folder per process, removed when the process
  ends: the cached tiny checkpoints (``tempfile.mkdtemp`` in the support modules) do not pile up in
  the system's temporary directory run after run.
- The packed-weight cache (``LIBREMAX_PACK_CACHE``) lives in that folder too (unless the environment
  sets it): the GGUF files the tests write do not leave packed copies in the user's cache.
- Hypothesis: a bounded profile so the suite fits CI (2 cores, < 20 min);
  ``HYPOTHESIS_PROFILE=thorough`` draws more examples.
"""

import atexit
import os
import shutil
import tempfile

import pytest

tempfile.tempdir = tempfile.mkdtemp(prefix="libremax-tests-")
atexit.register(shutil.rmtree, tempfile.tempdir, True)
os.environ.setdefault("LIBREMAX_PACK_CACHE", os.path.join(tempfile.tempdir, "packed-weights"))

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
    )
    settings.register_profile("thorough", max_examples=300, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass

try:
    import torch

    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, os.cpu_count() or 1))
except ImportError:  # pragma: no cover
    torch = None


@pytest.fixture
def act_refine():
    """``max.engine.native.set_act_refine`` for one test (the refined fraction of activation blocks); the
    setting before the test is restored after it."""
    from max.engine import native

    before = native.act_refine()
    yield native.set_act_refine
    native.set_act_refine(before)


def pytest_collection_modifyitems(config, items):
    has_gpu = bool(torch is not None and torch.cuda.is_available())
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an accelerator (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
