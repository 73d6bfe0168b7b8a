"""What vLLM's tests need to know about the pagellm installation under test.

vLLM's OpenAI-server tests name Hugging Face checkpoints ("Qwen/Qwen3-0.6B",
"openai-community/gpt2", ...). Machines that run this suite have no access to the
Hugging Face hub, so each name is served by a model from pagellm's registry and
keeps its original name through `--served-model-name`. The tokenizer the tests use
to check token ids is built from the same GGUF file that `pagellm serve` loads, with
the `tokenizers` package, so the tests compare pagellm against an independent
implementation of the very tokenizer it serves.

Configuration comes from the environment, set by scripts/vllm_openai_tests.py:
  PAGELLM_BIN            the pagellm binary under test
  PAGELLM_VLLM_WORKDIR   scratch directory (server logs, generated tokenizers)
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

# Hugging Face name used by a vLLM test -> pagellm registry model serving it.
# Small models only: the suite runs on CPU. Any instruct model with a chat template
# fits the tests that say "any model with a chat template should work here".
MODEL_MAP: dict[str, str] = {
    "Qwen/Qwen3-0.6B": "qwen2.5-coder-0.5b",
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-coder-0.5b",
    "Qwen/Qwen2-1.5B-Instruct": "qwen2.5-coder-0.5b",
    "HuggingFaceH4/zephyr-7b-beta": "smollm2-135m",
    "openai-community/gpt2": "smollm2-135m",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": "smollm2-135m",
}

# Local paths standing for a Hugging Face name (see download_weights_from_hf).
_ALIASES_FILE = "model_aliases.json"


def pagellm_bin() -> str:
    return os.environ.get("PAGELLM_BIN", "pagellm")


def workdir() -> Path:
    path = Path(os.environ.get("PAGELLM_VLLM_WORKDIR", "/tmp/pagellm-vllm-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def add_alias(path: str, hf_name: str) -> None:
    """Records that the local path `path` stands for the checkpoint `hf_name`."""
    file = workdir() / _ALIASES_FILE
    aliases = json.loads(file.read_text()) if file.exists() else {}
    aliases[path] = hf_name
    file.write_text(json.dumps(aliases, indent=1))


def hf_name_of(name: str) -> str:
    file = workdir() / _ALIASES_FILE
    aliases = json.loads(file.read_text()) if file.exists() else {}
    return aliases.get(name, name)


def pagellm_model(name: str) -> str:
    """The pagellm registry model that serves the checkpoint a test names."""
    hf_name = hf_name_of(name)
    try:
        return MODEL_MAP[hf_name]
    except KeyError:
        raise KeyError(
            f"no pagellm model stands for {hf_name!r}; add it to MODEL_MAP in {__file__}"
        ) from None


@functools.cache
def _registry_paths() -> dict[str, Path]:
    """Registry name -> GGUF path, from `pagellm models list`."""
    out = subprocess.run(
        [pagellm_bin(), "models", "list"], check=True, capture_output=True, text=True
    ).stdout
    paths = {}
    for line in out.splitlines()[1:]:
        # NAME  SIZE (e.g. "98 MB")  PRESENT  PATH  [(default)]
        fields = line.split()
        if "yes" in fields:
            path = fields[fields.index("yes") + 1]
            paths[fields[0]] = Path(path)
    return paths


def gguf_path(name: str) -> Path:
    model = pagellm_model(name)
    try:
        return _registry_paths()[model]
    except KeyError:
        raise FileNotFoundError(
            f"{model} is not downloaded; run `pagellm models pull {model}`"
        ) from None


def _gguf_fields(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {key: field.contents() for key, field in reader.fields.items()
              if key.startswith(("tokenizer.", "general.architecture"))}
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            # GGUF lists dimensions innermost first: (hidden, vocab).
            fields["vocab_size"] = int(tensor.shape[-1])
    return fields


# Pre-tokenizers of the BPE vocabularies in the registry, as in the models'
# tokenizer.json, keyed by GGUF's `tokenizer.ggml.pre`.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(kind: str):
    from tokenizers import Regex, pre_tokenizers

    if kind == "qwen2":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if kind == "smollm":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if kind in ("gpt-2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise NotImplementedError(f"GGUF pre-tokenizer {kind!r}")


@functools.cache
def tokenizer_dir(name: str) -> Path:
    """A Hugging Face tokenizer directory for the checkpoint a test names.

    Built from the GGUF's vocabulary, merges, special tokens and chat template, and
    written under the work directory at the checkpoint's own name, so that
    `AutoTokenizer.from_pretrained("Org/Name")` run from there finds it too.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    hf_name = hf_name_of(name)
    out = workdir() / "hf" / hf_name
    if (out / "tokenizer.json").exists():
        return out
    fields = _gguf_fields(gguf_path(hf_name))
    if fields.get("tokenizer.ggml.model") != "gpt2":
        raise NotImplementedError(f"GGUF tokenizer {fields.get('tokenizer.ggml.model')!r}")
    tokens = fields["tokenizer.ggml.tokens"]
    types = fields["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = _pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    # llama.cpp token types: 3 = control (special), 4 = user-defined (added, plain).
    tok.add_tokens([AddedToken(t, special=(ty == 3), normalized=False)
                    for t, ty in zip(tokens, types) if ty in (3, 4)])

    def special(key):
        idx = fields.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[idx] if idx is not None else None

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special("bos"),
        eos_token=special("eos"),
        unk_token=special("unknown"),
        pad_token=special("padding"),
        chat_template=fields.get("tokenizer.chat_template"),
        add_bos_token=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        clean_up_tokenization_spaces=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps({
        "model_type": fields.get("general.architecture"),
        "vocab_size": fields.get("vocab_size", len(tokens)),
    }))
    return out


def vocab_size(name: str) -> int:
    """Rows of the model's embedding matrix (vLLM's ModelConfig.get_vocab_size)."""
    return int(_gguf_fields(gguf_path(name))["vocab_size"])
