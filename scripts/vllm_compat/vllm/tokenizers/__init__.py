import functools

import pagellm_compat


@functools.cache
def get_tokenizer(tokenizer_name: str, *args, **kwargs):
    """The Hugging Face tokenizer of the model that serves `tokenizer_name`, built
    from its GGUF file (pagellm_compat.tokenizer_dir)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(pagellm_compat.tokenizer_dir(tokenizer_name)))
