"""Llava (``LlavaForConditionalGeneration``) over a Pixtral vision tower (Pixtral 12B): Mistral 3's image
model without the patch merger, a two-layer projector and a Mistral decoder.  Other vision towers (CLIP,
SigLIP) are refused with a clear error."""

from max.pipelines.architectures.llava.arch import llava_arch

ARCHITECTURES = [llava_arch]
