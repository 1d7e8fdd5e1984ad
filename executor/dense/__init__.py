"""The dense side of a step: each arch's model, the interaction, dense optimizers and precision."""
