"""picasso: plan, simulate and run hybrid-parallel training of wide-and-deep models.

`import picasso` gives the loop as functions (picasso/api.py): analyze, plan, simulate,
sweep, run, compare, and the trained model out: export_model, load_model, score. They import
the layers when called, so the command starts fast."""

from picasso.api import analyze, compare, export_model, load_model, plan, run, score, simulate, sweep

__all__ = ["analyze", "compare", "export_model", "load_model", "plan", "run", "score", "simulate", "sweep"]


def __getattr__(name: str) -> str:
    if name == "__version__":  # the installed package's, as `picasso --version` says it
        from picasso.cli import version

        return version()
    raise AttributeError(f"module 'picasso' has no attribute {name!r}")
