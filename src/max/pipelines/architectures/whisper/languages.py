"""English language names Whisper users pass (``language="german"``) -> the language code of the token
(``<|de|>``).  Codes themselves are always accepted; the model's ``lang_to_id`` decides what it supports.
The table is the task's (:mod:`max.pipelines.lib.transcription`)."""

from max.pipelines.lib.transcription import LANGUAGE_CODES

__all__ = ["LANGUAGE_CODES"]
