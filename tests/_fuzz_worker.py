"""Fuzz worker, run by tests/test_fuzz_cli.py in a subprocess under a memory limit.

`python _fuzz_worker.py WORKDIR COUNT SEED MEMORY_BYTES CPU_SECONDS` writes COUNT mutants of the
example `.pc` files and of their graph-spec JSON into WORKDIR (a copy of examples/, so includes
resolve), runs `circuitc` commands on each in this process (`circuitc.cli.main`) and prints one JSON
object: how many runs, and every run that printed a traceback, exited 1 (an internal error or out
of memory) or ran past CPU_SECONDS of CPU time (a hang). The memory limit is set with
`resource.setrlimit(RLIMIT_AS)` before anything is loaded; the per-run time limit is a CPU-time timer,
so a loaded machine does not turn slowness into hangs.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import resource
import signal
import sys
from pathlib import Path

PC_FRAGMENTS = [
    "}", "{", "(", ")", "[", "]", "*", "**", "|", "@", "..", ":", ",", ";", "=", "-", "//", "0", "1", "99", "-1",
    "n", "x", "x[0]", "x[0:99]", "x[3:1]", "root x[0]", "def", "return", "if", "else", "for", "in", "units",
    ".units = 0", "param", "vars", '"', "#", "\n", " ", "true", "not", "prod(", "btree(x)", "f()", "1 // 0",
    "2 ** 99999",
    # hostile
    'include "/etc/passwd"', 'include "../../../../etc/passwd.pc"', 'include "/dev/zero"', 'include "lib/trees.pc"',
    'include "include.pc"', "\nfor i in 0..10**18 { }\n", "\ny = random_tree(x, repetitions=10**9)\n",
    "\nk = 2\n" + "k = k * k\n" * 20, "len(0..10**70)", "\ndef g(k) { return g(k - 1) + g(k - 1) }\ny = g(60)\n",
    "x[0:10**9]", "10**18", "9" * 5000, "\nvars y[10**9] states 2\n", ".units = 10**9", "\x00", "\ufeff",
    "[i for i in 0..10**12]", "x[0]@" * 50, "(" * 300, "-" * 3000 + "1", "min(0..10**70)", "max(0..10**70)",
    "x[0..10**18]", "x[0..10**18, 5]", "len(range(0, 10**70, 7))", "x[0..10**9]@(10**70)",
    "\nfor i in 0..100000 { y = btree(x) }\n", "\nfor i in 0..100000 { y = x@a }\n",
]
NUMBERS = ["0", "-1", "1", "100000000", "10**18", "2**300", "9" * 5000, "65537"]
BINDINGS = [[], ["-D", "n=100000000"], ["-D", "n=0"], ["-D", "n=-3"], ["-D", 'n="a"'], ["-D", "r=100000"],
            ["-D", "v=1000000000"], ["-D", "n=" + "7" * 120]]
JSON_VALUES = [1e18, 10**18, 10**100, -1, 0, "x", None, [], {}, [[[[]]]], True, "\ud800", 3.5, "", [0, 0],
               {"scope": [10**9]}, {"scope": "0"}, ["x0", 3]]


class _Hang(Exception):
    pass


def _on_timer(signum, frame):
    raise _Hang()


def mutate_pc(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        at = rng.randint(0, len(text))
        kind = rng.choice(["insert", "delete", "replace", "drop line", "repeat line", "number"])
        if kind == "insert":
            text = text[:at] + rng.choice(PC_FRAGMENTS) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + rng.randint(1, 8):]
        elif kind == "replace":
            text = text[:at] + rng.choice(PC_FRAGMENTS) + text[at + rng.randint(1, 4):]
        elif kind == "number":
            digits = [k for k, ch in enumerate(text) if ch.isdigit()]
            if digits:
                k = rng.choice(digits)
                text = text[:k] + rng.choice(NUMBERS) + text[k + 1:]
        else:
            lines = text.splitlines(keepends=True)
            k = rng.randint(0, max(0, len(lines) - 1))
            lines[k:k + 1] = [] if kind == "drop line" else lines[k:k + 1] * 2
            text = "".join(lines)
    return text


def mutate_json(spec: dict, rng: random.Random) -> str:
    spec = json.loads(json.dumps(spec))
    kind = rng.choice(["value", "value", "region", "partition", "delete", "text", "duplicate", "deep"])
    if kind == "value":
        spec[rng.choice(list(spec))] = rng.choice(JSON_VALUES)
    elif kind == "region":
        rid = rng.choice(list(spec["regions"]))
        field = rng.choice(["scope", "units", "extra"])
        spec["regions"][rid][field] = rng.choice(JSON_VALUES)
    elif kind == "partition" and spec["partitions"]:
        p = rng.choice(spec["partitions"])
        p[rng.choice(["parent", "children", "product"])] = rng.choice(JSON_VALUES)
    elif kind == "delete":
        del spec[rng.choice(list(spec))]
    text = json.dumps(spec)
    if kind == "text":
        at = rng.randint(0, len(text))
        text = text[:at] + rng.choice(["", "{", "}", "[", "]", ",", '"', ":", "1e999", "\\ud800"]) \
            + text[at + rng.randint(0, 5):]
    elif kind == "duplicate":
        text = text.replace('"root": ', '"root": "x0", "root": ', 1)
    elif kind == "deep":
        text = text.replace('"partitions": ', '"partitions": ' + "[" * 50_000 + "]" * 50_000 + ", \"p\": ", 1)
    return text


def run(argv: list[str], cpu_seconds: float) -> tuple[int | str, str]:
    from circuitc.cli import main

    out, err = io.StringIO(), io.StringIO()
    signal.setitimer(signal.ITIMER_VIRTUAL, cpu_seconds)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    except _Hang:
        status = "hang"
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    return status, out.getvalue() + err.getvalue()


def main() -> None:
    workdir, count, seed, memory, cpu_seconds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4]), float(sys.argv[5])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    signal.signal(signal.SIGVTALRM, _on_timer)
    from circuitc import load_graph

    sources = {p.name: p.read_text() for p in sorted(workdir.glob("*.pc"))}
    specs = {name: load_graph(workdir / name).to_json() for name in sources}
    rng = random.Random(seed)
    runs, problems = 0, []
    for k in range(count):
        name = rng.choice(sorted(sources))
        if rng.random() < 0.7:
            path = workdir / f"mutant-{k}.pc"
            path.write_text(mutate_pc(sources[name], rng), encoding="utf-8", errors="surrogateescape")
            commands = [["check", str(path), *rng.choice(BINDINGS)], ["fmt", str(path)]]
        else:
            path = workdir / f"mutant-{k}.json"
            path.write_text(mutate_json(specs[name], rng), encoding="utf-8", errors="surrogatepass")
            commands = [["check", str(path)], [rng.choice(["fmt", "export", "show"]), str(path)]]
        for argv in commands:
            runs += 1
            status, output = run(argv, cpu_seconds)
            if status not in (0, 2) or "Traceback" in output:
                problems.append({"argv": argv, "status": status, "output": output[-2000:],
                                 "source": path.read_text(errors="replace")[:2000]})
        path.unlink()
    print(json.dumps({"mutants": count, "runs": runs, "problems": problems}))


if __name__ == "__main__":
    main()
