"""sample.py --device is checked before anything is loaded: a string torch does not read, a device
kind the sampler does not run on, or an accelerator this machine lacks is one line naming the flag."""

import pytest
import torch

import sample
from rpt.cli.devices import check_device
from rpt.cli.sample import read_prompts
from tests.helpers.inprocess_train import one_error_line

NO_GPU = not torch.cuda.is_available()


@pytest.mark.parametrize("device, message", [
    ("tpu9", "is not a device"), ("meta", "not a device to run a model on"), ("cuda:x", "is not a device"),
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


@pytest.mark.parametrize("kind, message", [
    ("not UTF-8", "p.jsonl line 2: not UTF-8 text (byte 13 of the line)"),
    ("a directory", "is a directory; give a JSON Lines file"),
    ("empty", "holds no prompts"),
    ("prompt a number", "line 1: 'prompt' must be present and a string"),
])
def test_a_bad_prompts_file_is_one_line_naming_it_before_loading(tmp_path, capsys, kind, message):
    path = tmp_path / "p.jsonl"
    if kind == "a directory":
        path.mkdir()
    else:
        path.write_bytes({"not UTF-8": b'{"prompt": "a"}\n{"prompt": "\xff"}\n', "empty": b"\n",
                          "prompt a number": b'{"prompt": 7}\n'}[kind])
    code = sample.main(["--checkpoint", str(tmp_path / "absent"), "--prompts", str(path), "--device", "cpu"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and message in line and str(path) in line


@pytest.mark.parametrize("flags, message", [
    (["--lz-penalty", "0.1", "--lz-window", "1000000000000"], "lz_window=1000000000000 is invalid: use an integer in "
                                                              "[1, 65536]"),
    (["--lz-penalty", "0.1", "--lz-buffer", "4096"], "lz_buffer=4096 is invalid"),
    (["--temperature", "nan"], "temperature=nan is invalid"),
    (["--batch-size", "0"], "--batch-size 0 is invalid"),
])
def test_numeric_flags_out_of_range_are_one_line_before_loading(tmp_path, capsys, flags, message):
    """Before: --lz-window 10**12 was accepted and the decode died allocating an 8 TB table."""
    code = sample.main(["--checkpoint", str(tmp_path / "absent"), "--prompt", "x", "--device", "cpu", *flags])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and message in line


@pytest.mark.parametrize("line, prompts, benchmarks, logs", [
    (b'{"prompt": "\xff"}', "line 2: not UTF-8 text (byte 13 of the line); save the file as UTF-8",
     ":2: not UTF-8 text (byte 13 of the line); save the file as UTF-8", None),
    (b'{"prompt": ', "line 2: invalid JSON (Expecting value)", ":2: malformed JSON (Expecting value)",
     "not JSON: Expecting value"),
    (b"[1, 2]", "line 2: expected a JSON object with a 'prompt' field", ":2: expected a JSON object, got list",
     "a JSON list, not an object"),
])
def test_the_three_json_lines_readers_keep_their_words(tmp_path, line, prompts, benchmarks, logs):
    """sample.py's prompts, the benchmarks' JSONL and the run logs parse a line with one statement
    (``rpt.append_log.json_object_lines`` / ``json_object``); each says what it said before, with the file
    and line named."""
    from rpt.append_log import json_object
    from rpt.evaluation.user_jsonl import EvalInputError, read_jsonl

    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n' + line + b"\n\n")
    with pytest.raises(ValueError) as read:
        read_prompts(str(path))
    assert str(read.value) == f"{path} {prompts}"
    with pytest.raises(EvalInputError) as read:
        read_jsonl(path)
    assert str(read.value) == f"{path}{benchmarks}"
    if logs is not None:
        with pytest.raises(ValueError, match=f"^{logs}$".replace("[", r"\[")):
            json_object(line.decode())
