"""The report's Training section: hyperparameters and seeds (the train run's ``run.started``), tokens
seen and FLOPs (derived facts), the training curves (its ``metric`` records, drawn as SVG) and the
final loss."""

from __future__ import annotations

from typing import Any

from marin import hashing
from marin.report.facts import Context, Facts, esc
from marin.report.figures import figure_svg
from marin.report.page import Page, table

CURVES = (("loss", "Loss"), ("lr", "Learning rate"), ("grad_norm", "Gradient norm (before clipping)"))


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """Fact ids of the hyperparameters, seeds, tokens seen, FLOPs, wall time and final loss; the curves'
    values with the metric records they were read from."""
    log = c.logs["train"]
    s, fin, started = log.start, log.end, log.start_body
    hp = {k: f.cite(f"train.{k}", log, s, f"/body/params/train/{esc(k)}").id for k in started["params"]["train"]}
    seeds = {"root": f.cite("root seed", log, s, "/body/seeds/root").id,
             "derivation": f.cite("seed derivation", log, s, "/body/seeds/derivation").id,
             "streams": {n: f.cite(f"seed stream {n} (fold_in)", log, s, f"/body/seeds/streams/{esc(n)}/fold_in").id
                         for n in sorted(started["seeds"].get("streams", {}))}}
    items = f.items
    seq_len = f.cite("model.seq_len", log, s, "/body/params/model/seq_len")
    tokens = f.derive("tokens seen in training", "steps × batch_size × seq_len",
                      [items[hp["steps"]], items[hp["batch_size"]], seq_len])
    flops = f.derive("training compute (FLOPs, 6·N·D estimate)", "6 × parameters × tokens seen",
                     [items[c.doc["model"]["n_params"]], tokens])
    metrics = log.of_kind("metric")
    out = {"hyperparameters": hp, "seeds": seeds, "tokens_seen": tokens.id, "flops": flops.id, "curve": _curve(c),
           "wall_s": f.cite("train wall time (s)", log, fin, "/body/wall_s").id,
           "checkpoints": len(log.bodies("checkpoint"))}
    if metrics:
        out["final_loss"] = f.cite("final training loss", log, metrics[-1], "/body/values/loss/value").id
        out["final_step"] = f.cite("final logged step", log, metrics[-1], "/body/step").id
    return out


def _curve(c: Context) -> dict[str, Any]:
    """The values the figures plot, and the metric records (seq, digest) they come from."""
    log = c.logs["train"]
    metrics = log.of_kind("metric")
    bodies = [r.body_as("metric") for r in metrics]
    return {"run_id": log.run_id, "records": [{"seq": r.seq, "digest": r.digest} for r in metrics],
            "step": [b["step"] for b in bodies],
            **{k: [b["values"][k]["value"] for b in bodies] for k in ("loss", "lr", "grad_norm")},
            "val_loss": [b["values"]["val_loss"]["value"] if "val_loss" in b["values"] else None for b in bodies]}


def lines(p: Page) -> list[str]:
    m, tr, v = p.doc["model"], p.doc["training"], p.v
    out = ["## Training", "", "### Architecture and hyperparameters", ""]
    arch, hp = list(m["architecture"].items()), list(tr["hyperparameters"].items())
    rows = [[*(arch[i] if i < len(arch) else ("", None)), *(hp[i] if i < len(hp) else ("", None))]
            for i in range(max(len(arch), len(hp)))]
    out += table(["model", "value", "train", "value"],
                 [[str(a), v(fa) if a else "", str(h), v(fh) if h else ""] for a, fa, h, fh in rows])
    s = tr["seeds"]
    out += [f"Seeds: root {v(s['root'])}; derivation {v(s['derivation'])}; streams "
            + ", ".join(f"`{n}` {v(fid)}" for n, fid in s["streams"].items()) + ".", "", "### Training curves", ""]
    c = tr["curve"]
    for key, title in CURVES:
        what = "training loss and, in blue, the validation loss on a fixed batch of validation windows" \
            if key == "loss" and any(x is not None for x in c.get("val_loss", [])) else title.lower()
        out += [f"![{title}](figures/{key}.svg)", "",
                f"*{what[0].upper() + what[1:]}: the {len(c['step'])} metric records of run `{c['run_id']}` "
                f"([figure source](#figure-{key})).*", ""]
    if "final_loss" in tr:
        out += [f"Final training loss {v(tr['final_loss'])} at step {v(tr['final_step'])}.", ""]
    return out


def figure_source(curve: dict[str, Any]) -> str:
    """Digest over the metric records a figure plots (their record digests, in order)."""
    return hashing.json_digest([r["digest"] for r in curve["records"]])


def figures(doc: dict[str, Any]) -> dict[str, str]:
    """The training curves, by key: SVG text, the same for the same values."""
    return {key: figure_svg(doc["training"]["curve"], key, title) for key, title in CURVES}
