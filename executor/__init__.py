"""Live executor: runs the simulator's policies and arrival schedules against a real model.

:mod:`executor.request_driver` drives :meth:`sim.serving.core.ServingCore.step` with the wall
clock, exactly as :mod:`sim.drivers.engine` drives it with simulated time;
:mod:`executor.live_requests` builds and runs a scenario live, :mod:`executor.compare` puts
prediction and measurement side by side. :mod:`executor.llm_driver` drives the LLM core the
same way on a real decoder, :mod:`executor.live_llm` builds and runs an LLM scenario live and
:mod:`executor.compare_llm` compares it with its prediction. Both comparisons run on one
skeleton, :mod:`executor.compare_loop` (argument checks, the probed repeat loop, the errors
table, ``compare.json``).
"""
