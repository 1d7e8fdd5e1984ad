"""picasso: plan, simulate and run hybrid-parallel training of wide-and-deep models."""

__version__ = "0.1.0"
