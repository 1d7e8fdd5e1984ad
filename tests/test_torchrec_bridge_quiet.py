"""With TorchRec installed, `picasso plan` prints none of TorchRec's own warnings or log lines
(its import, its Topology, its planner's FutureWarnings): the bridge silences them while only
TorchRec's code runs, and picasso's own messages still reach the user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a TorchRec that talks as the real one does: warnings and log lines from its import and its planner
FAKE = {
    "torchrec/__init__.py": "import logging, warnings\n"
                            "warnings.warn('torchrec import warning', UserWarning)\n"
                            "logging.getLogger('torchrec.distributed').warning('torchrec import log line')\n",
    "torchrec/distributed/__init__.py": "",
    "torchrec/distributed/embeddingbag.py": "class EmbeddingBagCollectionSharder:\n"
                                            "    def __init__(self, fused_params=None): pass\n",
    "torchrec/distributed/planner/types.py": "class PlannerError(Exception): pass\n",
    "torchrec/distributed/planner/__init__.py":
        "import logging, warnings\n"
        "from torchrec.distributed.planner.types import PlannerError\n"
        "class ParameterConstraints:\n    def __init__(self, **kw): pass\n"
        "class Topology:\n    def __init__(self, **kw):\n"
        "        logging.getLogger('torchrec.distributed.planner.types').warning("
        "'The topology was constructed directly rather than via TopologyFactory')\n"
        "class EmbeddingShardingPlanner:\n    def __init__(self, **kw):\n"
        "        warnings.warn('HeuristicalStorageReservation: deprecated', FutureWarning)\n"
        "    def plan(self, module, sharders):\n"
        "        warnings.warn('meta tensors', UserWarning)\n"
        "        raise PlannerError('no plan fits (fake)')\n",
    "torchrec/modules/__init__.py": "",
    "torchrec/modules/embedding_configs.py": "class DataType:\n    FP32 = FP16 = BF16 = 'x'\n"
                                             "class PoolingType:\n    MEAN = SUM = 'x'\n"
                                             "class EmbeddingBagConfig:\n    def __init__(self, **kw): pass\n",
    "torchrec/modules/embedding_modules.py": "class EmbeddingBagCollection:\n"
                                             "    def __init__(self, tables, device): pass\n",
    "fbgemm_gpu/__init__.py": "",
    "fbgemm_gpu/split_embedding_configs.py": "class EmbOptimType:\n    EXACT_ROWWISE_ADAGRAD = 'x'\n",
}


def _plan(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    for name, text in FAKE.items():
        (tmp_path / "site" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}", "PYTHONWARNINGS": "default"}
    return subprocess.run([sys.executable, "-m", "picasso", "plan", "--model", "dlrm-criteo-kaggle", "--hardware",
                           "local-cpu", "--row-cap", "1000", "--time-budget", "1", "-o", str(tmp_path / "plan.json"),
                           *flags], env=env, capture_output=True, text=True, timeout=300)


def test_plan_prints_none_of_torchrecs_warnings(tmp_path):
    res = _plan(tmp_path, "--explain")
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    for said in ("torchrec import", "topology was constructed", "HeuristicalStorageReservation", "meta tensors"):
        assert said not in out, out
    assert "no --profile" in res.stderr  # picasso's own note still shows


def test_the_torchrec_baseline_fails_in_one_line(tmp_path):
    res = _plan(tmp_path, "--baseline", "torchrec")
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and err == ["picasso plan: error: TorchRec's planner found no plan: no plan fits (fake)"]
