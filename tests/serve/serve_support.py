"""Helpers of the serving tests (a unique module name, so it never clashes with another conftest)."""

from __future__ import annotations

import glob
import os
import time

MAX_LENGTH = 256
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tiny_llama(out: str) -> str:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    files = sorted(glob.glob(os.path.join(os.path.dirname(transformers.__file__), "models", "llama", "*.py")))
    files += sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:30]
    text = [open(f, encoding="utf-8", errors="ignore").read() for f in files]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<pad>"]
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=1024, special_tokens=special, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  chat_template=CHAT_TEMPLATE)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
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


def kv_pages_in_use(server) -> int:
    mgr = server.llm.pipeline.kv_managers[0]
    return mgr.total_num_pages - mgr.num_free_pages


def wait_idle(server, timeout: float = 10.0) -> None:
    """Wait until the scheduler has no waiting or running request and no KV page is in use."""
    sched = server.llm.scheduler
    t0 = time.monotonic()
    while sched.running or sched.queue_depth or kv_pages_in_use(server):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not idle after {timeout} s: running={sched.running} queued={sched.queue_depth} "
                                 f"pages in use={kv_pages_in_use(server)}")
        time.sleep(0.02)
