"""Layer 1, the EnvACE algorithm: the tool-call protocol (:mod:`.tools`), the environment and episode
interfaces (:mod:`.environment`), rehearsal (:mod:`.rehearsal`), the ACT/REHEARSE rollout
(:mod:`.rollout`), one episode against a real environment (:mod:`.episode`), role-wise advantages
(:mod:`.advantage`), reward rules (:mod:`.reward`), test-time scaling (:mod:`.tts`) and rehearsal
fidelity scoring (:mod:`.fidelity`), with their prompts (:mod:`.prompts`).

Imports only :mod:`envace.common`: no training or serving framework (verl, vLLM, torch), no benchmark
adapter (``tests/test_architecture.py``)."""
