"""PopuLoRA-Env: the teacher/student coding game as a PettingZoo parallel environment.

This package (the game) never imports torch: it works with any learning framework.
"""
