"""Tiny random Llama checkpoints with a locally trained byte-level BPE tokenizer (MODELS.md §6.2),
shared by the pipeline and serving tests (a unique module name: no clash with any conftest)."""

from __future__ import annotations

import functools
import glob
import os
from typing import Any

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<pad>")


@functools.lru_cache(maxsize=None)
def _bpe_json(vocab_size: int, extra_special: tuple[str, ...]) -> str:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    files = sorted(glob.glob(os.path.join(os.path.dirname(transformers.__file__), "models", "llama", "*.py")))
    files += sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:30]
    text = [open(f, encoding="utf-8", errors="ignore").read() for f in files]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [*SPECIAL_TOKENS, *extra_special]
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                                      show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return bpe.to_str()


def make_tokenizer(vocab_size: int = 1024, chat_template: str = CHAT_TEMPLATE,
                   extra_special: tuple[str, ...] = ()) -> Any:
    """A ``PreTrainedTokenizerFast``: byte-level BPE (every byte spells), ChatML specials, ``</s>`` EOS."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer.from_str(_bpe_json(vocab_size, tuple(extra_special)))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   chat_template=chat_template)


def make_tiny_llama(out: str, *, tokenizer: Any = None, seed: int = 0, **config: Any) -> str:
    """Save a random ``LlamaForCausalLM`` (64 wide, 2 layers unless ``config`` says otherwise) and its
    tokenizer to ``out``; returns ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tok = tokenizer if tokenizer is not None else make_tokenizer()
    kw = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
              rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2)
    kw.update(config)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(LlamaConfig(**kw)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


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


def make_tiny_cross_encoder(out: str, kind: str = "bert", num_labels: int = 1, seed: int = 0) -> str:
    """A tiny random cross-encoder (``BertForSequenceClassification`` or, ``kind="xlm-roberta"``,
    ``XLMRobertaForSequenceClassification``; 32 wide, 2 layers) with a word-level tokenizer that encodes
    text pairs (``[CLS] a [SEP] b [SEP]`` with segment ids 0/1, or ``<s> a </s></s> b </s>``)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    roberta = kind == "xlm-roberta"
    cls_, pad, sep, unk, mask = (("<s>", "<pad>", "</s>", "<unk>", "<mask>") if roberta else
                                 ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"))
    special = [cls_, pad, sep, unk, mask] if roberta else [pad, unk, cls_, sep, mask]
    vocab = {t: i for i, t in enumerate(special + list(BERT_WORDS))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    ids = [(cls_, vocab[cls_]), (sep, vocab[sep])]
    pair = f"{cls_} $A {sep} {sep} $B {sep}" if roberta else f"{cls_} $A {sep} $B:1 {sep}:1"
    tok.post_processor = processors.TemplateProcessing(single=f"{cls_} $A {sep}", pair=pair, special_tokens=ids)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, pad_token=pad, cls_token=cls_, sep_token=sep,
                                   mask_token=mask)
    torch.manual_seed(seed)
    common = dict(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, initializer_range=0.2, num_labels=num_labels, pad_token_id=vocab[pad])
    if roberta:
        cfg = transformers.XLMRobertaConfig(max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5,
                                            architectures=["XLMRobertaForSequenceClassification"], **common)
        model = transformers.XLMRobertaForSequenceClassification(cfg)
    else:
        cfg = transformers.BertConfig(max_position_embeddings=64, architectures=["BertForSequenceClassification"],
                                      **common)
        model = transformers.BertForSequenceClassification(cfg)
    model.eval().save_pretrained(out)
    fast.save_pretrained(out)
    return out
