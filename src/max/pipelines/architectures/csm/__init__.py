"""Sesame CSM (``CsmForConditionalGeneration``): text to speech -- a Llama backbone over audio frames on the
paged KV cache, a depth decoder completing each frame's codebooks, the Mimi codec turning frames into audio
(streamed by chunks)."""

from max.pipelines.architectures.csm.arch import csm_arch

ARCHITECTURES = [csm_arch]
