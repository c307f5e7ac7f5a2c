"""VitaBench adapter (delivery, instore, ota, cross_domain) for the source-installed ``vita`` package.

VitaBench (meituan-longcat/vitabench) is not on PyPI (the PyPI ``vita`` is another package). Verified
against commit ``96f3b8529d8ea38d330de2405af7e32a1454f6cd`` (2025-11-06, package version 0.0.1),
installed with ``pip install --no-deps`` plus its missing runtime dependencies (``thefuzz``,
``rapidfuzz``, ``holidays``, ``json-repair``). Its task files (``<data_dir>/<domain>/tasks_en.json`` for
English, ``tasks.json`` for Chinese; 100 tasks each, in the repository's ``data/vita/domains``) carry a
per-task database (``environment``), a user profile and instructions for the simulated user, and
natural-language rubrics (``evaluation_criteria.expected_states[].state_rubrics`` and
``overall_rubrics``) that an LLM judge checks against the conversation.

Implemented:
- :func:`parse_task` / :func:`load_task_file` — validation of the task format with clear errors.
- :func:`collect_rubrics` — the rubric list (state rubrics, then overall rubrics, first occurrence
  only), the order in which the judge indexes them as ``rubric_0, rubric_1, ...``.
- The rubric judge (VitaBench's default ``trajectory`` evaluation, ``TrajectoryEvaluator``): the
  conversation is cut into windows of 10 messages overlapping by 2 (:func:`sliding_windows`); each
  window is judged with vita's own sliding-window prompt (task time + weekday, user instruction, window
  i of n) and the current rubric states; a verdict of a later window replaces an earlier one
  (:func:`apply_verdicts`); reward 1 iff every rubric is met (and there is at least one), with the met
  fraction as a sub-score (:func:`score_from_verdicts`). :func:`parse_judge_output` reads the judge's
  JSON list of ``{"rubric_idx", "justification", "meetExpectation"}`` (broken JSON is repaired with
  ``json_repair`` when installed, as vita does); an unparsable answer keeps the current states, an entry
  without ``meetExpectation`` keeps that rubric's state, as vita does.
- :class:`VitaEpisode` — the episode protocol over a :class:`ToolBackend` (the vita environment in
  real runs, a stand-in in tests): VitaBench's fixed greeting opens, the simulated user answers it;
  agent calls by parsed name + arguments only, through vita's ``Environment.get_response`` (an unknown
  tool, bad arguments or any exception become vita's ``"Error: ..."`` observation); an LLM user
  simulator with vita's system prompt through an OpenAI-compatible endpoint; ``###STOP###`` /
  ``###TRANSFER###`` / ``###OUT-OF-SCOPE###`` from the user, or ``###STOP###`` in the agent's reply,
  end the conversation (vita's ``USER_STOP`` / ``AGENT_STOP``). Tool errors are counted (``extra``) but
  do not zero the reward: vita's orchestrator declares ``max_errors=10`` but never counts errors.
- The vita environment (:class:`_VitaToolBackend`): built as ``vita.run`` builds it (the registered
  domain constructor, ``get_cross_environment("delivery,instore,ota", ...)`` for cross-domain), in a
  worker thread of its own whose vita registries (stores, products, locations: per-thread class-level
  state that the tools read) are reset first, as vita resets them per simulation; every call runs in
  that thread, so interleaved episodes in one process do not share state. vita's loguru logging and
  its import-time prints are silenced.

Verified here with the real package (``tests/bench_vitabench/test_real_vita.py``; CPU): tasks of all
four splits load (hand-made fixtures valid for vita's databases; real records of delivery and instore)
with the agent system prompt, tool schemas and user-simulator prompt equal to what vita builds; valid
calls create orders in every split's database (the cross-domain one reaching both delivery and hotel
tools), an unknown tool, an unexpected and a missing argument give vita's error observations;
interleaved episodes stay isolated; the gold orders of the real records replay to orders with the
gold store, products, quantities, price and payment state; our rubric judge sends the same system
prompts, window transcripts and rubric states as vita's ``TrajectoryEvaluator`` and reaches the same
verdicts, reward and fraction given the same scripted judge answers; the agent stop token ends the
conversation; the gold orders of the real records also pass through the full evaluation runner
(:func:`envace.bench.selfcheck.replay_gold`, scripted agent, rule judge: 3/3). Over the release's
delivery and instore task files (200 tasks, English; the Chinese ones load too) 904 of 941 replayable
gold orders replay exactly (the others are inconsistent gold records: a price differing from the
store's, a stray space in a time, a product missing from the store). The OTA and cross-domain task
files (over 4 MiB) could not be fetched here: those splits are verified on hand-made tasks only.

Not verified here: the LLM user simulator and the LLM judge end to end (only scripted ones and a
stand-in OpenAI client), an evaluation with a served model, and the OTA / cross-domain release tasks.

Simplifications (ours): the protocol's static ``Task.first_user`` cannot hold a sampled message, so it
is ``""`` and the runner must call :meth:`VitaEpisode.first_user_message` (the user simulator answers
VitaBench's greeting; ``Task.meta["first_user_from_episode"]``). Each agent tool call is recorded as
its own assistant message (vita keeps parallel calls in one message, which shifts the judge's window
boundaries for turns with several calls). A user-simulator turn without text is asked again (vita
would fail and retry the whole task). Locations are reset per episode (vita keeps them across the
tasks one worker thread runs). vita's order ids hash the wall-clock time, so they differ between runs.
vita sets its prompt language process-wide: run one language per process.

Modules: :mod:`.tasks` (the vita package import, task files and their parsing), :mod:`.judge` (the
rubric judge), :mod:`.episode` (vita environments and one conversation), :mod:`.adapter` (the
registered adapter).
"""
