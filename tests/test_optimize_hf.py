"""The `hf:PATH` policy with a tiny randomly initialised causal LM saved to disk by the test (no download):
it loads, generates k replies per round, and every reply is recorded with its prompt and token usage."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from kernelcraft.search.optimize import Options, optimize  # noqa: E402
from kernelcraft.search.policies import PolicyError, make_policy  # noqa: E402
from kernelcraft.search.rundb import RunDB  # noqa: E402


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-lm")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    tok.decoder = tokenizers.decoders.ByteLevel()
    corpus = ["```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, A, B):\n"
              "        return A[:, None] * B\n```\n", "Performance Analysis Algorithm Design Code Implementation speedup"]
    tok.train_from_iterator(corpus * 50, tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[UNK]", "<eos>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="[UNK]")
    fast.save_pretrained(path)
    cfg = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32768,
                                   eos_token_id=fast.eos_token_id, pad_token_id=fast.eos_token_id)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_hf_policy_generates_and_records(tiny_lm, tmp_path, cache_dir):
    opts = Options(policy=f"hf:{tiny_lm}", device="cpu", budget=2, k=2, confirm=0,
                   policy_options={"max_tokens": 24, "temperature": 1.0})
    res = optimize("tiny/level1/diag_matmul", tmp_path, opts)
    rows = RunDB(tmp_path).rows()
    assert res.candidates == 2 and len(rows) == 2
    for r in rows:  # random weights write no code: recorded as parse errors, reply and prompt kept
        assert r.status in ("parse_error", "compile_error", "runtime_error", "incorrect", "rejected")
        assert r.prompt and "torch.diag(A) @ B" in r.prompt and r.reply is not None
        assert r.usage["prompt_tokens"] > 100 and 0 < r.usage["completion_tokens"] <= 24
        assert r.policy == f"hf:{tiny_lm}"


def test_hf_policy_needs_a_directory(tmp_path):
    with pytest.raises(PolicyError, match="not a directory"):
        make_policy(f"hf:{tmp_path / 'missing'}")
