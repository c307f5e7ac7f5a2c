"""Layer 0, foundations every layer may import: the experiment config and its schema (:mod:`.config`),
result files and manifests (:mod:`.results`), atomic writes (:mod:`.atomic`), bootstrap statistics
(:mod:`.stats`), the OpenAI-compatible client set-up (:mod:`.openai_client`) and the exit statuses
(:mod:`.exit_codes`). Imports nothing else of envace."""
