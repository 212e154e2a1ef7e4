"""Acting and learning: base model, LoRA population, generation backends, advantage estimators,
policy-gradient trainer and the rollout/update loop."""
