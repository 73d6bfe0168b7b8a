#!/usr/bin/env python3
"""Generate reference ("golden") data from llama.cpp for pagellm's tests.

What it makes, per model (smollm2-135m and qwen2.5-coder-0.5b by default):

  tests/golden/tokenize_<model>.json
      llama.cpp token ids for ~90 tricky strings (unicode, CJK, emoji with ZWJ
      sequences, whitespace runs, code, long numbers, contractions, special
      tokens, ...), each tokenized twice through `llama_tokenize` with
      add_special=False: once with parse_special=False and once with
      parse_special=True. Also records the vocabulary facts llama.cpp derives
      (BOS/EOS ids, add_bos, the end-of-generation id set) and llama.cpp's
      detokenization of each id list.

  tests/golden/generate_<model>.json
      For ~24 prompts, the first 32 greedily decoded tokens. Each prompt is
      tokenized with add_special=True (BOS only if the model metadata asks for
      it) and parse_special=True, evaluated with `Llama.eval`, then extended one
      token at a time with the argmax of the last row of logits. For every
      generated position we record the chosen id and the margin between the
      best and second-best log-probability, so a test can tell a real
      divergence from a near-tie. Generation does not stop at end-of-generation
      tokens (each step records `eog`), so every prompt has exactly 32 steps.

Each JSON file starts with a `header` naming this script, the
llama-cpp-python version, the llama.cpp commit, the model file's sha256 and the
date.

Reference implementation: llama-cpp-python 0.3.36 (which vendors llama.cpp),
used through its ctypes bindings against a plain cmake build of the vendored
llama.cpp, without pip-building the wheel.

Re-run (from the repository root):

    LLAMA_CPP_LIB_PATH=/tmp/dl/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \\
    PYTHONPATH=/tmp/dl/llama_cpp_python-0.3.36 \\
    python3 scripts/make_goldens.py --model-dir ~/.cache/pagellm/models

`LLAMA_CPP_LIB_PATH` is read by `llama_cpp/llama_cpp.py` and must be the
directory containing `libllama.so` (and the libggml*.so it links). The only
extra Python dependencies are numpy and diskcache (`pip install diskcache`).
A pip-installed `llama-cpp-python==0.3.36` works too; then neither environment
variable is needed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

SCRIPT = "scripts/make_goldens.py"
N_GENERATE = 32
DEFAULT_MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b"]

# Strings chosen to hit every branch of the pre-tokenizer regexes and the
# special-token partitioning. Several deliberately contain special-token text so
# the parse_special=False/True pair differs.
TOKENIZE_STRINGS: list[str] = [
    "",
    " ",
    "  ",
    "\n",
    "\t",
    "Hello world",
    " Hello world",
    "  Hello  world  ",
    "hello   world\n\n\nfoo",
    "The quick brown fox jumps over the lazy dog.",
    "don't I'll we're they've she'd it's you'm",
    "DON'T I'LL WE'RE THEY'VE SHE'D IT'S",
    "Don'T i'Ll 'S 'sup ''quoted''",
    "3.14159",
    "1234567890123456789",
    "The year 2024 had 366 days; 1,000,000 people and 42.5% growth.",
    "-12.5e+10 0x1F 0b1010 007",
    "¹²³ ½ ⅓ Ⅻ ٣٤٥ १२३",
    "café naïve résumé Zürich façade São Paulo",
    "e\u0301 vs \u00e9 (combining acute vs precomposed)",
    "Ångström ΑΒΓ αβγ ñ ß ø œ",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "ภาษาไทยไม่มีช่องว่าง",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "שלום עולם",
    "Γειά σου Κόσμε",
    "Mixed: English, 中文, русский, العربية, हिन्दी, 日本語 and emoji 🎉",
    "😀😃😄😁",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag",
    "❤️ 🇫🇷🇩🇪 👍🏿 ✔︎",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 𝟘𝟙𝟚",
    "a\u200bb\u200cc\u200dd\ufeffe",
    "non\u00a0breaking\u3000ideographic\u2009thin",
    "tab\tseparated\tvalues\t\t\tend",
    "line1\nline2\r\nline3\rline4",
    "\n\n\n",
    "   leading spaces",
    "trailing spaces   ",
    " \n \n  x",
    "a \n b",
    "foo\n\n  bar",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tprintln!(\"Hello, {}!\", name);\n}\n",
    "    indented four\n        indented eight",
    "if (a && b || !c) { x += 1; } else { x -= 1; }",
    "#include <stdio.h>\nint main(void) { return 0; }",
    "<div class=\"container\"><p>Text &amp; more</p></div>",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "https://example.com/path/to/page?query=1&lang=en#section",
    "Email me at john.doe+test@example.co.uk!",
    "C:\\Users\\name\\file.txt and /usr/local/bin",
    "x² + y² = z², ∑ᵢ aᵢ, ∫₀^∞ e^{-x} dx ≈ 1, π ≈ 3.14",
    "!!!??? ... --- *** ### @@@",
    "«quotes» „German“ ‘single’ “double” — en–dash …",
    "$100 €50 £20 ¥1000 ₹500",
    "Hello!!! How are you??? I'm fine...",
    "ALLCAPS and CamelCaseWords and snake_case_words",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ab" * 40,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Zero\x07bell\x1bescape\x7fdel",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "foo<|endoftext|>bar",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start|",
    "<|im_start|>|>",
    "<<|im_start|>>",
    "<|endoftext|><|endoftext|>",
    "<reponame>my/repo<file_sep>main.py",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<|file_sep|><|repo_name|><|fim_pad|>",
    "<s> </s> [INST] <<SYS>>",
    "I said \"hello\" and she said 'hi'.",
    "Les élèves ont étudié l'histoire de France à l'école.",
    "Die Größe der Straße überrascht Jürgen nicht.",
    "¿Dónde está la biblioteca? ¡Está allí!",
    "Việt Nam có nhiều đặc sản ngon.",
    "Türkçe çok güzel bir dil, İstanbul ve ılık.",
    "1.\tFirst item\n2.\tSecond item\n- bullet\n* star",
    "| col1 | col2 |\n|------|------|\n| a    | b    |",
    "```python\nprint('hi')\n```",
    "  \t  \n\t\t\n",
    "word\u2028next\u2029para\u0085nel",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
]

GENERATE_PROMPTS: list[str] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "# Python function to check if a number is prime\ndef is_prime(n):",
    "Here is a list of fruits:\n1.",
    "Q: What is the largest planet in the solar system?\nA:",
    "The three primary colors are",
    "La capitale de l'Allemagne est",
    "Der schnellste Weg nach Berlin ist",
    "El agua hierve a",
    "中国的首都是",
    "2 + 2 =",
    "The derivative of x^2 is",
    "import numpy as np\n\narr = np.array([1, 2, 3])\n",
    "SELECT name FROM",
    "<html>\n<head>\n<title>",
    "Photosynthesis is the process by which",
    "To make a cup of tea, first",
    "My favorite programming language is",
    "function add(a, b) {",
    "In 1969, Neil Armstrong",
    "The recipe calls for 3 eggs, 2 cups of flour, and",
    "<|im_start|>user\nWhat is the capital of Italy?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
]


def sha256_of(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def llama_cpp_commit(llama_cpp_module) -> str | None:
    # The vendored checkout sits next to the python package in a source tree.
    pkg_dir = pathlib.Path(llama_cpp_module.__file__).resolve().parent
    vendor = pkg_dir.parent / "vendor" / "llama.cpp"
    if not vendor.exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(vendor), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def header(llama_cpp_module, model_name: str, model_path: pathlib.Path, sha: str) -> dict:
    return {
        "generator": SCRIPT,
        "llama_cpp_python_version": llama_cpp_module.__version__,
        "llama_cpp_commit": llama_cpp_commit(llama_cpp_module),
        "model": model_name,
        "model_file": model_path.name,
        "model_sha256": sha,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def vocab_facts(llama_cpp_module, llm) -> dict:
    vocab = llama_cpp_module.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()
    eog = [i for i in range(n_vocab) if llama_cpp_module.llama_vocab_is_eog(vocab, i)]
    control = [i for i in range(n_vocab) if llama_cpp_module.llama_vocab_is_control(vocab, i)]

    def opt(tok: int) -> int | None:
        return None if tok < 0 else tok

    return {
        "n_vocab": n_vocab,
        "bos_id": opt(llama_cpp_module.llama_vocab_bos(vocab)),
        "eos_id": opt(llama_cpp_module.llama_vocab_eos(vocab)),
        "add_bos": bool(llama_cpp_module.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp_module.llama_vocab_get_add_eos(vocab)),
        "eog_ids": eog,
        "control_ids": control,
    }


def detok(llm, ids: list[int], special: bool) -> str | None:
    raw = llm.detokenize(ids, special=special)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def make_tokenize(llama_cpp_module, Llama, name: str, path: pathlib.Path, sha: str, out_dir: pathlib.Path) -> None:
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = []
    for text in TOKENIZE_STRINGS:
        data = text.encode("utf-8")
        plain = llm.tokenize(data, add_bos=False, special=False)
        special = llm.tokenize(data, add_bos=False, special=True)
        with_bos = llm.tokenize(data, add_bos=True, special=True)
        cases.append(
            {
                "text": text,
                "ids_plain": plain,
                "ids_special": special,
                "ids_special_add_special": with_bos,
                "detok_plain": detok(llm, plain, special=False),
                "detok_special_render": detok(llm, special, special=True),
            }
        )
    doc = {
        "header": header(llama_cpp_module, name, path, sha),
        "description": (
            "llama_tokenize(text, add_special, parse_special): ids_plain = (False, False), "
            "ids_special = (False, True), ids_special_add_special = (True, True). "
            "detok_plain = llama_detokenize(ids_plain, render special=False); "
            "detok_special_render = llama_detokenize(ids_special, render special=True)."
        ),
        "vocab": vocab_facts(llama_cpp_module, llm),
        "cases": cases,
    }
    write_json(out_dir / f"tokenize_{name}.json", doc)
    del llm


def make_generate(llama_cpp_module, Llama, name: str, path: pathlib.Path, sha: str, out_dir: pathlib.Path) -> None:
    llm = Llama(
        model_path=str(path),
        n_ctx=512,
        n_threads=2,
        logits_all=True,
        seed=0,
        verbose=False,
    )
    vocab = llama_cpp_module.llama_model_get_vocab(llm.model)
    results = []
    for prompt in GENERATE_PROMPTS:
        prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(prompt_ids)
        steps = []
        generated: list[int] = []
        for _ in range(N_GENERATE):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            # log-softmax; the margin is invariant to the normaliser but the
            # absolute log-probability is handy when reading the file.
            m = logits.max()
            logprobs = logits - (m + np.log(np.exp(logits - m).sum()))
            order = np.argsort(-logprobs, kind="stable")
            best, second = int(order[0]), int(order[1])
            # np.argmax picks the lowest index among exact ties, like a plain
            # greedy sampler; use it as the choice.
            chosen = int(np.argmax(logits))
            steps.append(
                {
                    "id": chosen,
                    "logprob": round(float(logprobs[chosen]), 6),
                    "second_id": second if chosen == best else best,
                    "margin": round(float(logprobs[best] - logprobs[second]), 6),
                    "eog": bool(llama_cpp_module.llama_vocab_is_eog(vocab, chosen)),
                }
            )
            generated.append(chosen)
            llm.eval([chosen])
        results.append(
            {
                "prompt": prompt,
                "prompt_ids": prompt_ids,
                "generated_ids": generated,
                "generated_text": llm.detokenize(generated, special=True).decode("utf-8", errors="replace"),
                "steps": steps,
            }
        )
        print(f"  {name}: {prompt[:40]!r} -> {results[-1]['generated_text'][:60]!r}", file=sys.stderr)
    doc = {
        "header": header(llama_cpp_module, name, path, sha),
        "description": (
            "Greedy decoding with llama.cpp: Llama(n_ctx=512, n_threads=2, logits_all=True, seed=0); "
            "prompt_ids = tokenize(prompt, add_bos=True (honours the model's add_bos), special=True); "
            "eval(prompt_ids) then repeatedly argmax(logits of last position) and eval([id]). "
            "margin = logprob(best) - logprob(second best) at that step; "
            "generation continues through end-of-generation tokens (eog marks them)."
        ),
        "n_generate": N_GENERATE,
        "prompts": results,
    }
    write_json(out_dir / f"generate_{name}.json", doc)
    del llm


def write_json(path: pathlib.Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    repo_root = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model-dir",
        default=os.path.expanduser("~/.cache/pagellm/models"),
        help="directory holding <model>.gguf files (default: the pagellm model registry)",
    )
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--out", default=str(repo_root / "tests" / "golden"))
    ap.add_argument("--skip-generate", action="store_true", help="only write tokenize_*.json")
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    out_dir = pathlib.Path(args.out)
    for name in args.models:
        path = pathlib.Path(args.model_dir).expanduser() / f"{name}.gguf"
        if not path.exists():
            sys.exit(f"model file not found: {path}")
        sha = sha256_of(path)
        make_tokenize(llama_cpp, Llama, name, path, sha, out_dir)
        if not args.skip_generate:
            make_generate(llama_cpp, Llama, name, path, sha, out_dir)


if __name__ == "__main__":
    main()
