"""``LLM``: the forms vLLM users write (``LLM("model.gguf")``, ``LLM(model=...)``), the caller's
``SamplingParams`` honoured by ``generate`` (its ``max_new_tokens`` is not overridden by the default),
and ``chat_template`` overriding the model's."""

from __future__ import annotations

import numpy as np
import pytest

from lm_support import make_tiny_llama, make_tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("llm_entry")))


@pytest.fixture(scope="module")
def llm(tiny):
    from max.entrypoints.llm import LLM

    return LLM(model=tiny, max_length=128, max_batch_size=4)


def _generated_counts(llm, monkeypatch, *args, **kw) -> list[int]:
    """How many tokens ``llm.generate(*args, **kw)`` generated per prompt (counted from the scheduler's
    outputs, not by re-tokenising the text)."""
    counts: dict[str, int] = {}
    submit = llm.scheduler.submit

    def counting_submit(ctx, cb, **skw):
        counts[ctx.request_id] = 0

        def wrapped(out):
            counts[out.request_id] += len(out.tokens)
            cb(out)
        return submit(ctx, wrapped, **skw)

    monkeypatch.setattr(llm.scheduler, "submit", counting_submit)
    llm.generate(*args, use_tqdm=False, **kw)
    monkeypatch.undo()
    return list(counts.values())


def test_generate_honours_sampling_params_max_new_tokens(llm, monkeypatch):
    from max.interfaces import SamplingParams

    sp8 = SamplingParams(top_k=1, max_new_tokens=8, ignore_eos=True)
    assert _generated_counts(llm, monkeypatch, ["hello there", "the cat"], sampling_params=sp8) == [8, 8]
    # an explicit max_new_tokens still wins over the params', and the default stays 100
    assert _generated_counts(llm, monkeypatch, "hello there", max_new_tokens=3, sampling_params=sp8) == [3]
    assert _generated_counts(llm, monkeypatch, "hello there",
                             sampling_params=SamplingParams(top_k=1, ignore_eos=True)) == [100]
    n_prompt = int(llm.make_context("hello there", sp8).prompt_len)
    assert _generated_counts(llm, monkeypatch, "hello there", max_new_tokens=None,  # up to max_length
                             sampling_params=SamplingParams(top_k=1, ignore_eos=True)) == [128 - n_prompt]
    # the caller's object is not modified
    sp = SamplingParams(top_k=1, max_new_tokens=5, ignore_eos=True)
    llm.generate("hello", max_new_tokens=2, sampling_params=sp, use_tqdm=False)
    assert sp.max_new_tokens == 5


def test_generate_rejects_wrong_sampling_params_type(llm):
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate("hello", sampling_params={"max_new_tokens": 8}, use_tqdm=False)


def test_llm_takes_a_path_positionally_and_as_model_keyword(tiny, llm):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    by_path = LLM(tiny, max_length=128, max_batch_size=4)
    by_config = LLM(PipelineConfig(model_path=tiny, max_length=128, max_batch_size=4))
    outs = [m.generate("the cat sat", max_new_tokens=6, use_tqdm=False) for m in (by_path, by_config, llm)]
    assert outs[0] == outs[1] == outs[2]
    assert by_path.pipeline_config.max_length == 128


def test_llm_argument_errors_are_clear(tiny):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    with pytest.raises(TypeError, match="missing the model"):
        LLM()
    with pytest.raises(TypeError, match="once"):
        LLM(tiny, model=tiny)
    with pytest.raises(TypeError, match="PipelineConfig or a model path"):
        LLM(42)
    with pytest.raises(TypeError, match="go into the PipelineConfig"):
        LLM(PipelineConfig(model_path=tiny, max_length=128), max_batch_size=2)
    with pytest.raises(FileNotFoundError):
        LLM("/nonexistent/model/folder")


def test_llm_loads_a_gguf_file_by_path(tmp_path):
    pytest.importorskip("gguf")
    import torch
    import transformers

    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "gguf_support", os.path.join(os.path.dirname(__file__), "..", "pipelines", "gguf_support.py"))
    support = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(support)
    write_llama_gguf = support.write_llama_gguf
    from max.entrypoints.llm import LLM

    tok = make_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id, tie_word_embeddings=False, initializer_range=0.2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, model, tok, lambda w, name, a, is_norm: w.add_tensor(name, a.astype(np.float32)))
    llm = LLM(str(path), max_length=64, max_batch_size=2)
    prompt = "the cat sat on"
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=5, do_sample=False, min_new_tokens=5)[0, ids.shape[1]:].tolist()
    from max.interfaces import SamplingParams

    got = llm.generate(prompt, use_tqdm=False, sampling_params=SamplingParams(top_k=1, max_new_tokens=5,
                                                                               ignore_eos=True))
    assert got[0] == tok.decode(ref)


def test_chat_template_file_overrides_the_models(tiny, tmp_path):
    from max.entrypoints.llm import LLM

    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[[{{ m['role'] }}]]{{ m['content'] }}{% endfor %}"
                   "{% if add_generation_prompt %}[[assistant]]{% endif %}")
    llm = LLM(tiny, max_length=128, max_batch_size=2, chat_template=str(tpl))
    from max.interfaces import SamplingParams

    ctx = llm.make_context("hi", SamplingParams(top_k=1, max_new_tokens=2), chat=True)
    text = llm.tokenizer.delegate.decode(ctx.tokens[:ctx.prompt_len] if hasattr(ctx, "prompt_len") else ctx.tokens)
    assert "[[user]]hi[[assistant]]" in text
