"""`mtpc generate --prompts FILE --batch-size B`: the prompts decoded as left-padded batches, one JSON line
per prompt, each the text the prompt gives alone; bad batch options get one clean error."""

import json

import pytest

from test_generate import folders, generate, refused  # noqa: F401  (folders: the module's fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["a", "é", "a✓ é a", "✓"]  # different byte lengths: left padding


def alone(folders, capsys, prompt: str, *args) -> str:  # noqa: F811
    assert generate(folders, prompt, "--max-new-tokens", "11", "--no-stream", *args) == 0
    return capsys.readouterr().out.removesuffix("\n")


@pytest.mark.parametrize("layout", ["lines", "jsonl"])
@pytest.mark.parametrize("batch_size", [None, "3"])
def test_prompts_file_decodes_each_prompt_as_alone(folders, capsys, tmp_path, layout, batch_size):  # noqa: F811
    path = tmp_path / ("prompts.txt" if layout == "lines" else "prompts.jsonl")
    if layout == "lines":
        path.write_text("\n".join(PROMPTS) + "\n\n")  # an empty line is no prompt
    else:
        path.write_text("\n".join(json.dumps({"prompt": p}) if i % 2 else json.dumps(p) for i, p in enumerate(PROMPTS)))
    expected = [alone(folders, capsys, p) for p in PROMPTS]
    args = ["--prompts", str(path), "--max-new-tokens", "11", "--stats"] + (["--batch-size", batch_size]
                                                                            if batch_size else [])
    assert generate(folders, *args) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["prompt"] for line in lines] == PROMPTS
    assert [line["text"] for line in lines] == expected
    batches = ["batch of 4"] if batch_size is None else ["batch of 3", "batch of 1"]
    assert [line.split("] ")[0].removeprefix("[speculative, ") for line in captured.err.splitlines()] == batches


def test_sampled_batches_follow_the_seed(folders, capsys, tmp_path):  # noqa: F811
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS))
    runs = []
    for _ in range(2):
        assert generate(folders, "--prompts", str(path), "--max-new-tokens", "6", "--temperature", "1.5",
                        "--seed", "3") == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == len(PROMPTS)


def test_bad_batch_options_are_refused(folders, capsys, tmp_path):  # noqa: F811
    path = tmp_path / "prompts.txt"
    path.write_text("a\nb\n")
    model = ["generate", "--model", str(folders / "lm")]
    head = ["--head", str(folders / "head")]
    refused(model + head + ["--batch-size", "2", "a"], capsys, "--batch-size splits the prompts of --prompts FILE")
    refused(model + ["--prompts", str(path)], capsys, "give --head too")
    refused(model + head + ["--prompts", str(path), "a"], capsys, "either with --prompts FILE or as one prompt")
    refused(model + head + ["--prompts", str(path), "--compare"], capsys, "--compare measures one prompt")
    refused(model + head + ["--prompts", str(path), "--batch-size", "0"], capsys, "--batch-size")
    refused(model + head + ["--prompts", str(path), "--batch-size", "5000"], capsys, "--batch-size must be an integer in 1..4096")
    refused(model + head + ["--prompts", str(tmp_path / "missing.txt")], capsys, "no such file")
    (tmp_path / "empty.txt").write_text("\n \n")
    refused(model + head + ["--prompts", str(tmp_path / "empty.txt")], capsys, "no prompts")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"text": 3}\n')
    refused(model + head + ["--prompts", str(tmp_path / "bad.jsonl")], capsys, "bad.jsonl:2: expected a JSON string")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    refused(model + head + ["--prompts", str(tmp_path / "broken.jsonl")], capsys, "broken.jsonl:2: invalid JSON")
