import pagellm_compat


class ModelConfig:
    """The part of vLLM's ModelConfig the tests use: the vocabulary size."""

    def __init__(self, model: str, **_ignored):
        self.model = model

    def get_vocab_size(self) -> int:
        return pagellm_compat.vocab_size(self.model)
