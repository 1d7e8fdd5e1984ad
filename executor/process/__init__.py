"""Processes of a run: the agent that starts ranks, the rendezvous, spawning, process trees, threads and memory."""
