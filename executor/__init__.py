"""Live executor: runs the simulator's policies and arrival schedules against a real model.

:mod:`executor.live` drives :meth:`sim.core.ServingCore.step` with the wall clock, exactly as
:mod:`sim.engine` drives it with simulated time; :mod:`executor.run` builds and runs a
scenario live, :mod:`executor.compare` puts prediction and measurement side by side.
"""
