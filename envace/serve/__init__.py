"""Layer 3, models that generate: vLLM's OpenAI server as a managed process (:mod:`.vllm_server`),
generation backends over it or over Hugging Face ``generate`` (:mod:`.backends`), and the in-process
tiny smoke model (:mod:`.tiny_model`)."""
