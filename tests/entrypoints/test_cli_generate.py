"""``max generate``: it says when the output stopped at --max-new-tokens / --max-length (and that a
cut-off JSON output is not valid JSON), and constraint compile errors are one clear line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lm_support import make_tiny_llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("cli_gen_llama")))


def _gen(model, *args):
    from max.entrypoints.cli import main

    r = CliRunner().invoke(main, ["generate", "--model-path", model, "--devices", "cpu", "--prompt", "the cat",
                                  *args])
    return r


def test_generate_says_when_it_stopped_at_max_new_tokens(tiny_llama):
    r = _gen(tiny_llama, "--max-new-tokens", "3", "--max-length", "64")
    assert r.exit_code == 0, r.output
    assert "[stopped at --max-new-tokens: 3 tokens generated; raise --max-new-tokens" in r.output
    assert "JSON" not in r.output


def test_generate_says_when_it_stopped_at_max_length(tiny_llama):
    r = _gen(tiny_llama, "--max-new-tokens", "500", "--max-length", "12", "--temperature", "0")
    assert r.exit_code == 0, r.output
    # greedy on these random weights (seed 0) does not write EOS within the 12 tokens
    assert "[stopped at --max-length" in r.output


def test_generate_json_schema_cut_off_says_the_json_is_incomplete(tiny_llama):
    schema = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
    r = _gen(tiny_llama, "--max-new-tokens", "2", "--max-length", "64", "--json-schema", schema)
    assert r.exit_code == 0, r.output
    assert "[stopped at --max-new-tokens" in r.output
    assert "the JSON above is incomplete" in r.output


@pytest.mark.parametrize("args,needle", [
    (["--regex", "[a-"], 'invalid regex "[a-": unclosed character class'),
    (["--grammar", "start: foo"], 'unknown name: "foo"'),
])
def test_generate_constraint_compile_errors_are_one_line(tiny_llama, args, needle):
    r = _gen(tiny_llama, *args)
    assert r.exit_code != 0
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and needle in lines[0], r.output


def test_generate_top_k_default_is_the_whole_vocabulary():
    from max.entrypoints.cli import generate

    top_k = next(p for p in generate.params if p.name == "top_k")
    assert top_k.default == 0 and "whole vocabulary" in top_k.help


def test_generate_chat_template_file_is_used(tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[[{{ m['role'] }}]] {{ m['content'] }}{% endfor %}"
                   "{% if add_generation_prompt %} [[assistant]]{% endif %}")
    r = _gen(tiny_llama, "--chat", "--chat-template", str(tpl), "--max-new-tokens", "1", "--max-length", "64")
    assert r.exit_code == 0, r.output
    want = len(AutoTokenizer.from_pretrained(tiny_llama)("[[user]] the cat [[assistant]]",
                                                         add_special_tokens=False)["input_ids"])
    assert f"Prompt size:           {want} tokens" in r.output
