"""What vision-language families' stand-in processors share: when a model folder's ``AutoProcessor`` cannot
load, a family builds its own from the folder's image processor and tokenizer; these are the pieces every
such stand-in needs (the folder's chat template, applying it, and the error when neither loader works)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


def folder_chat_template(folder: str) -> Optional[str]:
    """The folder's ``chat_template.jinja``, or ``None`` (the tokenizer's own template then applies)."""
    tpl = Path(folder, "chat_template.jinja")
    return tpl.read_text() if tpl.is_file() else None


def processor_load_error(folder: str, why: Exception, e: Exception, parts: str) -> ValueError:
    """The error when neither the folder's processor (``why``) nor the family's stand-in (``e``, loading
    ``parts``) loads."""
    return ValueError(f"{folder}: cannot load the model's processor ({why}) nor its {parts} ({e}); a "
                      "vision-language model folder needs its processor files")


class FolderProcessor:
    """Base of a family's stand-in processor: ``tokenizer`` and ``chat_template`` (set by the subclass)."""

    tokenizer: Any
    chat_template: Optional[str]

    def apply_chat_template(self, messages: Any, tools: Any = None, tokenize: bool = False, **opts: Any) -> str:
        if self.chat_template is not None:
            opts["chat_template"] = self.chat_template
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **opts)
