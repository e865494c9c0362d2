#!/usr/bin/env python3
"""Collects bench/experiment.sh's runs into OUT/results.json, OUT/table.md and OUT/tta.svg.

usage: python3 bench/experiment_plot.py OUT

Reads OUT/manifest.tsv (one row per run; the last row of an id wins), OUT/meta-*.json,
OUT/plans/*.json and OUT/raw/<id>.{json,jsonl,err}. Standard library only.
"""
import csv
import glob
import html
import json
import math
import os
import re
import sys

EPOCH_MB = 60000 / 64  # minibatches of 64 per Fashion-MNIST epoch

ROW_ORDER = [  # (schedule, plan kind) of the throughput table
    ("dp", "straight"), ("asp", "straight"), ("model-parallel", "straight"), ("gpipe", "straight"),
    ("1f1b-flush", "straight"), ("2bw", "straight"), ("1f1b", "planner"), ("1f1b", "straight"),
    ("pytorch-ddp", "-"),
]
COLORS = {"dp": "#1f77b4", "asp": "#ff7f0e", "1f1b": "#2ca02c", "1f1b no-stash": "#d62728",
          "1f1b-flush": "#9467bd", "1f1b microbatches=4": "#17becf"}


def color_of(label):
    """A run's colour: its schedule and variant's, whatever its seed (the label's " seed N")."""
    base = label.split(" seed ")[0]
    return COLORS.get(label) or COLORS.get(base, "#555")


def rate_bits(r):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", r)
    if not m:
        return 0
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def rate_label(r):
    b = rate_bits(r)
    return f"{b / 1e9:g} Gbit/s" if b >= 1e9 else f"{b / 1e6:g} Mbit/s"


def last_json(path):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    for ln in reversed(lines):
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                return json.loads(ln)
            except ValueError:
                pass
    return None


def evals_of(out, rid):
    ev = []
    try:
        for ln in open(f"{out}/raw/{rid}.jsonl"):
            o = json.loads(ln)
            if "eval_minibatches" in o:
                ev.append(o)
    except (OSError, ValueError):
        pass
    if ev:
        return ev, "metrics"
    # a run that did not finish: rank 0's progress lines on stderr (seconds rounded)
    try:
        for m in re.finditer(r"evaluation after (\d+) minibatches \(([\d.]+) s of training\): test accuracy ([\d.]+)",
                             open(f"{out}/raw/{rid}.err").read()):
            ev.append({"eval_minibatches": int(m.group(1)), "epoch": int(m.group(1)) / EPOCH_MB,
                       "train_s": float(m.group(2)), "test_accuracy": float(m.group(3)), "test_loss": None})
    except OSError:
        pass
    return ev, "stderr"


def asp_figures(out, rid):
    try:
        t = open(f"{out}/raw/{rid}.err").read()
    except OSError:
        return None
    m = None
    for m in re.finditer(r"staleness mean ([\d.]+), max (\d+); pull round trip mean ([\d.]+) ms, max ([\d.]+) ms"
                         r" \(forward\+backward ([\d.]+) ms per unit\)", t):
        pass
    if not m:
        return None
    return {"staleness_mean": float(m.group(1)), "staleness_max": int(m.group(2)),
            "pull_ms_mean": float(m.group(3)), "pull_ms_max": float(m.group(4)),
            "forward_backward_ms_per_unit": float(m.group(5))}


def plan_info(path):
    try:
        p = json.load(open(path))
    except (OSError, ValueError):
        return None
    st = [{"layers": f"{s['layers'][0]}-{s['layers'][-1]}" if len(s["layers"]) > 1 else str(s["layers"][0]),
           "replicas": s["replicas"], "ranks": s["ranks"]} for s in p["stages"]]
    return {"stages": st, "bandwidth_Bps": p["cluster"]["levels"][0]["bandwidth"],
            "planner_predicted_ms_per_minibatch": p["predicted"]["pipeline_s"] * 1e3,
            "planner_data_parallel_ms": p["predicted"]["data_parallel_s"] * 1e3,
            "text": ", ".join(s["layers"] + (f" x{s['replicas']}" if s["replicas"] > 1 else "") for s in st)}


def err_tail(out, rid):
    try:
        lines = [ln for ln in open(f"{out}/raw/{rid}.err").read().splitlines() if "error" in ln or "abort" in ln]
        return lines[-1][:300] if lines else None
    except OSError:
        return None


def fmt(x, nd=0):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:,.{nd}f}"


def main():
    out = sys.argv[1]
    rows = {}
    with open(f"{out}/manifest.tsv") as f:
        for r in csv.DictReader(f, delimiter="\t"):
            rows[r["id"]] = r
    meta = {}
    for p in sorted(glob.glob(f"{out}/meta-*.json")):
        try:
            meta[os.path.basename(p)[5:-5]] = json.load(open(p))
        except ValueError:
            pass
    m0 = meta.get("all") or meta.get("tta") or meta.get("tput") or {}
    target = float(m0.get("target", 0.85))
    rates = sorted({r["rate"] for r in rows.values()}, key=rate_bits, reverse=True)
    plans = {}
    for r in rates:
        plans[r] = {k: plan_info(f"{out}/plans/{k}-{r}.json") for k in ("planner", "straight")}
        pl, st = plans[r]["planner"], plans[r]["straight"]
        if pl and st:
            plans[r]["planner_equals_straight"] = pl["stages"] == st["stages"]

    tput, tta = [], []
    for rid, r in rows.items():
        s = last_json(f"{out}/raw/{rid}.json")
        rec = {"id": rid, "rate": r["rate"], "rate_bits_per_s": rate_bits(r["rate"]), "schedule": r["schedule"],
               "plan": r["plan"], "variant": r["variant"] or None, "steps": int(r["steps"]), "exit_status": int(r["rc"]),
               "load1_before": float(r["load_before"]), "load1_after": float(r["load_after"]),
               "command_s": float(r["cmd_s"])}
        try:
            rec["command"] = open(f"{out}/raw/{rid}.cmd").read().strip()
        except OSError:
            pass
        if rec["exit_status"] != 0:
            rec["error"] = err_tail(out, rid)
        if r["schedule"] == "pytorch-ddp":
            rec["samples_per_s"] = s.get("samples_per_s") if s else None
            rec["predicted_samples_per_s"] = None
            rec["torch"] = s.get("torch") if s else None
        elif s:
            ub = s.get("unit_batch") or 64
            pred = s.get("predicted_time_per_unit_ms")
            rec.update({k: s.get(k) for k in ("samples_per_s", "time_per_unit_ms", "predicted_time_per_unit_ms",
                                              "unit_batch", "units", "wall_s", "overhead_pct", "test_accuracy",
                                              "final_loss", "mean_loss", "target_minibatches", "target_train_s",
                                              "stages")})
            rec["predicted_samples_per_s"] = ub * 1e3 / pred if pred else None
            for k in ("staleness_mean", "staleness_max", "pull_ms_mean", "pull_ms_max"):
                if k in s:
                    rec[k] = s[k]
        if r["schedule"] == "asp":
            a = asp_figures(out, rid)
            if a:
                rec["asp"] = a
        if r["phase"] == "tput":
            tput.append(rec)
            continue
        ev, src = evals_of(out, rid)
        rec["evals"], rec["evals_from"] = ev, src
        rec["target"] = target
        hit = next((e for e in ev if e["test_accuracy"] is not None and e["test_accuracy"] >= target), None)
        rec["reached"] = hit is not None
        if hit:
            rec["time_to_target_s"] = hit["train_s"]
            rec["minibatches_to_target"] = hit["eval_minibatches"]
            rec["epochs_to_target"] = hit["eval_minibatches"] / EPOCH_MB
        best = max(ev, key=lambda e: e["test_accuracy"] or 0) if ev else None
        rec["best_accuracy"] = best["test_accuracy"] if best else None
        rec["best_at_s"] = best["train_s"] if best else None
        rec["last_accuracy"] = ev[-1]["test_accuracy"] if ev else None
        rec["trained_minibatches"] = ev[-1]["eval_minibatches"] if ev else 0
        rec["trained_epochs"] = rec["trained_minibatches"] / EPOCH_MB
        rec["trained_s"] = ev[-1]["train_s"] if ev else None
        rec["label"] = r["schedule"] + (f" {r['variant']}" if r["variant"] else "")
        tta.append(rec)

    res = {"meta": meta, "rates": rates, "plans": plans, "throughput": tput, "time_to_accuracy": tta}
    json.dump(res, open(f"{out}/results.json", "w"), indent=1)
    write_table(out, res, target)
    if tta:
        write_svg(f"{out}/tta.svg", tta, target, m0)
    print(open(f"{out}/table.md").read())


def write_table(out, res, target):
    rates, L = res["rates"], []
    by = {(t["rate"], t["schedule"], t["plan"]): t for t in res["throughput"]}
    if res["throughput"]:
        L.append("Throughput, samples/s (all 4 ranks together): measured, and the simulator's prediction for the "
                 "same plan and profile (none for `asp`, which the simulator does not model).\n")
        L.append("| schedule | plan | " + " | ".join(f"{rate_label(r)} measured | simulator" for r in rates) + " |")
        L.append("| --- | --- | " + " | ".join("---: | ---:" for _ in rates) + " |")
        for sched, plan in ROW_ORDER:
            cells = []
            for r in rates:
                t = by.get((r, sched, plan))
                if not t:
                    cells += ["", ""]
                elif t["exit_status"] != 0:
                    cells += [f"failed ({t['exit_status']})", ""]
                elif sched == "asp":   # the simulator has no asp schedule: its figure is compute only
                    cells += [fmt(t.get("samples_per_s")), "—"]
                else:
                    cells += [fmt(t.get("samples_per_s")), fmt(t.get("predicted_samples_per_s"))]
            name = "PyTorch DDP (gloo)" if sched == "pytorch-ddp" else f"`{sched}`"
            L.append(f"| {name} | {plan if plan != '-' else ''} | " + " | ".join(cells) + " |")
        L.append("")
        L.append("Plans (one profile for all; `planner`: `pipedream plan --workers 4 --bandwidth B --cores C "
                 "--net-cpu S --core-efficiency E`, "
                 "`straight`: the same with `--straight`; layers per stage, xR = replicas):\n")
        L.append("| link | bandwidth given (B/s) | planner's plan | straight plan | planner's ms/minibatch |")
        L.append("| --- | ---: | --- | --- | ---: |")
        for r in rates:
            p = res["plans"].get(r, {})
            pl, st = p.get("planner"), p.get("straight")
            if pl and st:
                L.append(f"| {rate_label(r)} | {pl['bandwidth_Bps']:.4g} | {pl['text']} | "
                         f"{'same' if p.get('planner_equals_straight') else st['text']} | "
                         f"{pl['planner_predicted_ms_per_minibatch']:.1f} |")
        L.append("")
        asp = [t for t in res["throughput"] if t.get("asp")]
        if asp:
            L.append("asp (stderr of rank 0): staleness mean / max, pull round trip mean ms, forward+backward ms/unit: "
                     + "; ".join(f"{rate_label(t['rate'])}: {t['asp']['staleness_mean']} / {t['asp']['staleness_max']}, "
                                 f"{t['asp']['pull_ms_mean']:.0f}, {t['asp']['forward_backward_ms_per_unit']:.0f}"
                                 for t in sorted(asp, key=lambda t: -t["rate_bits_per_s"])))
            L.append("")
        lo = [t["load1_before"] for t in res["throughput"]]
        L.append(f"Machine load average (1 min) at the runs' starts: {min(lo):.1f}–{max(lo):.1f}.\n")
    if res["time_to_accuracy"]:
        tt = res["time_to_accuracy"]
        L.append(f"Time to {target:.0%} test accuracy at {rate_label(tt[0]['rate'])} "
                 f"(training wall-clock time, evaluations excluded):\n")
        L.append("| schedule | plan | cap (minibatches) | trained | reached | time to target | epochs to target "
                 "| best accuracy (at s) | last accuracy | samples/s |")
        L.append("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for t in tt:
            ok = t["reached"]
            L.append(f"| `{t['label']}` | {t['plan']} | {t['steps']} | {t['trained_minibatches']} mb, "
                     f"{t['trained_epochs']:.2f} ep, {fmt(t['trained_s'])} s | "
                     f"{'yes' if ok else ('no' if t['exit_status'] == 0 else 'run failed')} | "
                     f"{fmt(t.get('time_to_target_s')) + ' s' if ok else '—'} | "
                     f"{fmt(t.get('epochs_to_target'), 2) if ok else '—'} | "
                     f"{fmt(t['best_accuracy'], 4)} ({fmt(t['best_at_s'])}) | {fmt(t['last_accuracy'], 4)} | "
                     f"{fmt(t.get('samples_per_s'))} |")
        L.append("")
    open(f"{out}/table.md", "w").write("\n".join(L) + "\n")


def write_svg(path, tta, target, meta):
    W, H, ml, mr, mt, mb = 820, 470, 64, 250, 40, 52
    pw, ph = W - ml - mr, H - mt - mb
    xmax = max([e["train_s"] for t in tta for e in t["evals"]] + [1])
    step = [s for s in (10, 20, 50, 100, 200, 250, 500, 1000, 2000, 5000) if xmax / s <= 8][0]
    xmax = math.ceil(xmax / step) * step
    X = lambda x: ml + pw * x / xmax  # noqa: E731
    Y = lambda y: mt + ph * (1 - y)  # noqa: E731
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>']
    rate = tta[0]["rate"]
    o.append(f'<text x="{ml}" y="22" font-size="14" font-weight="bold">vgg16, Fashion-MNIST: test accuracy against '
             f'training time, 4 hosts at {html.escape(rate_label(rate))}</text>')
    for i in range(0, 11):
        y = i / 10
        o.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{Y(y):.1f}" y2="{Y(y):.1f}" stroke="#e4e4e4"/>')
        o.append(f'<text x="{ml - 6}" y="{Y(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    x = 0
    while x <= xmax + 1e-9:
        o.append(f'<line x1="{X(x):.1f}" x2="{X(x):.1f}" y1="{mt}" y2="{mt + ph}" stroke="#e4e4e4"/>')
        o.append(f'<text x="{X(x):.1f}" y="{mt + ph + 16}" text-anchor="middle">{x:g}</text>')
        x += step
    o.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    o.append(f'<text x="{ml + pw / 2}" y="{H - 12}" text-anchor="middle">training wall-clock time, s '
             f'(evaluations excluded)</text>')
    o.append(f'<text transform="translate(16 {mt + ph / 2}) rotate(-90)" text-anchor="middle">test accuracy '
             f'({meta.get("test_images", "")} test images)</text>')
    o.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{Y(target):.1f}" y2="{Y(target):.1f}" stroke="#000" '
             f'stroke-dasharray="6 4"/>')
    o.append(f'<text x="{ml + pw - 4}" y="{Y(target) - 5:.1f}" text-anchor="end">target {target:g}</text>')
    ly, rings = mt + 8, []  # the rings where a line reaches the target go on top of every line
    for t in tta:
        c = color_of(t["label"])
        pts = [(X(e["train_s"]), Y(e["test_accuracy"])) for e in t["evals"] if e["test_accuracy"] is not None]
        dash = ' stroke-dasharray="5 3"' if "no-stash" in (t["variant"] or "") else ""   # the ablation
        if len(pts) > 1:
            o.append(f'<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="'
                     + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        for a, b in pts:
            o.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.6" fill="{c}"/>')
        if t["reached"]:
            a, b = X(t["time_to_target_s"]), Y(target)
            rings.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="6" fill="none" stroke="{c}" stroke-width="2"/>')
        lx = ml + pw + 14
        o.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/>')
        o.append(f'<text x="{lx + 30}" y="{ly + 4}" font-weight="bold">{html.escape(t["label"])}</text>')
        if t["reached"]:
            s2 = f'{target:.0%} at {t["time_to_target_s"]:.0f} s, {t["epochs_to_target"]:.2f} epochs'
        else:
            s2 = f'not reached: {t["trained_epochs"]:.2f} epochs, {t["trained_s"] or 0:.0f} s'
        s3 = f'best {t["best_accuracy"] or 0:.3f}, last {t["last_accuracy"] or 0:.3f}'
        o.append(f'<text x="{lx + 30}" y="{ly + 18}" font-size="11">{html.escape(s2)}</text>')
        o.append(f'<text x="{lx + 30}" y="{ly + 31}" font-size="11">{html.escape(s3)}</text>')
        ly += 48
    o += rings
    o.append("</svg>")
    open(path, "w").write("\n".join(o) + "\n")


if __name__ == "__main__":
    main()
