"""simulator/: hardware specs, operator graphs, cost models and two engines (fast, simpy).

Knows nothing of recommendation models: it simulates operator graphs on hardware.
"""

from simulator.cost import RESOURCES, collective_cost, op_busy, op_cost_us, resource_capacity
from simulator.engine import ENGINES, simulate
from simulator.hardware import PRESETS, HardwareError, HardwareSpec, load_hardware, parse_quantity
from simulator.opgraph import COLLECTIVE_TYPES, Collective, OpGraph, OpGraphError
from simulator.result import SimResult
from simulator.symmetry import fold_symmetric
from simulator.timeline import Event, Timeline

__all__ = [
    "COLLECTIVE_TYPES", "ENGINES", "PRESETS", "RESOURCES", "Collective", "Event", "HardwareError",
    "HardwareSpec", "OpGraph", "OpGraphError", "SimResult", "Timeline", "collective_cost", "load_hardware",
    "fold_symmetric", "op_busy", "op_cost_us", "parse_quantity",
    "resource_capacity", "simulate",
]
