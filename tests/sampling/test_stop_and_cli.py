"""Stop strings, and the `hone generate` command line (streaming, exit codes)."""

import hone
from hone.cli import main


def test_stop_string_ends_the_completion():
    model, tok = hone.load_model("tiny"), hone.load_tokenizer("tiny")
    kw = dict(max_new_tokens=24, temperature=1.0, seed=1)
    free = hone.generate(model, tok, ["hello"], **kw)[0]
    # The first ASCII letter after the first character becomes the stop string.
    i, stop = next((i, c) for i, c in enumerate(free.text) if i > 0 and c.isascii() and c.isalpha())
    out = hone.generate(model, tok, ["hello"], stop=[stop], **kw)[0]
    assert out.finish_reason == "stop"
    assert out.text == free.text[:i]
    assert out.tokens == free.tokens[:len(out.tokens)]
    assert stop in tok.decode(out.tokens) and stop not in tok.decode(out.tokens[:-1])


def test_generate_command_streams_and_exits_zero(capsys):
    assert main(["generate", "--model", "tiny", "--prompt", "hi", "--max-new-tokens", "5",
                 "--temperature", "1.0"]) == 0
    assert "[5 tokens in" in capsys.readouterr().out


def test_generate_command_bad_input_exits_two(capsys):
    assert main(["generate", "--model", "tiny", "--prompt", "hi", "--top-p", "2"]) == 2
    err = capsys.readouterr().err
    assert "top_p" in err and "(0, 1]" in err


def test_unknown_model_exits_two(capsys):
    assert main(["generate", "--model", "nope", "--prompt", "hi"]) == 2
    assert "known preset" in capsys.readouterr().err
