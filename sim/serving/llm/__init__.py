"""The LLM serving core: iteration-level schedulers (step plans), the paged KV cache, step
compositions and :class:`sim.serving.llm.core.LlmCore`, which both LLM drivers call.
"""
