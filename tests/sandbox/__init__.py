"""Tests of populora_env.sandbox (hostile corpus, API semantics, soak)."""
