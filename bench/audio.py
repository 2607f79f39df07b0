"""Speech recognition: real-time factor (processing seconds / audio seconds; lower is faster) of libremax's
``WhisperPipeline.transcribe`` beside transformers' ``WhisperForConditionalGeneration.generate`` on the same
random checkpoint of openai/whisper-tiny's sizes (4+4 layers, d_model 384, vocabulary 51865, built locally:
nothing is downloaded), greedy, the same number of tokens per 30 s window; and each side's peak RSS.

Each side runs in its own process (so each peak RSS is its own): load, one warm-up, then the median of
``--repeat`` runs over one ~20 s clip of espeak-ng speech (a synthetic voice when espeak-ng is missing), and
over a batch of 4 clips at once.  Both sides compute the features (log-mel) inside the timing.  With
``--rounds N`` the two sides alternate N times (libremax, transformers, libremax, ...) and each figure is the
median over the rounds, so that a busy machine's load weighs on both sides alike.

Run: .venv/bin/python bench/audio.py [--threads N] [--repeat R] [--tokens T] [--rounds N]
     .venv/bin/python bench/audio.py --tts [--frames F]   (text to speech: CSM, see ``tts_main``)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from _common import peak_rss_mib  # noqa: E402

TEXT = ("Speech recognition turns spoken words into text. The model listens to thirty seconds of audio at a "
        "time, writes what it heard, and moves on to the next window until the recording ends.")


def _child(side: str, model_dir: str, wav: str, repeat: int, tokens: int, threads: int | None) -> dict:
    import numpy as np
    import soundfile
    import torch

    if threads:
        torch.set_num_threads(threads)
    audio, sr = soundfile.read(wav, dtype="float32")
    assert sr == 16000
    batch = [audio, audio[::-1].copy(), audio * 0.5, np.roll(audio, 8000)]
    t0 = time.perf_counter()
    if side == "libremax":
        from max.pipelines import PipelineConfig
        from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest, WhisperPipeline

        pipe = WhisperPipeline(PipelineConfig(model_path=model_dir, device_specs="cpu", max_batch_size=4))

        def run(clips: list) -> list:
            outs = pipe.transcribe([TranscriptionRequest(c, language="en", max_new_tokens=tokens) for c in clips])
            return [o.tokens for o in outs]
    else:
        import transformers

        model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
        fe = transformers.WhisperFeatureExtractor(feature_size=80)

        @torch.inference_mode()
        def run(clips: list) -> list:
            feats = torch.from_numpy(fe(clips, sampling_rate=16000, return_tensors="np").input_features)
            g = model.generate(feats, language="en", max_new_tokens=tokens)
            eos = model.generation_config.eos_token_id
            return [[t for t in row.tolist() if t != eos] for row in g]
    load = time.perf_counter() - t0
    res: dict = {"load_s": load, "tokens": run([audio])[0]}
    for name, clips in (("one", [audio]), ("batch4", batch)):
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            run(clips)
            times.append(time.perf_counter() - t)
        res[name] = statistics.median(times)
    res["audio_s"] = audio.size / 16000
    res["peak_rss_mib"] = peak_rss_mib()
    return res


CSM_SIZES = dict(
    num_codebooks=32, vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
    codebook_pad_token_id=2047, std=0.05,
    depth=dict(num_codebooks=32, backbone_hidden_size=512, vocab_size=2048, hidden_size=256, intermediate_size=768,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
               max_position_embeddings=33),
)
"""A small CSM (csm-1b's 32 codebooks of Mimi's 2048 codes, a 4-layer 512-wide backbone, a 2-layer 256-wide depth
decoder; Mimi at its 24 kHz / 12.5 Hz framing with a 2-layer transformer)."""

TTS_TEXTS = ["Text to speech turns written words into sound.", "A second voice answers after a short pause.",
             "Streaming sends the first audio early.", "The last request of the batch is here."]


def _tts_child(side: str, model_dir: str, repeat: int, frames: int, threads: int | None) -> dict:
    import numpy as np
    import torch

    from pipelines import csm_support as cs

    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    if side == "libremax":
        from max.pipelines import PipelineConfig
        from max.pipelines.architectures.csm import codec
        from max.pipelines.architectures.csm.pipeline import CsmPipeline

        codec.CODEC_CLASS = None  # libremax's own Mimi (transformers decodes with its MimiModel)
        pipe = CsmPipeline(PipelineConfig(model_path=model_dir, device_specs="cpu", max_batch_size=4,
                                          **({"num_threads": threads} if threads else {})), chunk_frames=(frames,))
        sr = pipe.sample_rate

        def run(texts: list) -> tuple:
            ctxs = [pipe.new_context(t, i % 4, max_new_frames=frames) for i, t in enumerate(texts)]
            audio = pipe.generate(ctxs)
            return [pipe.frames(c).tolist() for c in ctxs], sum(a.size for a in audio)
    else:
        model = cs.hf_model(model_dir)
        proc = cs.hf_processor(model_dir)
        sr = model.config.codec_config.sampling_rate

        @torch.inference_mode()
        def run(texts: list) -> tuple:
            codes = cs.hf_codes(model, proc, [cs.conversation(t, i % 4) for i, t in enumerate(texts)], frames)
            n = 0
            for c in codes:
                n += model.codec_model.decode(torch.as_tensor(c.T)[None]).audio_values.shape[-1]
            return [c.tolist() for c in codes], n
    load = time.perf_counter() - t0
    first, samples = run(TTS_TEXTS[:1])
    res: dict = {"load_s": load, "frames": first[0], "audio_s": samples / sr}
    for name, texts in (("one", TTS_TEXTS[:1]), ("batch4", TTS_TEXTS)):
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            _, n = run(texts)
            times.append(time.perf_counter() - t)
        res[name] = statistics.median(times)
        res[name + "_audio_s"] = n / sr
    res["peak_rss_mib"] = peak_rss_mib()
    _ = np
    return res


def tts_main(args: argparse.Namespace) -> None:
    """``--tts``: CSM text-to-speech real-time factor, libremax's ``CsmPipeline`` beside transformers'
    ``CsmForConditionalGeneration.generate`` + Mimi decode, greedy, the same frames, each in its own process."""
    import tempfile

    import torch
    from _common import table

    sys.path.insert(0, os.path.join(HERE, ".."))  # csm_support imports tests.pipelines
    from pipelines import csm_support as cs

    from transformers import MimiConfig

    sizes = dict(CSM_SIZES, codec_config=MimiConfig(num_hidden_layers=2, codebook_size=2048).to_dict())
    model_dir = cs.make_csm_dir(tempfile.mkdtemp(), json.dumps(sizes, sort_keys=True))
    results = {}
    for side in ("libremax", "transformers"):
        cmd = [sys.executable, __file__, "--tts", "--side", side, "--model-dir", model_dir, "--repeat",
               str(args.repeat), "--frames", str(args.frames)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "src"), os.path.join(HERE, ".."),
                                                           os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        results[side] = json.loads(out.strip().splitlines()[-1])
    ours, hf = results["libremax"], results["transformers"]
    rows = []
    for name, n in (("one", 1), ("batch4", 4)):
        a = ours[name + "_audio_s"]
        rows.append((f"{n} x {a / n:.1f} s", f"{ours[name] / a:.4f}", f"{hf[name] / hf[name + '_audio_s']:.4f}",
                     f"{(hf[name] / hf[name + '_audio_s']) / (ours[name] / a):.2f}x"))
    table(f"CSM text to speech (4-layer 512 backbone, 2-layer depth decoder, 32 codebooks, random weights, float32 "
          f"CPU, ISA {_isa()}, {args.threads or torch.get_num_threads()} threads, {args.frames} frames, greedy, "
          f"median of {args.repeat}; libremax decodes with its own Mimi, transformers with MimiModel)", rows,
          ("audio", "libremax RTF", "transformers RTF", "speed-up"))
    print(f"\nframes equal: {ours['frames'] == hf['frames']} ({len(ours['frames'])} frames)")
    print(f"peak RSS: libremax {ours['peak_rss_mib']:.0f} MiB, transformers {hf['peak_rss_mib']:.0f} MiB; "
          f"load: libremax {ours['load_s']:.2f} s (weights + compile), transformers {hf['load_s']:.2f} s")
    print("RTF = processing time / audio time (lower is faster); speed-up > 1 means libremax is faster.")


def _isa() -> str:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="tokens decoded per window (both sides)")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the two sides this many times (medians)")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--wav", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tts", action="store_true", help="CSM text to speech instead of Whisper")
    ap.add_argument("--frames", type=int, default=50, help="--tts: audio frames (80 ms each) per request")
    args = ap.parse_args()
    if args.tts:
        if args.side:
            print(json.dumps(_tts_child(args.side, args.model_dir, args.repeat, args.frames, args.threads)))
        else:
            tts_main(args)
        return
    if args.side:
        print(json.dumps(_child(args.side, args.model_dir, args.wav, args.repeat, args.tokens, args.threads)))
        return
    import tempfile

    import numpy as np
    import soundfile
    from _common import table
    from whisper_support import WHISPER_TINY, speech, tiny_whisper_dir

    model_dir = tiny_whisper_dir(0, tuple(WHISPER_TINY.items()), 50257)
    clip, how = speech(TEXT)
    clip = np.concatenate([clip, clip])[: 16000 * 28] if clip.size < 16000 * 20 else clip[: 16000 * 28]
    wav = os.path.join(tempfile.mkdtemp(), "speech.wav")
    soundfile.write(wav, clip, 16000, subtype="FLOAT")
    runs: dict = {"libremax": [], "transformers": []}
    for _ in range(max(1, args.rounds)):
        for side in runs:
            cmd = [sys.executable, __file__, "--side", side, "--model-dir", model_dir, "--wav", wav,
                   "--repeat", str(args.repeat), "--tokens", str(args.tokens)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "src"),
                                                               os.environ.get("PYTHONPATH", "")]))
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
            runs[side].append(json.loads(out.strip().splitlines()[-1]))
    results = {}
    for side, rs in runs.items():
        results[side] = dict(rs[0], **{k: statistics.median(r[k] for r in rs)
                                       for k in ("one", "batch4", "load_s", "peak_rss_mib")})
    ours, hf = results["libremax"], results["transformers"]
    a = ours["audio_s"]
    rows = []
    for name, n in (("one", 1), ("batch4", 4)):
        rows.append((f"{n} x {a:.1f} s", f"{ours[name] / (n * a):.4f}", f"{hf[name] / (n * a):.4f}",
                     f"{hf[name] / ours[name]:.2f}x"))
    import torch

    table(f"Whisper (whisper-tiny sizes, random weights, float32 CPU, ISA {_isa()}, {args.threads or torch.get_num_threads()} "
          f"threads, {args.tokens} tokens/window, median of {args.repeat} x {max(1, args.rounds)} "
          f"rounds; audio: {how})", rows,
          ("audio", "libremax RTF", "transformers RTF", "speed-up"))
    print(f"\ntokens equal: {ours['tokens'] == hf['tokens']} ({len(ours['tokens'])} tokens)")
    print(f"peak RSS: libremax {ours['peak_rss_mib']:.0f} MiB, transformers {hf['peak_rss_mib']:.0f} MiB; "
          f"load: libremax {ours['load_s']:.2f} s (weights + compile), transformers {hf['load_s']:.2f} s")
    print("RTF = processing time / audio time (lower is faster); speed-up > 1 means libremax is faster.")


if __name__ == "__main__":
    main()
