"""The `mtpc bench` report: per-set metrics, speed-ups, greedy checks, the table, markdown and plot."""

from __future__ import annotations

import json
import platform
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from ..checks import ROUNDING_DTYPES, ROUNDING_NOTE
from ..decoding import PHASES
from ..hardware import machine_summary
from ..lm.tokenizer import NUM_BYTES, ByteTokenizer, SubwordTokenizer
from .config import BenchConfig, Variant
from .peers import Peer
from .prompts import repetition
from .timing import Run

__all__ = ["build_report", "format_table", "markdown_table", "plot_tradeoff", "write_markdown", "write_outputs",
           "set_metrics", "greedy_check", "drop_repetitive"]

# --------------------------------------------------------------------------- the report

def set_metrics(runs: Sequence[Run], byte_lengths: Sequence[int] | None = None) -> dict:
    """Metrics of one prompt set (sums over its prompts); `byte_lengths[id]`: the bytes of text a token
    spells (`tok.byte_lengths()`; default a byte LM's: 1 for ids 0..255, 0 for the specials)."""
    tokens = sum(r.tokens for r in runs)
    text_bytes = sum(spelled_bytes(r.sequence[r.prompt_tokens:], byte_lengths) for r in runs)
    cycles = sum(r.cycles for r in runs)
    seconds = sum(r.seconds for r in runs)
    phases = {p: sum(r.phases[p] for r in runs) for p in PHASES}
    return {"tokens": tokens, "cycles": cycles, "seconds": seconds,
            "mu_acc": tokens / cycles if cycles else 0.0,
            "bytes": text_bytes, "bytes_per_cycle": text_bytes / cycles if cycles else 0.0,
            "mu_lat": seconds / cycles if cycles else 0.0,
            "tok_s": tokens / seconds if seconds > 0 else 0.0,
            "phases_per_cycle": {p: phases[p] / cycles if cycles else 0.0 for p in PHASES},
            "lookup_share": sum(r.lookup_cycles for r in runs) / cycles if cycles else 0.0,
            "handed_over": sum(r.handed_over_after is not None for r in runs),
            "repetition": statistics.fmean(run_repetition(r) for r in runs) if runs else 0.0,
            "position_counts": position_counts(runs)}


def spelled_bytes(ids: Sequence[int], byte_lengths: Sequence[int] | None) -> int:
    """The bytes of text `ids` spell (exact for invalid UTF-8 too, where decoded text would hold U+FFFD)."""
    if byte_lengths is None:
        return sum(1 for t in ids if 0 <= t < NUM_BYTES)
    return sum(byte_lengths[t] for t in ids if 0 <= t < len(byte_lengths))


def position_counts(runs: Sequence[Run]) -> list[list[int]]:
    """Per draft position `j = 1 ..`: [cycles that tested the token there, cycles that accepted it]. A
    cycle tests position `j` when it verified more than `j` positions and accepted every token before
    it (`accepted >= j`, counting `x_0`); it accepts it when it committed more than `j` tokens."""
    widest = max((w for r in runs for w in r.width_per_cycle), default=0)
    counts = [[0, 0] for _ in range(max(widest - 1, 0))]
    for r in runs:
        for accepted, width in zip(r.accepted_per_cycle, r.width_per_cycle):
            for j in range(1, min(width, accepted + 1)):
                counts[j - 1][0] += 1
                counts[j - 1][1] += accepted > j
    return counts


def position_acceptance(counts: list[list[int]]) -> list[float | None]:
    """The acceptance rate at each draft position (None where no cycle tested it)."""
    return [accepted / tested if tested else None for tested, accepted in counts]


def run_repetition(run: Run) -> float:
    """`repetition` (repeated 8-grams) of one generation's continuation."""
    return repetition(run.sequence[:run.prompt_tokens], run.sequence[run.prompt_tokens:])


def drop_repetitive(runs: dict[str, list[list[Run]]], max_repetition: float) -> tuple[dict, list[dict]]:
    """Leave out, for every decoder, the prompts whose plain continuation repeats more than
    `max_repetition` of its 8-grams (degenerate loops that flatter copying drafters). Returns the kept
    runs (empty sets removed) and what was dropped."""
    dropped, keep = [], []
    for k, plain_set in enumerate(runs["plain"]):
        kept = []
        for i, run in enumerate(plain_set):
            rep = run_repetition(run)
            if rep > max_repetition:
                dropped.append({"set": k, "prompt": i, "repetition": rep})
            else:
                kept.append(i)
        keep.append(kept)
    out = {label: [[sets[k][i] for i in keep[k]] for k in range(len(sets)) if keep[k]] for label, sets in runs.items()}
    return out, dropped


def mean_std(values: Sequence[float]) -> dict:
    values = list(values)
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def greedy_check(variant_runs: Sequence[Sequence[Run]], plain_runs: Sequence[Sequence[Run]]) -> dict:
    """Compare every output with plain greedy decoding of the same prompt."""
    mismatches = []
    compared = 0
    for k, (vs, ps) in enumerate(zip(variant_runs, plain_runs)):
        for i, (v, p) in enumerate(zip(vs, ps)):
            compared += 1
            if v.sequence != p.sequence:
                mismatches.append({"set": k, "prompt": i, "first_difference": _first_difference(v.sequence,
                                                                                                 p.sequence)})
    return {"compared": compared, "identical": compared - len(mismatches), "mismatches": mismatches}


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ff_reference(variant: Variant, variants: Sequence[Variant]) -> Variant | None:
    """The FF head the variant is compared with: same `n`, and the same decoder settings (lookup,
    window, acceptance rule, draft temperature, eager or compiled) when there is one, else any FF head
    with the same `n`."""
    ffs = [v for v in variants if v.entry.info["structure"] == "ff" and v.entry.info["n"] == variant.entry.info["n"]]
    same = [v for v in ffs if _settings(v) == _settings(variant) and v.entry.lora_layers == 0]
    return (same or ffs or [None])[0]


def _settings(v: Variant) -> tuple:
    return v.lookup, v.width, v.tree, v.acceptance, v.draft_temperature, v.compiled


def build_report(cfg: BenchConfig, base, variants: Sequence[Variant], peers: Sequence[Peer], runs: dict,
                 device: torch.device, dropped: list[dict] | None = None,
                 tok: ByteTokenizer | SubwordTokenizer | None = None) -> dict:
    """The report of `runs`; `tok` (the model's) counts the bytes per cycle."""
    lengths = tok.byte_lengths() if tok is not None else None  # [V] bytes each id spells
    plain_sets = [set_metrics(r, lengths) for r in runs["plain"]]
    plain = {"per_set": plain_sets, **_aggregate(plain_sets)}
    compiled = next((p for p in peers if p.kind == "plain-compiled"), None)
    compiled_sets = [set_metrics(r, lengths) for r in runs[compiled.label]] if compiled else None

    def speedups(sets: list[dict]) -> dict:
        out = {"speedup_plain": mean_std([s["tok_s"] / p["tok_s"] for s, p in zip(sets, plain_sets)])}
        if compiled_sets is not None:
            out["speedup_compiled"] = mean_std([s["tok_s"] / c["tok_s"] for s, c in zip(sets, compiled_sets)])
        return out

    peer_rows = []
    for peer in peers:
        sets = [set_metrics(r, lengths) for r in runs[peer.label]]
        row = {"label": peer.label, "kind": peer.kind, "detail": peer.detail, "per_set": sets, **_aggregate(sets),
               **speedups(sets)}
        if cfg.mode == "greedy":
            row["greedy_check"] = greedy_check(runs[peer.label], runs["plain"])
        peer_rows.append(row)
    rows = []
    for v in variants:
        sets = [set_metrics(r, lengths) for r in runs[v.label]]
        ff = ff_reference(v, variants)
        row = {"label": v.label, "head": v.entry.path, "lookup": v.lookup, "width": v.width or v.decoder.width,
               "tree": v.tree, "tree_auto": v.tree_auto, "auto": v.auto, "paced": v.pace is not None,
               "acceptance": v.acceptance, "draft_temperature": v.draft_temperature, "compiled": v.compiled,
               **v.entry.info, "per_set": sets, **_aggregate(sets),
               **speedups(sets), "ff_reference": ff.label if ff else None}
        if ff is not None:
            ff_sets = [set_metrics(r, lengths) for r in runs[ff.label]]
            row["speedup_ff"] = mean_std([s["tok_s"] / f["tok_s"] for s, f in zip(sets, ff_sets)])
        row["max_tok_s"] = v.window / row["mu_lat"]["mean"] if row["mu_lat"]["mean"] else 0.0
        step = plain["mu_lat"]["mean"]
        row["draft_cost_of_lm_step"] = ((row["phases_ms"]["head"] + row["phases_ms"]["circuit"]) / 1e3 / step
                                        if step else None)
        if cfg.mode == "greedy":
            row["greedy_check"] = greedy_check(runs[v.label], runs["plain"])
        rows.append(row)
    # llama.cpp runs the GGUF's quantized weights with its own kernels: its row reports its own check, the
    # verdict is about the decoders that run this model
    checked = rows + [r for r in peer_rows if r["kind"] != "llama.cpp"]
    return {"format": "mtpc-bench/2", "config": _config_dict(cfg), "environment": _environment(device, base),
            "max_tok_s_rule": "the longest window (n, 1 + lookup tokens, or a tree's deepest path) / mean cycle latency",
            "timer": "cuda events" if device.type == "cuda" else "time.perf_counter (the decoder's cycle clock)",
            "peer_timing": "transformers generate: from the end of the target's first forward (the prompt) to the "
                           "end; cycles = target forward calls, the first included"
                           + ("; llama.cpp: from its first new token to its last, one call per token, on the "
                              "GGUF's quantized weights (another dtype)" if any(p.kind == "llama.cpp" for p in peers)
                              else ""),
            "repetition_rule": "share of the continuation's 8-byte n-grams already seen in prompt + continuation",
            "repetition_filter": None if dropped is None else {"max_repetition": cfg.max_repetition,
                                                               "dropped": dropped},
            "greedy_identical": all(not r["greedy_check"]["mismatches"] for r in checked) if cfg.mode == "greedy"
            else None, "greedy_exactness_note": ROUNDING_NOTE if cfg.dtype in ROUNDING_DTYPES else None,
            "context_warning": _context_warning(cfg, base), "plain": plain, "peers": peer_rows, "heads": rows,
            "prompt_ids": prompt_ids(runs["plain"])}


def prompt_ids(plain_sets: Sequence[Sequence[Run]]) -> list[list[list[int]]]:
    """The token ids of every reported prompt, set by set (`--chat`: the chat template's tokens around the
    text), read from plain decoding's runs (after `--max-repetition`, the prompts kept)."""
    return [[r.sequence[:r.prompt_tokens] for r in runs] for runs in plain_sets]


def _aggregate(sets: Sequence[dict]) -> dict:
    phases = {p: statistics.fmean(s["phases_per_cycle"][p] for s in sets) * 1e3 for p in PHASES}
    return {"mu_acc": mean_std(s["mu_acc"] for s in sets), "bytes_per_cycle": mean_std(s["bytes_per_cycle"] for s in sets),
            "mu_lat": mean_std(s["mu_lat"] for s in sets),
            "tok_s": mean_std(s["tok_s"] for s in sets), "phases_ms": phases,
            "repetition": mean_std(s["repetition"] for s in sets),
            "lookup_share": statistics.fmean(s["lookup_share"] for s in sets),
            "position_acceptance": position_acceptance(_summed_counts(sets)),
            "tokens": sum(s["tokens"] for s in sets), "cycles": sum(s["cycles"] for s in sets)}


def _summed_counts(sets: Sequence[dict]) -> list[list[int]]:
    """The sets' per-position [tested, accepted] counts added up (sets may reach different widths)."""
    widest = max((len(s["position_counts"]) for s in sets), default=0)
    return [[sum(s["position_counts"][j][k] for s in sets if j < len(s["position_counts"])) for k in (0, 1)]
            for j in range(widest)]


def _config_dict(cfg: BenchConfig) -> dict:
    out = asdict(cfg)
    out["heads"] = list(cfg.heads)
    out["peers"], out["lookup"], out["windows"] = list(cfg.peers), list(cfg.lookup), list(cfg.windows)
    out["acceptance"] = list(cfg.acceptance)
    out["draft_temperatures"] = list(cfg.draft_temperatures)
    return out


def _environment(device: torch.device, base) -> dict:
    env = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor(),
           "cpu": machine_summary(str(device)),  # the CPU (or GPU) and whether it has native bf16: timings are its own
           "model_parameters": sum(p.numel() for p in base.parameters()),
           "model_config": {k: getattr(base.config, k, None) for k in
                            ("hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings")}}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    env["code"] = _code_version()
    return env


def _code_version() -> str | None:
    """`git describe` of the checkout this module runs from (with `-dirty` for local changes), if any."""
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _context_warning(cfg: BenchConfig, base) -> str | None:
    limit = getattr(base.config, "max_position_embeddings", None)
    longest = cfg.prompt_len + cfg.max_new_tokens
    if cfg.corpus is not None and limit and longest > limit:
        return (f"prompt_len + max_new_tokens = {longest} exceeds the model's max_position_embeddings {limit}: "
                "acceptance collapses beyond the training context")
    return None


# --------------------------------------------------------------------------- output

def _pm(stat: dict, scale: float = 1.0, digits: int = 2) -> str:
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def _check_cell(row: dict) -> str:
    check = row.get("greedy_check")
    if check is None:
        return "n/a"
    return f"{check['identical']}/{check['compared']}" + ("" if not check["mismatches"] else " MISMATCH")


TABLE_COLUMNS = ("decoder", "n", "LoRA", "params", "mu_acc", "bytes/cycle", "mu_lat ms", "tok/s", "x plain", "x compiled", "x FF",
                 "rep8", "max tok/s", "head ms", "circuit ms", "backbone ms", "accept ms", "draft/LM step",
                 "greedy == plain")


def table_rows(report: dict) -> list[list[str]]:
    """One row per decoder: plain, the peers (transformers' own decoders, the static-cache baselines),
    the heads. `x compiled` is relative to the compiled plain baseline when `--compile` ran it; `rep8`
    is the row's own outputs' repetition (mean over sets)."""
    plain = report["plain"]
    ms = plain["phases_ms"]
    compiled = any(p["kind"] == "plain-compiled" for p in report.get("peers", []))

    def versus(row: dict) -> str:
        return _pm(row["speedup_compiled"]) if compiled else "-"

    def rep(row: dict) -> str:
        return f"{row['repetition']['mean']:.2f}"

    rows = [["plain (autoregressive)", "-", "-", "-", "1.00", _pm(plain["bytes_per_cycle"]), _pm(plain["mu_lat"], 1e3), _pm(plain["tok_s"], 1, 1),
             "1.00", "-", "-", rep(plain), "-", "-", "-", f"{ms['backbone']:.2f}", f"{ms['accept']:.2f}", "-",
             "reference"]]
    for r in report.get("peers", []):
        # the static-cache baselines run without phase hooks, llama.cpp has no torch modules to hook
        hooked = not r["kind"].startswith("plain-") and r["kind"] != "llama.cpp"
        phases = [f"{r['phases_ms'][p]:.2f}" if hooked else "-" for p in ("backbone", "accept")]
        rows.append([r["label"], "-", "-", "-", _pm(r["mu_acc"]), _pm(r["bytes_per_cycle"]), _pm(r["mu_lat"], 1e3), _pm(r["tok_s"], 1, 1),
                     _pm(r["speedup_plain"]), versus(r), "-", rep(r), "-", "-", "-", *phases, "-", _check_cell(r)])
    for r in report["heads"]:
        ff = r.get("speedup_ff")
        cost = r["draft_cost_of_lm_step"]
        rows.append([r["label"], str(r["n"]), str(r["lora_layers"]), f"{r['parameters'] / 1e6:.2f}M",
                     _pm(r["mu_acc"]), _pm(r["bytes_per_cycle"]), _pm(r["mu_lat"], 1e3), _pm(r["tok_s"], 1, 1),
                     _pm(r["speedup_plain"]),
                     versus(r), _pm(ff) if ff else "-", rep(r), f"{r['max_tok_s']:.0f}",
                     *(f"{r['phases_ms'][p]:.2f}" for p in PHASES),
                     f"{cost:.0%}" if cost is not None else "-", _check_cell(r)])
    return rows


def format_table(report: dict) -> str:
    """A plain-text table (what `mtpc bench` prints)."""
    rows = [list(TABLE_COLUMNS)] + table_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(report: dict) -> str:
    rows = [list(TABLE_COLUMNS)] + table_rows(report)
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|")
    return "\n".join(lines)


def position_table(report: dict) -> list[str]:
    """Markdown lines: each head's acceptance rate at every draft position (tested cycles only), so a
    miss can be traced to the position where it happens."""
    rows = [r for r in report["heads"] if any(rate is not None for rate in r["position_acceptance"])
            and not r.get("tree")]  # a tree tests several tokens at a depth: one rate per position misreads it
    if not rows:
        return []
    widest = max(len(r["position_acceptance"]) for r in rows)
    lines = ["Acceptance rate at each draft position (of the cycles that tested it):", "",
             "| decoder | " + " | ".join(f"d{j}" for j in range(1, widest + 1)) + " |",
             "|---|" + "---|" * widest]
    for r in rows:
        rates = r["position_acceptance"] + [None] * (widest - len(r["position_acceptance"]))
        lines.append(f"| {r['label']} | " + " | ".join("-" if x is None else f"{x:.2f}" for x in rates) + " |")
    if any(r.get("tree") for r in report["heads"]):
        lines += ["", "(Tree rows are left out: a tree tests several tokens at each depth; its tokens per cycle "
                      "say what it kept.)"]
    return lines + [""]


def write_markdown(report: dict, path: Path, plot_name: str | None = None) -> None:
    cfg, env = report["config"], report["environment"]
    check = report["greedy_identical"]
    lines = [f"# mtpc bench: {cfg['mode']} decoding", "",
             f"Model `{cfg['model']}` ({env['model_parameters'] / 1e6:.2f}M parameters) on {env['device']} "
             f"({env.get('cpu', 'CPU not recorded')}; {env['threads']} threads, torch {env['torch']}); {cfg['repeats']} disjoint sets of "
             f"{cfg['num_prompts']} prompts, up to {cfg['max_new_tokens']} new tokens each. Mean ± std over the "
             f"sets. Timer: {report['timer']}. `max tok/s`: {report['max_tok_s_rule']}. Phases are ms per cycle "
             "(plain: per token); `draft/LM step` = (head + circuit) / one plain decoding step; `bytes/cycle`: the "
             "bytes of text the committed tokens spell, per cycle (a subword token stands for several).", ""]
    if check is not None:
        lines += [f"Greedy output identical to plain greedy decoding for every prompt and head: "
                  f"**{'yes' if check else 'NO'}**." + (f" ({report['greedy_exactness_note']})"
                                                         if report.get("greedy_exactness_note") else ""), ""]
    if report["context_warning"]:
        lines += [f"Warning: {report['context_warning']}.", ""]
    if cfg.get("chat"):
        lines += ["Every prompt is a user turn of the model's chat template (`--chat`).", ""]
    lines += [f"`rep8`: {report['repetition_rule']} (mean over prompts of each row's own outputs). Peers "
              f"(transformers' generate): {report['peer_timing']}.", ""]
    flt = report.get("repetition_filter")
    if flt is not None:
        lines += [f"Prompts whose plain continuation has rep8 > {flt['max_repetition']} were left out: "
                  f"{len(flt['dropped'])} dropped.", ""]
    lines += [markdown_table(report), ""]
    lines += position_table(report)
    if plot_name:
        lines += [f"![accepted tokens vs cycle latency]({plot_name})", ""]
    path.write_text("\n".join(lines))


def plot_tradeoff(reports: Sequence[dict], path: Path, title: str | None = None) -> None:
    """The paper's Figure 1: mean accepted tokens per cycle against mean cycle latency, one marker per
    head (error bars: std over prompt sets), dashed iso-throughput lines at multiples of plain decoding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=110)
    markers = {"ff": "o", "cp": "s", "hmm": "^", "btree": "D"}
    max_lat = max_acc = 0.0
    for report, face in zip(reports, ("C0", "C1", "C2", "C3")):
        mode = report["config"]["mode"]
        plain = report["plain"]
        for r in report["heads"]:
            lat, acc = r["mu_lat"]["mean"] * 1e3, r["mu_acc"]["mean"]
            ax.errorbar(lat, acc, xerr=r["mu_lat"]["std"] * 1e3, yerr=r["mu_acc"]["std"], fmt=markers.get(
                r["structure"], "P"), color=face, ms=6, capsize=2, alpha=0.9)
            ax.annotate(r["label"], (lat, acc), textcoords="offset points", xytext=(4, 3), fontsize=6.5)
            max_lat, max_acc = max(max_lat, lat), max(max_acc, acc)
        for r in report.get("peers", []):
            lat, acc = r["mu_lat"]["mean"] * 1e3, r["mu_acc"]["mean"]
            ax.errorbar(lat, acc, xerr=r["mu_lat"]["std"] * 1e3, yerr=r["mu_acc"]["std"], fmt="X", color=face, ms=6,
                        capsize=2, alpha=0.9, mfc="none")
            ax.annotate(r["label"], (lat, acc), textcoords="offset points", xytext=(4, -8), fontsize=6.5)
            max_lat, max_acc = max(max_lat, lat), max(max_acc, acc)
        step = plain["mu_lat"]["mean"] * 1e3
        ax.plot([step], [1.0], marker="*", color=face, ms=11, ls="none", label=f"plain ({mode})")
        max_lat = max(max_lat, step)
    step = reports[0]["plain"]["mu_lat"]["mean"] * 1e3
    x_top, y_top = max_lat * 1.15, max(max_acc * 1.2, 1.5)
    for mult in (0.25, 0.5, 1, 2, 3):  # throughput = mult x plain: accepted = mult * latency / step
        ax.plot([0, x_top], [0, x_top * mult / step], ls="--", lw=0.7, color="grey")
        x, y = min(x_top, y_top * step / mult), min(y_top, x_top * mult / step)  # where it leaves the axes
        ax.annotate(f"{mult:g}x plain", (x, y), fontsize=6, color="grey", ha="right", va="top")
    ax.set_xlim(0, x_top)
    ax.set_ylim(0, y_top)
    ax.set_xlabel("mean cycle latency μ_lat (ms)")
    ax.set_ylabel("mean accepted tokens per cycle μ_acc")
    ax.set_title(title or "accepted tokens vs latency (dashed: iso-throughput)", fontsize=9)
    handles = [plt.Line2D([], [], marker=m, ls="none", color="k", label=s) for s, m in markers.items()]
    handles.append(plt.Line2D([], [], marker="X", ls="none", color="k", mfc="none", label="transformers peer"))
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_tradeoff([report], out / "tradeoff.png", title=f"{report['config']['mode']}: accepted tokens vs latency")
    write_markdown(report, out / "bench.md", "tradeoff.png")

