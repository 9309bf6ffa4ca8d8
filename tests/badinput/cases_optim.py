"""Optimizer choices of the trainer: an unknown name is refused, naming the option and the choices
(adafactor and lamb among them)."""
from badinput import case


def option_case(option, expect, exit=1):
    @case("pretrain %s" % option, expect=expect, exit=exit)
    def _(fx, tmp):
        run = tmp / "run"
        fx.corpus(tmp)
        return fx.pretrain(run, option)


option_case("--optimizer=adafactr", r"optimizer.*adafactr.*adafactor.*lamb|optimizer.*adafactor.*lamb.*adafactr")
option_case("--optimizer=LAMB", r"optimizer.*LAMB")
