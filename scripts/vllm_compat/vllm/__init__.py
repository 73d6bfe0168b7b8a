"""The few `vllm` names that vLLM's OpenAI-server tests import, for running them
against `pagellm serve` without installing vLLM (which needs torch and a GPU).

Two kinds of names live here:
  * helpers the selected tests call (get_tokenizer, ModelConfig.get_vocab_size,
    get_open_port, ...), implemented for real on the model pagellm serves;
  * vLLM-internal classes imported at module level by test files whose tests of
    those classes are deselected (see scripts/vllm_openai_tests.py). They are
    `_unavailable` placeholders that raise if a test ever uses them.
Nothing here talks to the server: the server's answers are what the tests check.
"""

from vllm import version  # noqa: F401


def _unavailable(qualname: str):
    """A placeholder for a vLLM internal that only deselected tests use."""

    class Unavailable:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError(
                f"{qualname} is vLLM's own Python code, not part of the HTTP API "
                "under test; tests that use it are deselected"
            )

    Unavailable.__name__ = Unavailable.__qualname__ = qualname.rsplit(".", 1)[-1]
    return Unavailable
