import pagellm_compat


def download_weights_from_hf(model_name_or_path: str, cache_dir: str | None = None,
                             allow_patterns=None, **_ignored) -> str:
    """vLLM downloads a checkpoint to `cache_dir` and serves it from there. pagellm
    serves its registry copy of the model instead: the returned path is recorded as
    standing for `model_name_or_path`, for RemoteOpenAIServer and get_tokenizer."""
    path = cache_dir or model_name_or_path
    pagellm_compat.add_alias(path, model_name_or_path)
    return path
