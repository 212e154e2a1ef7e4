"""LoRA weight-space evolution: exact low-rank SVD, mutation/crossover operators, the PBT replacement step."""
