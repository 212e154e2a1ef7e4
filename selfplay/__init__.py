"""The run layer: configuration, the self-play loop (the single controller of a run), checkpoints and logging.

``config`` (the run config; its ``env`` section is the env's own :class:`populora_env.EnvConfig`), ``plugins``
(user modules imported before validation), ``mapping`` (which adapter acts for which env agent), ``rollouts``
(a finished round -> each member's rollouts, joined by completion id), ``loop``, ``run``, ``resume`` (new run or
resume, decided once; what a checkpoint holds), ``checkpoint`` (atomic checkpoint directories), ``logger`` and
``tags`` (every TensorBoard tag name). Nothing here knows whether it runs a population or a
baseline: the ``populora`` command chooses the config and the agent assignment.
"""
