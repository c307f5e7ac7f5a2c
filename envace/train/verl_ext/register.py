"""Register envace's verl components in this process (imported through ``VERL_USE_EXTERNAL_MODULES``).

The agent loop ``envace_rehearsal`` (:mod:`.agent_loop`), the advantage estimator ``envace_role_wise``
(:mod:`.advantage`) and the trainer modes ``envace_sync`` (:mod:`.trainer`) and ``envace_per_role_sync``
(:mod:`.per_role_trainer`) register themselves with verl when imported. verl's vLLM rollout classes are
replaced, by name, with :mod:`.weight_sync`'s (weight-sync sockets named per Ray cluster); that module is
imported only where verl builds a rollout. First, the installed verl must be the one every verl member
they depend on was checked against (:mod:`.coupling`).
"""

import importlib

from envace.train.verl_ext.coupling import check_verl_version

check_verl_version()

from verl.workers.rollout.base import _ROLLOUT_REGISTRY  # noqa: E402
from verl.workers.rollout.replica import RolloutReplicaRegistry  # noqa: E402

from envace.train.verl_ext import advantage, agent_loop, per_role_trainer, trainer  # noqa: E402, F401

_WEIGHT_SYNC = "envace.train.verl_ext.weight_sync"
_ROLLOUT_REGISTRY[("vllm", "async")] = f"{_WEIGHT_SYNC}.EnvaceServerAdapter"
RolloutReplicaRegistry.register("vllm", lambda: importlib.import_module(_WEIGHT_SYNC).EnvaceReplica)
