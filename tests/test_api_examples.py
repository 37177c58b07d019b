"""The public API's docstring examples run as written: each object below carries one ``>>>`` example
(a tiny random model or run, on the CPU, no network) and every line of it prints what the docstring says."""

import doctest
import importlib
import os

import pytest

# the public API, by the name a user imports it under
PUBLIC = [
    "rpt.sampling.generate",
    "rpt.sampling.SamplingConfig",
    "rpt.model.RPTForCausalLM",
    "rpt.model.RPTForCausalLM.from_base",
    "rpt.model.RPTForCausalLM.from_pretrained",
    "rpt.model.RPTForCausalLM.save_pretrained",
    "rpt.training.config.TrainConfig",
    "rpt.training.loop.run",
]


def public_object(name: str):
    """The object ``name`` names: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def the_example(name: str) -> doctest.DocTest:
    """``name``'s docstring example (its own docstring only, not its members')."""
    obj = public_object(name)
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, globs={})
    assert len(tests) == 1 and tests[0].examples, f"{name} has no >>> example in its docstring"
    assert (obj.__doc__ or "").count("Example:") == 1, f"{name}'s docstring should hold one Example: section"
    return tests[0]


@pytest.fixture(scope="module", autouse=True)
def deepspeed_imported():
    """DeepSpeed, where installed, prints a line on stdout when first imported (saving a model imports it):
    imported here, so that the line does not land in an example's output."""
    try:
        import deepspeed.accelerator  # noqa: F401
    except ImportError:
        pass


@pytest.fixture
def clean_process_state(monkeypatch):
    """No network, and the process-wide state a training run sets (accelerate's singletons, the
    environment variables it exports) reset afterwards, as for an in-process train.py."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    environ = dict(os.environ)
    yield
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
    os.environ.clear()
    os.environ.update(environ)


@pytest.mark.parametrize("name", PUBLIC)
def test_the_docstring_example_runs(name, clean_process_state):
    test = the_example(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = []
    runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
    assert result.attempted == len(test.examples) >= 3


def test_a_wrong_example_fails():
    """The runner above reports a line whose output differs (so a passing example is a checked one)."""
    test = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "wrong", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test, out=lambda _: None)
    assert runner.summarize(verbose=False).failed == 1
