class VLLMValidationError(ValueError):
    """vLLM's request-validation error; raised by vLLM's Python classes only, so
    only tests of those classes (deselected) expect it."""
