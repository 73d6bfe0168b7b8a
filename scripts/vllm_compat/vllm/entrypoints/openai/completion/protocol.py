from vllm import _unavailable

CompletionRequest = _unavailable("vllm...completion.protocol.CompletionRequest")
