"""How far ``model`` travels from ``generate`` to the model call (``tests/helpers/decode_path_trace.py``): every path
of the decode (the per-row round, the batch-flat RPT step, the batch-flat NTP step) reaches the model in a
few calls, and no module is entered more than twice on the way (the driver and the flat paths do not
call each other back and forth)."""

from rpt.sampling.decode.generate import generate
from tests.helpers.decode_path_trace import ModelPath, Stop, tiny_decodes_path, trace_model_path
from tests.sampling.decode.test_decoder import prompts, rpt_model


def test_every_decode_path_reaches_the_model_in_few_calls_entering_no_module_thrice():
    path = tiny_decodes_path(carrying_only=False)
    ends = {chain[-2].function for chain in path.chains}  # the frame that calls the model queries
    assert {"ModelQueries._forward"} == ends, ends
    through = {stop.function for chain in path.chains for stop in chain}
    assert {"Decoder._round", "RPTPath.run", "NTPPath.run"} <= through, through  # all three paths ran
    assert max(path.entries().values()) <= 2, path.summary()
    assert len(path.longest()) <= 8, path.summary()
    assert len(path.stops) <= 11, path.summary()
    package = path.within("rpt.sampling.decode")  # generate, the driver's loop, a path's step, the block's call
    assert len(package.longest()) <= 4, package.summary()


def test_the_trace_counts_entries_per_chain_and_stops_only_to_the_model():
    """The measure itself: a module left and entered again counts twice; a model call outside ``generate``
    records nothing."""
    a, b = Stop("m.a", "f"), Stop("m.b", "g")
    path = ModelPath({(a, b, Stop("m.a", "h"), b, Stop("m.a", "f2"))})
    assert path.entries() == {"m.a": 3, "m.b": 2}
    assert len(path.stops) == 4 and path.modules == {"m.a", "m.b"}
    assert path.within("m").chains == path.chains and path.within("n").chains == {()}
    model = rpt_model(2)
    ids, _ = prompts(1)
    assert trace_model_path(lambda: model(ids), model, generate).chains == set()
