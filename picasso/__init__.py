"""picasso: plan, simulate and run hybrid-parallel training of wide-and-deep models.

`import picasso` gives the loop as functions (picasso/api.py): analyze, plan, simulate,
sweep, run, compare, and the trained model out: export_model, load_model, score. They import
the layers when called, so the command starts fast."""

from picasso.api import analyze, compare, export_model, load_model, plan, run, score, simulate, sweep

__all__ = ["analyze", "compare", "export_model", "load_model", "plan", "run", "score", "simulate", "sweep"]
__version__ = "0.1.0"
