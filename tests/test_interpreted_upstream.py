"""Upstream's autotuned, device-guarded kernels under the interpreter without a GPU
(harness/interpreted_upstream.py): they run, on their first config, computing what they compute."""
import pytest
import torch
from triton.runtime.autotuner import Autotuner

from harness import interpreted_upstream
from tests.autotuned_kernels import doubled_with_width

pytestmark = pytest.mark.skipif(not interpreted_upstream.needed(), reason="the interpreter without a GPU only")


@pytest.fixture()
def restored(monkeypatch):
    """What `prepare` changes, put back after the test."""
    monkeypatch.setattr(Autotuner, "do_bench", Autotuner.__dict__["do_bench"])
    monkeypatch.setattr(torch.cpu, "device", getattr(torch.cpu, "device", None), raising=False)
    if getattr(torch.cpu, "device") is None:
        monkeypatch.delattr(torch.cpu, "device")


def test_an_autotuned_kernel_runs_its_first_config_untimed(restored):
    """Unprepared, the autotuner asks the GPU driver to time its eligible configs, and raises."""
    x, y, width = torch.arange(8.0), torch.zeros(8), torch.zeros(1, dtype=torch.int32)
    interpreted_upstream.prepare()
    doubled_with_width[(1,)](x, y, width, 8)
    assert width.item() == 4
    assert torch.equal(y, torch.cat([2 * x[:4], torch.zeros(4)]))


def test_a_device_guard_around_a_call_is_entered_on_the_cpu(restored):
    interpreted_upstream.prepare()
    with getattr(torch, "cpu").device(0):
        pass
