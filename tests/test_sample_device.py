"""sample.py --device is checked before anything is loaded: a string torch does not read, a device
kind the sampler does not run on, or an accelerator this machine lacks is one line naming the flag."""

import pytest
import torch

import sample
from rpt.sampling.loading import check_device
from tests.inprocess_train import one_error_line

NO_GPU = not torch.cuda.is_available()


@pytest.mark.parametrize("device, message", [
    ("tpu9", "is not a device"), ("meta", "not a device the sampler runs on"), ("cuda:x", "is not a device"),
    pytest.param("cuda", "no cuda device visible", marks=pytest.mark.skipif(not NO_GPU, reason="a GPU is visible")),
    ("cuda:99", "cuda"),
])
def test_a_bad_device_is_one_line_before_loading(tmp_path, capsys, device, message):
    # the checkpoint does not exist: the device is refused first, so nothing was loaded
    code = sample.main(["--checkpoint", str(tmp_path / "absent"), "--prompt", "x", "--device", device])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"--device {device!r}" in line and message in line


def test_cpu_devices_pass():
    assert check_device("cpu") == "cpu" and check_device("cpu:0") == "cpu:0"
