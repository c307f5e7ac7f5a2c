"""Layer 4, training: CM2 records to verl's parquet (:mod:`.data`), the SFT warm start of the smoke
model (:mod:`.warmstart`), the checklist judge client (:mod:`.judge`), verl's reward entry point
(:mod:`.reward_fn`) and EnvACE as a verl extension (:mod:`.verl_ext`)."""
