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
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


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
    args = ap.parse_args()
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
