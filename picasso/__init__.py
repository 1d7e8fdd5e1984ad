"""picasso: plan, simulate and run hybrid-parallel training of wide-and-deep models.

`import picasso` gives the loop as functions (picasso/api.py): analyze, plan, simulate,
sweep, run, compare. They import the layers when called, so the command starts fast."""

from picasso.api import analyze, compare, plan, run, simulate, sweep

__all__ = ["analyze", "compare", "plan", "run", "simulate", "sweep"]
__version__ = "0.1.0"
