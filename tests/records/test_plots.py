"""The job's plots (tuner.records.plots), drawn from a scripted job: every plot that applies is a
PNG, and drawing them leaves matplotlib's global state alone (a notebook that calls
tuner.tune() keeps its own backend)."""

import matplotlib

from tests.run.test_confirm import FAST, _late_plateau, tune
from tests.support.scripted import Machine
from tuner.records.plots import make_all
from tuner.records.results import TuneSummary

DIAGNOSTICS = {"layers": [
    {"layer": "dense", "risk": 0.4, "activation": {"overflow_fraction": 0.4}},
    {"layer": "softmax", "risk": 0.1, "gradient": {"underflow_fraction": 0.1}}]}


def test_the_plots_are_drawn_without_touching_the_callers_matplotlib_backend(tmp_path):
    machine = Machine(step_ms=lambda c: FAST[c.policy], seed=1, val_loss=_late_plateau(()))
    scheduler, outcome, _ = tune(tmp_path, machine)
    summary = TuneSummary(rows=scheduler.rows, best=outcome.winner, baseline=scheduler.rows[0],
                          estimate=None, wall_s=1.0, train_s=1.0, run_dir=tmp_path,
                          parent_run_id=None, tracking_uri="",
                          confirmations=outcome.confirmations)
    before = matplotlib.get_backend()
    matplotlib.use("svg")   # a backend of the caller's, not the one PNGs are drawn with
    try:
        made = make_all(summary, DIAGNOSTICS, tmp_path / "plots")
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert {p.name for p in made} >= {"speed_vs_stability.png", "loss_curves.png",
                                      "confirmation.png", "diagnostics.png"}
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_long_y_tick_labels_leave_the_axis_label_inside_the_figure(tmp_path):
    """One-panel plots take fixed margins (no layout pass); ticks such as 0.99990 once pushed
    the y label out of the picture."""
    from tuner.records.plots import _figure, _save

    for values, offset in (([1.0, 0.99989], False), ([2.5e5, 2.5e5 + 0.75], False),
                           ([0.1, 0.2], True)):
        figure, axes = _figure((8, 5))
        axes.plot([0, 1], values)
        axes.ticklabel_format(axis="y", useOffset=offset)
        axes.set_ylabel("share of float32's loss decrease")
        _save(figure, tmp_path / "plot.png")
        figure.canvas.draw()      # at the figure's own dpi: the margins are fractions of it
        label = axes.yaxis.label.get_window_extent()
        assert label.x0 >= 0, (values, label)   # matplotlib sets it beside the tick labels
