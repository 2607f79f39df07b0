"""Chat templates and stop tokens of model families through max serve's chat route: the family's own chat
format (Gemma's turns, Phi-3's role tags) renders the prompt, a stop token listed in the model's
generation_config (Gemma's <end_of_turn>-style second EOS) ends the reply, and a base model without a chat
template answers a chat request with a clear 400 instead of crashing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))

from family_support import DIMS, FAMILIES  # noqa: E402
from test_hf_utils import make_bpe_tokenizer  # noqa: E402

TEMPLATES = {
    "gemma3": ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
               "m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}"
               "<start_of_turn>model\n{% endif %}", ["<start_of_turn>", "<end_of_turn>"]),
    "phi3": ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>\n{% endif %}", ["<|user|>", "<|assistant|>", "<|end|>"]),
}


def _folder(tmp_path: Path, family: str, template: str | None, specials: list[str]) -> tuple[Path, list[int]]:
    """The family's tiny model with ``template``; its generation_config lists, besides the EOS token, the
    token transformers' greedy decoding emits first after the chat prompt (so a reply stops there)."""
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.chat_template = template
    cfg = FAMILIES[family][0]({**DIMS, "vocab_size": len(tok), "bos_token_id": tok.bos_token_id,
                               "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    d = tmp_path / family
    model.save_pretrained(d)
    tok.save_pretrained(d)
    stop: list[int] = []
    if template is not None:
        ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        with torch.no_grad():
            stop = [int(model(torch.tensor([ids])).logits[0, -1].argmax())]
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_token_id] + stop,
                                                          "bos_token_id": tok.bos_token_id}))
    return d, stop


def _serve(d: Path):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    return ServerThread(build_app(build_config(str(d), None, "cpu", 128, 4), served_model_name="m"))


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_family_chat_template_and_stop_token(tmp_path, family):
    template, specials = TEMPLATES[family]
    d, stop = _folder(tmp_path, family, template, specials)
    tok = transformers.AutoTokenizer.from_pretrained(d)
    n_prompt = len(tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False))
    with _serve(d) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
                                           temperature=0)
    assert r.usage.prompt_tokens == n_prompt  # the family's template rendered the prompt
    assert stop and r.choices[0].finish_reason == "stop" and r.usage.completion_tokens <= 1  # its stop token ended it


def test_base_model_without_chat_template_gets_a_clear_400(tmp_path):
    d, _ = _folder(tmp_path, "gemma3", None, [])
    with _serve(d) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert client.completions.create(model="m", prompt="import os", max_tokens=2).choices[0].text is not None
