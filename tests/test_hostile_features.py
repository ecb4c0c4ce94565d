"""Hostile and mistaken input to `mtpc features` and `mtpc train --features` (issue 61, part 4): a store of
any `--dtype` trains, a shard of another dtype than its manifest says is refused naming it, integers of
thousands of digits in a JSON file or on the command line are one clean line, `--out` never overwrites
the user's own files, the advice for a damaged shard works when followed, and a resume on changed
`--data` text is refused instead of mixing two texts in one store."""

import json
import shutil
from pathlib import Path

import pytest

from _tiny import save_tiny_lm, write_source_corpus
from mtpc.cli.commands import main
from mtpc.training.features import MANIFEST

ROOT = Path(__file__).resolve().parent.parent
BTREE = str(ROOT / "examples" / "btree.pc")
SEQ = 64
HUGE = "9" * 5001  # past Python's 4,300-digit int() limit


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"), parts=4, length=900, overlap=400)


def features_args(lm, data, out, *extra):
    return ["features", "--model", lm, "--data", str(data), "--out", str(out), "--seq-len", str(SEQ),
            "--shard-sequences", "16", "--val-sequences", "2", "--no-progress", *extra]


def train_args(lm, store, out, *extra):
    return ["train", "--model", lm, "--features", str(store), "--circuit", BTREE, "-D", "n=4", "-D", "r=2",
            "--steps", "1", "--seq-len", str(SEQ), "--batch-size", "2", "--val-sequences", "2", "--val-windows", "16",
            "--loss", "nll+kl", "--out", str(out), "--no-progress", *extra]


@pytest.fixture(scope="module")
def stores(lm, corpus, tmp_path_factory):
    """A store per --dtype, written by the command line."""
    base = tmp_path_factory.mktemp("stores")
    for dtype in ("fp32", "bf16", "fp64"):
        assert main(features_args(lm, corpus, base / dtype, "--dtype", dtype)) == 0
    return {dtype: base / dtype for dtype in ("fp32", "bf16", "fp64")}


def fails(capsys, argv, status, *fragments):
    """Run `mtpc argv` in-process; assert the exit status, one `mtpc: error:` line and no traceback."""
    capsys.readouterr()
    assert main(argv) == status
    err = capsys.readouterr().err
    assert "mtpc: error:" in err and "Traceback" not in err and "internal error" not in err, err
    line = err.split("mtpc: error:")[-1]
    assert err.count("mtpc: error:") == 1 and line.endswith("\n") and "\n" not in line[:-1], err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def copy_store(store: Path, to: Path) -> Path:
    shutil.copytree(store, to, ignore=shutil.ignore_patterns(".*"))
    return to


def plant(path: Path, edit) -> None:
    """Rewrite the JSON file `path` with `edit(data)` applied; the string "HUGE" becomes a 5,001-digit
    integer (json.dumps itself cannot write one)."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1).replace('"HUGE"', HUGE))


# ------------------------------------------------------------------ 1. any --dtype trains; dtypes checked


@pytest.mark.parametrize("dtype, precision", [("fp64", "fp32"), ("fp64", "bf16"), ("bf16", "fp32"), ("fp32", "bf16")])
def test_a_store_written_in_any_dtype_trains_at_any_precision(lm, stores, tmp_path, dtype, precision):
    assert main(train_args(lm, stores[dtype], tmp_path / "head", "--precision", precision)) == 0
    assert (tmp_path / "head" / "head.safetensors").is_file()


def test_a_shard_whose_dtype_is_not_the_manifests_is_refused_naming_it(lm, stores, tmp_path, capsys):
    store = copy_store(stores["fp64"], tmp_path / "store")
    plant(store / MANIFEST, lambda m: m["settings"].update(dtype="float32"))
    fails(capsys, train_args(lm, store, tmp_path / "head"), 2, "train-00000.safetensors", "float64",
          "features.json says float32")
    plant(store / MANIFEST, lambda m: m["settings"].update(dtype="float8"))
    fails(capsys, train_args(lm, store, tmp_path / "head"), 2, "features.json", "dtype must be one of")


# ------------------------------------------------------------------ 2. huge integers in files


def test_a_huge_integer_in_features_json_is_one_line_naming_the_file(lm, stores, tmp_path, capsys):
    store = copy_store(stores["fp32"], tmp_path / "store")
    plant(store / MANIFEST, lambda m: m["settings"].update(seq_len="HUGE"))
    err = fails(capsys, train_args(lm, store, tmp_path / "head"), 2, str(store / MANIFEST), "5,001 digits", "line")
    assert HUGE[:50] not in err
    fails(capsys, features_args(lm, "unused", store), 2, str(store / MANIFEST), "5,001 digits")


def test_a_huge_token_id_in_head_json_vocabulary_is_one_line_naming_the_file(lm, stores, tmp_path, capsys):
    import circuitc
    from mtpc.heads.head import MTPHead, save_head

    folder = tmp_path / "head"
    save_head(MTPHead(circuitc.compile(BTREE, n=2, r=2, v=4), 32, vocabulary=[3, 1, 4, 5]), folder)
    plant(folder / "head.json", lambda h: h["vocabulary"].__setitem__(0, "HUGE"))
    argv = ["train", "--model", lm, "--features", str(stores["fp32"]), "--init-head", str(folder), "--steps", "1",
            "--seq-len", str(SEQ), "--out", str(tmp_path / "out")]
    fails(capsys, argv, 2, str(folder / "head.json"), "5,001 digits")


# ------------------------------------------------------------------ 3. a huge integer on the command line


@pytest.mark.parametrize("value, fragment", [("1" + "0" * 400, "401 characters"), (str(10**16), "1..")],
                         ids=["401-digits", "past-the-bound"])
def test_a_max_tokens_past_any_corpus_is_a_usage_error(lm, corpus, tmp_path, capsys, value, fragment):
    fails(capsys, features_args(lm, corpus, tmp_path / "f", "--max-tokens", value), 2, "--max-tokens", fragment)
    assert not (tmp_path / "f").exists()


# ------------------------------------------------------------------ 4. --out never overwrites the user's files


def test_out_holding_files_the_store_did_not_write_is_refused(lm, corpus, stores, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train-00000.safetensors").write_bytes(b"the user's own weights")
    fails(capsys, features_args(lm, corpus, mine), 2, str(mine), "train-00000.safetensors", "without a features.json")
    assert (mine / "train-00000.safetensors").read_bytes() == b"the user's own weights"
    assert sorted(p.name for p in mine.iterdir()) == ["train-00000.safetensors"]  # not even a lock file left
    store = copy_store(stores["fp32"], tmp_path / "store")
    (store / "notes.txt").write_text("mine")
    fails(capsys, features_args(lm, corpus, store), 2, "notes.txt", "beside its features.json")
    assert (store / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------ 5. the damaged shard's advice, followed


def test_removing_a_damaged_shard_and_rerunning_the_same_command_repairs_the_store(lm, corpus, tmp_path, capsys):
    store = tmp_path / "store"
    command = features_args(lm, corpus, store)
    assert main(command) == 0
    shard = store / "train-00000.safetensors"
    damaged = bytearray(shard.read_bytes())
    damaged[-3] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    fails(capsys, train_args(lm, store, tmp_path / "head"), 2, str(shard), "remove it and rerun")
    shard.unlink()  # the advice, followed exactly
    assert main(command) == 0
    assert f"{16 * SEQ:,} tokens computed now" in capsys.readouterr().out
    assert main(train_args(lm, store, tmp_path / "head")) == 0


# ------------------------------------------------------------------ 6. changed --data text


def test_a_resume_on_changed_data_is_refused(lm, corpus, tmp_path, capsys):
    data = Path(shutil.copytree(corpus, tmp_path / "data"))
    store = tmp_path / "store"
    command = features_args(lm, data, store, "--max-tokens", str(16 * SEQ))
    assert main(command) == 0
    assert main(command) == 0  # the same text: a resume with nothing to do
    before = (store / MANIFEST).read_bytes()
    (data / "part1.py").write_text((data / "part1.py").read_text() + "\n# changed\n")
    err = fails(capsys, command, 2, "the --data text changed", str(store), "new --out")
    assert "# changed" not in err
    assert (store / MANIFEST).read_bytes() == before


# ------------------------------------------------------------------ held-out follow-ups (a second attacker's pass)

@pytest.mark.parametrize("edit, fragment", [
    (lambda m: m["settings"].update(dtype=["float32"]), "dtype must be a str"),  # was: unhashable type 'list'
    (lambda m: m["shards"].__setitem__("a\x00.safetensors", m["shards"].pop("train-00000.safetensors")),
     "a shard name that is not one mtpc features writes"),  # was: embedded null byte
    (lambda m: m.update(pad=[{}] * 2_200_000), "objects and lists"),  # 22 s and 3 GB a read, before
])
def test_a_manifest_of_odd_types_names_or_sizes_is_one_line(lm, stores, tmp_path, capsys, edit, fragment):
    store = copy_store(stores["fp32"], tmp_path / "store")
    plant(store / MANIFEST, edit)
    fails(capsys, train_args(lm, store, tmp_path / "head"), 2, str(store / MANIFEST), fragment)
