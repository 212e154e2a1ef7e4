"""An advantage estimator of your own, as a plugin: a group-median baseline.

For completion ``i`` of baseline group ``g`` (the attempts at one task; a proposal is a group of one), with
score ``s_i`` (its reward) and response mask ``m_{i,t}``::

    A_{i,t} = scale * (s_i - median_{j in g} s_j) * m_{i,t}

(``torch.median``: the lower middle value of an even group). The median, unlike GRPO's mean, is not pulled by
one outlier attempt; a group of one gets ``A = 0``. ``scale``
is a setting (``--trainer.advantage-kwargs '{"scale": 0.5}'``): settings are the estimator's named keyword
parameters, checked before a run starts; the ``**kw`` catch-all receives what the trainer passes besides
(``scope_ids``, ``token_rewards``) and takes no setting. The estimator contract is in
``agents/advantages.py``'s docstring.

Use it:

* every case of a scripted batch (groups that differ, all-equal rewards, groups of one, padding, an empty
  completion), in seconds: ``.venv/bin/populora test-estimator --plugins examples/estimator.py group_median``;
* in a run: ``.venv/bin/populora train --preset tiny --plugins examples/estimator.py --trainer.advantage
  group_median --trainer.advantage-kwargs '{"scale": 0.5}'``;
* as a script, below: the advantages of a small batch.

Run it: ``.venv/bin/python examples/estimator.py``.
"""

from collections import defaultdict

import torch

from agents.advantages import register_advantage


@register_advantage("group_median")
def group_median(rewards, response_mask, group_ids, *, scale: float = 1.0, **kw):
    groups = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    baseline = torch.zeros_like(rewards, dtype=torch.float32)
    for rows in groups.values():
        baseline[rows] = rewards[rows].float().median()
    return scale * (rewards.float() - baseline)[:, None] * response_mask.float()


if __name__ == "__main__":
    rewards = torch.tensor([1.0, -0.5, -0.5, 1.0, 0.5])  # task a: 4 attempts; a proposal alone in its group
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    print(group_median(rewards, mask, ["a", "a", "a", "a", "p"], scale=0.5))
