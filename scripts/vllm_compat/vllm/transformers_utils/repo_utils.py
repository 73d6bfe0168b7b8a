"""LoRA adapters are fetched from the Hugging Face hub by session fixtures of
vLLM's conftest. pagellm serves no LoRA adapters and this suite has no hub access:
`snapshot_download` returns a path that does not exist, which only ever fills a
`--lora-modules` argument (dropped by RemoteOpenAIServer); every test that sends a
request to an adapter is deselected."""


class _NoHub:
    def snapshot_download(self, repo_id: str, **_ignored) -> str:
        return f"/nonexistent/lora-adapters/{repo_id}"


def hf_api() -> _NoHub:
    return _NoHub()
