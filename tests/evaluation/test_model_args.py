"""lm-eval --model_args for the rpt model, parsed strictly: each value is its knob's type or one
error naming the key (rpt_iters=1.7 is not 1, ptp_greedy=ture is not False, batch_size=many is not 8)."""

import pytest

from rpt.evaluation.lm_eval_args import ModelArgsError, batch_size_of, dtype_of, max_length_of, sampling_knobs


@pytest.mark.parametrize("args, key", [
    ({"rpt_iters": 1.7}, "rpt_iters"), ({"rpt_iters": "two"}, "rpt_iters"), ({"rpt_iters": True}, "rpt_iters"),
    ({"ptp_greedy": "ture"}, "ptp_greedy"), ({"ptp_greedy": 1}, "ptp_greedy"), ({"token_healing": "yes"}, "token_healing"),
    ({"confidence": "high"}, "confidence"), ({"confidence": "nan"}, "confidence"), ({"temperature": "inf"}, "temperature"),
    ({"top_k": 2.5}, "top_k"), ({"seed": "x"}, "seed"), ({"eos_token_id": -1}, "eos_token_id"),
    ({"rpt_iterations": 1}, "rpt_iterations"),
])
def test_bad_sampling_values_name_the_key(args, key):
    with pytest.raises(ModelArgsError, match=key):
        sampling_knobs(args)


def test_good_values_keep_their_types():
    knobs = sampling_knobs({"rpt_iters": 2, "rpt_window": "3", "ptp_greedy": "False", "token_healing": True,
                            "confidence": 1, "temperature": "0.5", "stop": "a|b", "seed": "None", "eos_token_id": 0})
    assert knobs == {"rpt_iters": 2, "rpt_window": 3, "ptp_greedy": False, "token_healing": True, "confidence": 1.0,
                     "temperature": 0.5, "stop": ["a", "b"], "seed": None, "eos_token_id": 0}
    assert type(knobs["confidence"]) is float


@pytest.mark.parametrize("parse, value, ok", [
    (batch_size_of, 4, 4), (batch_size_of, "16", 16), (batch_size_of, "auto", 8), (batch_size_of, "many", None),
    (batch_size_of, 0, None), (batch_size_of, 2.5, None), (dtype_of, "bfloat16", "bfloat16"), (dtype_of, "float64", None),
    (max_length_of, None, None), (max_length_of, 512, 512), (max_length_of, -4, "error"), (max_length_of, "long", "error"),
])
def test_model_settings(parse, value, ok):
    if ok is None and parse is not max_length_of or ok == "error":
        with pytest.raises(ModelArgsError):
            parse(value)
    else:
        assert parse(value) == ok
