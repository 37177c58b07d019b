"""Fixtures the compile-failure tests share: a small float32 RPT model, and a lenient decode (compile
failures fall back instead of raising) with the decode's buffers and dynamo's caches fresh around it."""

import pytest
import torch

from rpt.decode_forward.compile_guard import STRICT_ENV
from rpt.sampling.decode.buffers import release_decode_buffers
from tests.sampling.decode.test_decoder import rpt_model


@pytest.fixture(scope="module")
def model():
    return rpt_model(2).float()


@pytest.fixture
def lenient(monkeypatch, model):
    monkeypatch.setenv(STRICT_ENV, "0")
    release_decode_buffers(model)
    torch._dynamo.reset()
    yield
    release_decode_buffers(model)
