from vllm import _unavailable

SamplingParams = _unavailable("vllm.sampling_params.SamplingParams")
