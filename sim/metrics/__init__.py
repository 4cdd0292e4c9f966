"""Metrics, one definition each: the measurement window, the folds that summarise records,
summaries of request-level and LLM runs, the stability verdict, the summary-only sink and the
run directory both drivers write.
"""
