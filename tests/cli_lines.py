"""The command line's contract for bad input, as the tests check it."""

from __future__ import annotations

from picasso.cli import main


def refused(capsys, argv, needle: str) -> str:
    """Run `picasso argv` in-process: exit 2 with one line on stderr holding `needle`; returns it."""
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    return err[0]
