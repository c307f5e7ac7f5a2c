"""Register envace's verl components in this process (imported through ``VERL_USE_EXTERNAL_MODULES``).

The agent loop ``envace_rehearsal`` (:mod:`.agent_loop`), the advantage estimator ``envace_role_wise``
(:mod:`.advantage`) and the trainer modes ``envace_sync`` (:mod:`.trainer`) and ``envace_per_role_sync``
(:mod:`.per_role_trainer`) register themselves with verl when imported. First, the installed verl must be
the one every verl member they depend on was checked against (:mod:`.coupling`).
"""

from envace.train.verl_ext.coupling import check_verl_version

check_verl_version()

from envace.train.verl_ext import advantage, agent_loop, per_role_trainer, trainer  # noqa: E402, F401
