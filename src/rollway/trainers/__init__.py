"""Adapters that let existing RL trainers consume rollway rollouts.

``rollway.trainers.trl``: TRL's ``GRPOTrainer`` samples through a ``RolloutClient`` (its
``rollout_func`` hook), with the trainer's weights pushed into rollway's engine each step;
``rollway.trainers.trl_steps``: its batches from a step source instead (``client.step_source``).
Importing this package imports no trainer library; see ``docs/trainers.md`` for the others.
"""

__all__: list[str] = []  # each adapter is its own public module (docs/trainers.md)
