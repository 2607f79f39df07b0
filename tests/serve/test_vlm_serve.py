"""Images through a live ``max serve`` process (a tiny random Gemma 3 multimodal checkpoint, one process for
the module): the ``openai`` client's image parts give the same text as ``LLM.generate``, streamed or not;
bad images get an OpenAI-shaped 400 and leave the server serving; a text-only model refuses images; the
model cards say which model takes images."""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("PIL")

from serve_support import served  # noqa: E402
from vlm_support import image_bytes, tiny_gemma3_vlm, tiny_mistral3  # noqa: E402


def _uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def vlm_server():
    with served(tiny_gemma3_vlm()[0], "--max-length", "128", "--served-model-name", "tiny-vlm", "--log-level",
                "warning", "--drain-timeout", "0") as s:
        yield s


@pytest.fixture(scope="module")
def vlm_client(vlm_server):
    import openai

    return openai.OpenAI(base_url=vlm_server[1] + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local_llm(vlm_server):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=vlm_server[0], max_length=128, max_batch_size=4))


def _messages(img: bytes, text: str, mime: str = "image/png") -> list:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _uri(img, mime)}},
                                         {"type": "text", "text": text}]}]


def test_openai_client_image_gives_the_same_text_as_llm_generate(vlm_client, local_llm):
    img = image_bytes(21, (50, 30))
    want = local_llm.generate("What is this?", max_new_tokens=12, images=[img], use_tqdm=False)[0]
    r = vlm_client.chat.completions.create(model="tiny-vlm", messages=_messages(img, "What is this?"),
                                           max_tokens=12, temperature=0)
    assert r.choices[0].message.content == want
    stream = vlm_client.chat.completions.create(model="tiny-vlm", messages=_messages(img, "What is this?"),
                                                max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
    other = vlm_client.chat.completions.create(model="tiny-vlm", messages=_messages(image_bytes(22), "What is this?"),
                                               max_tokens=12, temperature=0)
    assert other.choices[0].message.content != want  # the image matters


@pytest.mark.parametrize("url,match", [
    (_uri(image_bytes(23)[:60]), "corrupt|not a readable image"),
    (_uri(image_bytes(24, fmt="PPM"), "image/x-portable-pixmap"), "unsupported image format"),
    ("https://example.com/cat.png", "remote images"),
    ("data:image/png;base64,not base64 !!", "base64"),
])
def test_bad_images_are_400_and_the_server_keeps_serving(vlm_server, vlm_client, url, match):
    import openai

    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "hi"}]}]
    with pytest.raises(openai.BadRequestError) as e:
        vlm_client.chat.completions.create(model="tiny-vlm", messages=msgs, max_tokens=4)
    assert e.value.status_code == 400
    import re

    assert re.search(match, e.value.body["message"]), e.value.body
    ok = vlm_client.chat.completions.create(model="tiny-vlm", messages=_messages(image_bytes(25), "hi"), max_tokens=3)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_too_many_images_is_400(vlm_client):
    import openai

    content = [{"type": "image_url", "image_url": {"url": _uri(image_bytes(26))}}] * 16
    content.append({"type": "text", "text": "x"})
    with pytest.raises(openai.BadRequestError) as e:
        vlm_client.chat.completions.create(model="tiny-vlm", messages=[{"role": "user", "content": content}],
                                           max_tokens=4)
    assert "fewer or smaller images" in e.value.body["message"]


def test_model_cards_say_which_model_takes_images(vlm_server, server):
    """``capabilities.vision`` on the model card (the chat page shows its image button only then)."""
    import httpx

    assert httpx.get(vlm_server[1] + "/v1/models").json()["data"][0]["capabilities"] == {"vision": True}
    assert httpx.get(vlm_server[1] + "/v1/models/tiny-vlm").json()["capabilities"] == {"vision": True}
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["capabilities"] == {"vision": False}


def test_text_only_model_refuses_an_image(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=_messages(image_bytes(27), "hi"), max_tokens=4)
    assert "text only" in e.value.body["message"]


@pytest.fixture(scope="module")
def mistral3_server():
    with served(tiny_mistral3()[0], "--max-length", "256", "--served-model-name", "tiny-m3", "--log-level",
                "warning", "--drain-timeout", "0") as s:
        yield s


def test_mistral3_chat_with_images_of_two_sizes(mistral3_server):
    """Mistral 3 (Pixtral layout: break/end tokens inside each image) through the chat API: two images of
    different sizes in one message give ``LLM.generate``'s text, streamed or not."""
    import openai

    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, url = mistral3_server
    imgs = [image_bytes(41, (40, 28)), image_bytes(42, (20, 50))]
    want = LLM(PipelineConfig(model_path=d, max_length=256, max_batch_size=2)).generate(
        "Compare them.", max_new_tokens=12, images=imgs, use_tqdm=False)[0]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": _uri(i)}} for i in imgs),
                                         {"type": "text", "text": "Compare them."}]}]
    r = client.chat.completions.create(model="tiny-m3", messages=msgs, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == want and r.usage.prompt_tokens > 4 * 5 + 6 * 3
    stream = client.chat.completions.create(model="tiny-m3", messages=msgs, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
