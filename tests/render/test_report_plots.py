"""The memory plot of a report (kvplan.render.report_plots): the legend beside the bars, one segment per budget term."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("gpus", [["H100"], ["H100", "A100-40GB", "L4"], ["H100", "H200", "A100-40GB", "L4", "L40S",
                                                                          "MI300X", "B200"]])
def test_the_memory_plot_legend_clears_the_axis_label(gpus):
    pytest.importorskip("matplotlib")
    import kvplan
    from kvplan.render.report_plots import _pyplot, memory_figure

    report = kvplan.sweep({"defaults": {"model": "meta-llama/Llama-3.1-8B"}, "sweep": {"gpu": gpus}})
    fig, _ = memory_figure(report)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    for label in (ax.xaxis.label, ax.title):
        assert not legend.overlaps(label.get_window_extent()), label.get_text()
    assert not legend.overlaps(ax.get_window_extent())  # beside the bars, not over them
    names = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "overhead" in names and "cudagraph" in names and not any("+" in n for n in names)
    _pyplot().close(fig)
