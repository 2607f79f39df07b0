"""The reference's text-to-speech interfaces: ``TTSContext`` (speech tokens appended in blocks, chunks read
without moving ``decoded_index``, left-context buffer, growth, ``is_done`` following the audio status), the
registry's pipelines for ``AUDIO_GENERATION`` / ``SPEECH_TOKEN_GENERATION``, and ``AudioGeneratorPipeline``
streaming a tiny random Llama's speech tokens through a per-token tone codec (a test codec: no speech model is
registered yet): chunks concatenate to the all-at-once decoding, the tokens equal plain greedy text generation,
metadata and final chunk are right, pages are released."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from max.interfaces import (
    AudioGenerationMetadata,
    AudioGenerationRequest,
    AudioGenerator,
    AudioGeneratorOutput,
    GenerationStatus,
    PipelineTask,
    SamplingParams,
)
from max.pipelines.core import TTSContext, get_request_payload_from_pipeline_task


def _ctx(**kw):
    return TTSContext(max_length=64, tokens=np.array([1, 2, 3]), **kw)


def test_ttscontext_fields_and_signature():
    params = inspect.signature(TTSContext).parameters
    for name in ("audio_prompt_tokens", "buffer_speech_tokens", "audio_buffer", "prev_samples_beyond_offset",
                 "streaming", "_speech_token_size", "_speech_token_end_idx", "_speech_tokens", "decoded_index",
                 "_block_counter", "_arrival_time", "audio_generation_status", "request_id", "max_length", "tokens"):
        assert name in params, name
    assert params["max_length"].kind is inspect.Parameter.KEYWORD_ONLY
    c = _ctx(audio_prompt_tokens=[5, 6], streaming=True)
    assert c.audio_prompt_tokens.tolist() == [5, 6] and c.streaming and c.decoded_index == 0
    assert c.speech_tokens.size == 0 and c.block_counter == 0 and not c.is_done


def test_speech_tokens_blocks_chunks_and_buffer():
    c = _ctx(_speech_token_size=4)
    c.update_speech_tokens(np.array([10, 11, 12]))
    c.update_speech_tokens(np.array([13, 14, 15, 16, 17]))  # grows past the initial 4
    assert c.speech_tokens.tolist() == [10, 11, 12, 13, 14, 15, 16, 17] and c.block_counter == 2
    toks, buf = c.next_speech_tokens(3)
    assert toks.tolist() == [10, 11, 12] and buf == 0
    assert c.next_speech_tokens(3)[0].tolist() == [10, 11, 12]  # does not advance by itself
    c.decoded_index = 3
    toks, buf = c.next_speech_tokens(2, buffer=2)
    assert toks.tolist() == [11, 12, 13, 14] and buf == 2
    toks, buf = c.next_speech_tokens(buffer=10)  # all unseen; the buffer is what exists before
    assert toks.tolist() == [10, 11, 12, 13, 14, 15, 16, 17] and buf == 3
    c.decoded_index = 8
    assert c.next_speech_tokens(4)[0].size == 0
    with pytest.raises(ValueError, match="audio_chunk_size"):
        c.next_speech_tokens(-1)


def test_is_done_follows_audio_status():
    c = _ctx()
    c.status = GenerationStatus.END_OF_SEQUENCE  # the token stream ended; the audio has not
    assert not c.is_done
    c.audio_generation_status = GenerationStatus.END_OF_SEQUENCE
    assert c.is_done


def test_registry_resolves_audio_tasks():
    from max.pipelines.lib.audio_generator_pipeline import AudioGeneratorPipeline
    from max.pipelines.lib.registry import get_pipeline_for_task
    from max.pipelines.lib.speech_token_pipeline import SpeechTokenGenerationPipeline

    class Cfg:
        draft_model_config = None

    assert get_pipeline_for_task(PipelineTask.AUDIO_GENERATION, Cfg()) is AudioGeneratorPipeline
    assert get_pipeline_for_task(PipelineTask.SPEECH_TOKEN_GENERATION, Cfg()) is SpeechTokenGenerationPipeline
    assert PipelineTask.AUDIO_GENERATION.output_type is AudioGeneratorOutput
    req_t, ctx_t = get_request_payload_from_pipeline_task(PipelineTask.AUDIO_GENERATION).__args__
    assert req_t is AudioGenerationRequest and ctx_t is TTSContext
    md = AudioGenerationMetadata(sample_rate=24000, chunk_id=2, final_chunk=True)
    assert md.to_dict() == {"sample_rate": 24000, "chunk_id": 2, "final_chunk": True}


class ToneCodec:
    """Test codec: each speech token is 40 samples of a tone at 200 + 10 * token Hz (token by token, so any
    split of the tokens decodes to the same samples)."""

    sample_rate = 8000
    samples_per_token = 40

    def decode(self, tokens):
        t = np.arange(self.samples_per_token) / self.sample_rate
        return np.concatenate([np.sin(2 * np.pi * (200 + 10 * int(k)) * t) for k in tokens]).astype(np.float32) \
            if len(tokens) else np.zeros(0, np.float32)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from lm_support import make_tiny_llama

    from max.pipelines import PipelineConfig
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    d = make_tiny_llama(str(tmp_path_factory.mktemp("speech_lm")))
    cfg = PipelineConfig(model_path=d, max_length=64, max_batch_size=4, kv_cache_page_size=16)
    arch = PIPELINE_REGISTRY.retrieve_architecture(cfg.model_config.huggingface_weight_repo)
    tok = PIPELINE_REGISTRY.retrieve_tokenizer(cfg)
    return cfg, arch, tok


def _pipe(lm, **kw):
    from max.pipelines.lib.audio_generator_pipeline import AudioGeneratorPipeline

    cfg, arch, tok = lm
    return AudioGeneratorPipeline(cfg, arch.pipeline_model, tok.eos, arch.weight_adapters, tok, **kw)


def test_audio_generator_streams_speech_tokens(lm):
    from max.pipelines.lib.config import AudioGenerationConfig

    pipe = _pipe(lm, audio_decoder=ToneCodec(), audio_config=AudioGenerationConfig("tone", chunk_size=[3, 5],
                                                                                   buffer=2))
    assert isinstance(pipe, AudioGenerator)
    prompts = [[5, 9, 14, 2], [7, 7, 30]]
    ctxs = {f"r{i}": TTSContext(max_length=4 + 14, tokens=np.array(p), request_id=f"r{i}", ignore_eos=True,
                                sampling_params=SamplingParams(top_k=1)) for i, p in enumerate(prompts)}
    chunks: dict[str, list] = {rid: [] for rid in ctxs}
    for _ in range(20):
        live = {rid: c for rid, c in ctxs.items() if not c.is_done}
        if not live:
            break
        for rid, out in pipe.next_chunk(live).items():
            chunks[rid].append(out)
    codec = ToneCodec()
    for rid, c in ctxs.items():
        outs = chunks[rid]
        assert c.is_done and outs[-1].is_done and outs[-1].metadata.final_chunk
        assert not any(o.metadata.final_chunk for o in outs[:-1])
        assert [o.metadata.chunk_id for o in outs] == list(range(len(outs)))
        sizes = [o.audio_data.size // codec.samples_per_token for o in outs]
        assert sizes[0] == 3 and all(s <= 5 for s in sizes[1:])  # chunk_size: 3 first, then 5
        audio = np.concatenate([o.audio_data for o in outs])
        np.testing.assert_array_equal(audio, codec.decode(c.speech_tokens))  # buffered chunks join exactly
        assert all(o.metadata.sample_rate == 8000 and o.metadata.duration == o.audio_data.size / 8000 for o in outs)
        assert c.speech_tokens.size == c.max_length - c.prompt_len
        assert c.speech_tokens.tolist() == c.generated_tokens.tolist()
    # the speech tokens are the model's greedy tokens (plain text generation of the same prompts)
    from max.pipelines.core import TextContext
    from max.interfaces import TextGenerationInputs

    plain = {f"t{i}": TextContext(max_length=4 + 14, tokens=np.array(p), request_id=f"t{i}", ignore_eos=True,
                                  sampling_params=SamplingParams(top_k=1)) for i, p in enumerate(prompts)}
    while not all(c.is_done for c in plain.values()):
        pipe.speech_lm.execute(TextGenerationInputs([{k: c for k, c in plain.items() if not c.is_done}], 1))
    for i in range(len(prompts)):
        assert ctxs[f"r{i}"].speech_tokens.tolist() == plain[f"t{i}"].generated_tokens.tolist()
    for rid in [*ctxs, *plain]:
        pipe.release(rid)
    assert pipe.kv_managers[0].num_used_pages == 0


def test_unregistered_audio_decoder_is_a_clear_error(lm):
    from max.pipelines.lib.config import AudioGenerationConfig

    with pytest.raises(NotImplementedError, match="audio decoder 'csm-mimi' is not available"):
        _pipe(lm, audio_config=AudioGenerationConfig("csm-mimi"))
