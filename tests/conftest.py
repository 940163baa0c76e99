"""Test set-up: the Triton interpreter without CUDA (set before any kernel is defined), and
every torch.empty-family allocation made inside fla_kernels filled with NaN, so output a kernel
forgot to write fails the test that reads it. Stored goldens go to a temporary folder."""
import os

import pytest

import fla_kernels  # noqa: F401
from harness.allocations import nan_filled_allocations


@pytest.fixture(autouse=True)
def poisoned_kernel_allocations():
    with nan_filled_allocations():
        yield


@pytest.fixture(autouse=True, scope="session")
def golden_cache_in_a_temporary_folder(tmp_path_factory):
    os.environ["HARNESS_GOLDEN_CACHE"] = str(tmp_path_factory.mktemp("goldens"))
    yield
