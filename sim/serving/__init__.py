"""The clock-free serving core that every driver shares: admission, routing, queues, dispatch,
records, invariants, the fleet and its autoscalers, the request-level core
(:class:`sim.serving.core.ServingCore`), the batching policies and the LLM core with its
schedulers and KV cache (:mod:`sim.serving.llm`).

Nothing here reads a clock, imports simpy or imports torch: a driver (the SimPy engine, the
simulated LLM clock, the live executor) owns time and calls the core's ``step``. This folder
is the set the optional compiled build (``servelab compile``) covers.
"""
