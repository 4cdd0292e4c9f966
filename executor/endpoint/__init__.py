"""Measure third-party LLM servers behind an OpenAI-compatible endpoint.

* :mod:`executor.endpoint.servers`: vLLM's CPU build in its own virtual environment, a tiny
  random-weight model written locally, and a server started and stopped on a loopback port;
* :mod:`executor.endpoint.client`: the open-loop streaming client (one process, asyncio);
* :mod:`executor.endpoint.bench`: ``servelab bench``, the run directory ``live`` writes;
* :mod:`executor.endpoint.stub`: a small local server for tests and the overhead benchmark.

Request-level servers (KServe v2 / Open Inference Protocol, plain JSON):
:mod:`~executor.endpoint.request_client` (bodies and the non-streaming sender),
:mod:`~executor.endpoint.request_bench` (``bench --api kserve-v2|http-json``),
:mod:`~executor.endpoint.request_calibrate` (``calibrate --endpoint``),
:mod:`~executor.endpoint.stub_v2` (the stub's v2 routes), :mod:`~executor.endpoint.rayserve`
and ``ray_app.py`` (Ray Serve in its own environment).
"""
