"""Render per-layer diagnostics (plain data from tuner.worker.diagnostics.diagnose) for people.

Two readings of the same findings: ``conclusions``, every finding on a line of its own (the
records: ``diagnostics.md`` in the MLflow parent run, and ``diagnose --all``), and
``console_lines``, what a person reads before the first trial: one line per layer, its worst
finding and how many more, the features that are zero to float32 as well left out (counted on
one line; tuner.worker.diagnostics.continuous_inputs.negligible says why they lose nothing).
"""

from __future__ import annotations

from typing import Any

from tuner.judging.erasure import severity, step_text, values_text
from tuner.judging.underflow import gradient_histograms, underflow_note

HEADERS = ["layer", "class", "act max", "act >f16 max", "act <f16 normal", "grad max",
           "grad <f16 min", "w-grad flushed @1", "w-grad flushed @rec", "bf16 err", "risk"]


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{100 * value:.3g}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def rows(diagnostics: dict[str, Any], limit: int | None = None) -> list[list[str]]:
    layers = sorted(diagnostics["layers"], key=lambda layer: (-layer["risk"], layer["layer"]))
    table = []
    for layer in layers[:limit]:
        # No activation gradients where the train_step's losses are out of reach
        # (tuner.worker.diagnostics.diagnose_steps): shown as "-".
        act, grad = layer["activation"], layer["gradient"] or {}
        table.append([layer["layer"], layer["class"], _num(act["abs_max"]),
                      _pct(act["overflow_fraction"]), _pct(act["subnormal_fraction"]),
                      _num(grad.get("abs_max")), _pct(grad.get("underflow_fraction")),
                      *_flushed(layer),
                      _pct(act["bf16_rel_error"]), f"{layer['risk']:.2f}"])
    return table


def _flushed(layer: dict[str, Any]) -> list[str]:
    """The share of the layer's weight gradients float16 flushes to zero at scale 1 and at
    the recommended scale (diagnostics from before the histograms: scale 1 only)."""
    flushed, wgrad = layer.get("weight_gradient_flushed"), layer["weight_gradient"]
    if flushed:
        return [_pct(flushed["at_1"]), _pct(flushed["at_recommended"])]
    return [_pct(wgrad["underflow_fraction"]) if wgrad else "-", "-"]


def describe_integers(entry: dict[str, Any]) -> str:
    """``token_embedding (TokenEmbedding) receives integer-valued floats up to 4999``"""
    return (f"{entry['layer']} ({entry['class']}) receives integer-valued floats up to "
            f"{entry['max']:.0f}")


def describe_continuous(entry: dict[str, Any]) -> str:
    """``normalization (Normalization) receives feature 0 (values -122.5..-121.8, spread 0.20):
    bfloat16's step there is 0.5, 2 of 192 distinct values survive, so a bfloat16 config must
    keep normalization in float32``"""
    which = "" if entry["input"] == 0 else f" of its float input {entry['input']}"
    losses = "; ".join(f"{dtype}'s {step_text(entry, dtype)}, {entry['survive'][dtype]} of "
                       f"{entry['distinct']} distinct values survive"
                       for dtype in entry["erased_in"])
    configs = entry["erased_in"][0] if len(entry["erased_in"]) == 1 else "16-bit"
    return (f"{entry['layer']} ({entry['class']}) receives feature {entry['feature']}{which} "
            f"({values_text(entry)}): {losses}, so a {configs} config must keep "
            f"{entry['layer']} in float32")


def describe_negligible(entry: dict[str, Any]) -> str:
    """``stem (Dense) receives feature 6 (values -3e-21..2.5e-21, spread 1e-21): float16
    rounds its 192 distinct values all to 0, but next to the 1.01e+03 its input also carries
    it is zero to float32 too, so it keeps stem in no config's float32``"""
    which = "" if entry["input"] == 0 else f" of its float input {entry['input']}"
    return (f"{entry['layer']} ({entry['class']}) receives feature {entry['feature']}{which} "
            f"({values_text(entry)}): float16 rounds its {entry['distinct']} distinct values "
            "all to 0, but next to the "
            f"{entry['input_abs_max']:.3g} its input also carries it is zero to float32 too, "
            f"so it keeps {entry['layer']} in no config's float32")


def describe_head(entry: dict[str, Any]) -> str:
    """``output 0 (price, Dense) must produce targets 3.4e+04..6.1e+05 (targets up to 6.1e+05
    pass float16's 65504 / 4 headroom), so every float16 config keeps price in float32``"""
    dtypes = " and ".join(entry["needs_float32_in"])
    whys = "; ".join(entry["needs_float32_in"].values())
    return (f"output {entry['output']} ({entry['layer']}, {entry['class']}) must produce "
            f"targets {entry['min']:.3g}..{entry['max']:.3g} ({whys}), so every {dtypes} "
            f"config keeps {', '.join(entry['layers'])} in float32")


def _integer_line(entry: dict[str, Any]) -> str:
    return (f"{describe_integers(entry)}: bfloat16 holds integers exactly only up to 256, "
            f"float16 up to 2048, so a 16-bit config must keep {entry['layer']} in float32 "
            "(or feed it int32)")


def _by_layer(entries: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Entries grouped by layer, in order of first appearance, each group worst first."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(entry["layer"], []).append(entry)
    return {layer: sorted(group, key=severity) for layer, group in groups.items()}


def _unrecorded(group: list[dict[str, Any]]) -> int:
    """How many of a layer's features the worker counted but did not keep one by one."""
    return max(0, group[0].get("of_layer", len(group)) - len(group))


def _layer_findings(diagnostics: dict[str, Any]) -> dict[str, tuple[list[str], int]]:
    """Per layer (integer inputs' layers first, then the continuous ones', in call order): its
    findings' lines, worst first, and how many findings it has, those not recorded one by one
    included."""
    lines: dict[str, list[str]] = {}
    total: dict[str, int] = {}
    for entry in diagnostics.get("integer_inputs", []):
        lines.setdefault(entry["layer"], []).append(_integer_line(entry))
        total[entry["layer"]] = total.get(entry["layer"], 0) + 1
    for layer, group in _by_layer(diagnostics.get("continuous_inputs", [])).items():
        lines.setdefault(layer, []).extend(describe_continuous(entry) for entry in group)
        total[layer] = total.get(layer, 0) + len(group) + _unrecorded(group)
    return {layer: (lines[layer], total[layer]) for layer in lines}


def _opening(diagnostics: dict[str, Any]) -> list[str]:
    candidates = diagnostics["candidates"]
    return ["float32 placement candidates (riskiest first): "
            + (", ".join(candidates[:8]) if candidates else "none: every layer fits float16")]


def _closing(diagnostics: dict[str, Any]) -> list[str]:
    """The output heads, the recommended loss scale and what float16 flushes at it."""
    scale = diagnostics["loss_scale"]
    lines = [describe_head(entry) for entry in diagnostics.get("output_heads", [])]
    lines.append(f"recommended initial loss scale: 2^{scale['exponent']} "
                 f"(largest weight gradient {diagnostics['gradient_abs_max']:.3g}; "
                 + ("it lifts the smallest gradients out of float16's subnormal range)"
                    if scale["lifts_p01_to_normal"] else
                    "the smallest 1% of gradients stay subnormal in float16 even so)"))
    histograms = gradient_histograms(diagnostics)
    for at in sorted({1.0, float(scale["initial_scale"])}):
        flushed = underflow_note(histograms, at)
        if flushed:
            lines.append(flushed)
    return lines


def _not_taken(diagnostics: dict[str, Any]) -> list[str]:
    return [f"not taken: {diagnostics['unavailable']}; the search runs on the space as "
            "written, with Keras's initial loss scale"]


def conclusions(diagnostics: dict[str, Any]) -> list[str]:
    """Every finding on a line of its own: the records' reading (``markdown``)."""
    if diagnostics.get("unavailable"):
        return _not_taken(diagnostics)
    lines = _opening(diagnostics)
    for layer, (found, total) in _layer_findings(diagnostics).items():
        lines += found
        if total > len(found):
            lines.append(f"{layer}: {total - len(found)} more features like these (the "
                         "diagnostics keep the worst few of a layer one by one)")
    lines += [describe_negligible(entry) for entry in diagnostics.get("negligible_inputs", [])]
    return lines + _closing(diagnostics)


def console_lines(diagnostics: dict[str, Any]) -> list[str]:
    """What a person reads before the first trial: one line per layer, its worst finding and
    how many more (``N more``), and one line counting the features left out as zero to
    float32 too (``negligible_inputs``); ``conclusions`` holds every line."""
    if diagnostics.get("unavailable"):
        return _not_taken(diagnostics)
    lines = _opening(diagnostics)
    for found, total in _layer_findings(diagnostics).values():
        lines.append(found[0] + (f" (and {total - 1} more of its input features)"
                                 if total > 1 else ""))
    zero = _by_layer(diagnostics.get("negligible_inputs", []))
    if zero:
        counts = {layer: len(group) + _unrecorded(group) for layer, group in zero.items()}
        largest = max(max(abs(e["min"]), abs(e["max"])) for g in zero.values() for e in g)
        left = sum(counts.values())
        lines.append(f"left out: {left} input feature{'s' if left > 1 else ''} that float16 "
                     f"rounds to 0 but that float32 drops too (at most {largest:.2g}, next to "
                     "values 2^24 times larger in the same input): "
                     + ", ".join(f"{layer} ({count})" for layer, count in counts.items()))
    return lines + _closing(diagnostics)


def markdown(diagnostics: dict[str, Any]) -> str:
    out = ["# per-layer diagnostics (float32 steps)", ""]
    out += [f"- {line}" for line in conclusions(diagnostics)]
    out += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(row) + " |" for row in rows(diagnostics)]
    return "\n".join(out) + "\n"


def print_table(diagnostics: dict[str, Any], console, limit: int | None = 25,
                every_finding: bool = False) -> None:
    """The per-layer table (the ``limit`` riskiest rows), then ``console_lines``, or with
    ``every_finding`` every line of ``conclusions``."""
    from rich.table import Table

    table = Table(title="per-layer ranges in float32, worst first (>f16 max: would overflow; "
                        "<f16 min, flushed: would flush to zero, at loss scale 1 or at the "
                        "recommended scale)")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in ("layer", "class") else "right",
                         overflow="fold")
    from rich.markup import escape

    for row in rows(diagnostics, limit):
        table.add_row(*map(escape, row), style="red" if float(row[-1]) >= 1 else None)
    console.print(table)
    hidden = len(diagnostics["layers"]) - (limit or len(diagnostics["layers"]))
    if hidden > 0:
        console.print(f"({hidden} more layers with lower risk not shown)")
    for line in (conclusions if every_finding else console_lines)(diagnostics):
        console.print(line, markup=False)
