"""Helpers of the serving tests (a unique module name, so it never clashes with another conftest)."""

from __future__ import annotations

import time

from lm_support import CHAT_TEMPLATE, make_tiny_llama  # noqa: F401 - re-exported for the serve tests

MAX_LENGTH = 256


BERT_WORDS = ("the a cat dog sat on mat hello world sun good morning is are and of to in it was for with as "
              "by this that at from or word").split()


def make_tiny_bert(out: str) -> str:
    """A tiny random ``BertModel`` (32 wide, 2 layers, 64 positions) with a word-level WordPiece tokenizer."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {t: i for i, t in enumerate(special + list(BERT_WORDS))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, initializer_range=0.2,
                                  pad_token_id=0, architectures=["BertModel"])
    transformers.BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(out)
    fast.save_pretrained(out)
    return out


def kv_pages_in_use(server) -> int:
    mgr = server.engine.kv_manager
    return mgr.total_num_pages - mgr.num_free_pages


def wait_idle(server, timeout: float = 10.0) -> None:
    """Wait until the scheduler has no waiting or running request and no KV page is in use."""
    sched = server.engine.scheduler
    t0 = time.monotonic()
    while sched.running or sched.queue_depth or kv_pages_in_use(server):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not idle after {timeout} s: running={sched.running} queued={sched.queue_depth} "
                                 f"pages in use={kv_pages_in_use(server)}")
        time.sleep(0.02)


def make_context(server, prompt: str, params):
    """A ``TextContext`` for ``prompt`` made by the served model's tokenizer."""
    import asyncio
    import uuid

    from max.interfaces import TextGenerationRequest

    req = TextGenerationRequest(request_id=uuid.uuid4().hex, model_name="tiny", prompt=prompt, sampling_params=params)
    return asyncio.run(server.engine.tokenizer.new_context(req))
