from vllm import _unavailable

ChatCompletionRequest = _unavailable("vllm...chat_completion.protocol.ChatCompletionRequest")
BatchChatCompletionRequest = _unavailable(
    "vllm...chat_completion.protocol.BatchChatCompletionRequest"
)
