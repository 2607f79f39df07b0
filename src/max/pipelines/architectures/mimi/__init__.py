"""Mimi (transformers' ``MimiModel``), the neural audio codec of Sesame CSM and Moshi, on max graphs.

Supported: encode (mono waveform -> split-RVQ codes, equal to ``MimiModel.encode``), decode (codes ->
waveform, equal to ``MimiModel.decode``), streaming decode chunk by chunk (causal convolution, transposed
convolution and sliding-window KV states carried between chunks; any chunking concatenates to the whole
decode; ``decode_chunks`` advances several streams at once, equal chunk lengths in one graph call), batched
whole decode of several requests, fewer codebooks than the config's (``num_codebooks=``).
Checkpoints: a ``save_pretrained`` folder, or a state dict with a prefix (``codec_model.`` in CSM).
Not supported (clear errors): non-causal convolutions, ``pad_mode`` other than ``constant``,
``trim_right_ratio`` != 1, convolution shortcuts, stereo, RoPE scaling; streaming encode; devices other than
the CPU.  It is a component, not a pipeline architecture (no ``ARCHITECTURES`` entry)."""

from max.pipelines.architectures.mimi.codec import MimiCodec, MimiDecodeState

__all__ = ["ARCHITECTURES", "MimiCodec", "MimiDecodeState"]

ARCHITECTURES: tuple = ()
"""None: the codec is a component of speech-token architectures (CSM), not a pipeline of its own."""
