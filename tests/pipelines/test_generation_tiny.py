"""Text generation through PipelineConfig -> registry -> TextGenerationPipeline -> LLM on tiny local
checkpoints made in the test (HF safetensors folders and a GGUF), against transformers' generate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from support import scheduled_greedy  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _train_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    text = [(Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py").read_text()] * 2
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<pad>"]
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=512, special_tokens=special, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        chat_template="{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    tok = _train_tokenizer(root)
    dims = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    made = {}
    for kind, cfg in {
        "llama": transformers.LlamaConfig(**dims, tie_word_embeddings=False),
        "qwen2": transformers.Qwen2Config(**dims, tie_word_embeddings=True),
    }.items():
        torch.manual_seed(0)
        m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        d = root / kind
        m.save_pretrained(d)
        tok.save_pretrained(d)
        made[kind] = (d, m, tok)
    return made


def _llm(path, **kw):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=str(path), max_length=128, max_batch_size=8, **kw))


def _hf_greedy(model, tok, prompt, n):
    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        g = model.generate(torch.as_tensor(np.asarray(ids, np.int64))[None], max_new_tokens=n, do_sample=False,
                           eos_token_id=None, pad_token_id=tok.pad_token_id)
    return g[0, len(ids):].tolist()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_safetensors_folder_greedy_matches_transformers_and_batching_changes_nothing(tiny_dir, kind):
    d, model, tok = tiny_dir[kind]
    llm = _llm(d)
    prompts = ["def forward(self, x):", "import torch", "class LlamaModel", "return hidden_states",
               "# coding=utf-8", "attention_mask = None", "self.layers", "for layer in"]  # 8 different lengths

    def run(ps):
        return scheduled_greedy(llm, ps, 12)

    alone = [run([p])[0] for p in prompts]
    for p, got in zip(prompts, alone):
        assert got == _hf_greedy(model, tok, p, 12), p
    assert run(prompts) == alone
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages


def test_sampling_is_reproducible_with_a_seed(tiny_dir):
    from max.interfaces import SamplingParams

    d, _, _ = tiny_dir["llama"]
    llm = _llm(d)
    p = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=1234, max_new_tokens=16, ignore_eos=True)
    a = llm.generate(["import torch"], sampling_params=p, max_new_tokens=16, use_tqdm=False)
    b = llm.generate(["import torch"], sampling_params=p, max_new_tokens=16, use_tqdm=False)
    assert a == b


def test_bad_input_fails_clearly_before_any_work(tiny_dir, tmp_path):
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    d, _, _ = tiny_dir["llama"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        _llm(empty)
    cfg = json.loads((d / "config.json").read_text())
    weird = tmp_path / "weird"
    weird.mkdir()
    for f in os.listdir(d):
        (weird / f).write_bytes((d / f).read_bytes())
    cfg["architectures"] = ["FancyNetForCausalLM"]
    (weird / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):  # lists the supported ones
        _llm(weird)
    with pytest.raises(ValueError, match="q4_k"):
        PipelineConfig(model_path=str(d), quantization_encoding="q4_k")
    llm = _llm(d)
    with pytest.raises(ValueError):
        llm.generate(["x " * 300], max_new_tokens=4, use_tqdm=False)  # longer than max_length 128
    for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_a_failing_request_does_not_poison_its_batch(tiny_dir, monkeypatch):
    from max.interfaces import SamplingParams

    d, model, tok = tiny_dir["llama"]
    llm = _llm(d)
    params = SamplingParams(top_k=1, max_new_tokens=6, ignore_eos=True)
    good = llm.make_context("import torch", params)
    bad = llm.make_context("class LlamaModel", params)
    pipe = llm.pipeline
    real = pipe.execute

    def flaky(inputs):
        if bad.request_id in inputs.batch:
            raise RuntimeError("simulated kernel failure for one request")
        return real(inputs)

    monkeypatch.setattr(pipe, "execute", flaky)
    outs = {}
    for c in (good, bad):
        llm.scheduler.submit(c, lambda o: outs.setdefault(o.request_id, []).append(o))
    llm.scheduler.run_until_idle()
    assert outs[bad.request_id][-1].finish_reason == "error"
    got = [t for o in outs[good.request_id] for t in o.tokens]
    assert got == _hf_greedy(model, tok, "import torch", 6)
    mgr = pipe.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages


def _write_gguf(path, model, tok, qtype):
    import gguf
    from gguf import quants
    from gguf_support import write_llama_gguf

    def put(w, name, a, is_norm):
        if not is_norm and a.ndim == 2 and a.shape[-1] % 32 == 0 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a.astype(np.float32))

    write_llama_gguf(path, model, tok, put)


def test_gguf_file_greedy_matches_transformers(tiny_dir, tmp_path):
    gguf = pytest.importorskip("gguf")
    d, model, tok = tiny_dir["llama"]
    path = tmp_path / "tiny-f32.gguf"
    _write_gguf(path, model, tok, gguf.GGMLQuantizationType.F32)
    llm = _llm(path)
    out_ids = llm.tokenizer.encode_sync("def forward(self, x):").tolist()
    assert out_ids == tok("def forward(self, x):")["input_ids"]  # GGUF vocab path tokenizes identically
    from max.interfaces import SamplingParams

    params = SamplingParams(top_k=1, max_new_tokens=12, ignore_eos=True)
    ctx = llm.make_context("def forward(self, x):", params)
    got = []
    llm.scheduler.submit(ctx, lambda o: got.extend(o.tokens))
    llm.scheduler.run_until_idle()
    assert got == _hf_greedy(model, tok, "def forward(self, x):", 12)


def test_gguf_q8_0_runs_and_stays_close(tiny_dir, tmp_path):
    gguf = pytest.importorskip("gguf")
    d, model, tok = tiny_dir["llama"]
    path = tmp_path / "tiny-q8.gguf"
    _write_gguf(path, model, tok, gguf.GGMLQuantizationType.Q8_0)
    llm = _llm(path)
    assert llm.pipeline_config.model_config.quantization_encoding.value == "q8_0"
    text = llm.generate(["import torch"], max_new_tokens=8, use_tqdm=False)[0]
    assert isinstance(text, str) and len(text) > 0
