"""EnvACE as a verl 0.9.1 extension (GPU path). Importing this package registers, in the importing
process, the agent loop ``envace_rehearsal``, the advantage estimator ``envace_role_wise`` and the
trainer mode ``envace_sync``; ``VERL_USE_EXTERNAL_MODULES=envace.verl_ext`` (set by
:mod:`envace.verl_ext.launch`) makes ``import verl`` import it in every Ray process.

Layout choice — per-generation rows: each ACT turn and each REHEARSE reply is its own training row
(prompt = the context it was sampled from, response = its tokens), as in the authors' code. The
alternative, one sequence per trajectory with per-token role ids, cannot keep the REHEARSE context (a
fresh chat holding privileged reference pairs) separate from the ACT context. verl 0.9.1's v1 agent-loop
worker already stores a ``list[AgentLoopOutput]`` as separate rows and pads sampled batches with masked
``is_padding`` rows, so no worker fork is needed; the role reaches the advantage through role-aware group
ids (``<uid>::<role>``) set by a narrow trainer subclass (:mod:`.trainer`), because verl passes estimators
only the uid.

Per-role policy (``per_role_8b``) — NOT IMPLEMENTED, plan: verl trains one actor per trainer. The cleanest
route without a fork is one LoRA-free second policy served as an *external* rehearser: two verl trainers
(ACT, REHEARSE) alternating phases over a shared rollout cache is a fork-sized change; instead run the ACT
policy with ``envace.mode=external_simulator`` pointing at a second vLLM server whose weights are
updated from a second trainer that consumes only REHEARSE rows. :func:`envace.verl_ext.launch.launch`
refuses this run with a clear message until that exists.
"""

from envace.verl_ext import advantage, agent_loop, trainer  # noqa: F401  (registration side effects)
