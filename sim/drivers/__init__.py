"""The simulator's clocks: the SimPy driver and ``sim.run`` for request-level scenarios, the
simulated LLM clock and ``sim.llm.run`` for LLM scenarios. Each only keeps time and calls the
serving core's ``step``.
"""
