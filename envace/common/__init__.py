"""Layer 0, foundations every layer may import: the experiment config and its schema (:mod:`.config`),
result files, manifests and atomic writes (:mod:`.results`), bootstrap statistics (:mod:`.stats`) and the
OpenAI-compatible client set-up (:mod:`.openai_client`). Imports nothing else of envace."""
