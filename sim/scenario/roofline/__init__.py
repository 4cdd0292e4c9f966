"""The roofline LLM step model: model shapes, device sheets, coefficients, fitting."""
