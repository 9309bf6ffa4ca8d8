"""Bad command-line options and recipe settings: each names the option and the problem."""
from badinput import case, edit_json


def option_case(option, expect, exit=1):
    @case("pretrain %s" % option, expect=expect, exit=exit)
    def _(fx, tmp):
        run = tmp / "run"
        fx.corpus(tmp)
        return fx.pretrain(run, option)


# Numbers that are not finite, or outside the range where they mean something.
option_case("--lr=inf", r"'lr' must be a finite number, got inf \(--lr=inf\)")
option_case("--lr=1e400", r"'lr' must be a finite number.*--lr=1e400")
option_case("--lr=-inf", r"'lr' must be a finite number.*--lr=-inf")
option_case("--lr=nan", r"'lr' must be a finite number.*--lr=nan")
option_case("--lr=abc", r"lr.*abc")
option_case("--lr=-1", r"lr.*-1")
option_case("--min_lr=inf", r"'min_lr' must be a finite number")
option_case("--grad_clip=nan", r"grad_clip.*nan")
option_case("--grad_clip=-1", r"grad_clip.*-1")
option_case("--weight_decay=inf", r"'weight_decay' must be a finite number")
option_case("--top_p=2", r"top_p must be a finite number in \[0, 1\], got 2")
option_case("--top_p=-0.1", r"top_p.*\[0, 1\].*-0.1")
option_case("--temperature=nan", r"temperature.*nan")
option_case("--eval_every=-1", r"eval_every.*-1")
option_case("--ckpt_keep=-1", r"ckpt_keep.*-1")
option_case("--ckpt_every=-5", r"ckpt_every.*-5")
option_case("--log_every=-1", r"log_every.*-1")
option_case("--eval_iters=-3", r"eval_iters.*-3")
option_case("--warmup=-10", r"warmup.*-10")
option_case("--steps=-1", r"steps.*-1")
option_case("--steps=1.5", r"steps.*1\.5")
option_case("--batch=0", r"batch.*0")
option_case("--batch=1.5", r"batch.*1\.5")
option_case("--grad_accum=0", r"grad_accum.*0")
option_case("--betas=2,0.9", r"betas.*2")
option_case("--model.arch=bert", r"model\.arch.*bert")
option_case("--tokenizer=wordpiece", r"tokenizer.*wordpiece")
option_case("--precision=fp8", r"precision.*fp8")
option_case("--schedule=step", r"schedule.*step")
option_case("--bogus=1", r"bogus")
option_case("--model.bogus=1", r"model\.bogus")
option_case("--seed=x", r"seed.*x")
option_case("--model.dropout=1.5", r"dropout.*1\.5")
option_case("--data=/nonexistent/corpus.txt", r"/nonexistent/corpus\.txt")
option_case("--device=tpu", r"'tpu' is neither a device")
option_case("--device=cuda", r"cuda")

# Sizes that cannot fit: refused before anything is allocated, naming the options.
option_case("--batch=1000000000000", r"data: batch = 1000000000000 .*seq_len = 16 tokens would need .* more than the .* of memory")
# (--model.n_layer, --model.d_model too large: cases_hf.py, with the HF config's limits)
option_case("--model.block_size=100000000", r"seq_len 100000000 needs")
option_case("--model.n_head=3", r"d_model 16 is not a multiple of n_head 3")


# A command's checked error is its message alone: no position inside lutra, no traceback.
@case("convert: a bad config.json key is one line on stderr (no lutra position, no traceback)",
      expect=r'\Alutra convert: hf: \S*/model/config\.json: n_embd = "abc": lutra needs a positive integer\n\Z')
def _(fx, tmp):
    model = fx.model_dir(tmp)
    edit_json(model / "config.json", lambda c: c.update(n_embd="abc"))
    return fx.lutra_cmd("convert", model, tmp / "out")


@case("generate: a missing model directory is one line on stderr",
      expect=r"\Alutra generate: modeldir\.load: \S*/missing is not a model directory [^\n]*\n\Z")
def _(fx, tmp):
    return fx.lutra_cmd("generate", tmp / "missing", "--prompt=hi")
