"""The workflow a user runs, per family: a tiny model directory as transformers saves it, with a tokenizer and
the family's own chat template, and what transformers computes from it.

    python gen_flow.py OUTDIR                      write the fixtures (fixed seeds)
    python gen_flow.py --check-lutra LUTRA OUTDIR  the other direction: recipes/sft.lua (the binary LUTRA) trains
        each fixture model 3 steps and saves it; transformers loads the saved directory (model and tokenizer)
        and its logits are compared with lutra's of the same directory (transformers in float64 and float32);
        its chat_template must be the fixture's text, giving the fixture's prompt ids. Prints one line per
        family and exits 1 when a difference passes 1e-5 (relative to the largest logit) or the template or
        its ids differ.

OUTDIR/<family>/ holds what save_pretrained wrote (config.json, model.safetensors in f32; tokenizer.json,
tokenizer_config.json, chat_template.jinja) and expected.json: the prompt, its ids rendered by
apply_chat_template (add_generation_prompt) and the ids transformers' greedy generate adds to them (model in
float64; the smallest top-1 / top-2 logit gap on the way, so that an f32 run cannot flip a choice); the same for
a second user turn after the decoded first reply (prompt2, prompt2_ids, greedy2_ids: what `lutra chat` sees); the
number of tokens of data/sft.jsonl that carry loss: span_tokens by the rule lutra documents (span_mask, on
transformers' rendering and offsets), assistant_tokens by return_assistant_tokens_mask where the template marks
them with {% generation %}; the mean summed log-probability of data/dpo.jsonl's chosen and rejected responses
(dpo_chosen_logp, dpo_rejected_logp; the final assistant turn's span, float64). The tokenizers and the templates are tests/hf/fixtures/chat's (a byte-level BPE of 500 ids
trained by gen_chat.py with the template's special tokens; the template texts of the real models), read from
there. OUTDIR/data/ holds the chats (sft.jsonl) and preference pairs (dpo.jsonl) the workflow trains on.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers as tf
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(HERE, "fixtures", "chat")
ROOT = os.path.dirname(os.path.dirname(HERE))
PROMPTS = ["What is the capital of France?", "And of Spain?"]
NEW_TOKENS = 6

SMALL = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, rms_norm_eps=1e-5)

# family -> (chat fixture holding the tokenizer and template, transformers class, config kwargs)
FAMILIES = {
    # gpt2 ships no chat template: ChatML with {% generation %} (assistant masks from transformers)
    "gpt2": ("chatml_generation", tf.GPT2LMHeadModel, tf.GPT2Config,
             dict(n_embd=32, n_layer=2, n_head=4, n_positions=128, n_inner=32, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0)),
    "llama": ("llama31", tf.LlamaForCausalLM, tf.LlamaConfig,
              dict(SMALL, tie_word_embeddings=False, rope_parameters={
                  "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "qwen2": ("qwen25", tf.Qwen2ForCausalLM, tf.Qwen2Config, dict(SMALL, tie_word_embeddings=True)),
    "qwen3": ("qwen3", tf.Qwen3ForCausalLM, tf.Qwen3Config,
              dict(SMALL, head_dim=16, attention_bias=False, tie_word_embeddings=True)),
    "mistral": ("mistral", tf.MistralForCausalLM, tf.MistralConfig,
                dict(SMALL, sliding_window=8, head_dim=8, tie_word_embeddings=True)),
    "smollm2": ("smollm2", tf.LlamaForCausalLM, tf.LlamaConfig,
                dict(SMALL, num_key_value_heads=4, tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
}

SFT = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there!"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
]
DPO = [
    {"prompt": "What is the capital of France?", "chosen": "Paris.", "rejected": "London."},
    {"prompt": "Say hello.", "chosen": "Hello there!", "rejected": "No."},
    {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
    {"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Table."},
]


def randomise(model, seed, scale):
    """Weights away from their init (norms off 1, biases off 0), so that a mix-up shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.ndim == 1:
                p.copy_((1 + 0.2 * r) if ("norm" in name or "ln_" in name) else 0.2 * r)
            else:
                p.copy_(scale * r / math.sqrt(p.shape[-1]))


def ids_of(tok, messages, **kw):
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)
    return out


def span_mask(tok, messages, last_only=False):
    """ids of the rendered conversation and which carry loss by the rule lutra documents (README, SFT data):
    the tokens that overlap an assistant message's content where the rendered text shows it, with the
    end-of-turn string (the tokenizer's eos) right after it. Found here on transformers' own rendering and
    offsets: each message's content searched in order through apply_chat_template's text."""
    text = tok.apply_chat_template(messages, tokenize=False)
    spans, pos = [], 0
    for i, m in enumerate(messages):
        start = text.index(m["content"], pos)
        pos = start + len(m["content"])
        if m["role"] == "assistant":
            if text.startswith(tok.eos_token, pos):
                pos += len(tok.eos_token)
            if not last_only or i == len(messages) - 1:
                spans.append((start, pos))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = ids_of(tok, messages)["input_ids"]
    assert enc["input_ids"] == ids, "the rendered text tokenizes to apply_chat_template's ids"
    mask = [int(any(a < e and s < b for s, e in spans)) for a, b in enc["offset_mapping"]]
    return ids, mask


def dpo_logps(tok, model):
    """The mean over data/dpo.jsonl of the summed log-probabilities of the chosen and of the rejected response
    (the final assistant turn's span), model in float64."""
    out = []
    for key in ("chosen", "rejected"):
        total = 0.0
        for p in DPO:
            ids, mask = span_mask(tok, [{"role": "user", "content": p["prompt"]},
                                        {"role": "assistant", "content": p[key]}], last_only=True)
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
            total += sum(lp[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t])
        out.append(total / len(DPO))
    return out


def greedy(d):
    """What transformers makes of the saved directory: two user turns (the second after the model's greedy
    reply to the first, as its decoded text), each turn's prompt ids and greedy reply ids, the smallest top-2
    logit gap on the way, and whether the first reply decodes to clean UTF-8 text."""
    tok = tf.AutoTokenizer.from_pretrained(d)
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="sdpa").eval()
    eos = model.config.eos_token_id
    messages, turns, gap, clean = [], [], math.inf, True
    for text in PROMPTS:
        messages.append({"role": "user", "content": text})
        prompt = ids_of(tok, messages, add_generation_prompt=True)["input_ids"]
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=eos, output_logits=True,
                                 return_dict_in_generate=True)
        new = gen.sequences[0, len(prompt):].tolist()
        gap = min([gap] + [(lg[0].topk(2).values[0] - lg[0].topk(2).values[1]).item() for lg in gen.logits])
        turns.append({"prompt": text, "prompt_ids": prompt, "greedy_ids": new})
        reply = tok.decode([i for i in new if i != eos])
        clean = clean and "\ufffd" not in reply
        messages.append({"role": "assistant", "content": reply})
    return turns, gap, clean


def write_family(out, family, seed):
    chat, cls, config_cls, kwargs = FAMILIES[family]
    d = os.path.join(out, family)
    tok = tf.AutoTokenizer.from_pretrained(os.path.join(CHAT, chat))
    with open(os.path.join(CHAT, chat, "chat_template.jinja")) as f:
        tok.chat_template = f.read()
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    bos = tok.convert_tokens_to_ids(tok.bos_token) if tok.bos_token else None
    config = config_cls(vocab_size=len(tok), bos_token_id=bos, eos_token_id=eos, **kwargs)
    # the first seed whose greedy reply is no single repeated token and whose choices are clear (a gap
    # of 0.005 between the two best logits, far above f32 rounding)
    for seed in range(seed, seed + 300):
        torch.manual_seed(seed)
        model = cls(config)
        # gpt2's random replies rarely leave a repeated token at the usual scale
        randomise(model, seed, 2.0 if family == "gpt2" else 1.0)
        shutil.rmtree(d, ignore_errors=True)
        model.eval().save_pretrained(d)
        tok.save_pretrained(d)
        turns, gap, clean = greedy(d)
        if gap > 0.005 and clean and all(len(set(t["greedy_ids"])) >= 3 for t in turns):
            break
    else:
        raise RuntimeError(family + ": no seed gave clear greedy replies")
    tok = tf.AutoTokenizer.from_pretrained(d)
    expected = {"prompt": turns[0]["prompt"], "prompt_ids": turns[0]["prompt_ids"],
                "greedy_ids": turns[0]["greedy_ids"], "prompt2": turns[1]["prompt"],
                "prompt2_ids": turns[1]["prompt_ids"], "greedy2_ids": turns[1]["greedy_ids"], "eos_id": eos,
                "min_top2_gap": gap, "template": chat, "seed": seed}
    expected["span_tokens"] = sum(sum(span_mask(tok, m)[1]) for m in SFT)
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="sdpa").eval()
    expected["dpo_chosen_logp"], expected["dpo_rejected_logp"] = dpo_logps(tok, model)
    if "{% generation %}" in tok.chat_template:
        n = 0
        for messages in SFT:
            r = ids_of(tok, messages, return_assistant_tokens_mask=True)
            n += sum(r["assistant_masks"])
        expected["assistant_tokens"] = n
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print("%-8s template %-18s seed %d, greedy %s, then %s (gap %.3g)" % (family, chat, seed, turns[0]["greedy_ids"],
                                                                          turns[1]["greedy_ids"], gap))


def generate(out):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "data"))
    with open(os.path.join(out, "data", "sft.jsonl"), "w") as f:
        for m in SFT:
            f.write(json.dumps({"messages": m}) + "\n")
    with open(os.path.join(out, "data", "dpo.jsonl"), "w") as f:
        for p in DPO:
            f.write(json.dumps(p) + "\n")
    for i, family in enumerate(FAMILIES):
        write_family(out, family, 100 + i)


LOGITS_LUA = """
local lt = require "lutra"
local st = require "lutra.ckpt.safetensors"
local dir, ids_file, dst = ...
local model = require("lutra.hf").load_pretrained(dir)
local ids = st.load(ids_file).ids
st.save(dst, {logits = model(ids)})
"""


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError("%s failed: %s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout


def check_lutra(lutra, fixtures):
    from safetensors.torch import save_file
    lutra = os.path.abspath(lutra)
    fixtures = os.path.abspath(fixtures)
    tmp = tempfile.mkdtemp(prefix="lutra-flow-")
    script = os.path.join(tmp, "logits.lua")
    with open(script, "w") as f:
        f.write(LOGITS_LUA)
    data = os.path.join(fixtures, "data", "sft.jsonl")
    worst, failed = 0.0, []
    print("%-8s %-16s %-16s %s" % ("family", "rel diff f64", "rel diff f32", "template and prompt ids"))
    for family in FAMILIES:
        try:
            out = os.path.join(tmp, family)
            run([lutra, os.path.join(ROOT, "recipes", "sft.lua"), "--model=" + os.path.join(fixtures, family),
                 "--train_data=" + data, "--val_data=" + data, "--steps=3", "--batch=2", "--warmup=1", "--lr=1e-2",
                 "--eval_answers=0", "--threads=1", "--run_dir=" + os.path.join(tmp, "run-" + family),
                 "--out=" + out])
            tok = tf.AutoTokenizer.from_pretrained(out)
            with open(os.path.join(fixtures, family, "chat_template.jinja")) as f:
                same = tok.chat_template == f.read()
            exp = json.load(open(os.path.join(fixtures, family, "expected.json")))
            messages = [{"role": "user", "content": exp["prompt"]}]
            same = same and ids_of(tok, messages, add_generation_prompt=True)["input_ids"] == exp["prompt_ids"]
            ids = torch.tensor([exp["prompt2_ids"] + exp["greedy2_ids"]])
            save_file({"ids": ids}, os.path.join(tmp, "ids.safetensors"))
            run([lutra, script, out, os.path.join(tmp, "ids.safetensors"), os.path.join(tmp, "got.safetensors")])
            got = load_file(os.path.join(tmp, "got.safetensors"))["logits"].double()
            figures = []
            for dtype in (torch.float64, torch.float32):
                model = tf.AutoModelForCausalLM.from_pretrained(out, dtype=dtype, attn_implementation="sdpa").eval()
                with torch.no_grad():
                    ref = model(ids).logits.double()
                figures.append(((got - ref).abs().max() / ref.abs().max()).item())
            worst = max(worst, figures[0])
            if not same:
                failed.append(family + " (chat_template or its ids differ)")
            print("%-8s %-16.3g %-16.3g %s" % (family, figures[0], figures[1], "same" if same else "DIFFERS"))
        except RuntimeError as e:
            print("%-8s failed: %s" % (family, str(e).strip().splitlines()[-1]))
            failed.append(family)
    shutil.rmtree(tmp)
    print("worst relative logit difference (lutra f32 vs transformers f64): %.3g%s"
          % (worst, "; failed: " + " ".join(failed) if failed else ""))
    return 0 if worst <= 1e-5 and not failed else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-lutra", metavar="LUTRA", help="train with lutra, reload in transformers (OUTDIR: fixtures)")
    p.add_argument("outdir")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.check_lutra:
        sys.exit(check_lutra(a.check_lutra, a.outdir))
    generate(a.outdir)


if __name__ == "__main__":
    main()
