"""Register envace's verl components in this process (imported through ``VERL_USE_EXTERNAL_MODULES``).

The agent loop ``envace_rehearsal`` (:mod:`.agent_loop`), the advantage estimator ``envace_role_wise``
(:mod:`.advantage`) and the trainer modes ``envace_sync`` (:mod:`.trainer`) and ``envace_per_role_sync``
(:mod:`.per_role_trainer`) register themselves with verl when imported.
"""

from envace.verl_ext import advantage, agent_loop, per_role_trainer, trainer  # noqa: F401
