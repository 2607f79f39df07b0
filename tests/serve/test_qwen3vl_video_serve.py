"""Video through the server (``build_app`` under uvicorn, a tiny random Qwen3-VL checkpoint): a ``video_url`` part (a
``data:video/mp4`` URI) gives the text the pipeline gives; bad videos get an OpenAI-shaped 400 naming
``video_url`` and leave the server serving."""

from __future__ import annotations

import base64
import re

import pytest

pytest.importorskip("PIL")
pytest.importorskip("av")

from qwen3vl_support import MAX_FRAMES, tiny_qwen3_vl, video_bytes, video_request  # noqa: E402
from vlm_support import image_bytes  # noqa: E402


def _uri(data: bytes, mime: str = "video/mp4") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def server():
    """The server's app in this process (``build_app`` under uvicorn on a thread), with an ``openai`` client."""
    import openai

    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    d, _, _ = tiny_qwen3_vl()
    app = build_app(build_config(d, None, "cpu", 320, 2), served_model_name="tiny-qwen3-vl")
    with ServerThread(app) as srv:
        yield d, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(client, part: dict, n: int = 6):
    return client.chat.completions.create(model="tiny-qwen3-vl", max_tokens=n, temperature=0, messages=[
        {"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}])


def test_video_url_gives_the_pipelines_text(server):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, client = server
    video = video_bytes(11)
    llm = LLM(PipelineConfig(model_path=d, max_length=320, max_batch_size=1))
    ctx = video_request(llm.tokenizer, "What happens?", video, max_new_tokens=6)
    toks: list[int] = []
    llm.scheduler.submit(ctx, lambda o: toks.extend(o.tokens))
    llm.scheduler.run_until_idle()
    r = _ask(client, {"type": "video_url", "video_url": {"url": _uri(video)}})
    assert r.choices[0].message.content == llm.tokenizer.delegate.decode(toks, skip_special_tokens=True)


@pytest.mark.parametrize("part,match", [
    ({"type": "video_url", "video_url": {"url": _uri(b"\x00\x01 not a video")}}, "not a readable video|corrupt"),
    ({"type": "video", "video": [_uri(image_bytes(2, (20, 20)), "image/png")] * (MAX_FRAMES + 1)},
     f"more than the {MAX_FRAMES}"),
])  # (the other bad videos: tests/pipelines/test_qwen3vl.py)
def test_bad_videos_are_400_naming_the_field_and_the_server_keeps_serving(server, part, match):
    import openai

    _, client = server
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, part)
    assert e.value.status_code == 400
    assert re.search(match, e.value.body["message"]), e.value.body
    assert e.value.body.get("param") == "video_url", e.value.body
    ok = _ask(client, {"type": "video_url", "video_url": {"url": _uri(video_bytes(12))}}, n=2)
    assert ok.choices[0].finish_reason in ("length", "stop")
