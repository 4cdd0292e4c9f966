"""Measure third-party LLM servers behind an OpenAI-compatible endpoint.

* :mod:`executor.endpoint.servers`: vLLM's CPU build in its own virtual environment, a tiny
  random-weight model written locally, and a server started and stopped on a loopback port;
* :mod:`executor.endpoint.client`: the open-loop streaming client (one process, asyncio);
* :mod:`executor.endpoint.bench`: ``servelab bench``, the run directory ``live`` writes;
* :mod:`executor.endpoint.stub`: a small local server for tests and the overhead benchmark.
"""
