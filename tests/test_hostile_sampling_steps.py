"""Issue 61, part 4: the sampling settings have one check for every command, and the compiled-step store
unpickles only what no one but this user (or root) could have written.

1. Sampling settings: `mtpc bench --temperature 1e-9` was an internal error deep in the run where
   `mtpc generate` refused it cleanly. Every command's temperature, top-k, top-p and draft temperature now
   go through `mtpc.sampling`'s rules once, right after parsing (`mtpc.checks.check_sampling_settings`):
   one `mtpc: error:` line, exit status 2, before any model is looked at (the model folders named here do
   not exist, so any later check would say so instead).
2. The step store: its file's ownership was read with `stat` (following links), never its folders', so a
   world-writable `mtpc-steps/` holding a link to a pickle got it run. `check_store` judges every folder
   of the store's real path, `read_stored_step` opens the file without following a link and checks the
   open descriptor; a refused store is a warning and the step is traced afresh. These tests call the trust
   functions directly (no compiling: they run on a torch without `aot_compile` too); one test drives
   `precompiled_step` with a stand-in for `torch.compile`, to show the store is consulted and never
   unpickled from when refused.
"""

import logging
import os
import pickle
from pathlib import Path

import pytest
import torch

from mtpc.bench import BenchConfig, run_bench
from mtpc.cli.commands import main
from mtpc.decoding import compiling
from mtpc.decoding.compiling import precompiled_step
from mtpc.step_store import UntrustedStore, check_store, read_stored_step
from mtpc.errors import InputError

ROOT_USER = os.getuid() == 0
STRANGER = 4242  # a uid that is neither this user nor root


def one_clean_line(capsys, argv) -> str:
    """Run `mtpc argv` in-process; assert exit status 2 and one `mtpc: error:` line; return that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpc: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


# ------------------------------------------------------------------ 1. one sampling check for every command

def commands(tmp_path) -> dict[str, list[str]]:
    """Every command that takes sampling settings, with model and head folders that do not exist."""
    model, head = str(tmp_path / "no-model"), str(tmp_path / "no-head")
    bench = ["bench", "--model", model, "--heads", head, "--corpus", "stdlib"]
    return {"generate": ["generate", "--model", model, "a prompt"], "bench": bench,
            "bench --mode sample": [*bench, "--mode", "sample"],
            "distill-data": ["distill-data", "--model", model, "--out", str(tmp_path / "out.jsonl")]}


@pytest.mark.parametrize("value", ["1e-9", "1e-310", "0.0009"])
def test_a_temperature_too_small_to_sample_with_is_the_same_line_from_every_command(capsys, tmp_path, value):
    lines = {name: one_clean_line(capsys, [*argv, "--temperature", value])
             for name, argv in commands(tmp_path).items()}
    assert len(set(lines.values())) == 1, lines
    assert f"--temperature {float(value):g} is too small to sample with" in lines["bench"]


def test_a_draft_temperature_too_small_to_sample_with_is_the_same_line_from_every_command(capsys, tmp_path):
    argv = commands(tmp_path)
    generate = one_clean_line(capsys, [*argv["generate"], "--temperature", "1", "--draft-temperature", "1e-9"])
    bench = one_clean_line(capsys, [*argv["bench --mode sample"], "--draft-temperature", "target", "1e-9"])
    assert generate == bench
    assert "--draft-temperature 1e-09 is too small to sample with" in bench


# values the commands' number types refuse while parsing; the message names the flag and the value typed
BAD_VALUES = [("--temperature", v) for v in ("-1", "nan", "inf", "-inf")] + \
             [("--top-p", v) for v in ("0", "1.5", "-0.1", "nan")] + [("--top-k", v) for v in ("0", "-3", "2.5")]


@pytest.mark.parametrize("flag, value", BAD_VALUES)
def test_every_refused_sampling_value_is_one_clean_line_from_every_command(capsys, tmp_path, flag, value):
    lines = {}
    for name, argv in commands(tmp_path).items():
        if flag == "--top-k" and name == "distill-data":  # its records have no top-k
            continue
        line = one_clean_line(capsys, [*argv, f"{flag}={value}"])  # `=`: a value such as -inf is no option
        assert f"argument {flag}" in line and repr(value) in line, line
        lines[name] = line.replace(name.split()[0], "COMMAND")
    if flag != "--temperature":  # the temperature's range differs: 0 is greedy only for generate
        assert len(set(lines.values())) == 1, lines


def test_valid_sampling_settings_pass_on_to_the_missing_model(capsys, tmp_path):
    """The check refuses only what sampling refuses: here the next check (the model folder) speaks."""
    for argv in commands(tmp_path).values():
        line = one_clean_line(capsys, [*argv, "--temperature", "0.5", "--top-p", "0.9"])
        assert "sample" not in line and "temperature" not in line, line


def test_the_python_api_of_the_bench_refuses_the_same_settings_before_loading(tmp_path):
    missing = str(tmp_path / "no-model")
    for mode in ("greedy", "sample"):  # a greedy bench does not use them, but they are still mistakes
        with pytest.raises(InputError, match="--temperature 1e-09 is too small to sample with"):
            run_bench(BenchConfig(model=missing, heads=[missing], corpus="stdlib", mode=mode, temperature=1e-9))
    with pytest.raises(InputError, match="--top-k must be a positive integer"):
        run_bench(BenchConfig(model=missing, heads=[missing], corpus="stdlib", mode="sample", top_k=-1))
    with pytest.raises(InputError, match="--draft-temperature must be above 0"):
        run_bench(BenchConfig(model=missing, heads=[missing], corpus="stdlib", mode="sample",
                              draft_temperatures=(0.0,)))
    with pytest.raises(InputError, match="give --mode sample"):  # as generate refuses it at --temperature 0
        run_bench(BenchConfig(model=missing, heads=[missing], corpus="stdlib", mode="greedy",
                              draft_temperatures=(None, 0.5)))


# ------------------------------------------------------------------ 2. the compiled-step store

EVIL = pickle.dumps(print)  # stands for a pickle that runs code; never read by these tests' trusted paths


def private_folder(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)  # whatever the umask
    return path


def step_file(path: Path, data: bytes = b"stored step", mode: int = 0o600) -> Path:
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def test_a_private_store_is_trusted_and_its_step_read(tmp_path):
    store = private_folder(tmp_path / "mtpc-steps")
    assert check_store(store) == Path(os.path.realpath(store))
    assert read_stored_step(step_file(store / "k.bin")) == b"stored step"
    assert read_stored_step(store / "none.bin") is None  # not stored yet: no step, no warning
    assert check_store(tmp_path / "not" / "made" / "yet") == tmp_path / "not" / "made" / "yet"  # made by us


def test_a_step_file_that_is_a_link_is_never_opened(tmp_path):
    store = private_folder(tmp_path / "mtpc-steps")
    (store / "k.bin").symlink_to(step_file(tmp_path / "elsewhere.pkl", EVIL))  # the target: ours, private
    with pytest.raises(UntrustedStore, match="k.bin is a symbolic link") as refused:
        read_stored_step(check_store(store) / "k.bin")
    assert "builtins" not in str(refused.value)  # the path named, never the content


def test_a_step_file_others_can_write_or_that_is_no_file_is_refused(tmp_path):
    store = private_folder(tmp_path / "mtpc-steps")
    with pytest.raises(UntrustedStore, match="is writable by other users"):
        read_stored_step(step_file(store / "open.bin", mode=0o666))
    os.mkfifo(store / "fifo.bin", 0o600)  # opened without blocking, refused on the descriptor
    with pytest.raises(UntrustedStore, match="fifo.bin is not a regular file"):
        read_stored_step(store / "fifo.bin")


@pytest.mark.parametrize("mode, refused", [(0o777, True), (0o703, True), (0o1777, False), (0o755, False)])
def test_a_folder_others_can_write_is_refused_unless_sticky(tmp_path, mode, refused):
    """World-writable without the sticky bit: anyone could have swapped the step; sticky (as /tmp): no one
    renames or removes what they do not own, and the folder below is judged by its owner."""
    store = private_folder(tmp_path / "open" / "mtpc-steps")
    os.chmod(tmp_path / "open", mode)
    if refused:
        with pytest.raises(UntrustedStore, match=f"{tmp_path / 'open'} is writable by other users"):
            check_store(store)
    else:
        assert check_store(store) == store


def test_a_linked_folder_is_judged_where_it_leads(tmp_path):
    """A link on the way is resolved and the folder it leads to judged (macOS's /tmp is such a link); the
    real path comes back, so the step file is opened there, not through the link again."""
    os.chmod(private_folder(tmp_path / "open"), 0o777)
    (tmp_path / "to-open").symlink_to(tmp_path / "open")
    with pytest.raises(UntrustedStore, match=f"{tmp_path / 'open'} is writable by other users"):
        check_store(tmp_path / "to-open" / "mtpc-steps")
    (tmp_path / "linked").symlink_to(private_folder(tmp_path / "mine"))
    assert check_store(tmp_path / "linked") == tmp_path / "mine"
    # a link in the open folder: whoever swaps it only chooses which checked folder is read, as the step
    # file is then opened through the real path returned (and without following a link)
    (tmp_path / "open" / "mtpc-steps").symlink_to(tmp_path / "mine")
    assert check_store(tmp_path / "open" / "mtpc-steps") == tmp_path / "mine"


def test_a_group_writable_folder_is_trusted_only_in_the_owners_own_group(tmp_path):
    """A umask of 002 (user-private groups) makes inductor's cache folder group-writable: trusted when the
    group is the owner's own (named as the user, no other member), refused for any other group."""
    import grp
    import pwd

    folder = private_folder(tmp_path / "shared")
    os.chmod(folder, 0o770)
    user = pwd.getpwuid(os.getuid())
    group = grp.getgrgid(os.stat(folder).st_gid)
    own = group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name} and user.pw_gid == group.gr_gid
    if own:
        assert check_store(folder) == folder
    else:
        with pytest.raises(UntrustedStore, match="shared is writable by other users"):
            check_store(folder)
    if ROOT_USER:  # a group of strangers, for real
        os.chown(folder, -1, STRANGER)
        with pytest.raises(UntrustedStore, match="shared is writable by other users"):
            check_store(folder)


@pytest.mark.skipif(not ROOT_USER, reason="only root can give a folder to another user")
def test_a_folder_or_step_file_of_another_user_is_refused(tmp_path):
    """A real stranger's folder and file (chown, as root)."""
    store = private_folder(tmp_path / "theirs" / "mtpc-steps")
    os.chown(tmp_path / "theirs", STRANGER, STRANGER)
    with pytest.raises(UntrustedStore, match=f"{tmp_path / 'theirs'} belongs to another user \\(uid {STRANGER}\\)"):
        check_store(store)
    mine = private_folder(tmp_path / "mine")
    os.chown(step_file(mine / "k.bin"), STRANGER, STRANGER)
    with pytest.raises(UntrustedStore, match=f"k.bin belongs to another user \\(uid {STRANGER}\\)"):
        read_stored_step(mine / "k.bin")


def test_the_owner_rules_trust_only_the_owners_given(tmp_path):
    """Simulated, for any user: this user taken for a stranger (the folders may belong only to a uid that
    owns none of them; the file only to STRANGER). The real case is the root-only test above."""
    store = private_folder(tmp_path / "mtpc-steps")
    with pytest.raises(UntrustedStore, match="belongs to another user"):
        check_store(store, owners={STRANGER})
    with pytest.raises(UntrustedStore, match=f"k.bin belongs to another user \\(uid {os.getuid()}\\)"):
        read_stored_step(step_file(store / "k.bin"), user=STRANGER)


# ------------------------------------------------------------------ the store as precompiled_step uses it

class Scale:
    def __init__(self, k: float):
        self.k = k

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


class StandInCompiled:
    """What `aot_compile` hands back, without compiling: runs the step, saves a few bytes atomically (as
    torch does: a temporary file renamed over the step's)."""

    def __init__(self, function):
        self.function = function

    def __call__(self, owner, *args):
        return self.function(owner, *args)

    def guard_check(self, owner, *args) -> bool:
        return True

    def save_compiled_function(self, path: str) -> None:
        step_file(Path(path + ".tmp"), b"stand-in step")
        os.replace(path + ".tmp", path)


@pytest.fixture
def stand_in_compiler(monkeypatch):
    """`precompiled_step` with `torch.compile` replaced by `StandInCompiled` and the store's reads recorded."""
    loads = []

    def load(file, f_globals=None):
        loads.append(file.read())
        return StandInCompiled(Scale.step)

    monkeypatch.setattr(compiling, "steps_can_be_stored", lambda: True)
    monkeypatch.setattr(compiling, "_step_key", lambda function, identity: identity)  # no version hashing
    monkeypatch.setattr(torch, "compile", lambda function, **options: type(
        "Compiling", (), {"aot_compile": lambda self, call: StandInCompiled(function)})())
    monkeypatch.setattr(torch.compiler, "load_compiled_function", load)
    return loads


def test_a_refused_store_is_a_warning_and_the_step_is_compiled_afresh(tmp_path, stand_in_compiler, caplog):
    x = torch.ones(3)
    store = tmp_path / "mtpc-steps"
    assert torch.equal(precompiled_step(Scale(2.0).step, (x,), "scale", store=store)(x), x * 2)  # saved
    assert precompiled_step(Scale(3.0).step, (x,), "scale", store=store).aot is not None
    assert stand_in_compiler == [b"stand-in step"]  # the trusted store is read back

    (store / "scale.bin").unlink()
    (store / "scale.bin").symlink_to(step_file(tmp_path / "evil.pkl", EVIL))
    with caplog.at_level(logging.WARNING, logger="mtpc.decoding.compiling"):
        assert torch.equal(precompiled_step(Scale(3.0).step, (x,), "scale", store=store)(x), x * 3)
    assert stand_in_compiler == [b"stand-in step"]  # the link was not followed
    assert "scale.bin is a symbolic link" in caplog.text and "traced afresh" in caplog.text
    assert not (store / "scale.bin").is_symlink()  # the step saved again replaced the link

    caplog.clear()
    os.chmod(store, 0o777)
    with caplog.at_level(logging.WARNING, logger="mtpc.decoding.compiling"):
        assert torch.equal(precompiled_step(Scale(4.0).step, (x,), "other", store=store)(x), x * 4)
    assert stand_in_compiler == [b"stand-in step"] and not (store / "other.bin").exists()  # neither read nor written
    assert f"{store} is writable by other users" in caplog.text
