"""Text generation with a loaded policy: the model loader, batched decoding, drafts, shared
prefixes and the CTranslate2 engine. Training (rollouts, evaluation) and serving use it."""
