"""From scenario files to objects: the scenario schemas (request-level and LLM), the builtin
registry, workloads and token lengths, service-time models, and the builders that turn a
scenario into a serving core.
"""
