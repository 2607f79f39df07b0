"""Mimi codec decoding: real-time factor (decode seconds / audio seconds; lower is faster, < 1 is faster than
real time) of libremax's ``MimiCodec`` beside transformers' ``MimiModel.decode`` on the same random
checkpoint (built locally, nothing downloaded), whole decode of a clip and streaming decode in chunks
(transformers has no chunked decode equal to its whole one, so its side is the whole decode only).

Sizes (``--size``): ``small`` (hidden 256, 32 filters, 4 transformer layers, Mimi's ratios 8/6/5/4 at 24 kHz, 32
codebooks of 2048: a tiny-but-not-toy codec) or ``mimi`` (kyutai/mimi's sizes: hidden 512, 64 filters, 8
layers).  Prints the medians and the ratio transformers / libremax (> 1: libremax is faster).

Run: .venv/bin/python bench/mimi.py [--size small|mimi] [--seconds S] [--chunk FRAMES] [--repeat R] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SIZES = {
    "small": dict(hidden_size=256, num_filters=32, num_hidden_layers=4, intermediate_size=1024,
                  num_attention_heads=4, num_key_value_heads=4, codebook_dim=256,
                  vector_quantization_hidden_dimension=256, upsample_groups=256),
    "mimi": dict(),  # MimiConfig's defaults are kyutai/mimi's sizes
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--chunk", type=int, default=5, help="code frames per streaming chunk")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of both sides (default: the cores)")
    a = ap.parse_args()

    import numpy as np
    import torch
    import transformers

    from _common import fmt_s, table, timeit
    from max.pipelines.architectures.mimi import MimiCodec

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    hf = transformers.MimiModel(transformers.MimiConfig(**SIZES[a.size])).eval()
    with torch.no_grad():
        for n, b in hf.named_buffers():
            if n.endswith("embed_sum"):
                b.normal_()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        from max.engine import InferenceSession

        codec = MimiCodec.from_pretrained(d, session=InferenceSession(num_threads=a.threads))
    frames = int(round(a.seconds * codec.frame_rate))
    codes = np.random.default_rng(0).integers(0, codec.codebook_size, (codec.num_codebooks, frames))
    audio_s = frames * codec.samples_per_frame / codec.sample_rate

    def ours() -> None:
        codec.decode(codes)

    def streamed() -> None:
        st = codec.new_decode_state()
        for i in range(0, frames, a.chunk):
            codec.decode_chunk(codes[:, i:i + a.chunk], st)

    tc = torch.from_numpy(codes)[None]

    def theirs() -> None:
        with torch.no_grad():
            hf.decode(tc)

    err = np.abs(codec.decode(codes) - hf.decode(tc).audio_values[0, 0].detach().numpy()).max()
    t_ours, t_stream, t_hf = (timeit(f, repeat=a.repeat) for f in (ours, streamed, theirs))
    rows = [("libremax decode", fmt_s(t_ours), f"{t_ours / audio_s:.4f}", f"{t_hf / t_ours:.2f}x"),
            (f"libremax stream ({a.chunk} frames/chunk)", fmt_s(t_stream), f"{t_stream / audio_s:.4f}",
             f"{t_hf / t_stream:.2f}x"),
            ("transformers decode", fmt_s(t_hf), f"{t_hf / audio_s:.4f}", "1.00x")]
    table(f"Mimi decode, {a.size} sizes, {audio_s:.1f} s of audio ({frames} frames x {codec.num_codebooks} "
          f"codebooks), torch threads {torch.get_num_threads()}; max |diff| vs transformers {err:.2e}",
          rows, ("side", "median", "RTF", "transformers / side"))


if __name__ == "__main__":
    main()
