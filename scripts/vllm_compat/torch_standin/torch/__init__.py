"""Stand-in for `torch`, put on the path only when torch is not installed.

Some vLLM test modules import torch at module level (and name dtypes in
`parametrize`) although the tests selected here never compute with it; a CPU
build of torch is far larger than the rest of the suite's needs. This module
offers the names needed to import those modules, `iinfo` for integer bounds
(test_long_seed), and raises on anything else. Tests that need real tensors
(prompt embeddings) are deselected.
"""

import numpy as _np


class dtype:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class layout(dtype):
    pass


float32 = dtype("float32")
float16 = dtype("float16")
bfloat16 = dtype("bfloat16")
int64 = long = dtype("int64")
int32 = dtype("int32")
strided = layout("strided")
sparse_coo = layout("sparse_coo")
sparse_csc = layout("sparse_csc")
sparse_csr = layout("sparse_csr")


def iinfo(t: dtype):
    return _np.iinfo(getattr(_np, t.name))


def __getattr__(name: str):
    raise AttributeError(
        f"torch.{name}: torch is not installed; this stand-in only supports importing "
        "the test modules (see scripts/vllm_compat/torch_standin/torch/__init__.py)"
    )
