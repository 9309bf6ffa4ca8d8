"""Hugging Face model directories: config.json typed and limited before any allocation, the
architecture checked against model_type, a chat template lutra.jinja cannot run refused naming its
file and line (never swapped for chatml); and the recipe's --model.* sizes limited the same way. Each error names the file (or the
option) and the key."""
import json
import shutil
import subprocess

from badinput import case, edit_json

LIMIT = 2147483647
# a size no machine holds: the message says how many bytes the parameters would need
BYTES = r"the parameters would need [\d.]+ (TB|PB|EB)"


def generate(fx, model, *extra):
    return fx.lutra_cmd("generate", model, "--prompt", "hi", "--max_new_tokens=1", *extra)


CONFIG = r"model/config\.json: "
# weights that do not fit what config.json says (the error names the directory and every tensor)
WEIGHTS = r"model does not hold a %s model of this config\.json:\n  "


def config_case(arch, changes, expect, name=None, drop=(), extra=(), where=CONFIG):
    """A case that edits model/config.json of the gpt2 or llama fixture and runs `lutra generate`."""
    label = name or ", ".join("%s: %s" % (k, json.dumps(v)) for k, v in changes.items()) or "drop " + ", ".join(drop)

    @case("config.json (%s) %s" % (arch, label), expect=where + expect)
    def _(fx, tmp):
        model = fx.model_dir(tmp) if arch == "gpt2" else fx.llama_model_dir(tmp)

        def edit(c):
            c.update(changes)
            for k in drop:
                c.pop(k, None)
        edit_json(model / "config.json", edit)
        return generate(fx, model, *extra)


# ---- types: a value of another type is an error, never converted ----------------------------
config_case("llama", {"head_dim": "16"}, r'head_dim = "16": lutra needs a positive integer')
config_case("llama", {"head_dim": "abc"}, r'head_dim = "abc": lutra needs a positive integer')
# head_dim apart from hidden_size / num_attention_heads is read (Qwen3's layout): the weights then do not fit
config_case("llama", {"head_dim": 16}, where=WEIGHTS % "llama", expect=r"model\.layers\.0\.self_attn\.q_proj\.weight is \[16, 16\] in the file, \[32, 16\] from config\.json")
config_case("llama", {"head_dim": 7}, r"rope needs an even head dim; head_dim = 7")
config_case("llama", {"head_dim": 8.5}, r"head_dim = 8.5: lutra needs a positive integer")
config_case("llama", {"num_hidden_layers": 1.5}, r"num_hidden_layers = 1.5: lutra needs a positive integer")
config_case("llama", {"num_attention_heads": 0}, r"num_attention_heads = 0: lutra needs a positive integer")
config_case("llama", {"intermediate_size": -64}, r"intermediate_size = -64: lutra needs a positive integer")
config_case("llama", {"max_position_embeddings": "2048"}, r'max_position_embeddings = "2048": lutra needs a positive')
config_case("llama", {"num_key_value_heads": True}, r"num_key_value_heads = true: lutra needs a positive integer")
config_case("llama", {"tie_word_embeddings": "yes"}, r'tie_word_embeddings = "yes": lutra needs true or false')
config_case("llama", {"attention_bias": "false"}, r'attention_bias = "false": lutra needs true or false')
config_case("llama", {"rms_norm_eps": 0}, r"rms_norm_eps = 0: lutra needs a positive number")
config_case("llama", {"rms_norm_eps": -1e-6}, r"rms_norm_eps = -1e-06: lutra needs a positive number")
config_case("llama", {"rope_theta": "10000"}, r'rope_theta = "10000": lutra needs a positive number')
config_case("llama", {"initializer_range": "0.02"}, r'initializer_range = "0.02": lutra needs a number >= 0')
config_case("llama", {"hidden_act": "gelu"}, r'hidden_act = "gelu": lutra needs "silu"')
config_case("llama", {"hidden_act": 7}, r'hidden_act = 7: lutra needs "silu"')
config_case("gpt2", {"n_layer": 1.5}, r"n_layer = 1.5: lutra needs a positive integer")
config_case("gpt2", {"n_layer": -2}, r"n_layer = -2: lutra needs a positive integer")
config_case("gpt2", {"n_head": "2"}, r'n_head = "2": lutra needs a positive integer')
config_case("gpt2", {"n_inner": 0}, r"n_inner = 0: lutra needs a positive integer")
config_case("gpt2", {"tie_word_embeddings": "yes"}, r'tie_word_embeddings = "yes": lutra needs true or false')
config_case("gpt2", {"layer_norm_epsilon": "1e-5"}, r'layer_norm_epsilon = "1e-5": lutra needs a positive number')
config_case("gpt2", {"resid_pdrop": 1.5}, r"resid_pdrop = 1.5: lutra needs a probability in \[0, 1\)")
config_case("gpt2", {"attn_pdrop": "0.1"}, r'attn_pdrop = "0.1": lutra needs a probability')
config_case("gpt2", {"scale_attn_weights": "true"}, r'scale_attn_weights = "true": lutra needs true')
config_case("gpt2", {"pruned_heads": "x"}, r'pruned_heads = "x": lutra needs \{\} \(no pruned heads\)')
config_case("gpt2", {"n_ctx": 7}, r"n_ctx = 7: lutra needs n_positions")

# ---- math lutra does not implement ------------------------------------------------------------
# RoPE (rope_theta + rope_scaling of transformers 4.x, rope_parameters of 5.x): read, never dropped
NO_DROP = r" \(it changes the model's computation, so --ignore-key cannot drop it\)"
ROPE_TYPES = r'"default", "linear", "dynamic", "llama3", "yarn" or "longrope" \(the RoPE scalings lutra computes\)'
config_case("llama", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0}},
            r'rope_parameters\.rope_type = "proportional": lutra needs ' + ROPE_TYPES + NO_DROP)
config_case("llama", {"rope_scaling": {"type": "su", "factor": 2.0}}, r'rope_scaling\.type = "su": lutra needs ' + ROPE_TYPES)
config_case("llama", {"rope_scaling": "linear"}, r'rope_scaling = "linear": lutra needs an object \{rope_type =, '
            r'rope_theta =, \.\.\.\} or null' + NO_DROP)
config_case("llama", {"rope_parameters": [1, 2]}, r"rope_parameters = \[1,2\]: lutra needs an object")
config_case("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}},
            r'rope_parameters\.low_freq_factor: rope_type "linear" has no field low_freq_factor \(transformers would '
            r"not read it; lutra refuses what it cannot place\)" + NO_DROP)
config_case("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
            r"rope_scaling: rope_type llama3 needs high_freq_factor" + NO_DROP)
config_case("llama", {"rope_parameters": {"rope_type": "linear", "factor": 0.5}},
            r"rope_parameters: factor = 0\.5: must be >= 1" + NO_DROP)
config_case("llama", {"rope_parameters": {"rope_type": "yarn", "factor": "4"}},
            r'rope_parameters\.factor = "4": lutra needs a number' + NO_DROP)
config_case("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                          "high_freq_factor": 1.0}},
            r"rope_parameters: high_freq_factor \(1\) must be above low_freq_factor \(4\)")
config_case("llama", {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0, "x"], "long_factor": [1.0]}},
            r"rope_parameters: short_factor\[2\] = x: must be a positive number")
config_case("llama", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
            r"rope_parameters\.partial_rotary_factor = 0\.5: lutra needs 1 \(lutra rotates the whole head\)" + NO_DROP)
config_case("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}, "rope_scaling": {"type": "linear",
                                                                                                  "factor": 4.0}},
            r"rope_scaling \(transformers 4\.x\) and rope_parameters \(5\.x\) are both set: give one of them" + NO_DROP,
            name="rope_scaling beside rope_parameters")
config_case("llama", {"rope_parameters": {"rope_theta": -1}}, r"rope_parameters\.rope_theta = -1: lutra needs a positive")
config_case("llama", {"attention_dropout": 0.1}, r"attention_dropout = 0\.1: lutra needs 0")
config_case("llama", {"attention_dropout": 0.1}, r"attention_dropout = 0\.1: lutra needs 0 .*" + NO_DROP,
            name="attention_dropout 0.1 (not dropped by --ignore-key=attention_dropout)",
            extra=("--ignore-key=attention_dropout",))
# mlp_bias apart from attention_bias is read: the file then lacks the biases
config_case("llama", {"mlp_bias": True}, where=WEIGHTS % "llama", expect=r"missing model\.layers\.0\.mlp\.gate_proj\.bias \[")
# (LlamaForCausalLM has no sliding window: transformers does not read the key)
config_case("llama", {"sliding_window": 4096}, r"unknown key 'sliding_window' for llama \(lutra cannot tell whether it "
            r"changes the model; if it does not, pass --ignore-key=sliding_window to load anyway; "
            r"ignore_keys = \{\"sliding_window\"\} in Lua\)")
config_case("gpt2", {"activation_function": "relu"}, r'activation_function = "relu": lutra needs "gelu_new"')
config_case("gpt2", {"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx = true: lutra needs false")
config_case("gpt2", {"add_cross_attention": True}, r"add_cross_attention = true: lutra needs false")
config_case("gpt2", {"pruned_heads": {"0": [1]}}, r"pruned_heads = .*lutra needs \{\}")


@case("generate --ignore-key=foo,bar: unknown keys accepted as harmless (documented)", exit=0, expect=r"\S")
def _(fx, tmp):
    model = fx.llama_model_dir(tmp)
    edit_json(model / "config.json", lambda c: c.update(foo=1, bar="x"))
    return generate(fx, model, "--ignore-key=foo,bar")


# ---- transformers' own directories (tests/hf/fixtures/models), converted ----------------------
def fixture_case(name, changes, expect, label=None, drop=(), extra=(), where=CONFIG):
    """A case that edits config.json of a model transformers wrote and runs `lutra convert` on it."""
    label = label or ", ".join("%s: %s" % (k, json.dumps(v)) for k, v in changes.items()) or "drop " + ", ".join(drop)

    @case("config.json (transformers' %s) %s" % (name, label), expect=where + expect)
    def _(fx, tmp):
        model = tmp / "model"
        shutil.copytree(fx.root / "tests/hf/fixtures/models" / name, model)

        def edit(c):
            c.update(changes)
            for k in drop:
                c.pop(k, None)
        edit_json(model / "config.json", edit)
        return fx.lutra_cmd("convert", *extra, model, tmp / "out")


fixture_case("qwen2_sliding", {"layer_types": ["full_attention"]},
             r'layer_types = \["full_attention"\]: lutra needs a list of 2 entries \(num_hidden_layers\)' + NO_DROP)
fixture_case("qwen2_sliding", {"layer_types": ["full_attention", "chunked_attention"]},
             r'layer_types\[2\] = "chunked_attention": lutra needs "full_attention" or "sliding_attention"' + NO_DROP)
fixture_case("qwen2_sliding", {"use_sliding_window": False},
             r'layer_types\[2\] = "sliding_attention" but use_sliding_window is false: lutra needs a window for it')
fixture_case("qwen2_sliding", {"sliding_window": "4"}, r'sliding_window = "4": lutra needs a positive integer')
fixture_case("qwen2_sliding", {"max_window_layers": 1.5}, r"max_window_layers = 1\.5: lutra needs an integer >= 0",
             drop=("layer_types",))
fixture_case("qwen2", {"use_sliding_window": "yes"}, r'use_sliding_window = "yes": lutra needs true or false')
fixture_case("qwen3", {"head_dim": 8}, where=WEIGHTS % "qwen3", expect=r"model\.layers\.0\.self_attn\.q_proj\.weight is \[64, 32\] in the file, \[32, 32\] from config\.json")
fixture_case("mistral_window", {"layer_types": ["full_attention", "sliding_attention"]},
             r"unknown key 'layer_types' for mistral \(lutra cannot tell whether it changes the model; if it does not, "
             r"pass --ignore-key=layer_types")
fixture_case("mistral_window", {"sliding_window": 0}, r"sliding_window = 0: lutra needs a positive integer")
fixture_case("llama_yarn", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "truncate": "no"}},
             r"rope_parameters\.truncate = \"no\": lutra needs true or false" + NO_DROP)
fixture_case("llama_v4_config", {"rope_scaling": {"type": "linear"}}, r"rope_scaling: rope_type linear needs factor" + NO_DROP)
fixture_case("llama", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}},
             r'rope_parameters\.rope_type = "proportional": lutra needs .*' + NO_DROP,
             label="rope_type proportional with --ignore-key=rope_parameters (still read, still refused)",
             extra=("--ignore-key=rope_parameters",))
fixture_case("qwen2", {"model_type": "qwen2_moe"},
             r'architectures\[1\] = "Qwen2ForCausalLM" does not fit model_type = "qwen2_moe"')
# mixtures of experts: what lutra does not compute, refused naming the key
fixture_case("qwen2_moe", {"decoder_sparse_step": 2}, r"decoder_sparse_step = 2: lutra needs 1 \(every layer an MoE layer"
             + ".*" + NO_DROP)
fixture_case("qwen3_moe", {"mlp_only_layers": [1]}, r"mlp_only_layers = \[1\]: lutra needs \[\]" + ".*" + NO_DROP)
fixture_case("mixtral", {"router_jitter_noise": 0.01}, r"router_jitter_noise = 0\.01: lutra needs 0" + ".*" + NO_DROP)
fixture_case("mixtral", {"num_experts_per_tok": 9}, r"num_experts_per_tok = 9: lutra needs at most the 4 experts" + NO_DROP)
fixture_case("qwen3", {"architectures": ["Qwen2ForCausalLM"]},
             r'architectures\[1\] = "Qwen2ForCausalLM" does not fit model_type = "qwen3" \(a qwen3 config names '
             r'"Qwen3ForCausalLM" or "Qwen3Model"\)')


# ---- limits, before anything is allocated ------------------------------------------------------
config_case("gpt2", {"n_layer": 1000000000}, BYTES + r".*most are in the blocks \(n_layer = 1000000000")
config_case("gpt2", {"n_embd": 2 ** 31}, r"n_embd = 2147483648: lutra needs a positive integer at most 2147483647")
config_case("gpt2", {"n_positions": 10 ** 12}, r"n_positions = 1000000000000: lutra needs a positive integer at most")
config_case("gpt2", {"vocab_size": 10 ** 12}, r"vocab_size = 1000000000000: lutra needs a positive integer at most")
config_case("gpt2", {"n_embd": 1048576, "n_head": 1, "n_positions": LIMIT},
            BYTES + r".*position embeddings \(n_positions = 2147483647, n_embd = 1048576\)",
            name="n_positions 2^31-1 with n_embd 2^20 (a product of 2^51)")
config_case("gpt2", {"vocab_size": LIMIT, "n_embd": 65536, "n_head": 1, "n_inner": 1},
            BYTES + r".*token embeddings \(vocab_size = 2147483647, n_embd = 65536\)", name="vocab_size 2^31-1")
config_case("llama", {"num_hidden_layers": 1000000000}, BYTES + r".*num_hidden_layers = 1000000000")
config_case("llama", {"vocab_size": LIMIT, "hidden_size": 4096}, drop=("head_dim",),
            expect=BYTES + r".*token embeddings \(vocab_size = 2147483647, hidden_size = 4096\)")
config_case("llama", {"hidden_size": 2 ** 31}, r"hidden_size = 2147483648: lutra needs a positive integer at most")
config_case("llama", {"max_position_embeddings": 10 ** 12}, r"max_position_embeddings = 1000000000000: lutra needs")
config_case("llama", {"num_key_value_heads": 3}, r"num_attention_heads 2 is not a multiple of num_key_value_heads 3")
config_case("llama", {"hidden_size": 17}, r"hidden_size 17 is not a multiple of num_attention_heads 2",
            name="hidden_size 17 (head_dim dropped)", drop=("head_dim",))

# ---- the architecture --------------------------------------------------------------------------
config_case("gpt2", {"architectures": ["BertModel"]},
            r'architectures\[1\] = "BertModel" does not fit model_type = "gpt2" '
            r'\(a gpt2 config names "GPT2LMHeadModel" or "GPT2Model"\)')
config_case("llama", {"architectures": ["MistralForCausalLM"]}, r'architectures\[1\] = "MistralForCausalLM" does not fit model_type = "llama"')
config_case("gpt2", {"architectures": "GPT2LMHeadModel"}, r'architectures = "GPT2LMHeadModel": lutra needs a list')
config_case("gpt2", {"model_type": "bert"}, r'model_type = "bert": lutra needs "gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3" or "qwen3_moe"')
config_case("gpt2", {"model_type": 5}, r'model_type = 5: lutra needs "gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3" or "qwen3_moe"')
config_case("gpt2", {}, r'model_type is missing \(lutra knows "gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3" or "qwen3_moe"\)', drop=("model_type",))


@case("config.json: n_layer 1e400 (a number past the largest double)",
      expect=r"json: .*model/config\.json: number 1e400 is out of range at line \d+")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text.replace('"n_layer": 1,', '"n_layer": 1e400,'))
    return generate(fx, model)


@case("config.json is a JSON array", expect=r"model/config\.json must hold a JSON object, got an array")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "config.json").write_text("[1, 2]")
    return generate(fx, model)


@case("config.json is a string", expect=r"model/config\.json must hold a JSON object, got string")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "config.json").write_text('"gpt2"')
    return generate(fx, model)


@case("config.json is not JSON", expect=r"json: .*model/config\.json: .*line 1")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "config.json").write_text('{"model_type": "gpt2",')
    return generate(fx, model)


@case("convert: config.json with head_dim \"abc\"", expect=r"model/config\.json: head_dim = \"abc\"")
def _(fx, tmp):
    model = fx.llama_model_dir(tmp)
    edit_json(model / "config.json", lambda c: c.update(head_dim="abc"))
    return fx.lutra_cmd("convert", model, tmp / "out")


# ---- the recipe's model sizes (--model.*), refused the same way --------------------------------
def option_case(option, expect):
    @case("pretrain %s" % option, expect=expect)
    def _(fx, tmp):
        fx.corpus(tmp)
        return fx.pretrain(tmp / "run", option)


option_case("--model.n_layer=1000000000", r"models\.build: " + BYTES + r".*n_layer = 1000000000")
option_case("--model.d_model=2147483648", r"models\.build: d_model must be at most 2147483647, got 2147483648")
option_case("--model.n_layer=2147483648", r"models\.build: n_layer must be at most 2147483647, got 2147483648")
option_case("--model.d_model=1048576", r"models\.build: " + BYTES + r".*d_model = 1048576")


# ---- chat templates: the model's own is run by lutra.jinja; one it cannot run is an error -------
# naming its file and line, until --template picks one of lutra's
ZEPHYR = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}"
          "{% endfor %}\n{% include 'system.jinja' %}")
CHATML = json.loads('"' + "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\\\n' + "
                    "message['content'] + '<|im_end|>' + '\\\\n' }}{% endfor %}{% if add_generation_prompt %}"
                    "{{ '<|im_start|>assistant\\\\n' }}{% endif %}" + '"')
UNSUPPORTED = r"\) line 2: \{% include %\} is not supported in chat templates"


def drop_lutra_template(model):
    for name in ("chat_template.json", "chat_template.jinja", "tokenizer_config.json"):
        (model / name).unlink(missing_ok=True)


@case("tokenizer_config.json with a custom chat_template",
      expect=r"chat template \(\S*model/tokenizer_config\.json" + UNSUPPORTED)
def _(fx, tmp):
    model = fx.model_dir(tmp)
    drop_lutra_template(model)
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": ZEPHYR, "eos_token": "</s>"}))
    return generate(fx, model)


@case("chat_template.json of transformers (no lutra_template) with a custom template",
      expect=r"chat template \(\S*model/chat_template\.json" + UNSUPPORTED)
def _(fx, tmp):
    model = fx.model_dir(tmp)
    drop_lutra_template(model)
    (model / "chat_template.json").write_text(json.dumps({"chat_template": ZEPHYR}))
    return generate(fx, model)


@case("chat_template.jinja with a custom template", expect=r"chat template \(\S*model/chat_template\.jinja" + UNSUPPORTED)
def _(fx, tmp):
    model = fx.model_dir(tmp)
    drop_lutra_template(model)
    (model / "chat_template.jinja").write_text(ZEPHYR)
    return generate(fx, model)


@case("lutra's chat_template.json beside a custom chat_template.jinja",
      expect=r"model/chat_template\.jinja declares the template as a Jinja template of its own but \S*model/"
             r"tokenizer_config\.json declares chatml; pick one with --template=NAME")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "chat_template.jinja").write_text(ZEPHYR)
    return generate(fx, model)


@case("sft: a model directory with a custom template", expect=r"chat template \(\S*model/tokenizer_config\.json" + UNSUPPORTED)
def _(fx, tmp):
    model = fx.model_dir(tmp)
    drop_lutra_template(model)
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": ZEPHYR}))
    return fx.lutra_cmd(fx.root / "recipes/sft.lua", "--model=%s" % model, "--steps=1", "--run_dir=%s" % (tmp / "s"))


@case("dpo: a model directory with a custom template", expect=r"chat template \(\S*model/chat_template\.jinja" + UNSUPPORTED)
def _(fx, tmp):
    model = fx.model_dir(tmp)
    drop_lutra_template(model)
    (model / "chat_template.jinja").write_text(ZEPHYR)
    return fx.lutra_cmd(fx.root / "recipes/dpo.lua", "--model=%s" % model, "--steps=1", "--out=%s" % (tmp / "d"))


@case("a custom template with --template=chatml: chatml, as asked (documented)", exit=0,
      expect=r"\S")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "chat_template.jinja").write_text(ZEPHYR)
    return generate(fx, model, "--template=chatml")


@case("tokenizer_config.json holding lutra's own chatml Jinja: recognised (documented)", exit=0, expect=r"\S")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    drop_lutra_template(model)
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return generate(fx, model)


@case("chat_template.json: lutra_template unknown",
      expect=r"model/chat_template\.json: lutra_template \"zephyr\" is not one of lutra's templates \(chatml, llama3\)")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "chat_template.json").write_text(json.dumps({"lutra_template": "zephyr"}))
    return generate(fx, model)


@case("chat_template.json is not JSON", expect=r"json: .*model/chat_template\.json")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "chat_template.json").write_text('{"lutra_template": "chatml"')
    return generate(fx, model)


@case("chat_template.json: chat_template is a number", expect=r"model/chat_template\.json: chat_template is not a text")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    (model / "chat_template.json").write_text(json.dumps({"chat_template": 5}))
    return generate(fx, model)


@case("tokenizer_config.json: a list of templates without a default",
      expect=r"model/tokenizer_config\.json: chat_template is a list without a \"default\" template")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    drop_lutra_template(model)
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": ZEPHYR}]}))
    return generate(fx, model)


@case("chat_template.jinja says chatml, tokenizer_config.json says llama3",
      expect=r"model/chat_template\.jinja declares the template as chatml but .*model/tokenizer_config\.json declares llama3")
def _(fx, tmp):
    model = fx.model_dir(tmp)
    # lutra's own llama3 Jinja, as modeldir writes it
    script = tmp / "jinja.lua"
    script.write_text('io.write(require("lutra.sft.templates").builtin.llama3.jinja)')
    llama3 = subprocess.run([fx.lutra, str(script)], capture_output=True, text=True, check=True).stdout
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": llama3}))
    return generate(fx, model)
