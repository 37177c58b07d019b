"""The ``custom_generate/`` files every RPT checkpoint carries (copied by ``rpt.hf_generate.write_custom_generate``)."""
