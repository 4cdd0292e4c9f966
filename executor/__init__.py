"""Live executor: runs the simulator's policies and arrival schedules against a real model.

Not built yet (see the live-executor issue); it will drive :class:`sim.core.ServingCore`
with the wall clock, exactly as :mod:`sim.engine` drives it with simulated time.
"""
